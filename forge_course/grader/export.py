"""CSV that a spreadsheet reads as data: every field quoted, none of them a formula.

Student ids come from folder names and messages from answers, so a field may begin with ``=``,
``+``, ``-``, ``@``, a tab or a carriage return, or hold a newline and commas. Opened in a
spreadsheet, the first is run as a formula; written unquoted, the second adds rows. Every CSV
the course writes goes through `csv_text`, and nbgrader's own ``nbgrader export`` uses
`SafeCsvExport` (set in ``autograder/nbgrader_config.py``).
"""

from __future__ import annotations

from nbgrader.api import MissingEntry
from nbgrader.plugins.export import CsvExportPlugin

from forge_course.grader.text import csv_text

NBGRADER_COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name",
                    "first_name", "email", "raw_score", "late_submission_penalty", "score",
                    "max_score"]  # fmt: skip


class SafeCsvExport(CsvExportPlugin):
    """nbgrader's CSV export, the same columns and rows, through `csv_text`."""

    def export(self, gradebook) -> None:
        students, assignments = set(map(str, self.student)), set(map(str, self.assignment))
        rows = [NBGRADER_COLUMNS]
        for assignment in gradebook.assignments:
            if assignments and assignment.name not in assignments:
                continue
            for student in gradebook.students:
                if students and student.id not in students:
                    continue
                try:
                    sub = gradebook.find_submission(assignment.name, student.id)
                    when, raw, late = sub.timestamp, sub.score, sub.late_submission_penalty
                except MissingEntry:
                    when, raw, late = "", 0.0, 0.0
                rows.append([assignment.name, assignment.duedate or "", when or "", student.id,
                             student.last_name or "", student.first_name or "",
                             student.email or "", raw, late, max(0.0, raw - late),
                             assignment.max_score])  # fmt: skip
        with open(self.to or "grades.csv", "w", encoding="utf-8", newline="") as f:
            f.write(csv_text(rows))
