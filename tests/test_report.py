"""`forge-course report` on a class of known make-up, graded for real, and on hand-made data.

The class: chapter 04 submissions built from the wrong answers of `tests/answers/ch04.py` in
known numbers, plus one that loops forever, one malformed notebook and one that tampers. Every
count, mean, share and mistake frequency the report writes is compared with the construction.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from forge_course import report
from forge_course.grader import run, sandbox
from forge_course.release import build_sources, generate_release
from forge_course.report import page as report_page
from forge_course.report import results
from tests.answers import ch04 as answers
from tests.conftest import REPO

CH = "ch04_one_training_step"
HAND, TRAIN, QUESTIONS = "ch04_hand_step", "ch04_train_step", "ch04_questions"
SOLVED = REPO / "autograder" / "examples" / "alice" / CH / f"{CH}.ipynb"
LIMITS = sandbox.Limits(seconds=15, memory_mb=3072)

NO_MEAN, WRONG_SIGN, _ = ((HAND, *w) for w in answers.WRONG[HAND])
NO_ZERO_GRAD, _, RETURNS_TENSOR, EVAL_MODE, *_ = ((TRAIN, *w) for w in answers.WRONG[TRAIN])
QUESTIONS_A, QUESTIONS_B = ((QUESTIONS, *w) for w in answers.WRONG[QUESTIONS])
LOOP = "def train_step(*args):\n    while True:\n        pass\n"
TAMPER = "import torch\ntorch.allclose = lambda *a, **k: True\ndef train_step(*a):\n    return 0\n"

# student -> the wrong answers in their notebook: (solution cell, answer, {test: phrase}).
CLASS = {
    "s01": [],
    "s02": [],
    "s03": [],
    "s04": [],
    "s05-alternative": [],
    "s06": [NO_MEAN],
    "s07": [NO_MEAN, NO_ZERO_GRAD],
    "s08": [WRONG_SIGN],
    "s09": [NO_ZERO_GRAD],
    "s10": [RETURNS_TENSOR, QUESTIONS_A],
    "s11": [QUESTIONS_B],
    "s12": [EVAL_MODE],
}
# student -> (replaced cells, the status every test of those cells ends with)
ODD = {
    "s13-loop": ({TRAIN: LOOP}, "timeout"),
    "s14-malformed": (None, "malformed"),
    "s15-tampered": ({TRAIN: TAMPER}, "tampered"),
}
TESTS_OF = {HAND: [f"{HAND}_tests"], TRAIN: [f"{TRAIN}_tests"],
            QUESTIONS: ["ch04_q_grad_multiple", "ch04_q_softmax"]}  # fmt: skip


def _notebook(cells: dict[str, str]):
    nb = nbformat.read(SOLVED, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in cells:
            cell.source = cells[grade_id]
    return nb


def _max_points() -> dict[str, float]:
    nb = nbformat.read(SOLVED, as_version=4)
    meta = [c.metadata.get("nbgrader", {}) for c in nb.cells]
    return {m["grade_id"]: float(m["points"]) for m in meta if m.get("grade")}


def build_class(submitted, students=CLASS, odd=ODD) -> None:
    for student, wrong in students.items():
        cells = {cell: text for cell, text, _ in wrong}
        if student.endswith("alternative"):
            cells = dict(answers.ALTERNATIVE)
        path = submitted / student / CH / f"{CH}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(_notebook(cells), path)
    for student, (cells, _) in odd.items():
        path = submitted / student / CH / f"{CH}.ipynb"
        path.parent.mkdir(parents=True)
        if cells is None:
            path.write_text('{"cells": [')  # cut short: not JSON
        else:
            nbformat.write(_notebook(cells), path)


def expected_statuses() -> dict[str, dict[str, str]]:
    """test -> student -> the status the construction gives it."""
    tests = _max_points()
    found = {t: {} for t in tests}
    for student, wrong in CLASS.items():
        failing = {t for cell, _, _ in wrong for t in TESTS_OF[cell]}
        for t in tests:
            found[t][student] = "wrong" if t in failing else "graded"
    for student, (cells, status) in ODD.items():
        failing = set(tests) if cells is None else {t for c in cells for t in TESTS_OF[c]}
        for t in tests:
            found[t][student] = status if t in failing else "graded"
    return found


def _csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    grading = tmp_path_factory.mktemp("class") / "grading"
    build_class(grading / "submitted")
    run.grade(grading=grading, jobs=2, limits=LIMITS, progress=False, unsafe=True)
    page, _ = report.report(CH, grading, grading / "submitted")
    return grading, page


# --- pure functions: no grading ---------------------------------------------------------


def test_discrimination_equals_a_hand_computation():
    # Five students, one exercise of 1 point in a chapter of 3. Rest of the chapter (total less
    # the item): 1, 2, 1, 0, 2. Means 0.6 and 1.2; deviations of the item -.6 .4 .4 -.6 .4, of
    # the rest -.2 .8 -.2 -1.2 .8. Covariance sum 1.4; sums of squares 1.2 and 2.8.
    item, totals = [0, 1, 1, 0, 1], [1, 3, 2, 0, 3]
    assert results.discrimination(item, totals) == pytest.approx(1.4 / math.sqrt(1.2 * 2.8))
    # An item that does not vary has no correlation to report.
    assert results.discrimination([1, 1, 1], [1, 2, 3]) is None


def test_a_class_without_wrong_answers_says_so(tmp_path):
    full = {t: {"status": "graded", "points": p, "max_points": p, "message": ""}
            for t, p in _max_points().items()}  # fmt: skip
    cls = results.Class(CH, "ledger", [results.Student(f"s{i}", full) for i in range(3)], [], {})
    found = results.exercises(cls)
    rows = report.questions_csv(cls, found)
    assert all(r[rows[0].index("discrimination")] == "" for r in rows[1:])
    assert all(r[rows[0].index("share_full")] == 1.0 for r in rows[1:])
    assert len(report.mistakes_csv(cls, found)) == 1  # its header only
    text = report_page.render(cls, found, [])
    assert "No wrong answers" in text
    assert "No named mistakes" in "\n".join(results.summary(found))


def test_named_mistakes_are_told_from_generic_hints():
    hint = "the order is zero_grad, forward, loss, backward, step."
    named = (
        "f: the loss differs.\nLikely mistake: `zero_grad()` is missing; something else differs too"
    )
    assert results.named_mistake(named, hint) == "`zero_grad()` is missing"
    assert results.named_mistake(f"f: the loss differs.\nLikely mistake: {hint}", hint) is None
    assert results.named_mistake("2 is not right: count the first backward too") == (
        "count the first backward too"
    )
    assert results.named_mistake("3 is not right.") is None


# --- the class graded for real ------------------------------------------------------------


@pytest.mark.slow
def test_every_figure_in_the_csv_equals_the_construction(graded):
    grading, _ = graded
    points, statuses = _max_points(), expected_statuses()
    n = len(CLASS) + len(ODD)
    rows = {r["exercise"]: r for r in _csv(grading / "report" / f"{CH}-questions.csv")}
    assert set(rows) == set(points)
    for test, top in points.items():
        row, by_student = rows[test], statuses[test]
        earned = [top if s == "graded" else 0.0 for s in by_student.values()]
        assert int(row["students"]) == n
        assert float(row["max_points"]) == top
        assert float(row["mean"]) == pytest.approx(sum(earned) / n, abs=1e-4)
        assert float(row["share_full"]) == pytest.approx(earned.count(top) / n, abs=1e-4)
        assert float(row["share_zero"]) == pytest.approx(earned.count(0.0) / n, abs=1e-4)
        for status in results.STATUSES:
            assert int(row[status]) == list(by_student.values()).count(status), (test, status)

    mistakes = _csv(grading / "report" / f"{CH}-mistakes.csv")
    made = {}
    for wrong in CLASS.values():
        for _, _, phrases in wrong:
            for test, phrase in phrases.items():
                made[(test, phrase)] = made.get((test, phrase), 0) + 1
    for (test, phrase), count in made.items():
        rows_found = [r for r in mistakes if r["exercise"] == test and phrase in r["mistake"]]
        assert len(rows_found) == 1, (test, phrase, mistakes)
        assert (rows_found[0]["named"], int(rows_found[0]["students"])) == ("yes", count)
        assert float(rows_found[0]["share"]) == pytest.approx(count / n, abs=1e-4)
    named = sum(int(r["students"]) for r in mistakes if r["named"] == "yes")
    assert named == sum(made.values())

    students = {r["student_id"]: r for r in _csv(grading / "report" / f"{CH}-students.csv")}
    assert set(students) == set(CLASS) | set(ODD)
    for test, by_student in statuses.items():
        for student, status in by_student.items():
            want = points[test] if status == "graded" else 0.0
            assert float(students[student][test]) == want, (student, test)


@pytest.mark.slow
def test_a_forged_ledger_entry_never_reaches_the_report(graded, tmp_path):
    import json

    grading = tmp_path / "grading"
    shutil.copytree(graded[0], grading)
    entry = run.Ledger(grading / "forge").path(CH, "s09")
    saved = json.loads(entry.read_text())
    for result in saved["record"]["results"].values():
        result.update(status="graded", points=result["max_points"], message="")
    entry.write_text(json.dumps(saved))
    report.report(CH, grading, grading / "submitted")
    students = {r["student_id"] for r in _csv(grading / "report" / f"{CH}-students.csv")}
    assert "s09" not in students and len(students) == len(CLASS) + len(ODD) - 1
    assert "s09</a>" in (grading / "report" / f"{CH}.html").read_text()  # to look at by hand


@pytest.mark.slow
def test_the_command_prints_the_lowest_means_and_commonest_mistakes(graded):
    grading, _ = graded
    done = subprocess.run(
        [sys.executable, "-m", "forge_course.cli", "report", "ch04"], capture_output=True,
        text=True, env={**os.environ, "FORGE_GRADING_DIR": str(grading)}, check=True,
    )  # fmt: skip
    assert f"{CH}: {grading / 'report' / CH}.html" in done.stdout
    assert "Lowest means:" in done.stdout
    # The two wrong answers each made by two students come first.
    assert "2 × ch04_hand_step_tests" in done.stdout and "2 × ch04_train_step_tests" in done.stdout


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_the_page_opens_in_chromium_with_its_figures_and_links(graded):
    from playwright.sync_api import sync_playwright

    grading, page_path = graded
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update"],
        )  # fmt: skip
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors, requests = [], []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri())
            images = page.eval_on_selector_all(
                "img", "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)"
            )
            links = page.eval_on_selector_all("a", "links => links.map(a => a.href)")
            if os.environ.get("FORGE_REPORT_SCREENSHOT"):  # the README's picture
                page.screenshot(path=os.environ["FORGE_REPORT_SCREENSHOT"], full_page=True)
            assert errors == []
            assert len(images) == 2 and all(images)
            assert all(url.startswith(("file:", "data:")) for url in requests)  # no network
            assert links, "the tampered submission must be linked"
            for url in links:
                page.goto(url)
                assert "feedback for" in page.title(), url
        finally:
            browser.close()


@pytest.mark.slow
def test_nbgrader_autograde_gives_the_same_means(tmp_path, monkeypatch):
    """A smaller class (nbgrader takes seconds a notebook), graded by each, reported by each."""
    # nbgrader runs `alembic` by name: this environment's tools first, as `make` puts them.
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    small = {s: CLASS[s] for s in ("s01", "s07", "s10")}
    root = tmp_path / "course"
    build_sources(REPO, root / "build" / "source")
    generate_release(root, [CH])
    build_class(root / "grading" / "submitted", small, {})
    nbgrader = subprocess.run(
        [sys.executable, "-m", "nbgrader", "autograde", CH, "--force"], cwd=REPO / "autograder",
        env={**os.environ, "FORGE_COURSE_ROOT": str(root)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert nbgrader.returncode == 0, nbgrader.stderr[-2000:]
    report.report(CH, root / "grading", gradebook=True)

    ours = tmp_path / "grading"
    build_class(ours / "submitted", small, {})
    run.grade(grading=ours, jobs=2, limits=LIMITS, progress=False, unsafe=True)
    report.report(CH, ours, ours / "submitted")

    theirs = {r["exercise"]: r for r in _csv(root / "grading/report" / f"{CH}-questions.csv")}
    mine = {r["exercise"]: r for r in _csv(ours / "report" / f"{CH}-questions.csv")}
    assert set(theirs) == set(mine) == set(_max_points())
    for test in mine:
        assert float(theirs[test]["mean"]) == float(mine[test]["mean"]), test
        assert theirs[test]["named_mistakes"] == results.NOT_AVAILABLE
    assert results.NOT_AVAILABLE in (root / "grading/report" / f"{CH}.html").read_text()


def test_the_generic_hints_are_read_from_the_chapters_checks():
    from forge_course.grading import ch04

    hints = results._hints(CH)
    assert hints == {f"{e.grade_id}_tests": e.hint for e in ch04.EXERCISES}
    assert all(hints.values())
