"""The parts of the package that need no torch, on any Python the package accepts.

`tests/test_pythons.py` runs this file on every Python from 3.10 to 3.13 installed here, in a venv
holding the package (installed with `--no-deps`), `packaging` and pytest, and no torch (the
CPU wheel here is for 3.11 only). So it imports nothing from `tests/` (whose conftest imports
torch) and is run with `--noconftest`. What needs torch is not here: the release (through the
install cell's tag in `forge_course.grader.assignment`, which imports the checks), the grader's
codec (it carries tensors) and the simulation engines (each one computes with torch).
"""

import importlib.metadata
import subprocess
import sys

import pytest

import forge_course
from forge_course import chapters, cli, lab
from forge_course.grader import tamper


def test_the_package_imports_without_torch():
    assert importlib.metadata.version("forge-course") == forge_course.__version__
    modules = "forge_course, forge_course.chapters, forge_course.cli, forge_course.lab"
    script = f"import sys, {modules}, forge_course.grader.tamper; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_the_chapters_are_numbered_in_order():
    ids = [c.id for c in chapters.CHAPTERS]
    assert ids == sorted(set(ids)) and all(c.minutes > 0 for c in chapters.CHAPTERS)


def test_lab_says_which_python_or_torch_to_install():
    with pytest.raises(lab.CannotStart, match=r'-m pip install --upgrade "torch>=2.3"'):
        lab.check_torch(["numpy>=1.24", "torch>=2.3"], "2.1.2")
    lab.check_torch(["torch>=2.3"], "2.13.0+cpu")
    with pytest.raises(lab.CannotStart, match="needs Python >=3.10 and this is Python 3.9.6"):
        lab.check_python(">=3.10", "3.9.6")
    lab.check_python(">=3.10")  # this Python


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_grading_off_linux_is_one_sentence(platform):
    reason = cli._grading_elsewhere(platform, unsafe=False)
    assert "bubblewrap" in reason and "\n" not in reason
    assert cli._grading_elsewhere("linux", unsafe=False) == ""


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("import ctypes", "memory"),
        ("import subprocess", "starts processes"),
        ("import sys\nsys.settrace(lambda *a: None)", "trace hook"),
        ("eval('1 + 1')", "runs code built at run time"),
    ],
)
def test_the_static_scan_names_what_it_sees(source, reason):
    assert any(reason in finding for finding in tamper.findings(source))
