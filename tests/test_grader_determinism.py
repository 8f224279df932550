"""A grade depends on the answer alone: the same class, any ``--jobs``, any order, same grades.

The chapters here are those whose checks draw random numbers or change process-wide settings
while they observe the reference (seeds, generators' states, thread counts): each class holds
two copies of the instructor's solution and one of each typical wrong answer, graded with one
job and with four (so in another order, and side by side).
"""

import nbformat
import pytest

from forge_course.grader import run
from forge_course.release import build_sources, generate_release
from tests.conftest import REPO
from tests.test_autograde import _answers, _solutions, _submission

pytestmark = pytest.mark.slow

CHAPTERS = ["ch04_one_training_step", "ch06_evaluation_loop", "ch09_production_loop"]


def _class(root, chapter) -> dict[str, dict]:
    build_sources(REPO, root / "build" / "source")
    generate_release(root, [chapter])
    name = f"{chapter}.ipynb"
    source = nbformat.read(root / "build" / "source" / chapter / name, as_version=4)
    released = nbformat.read(root / "notebooks" / chapter / name, as_version=4)
    solved, wrong = _solutions(source), _answers(chapter).WRONG
    students = {f"solution_{i}": solved for i in range(2)}
    for cell, options in wrong.items():
        students[f"wrong_{cell}"] = {**solved, cell: options[0][0]}
    for student, replacements in students.items():
        path = root / "submitted" / student / chapter / name
        path.parent.mkdir(parents=True)
        nbformat.write(_submission(released, replacements), path)
    return students


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_same_class_gets_the_same_grades_with_any_number_of_jobs(chapter, tmp_path):
    students = _class(tmp_path, chapter)
    grades = {}
    for jobs in (1, 4):
        grades[jobs] = run.grade([chapter], submitted=tmp_path / "submitted", jobs=jobs,
                                 grading=tmp_path / f"jobs{jobs}", progress=False, unsafe=True,
                                 seed=99, force=True)  # fmt: skip
    assert grades[1] == grades[4]
    for i in range(2):
        results = grades[1][(f"solution_{i}", chapter)]
        assert all(r["status"] == "graded" for r in results.values()), results
    for student in students:
        if student.startswith("wrong_"):
            statuses = [r["status"] for r in grades[1][(student, chapter)].values()]
            assert "wrong" in statuses, (student, statuses)
    csvs = [(tmp_path / f"jobs{jobs}" / "grades.csv").read_text() for jobs in (1, 4)]
    assert csvs[0] == csvs[1]
