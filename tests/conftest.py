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


# Roughly what each slow test costs on two shared cores (seconds, from `--durations`). xdist's
# `worksteal` hands the first half of the list to one worker and the second half to the other,
# and an idle worker steals from the end of the other's queue; so each half starts with every
# other slow test, longest first, and the quick ones come last, where stealing evens them out.
COSTS = {
    "test_grader_class.py::test_a_class_of_40": 80,
    "test_colab_runtime.py": 130,  # each chapter; 13 of them, on one worker (SHARED)
    "test_grader_boundary.py": 120,
    "test_autograde.py": 110,
    "test_grader_determinism.py": 90,
    "test_grader_instruments.py": 50,
    "test_grader_class.py::test_tamper_suite": 75,
    "test_grader.py::test_shipped_examples": 55,
    "test_browser.py": 25,
    "test_grading_ch11.py": 20,
    "test_observe_boundary.py::test_a_worker": 15,
    "test_notebooks.py": 15,
    "test_cli.py::test_check_on_a_fresh_release": 15,
    "test_grader_class.py": 12,
    "test_figures.py::test_every_figure_a_chapter": 8,
}


# Files whose tests share one expensive module fixture (a graded class, a running Lab): their
# tests stay on one worker, or the fixture would be built twice.
# test_colab_runtime.py's chapters share one venv, into which each installs the package.
SHARED = (
    "test_grader_boundary.py",
    "test_grader_instruments.py",
    "test_browser.py",
    "test_colab_runtime.py",
)


def _cost(item: pytest.Item) -> int:
    nodeid = item.nodeid.removeprefix("tests/")
    return max((cost for prefix, cost in COSTS.items() if nodeid.startswith(prefix)), default=0)


def _unit(item: pytest.Item) -> str:
    nodeid = item.nodeid.removeprefix("tests/")
    return next((f for f in SHARED if nodeid.startswith(f)), nodeid)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_unit(item), []).append(item)
    ranked = sorted(units.values(), key=lambda u: max(map(_cost, u)), reverse=True)  # stable
    slow = [u for u in ranked if max(map(_cost, u))]
    quick = [item for u in ranked[len(slow) :] for item in u]
    first = [item for u in slow[0::2] for item in u]
    second = [item for u in slow[1::2] for item in u]
    cut = max(0, len(items) // 2 - len(first))  # xdist sends the first half to the first worker
    items[:] = first + quick[:cut] + second + quick[cut:]
