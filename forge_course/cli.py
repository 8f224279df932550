"""The `forge-course` command: one entry point for learners, instructors and graders."""

from __future__ import annotations

import sys

USAGE = """usage: forge-course COMMAND [ARGS]

commands:
  check NOTEBOOK          run a notebook and report its tests (learners)
  doctor FILE.py:FUNC     run a training function under the loop doctor
  release                 rebuild build/source and notebooks/ from solutions/ (instructors)
  grade [ASSIGNMENT ...]  grade grading/submitted/ in parallel, isolated (graders);
                          options: --submitted DIR, --jobs N, --timeout S, --memory MB,
                          --device auto|cpu|cuda, --seed N, --force, --unsafe
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help", "help"}:
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "check":
        from forge_course.check import main as check

        return check(rest)
    if command == "doctor":
        from forge_course.doctor import main as doctor

        return doctor(rest)
    if command == "release":
        from forge_course.release import release

        chapters = release()
        print(f"Released {len(chapters)} chapter(s) into notebooks/: {', '.join(chapters)}")
        return 0
    if command == "grade":
        return _grade(rest)
    print(f"Unknown command {command!r}.\n\n{USAGE}", file=sys.stderr)
    return 2


def _grade(argv: list[str]) -> int:
    import argparse
    from collections import Counter
    from pathlib import Path

    from forge_course.grader import run, sandbox

    parser = argparse.ArgumentParser(prog="forge-course grade")
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    parser.add_argument("--submitted", type=Path, help="folder of <student>/<assignment>/")
    parser.add_argument("--jobs", type=int, help="submissions graded at once (default: cores)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per exercise")
    parser.add_argument("--memory", type=int, default=4096, help="MB of memory per submission")
    parser.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="devices to check on"
    )
    parser.add_argument("--seed", type=int, help="replay the hidden cases of an earlier run")
    parser.add_argument("--force", action="store_true", help="regrade what the ledger holds")
    parser.add_argument(
        "--unsafe", action="store_true", help="grade without bubblewrap (no sandbox: your rights)"
    )
    args = parser.parse_args(argv)
    limits = sandbox.Limits(seconds=args.timeout, memory_mb=args.memory)
    print(f"Isolation: {sandbox.isolation()}", flush=True)
    try:
        outcomes = run.grade(
            args.assignments or None,
            submitted=args.submitted.resolve() if args.submitted else None,
            jobs=args.jobs,
            limits=limits,
            force=args.force,
            unsafe=args.unsafe,
            seed=args.seed,
            device=args.device,
        )
    except (run.SandboxUnavailable, sandbox.SandboxError) as err:
        print(f"forge-course grade: {err}", file=sys.stderr)
        return 2
    statuses = Counter(r["status"] for results in outcomes.values() for r in results.values())
    print(
        f"Graded {len(outcomes)} submission(s): "
        + ", ".join(f"{n} {s}" for s, n in statuses.most_common())
    )
    print(f"Scores: {run.grading_dir() / 'grades.csv'}; feedback: {run.grading_dir() / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
