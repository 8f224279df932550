"""`forge-course check NOTEBOOK`: run a notebook and report its tests like a teaching assistant.

It executes every cell in a fresh kernel (the notebook's folder as working directory), then
reads the outcome of each graded test cell: passed, or what went wrong and the likely mistake.
The kernel runs every exercise's check thoroughly (the hidden tests' cases, drawn at random as
the grader draws them), and a self-study notebook's question cells hold answer keys
(`forge_course.grading.answers`), so each verdict is the grader's. A graded class's notebook
has no keys: its question cells check the answer's form only, and the report says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient


@dataclass(frozen=True)
class TestResult:
    grade_id: str
    points: float
    passed: bool
    message: str
    form_only: bool = False  # a question without its answer key: only the form was checked


def _form_only(source: str) -> bool:
    return ("check_number(" in source or "check_choice(" in source) and "key=" not in source


def execute(
    path: Path, timeout: int = 120, repeat: int = 1, thorough: bool = False
) -> nbformat.NotebookNode:
    """Run every cell of the notebook at ``path`` (``repeat`` times in one kernel); return it run.

    Errors do not stop the run: every test cell gets its own verdict. ``repeat=2`` checks that a
    notebook runs again top to bottom without a kernel restart: each cell ends with the outputs
    of the last pass, after the errors it raised in any earlier pass.
    """
    import os

    from forge_course.grading.core import THOROUGH

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(Path(path).parent)}},
    )
    # With thorough, the kernel runs every check with the grader's cases.
    env = {**os.environ, THOROUGH: "1"} if thorough else None
    earlier: dict[int, list] = {}
    with client.setup_kernel(**({"env": env} if env else {})):
        for last in [False] * (repeat - 1) + [True]:
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
                if not last and errors(cell):
                    earlier.setdefault(index, []).extend(errors(cell))
    for index, raised in earlier.items():
        nb.cells[index].outputs[:0] = raised
    return nb


def errors(cell: nbformat.NotebookNode) -> list[dict]:
    """The error outputs of a code cell."""
    return [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def graded_results(nb: nbformat.NotebookNode) -> list[TestResult]:
    """One result per graded cell of an executed notebook, in notebook order."""
    results = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("grade") or cell.cell_type != "code":
            continue
        failures = errors(cell)
        message = ""
        if failures:
            err = failures[0]
            message = f"{err['ename']}: {err['evalue']}"
        results.append(
            TestResult(
                meta["grade_id"],
                meta.get("points", 0),
                not failures,
                message,
                form_only=_form_only(cell.source),
            )
        )
    return results


def report(results: list[TestResult]) -> str:
    """A short, readable summary: one line per test, the message under each failure."""
    lines = []
    for r in results:
        unit = "point" if r.points == 1 else "points"
        verdict = "FORM" if r.form_only and r.passed else "PASS" if r.passed else "FAIL"
        lines.append(f"{verdict}  {r.grade_id}  ({r.points:g} {unit})")
        if not r.passed:
            lines += [f"      {line}" for line in r.message.splitlines()]
    judged = [r for r in results if not (r.form_only and r.passed)]
    earned = sum(r.points for r in judged if r.passed)
    total = sum(r.points for r in judged)
    lines.append(f"{earned:g} of {total:g} points, checked as the grader checks them.")
    unjudged = len(results) - len(judged)
    if unjudged:
        lines.append(
            f"FORM: {unjudged} answer(s) of the right form, not judged here: this notebook is "
            "a graded class's copy, without answer keys; your instructor grades them."
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: forge-course check NOTEBOOK.ipynb", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.is_file():
        print(f"No notebook at {path}.", file=sys.stderr)
        return 2
    print(f"Running {path.name} top to bottom ...", flush=True)
    results = graded_results(execute(path, timeout=600, thorough=True))
    print(report(results))
    return 0 if results and all(r.passed and not r.form_only for r in results) else 1
