"""nbgrader configuration for forge-course.

The repository is the course root: `make release` writes the learner notebooks into
`notebooks/` from the notebooks built out of `solutions/` in `build/source/`. Everything a grading
run creates (submissions, autograded copies, feedback, the gradebook, the exchange) lives in
`grading/`, which git ignores. `FORGE_COURSE_ROOT` moves the whole course (the tests grade in a
temporary copy); `FORGE_GRADING_DIR` moves only the grading workspace.
"""

import os
from pathlib import Path

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import ClearHiddenTests, GetGrades

from forge_course.grading.feedback import TracebacksToMessages

c = get_config()  # noqa: F821  (nbgrader provides it when it loads this file)

root = Path(os.environ.get("FORGE_COURSE_ROOT", Path(__file__).resolve().parent.parent))
grading = Path(os.environ.get("FORGE_GRADING_DIR", root / "grading"))
(grading / "exchange").mkdir(parents=True, exist_ok=True)

c.CourseDirectory.course_id = "forge-course"
c.CourseDirectory.root = str(root)
c.CourseDirectory.source_directory = "build/source"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = str(grading / "submitted")
c.CourseDirectory.autograded_directory = str(grading / "autograded")
c.CourseDirectory.feedback_directory = str(grading / "feedback")
c.CourseDirectory.db_url = f"sqlite:///{grading / 'gradebook.db'}"
c.Exchange.root = str(grading / "exchange")
# Student ids and messages reach the CSV: every field quoted, none read as a formula.
c.ExportApp.plugin_class = "forge_course.grader.export.SafeCsvExport"

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
