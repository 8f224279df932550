"""`nbgrader zip_collect`'s file-name patterns (autograder/nbgrader_config.py) on every name that
Canvas, Moodle and Blackboard give a submission, and downloads in which students named their files,
folders or themselves to be filed as someone else or to stop the collection, run through real
`nbgrader zip_collect`; `tests/test_nbgrader_workflow.py` collects a real download of each LMS."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

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


def collector() -> LmsCollector:
    """The course's collector, with chapter 04 released."""
    config = PyFileConfigLoader("nbgrader_config.py", str(REPO / "autograder")).load_config()
    plugin = LmsCollector(config=config)
    plugin._released = lambda: [NB]
    return plugin


def read(*paths: str) -> list[dict | None]:
    """What the collector files for each of ``paths``, the files of one download."""
    collected = collector().read_download(list(paths))
    return [collected.get(path) for path in paths]


@pytest.mark.parametrize(("path", "student", "notebook", "timestamp"), NAMES)
def test_each_lms_name_gives_student_and_notebook(path, student, notebook, timestamp):
    [info] = read(path)
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
def test_what_no_lms_submitted_is_left(path):
    assert read(path) == [None]


def test_ids_keep_to_the_graders_rule():
    assert plain_id("Ann-Marie O'Neil") == "ann-marie.o.neil"
    assert plain_id("王伟") == "王伟"  # no Latin letter: kept, and hashed by the grader
    assert plain_id(". .").startswith("student-")  # but never a path step
    assert notebook_name("other.ipynb", [NB]) == "other.ipynb"


def test_names_that_would_share_an_id_are_all_refused(caplog):
    """ "José Núñez", "Jose Nunez" and "JOSE NUNEZ", whose plain id is one, and the same name with
    two participant numbers: none of them is filed, and one error names them all."""
    names = ("José Núñez_1", "Jose Nunez_2", "JOSE NUNEZ_3", "Carol King_4", "Carol King_5")
    paths = [f"moodle/{name}_assignsubmission_file/{NB}" for name in names]
    assert read(*paths, f"moodle/Dan Brown_6_assignsubmission_file/{NB}") == [None] * 5 + [
        {"student_id": "dan.brown", "file_id": NB}
    ]
    refusals = sorted(r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    assert len(refusals) == 2
    assert "'Carol King' (participant 4) and 'Carol King' (participant 5)" in refusals[0]
    assert (
        "'JOSE NUNEZ' (participant 3), 'Jose Nunez' (participant 2) and 'José Núñez' "
        in (refusals[1])
    )
    assert "as the student jose.nunez" in refusals[1]


@pytest.mark.parametrize(
    ("paths", "students"),
    [
        # The first "_<user>_attempt_<time>_" is Blackboard's, the rest the file's own name.
        (["bb/Chapter 4_mallory_attempt_2026-11-20-11-00-00_x_alice_attempt_2099-01-01-00-00-00_"
          + NB], ["mallory"]),
        # Moodle's folder, not one the student made inside it, says whose the file is.
        ([f"m/Mallory Evil_7_assignsubmission_file/Bob Jones_1_assignsubmission_file/{NB}"],
         ["mallory.evil"]),
        # An archive a student uploaded is unpacked into a folder of its name: all in it is theirs.
        (["bb/Chapter 4_mallory_attempt_2026-11-20-11-00-00_work.zip",
          f"bb/Chapter 4_mallory_attempt_2026-11-20-11-00-00_work/Chapter 4_kim42_attempt_"
          f"2099-01-01-00-00-00_{NB}"], [None, "mallory"]),
        (["canvas/evilmal_99999_1_w.zip", f"canvas/evilmal_99999_1_w/smithbob_23456_2_{NB}"],
         [None, "99999"]),
        # A folder a student made is no archive: its name is not read as a Canvas upload.
        ([f"m/Mallory Evil_7_assignsubmission_file/smithbob_23456_2_x/{NB}"], ["mallory.evil"]),
        # Every file of a Canvas download is read as Canvas's, even one named like Blackboard's.
        ([f"canvas/evilmal_99999_1_x_23456_attempt_2099-01-01-00-00-00_{NB}",
          f"canvas/smithbob_23456_2_{NB}"], ["99999", "23456"]),
        # A Moodle display name that holds Moodle's prefix cannot be split: refused.
        ([f"m/Hal Ng_1_assignsubmission_file_x_6_assignsubmission_file_{NB}",
          f"m/Hal Ng_7_assignsubmission_file_{NB}"], [None, "hal.ng"]),
        # A name with no letter that is a path step is hashed, never a folder of its own.
        ([f"m/.._7_assignsubmission_file/{NB}"], [plain_id("..")]),
    ],
)  # fmt: skip
def test_a_students_own_names_never_speak_for_another(paths, students):
    assert [info and info["student_id"] for info in read(*paths)] == students


def test_a_notebook_handed_in_twice_with_nothing_to_choose_is_refused(caplog):
    """Two copies of a notebook in one Moodle folder (nbgrader would stop the collection) or in
    one Blackboard attempt: refused, and the student's other files kept; across attempts the
    newest is nbgrader's to choose."""
    gina = "m/Gina Lee_8_assignsubmission_file/"
    twice = [gina + NB, gina + "Copy of " + NB, gina + "notes.ipynb"]
    attempt = "bb/Chapter 4_kim42_attempt_2026-11-21-10-30-00_"
    assert (
        read(*twice, attempt + NB, attempt + "Copy of " + NB)
        == [None] * 2 + [{"student_id": "gina.lee", "file_id": "notes.ipynb"}] + [None] * 2
    )
    assert "gina.lee handed in 2 files that are each " + NB in caplog.text
    older = "bb/Chapter 4_kim42_attempt_2026-11-20-10-30-00_" + NB
    assert [info["timestamp"] for info in read(older, attempt + NB)] == [
        "2026-11-20 10:30:00",
        "2026-11-21 10:30:00",
    ]


MALLORY = "Mallory Evil_7654321_assignsubmission_file"
IVAN = "Ivan Cole_8888888_assignsubmission_file"
# Each download, as its LMS writes it, and where each notebook must end up (None: nowhere). The
# notebooks hold the name of whoever wrote them.
CRAFTED = {
    # Finding: Mallory's upload is named like Alice's newer attempt.
    "blackboard.zip": {
        f"Chapter 4_alice_attempt_2026-11-20-10-00-00_{NB}": "alice",
        "Chapter 4_mallory_attempt_2026-11-20-11-00-00_x_alice_attempt_2099-01-01-00-00-00_"
        + NB: "mallory",
        # and a zip whose notebook is named like Kim's attempt
        "Chapter 4_mallory_attempt_2026-11-20-12-00-00_work.zip": None,
    },
    # Finding: a folder named like Bob's inside Mallory's, and one like Dan's (who did not
    # submit) inside Ivan's.
    "moodle_nested.zip": {
        f"Bob Jones_1234567_assignsubmission_file/{NB}": "bob.jones",
        f"{MALLORY}/Bob Jones_1_assignsubmission_file/{NB}": "mallory.evil",
        f"{IVAN}/Dan Brown_2_assignsubmission_file/{NB}": "ivan.cole",
    },
    # Finding: two students named Carol King; Erin, Frank and Gina must still be collected
    # (Frank uploaded a .gz that is no archive, Gina two copies of her notebook: refused).
    "moodle_samename.zip": {
        f"Carol King_2222222_assignsubmission_file/{NB}": None,
        f"Carol King_3333333_assignsubmission_file/{NB}": None,
        f"Erin Moss_4444444_assignsubmission_file/{NB}": "erin.moss",
        f"Frank Bell_5555555_assignsubmission_file/{NB}": "frank.bell",
        "Frank Bell_5555555_assignsubmission_file/data.gz": None,
        f"Gina Lee_6666666_assignsubmission_file/{NB}": None,
        f"Gina Lee_6666666_assignsubmission_file/Copy of {NB}": None,
    },
    # A Canvas upload named like a Blackboard attempt of user 23456.
    "canvas.zip": {
        f"smithbob_23456_678902_{NB}": "23456",
        f"evilmal_99999_678903_x_23456_attempt_2099-01-01-00-00-00_{NB}": "99999",
    },
}
KIMS = f"Chapter 4_kim42_attempt_2099-01-01-00-00-00_{NB}"


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """`nbgrader zip_collect` of the crafted downloads: its log and the submitted folder."""
    course = tmp_path_factory.mktemp("course")
    release = course / "build" / "release" / "ch04_one_training_step"
    release.mkdir(parents=True)
    release.joinpath(NB).write_bytes(
        (REPO / "notebooks" / "ch04_one_training_step" / NB).read_bytes()
    )
    archive = course / "grading" / "downloaded" / "ch04_one_training_step" / "archive"
    archive.mkdir(parents=True)
    for download, files in CRAFTED.items():
        with zipfile.ZipFile(archive / download, "w") as zf:
            for name in files:
                if name.endswith(".zip"):
                    with zipfile.ZipFile(course / "upload.zip", "w") as upload:
                        upload.writestr(KIMS, "mallory's work.zip")
                    zf.write(course / "upload.zip", name)
                else:
                    zf.writestr(name, f"{download}: {name}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    env |= {"FORGE_COURSE_ROOT": str(course), "FORGE_GRADING_DIR": str(course / "grading")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    shutil.copy(REPO / "autograder" / "nbgrader_config.py", course)
    done = subprocess.run(
        ["nbgrader", "zip_collect", "ch04_one_training_step"],
        cwd=course, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return done, course / "grading" / "submitted"


def submitted(folder: Path) -> dict[str, set[str]]:
    """Each student's collected notebooks, by what they hold."""
    return {
        student.name: {nb.read_text() for nb in student.rglob("*.ipynb")}
        for student in folder.iterdir()
    }


@pytest.mark.slow
def test_crafted_downloads_are_collected_student_by_student(crafted):
    done, folder = crafted
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    expected: dict[str, set[str]] = {}
    for download, files in CRAFTED.items():
        for name, student in files.items():
            if student is not None:
                expected.setdefault(student, set()).add(f"{download}: {name}")
    expected["mallory"].add("mallory's work.zip")
    assert submitted(folder) == expected, log
    # Alice's own notebook, not Mallory's 2099 "attempt", is hers; Bob's is Bob's; no Kim, no Dan.
    assert (folder / "alice" / "ch04_one_training_step" / NB).read_text().endswith("10-00-00_" + NB)


@pytest.mark.slow
def test_each_refusal_is_logged_with_its_reason(crafted):
    done, _ = crafted
    log = done.stdout + done.stderr
    assert "'Carol King' (participant 2222222) and 'Carol King' (participant 3333333)" in log
    assert "gina.lee handed in 2 files that are each " + NB in log
    assert "data.gz is not unpacked" in log
