"""The round trip with real nbgrader: release, submit, autograde, feedback.

For each chapter, in a temporary copy of the course: the solved notebook scores full marks, the
untouched release scores zero, each wrong answer loses its exercise's points with feedback that
names the mistake (and only that exercise's points), a differently written correct answer scores
full marks, and an answer that calls the reference scores nothing. nbgrader grades one
submission that mixes these kinds (`_mixed`), `forge-course grade` grades them all, and the two
agree point for point.

nbgrader runs through its Python API, in this process, with the course's `nbgrader_config.py`:
the applications its command line would start, without the seconds each command spends
importing nbgrader. The commands themselves, as the README gives them, run in
`tests/test_nbgrader_workflow.py`.
"""

import importlib
from html import unescape

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.apps import NbGraderAPI
from traitlets.config.loader import PyFileConfigLoader

from forge_course.grader import run as grader_run
from forge_course.release import build_sources, generate_release
from tests.conftest import CHAPTERS, REPO


def _answers(chapter):
    return importlib.import_module(f"tests.answers.{chapter[:4]}")


def _solutions(source_nb):
    """grade_id -> source of every solution cell, as the instructor wrote it."""
    return {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in source_nb.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }


def _submission(release_nb, replacements):
    nb = nbformat.from_dict(release_nb)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in replacements:
            cell.source = replacements[grade_id]
    return nb


def _nbgrader(root, monkeypatch) -> NbGraderAPI:
    """nbgrader on the course copy at ``root``, configured as its command line would be."""
    monkeypatch.setenv("FORGE_COURSE_ROOT", str(root))  # read by the config, kept for the kernels
    config = PyFileConfigLoader("nbgrader_config.py", str(REPO / "autograder")).load_config()
    return NbGraderAPI(config=config)


def _test_outputs(nb):
    """grade_id of each graded cell -> the text of its error, or '' when it passed."""
    texts = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            errors = [o for o in cell.outputs if o.output_type == "error"]
            texts[meta["grade_id"]] = "\n".join(f"{e.ename}: {e.evalue}" for e in errors)
    return texts


# Graded by nbgrader as well as by forge-course grade: one "mixed" student per chapter, whose
# answer cells take turns (exercises first): a typical wrong answer, a call of the reference, a
# correct answer written differently. So one notebook takes each of nbgrader's paths: to zero
# with the mistake named, to zero for calling the reference, and to full marks (hidden tests put
# back, executed, scored, recorded). Every notebook nbgrader runs costs the chapter's whole run
# time (each chapter's slowest part here), so the other submissions, which the same checks
# judge, go through forge-course grade alone, and each grade of the mixed student must agree.
# The instructor's solution runs with every test cell, hidden tests included, in
# `tests/test_notebooks.py`.
NBGRADER_STUDENTS = ("mixed",)
ROLES = ("wrong", "reference", "alternative")
CALLS_REFERENCE = "calls forge_course's reference"


def _mixed(answers, alternative: dict) -> tuple[dict, dict]:
    """The mixed student's cells, and each test it must fail with what the failure must say."""
    cells, failing = dict(alternative), {}
    order = sorted(answers.WRONG, key=lambda cell: cell.endswith("_questions"))
    for i, cell in enumerate(order):
        role = ROLES[i % len(ROLES)]
        if role == "reference" and cell not in answers.REFERENCE_CALLER:
            role = "wrong"
        if role == "wrong":
            cells[cell], fails = answers.WRONG[cell][0]
            failing.update(fails)
        elif role == "reference":
            cells[cell] = answers.REFERENCE_CALLER[cell]
            failing[f"{cell}_tests"] = CALLS_REFERENCE
    return cells, failing


# Every chapter's self-study notebook (answer keys in its question cells), and one chapter's
# graded-class edition (`forge-course release --graded`, no keys): both grade the same.
EDITIONS = [pytest.param(c, False, id=c) for c in CHAPTERS] + [
    pytest.param("ch00_training_arithmetic", True, id="ch00_training_arithmetic-graded")
]


@pytest.mark.slow
@pytest.mark.parametrize("chapter,graded", EDITIONS)
def test_round_trip(chapter, graded, tmp_path, monkeypatch):
    """One nbgrader run per chapter (it is the slow part); every check collected, then reported."""
    root = tmp_path
    build_sources(REPO, root / "build" / "source", [chapter])
    handout = generate_release(root, [chapter], graded=graded)
    name = f"{chapter}.ipynb"
    source = nbformat.read(root / "build" / "source" / chapter / name, as_version=4)
    released = nbformat.read(handout / chapter / name, as_version=4)
    answers = _answers(chapter)
    solved = _solutions(source)
    # Every submission but the blank one answers the cells it does not change correctly. The
    # blank one calls the reference where it can: cells left as released and cells that call
    # the reference must both score nothing.
    students = {
        "solution": solved,
        "blank": dict(answers.REFERENCE_CALLER),
        "alternative": {**solved, **answers.ALTERNATIVE},
    }
    rounds = max(len(v) for v in answers.WRONG.values())
    for k in range(rounds):
        wrong = {c: v[k][0] for c, v in answers.WRONG.items() if len(v) > k}
        students[f"wrong_{k + 1}"] = {**solved, **wrong}
    students["mixed"], mixed_failing = _mixed(answers, students["alternative"])
    failing_of = {f"wrong_{k + 1}": {} for k in range(rounds)}
    for options in answers.WRONG.values():
        for k, (_, fails) in enumerate(options):
            failing_of[f"wrong_{k + 1}"].update(fails)
    failing_of["mixed"] = mixed_failing
    for student, replacements in students.items():
        folder = "submitted" if student in NBGRADER_STUDENTS else "forge_only"
        path = root / "grading" / folder / student / chapter / name
        path.parent.mkdir(parents=True)
        nbformat.write(_submission(released, replacements), path)

    nbgrader = _nbgrader(root, monkeypatch)
    run = nbgrader.autograde(chapter, "*", force=True)  # every student, as `nbgrader autograde`
    assert run["success"], run.get("log", "") + run.get("error", "")
    # student -> test -> (points, max points, what the test said)
    verdicts = {}
    with Gradebook(f"sqlite:///{root / 'grading' / 'gradebook.db'}") as gb:
        for student in NBGRADER_STUDENTS:
            sub = gb.find_submission_notebook(chapter, chapter, student)
            graded = root / "grading" / "autograded" / student / chapter / name
            said = _test_outputs(nbformat.read(graded, as_version=4))
            verdicts[student] = {g.name: (g.score, g.max_score, said[g.name]) for g in sub.grades}

    # forge-course grade, on every submission, two at a time (the default on two cores), in
    # isolated workers, agrees point for point with nbgrader where both graded.
    problems = []
    for student in set(students) - set(NBGRADER_STUDENTS):
        (root / "grading" / "forge_only" / student).rename(root / "grading" / "submitted" / student)
    forge = grader_run.grade([chapter], submitted=root / "grading" / "submitted", jobs=2,
                             progress=False, course_root=REPO, grading=root / "forge",
                             unsafe=True)  # fmt: skip
    for student in students:
        for test, r in forge[(student, chapter)].items():
            said = f"{r['status']}: {r['message']}"
            if student not in NBGRADER_STUDENTS:
                verdicts.setdefault(student, {})[test] = (r["points"], r["max_points"], said)
            elif r["points"] != verdicts[student][test][0]:
                problems.append(
                    f"forge-course grade gives {student} {r['points']} on {test}, "
                    f"nbgrader {verdicts[student][test][0]}: {said[:300]}"
                )

    for test, (score, top, said) in verdicts["solution"].items():
        if score != top:
            problems.append(f"solution loses points on {test}: {said}")
    for test, (score, _, _) in verdicts["blank"].items():
        if score != 0:
            problems.append(f"the blank release (or a reference call) scores on {test}")
    for test, (score, top, said) in verdicts["alternative"].items():
        if score != top:
            problems.append(f"a correct alternative fails {test}: {said}")
    for cell in answers.REFERENCE_CALLER:  # forge-course grade refuses the import itself
        said = verdicts["blank"][f"{cell}_tests"][2]
        if "imports forge_course, where the references" not in said:
            problems.append(f"calling the reference is not named: {said}")
    for student, failing in failing_of.items():
        for test, (score, top, said) in verdicts[student].items():
            if test not in failing:
                if score != top:
                    problems.append(f"{student} loses points on {test}, which it answered: {said}")
            elif score != 0:
                problems.append(f"{student} keeps the points of {test}")
            elif failing[test] not in said:
                problems.append(f"{student}: {test} should say {failing[test]!r}; it says {said!r}")

    run = nbgrader.generate_feedback(chapter, "mixed", force=True)
    assert run["success"], run.get("log", "") + run.get("error", "")
    html = (root / "grading" / "feedback" / "mixed" / chapter / f"{chapter}.html").read_text()
    for secret in ("thorough=True", "BEGIN HIDDEN TESTS"):
        if secret in html:
            problems.append(f"the feedback shows hidden test code ({secret!r})")
    shown = unescape(html)
    for test, message in failing_of["mixed"].items():
        if message not in shown:
            problems.append(f"the feedback does not say what {test} found: {message!r}")
    assert not problems, "\n".join(problems)
