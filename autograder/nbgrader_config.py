"""nbgrader configuration for forge-course.

The repository is the course root: `make release` builds `solutions/` into `build/source/`, lets
nbgrader release it into `build/release/` and copies a cleaned release into `notebooks/`, which
nbgrader itself never writes (the Formgrader's "Generate" writes `build/release/`). Everything a
grading run creates (LMS downloads, submissions, autograded copies, feedback, the gradebook,
the exchange, nbgrader's CSV export) lives in `grading/`, which git ignores. `FORGE_COURSE_ROOT`
moves the whole course (the tests grade in a temporary copy); `FORGE_GRADING_DIR` moves only the
grading workspace.
"""

import os
from pathlib import Path

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import ClearHiddenTests, GetGrades

from forge_course.grader.collect import LmsCollector, LmsExtractor
from forge_course.grading.feedback import TracebacksToMessages

c = get_config()  # noqa: F821  (nbgrader provides it when it loads this file)

root = Path(os.environ.get("FORGE_COURSE_ROOT", Path(__file__).resolve().parent.parent))
grading = Path(os.environ.get("FORGE_GRADING_DIR", root / "grading"))
(grading / "exchange").mkdir(parents=True, exist_ok=True)

c.CourseDirectory.course_id = "forge-course"
c.CourseDirectory.root = str(root)
c.CourseDirectory.source_directory = "build/source"
c.CourseDirectory.release_directory = "build/release"
c.CourseDirectory.submitted_directory = str(grading / "submitted")
c.CourseDirectory.autograded_directory = str(grading / "autograded")
c.CourseDirectory.feedback_directory = str(grading / "feedback")
c.CourseDirectory.db_url = f"sqlite:///{grading / 'gradebook.db'}"
c.Exchange.root = str(grading / "exchange")
# Student ids and messages reach the CSV: every field quoted, none read as a formula.
c.ExportApp.plugin_class = "forge_course.grader.export.SafeCsvExport"
c.ExportPlugin.to = str(grading / "nbgrader_grades.csv")

# `nbgrader zip_collect CHAPTER` reads an LMS's download from grading/downloaded/CHAPTER/archive/.
c.ZipCollectApp.collect_directory_structure = str(
    grading / "{downloaded}" / "{assignment_id}" / "{collect_step}"
)
c.ZipCollectApp.collector_plugin = LmsCollector
# An archive a student uploaded is unpacked once, and one that cannot be is left as it is (nbgrader
# would stop collecting the whole class at it).
c.ZipCollectApp.extractor_plugin = LmsExtractor
# How each LMS names a submission in its "download all submissions" zip. Each pattern reads one
# name of a file's path inside the download: a folder (no file_id group) or the file itself. The
# first name from the top that a pattern reads is the LMS's; all below it is that student's. The
# LMS that reads every such name in a folder reads each of them (earlier ones first); a group
# "ambiguous" that matches refuses the file. tests/lms/ holds one sample download of each.
c.LmsCollector.patterns = {
    # Moodle 3.1 and later: a folder per student, "Full Name_<participant number>_assignsubmission
    # _file" (older versions end it with "_"). The number changes with every assignment, so the
    # name is the id; the number only tells apart two students of the same name (both refused).
    "Moodle": r"(?P<student_id>[^/]+)_(?P<participant>\d+)_assignsubmission_file_?",
    # Moodle with "Download submissions in folders" off: the same prefix on every file. A
    # student's display name and file name are both their own: a name that holds the prefix
    # twice cannot be split.
    "Moodle, without folders": (
        r"(?P<student_id>[^/]+?)_(?P<participant>\d+)_assignsubmission_file_"
        r"(?P<ambiguous>(?=[^/]*_\d+_assignsubmission_file_))?(?P<file_id>[^/]+)"
    ),
    # Blackboard Learn: "<Assignment>_<username>_attempt_<YYYY-MM-DD-HH-MM-SS>_<file>", plus a
    # receipt "<Assignment>_<username>_attempt_<date>.txt" that is not collected. The first
    # "_attempt_<date>_" is Blackboard's; a later one is part of the file's name.
    "Blackboard": (
        r"[^/]*?_(?P<student_id>[^/_]+)_attempt_"
        r"(?P<timestamp>\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d)_(?P<file_id>[^/]+)"
    ),
    # Canvas: "<lastnamefirstname>_[late_]<user id>_<file id>_<file>", the name lower-cased
    # without spaces or punctuation and left out under anonymous grading; the user id is the id
    # Canvas's gradebook import matches. A file submitted twice gets "-1" before its extension.
    "Canvas": r"(?:[^/]*?_)?(?:late_)?(?P<student_id>\d+)_\d+_(?P<file_id>[^/]+)",
}

# A chapter runs in under 60 s in total; one cell stuck for 120 s is a loop that will not end.
c.Execute.timeout = 120
# The kernel's state is not needed after grading; a polite shutdown costs about 2.4 s each.
c.Execute.shutdown_kernel = "immediate"
# A deleted test cell must still count (as zero), not silently become "needs manual grade".
c.OverwriteCells.add_missing_cells = True
# Feedback shows each test's message, never the code of hidden tests (nor tracebacks quoting it).
c.GenerateFeedback.preprocessors = [
    GetGrades,
    ClearHiddenTests,
    TracebacksToMessages,
    CSSHTMLHeaderPreprocessor,
]
