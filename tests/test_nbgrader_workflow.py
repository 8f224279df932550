"""A grader's whole workflow, from a fresh clone, with real nbgrader, in the README's order.

In a copy of the repository's tracked files (a clone, as a grader starts): `make release`, which
must also register every chapter in the gradebook (a fresh clone has none, so the Formgrader
listed nothing and `nbgrader autograde` refused); the Formgrader's "Generate", which must leave
the committed `notebooks/` alone; `nbgrader zip_collect` of one download from each of Canvas,
Moodle and Blackboard (`tests/lms/`), every submission collected; the README's
`nbgrader autograde`, `nbgrader generate_feedback` and `nbgrader export`; `forge-course grade`
on the same collected folders, agreeing with nbgrader; and at the end nothing for git to see:
whatever the workflow wrote about students is ignored.

One chapter, 04 (the README's example), for every step after the release: each step runs the
same code for every chapter, and each notebook nbgrader grades costs seconds (the other
chapters' grading is `tests/test_autograde.py`'s). One student per LMS, the fewest that still
give each LMS's naming at its hardest (Canvas's late, re-uploaded file; Moodle's folder and
accented name; Blackboard's receipts and two attempts) and both a full and a zero score; the
other names each LMS gives are `tests/test_lms_collect.py`'s.

The downloads keep each LMS's names and layout; their notebooks are stand-ins ("solved",
"blank") that the test replaces with today's chapter 04, solved or as released, so a change to
the chapter never makes them stale.
"""

import csv
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from tests.conftest import CHAPTERS, REPO

CHAPTER = "ch04_one_training_step"
NOTEBOOK = f"{CHAPTER}.ipynb"
VENV = Path(sys.executable).parent.parent
# Each download, the students it holds, and whether each one's (newest) notebook is solved.
DOWNLOADS = {
    "canvas.zip": {"23456": False},
    "moodle.zip": {"jose.nunez": True},
    "blackboard.zip": {"kim42": True},
}


def tracked_copy(destination: Path) -> Path:
    """The repository's tracked files as they are now, committed in a new repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name, follow_symlinks=False)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=destination, check=True)
    subprocess.run(["git", "add", "-A"], cwd=destination, check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], cwd=destination, check=True)
    return destination


def run(command: list[str], cwd: Path, env: dict) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def git_status(clone: Path) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=clone, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def solved(source: nbformat.NotebookNode, released: nbformat.NotebookNode) -> str:
    """The released chapter with the instructor's answers written in."""
    answers = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in source.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    nb = nbformat.from_dict(released)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nbformat.writes(nb)


def fill_download(sample: Path, out: Path, notebooks: dict[str, str]) -> None:
    """``sample`` with each stand-in notebook replaced by the notebook it names."""
    with zipfile.ZipFile(sample) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith(".ipynb"):
                data = notebooks[data.decode()].encode()
            dst.writestr(info, data)


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    return tracked_copy(tmp_path_factory.mktemp("fresh") / "forge-course")


@pytest.fixture(scope="module")
def env(clone):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    environment["PATH"] = f"{VENV / 'bin'}{os.pathsep}{environment['PATH']}"
    # The venv's forge_course is this checkout's (installed in editable mode): the clone's comes
    # first, so every command runs the code under test, in the clone.
    environment["PYTHONPATH"] = str(clone)
    return environment


@pytest.mark.slow
def test_the_graders_workflow(clone, env):
    autograder = clone / "autograder"
    grading = clone / "grading"
    committed = {p: p.read_bytes() for p in (clone / "notebooks").rglob("*.ipynb")}

    # 1. make release: the release is the committed one, and every chapter is in the gradebook.
    # (-o: the venv is the one this suite runs in, set up already.)
    run(["make", "-o", str(VENV / ".installed"), f"VENV={VENV}", "release"], clone, env)
    assert git_status(clone) == "", "make release changed tracked files"
    with Gradebook(f"sqlite:///{grading / 'gradebook.db'}") as gb:
        assert sorted(a.name for a in gb.assignments) == CHAPTERS
        assert all(gb.find_notebook(c, c) for c in CHAPTERS)

    # 2. The Formgrader's "Generate" writes nbgrader's build folder, never notebooks/.
    run(["nbgrader", "generate_assignment", CHAPTER, "--force"], autograder, env)
    changed = [p for p in (clone / "notebooks").rglob("*.ipynb") if p.read_bytes() != committed[p]]
    assert not changed, f"the Formgrader's Generate rewrote {changed}"
    assert (clone / "build" / "release" / CHAPTER / NOTEBOOK).is_file()

    # 3. Each LMS's download, collected in full.
    source = nbformat.read(clone / "build" / "source" / CHAPTER / NOTEBOOK, as_version=4)
    released = nbformat.read(clone / "notebooks" / CHAPTER / NOTEBOOK, as_version=4)
    notebooks = {"solved": solved(source, released), "blank": nbformat.writes(released)}
    archive = grading / "downloaded" / CHAPTER / "archive"
    archive.mkdir(parents=True)
    for name in DOWNLOADS:
        fill_download(REPO / "tests" / "lms" / name, archive / name, notebooks)
    log = run(["nbgrader", "zip_collect", CHAPTER], autograder, env)
    submitted = grading / "submitted"
    students = {s: ok for download in DOWNLOADS.values() for s, ok in download.items()}
    assert sorted(p.name for p in submitted.iterdir()) == sorted(students), log
    for student, is_solved in students.items():
        text = (submitted / student / CHAPTER / NOTEBOOK).read_text()
        assert text == notebooks["solved" if is_solved else "blank"], student
    # Every notebook in the downloads was read (Blackboard's older attempt, then replaced by
    # the newer one); only the receipts were skipped.
    with_notebooks = sum(
        name.endswith(".ipynb")
        for download in DOWNLOADS
        for name in zipfile.ZipFile(REPO / "tests" / "lms" / download).namelist()
    )
    assert f"{with_notebooks} files collected" in log, log
    assert "not collected" not in log, log

    # 4. The README's grading commands, as written, from autograder/.
    run(["nbgrader", "autograde", CHAPTER], autograder, env)
    run(["nbgrader", "generate_feedback", CHAPTER], autograder, env)
    run(["nbgrader", "export"], autograder, env)
    with open(grading / "nbgrader_grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f) if r["assignment"] == CHAPTER}
    for student, is_solved in students.items():
        assert (grading / "feedback" / student / CHAPTER / f"{CHAPTER}.html").is_file()
        score, max_score = float(rows[student]["score"]), float(rows[student]["max_score"])
        assert max_score > 0
        assert score == (max_score if is_solved else 0), (student, score, max_score)

    # 5. forge-course grade, reading the same collected folders, agrees point for point.
    run(["forge-course", "grade", CHAPTER, "--force"], clone, env)
    points: dict[str, float] = {}
    with open(grading / "grades.csv", newline="") as f:
        for row in csv.DictReader(f):
            points[row["student"]] = points.get(row["student"], 0) + float(row["points"])
    assert points == {s: float(rows[s]["score"]) for s in students}

    # 6. Student data stays out of git.
    assert git_status(clone) == "", "the workflow left files that git would commit"
