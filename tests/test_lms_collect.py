"""`nbgrader zip_collect`'s file-name patterns (autograder/nbgrader_config.py) on every name that
Canvas, Moodle and Blackboard give a submission; `tests/test_nbgrader_workflow.py` collects a real
download of each."""

import pytest
from traitlets.config.loader import PyFileConfigLoader

from forge_course.grader.collect import LmsCollector, notebook_name, plain_id
from tests.conftest import REPO

NB = "ch04_one_training_step.ipynb"
NAMES = [
    # Canvas: name, optional "late", user id, file id, the file as uploaded.
    ("canvas/doejane_12345_678901_" + NB, "12345", NB, None),
    ("canvas/doejane_late_12345_678901_" + NB, "12345", NB, None),
    ("canvas/smithbob_23456_678902_ch04_one_training_step-1.ipynb", "23456", NB, None),
    ("canvas/23456_678902_" + NB, "23456", NB, None),  # anonymous grading: no name
    # Moodle: a folder per student (4.x, and 3.x with its trailing "_"), or none.
    ("moodle/José Núñez_1234567_assignsubmission_file/" + NB, "jose.nunez", NB, None),
    ("moodle/Jane Doe_1234567_assignsubmission_file_/Copy of " + NB, "jane.doe", NB, None),
    ("Jane Doe_1234567_assignsubmission_file_" + NB, "jane.doe", NB, None),
    # Blackboard: assignment, user name, attempt's time, the file as uploaded.
    (
        "bb/Chapter 4_kim42_attempt_2026-11-21-10-30-00_" + NB,
        "kim42",
        NB,
        "2026-11-21 10:30:00",
    ),
]


@pytest.fixture(scope="module")
def collector():
    """The course's collector, on paths inside a download, with chapter 04 released."""
    config = PyFileConfigLoader("nbgrader_config.py", str(REPO / "autograder")).load_config()
    plugin = LmsCollector(config=config)
    plugin._released = lambda: [NB]
    plugin._inside_download = lambda path: path
    return plugin


@pytest.mark.parametrize(("path", "student", "notebook", "timestamp"), NAMES)
def test_each_lms_name_gives_student_and_notebook(collector, path, student, notebook, timestamp):
    info = collector.collect(path)
    assert info is not None, f"{path} was not collected"
    assert (info["student_id"], info["file_id"], info.get("timestamp")) == (
        student,
        notebook,
        timestamp,
    )


@pytest.mark.parametrize(
    "path",
    [
        "bb/Chapter 4_kim42_attempt_2026-11-21-10-30-00.txt",  # Blackboard's receipt
        "moodle/Jane Doe_1234567_onlinetext_/onlinetext.html",
        "notes/readme.ipynb",  # a notebook no LMS named
    ],
)
def test_what_no_lms_submitted_is_left(collector, path):
    assert collector.collect(path) is None


def test_ids_keep_to_the_graders_rule():
    assert plain_id("Ann-Marie O'Neil") == "ann-marie.o.neil"
    assert plain_id("王伟") == "王伟"  # no Latin letter: kept, and hashed by the grader
    assert notebook_name("other.ipynb", [NB]) == "other.ipynb"


def test_names_that_would_share_an_id_are_never_filed_over_each_other(caplog):
    """Three students, "José Núñez", "Jose Nunez" and "JOSE NUNEZ", whose plain id is one: the
    first collected keeps it, and each other is refused with an error naming both."""
    config = PyFileConfigLoader("nbgrader_config.py", str(REPO / "autograder")).load_config()
    plugin = LmsCollector(config=config)
    plugin._released = lambda: [NB]
    plugin._inside_download = lambda path: path
    paths = [f"moodle/{name}_1234567_assignsubmission_file/{NB}"
             for name in ("José Núñez", "José Núñez", "Jose Nunez", "JOSE NUNEZ")]  # fmt: skip
    collected = [plugin.collect(path) for path in paths]
    assert [c and c["student_id"] for c in collected] == ["jose.nunez", "jose.nunez", None, None]
    refusals = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(refusals) == 2
    for refusal, other in zip(refusals, ("Jose Nunez", "JOSE NUNEZ")):
        assert "'José Núñez'" in refusal and repr(other) in refusal and "jose.nunez" in refusal
