"""The `forge-course` command: one entry point for learners, instructors and graders."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import sysconfig
import threading

USAGE = """usage: forge-course COMMAND [ARGS]

commands:
  lab [--port N] [--no-browser] [JUPYTER ARGS]
                          open the course in JupyterLab (learners)
  check NOTEBOOK          run a notebook and report its tests (learners)
  doctor FILE.py:FUNC     run a training function under the loop doctor
  release [--graded]      rebuild build/source and notebooks/ from solutions/ (instructors);
                          --graded: build/graded/, whose question cells reveal nothing
  grade [ASSIGNMENT ...]  grade grading/submitted/ in parallel, isolated (graders);
                          options: --submitted DIR, --jobs N, --timeout S, --memory MB,
                          --device auto|cpu|cuda, --seed N, --force, --unsafe,
                          --cluster ADDRESS (a Dask scheduler whose workers grade)
  report [ASSIGNMENT ...] what the class got wrong: grading/report/ASSIGNMENT.html and CSV
                          (default: every graded chapter); options: --submitted DIR,
                          --gradebook (read nbgrader's gradebook, not the ledger)
"""


# The exit status of a run stopped by Ctrl-C or SIGTERM (a shell's for a command ended by Ctrl-C).
STOPPED = 130


@contextlib.contextmanager
def _stopping_on(*signums: int):
    """Within it, each of ``signums`` stops the command as Ctrl-C does, once: a second one while
    it stops (about a second) is ignored, so nothing cuts its cleaning up short."""
    stopping = []

    def interrupt(*_):
        if not stopping:
            stopping.append(True)
            raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # only it can handle signals
        yield
        return
    before = {signum: signal.signal(signum, interrupt) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def with_own_scripts_on_path() -> None:
    """Put this Python's scripts folder first on ``PATH``: nbgrader starts `alembic` by name to
    create a gradebook, which fails where the venv is not activated (`.venv/bin/forge-course
    release` on a fresh clone, a pip-only set-up on Windows)."""
    scripts = sysconfig.get_path("scripts")
    path = os.environ.get("PATH", "")
    if scripts not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, [scripts, path]))


def main(argv: list[str] | None = None) -> int:
    with_own_scripts_on_path()
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help", "help"}:
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "lab":
        from forge_course.lab import main as lab

        return lab(rest)
    if command == "check":
        from forge_course.check import main as check

        return check(rest)
    if command == "doctor":
        from forge_course.doctor import main as doctor

        return doctor(rest)
    if command == "release":
        from forge_course.release import release

        if rest not in ([], ["--graded"]):
            print("usage: forge-course release [--graded]", file=sys.stderr)
            return 2
        graded = rest == ["--graded"]
        chapters = release(graded=graded)
        where = "build/graded/ (for graded classes)" if graded else "notebooks/ (self-study)"
        print(f"Released {len(chapters)} chapter(s) into {where}: {', '.join(chapters)}")
        return 0
    if command == "grade":
        try:
            return _grade(rest)
        except KeyboardInterrupt:  # before grading began (importing, building), or while it ends
            print("forge-course grade: stopped; the ledger keeps what was graded.", file=sys.stderr)
            return STOPPED
    if command == "report":
        return _report(rest)
    print(f"Unknown command {command!r}.\n\n{USAGE}", file=sys.stderr)
    return 2


def _grade(argv: list[str]) -> int:
    import argparse
    from collections import Counter
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="forge-course grade")
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    parser.add_argument("--submitted", type=Path, help="folder of <student>/<assignment>/")
    parser.add_argument("--jobs", type=int, help="submissions graded at once (default: cores)")
    parser.add_argument("--timeout", type=float, help="seconds per exercise (default: Limits)")
    parser.add_argument("--memory", type=int, help="MB of memory per submission (default: Limits)")
    parser.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="devices to check on"
    )
    parser.add_argument("--seed", type=int, help="replay the hidden cases of an earlier run")
    parser.add_argument("--force", action="store_true", help="regrade what the ledger holds")
    parser.add_argument(
        "--unsafe", action="store_true", help="grade without bubblewrap (no sandbox: your rights)"
    )
    parser.add_argument(
        "--cluster", metavar="ADDRESS", help="grade on a Dask cluster's workers, record here"
    )
    args = parser.parse_args(argv)
    elsewhere = "" if args.cluster else _grading_elsewhere(sys.platform, args.unsafe)
    if elsewhere:
        print(f"forge-course grade: {elsewhere}", file=sys.stderr)
        return 2

    from forge_course.grader import run, sandbox

    chosen = {"seconds": args.timeout, "memory_mb": args.memory}
    limits = sandbox.Limits(**{k: v for k, v in chosen.items() if v is not None})
    where = f"the Dask cluster at {args.cluster}" if args.cluster else sandbox.isolation()
    print(f"Isolation: {where}", flush=True)
    try:
        with _stopping_on(signal.SIGINT, signal.SIGTERM):  # Ctrl-C, `kill`, a batch time limit
            outcomes = run.grade(
                args.assignments or None,
                submitted=args.submitted.resolve() if args.submitted else None,
                jobs=args.jobs,
                limits=limits,
                force=args.force,
                unsafe=args.unsafe,
                seed=args.seed,
                device=args.device,
                cluster=args.cluster,
            )
    except (run.SandboxUnavailable, sandbox.SandboxError) as err:
        print(f"forge-course grade: {err}", file=sys.stderr)
        return 2
    except run.Stopped as stop:
        again = "the same command without --force" if args.force else "the same command"
        print(f"forge-course grade: {stop}; the ledger keeps them: run {again} to grade the "
              "rest.", file=sys.stderr)  # fmt: skip
        return STOPPED
    statuses = Counter(r["status"] for results in outcomes.values() for r in results.values())
    print(
        f"Graded {len(outcomes)} submission(s): "
        + ", ".join(f"{n} {s}" for s, n in statuses.most_common())
    )
    print(f"Scores: {run.grading_dir() / 'grades.csv'}; feedback: {run.grading_dir() / 'feedback'}")
    return 0


def _report(argv: list[str]) -> int:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="forge-course report")
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all graded)")
    parser.add_argument("--submitted", type=Path, help="folder of <student>/<assignment>/")
    parser.add_argument(
        "--gradebook", action="store_true", help="read nbgrader's gradebook (plain autograde)"
    )
    args = parser.parse_args(argv)

    import os

    from forge_course import report
    from forge_course.chapters import CHAPTERS

    # As `run.grading_dir`, without importing the grader (nbgrader and PyTorch: seconds).
    root = Path(__file__).resolve().parent.parent
    grading = Path(os.environ.get("FORGE_GRADING_DIR", root / "grading")).resolve()
    submitted = (args.submitted or grading / "submitted").resolve()
    known = [c.id for c in CHAPTERS]
    chosen = [next((c for c in known if c.startswith(a)), a) for a in args.assignments]
    if not chosen:
        chosen = [c for c in known if (grading / "forge" / c).is_dir()] or known
    for assignment in chosen:
        path, lines = report.report(assignment, grading, submitted, args.gradebook)
        print(f"{assignment}: {path}")
        print("\n".join(f"  {line}" for line in lines))
    return 0


def _grading_elsewhere(platform: str, unsafe: bool) -> str:
    """Why this system cannot grade (one sentence), or "" where it can try."""
    if platform.startswith("linux"):
        return ""  # bubblewrap, or the sandbox's own message where it is missing
    isolation = "it isolates learner code with bubblewrap, which runs only on Linux"
    if platform == "win32":  # the worker forks a child per exercise
        return (
            f"{isolation}: grade in WSL or a Linux container (--unsafe cannot help: its "
            "workers fork, which Windows cannot)."
        )
    if unsafe:
        return ""
    return (
        f"{isolation}: grade in a Linux machine or container, or pass --unsafe to run learner "
        "code with your own rights (only on a machine you can afford to lose)."
    )


if __name__ == "__main__":
    sys.exit(main())
