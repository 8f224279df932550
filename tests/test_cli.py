"""The `forge-course` command, as a learner meets it."""

import os
import subprocess
import sys

import pytest

from forge_course.cli import main
from tests.conftest import CHAPTERS, REPO


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "check NOTEBOOK" in out and "doctor" in out and "release" in out


def test_unknown_command_fails_with_usage(capsys):
    assert main(["frobnicate"]) == 2
    assert "Unknown command" in capsys.readouterr().err


def test_check_needs_an_existing_notebook(capsys, tmp_path):
    assert main(["check", str(tmp_path / "missing.ipynb")]) == 2


@pytest.mark.slow
def test_check_on_a_fresh_release_reports_every_exercise_unanswered():
    chapter = CHAPTERS[0]
    run = subprocess.run(
        [sys.executable, "-m", "forge_course.cli", "check", f"notebooks/{chapter}/{chapter}.ipynb"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1
    assert "FAIL" in run.stdout and "PASS" not in run.stdout
    assert "not written yet" in run.stdout or "No answer yet" in run.stdout
    assert "0 of" in run.stdout


@pytest.mark.slow
def test_a_gradebook_is_created_where_the_venv_is_not_activated(tmp_path):
    """nbgrader runs `alembic` by name for a new gradebook: `forge-course` finds its own."""
    create = (
        "import sys\n"
        "from forge_course import cli\n"
        "if sys.argv[1] == 'cli': cli.main(['--help'])\n"
        "from nbgrader.api import Gradebook\n"
        "Gradebook('sqlite:///' + sys.argv[2]).close()\n"
    )
    bare = {**os.environ, "PATH": "/usr/bin:/bin"}
    for how in ("plain", "cli"):
        db = tmp_path / f"{how}.db"
        run = subprocess.run([sys.executable, "-c", create, how, str(db)], env=bare,
                             capture_output=True, text=True)  # fmt: skip
        assert (run.returncode == 0) == (how == "cli"), run.stderr[-500:]
