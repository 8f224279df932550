"""Colab as a first-time learner meets it: every released chapter, run in a Colab-like runtime.

Colab's packages come from the public repository `googlecolab/backend-info` (`pip-freeze.txt`,
snapshot of 2026-08-19), copied to `tests/colab/`; `colab-subset.txt` keeps the packages
the chapters touch (kernel, widgets, plotting, numerics), at Colab's versions: ipywidgets 7.7.1,
ipykernel 6.17.1, IPython 7.34.0, traitlets 5.7.1, and Colab's pip 24.1.2. Differences from
Colab, each forced by this machine: Python 3.11 (Colab's is 3.13; the CPU torch wheel here is
for 3.11), torch 2.13.0 CPU (Colab's 2.11 is a CUDA build), and setuptools raised to what that
torch asks for. `tests/helpers/colab_runtime.py` builds the venv once (cached under
`build/colab-runtime/`) and registers its kernel.

Each chapter runs twice, as the learner would run it:

* first run: a new kernel whose start-up has imported ipywidgets (as Colab's does), without the
  course package. The chapter's install cell runs its own `%pip install` for real; pip finds
  the release in a folder holding a wheel built from this working tree (pip's `PIP_FIND_LINKS`,
  so the cell's command is what runs) and everything else on the package index. Then the rest
  of the chapter, in the same kernel, with no restart.
* after a restart: a new kernel, the package installed; the install cell must say nothing, and
  the chapter's settings cell (it imports all the chapter uses) must run. The rest of the
  chapter is not run again: the first run has just run the same code on the same versions
  (it checks that pip installed the course package and changed nothing else), and running all
  13 chapters twice would double the test's time for nothing new.

No error may appear outside the cells tagged `raises-exception` (the unanswered exercises).
The first run must install the package alone and so not ask for a restart, and every
simulation must send its widget and its picture; both runs enable Colab's widget manager and
keep Colab's ipywidgets loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from forge_course import colab
from forge_course.grader.assignment import INSTALL_TAG
from forge_course.sims.display import WIDGET_VIEW
from tests.conftest import CHAPTERS, REPO
from tests.helpers import colab_runtime

pytestmark = pytest.mark.slow

REQUIREMENT = colab.release_requirement()
VIEW_CALL = re.compile(r"^[\w.]*_view\(", re.MULTILINE)  # a simulation shown in the chapter
# Appended to each chapter: what the kernel has in memory at the end, and the widget manager.
REPORT = """\
import json as _json, sys as _sys
print("COLAB-REPORT", _json.dumps({
    "ipywidgets": _sys.modules["ipywidgets"].__version__,
    "widget_manager": widget_manager_calls,
}))"""


@pytest.fixture(scope="module")
def runtime():
    return colab_runtime.runtime()


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """A folder holding the package's wheel, built from this working tree (tracked or not)."""
    tree = tmp_path_factory.mktemp("tree")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--wheel-dir", str(wheels), str(tree)],
        check=True, capture_output=True,
    )  # fmt: skip
    return wheels


def _kernel_env(rt, wheelhouse) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env["PATH"] = f"{rt.python.parent}{os.pathsep}{env['PATH']}"
    env["PIP_FIND_LINKS"] = str(wheelhouse)  # where pip finds the release; the index, the rest
    env["FORGE_DEVICE"] = "cpu"
    env["OMP_NUM_THREADS"] = "1"  # as the rest of the suite: two workers share two cores
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # ipykernel's debugger warns on every start
    return env


def _run(chapter, workdir, rt, env, whole=True) -> nbformat.NotebookNode:
    """The released chapter, run top to bottom in a new Colab-like kernel; errors recorded.

    Not ``whole``: only its first two code cells, the install cell and the settings cell (which
    imports everything the chapter uses).
    """
    nb = nbformat.read(REPO / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
    if not whole:
        nb.cells = [c for c in nb.cells if c.cell_type == "code"][:2]
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    workdir.mkdir()
    specs = KernelSpecManager(kernel_dirs=[str(rt.kernels)])
    km = KernelManager(kernel_name=colab_runtime.KERNEL_NAME, kernel_spec_manager=specs)
    client = NotebookClient(
        nb, km=km, timeout=300, allow_errors=True, resources={"metadata": {"path": str(workdir)}}
    )
    try:
        client.execute(env=env)
    finally:  # nbclient shuts down only the kernels of the managers it made itself
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    nbformat.write(nb, workdir / f"{chapter}.ipynb")  # kept by pytest, to read after a failure
    return nb


def _unexpected_errors(nb) -> list[str]:
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        for out in cell.outputs:
            if out.output_type == "error":
                found.append(f"cell {cell.id}: {out.ename}: {out.evalue}")
    return found


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _report(nb) -> dict:
    line = next(x for x in _text(nb.cells[-1]).splitlines() if x.startswith("COLAB-REPORT"))
    return json.loads(line.removeprefix("COLAB-REPORT"))


def _views_send_widget_and_picture(nb) -> None:
    """Each simulation (a call of a ``*_view(...)``; ch12 has none) sends its widget and picture."""
    views = [c for c in nb.cells if c.cell_type == "code" and VIEW_CALL.search(c.source)]
    for cell in views:
        sent = [o.get("data", {}) for o in cell.outputs if o.output_type == "display_data"]
        both = [d for d in sent if WIDGET_VIEW in d and "image/png" in d]
        assert both, f"cell {cell.id}: no widget with its picture among {[list(d) for d in sent]}"
        assert all(d[WIDGET_VIEW]["model_id"] for d in both)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_on_colab_first_run_and_after_restart(chapter, runtime, wheelhouse, tmp_path):
    before = colab_runtime.fresh(runtime)
    env = _kernel_env(runtime, wheelhouse)

    first = _run(chapter, tmp_path / "first", runtime, env)
    install = next(c for c in first.cells if INSTALL_TAG in c.metadata.get("tags", []))
    printed = _text(install)
    assert _unexpected_errors(first) == [], "first run (no restart):\n" + "\n".join(
        _unexpected_errors(first)
    )
    assert f"Successfully installed {REQUIREMENT.replace('==', '-')}" in printed, printed
    assert colab.RESTART not in printed, f"the install asked for a restart:\n{printed}"
    after = runtime.versions()
    assert after.pop("forge-course") == REQUIREMENT.partition("==")[2]
    changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    assert not changed, f"installing the package changed Colab's packages: {changed}"
    report = _report(first)
    assert report["ipywidgets"] == before["ipywidgets"], "the kernel should run Colab's widgets"
    assert report["widget_manager"] == ["enabled"], "Colab's widget manager was not enabled"
    _views_send_widget_and_picture(first)

    again = _run(chapter, tmp_path / "restarted", runtime, env, whole=False)
    install = next(c for c in again.cells if INSTALL_TAG in c.metadata.get("tags", []))
    assert install.outputs == [], "with the package installed, the install cell says nothing"
    assert _unexpected_errors(again) == [], "after a restart:\n" + "\n".join(
        _unexpected_errors(again)
    )
    assert _report(again) == {"ipywidgets": before["ipywidgets"], "widget_manager": ["enabled"]}
