"""Colab: every chapter opens with the install cell and a badge, derived from pyproject.toml.

The install cell runs for real in a fresh kernel here: where the package is installed (it does
nothing), and where it is missing, with a stand-in `%pip` that records its line and changes an
installed distribution the way an upgrade would, to check when the cell asks for a restart.
`tests/test_colab_runtime.py` runs the cell with pip itself, in a Colab-like runtime.
"""

import json
import shlex

import nbformat
import pytest
import tomllib
from nbclient import NotebookClient
from packaging.requirements import Requirement

from forge_course import colab
from forge_course.grader import assignment
from forge_course.grader.assignment import INSTALL_TAG
from forge_course.release import source_notebook, write_notebook
from tests.conftest import CHAPTERS, REPO

URL = colab.repository_url()
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CELL = colab.install_cell_source(colab.release_requirement())

# A distribution `probe-widgets` 1.0 (module `probe_widgets`) in a folder on sys.path, and a
# stand-in `%pip` that records its line and "upgrades" the probe to 2.0 on disk, as pip would.
PROBE = """\
import pathlib
import sys

probe = pathlib.Path("probe")
(probe / "probe_widgets").mkdir(parents=True)
(probe / "probe_widgets" / "__init__.py").write_text("")
info = probe / "probe_widgets-1.0.dist-info"
info.mkdir()
(info / "METADATA").write_text("Metadata-Version: 2.1\\nName: probe-widgets\\nVersion: 1.0\\n")
(info / "top_level.txt").write_text("probe_widgets\\n")
sys.path.insert(0, str(probe.resolve()))

pip_calls = []


def upgrading_pip(line):
    pip_calls.append(line)
    (info / "METADATA").write_text("Metadata-Version: 2.1\\nName: probe-widgets\\nVersion: 2.0\\n")


get_ipython().register_magic_function(upgrading_pip, "line", "pip")
"""
# A Colab runtime that lacks the course package, as far as the install cell can tell.
COLAB_WITHOUT_THE_PACKAGE = """\
import sys
import types

sys.modules["forge_course"] = None  # now `import forge_course` raises ModuleNotFoundError
widget_manager_calls = []
colab = types.ModuleType("google.colab")
colab.output = types.SimpleNamespace(
    enable_custom_widget_manager=lambda: widget_manager_calls.append("enabled")
)
sys.modules["google.colab"] = colab
"""
REPORT = """\
import json

print(json.dumps({"pip": pip_calls, "widgets": globals().get("widget_manager_calls", [])}))
"""


def _release(chapter):
    return nbformat.read(REPO / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)


def _run_install_cell(tmp_path, *before):
    """Run the probe, ``before``, the install cell and a report in a fresh kernel."""
    sources = [PROBE, *before, CELL, REPORT]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    # Run from an empty folder, so the package can only come from its installation.
    client = NotebookClient(
        nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    install, report = nb.cells[-2], nb.cells[-1]
    printed = "".join(o.get("text", "") for o in install.outputs)
    assert all(o.output_type == "stream" for o in install.outputs), install.outputs
    return printed, json.loads(report.outputs[0]["text"])


@pytest.mark.slow
def test_install_cell_does_nothing_where_the_package_is_installed(tmp_path):
    printed, calls = _run_install_cell(tmp_path)
    assert calls == {"pip": [], "widgets": []}
    assert printed == "", "the install cell should be silent where there is nothing to do"


@pytest.mark.slow
def test_install_cell_installs_this_release_loudly_on_colab(tmp_path):
    printed, calls = _run_install_cell(tmp_path, COLAB_WITHOUT_THE_PACKAGE)
    assert len(calls["pip"]) == 1, f"expected one %pip call, got {calls['pip']}"
    # No -q: Colab offers its restart button from pip's "Successfully installed" line.
    command, requirement = shlex.split(calls["pip"][0])
    assert command == "install"
    requirement = Requirement(requirement)
    assert requirement.name == PROJECT["name"]
    assert str(requirement.specifier) == f"=={PROJECT['version']}"
    assert calls["widgets"] == ["enabled"], "Colab's custom widget manager was not enabled"
    # The probe was on disk but never imported: its upgrade needs no restart.
    assert colab.RESTART not in printed


@pytest.mark.slow
def test_install_cell_asks_for_a_restart_when_it_changed_what_was_imported(tmp_path):
    printed, _ = _run_install_cell(tmp_path, COLAB_WITHOUT_THE_PACKAGE, "import probe_widgets")
    assert colab.RESTART in printed
    assert "probe-widgets" in printed, "the cell should say which package changed"


def test_the_address_is_written_only_in_pyproject():
    written = [
        *REPO.glob("forge_course/**/*.py"),
        *REPO.glob("solutions/*.py"),
        *REPO.glob("tests/**/*.py"),
        REPO / "Makefile",
        *(path for path in (REPO / "binder").rglob("*") if path.is_file()),
    ]
    for path in written:
        assert URL not in path.read_text(), f"{path.relative_to(REPO)} repeats the address"


def test_readme_badges_are_up_to_date():
    readme = (REPO / "README.md").read_text()
    assert colab.with_readme_badges(readme, URL) == readme, "run `make release`"
    assert colab.colab_url(URL, "notebooks/index.ipynb") in readme
    assert colab.binder_url(URL) in readme


def test_addresses_follow_colab_and_binder():
    url = "https://github.com/someone/course"
    assert colab.colab_url(url, "notebooks/a/a.ipynb") == (
        "https://colab.research.google.com/github/someone/course/blob/main/notebooks/a/a.ipynb"
    )
    assert colab.binder_url(url) == (
        "https://mybinder.org/v2/gh/someone/course/main?urlpath=lab/tree/notebooks/index.ipynb"
    )
    assert colab.github_name("https://github.com/someone/course.git/") == "someone/course"
    with pytest.raises(ValueError, match="Repository in pyproject.toml"):
        colab.github_name("https://gitlab.com/someone/course")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_opens_with_the_install_cell_and_its_own_badge(chapter):
    nb = _release(chapter)
    code = [c for c in nb.cells if c.cell_type == "code"]
    first = code[0]
    assert first.metadata.get("tags") == [INSTALL_TAG], "the install cell must come first"
    assert "nbgrader" not in first.metadata
    assert first.source == CELL
    assert sum(INSTALL_TAG in c.metadata.get("tags", []) for c in code) == 1
    title = next(c for c in nb.cells if c.cell_type == "markdown")
    assert colab.colab_badge(URL, f"notebooks/{chapter}/{chapter}.ipynb") in title.source


def test_index_opens_every_chapter_on_colab():
    text = nbformat.read(REPO / "notebooks" / "index.ipynb", as_version=4).cells[0].source
    for chapter in CHAPTERS:
        assert colab.colab_url(URL, f"notebooks/{chapter}/{chapter}.ipynb") in text


def test_the_grader_takes_the_settings_cell_not_the_install_cell(tmp_path):
    chapter = "ch04_one_training_step"
    source = tmp_path / f"{chapter}.ipynb"
    write_notebook(source_notebook(REPO / "solutions" / f"{chapter}.py"), source)
    prelude = assignment.load(chapter, source).prelude
    assert prelude.startswith("# Settings for this chapter")
