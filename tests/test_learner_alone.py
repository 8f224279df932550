"""A learner alone can tell right from wrong: the released notebook's own test cells say what
the grader says.

A learner who answers every question and exercise of every chapter wrong in a typical way (the
wrong answers of `tests.answers`, and every known slip of every question) runs the test cells of
the self-study notebook in ``notebooks/``: each must fail, with the grader's message. A question
cell's verdict is compared with the instructor's cell, hidden tests included, on the same
answer. The cells' code runs here directly, without a kernel, to keep this cheap.
"""

from __future__ import annotations

import ast
import importlib
import math
from functools import cache

import numpy as np
import pytest

from forge_course import answer_keys, release
from forge_course.grading import Mistake

CHAPTERS = release.chapter_ids()


@cache
def released_cells(chapter: str) -> dict[str, str]:
    """The test cells a learner has, by grade id."""
    import nbformat

    path = release.REPO / "notebooks" / chapter / f"{chapter}.ipynb"
    nb = nbformat.read(path, as_version=4)
    return {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade")
    }


@cache
def instructor_cells(chapter: str) -> dict[str, str]:
    """The same cells with their hidden tests, what the grader runs."""
    nb = release.source_notebook(release.REPO / "solutions" / f"{chapter}.py")
    return {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade")
    }


@cache
def chapter_imports(chapter: str) -> dict:
    """The names an answer's cell finds defined: what the chapter's set-up cell defines (as the
    isolated grader runs it) and what its other cells import."""
    import tempfile
    from pathlib import Path

    from forge_course.grader.assignment import load

    with tempfile.TemporaryDirectory(prefix="learner-alone-") as name:
        folder = Path(name)
        release.build_sources(release.REPO, folder, [chapter])
        scope = load(chapter, folder / chapter / f"{chapter}.ipynb").settings()
    nb = release.source_notebook(release.REPO / "solutions" / f"{chapter}.py")
    scope["math"] = math
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # a cell with IPython's magics: the install cell
            continue
        imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        exec(compile(ast.Module(imports, []), chapter, "exec"), scope)  # noqa: S102
    return scope


def said(code: str, names: dict) -> str | None:
    """What running ``code`` with ``names`` defined says: None if it passes, else its message."""
    scope = {"math": math, **names}  # what earlier cells of a chapter imported
    try:
        exec(compile(code, "<test cell>", "exec"), scope)  # noqa: S102
    except Mistake as err:
        return str(err)
    return None


def _questions():
    for chapter in CHAPTERS:
        for grade_id, source in instructor_cells(chapter).items():
            found = answer_keys.key_of(source, grade_id)
            if found is not None and isinstance(found[1]["right"], str):  # not a labelling
                yield pytest.param(chapter, grade_id, id=grade_id)


def _tries(source: str, grade_id: str) -> tuple[str, list]:
    """The answer's name and the answers to try: the right one written several ways, each
    known slip, and wrong answers no hint names."""
    calls = []

    def number(answer, gid, expected=None, *, hints=None, **_):
        if expected is not None:
            calls.append([expected, float(expected), *(hints or {}), expected + 1, -1.5])
            if float(expected).is_integer():
                calls[-1] += [np.int64(expected), np.float32(expected), int(expected) - 1]

    def choice(answer, gid, choices="", correct=None, why_not=None, **_):
        if correct is not None:
            calls.append([correct, correct.upper(), f" {correct} ", *choices, "z"])

    scope = {"check_number": number, "check_choice": choice}
    exec(answer_keys.hidden_code(source), scope, answer_keys._Unknown(scope))  # noqa: S102
    call = answer_keys._visible_call(ast.parse(source), grade_id)
    return call.args[0].id, calls[0]


@pytest.mark.parametrize("chapter,grade_id", list(_questions()))
def test_each_question_cell_gives_the_graders_verdict_and_message(chapter, grade_id):
    instructor = instructor_cells(chapter)[grade_id]
    learner = released_cells(chapter)[grade_id]
    assert "key=" in learner and "expected=" not in learner and "correct=" not in learner
    name, tries = _tries(instructor, grade_id)
    verdicts = [said(instructor, {name: t}) for t in tries]
    assert verdicts[0] is None and any(verdicts)  # the right answer passes, slips do not
    assert [said(learner, {name: t}) for t in tries] == verdicts


def _wrong_answers():
    for chapter in CHAPTERS:
        answers = importlib.import_module(f"tests.answers.{chapter[:4]}")
        for cell, options in answers.WRONG.items():
            for k, (source, messages) in enumerate(options):
                yield pytest.param(chapter, source, messages, id=f"{cell}-{k}")


@pytest.mark.slow  # about two minutes on two loaded cores: every chapter's visible checks
@pytest.mark.parametrize("chapter,source,messages", list(_wrong_answers()))
def test_each_typical_wrong_answer_fails_the_visible_tests_with_the_graders_message(
    chapter, source, messages
):
    names = dict(chapter_imports(chapter))
    exec(compile(source, "<answer>", "exec"), names)  # noqa: S102
    cells = released_cells(chapter)
    for test_id, message in messages.items():
        got = said(cells[test_id], names)
        assert got is not None, f"{test_id} passes this wrong answer"
        assert message in got


@pytest.mark.slow  # runs chapter 00 in a kernel, thoroughly
def test_forge_course_check_reports_each_wrong_answer_with_the_graders_message(tmp_path, capsys):
    """ch00 answered wrong throughout: `forge-course check` fails every test, with the message
    the grader gives (thorough checks for the exercises, answer keys for the questions)."""
    import nbformat

    from forge_course.check import main as check
    from tests.answers import ch00

    chapter = "ch00_training_arithmetic"
    nb = nbformat.read(release.REPO / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
    expected = {}
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in ch00.WRONG:
            cell.source, messages = ch00.WRONG[grade_id][0]
            expected.update(messages)
    path = tmp_path / chapter / f"{chapter}.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    assert check([str(path)]) == 1
    report = capsys.readouterr().out
    tests = [line.split()[1] for line in report.splitlines() if line[:4] in {"PASS", "FAIL"}]
    assert tests and all(f"FAIL  {t}" in report for t in tests), report
    assert all(message in report for message in expected.values()), report
    assert "0 of 9 points, checked as the grader checks them." in report


def test_ch00_names_the_floor_division_slip_in_the_learners_own_cell():
    """The most common slip of chapter 00, ``N // B`` for the number of batches, is named by
    the question's visible test, as the grader names it."""
    cell = released_cells("ch00_training_arithmetic")["ch00_q_iterations"]
    message = said(cell, {"q_iterations": 50_000 // 256})
    assert message is not None and "50,000 // 256 rounds down" in message
    assert said(cell, {"q_iterations": math.ceil(50_000 / 256)}) is None


def test_check_says_which_answers_a_graded_copy_cannot_judge():
    """A graded class's notebook has no answer keys: a question that passes there passed on its
    form only, and `forge-course check` neither counts it as right nor exits 0 on it."""
    from forge_course.check import TestResult, _form_only, report

    graded = "check_number(q_updates, 'ch00_q_updates')"
    keyed = released_cells("ch00_training_arithmetic")["ch00_q_updates"]
    assert _form_only(graded) and not _form_only(keyed)
    text = report([TestResult("ch00_q_updates", 1, True, "", form_only=True),
                   TestResult("ch00_update_schedule_tests", 3, True, "")])  # fmt: skip
    assert "FORM  ch00_q_updates" in text and "PASS  ch00_update_schedule_tests" in text
    assert "3 of 3 points, checked as the grader checks them." in text
    assert "1 answer(s) of the right form, not judged here" in text
