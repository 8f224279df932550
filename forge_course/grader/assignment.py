"""What the grader knows about one assignment, read from the instructor's side only.

Everything here comes from the source notebook built from ``solutions/`` and from the chapter's
checks module, never from a submission: the set-up cell the answers run after, the exercises
and their test cells with points, and the question cells with their (hidden) test code.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from forge_course.grading.core import Exercise, clean_room

INSTALL_TAG = "colab-install"  # the first cell that installs forge_course on Colab


@dataclass
class Assignment:
    id: str
    prelude: str
    exercises: dict[str, list[Exercise]]  # solution cell id -> its records, reference first
    test_points: dict[str, float]  # graded cell id -> points
    question_tests: dict[str, str] = field(default_factory=dict)  # graded cell id -> its code
    question_cells: dict[str, list[str]] = field(default_factory=dict)  # cell id -> names
    release: nbformat.NotebookNode | None = None
    # The set-up cell and then every import of the chapter's other cells, each allowed to fail:
    # what a question cell runs after (a learner may use `math` imported by a later demo cell).
    question_prelude: str = ""
    _settings: dict | None = field(default=None, repr=False)

    def settings(self) -> dict:
        """The names the instructor's set-up cell defines (run once, here, in the grader)."""
        if self._settings is None:
            scope: dict = {"__name__": "__forge_settings__"}
            with clean_room(), contextlib.redirect_stdout(io.StringIO()):
                exec(compile(self.prelude, f"<{self.id} set-up>", "exec"), scope)
            self._settings = scope
        return dict(self._settings)

    def test_for(self, solution_id: str) -> str:
        return f"{solution_id}_tests"

    @property
    def module(self) -> str:
        return f"forge_course.grading.{self.id[:4]}"


def _assigned_names(source: str) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id not in names:
                    names.append(target.id)
    return names


def load(assignment_id: str, source: Path, release: Path | None = None) -> Assignment:
    """Read ``source`` (the instructor's notebook) and the chapter's ``EXERCISES``."""
    nb = nbformat.read(source, as_version=4)
    module = importlib.import_module(f"forge_course.grading.{assignment_id[:4]}")
    if not hasattr(module, "EXERCISES"):
        raise NotImplementedError(
            f"{assignment_id}'s checks do not list their EXERCISES yet, so forge-course grade "
            "cannot grade it in isolation; use nbgrader autograde for this chapter."
        )
    exercises: dict[str, list[Exercise]] = {}
    for exercise in module.EXERCISES:
        exercises.setdefault(exercise.grade_id, []).append(exercise)
    code = [c for c in nb.cells if c.cell_type == "code"]
    # The set-up cell: the first plain code cell, past the Colab install cell if there is one.
    instructor = [
        c.source
        for c in code
        if "nbgrader" not in c.metadata and INSTALL_TAG not in c.metadata.get("tags", [])
    ]
    prelude = instructor[0] if instructor else ""
    points, question_tests, question_cells = {}, {}, {}
    for cell in code:
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id")
        if meta.get("grade"):
            points[grade_id] = float(meta.get("points", 0))
        if meta.get("solution") and grade_id not in exercises:
            question_cells[grade_id] = _assigned_names(cell.source)
    for cell in code:
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id")
        if meta.get("grade") and not any(grade_id == f"{e}_tests" for e in exercises):
            question_tests[grade_id] = cell.source
    released = nbformat.read(release, as_version=4) if release and release.exists() else None
    return Assignment(
        assignment_id, prelude, exercises, points, question_tests, question_cells, released,
        question_prelude=prelude + _imports_of(instructor[1:]),
    )  # fmt: skip


def _imports_of(sources: list[str]) -> str:
    """Each top-level import of ``sources``, as code that skips an import the sandbox lacks."""
    found: dict[str, None] = {}
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell of IPython magics, say: it imports nothing we can see
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
                isinstance(node, ast.ImportFrom) and node.module == "__future__"
            ):
                found[ast.unparse(node)] = None
    return "".join(f"\ntry:\n    {line}\nexcept ImportError:\n    pass" for line in found)


_RENAMES = [
    re.compile(r"^copy of\s+", re.I),  # Colab, Drive
    re.compile(r"\s*\(\d+\)$"),  # browsers: "name (1)"
    re.compile(r"[-_ ]copy\d*$", re.I),  # Jupyter: "name-Copy1"
]


def canonical(stem: str) -> str:
    """The notebook name with download and copy decorations removed."""
    stem = stem.strip()
    changed = True
    while changed:
        changed = False
        for pattern in _RENAMES:
            new = pattern.sub("", stem)
            changed |= new != stem
            stem = new
    return stem.lower()


def find_notebook(folder: Path, assignment_id: str) -> Path | None:
    """The notebook for ``assignment_id`` in ``folder``, however a browser renamed it."""
    notebooks = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    exact = [p for p in notebooks if canonical(p.stem) == assignment_id.lower()]
    if exact:
        return exact[0]
    return notebooks[0] if len(notebooks) == 1 else None
