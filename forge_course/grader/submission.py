"""Grade one submission: every test cell ends with a status, points and a message.

Statuses: ``graded`` (full points), ``wrong``, ``timeout``, ``resource limit``, ``crashed``,
``tampered``, ``malformed``, ``missing`` and ``grader error``. Only ``graded`` earns points, and
every other status says why, so no zero is silent.

Everything that comes back from a worker was within reach of learner code, so each message is
checked against the shape the worker writes (`_Reading`): first ``ready`` (or the set-up
cell's error), written before learner code runs; then one result per case, nothing after
``done``, nothing unknown. A line the worker never writes is evidence of tampering. A status
never comes from the text of an error, which the answer chooses: the worker names the limit
that refused the answer by the exception's type.
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from forge_course.grader import codec, sandbox, tamper
from forge_course.grader.assignment import Assignment
from forge_course.grader.text import clean_text
from forge_course.grading.core import Mistake, clean_room
from forge_course.observe.common import Tampered

MAX_NOTEBOOK_BYTES = 8 * 2**20  # a chapter's submission is well under 1 MB
MAX_CELLS = 2000
MAX_CELL_CHARS = 200_000


@dataclass(frozen=True)
class CellResult:
    status: str
    points: float
    max_points: float
    message: str = ""


def fingerprint(path: Path) -> str:
    with path.open("rb") as f:  # in chunks: a submitted file may be of any size
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_notebook(path: Path) -> dict[str, str]:
    """Solution cells of a submitted notebook by grade id (the last one wins if duplicated).

    Raises ``ValueError`` with a reason for anything that is not a notebook within bounds.
    """
    if path.is_symlink():
        raise ValueError("the notebook is a symbolic link, not a file")
    with path.open("rb") as f:  # never more than the bound, whatever the file grew to
        data = f.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"the notebook is larger than {MAX_NOTEBOOK_BYTES // 2**20} MB")
    try:
        nb = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"the notebook is not valid JSON ({type(err).__name__})") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise ValueError("the notebook has no list of cells")
    if len(cells) > MAX_CELLS:
        raise ValueError(f"the notebook has more than {MAX_CELLS} cells")
    found = {}
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata")
        nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
        grade_id = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
        if not isinstance(grade_id, str):
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(s, str) for s in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise ValueError(f"the cell {clean_text(grade_id, 80)} has no text as its source")
        if len(source) > MAX_CELL_CHARS:
            raise ValueError(f"the cell {clean_text(grade_id, 80)} is too long")
        found[grade_id] = source
    return found


def _all_of(assignment: Assignment, cells: list[str], status: str, message: str) -> dict:
    return {c: CellResult(status, 0.0, assignment.test_points[c], message) for c in cells}


def grade_notebook(
    assignment: Assignment, path: Path | None, box: sandbox.Session, seed: int
) -> dict[str, CellResult]:
    """Results for every graded cell of ``assignment`` from the notebook at ``path``, graded
    as a new submission of the warm worker ``box``."""
    tests = list(assignment.test_points)
    if path is None:
        return _all_of(assignment, tests, "missing", "No notebook for this assignment was found.")
    try:
        answers = read_notebook(path)
    except (ValueError, OSError) as err:
        return _all_of(assignment, tests, "malformed", f"The notebook cannot be graded: {err}")
    results: dict[str, CellResult] = {}
    box.begin()
    for solution_id, records in assignment.exercises.items():
        test = assignment.test_for(solution_id)
        for exercise in records:  # every record must pass: reference, then oracles
            job = _Job(assignment, exercise, answers.get(solution_id), test, seed)
            results[test] = job.grade(box)
            if results[test].status != "graded":
                break
    results.update(_grade_questions(assignment, answers, box, seed))
    return {t: results.get(t, CellResult("missing", 0.0, assignment.test_points[t])) for t in tests}


class _Reading:
    """A job's messages, checked against the sequence the worker writes."""

    def __init__(self, outcome: sandbox.Outcome, cases: int):
        self.outcome = outcome
        self.tampered: list[str] = []
        self.ran: dict = {}
        self.setup_error = ""
        self.by_case: dict[int, dict] = {}
        self.variables: dict | None = None
        self.odd = ""
        started = done = False
        for m in outcome.messages:
            if "tampered" in m:
                names = m["tampered"] if isinstance(m["tampered"], list) else [m["tampered"]]
                self.tampered += [clean_text(n, 200) for n in names[:20]]
                continue
            if not started:  # the worker's first line comes before any learner code runs
                started = True
                if _shape(m, "setup_error", str):
                    self.setup_error, done = m["setup_error"], True
                elif m != {"ready": True}:
                    self.odd = "a line before the worker's first"
            elif done:
                self.odd = "a line after the worker's last"
            elif _shape(m, "ran", bool) or _shape(m, "error", str):
                self.odd = self.odd or ("a second report of the cell" if self.ran else "")
                self.ran = m
            elif _is_case(m, cases):
                if m["case"] in self.by_case:
                    self.odd = "two results for one case"
                self.by_case[m["case"]] = m
            elif _shape(m, "variables", dict) and self.variables is None:
                self.variables = m["variables"]
            elif m == {"done": True}:
                done = True
            else:
                self.odd = "a line the worker never writes"
        if self.odd:
            self.tampered.append(f"the channel to the grader holds {self.odd}")


def _shape(message: dict, key: str, kind: type) -> bool:
    return set(message) == {key} and isinstance(message[key], kind)


def _is_case(message: dict, cases: int) -> bool:
    keys = set(message)
    return (
        keys in ({"case", "observation"}, {"case", "mistake"}, {"case", "mistake", "limit"})
        and type(message["case"]) is int
        and 0 <= message["case"] < cases
        and isinstance(message.get("limit", ""), str)
        and message.get("limit", "memory") in _LIMITS
    )


# What the worker found refused an answer (`worker._limit_of`): status and message.
_LIMITS = {
    "memory": "Your code ran out of memory.",
    "processes": "Your code started too many processes.",
    "files": "Your code opened too many files at once.",
}


class _Job:
    """One exercise of one submission: run the learner half in the sandbox, judge here."""

    def __init__(self, assignment, exercise, answer, test, seed):
        self.assignment, self.exercise, self.answer, self.test = assignment, exercise, answer, test
        self.top = assignment.test_points[test]
        self.seed = seed

    def result(self, status: str, message: str) -> CellResult:
        points = self.top if status == "graded" else 0.0
        return CellResult(status, points, self.top, clean_text(message))

    def grade(self, box: sandbox.Session) -> CellResult:
        exercise = self.exercise
        if self.answer is None:
            return self.result("missing", f"The answer cell {exercise.grade_id} is missing.")
        try:
            reasons = tamper.findings(self.answer)
        except tamper.Unreadable as why:
            return self.result("malformed", f"Not graded: {why}.")
        if reasons:
            return self.result("tampered", "Not graded: your answer " + "; ".join(reasons))
        cases = exercise.cases(False) + exercise.cases(True)
        job = {
            "prelude": self.assignment.prelude,
            "answer": self.answer,
            "observer": exercise.observer,
            "function": exercise.function,
            "cases": cases,
            "seed": self.seed,
        }
        reading = _Reading(box.run(job), len(cases))
        if reading.tampered:
            return self.result("tampered", _tamper_message(reading.tampered))
        if reading.setup_error:
            message = f"The chapter's set-up cell failed in the grader: {reading.setup_error}"
            return self.result("grader error", message)
        if reading.outcome.status != "finished":
            # Whatever it sent before it was stopped proves nothing: it could have been forged.
            return self.result(reading.outcome.status, _limit_message(reading.outcome))
        for i, case in enumerate(cases):
            verdict = self._judge(i, case, reading)
            if verdict is not None:
                return verdict
        return self.result("graded", "")

    def _judge(self, i: int, case: dict, reading: _Reading) -> CellResult | None:
        message = reading.by_case.get(i)
        if message is None:
            return self.result("crashed", "The worker sent no result for a case.")
        if "limit" in message:
            return self.result("resource limit", _LIMITS[message["limit"]])
        if "mistake" in message:
            text = str(message["mistake"])
            text = text.removeprefix(f"[{self.exercise.grade_id}] ")
            text = f"[{self.exercise.grade_id}] {self.exercise.explain_raised(text, case)}"
            return self.result("wrong", _with_cell_error(text, reading.ran))
        try:
            observed = codec.from_plain(message["observation"])
        except ValueError as err:
            return self.result("wrong", f"What your code returned is unreadable: {err}")
        try:
            self.exercise.judged(case, observed)
        except Tampered as tampered:
            return self.result("tampered", str(tampered))
        except Mistake as mistake:
            return self.result("wrong", str(mistake))
        return None


def _tamper_message(names: list[str]) -> str:
    listed = ", ".join(f"`{n}`" for n in dict.fromkeys(names))
    return f"Not graded: while it ran, your code tampered with the check: {listed}"


def _with_cell_error(text: str, ran: dict) -> str:
    if "error" in ran:
        return f"{text}\n(Your answer cell itself raised {ran['error']}.)"
    return text


def _limit_message(outcome: sandbox.Outcome) -> str:
    what = {
        "timeout": "Your code did not finish within the time limit",
        "resource limit": "Your code went over a limit of the sandbox",
        "crashed": "Your code ended the worker process",
    }.get(outcome.status, "Your code could not be graded")
    return f"{what} ({outcome.detail})."


def _question_values(assignment, answer, names, box, seed) -> tuple[str, str, dict]:
    """(status, message, plain values) of one question cell, run after the set-up cell."""
    if answer is None:
        return "missing", "The answer cell of these questions is missing.", {}
    try:
        reasons = tamper.findings(answer)
    except tamper.Unreadable as why:
        return "malformed", f"Not graded: {why}.", {}
    if reasons:
        return "tampered", "Not graded: your answer " + "; ".join(reasons), {}
    prelude = assignment.question_prelude or assignment.prelude
    job = {"prelude": prelude, "answer": answer, "variables": names, "seed": seed}
    reading = _Reading(box.run(job), 0)
    if reading.tampered:
        return "tampered", _tamper_message(reading.tampered), {}
    if reading.setup_error:
        return "grader error", f"The set-up cell failed: {reading.setup_error}", {}
    if reading.outcome.status != "finished":
        return reading.outcome.status, _limit_message(reading.outcome), {}
    sent = reading.variables
    if sent is None:
        return "crashed", "The worker sent no answers back.", {}
    # Where the cell raised, the answers it set before still count, as in the notebook; the
    # error is added to the message of any question that fails.
    raised = _CELL_RAISED.format(reading.ran["error"]) if "error" in reading.ran else ""
    try:
        return "finished", raised, {n: codec.from_plain(sent.get(n)) for n in names}
    except ValueError as err:
        return "wrong", f"Your answers are unreadable: {err}", {}


_CELL_RAISED = (
    "\n(Your answer cell itself raised {}. In the grader it runs after the chapter's settings "
    "cell and the chapter's imports, without the other cells' variables: compute each answer "
    "within the cell.)"
)


def _names_used(source: str) -> set[str]:
    return {n.id for n in ast.walk(tamper.parse(source)) if isinstance(n, ast.Name)}


def _grade_questions(assignment, answers, box, seed) -> dict[str, CellResult]:
    """Each question cell runs in the sandbox; each question's test code runs here."""
    cells = {
        cell: (names, _question_values(assignment, answers.get(cell), names, box, seed))
        for cell, names in assignment.question_cells.items()
    }
    results = {}
    for test, code in assignment.question_tests.items():
        top = assignment.test_points[test]
        used = _names_used(code)
        mine = [outcome for names, outcome in cells.values() if used & set(names)]
        failed = next((o for o in mine if o[0] != "finished"), None)
        if failed:
            results[test] = CellResult(failed[0], 0.0, top, clean_text(failed[1]))
            continue
        values = {k: v for _, _, found in mine for k, v in found.items()}
        raised = "".join(dict.fromkeys(o[1] for o in mine))
        # The instructor's test code runs here, after the instructor's set-up cell, on plain
        # values only: it never sees learner code.
        try:
            with clean_room():
                scope = {**assignment.settings(), **values}
                exec(compile(code, f"<{test}>", "exec"), scope)
        except Mistake as mistake:
            results[test] = CellResult("wrong", 0.0, top, clean_text(f"{mistake}{raised}"))
        except Exception as err:  # noqa: BLE001
            results[test] = CellResult(
                "wrong", 0.0, top, clean_text(f"[{test}] {type(err).__name__}: {err}{raised}")
            )
        else:
            results[test] = CellResult("graded", top, top, "")
    return results


def as_dict(results: dict[str, CellResult]) -> dict[str, dict]:
    return {cell: asdict(result) for cell, result in results.items()}
