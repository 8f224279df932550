"""What a correct answer to each chapter uses of every sandbox limit, and how much room is left.

The instructor's solution of every chapter is graded as a class of one student per chapter,
by `forge-course grade`'s own pipeline under bubblewrap. The class is built as the tests build
theirs: the sources, nbgrader's release, and the solution cells put into the released
notebook. The limits are set far above the defaults, so that nothing is cut short, and each
submission's peaks are recorded (`sandbox.Session.peaks`: the watcher's totals from inside the
sandbox, the grader's clock, and the control group's memory peak where there is one). The
table sets each chapter's peaks beside `sandbox.Limits`' defaults and shows the margin.

Run alone (``.venv/bin/python benchmarks/limits.py``), it rewrites only its own section of
benchmarks/RESULTS.md. `benchmarks/run.py` writes the same section into the file it writes.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import sys
import tempfile
from pathlib import Path
from unittest import mock

import nbformat

from forge_course.device import describe, pick_device
from forge_course.grader import cgroup, run, sandbox
from forge_course.release import REPO, build_sources, chapter_ids, generate_release

TITLE = "## Sandbox limits"
SEED = 1234  # the hidden cases, as in the tests
# Room enough for a correct answer to show what it uses. Per process, open files stay under
# the grader's own hard limit, which a worker cannot raise.
ROOMY = sandbox.Limits(
    seconds=600, submission_seconds=3600, cpu_seconds=3600, memory_mb=16_384, processes=1024,
    file_mb=1024, disk_mb=2048, files=1_000_000, open_files=8192, open_files_total=1_000_000,
)  # fmt: skip
# (`Limits` field, column heading, decimals): the totals, in the table's order
COLUMNS = (
    ("seconds", "longest exercise s", 1),
    ("submission_seconds", "submission s", 1),
    ("cpu_seconds", "CPU s", 1),
    ("memory_mb", "memory MB", 0),
    ("processes", "processes + threads", 0),
    ("open_files", "open files, one process", 0),
    ("open_files_total", "open files, all", 0),
    ("disk_mb", "disk MB", 1),
    ("files", "files", 0),
)


def solution_class(root: Path, chapters: list[str]) -> Path:
    """Write ``root/submitted/<chapter>/<chapter>/<chapter>.ipynb``: for each chapter, a student
    who submits the release with the instructor's solution in every answer cell."""
    build_sources(REPO, root / "build" / "source")
    generate_release(root, chapters)
    for chapter in chapters:
        name = f"{chapter}.ipynb"
        source = nbformat.read(root / "build" / "source" / chapter / name, as_version=4)
        solved = {
            c.metadata["nbgrader"]["grade_id"]: c.source
            for c in source.cells
            if c.metadata.get("nbgrader", {}).get("solution")
        }
        nb = nbformat.read(root / "notebooks" / chapter / name, as_version=4)
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id in solved:
                cell.source = solved[grade_id]
        path = root / "submitted" / chapter / chapter / name
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    return root / "submitted"


def measure(chapters: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, bool]]:
    """(peaks, whether the solution scored full) of each chapter's solution."""
    peaks: dict[str, dict[str, float]] = {}
    grading_now = run.grade_notebook

    def grade_notebook(assignment, path, box, seed):
        results = grading_now(assignment, path, box, seed)
        peaks[assignment.id] = dict(box.peaks)  # the submission's own: begun with it
        return results

    with tempfile.TemporaryDirectory(prefix="forge-limits-") as tmp, contextlib.ExitStack() as s:
        submitted = solution_class(Path(tmp), chapters)
        s.enter_context(mock.patch.object(run, "grade_notebook", grade_notebook))
        outcomes = run.grade(chapters, submitted=submitted, grading=Path(tmp) / "grading", jobs=1,
                             limits=ROOMY, progress=False, seed=SEED, force=True)  # fmt: skip
    full = {
        chapter: all(r["status"] == "graded" for r in outcomes[(chapter, chapter)].values())
        for chapter in chapters
    }
    return peaks, full


def table(peaks: dict[str, dict[str, float]], full: dict[str, bool]) -> list[str]:
    defaults = sandbox.Limits()
    rows = [
        "| chapter | " + " | ".join(heading for _, heading, _ in COLUMNS) + " | full marks |",
        "| --- " * (len(COLUMNS) + 2) + "|",
    ]

    def cells(values: dict[str, float]) -> str:
        return " | ".join(f"{values.get(name, 0):,.{d}f}" for name, _, d in COLUMNS)

    for chapter, measured in peaks.items():
        rows.append(f"| {chapter} | {cells(measured)} | {'yes' if full[chapter] else '**no**'} |")
    worst = {name: max(p.get(name, 0) for p in peaks.values()) for name, _, _ in COLUMNS}
    limit = {name: getattr(defaults, name) for name, _, _ in COLUMNS}
    margin = " | ".join(
        f"{limit[name] / worst[name]:,.1f}×" if worst[name] else "" for name, _, _ in COLUMNS
    )
    rows += [
        f"| **most of any chapter** | {cells(worst)} | |",
        f"| **limit** (`Limits` default) | {cells(limit)} | |",
        f"| **margin** (limit ÷ most) | {margin} | |",
    ]
    return rows


def bench_limits(chapters: list[str] | None = None) -> list[str]:
    """The section's lines: what it measured, and the table."""
    chapters = chapters or chapter_ids(REPO)
    load = os.getloadavg()[0]
    peaks, full = measure(chapters)
    load = max(load, os.getloadavg()[0])  # wall-clock figures stretch with the machine's load
    groups = cgroup.make(1, 1)
    cgroup.remove(groups)
    memory = (
        "the peak of the submission's control group: what its jobs' processes and its tmpfs "
        "files took, not the warm worker's imports, which are charged to a group of their own"
        if groups
        else "the watcher's sum of resident memory (no control group here)"
    )
    return [
        f"Measured {datetime.date.today()} on {describe(pick_device())}, {os.cpu_count()} cores "
        f"(1-minute load average {load:.1f} at the start or end), under "
        f"{sandbox.isolation()}: the instructor's solution of each chapter graded by "
        "`forge-course grade` (one submission at a time, limits far above the defaults), with "
        f"each submission's peaks (`sandbox.Session.peaks`). Memory is {memory}; processes, "
        "threads and open files include the worker's own; CPU time is the answer's, not the "
        "worker's imports. A file's size is bounded by the disk column.",
        "",
        *table(peaks, full),
    ]


def write_section(
    lines: list[str], results: Path = REPO / "benchmarks" / "RESULTS.md", title: str = TITLE
) -> None:
    """Put the section into RESULTS.md in place of the old one (or at the end)."""
    section = "\n".join([title, "", *lines, ""])
    text = results.read_text() if results.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(title)}\n.*?(?=^## |\Z)", re.M | re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = text.rstrip("\n") + "\n\n" + section
    results.write_text(text)


def main(argv: list[str]) -> int:
    # nbgrader runs `alembic` by name: this environment's tools first, as `make` puts them.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    lines = bench_limits(argv or None)
    write_section(lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
