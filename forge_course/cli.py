"""The `forge-course` command: one entry point for learners, instructors and graders."""

from __future__ import annotations

import sys

USAGE = """usage: forge-course COMMAND [ARGS]

commands:
  check NOTEBOOK          run a notebook and report its tests (learners)
  doctor FILE.py:FUNC     run a training function under the loop doctor
  release                 rebuild build/source and notebooks/ from solutions/ (instructors)
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
    print(f"Unknown command {command!r}.\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
