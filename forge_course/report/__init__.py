"""`forge-course report`: what a graded class got wrong, one self-contained page per chapter.

Writes into ``grading/report/``: ``<chapter>.html`` (`page`), ``<chapter>-questions.csv`` (one
row per exercise), ``<chapter>-mistakes.csv`` (one row per mistake and exercise) and
``<chapter>-students.csv`` (one row per student, one column per exercise: the layout of an
LMS's grade import), from what `results` reads of the graded class.
"""

from __future__ import annotations

import html
import statistics
from pathlib import Path

from forge_course.grader.text import csv_text
from forge_course.report.page import figures, render
from forge_course.report.results import (
    NOT_AVAILABLE,
    STATUSES,
    Class,
    Exercise,
    exercises,
    from_gradebook,
    from_ledger,
    summary,
)

# --- the CSV files ------------------------------------------------------------------------


def _r(x: float | None) -> float | str:
    return "" if x is None else round(x, 4)


def questions_csv(cls: Class, found: list[Exercise]) -> list[list]:
    status_columns = STATUSES if cls.source == "ledger" else []
    rows = [
        [
            "exercise",
            "max_points",
            "students",
            "mean",
            "median",
            "share_zero",
            "share_full",
            "discrimination",
            "flag",
            *status_columns,
            "named_mistakes",
            "unnamed_failures",
        ]
    ]
    for ex in found:
        statuses = [ex.statuses[s] for s in status_columns]
        mistakes = [sum(ex.mistakes.values()), sum(ex.unnamed.values())]
        rows.append(
            [
                ex.name,
                ex.max_points,
                len(ex.points),
                _r(ex.mean),
                _r(statistics.median(ex.points)),
                _r(ex.share(0.0)),
                _r(ex.share(ex.max_points)),
                _r(ex.discrimination),
                ex.flag(),
                *statuses,
                *(mistakes if cls.source == "ledger" else [NOT_AVAILABLE] * 2),
            ]
        )
    return rows


def mistakes_csv(cls: Class, found: list[Exercise]) -> list[list]:
    rows = [["exercise", "mistake", "named", "students", "share", "example_feedback"]]
    n = len(cls.students)
    for ex in found:
        for named, counter in ((True, ex.mistakes), (False, ex.unnamed)):
            for mistake, count in counter.most_common():
                rows.append(
                    [
                        ex.name,
                        mistake,
                        "yes" if named else "no",
                        count,
                        _r(count / n),
                        ex.examples[mistake],
                    ]
                )
    return rows


def students_csv(cls: Class, found: list[Exercise]) -> list[list]:
    """One row per student: the id, then one column per exercise, then the chapter's total."""
    rows = [["student_id", *(ex.name for ex in found), f"{cls.assignment} total"]]
    for s in cls.students:
        points = [s.results[ex.name]["points"] if ex.name in s.results else 0.0 for ex in found]
        rows.append([s.id, *points, sum(points)])
    return rows


def report(
    assignment: str, grading: Path, submitted: Path | None = None, gradebook: bool = False
) -> tuple[Path, list[str]]:
    """Write the chapter's page and CSV files; return the page's path and the summary."""
    if gradebook or not (grading / "forge" / assignment).is_dir():
        cls = from_gradebook(assignment, grading / "gradebook.db")
    else:
        cls = from_ledger(assignment, grading, submitted)
    out = grading / "report"
    out.mkdir(parents=True, exist_ok=True)
    found = exercises(cls)
    if not found:
        lines = [f"{assignment}: no graded submission to report on."]
        (out / f"{assignment}.html").write_text(
            f"<!DOCTYPE html><html lang='en'><meta charset='utf-8'><title>{assignment}</title>"
            f"<p>{html.escape(lines[0])}</p></html>\n"
        )
        return out / f"{assignment}.html", lines
    (out / f"{assignment}-questions.csv").write_text(csv_text(questions_csv(cls, found)))
    (out / f"{assignment}-mistakes.csv").write_text(csv_text(mistakes_csv(cls, found)))
    (out / f"{assignment}-students.csv").write_text(csv_text(students_csv(cls, found)))
    (out / f"{assignment}.html").write_text(render(cls, found, figures(cls, found), grading))
    return out / f"{assignment}.html", summary(found)
