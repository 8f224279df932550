"""Grade one submission: every test cell ends with a status, points and a message.

Statuses: ``graded`` (full points), ``wrong``, ``timeout``, ``resource limit``, ``crashed``,
``tampered``, ``malformed`` and ``missing``. Only ``graded`` earns points, and every other status
says why, so no zero is silent.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from forge_course.grader import codec, sandbox, tamper
from forge_course.grader.assignment import Assignment
from forge_course.grading.core import Mistake


@dataclass(frozen=True)
class CellResult:
    status: str
    points: float
    max_points: float
    message: str = ""


def fingerprint(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _answers(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Solution cells of the submission by grade id (the last one wins if duplicated)."""
    found = {}
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell.get("cell_type") == "code" and grade_id:
            found[grade_id] = cell.get("source", "")
    return found


def _all_of(assignment: Assignment, cells: list[str], status: str, message: str) -> dict:
    return {c: CellResult(status, 0.0, assignment.test_points[c], message) for c in cells}


def grade_notebook(
    assignment: Assignment, path: Path | None, limits: sandbox.Limits, hidden: list[Path]
) -> dict[str, CellResult]:
    """Results for every graded cell of ``assignment`` from the notebook at ``path``."""
    tests = list(assignment.test_points)
    if path is None:
        return _all_of(assignment, tests, "missing", "No notebook for this assignment was found.")
    try:
        nb = nbformat.read(path, as_version=4)
        answers = _answers(nb)
    except Exception as err:  # noqa: BLE001  (any unreadable file is malformed, nothing else)
        return _all_of(assignment, tests, "malformed", f"The notebook cannot be read: {err}")
    results: dict[str, CellResult] = {}
    with sandbox.Session(limits, hidden) as box:  # one warm worker for the whole submission
        for solution_id, records in assignment.exercises.items():
            test = assignment.test_for(solution_id)
            for index, exercise in records:  # every record must pass: reference, then oracles
                results[test] = _grade_exercise(
                    assignment, index, exercise, answers.get(solution_id), test, box
                )
                if results[test].status != "graded":
                    break
        results.update(_grade_questions(assignment, answers, box))
    return {t: results.get(t, CellResult("missing", 0.0, assignment.test_points[t])) for t in tests}


def _grade_exercise(assignment, index, exercise, answer, test, box) -> CellResult:
    top = assignment.test_points[test]
    if answer is None:
        return CellResult("missing", 0.0, top, f"The answer cell {exercise.grade_id} is missing.")
    reasons = tamper.findings(answer)
    if reasons:
        return CellResult("tampered", 0.0, top, "Not graded: your answer " + "; ".join(reasons))
    cases = exercise.cases(False) + exercise.cases(True)
    job = {
        "prelude": assignment.prelude,
        "answer": answer,
        "exercise": {"module": assignment.module, "index": index},
        "cases": cases,
    }
    outcome = box.run(job)
    if patched := _patched(outcome):
        return CellResult("tampered", 0.0, top, patched)
    ran = next((m for m in outcome.messages if "ran" in m or "error" in m), {})
    if outcome.status != "finished":
        # Whatever it sent before it was stopped proves nothing: it could have been forged.
        return CellResult(outcome.status, 0.0, top, _limit_message(outcome, ran))
    # The worker writes each case's result after the learner's call returns, so the last
    # message for a case is the worker's own, even if learner code wrote lines before it.
    by_case = {m["case"]: m for m in outcome.messages if "case" in m}
    for i, case in enumerate(cases):
        message = by_case.get(i)
        if message is None:
            return CellResult("crashed", 0.0, top, "The worker sent no result for a case.")
        if "mistake" in message:
            if "MemoryError" in message["mistake"]:
                return CellResult("resource limit", 0.0, top, "Your code ran out of memory.")
            if "BlockingIOError" in message["mistake"]:  # fork refused: the process cap
                return CellResult(
                    "resource limit", 0.0, top, "Your code started too many processes."
                )
            return CellResult("wrong", 0.0, top, _with_cell_error(message["mistake"], ran))
        try:
            observed = codec.from_plain(message["observation"])
        except Exception as err:  # noqa: BLE001  (only forged lines can be malformed)
            return CellResult("wrong", 0.0, top, f"What your code returned is unreadable: {err}")
        try:
            exercise.judge(case, observed)
        except Mistake as mistake:
            return CellResult("wrong", 0.0, top, str(mistake))
    return CellResult("graded", top, top, "")


def _patched(outcome: sandbox.Outcome) -> str:
    """The worker's report that learner code replaced what the grading relies on, if any."""
    names = next((m["tampered"] for m in outcome.messages if "tampered" in m), None)
    if not names:
        return ""
    return "Not graded: while it ran, your code replaced " + ", ".join(f"`{n}`" for n in names)


def _with_cell_error(text: str, ran: dict) -> str:
    if "error" in ran:
        return f"{text}\n(Your answer cell itself raised {ran['error']}.)"
    return text


def _limit_message(outcome: sandbox.Outcome, ran: dict) -> str:
    what = {
        "timeout": "Your code did not finish within the time limit",
        "resource limit": "Your code went over the memory or process limit",
        "crashed": "Your code ended the worker process",
    }[outcome.status]
    return f"{what} ({outcome.detail})."


def _question_values(answer, names, box) -> tuple[str, str, dict]:
    """(status, message, plain values) of one question cell, run alone in a worker."""
    if answer is None:
        return "missing", "The answer cell of these questions is missing.", {}
    reasons = tamper.findings(answer)
    if reasons:
        return "tampered", "Not graded: your answer " + "; ".join(reasons), {}
    outcome = box.run({"prelude": "", "answer": answer, "variables": names})
    if patched := _patched(outcome):
        return "tampered", patched, {}
    if outcome.status != "finished":
        return outcome.status, _limit_message(outcome, {}), {}
    sent = next((m["variables"] for m in outcome.messages if "variables" in m), None)
    if sent is None:
        return "crashed", "The worker sent no answers back.", {}
    try:
        return "finished", "", {n: codec.from_plain(v) for n, v in sent.items()}
    except Exception as err:  # noqa: BLE001  (only forged lines can be malformed)
        return "wrong", f"Your answers are unreadable: {err}", {}


def _names_used(source: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}


def _grade_questions(assignment, answers, box) -> dict[str, CellResult]:
    """Each question cell runs in its own worker; each question's test code runs here."""
    cells = {
        cell: (names, _question_values(answers.get(cell), names, box))
        for cell, names in assignment.question_cells.items()
    }
    results = {}
    for test, code in assignment.question_tests.items():
        top = assignment.test_points[test]
        used = _names_used(code)
        mine = [outcome for names, outcome in cells.values() if used & set(names)]
        failed = next((o for o in mine if o[0] != "finished"), None)
        if failed:
            results[test] = CellResult(failed[0], 0.0, top, failed[1])
            continue
        values = {k: v for _, _, found in mine for k, v in found.items()}
        # The instructor's test code runs here, after the instructor's set-up cell, on plain
        # values only: it never sees learner code.
        scope = {**assignment.settings(), **values}
        try:
            exec(compile(code, f"<{test}>", "exec"), scope)
        except Mistake as mistake:
            results[test] = CellResult("wrong", 0.0, top, str(mistake))
        except Exception as err:  # noqa: BLE001
            results[test] = CellResult("wrong", 0.0, top, f"[{test}] {type(err).__name__}: {err}")
        else:
            results[test] = CellResult("graded", top, top, "")
    return results


def as_dict(results: dict[str, CellResult]) -> dict[str, dict]:
    return {cell: asdict(result) for cell, result in results.items()}
