"""A grade depends on the answer alone: the same class, any ``--jobs``, any order, same grades.

One class holds every chapter: each chapter's instructor solution and one typical wrong answer,
so each run mixes right and wrong answers of every chapter, graded side by side. It is graded
with one job, then with four after the students' folders are renamed into the reverse order:
the solution is then graded after the wrong answer instead of before it, on more jobs than the
machine has cores. The grades and the CSV (names mapped back) must be the same.
"""

import csv

import pytest

from forge_course.grader import run
from forge_course.grading.core import _EXPECTED
from tests.conftest import CHAPTERS
from tests.helpers.classes import build_class
from tests.test_autograde import _answers

pytestmark = pytest.mark.slow


STUDENTS = ("solution", "wrong")


def _class(root) -> None:
    def answers(chapter, solved):
        cell, options = next(iter(_answers(chapter).WRONG.items()))
        wrong = {**solved, cell: options[0][0]}
        return {student: wrong if student == "wrong" else solved for student in STUDENTS}

    build_class(root, CHAPTERS, answers)


def _grade(folder, grading, jobs):
    return run.grade(CHAPTERS, submitted=folder, jobs=jobs, grading=grading, progress=False,
                     unsafe=True, seed=99, force=True)  # fmt: skip


def test_the_same_class_gets_the_same_grades_with_any_number_of_jobs_in_any_order(tmp_path):
    _class(tmp_path)
    one = _grade(tmp_path / "submitted", tmp_path / "jobs1", 1)

    # Renamed into the reverse order: the students meet other neighbours, on four jobs.
    renamed = {f"{i}_{name}": name for i, name in enumerate(reversed(STUDENTS))}
    for new, old in renamed.items():
        (tmp_path / "submitted" / old).rename(tmp_path / "submitted" / new)
    # Nothing the first run observed is reused: the four jobs observe every reference and known
    # mistake afresh, beside each other's judges.
    _EXPECTED.clear()
    four = _grade(tmp_path / "submitted", tmp_path / "jobs4", 4)
    assert {(renamed[student], chapter): r for (student, chapter), r in four.items()} == one

    rows = {}
    for jobs in (1, 4):
        with open(tmp_path / f"jobs{jobs}" / "grades.csv", newline="") as f:
            rows[jobs] = sorted(
                tuple({**row, "student": renamed.get(row["student"], row["student"])}.values())
                for row in csv.DictReader(f)
            )
    assert rows[1] == rows[4]

    for (student, chapter), results in one.items():
        statuses = [r["status"] for r in results.values()]
        if student.startswith("solution"):
            assert set(statuses) == {"graded"}, (student, chapter, results)
        else:
            assert "wrong" in statuses, (student, chapter, statuses)
