"""Each solved chapter runs twice in one kernel, with no error and every test passing, within
Binder's memory, the first time with processes started by *spawn*, as on macOS and Windows.

Linux starts processes by *fork*: a child inherits the kernel's memory, functions and classes
defined in the notebook included. macOS and Windows *spawn* a fresh interpreter, which must
import by name whatever it runs, so a DataLoader worker or a rank that needs a notebook's
definition fails there and nowhere on Linux. Linux's fork already runs in the nbgrader round
trip (`tests/test_autograde.py`), so this run, the only other one of every solved chapter,
makes spawn the default start method for its first pass instead of running each chapter a
third time. What asks for fork by name still forks, as it may on macOS but not on Windows,
which has no fork at all. The second pass, which checks that the chapter runs again top to
bottom in the same kernel, forks as Linux does: every spawned process imports torch afresh
(chapter 02 starts dozens), which the first pass has already paid for.
"""

import json

import nbformat
import pytest
import torch

from forge_course.check import errors, execute, graded_results
from tests.conftest import CHAPTERS, add_cells

# mybinder.org guarantees 1 GiB to a session (2 GiB is the most it may get, when a node has room).
# The chapters that need more than the guarantee are named in the README's Binder section, and
# held to the limit instead.
BINDER_BYTES = 2**30
BINDER_LIMIT_BYTES = 2 * 2**30
# Measured on 2026-11-26 (kernel + largest child + server): ch02 1070 MiB, ch06 1160 MiB,
# ch08 1160 MiB, ch09 1205 MiB, ch10 1354 MiB, ch11 1217 MiB, ch12 1160 MiB.
OVER_BINDER_GUARANTEE = (
    "ch02_datasets_dataloaders",
    "ch06_evaluation_loop",
    "ch08_training_arena",
    "ch09_production_loop",
    "ch10_scaling_one_device",
    "ch11_distributed",
    "ch12_capstone",
)
SERVER_BYTES = 300 * 2**20  # JupyterLab's own server and the Binder image around the kernel
START_METHODS = ["spawn", "fork"]  # one per pass
SPAWN_CELL = (
    "import multiprocessing\n"
    "_passes = globals().get('_passes', 0) + 1\n"
    f"multiprocessing.set_start_method({START_METHODS}[_passes - 1], force=True)"
)
# Appended to each chapter: after each pass, the kernel's peak resident memory and its largest
# child's (training subprocesses, DataLoader workers, compile), both in kB on Linux, and the
# start method in force at the end (no chapter may quietly change it). The kernel's own peak
# is its VmHWM: Linux keeps `ru_maxrss` across exec, so a kernel started by a large test process
# would report that process's memory as its own. The memory budget is read after the first
# pass: a forked child's resident memory counts the pages it shares with the kernel again.
PEAK_CELL = (
    "import json as _json, multiprocessing as _mp, resource as _resource\n"
    "try:\n"
    "    _own = [int(l.split()[1]) for l in open('/proc/self/status') if l[:6] == 'VmHWM:'][0]\n"
    "except OSError:  # no /proc (macOS)\n"
    "    _own = _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss\n"
    "_ends = globals().get('_ends', []) + [[_own,\n"
    "    _resource.getrusage(_resource.RUSAGE_CHILDREN).ru_maxrss, _mp.get_start_method()]]\n"
    "print(_json.dumps(_ends))"
)


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solution_notebook_runs_twice_cleanly(chapter, sources):
    path = sources / chapter / f"{chapter}.ipynb"
    add_cells(path, first=SPAWN_CELL, last=PEAK_CELL)
    nb = execute(path, repeat=2)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not errors(cell), f"cell {cell.id} failed:\n{errors(cell)[0]['evalue']}"
    results = graded_results(nb)
    assert results and all(r.passed for r in results)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "every chapter shows at least one figure"

    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    ends = json.loads(printed.strip().splitlines()[-1])
    assert [method for _, _, method in ends] == START_METHODS
    kernel_kb, child_kb, _ = ends[0]
    peak = (kernel_kb + child_kb) * 1024 + SERVER_BYTES
    if not torch.cuda.is_available():  # Binder has no GPU; a CUDA kernel's peak means nothing there
        if chapter in OVER_BINDER_GUARANTEE:
            assert peak < BINDER_LIMIT_BYTES, f"{peak / 2**20:.0f} MiB: over Binder's 2 GiB limit"
        else:
            assert peak < BINDER_BYTES, f"{peak / 2**20:.0f} MiB: over Binder's guaranteed 1 GiB"


def test_the_readme_names_the_chapters_over_binders_guarantee(repo):
    binder = (repo / "README.md").read_text().split("### On Binder", 1)[1].split("###", 1)[0]
    for chapter in OVER_BINDER_GUARANTEE:
        assert f"`{chapter}`" in binder, f"the README's Binder section must name {chapter}"


def test_an_error_of_the_first_pass_is_kept_when_the_second_passes(tmp_path):
    """A cell that fails only on the first pass (a spawned worker that could not import a
    notebook's class, say) must not be hidden by the second pass's clean run."""
    first_only = "_runs = globals().get('_runs', 0) + 1\nassert _runs > 1, 'first pass'"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(first_only)])
    nbformat.write(nb, tmp_path / "twice.ipynb")
    (cell,) = execute(tmp_path / "twice.ipynb", repeat=2).cells
    assert [e["evalue"] for e in errors(cell)] == ["first pass"]
