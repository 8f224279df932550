"""Each solved chapter runs twice in one kernel, with no error and every test passing."""

import pytest

from forge_course.check import errors, execute, graded_results
from forge_course.release import build_sources
from tests.conftest import CHAPTERS, REPO


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    out = tmp_path_factory.mktemp("source")
    build_sources(REPO, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solution_notebook_runs_twice_cleanly(chapter, sources):
    nb = execute(sources / chapter / f"{chapter}.ipynb", repeat=2)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not errors(cell), f"cell {cell.id} failed:\n{errors(cell)[0]['evalue']}"
    results = graded_results(nb)
    assert results and all(r.passed for r in results)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "every chapter shows at least one figure"
