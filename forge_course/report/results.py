"""What a graded class did, per exercise: read from the grader's signed ledger or, read-only,
from nbgrader's gradebook, and counted (scores, statuses, discrimination, named mistakes).

The ledger is read through the grader's own reader (`forge_course.grader.ledger.read_ledger`),
so an entry whose signature fails never reaches a report. The gradebook holds scores only:
statuses and mistakes are then marked "not available", never guessed from the points.
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

NOT_AVAILABLE = "not available"
STATUSES = [
    "graded",
    "wrong",
    "timeout",
    "resource limit",
    "crashed",
    "tampered",
    "malformed",
    "missing",
    "grader error",
]
BY_HAND = {"tampered", "grader error"}  # statuses an instructor must read for themselves
WEAK_DISCRIMINATION = 0.2  # below this, an exercise hardly separates strong from weak students
ALMOST_NOBODY, ALMOST_EVERYBODY = 0.1, 0.9  # shares at full marks that tell little
SOMETHING_ELSE = "; something else differs too"


@dataclass
class Student:
    id: str
    results: dict[str, dict]  # test cell -> {status, points, max_points, message}


@dataclass
class Exercise:
    name: str
    max_points: float
    points: list[float]
    statuses: Counter
    mistakes: Counter = field(default_factory=Counter)  # named mistake -> students
    unnamed: Counter = field(default_factory=Counter)  # a message's first line -> students
    examples: dict[str, str] = field(default_factory=dict)  # mistake -> one student's message
    discrimination: float | None = None

    @property
    def mean(self) -> float:
        return statistics.fmean(self.points)

    def share(self, value: float) -> float:
        return sum(p == value for p in self.points) / len(self.points)

    def flag(self) -> str:
        full = self.share(self.max_points)
        if full <= ALMOST_NOBODY:
            return "almost nobody solves it"
        if full >= ALMOST_EVERYBODY:
            return "almost everybody solves it"
        if self.discrimination is None or self.discrimination < WEAK_DISCRIMINATION:
            return "does not separate strong from weak students"
        return ""


@dataclass
class Class:
    assignment: str
    source: str  # "ledger" or "gradebook"
    students: list[Student]
    unverified: list[str]  # submission folders without a genuine ledger entry
    run: dict[str, str]


def discrimination(item: list[float], totals: list[float]) -> float | None:
    """The corrected item–total correlation: Pearson's r between an exercise's points and the
    rest of each student's chapter total (the total less this exercise), so an exercise is not
    correlated with itself. None where either side never varies (r is undefined there)."""
    rest = [t - i for i, t in zip(item, totals, strict=True)]
    if len(item) < 2:
        return None
    mean_item, mean_rest = statistics.fmean(item), statistics.fmean(rest)
    cov = sum((i - mean_item) * (r - mean_rest) for i, r in zip(item, rest))
    var_item = sum((i - mean_item) ** 2 for i in item)
    var_rest = sum((r - mean_rest) ** 2 for r in rest)
    if var_item == 0 or var_rest == 0:
        return None
    return cov / math.sqrt(var_item * var_rest)


def named_mistake(message: str, hint: str = "") -> str | None:
    """The mistake a failure's message names, or None where the check could not name one (its
    generic ``hint`` is a suggestion, not a diagnosis)."""
    if "Likely mistake: " in message:
        named = message.split("Likely mistake: ", 1)[1].strip().removesuffix(SOMETHING_ELSE)
        generic = hint and (named == hint or (named.endswith("…") and hint.startswith(named[:-1])))
        return None if generic else named
    first = message.splitlines()[0] if message else ""
    slip = re.match(r".* is not right[:.] (.+)", first)  # check_number's hints, check_choice's
    return slip.group(1).strip() if slip else None


def _hints(assignment: str) -> dict[str, str]:
    """Each test cell's generic hint, read from the chapter's checks without importing them
    (they import PyTorch: seconds): the ``hint=`` of each ``Exercise(grade_id=..., ...)`` in
    ``forge_course/grading/chNN.py``. ``ch04_train_step_tests`` checks ``ch04_train_step``."""
    path = Path(__file__).parents[1] / "grading" / f"{assignment[:4]}.py"
    if not path.exists():
        return {}
    hints = {}
    for call in ast.walk(ast.parse(path.read_text())):
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Exercise":
            words = {k.arg: k.value for k in call.keywords}
            if all(isinstance(words.get(k), ast.Constant) for k in ("grade_id", "hint")):
                hints[f"{words['grade_id'].value}_tests"] = words["hint"].value
    return hints


def from_ledger(assignment: str, grading: Path, submitted: Path | None) -> Class:
    from forge_course.grader import ledger

    records = {r["student"]: r for r in ledger.read_ledger(grading / "forge", assignment)}
    unverified = []
    if submitted is not None and submitted.is_dir():
        for name, _, _ in ledger.discover(submitted, [assignment]):
            if ledger.student_id(name) not in records:
                unverified.append(ledger.student_id(name))
    keys = [r["key"] for r in records.values()]
    seed_file = grading / "forge" / "seed"
    finished = grading / "grades.csv"
    run_info = {
        "instructor version": _one_of(k.get("instructor", "")[:12] for k in keys),
        "grader version": _one_of(k.get("grader", "")[:12] for k in keys),
        "seed": _one_of(str(k.get("seed", "")) for k in keys)
        or (seed_file.read_text().strip() if seed_file.exists() else ""),
        "finished": _mtime(finished) if finished.exists() else NOT_AVAILABLE,
        "--jobs and time taken": "not recorded by forge-course grade",
    }
    students = [Student(s, records[s]["results"]) for s in sorted(records)]
    return Class(assignment, "ledger", students, sorted(unverified), run_info)


def from_gradebook(assignment: str, gradebook: Path) -> Class:
    """The scores nbgrader's gradebook holds, opened read-only with SQLite itself (nbgrader's
    own `Gradebook` runs the ``alembic`` command first: seconds, and it may write)."""
    import sqlite3

    # A grade's score as nbgrader counts it (`nbgrader.api.Grade.score`): the manual score if
    # an instructor gave one, else the automatic one, plus any extra credit.
    query = """
        SELECT sa.student_id, cell.name,
               COALESCE(g.manual_score, g.auto_score) + COALESCE(g.extra_credit, 0), gc.max_score
        FROM grade g
        JOIN submitted_notebook sn ON g.notebook_id = sn.id
        JOIN submitted_assignment sa ON sn.assignment_id = sa.id
        JOIN assignment a ON sa.assignment_id = a.id
        JOIN base_cell cell ON g.cell_id = cell.id
        JOIN grade_cells gc ON gc.id = cell.id
        WHERE a.name = ? ORDER BY sa.student_id, cell.rowid"""
    found: dict[str, dict] = {}
    if gradebook.exists():
        with contextlib.closing(sqlite3.connect(f"{gradebook.as_uri()}?mode=ro", uri=True)) as db:
            for student, cell, score, top in db.execute(query, (assignment,)):
                found.setdefault(student, {})[cell] = {
                    "status": NOT_AVAILABLE,
                    "points": score or 0.0,
                    "max_points": top,
                    "message": "",
                }
    run_info = {
        "graded by": "nbgrader autograde (its gradebook)",
        "gradebook changed": _mtime(gradebook) if gradebook.exists() else NOT_AVAILABLE,
        "instructor version, grader version, seed, --jobs, time taken": NOT_AVAILABLE,
    }
    students = [Student(s, results) for s, results in sorted(found.items())]
    return Class(assignment, "gradebook", students, [], run_info)


def _one_of(values) -> str:
    found = sorted(set(values))
    return found[0] if len(found) == 1 else ", ".join(found)


def _mtime(path: Path) -> str:
    when = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def exercises(cls: Class) -> list[Exercise]:
    """Per-exercise figures of the students who have a result (in the notebook's order)."""
    names = list(dict.fromkeys(c for s in cls.students for c in s.results))
    totals = [sum(r["points"] for r in s.results.values()) for s in cls.students]
    hints = _hints(cls.assignment) if cls.source == "ledger" else {}
    found = []
    for name in names:
        rows = [s.results.get(name) for s in cls.students]
        ex = Exercise(
            name,
            max(r["max_points"] for r in rows if r),
            [r["points"] if r else 0.0 for r in rows],
            Counter(r["status"] if r else "missing" for r in rows),
        )
        ex.discrimination = discrimination(ex.points, totals)
        for r in rows:
            if not r or r["status"] in ("graded", NOT_AVAILABLE):
                continue
            mistake = named_mistake(r["message"], hints.get(name, ""))
            if mistake is not None:
                ex.mistakes[mistake] += 1
            elif r["status"] == "wrong":
                mistake = (r["message"].splitlines() or [""])[0]
                ex.unnamed[mistake] += 1
            else:
                continue
            ex.examples.setdefault(mistake, r["message"])
        found.append(ex)
    return found


def by_hand(cls: Class) -> list[tuple[str, str]]:
    """(student, why) for the submissions an instructor must look at themselves."""
    found = [(s, "no genuine ledger entry for the notebook submitted") for s in cls.unverified]
    for s in cls.students:
        statuses = {r["status"] for r in s.results.values()}
        why = sorted(statuses & BY_HAND)
        if statuses == {"timeout"}:
            why.append("every exercise timed out")
        if why:
            found.append((s.id, ", ".join(why)))
    return found


def summary(found: list[Exercise]) -> list[str]:
    """What an instructor reads first: the three lowest means, the three commonest mistakes."""
    lowest = sorted(found, key=lambda ex: ex.mean / ex.max_points if ex.max_points else 1)[:3]
    lines = [
        "Lowest means: "
        + "; ".join(f"{ex.name} {ex.mean:.2f} of {ex.max_points:g}" for ex in lowest)
    ]
    common = Counter({(ex.name, m): c for ex in found for m, c in ex.mistakes.items()})
    if common:
        lines += ["Most frequent named mistakes:"] + [
            f"  {count} × {name}: {mistake}" for (name, mistake), count in common.most_common(3)
        ]
    elif any(ex.statuses[NOT_AVAILABLE] for ex in found):
        lines.append(f"Named mistakes: {NOT_AVAILABLE} (nbgrader's gradebook does not keep them).")
    else:
        lines.append("No named mistakes: no wrong answer the checks could name.")
    return lines
