"""How long `forge-course report` takes on a class of 300 chapter 04 submissions.

The class's ledger is written with the grader's own `run.Ledger` (signed, under the key a run
of this code would use), so the report reads and verifies exactly what it reads after a real
run, without spending the minutes grading 300 notebooks takes (`make bench` measures that on
its own). A third of the students have one wrong exercise, each carrying one of the chapter's
named mistakes in the feedback's own form, so every part of the page has something to show.
The time is the whole command, Python's start-up and imports included.

Run alone (``.venv/bin/python benchmarks/report.py``), it rewrites only its own section of
benchmarks/RESULTS.md. `benchmarks/run.py` writes the same section into the file it writes.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from forge_course.grader import run
from forge_course.grader.submission import fingerprint
from forge_course.grading import ch04
from forge_course.release import REPO

TITLE = "## Class report"
CH = "ch04_one_training_step"
SIZE, BUDGET_S = 300, 5.0
SOLVED = REPO / "autograder" / "examples" / "alice" / CH / f"{CH}.ipynb"


def _results(i: int, points: dict[str, float]) -> dict:
    """Student ``i``'s verdicts: all right, or (one in three) one exercise wrong, with one of
    its named mistakes."""
    exercise = ch04.EXERCISES[i % len(ch04.EXERCISES)]
    wrong = f"{exercise.grade_id}_tests" if i % 3 == 0 else None
    mistake = exercise.mistakes[i % len(exercise.mistakes)][0]
    results = {}
    for test, top in points.items():
        if test == wrong:
            message = f"the result differs (case: 2 inputs).\nLikely mistake: {mistake}"
            results[test] = {"status": "wrong", "points": 0.0, "max_points": top,
                             "message": message}  # fmt: skip
        else:
            results[test] = {"status": "graded", "points": top, "max_points": top, "message": ""}
    return results


def build_class(grading: Path, size: int = SIZE) -> Path:
    """``size`` submissions and their signed ledger entries; return the submitted folder."""
    nb = nbformat.read(SOLVED, as_version=4)
    meta = [c.metadata.get("nbgrader", {}) for c in nb.cells]
    points = {m["grade_id"]: float(m["points"]) for m in meta if m.get("grade")}
    ledger = run.Ledger(grading / "forge")
    key = {**run.versions(REPO, CH), "seed": 1234}
    submitted = grading / "submitted"
    for i in range(size):
        student = f"student-{i:03d}"
        path = submitted / student / CH / f"{CH}.ipynb"
        path.parent.mkdir(parents=True)
        nb.metadata["student"] = student  # a notebook of its own, as every student's is
        nbformat.write(nb, path)
        notebook_key = {**key, "notebook": fingerprint(path)}
        ledger.write(CH, student, notebook_key, _results(i, points))
    return submitted


def bench_report(repeats: int = 3) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        grading = Path(tmp) / "grading"
        build_class(grading)
        seconds = []
        for _ in range(repeats):
            shutil.rmtree(grading / "report", ignore_errors=True)
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "forge_course.cli", "report", CH],
                env={**os.environ, "FORGE_GRADING_DIR": str(grading)},
                check=True, capture_output=True,
            )  # fmt: skip
            seconds.append(time.perf_counter() - start)
    load = os.getloadavg()[0]
    median = statistics.median(seconds)
    verdict = "met" if median <= BUDGET_S else "missed"
    return [
        f"`forge-course report {CH}` on a class of {SIZE} (a signed ledger entry each, a third "
        f"with a named mistake), {os.cpu_count()} cores, 1-minute load average {load:.1f}: "
        f"median of {repeats} runs {median:.1f} s (all: "
        f"{', '.join(f'{s:.1f}' for s in seconds)}), start-up and imports included. "
        f"Budget {BUDGET_S:g} s: {verdict}.",
    ]


def main() -> int:
    from limits import write_section  # benchmarks/limits.py, beside this script

    lines = bench_report()
    write_section(lines, title=TITLE)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
