"""`forge-course lab`, the one way into the course: its settings, its errors, the README set-up.

The README's pip-only set-up itself runs in `tests/test_browser.py` (a fresh venv, no `make`,
every chapter opened in the Lab it starts); here the README's Windows commands are held to the
Linux/macOS ones that test runs, and `make lab` to `forge-course lab`.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys

import nbformat
import pytest
from nbformat.sign import NotebookNotary

from forge_course import cli, lab
from forge_course.ports import free_port
from tests.conftest import CHAPTERS, REPO
from tests.lab_server import get, readme_commands
from tests.lab_server import lab as running_lab


def _powershell_as_posix(line: str) -> str:
    """A PowerShell line of the README as the same command in bash: the obvious translation."""
    line = line.replace("\\Scripts\\", "/bin/").replace("; ", " && ")
    return "python3" + line.removeprefix("python") if line.startswith("python ") else line


def test_the_readmes_windows_commands_are_the_ones_the_set_up_test_runs():
    posix, windows = readme_commands("bash"), readme_commands("powershell")
    assert [_powershell_as_posix(line) for line in windows] == posix
    assert len(posix) == 2 and posix[1].endswith("forge-course lab")
    # Windows PowerShell 5.1 has no `&&`, and its default policy refuses to run Activate.ps1.
    assert not any("&&" in line or "Activate" in line for line in windows)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("forge-course lab: ") and "\n" not in err and "Traceback" not in err
    assert err.isascii(), "a Windows console in a legacy code page cannot print it"
    return err


def test_a_port_in_use_is_one_line_with_a_free_port_to_use(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert lab.main(["--port", str(port)]) == 2
    err = _one_line(capsys)
    assert f"Port {port} is in use" in err and "forge-course lab --port " in err


def test_an_old_torch_or_python_says_what_to_install():
    with pytest.raises(lab.CannotStart, match=r'-m pip install --upgrade "torch>=2.3"'):
        lab.check_torch(["numpy>=1.24", "torch>=2.3"], "2.1.2")
    with pytest.raises(lab.CannotStart, match="needs torch>=2.3 and this Python has no torch"):
        lab.check_torch(["torch>=2.3"], None)
    lab.check_torch(["torch>=2.3"], "2.13.0+cpu")  # a local build label is still 2.13.0
    with pytest.raises(lab.CannotStart, match="needs Python >=3.10 and this is Python 3.9.6"):
        lab.check_python(">=3.10", "3.9.6")
    lab.check_package()  # this venv's own forge-course, Python and torch pass


def test_missing_jupyterlab_or_notebooks_say_what_to_do(tmp_path, monkeypatch, capsys):
    with pytest.raises(lab.CannotStart, match="github.com/forge-course/forge-course"):
        lab.check_course(tmp_path)  # an installed package, no clone beside it
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name: None if name == "jupyterlab" else real_find_spec(name),
    )
    assert lab.main(["--port", "0"]) == 2
    assert "-m pip install jupyterlab" in _one_line(capsys)


@pytest.fixture
def launched(monkeypatch, tmp_path):
    """What `lab.main` would start, instead of starting it (signatures kept in ``tmp_path``)."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(lab, "launch", lambda command, env: calls.append((command, env)) or 0)
    return calls


def test_the_lab_gets_the_course_settings(launched):
    port = free_port()
    assert lab.main(["--no-browser", "--port", str(port), "--LabApp.x=1"]) == 0
    (command, env), = launched  # fmt: skip
    assert command[:3] == [sys.executable, "-m", "jupyterlab"]
    assert env["JUPYTER_CONFIG_PATH"] == os.pathsep.join(
        [str(REPO / "autograder" / "learner"), str(REPO / "autograder")]
    )
    args = command[3:]
    assert f"--ServerApp.root_dir={REPO}" in args and f"--ServerApp.port={port}" in args
    assert "--LabApp.default_url=/lab/tree/notebooks/index.ipynb" in args
    assert ("--ServerApp.allow_root=True" in args) == (os.geteuid() == 0)
    assert "--no-browser" in args and args[-1] == "--LabApp.x=1"  # the learner's own args last


def test_without_a_browser_the_address_to_open_is_printed(launched, monkeypatch, capsys):
    monkeypatch.setattr(lab, "browser_found", lambda: False)
    monkeypatch.delenv("JUPYTER_TOKEN", raising=False)
    port = free_port()
    assert lab.main(["--port", str(port)]) == 0
    (command, env), = launched  # fmt: skip
    out = capsys.readouterr().out
    address = f"http://127.0.0.1:{port}/lab/tree/notebooks/index.ipynb?token={env['JUPYTER_TOKEN']}"
    assert address in out and "--no-browser" in command


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_grading_off_linux_stops_with_one_sentence(platform, monkeypatch, capsys):
    monkeypatch.setattr(sys, "platform", platform)
    assert cli.main(["grade"]) == 2
    err = capsys.readouterr().err.strip()
    assert "bubblewrap, which runs only on Linux" in err and "--unsafe" in err and "\n" not in err
    if platform == "win32":  # its workers fork: --unsafe cannot help there
        assert cli.main(["grade", "--unsafe"]) == 2


@pytest.mark.slow
def test_make_lab_is_forge_course_lab_and_serves_every_chapter(tmp_path):
    with running_lab(REPO, tmp_path) as base:
        assert "JupyterLab" in get(f"{base}/lab").decode()
        for chapter in CHAPTERS:
            path = f"notebooks/{chapter}/{chapter}.ipynb"
            model = json.loads(get(f"{base}/api/contents/{path}"))
            assert model["content"]["cells"], f"{path} is empty"
    assert "/forge-course lab --port " in (tmp_path / "lab.log").read_text()  # make echoes it


def test_off_posix_the_lab_runs_as_a_child_and_its_status_comes_back(monkeypatch):
    monkeypatch.setattr(os, "name", "nt")  # Windows cannot exec: forge-course waits for Jupyter
    assert lab.launch([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ)) == 3


PAGE_CONFIG = (
    "import json; from jupyterlab_server.config import get_static_page_config; "
    "print(json.dumps(get_static_page_config(level='all').get('disabledExtensions', {})))"
)


@pytest.mark.parametrize("instructor", [False, True], ids=["learner", "instructor"])
def test_a_learners_lab_validates_and_an_instructors_grades(launched, instructor):
    """The page config JupyterLab itself reads from the path `forge-course lab` sets."""
    argv = ["--no-browser", "--port", str(free_port())] + ["--instructor"] * instructor
    assert lab.main(argv) == 0
    (_, env), = launched  # fmt: skip
    done = subprocess.run([sys.executable, "-c", PAGE_CONFIG], env=env, capture_output=True,
                          text=True, check=True, timeout=120)  # fmt: skip
    disabled = json.loads(done.stdout)
    assert disabled.get("@jupyterlab/apputils-extension:announcements"), "the news prompt"
    assert not disabled.get("@jupyter/nbgrader:validate-assignment"), "everyone validates"
    for tool in ("create-assignment", "menu", "course-list", "assignment-list"):
        assert bool(disabled.get(f"@jupyter/nbgrader:{tool}")) is not instructor, tool


def test_chapters_as_released_are_trusted_and_notebooks_with_outputs_are_left_alone(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    folder = tmp_path / "course" / "notebooks" / "ch00"
    folder.mkdir(parents=True)
    code = nbformat.v4.new_code_cell("print('hi')")
    released = nbformat.v4.new_notebook(cells=[code])
    html = nbformat.v4.new_output("display_data", data={"text/html": "<script>run()</script>"})
    ran = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("show()", outputs=[html])])
    nbformat.write(released, folder / "released.ipynb")
    nbformat.write(ran, folder / "from_elsewhere.ipynb")
    (folder / "half_saved.ipynb").write_text('{"cells": [')  # skipped, not a reason to stop
    lab.trust_unrun_notebooks(tmp_path / "course")
    with NotebookNotary() as notary:
        assert notary.check_signature(released)
        assert not notary.check_signature(ran)
