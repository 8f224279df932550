"""Shared fixtures: where the repository is, and the chapters that exist."""

from pathlib import Path

import nbformat
import pytest
import torch

from forge_course.release import build_sources, chapter_ids

# Two xdist workers share two cores: more threads per worker would only contend.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = chapter_ids(REPO)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """The chapters' source notebooks, built once per test module (tests may add cells)."""
    out = tmp_path_factory.mktemp("source")
    build_sources(REPO, out)
    return out


def add_cells(path: Path, first: str | None = None, last: str | None = None) -> None:
    """Put a code cell at the start and/or end of the notebook at ``path``."""
    nb = nbformat.read(path, as_version=4)
    if first is not None:
        nb.cells.insert(0, nbformat.v4.new_code_cell(first))
    if last is not None:
        nb.cells.append(nbformat.v4.new_code_cell(last))
    nbformat.write(nb, path)


# What each slow test cost (seconds, from `--durations` on two idle cores: the last full run's
# 30 slowest, 2026-11-26, and earlier runs for the rest): a file's entry is for each of its tests,
# a longer entry is for the tests it names and wins over the file's. Since, nbgrader grades one
# notebook per round trip (it was three), the notebook runs' second pass forks and the
# determinism test grades twice (it was three times): those entries were measured again on
# 2026-11-26 at load 6, so they overstate, each in about the same proportion.
# xdist's `worksteal` hands the first half of the list to one worker and the second half to the
# other, and an idle worker steals from the end of the other's queue. So the slow tests are dealt
# into the two halves, longest first, each to the half with less work so far; the quick ones come
# last, where stealing evens them out.
COSTS = {
    "test_notebooks.py::test_solution_notebook_runs_twice_cleanly": 40,  # under 56 s but these:
    "test_notebooks.py::test_solution_notebook_runs_twice_cleanly[ch02": 182,  # spawns workers
    "test_notebooks.py::test_solution_notebook_runs_twice_cleanly[ch09": 67,
    "test_notebooks.py::test_solution_notebook_runs_twice_cleanly[ch10": 75,
    "test_notebooks.py::test_solution_notebook_runs_twice_cleanly[ch11": 78,
    "test_autograde.py": 50,  # 37-56 s but these:
    "test_autograde.py::test_round_trip[ch00": 70,
    "test_autograde.py::test_round_trip[ch07": 70,
    "test_autograde.py::test_round_trip[ch10": 82,
    "test_autograde.py::test_round_trip[ch11": 118,
    "test_autograde.py::test_round_trip[ch12": 70,
    "test_grader_determinism.py": 395,
    "test_nbgrader_workflow.py": 178,
    "test_browser.py": 60,  # 16 tests, the first setting up a pip-only venv (116-208 s)
    "test_colab_runtime.py": 40,  # 13 chapters at 20-45 s, the first building a venv (102 s)
    "test_grader_cluster.py::test_a_cluster_gives_the_grades_of_a_local_run": 97,
    "test_grader_class.py::test_a_class_of_40": 75,
    "test_grader_class.py::test_tamper_suite": 56,
    "test_grader_class.py": 12,
    "test_grader.py::test_shipped_examples": 68,
    "test_grader_boundary.py": 18,  # 8 tests, 141 s together
    "test_grader_instruments.py": 50,
    "test_grading_ch11.py": 20,
    "test_ddp_practice.py": 2,  # 14 tests, one torchrun launch with a restart for all (~25 s)
    "test_observe_boundary.py::test_a_worker": 15,
    "test_cli.py::test_check_on_a_fresh_release": 15,
    "test_figures.py::test_every_figure_a_chapter": 8,
}


# Files whose tests share one expensive module fixture (a graded class, a running Lab): their
# tests stay on one worker, or the fixture would be built twice.
# test_colab_runtime.py's chapters share one venv, into which each installs the package;
# test_ddp_practice.py's tests share one torchrun launch.
SHARED = (
    "test_grader_boundary.py",
    "test_grader_instruments.py",
    "test_browser.py",
    "test_colab_runtime.py",
    "test_ddp_practice.py",
)


def _cost(item: pytest.Item) -> int:
    nodeid = item.nodeid.removeprefix("tests/")
    matches = [prefix for prefix in COSTS if nodeid.startswith(prefix)]
    return COSTS[max(matches, key=len)] if matches else 0


def _unit(item: pytest.Item) -> str:
    nodeid = item.nodeid.removeprefix("tests/")
    return next((f for f in SHARED if nodeid.startswith(f)), nodeid)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_unit(item), []).append(item)
    cost = {name: sum(map(_cost, unit)) for name, unit in units.items()}
    halves: tuple[list[pytest.Item], list[pytest.Item]] = ([], [])
    work = [0, 0]
    quick = []
    for name in sorted(units, key=cost.__getitem__, reverse=True):  # stable
        if not cost[name]:
            quick += units[name]
            continue
        lighter = work.index(min(work))
        halves[lighter].extend(units[name])
        work[lighter] += cost[name]
    first, second = halves
    cut = max(0, len(items) // 2 - len(first))  # xdist sends the first half to the first worker
    items[:] = first + quick[:cut] + second + quick[cut:]
