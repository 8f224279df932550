"""Question cells in `forge-course grade`: run as in the notebook, and a failure says why.

A question cell runs after the chapter's settings cell and every import of the chapter's other
cells, so answers computed with `torch`, `math`, NumPy or a course helper score as they do in
the notebook; a cell that raises keeps the answers it set first, and the questions it left
unanswered say that the cell raised, and what.
"""

import nbformat
import pytest

from forge_course.grader import run
from forge_course.grader.assignment import load
from forge_course.release import build_sources
from tests.conftest import REPO

CH = "ch00_training_arithmetic"

ANSWERS = {
    # 50 000 examples in batches of 256 (the last one short); 790 updates; choice b.
    "computed": (
        "import math\nimport numpy as np\n"
        "q_iterations = np.int64(math.ceil(50_000 / 256))\n"
        "q_updates = int(torch.tensor(790.0).item())\n"
        "q_scheduler = np.str_('b')\n"
    ),
    # The last line uses a variable of a demo cell, which the grader does not run.
    "raises": "q_iterations = 196\nq_scheduler = 'b'\nq_updates = epochs_run * 158\n",
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("questions")
    released = nbformat.read(REPO / "notebooks" / CH / f"{CH}.ipynb", as_version=4)
    for student, source in ANSWERS.items():
        nb = nbformat.from_dict(released)
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == "ch00_questions":
                cell.source = source
        path = root / "submitted" / student / CH / f"{CH}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    return run.grade([CH], submitted=root / "submitted", jobs=1, progress=False,
                     course_root=REPO, grading=root / "forge", unsafe=True)  # fmt: skip


@pytest.mark.slow
def test_answers_computed_with_the_chapters_modules_and_numpy_numbers_score(graded):
    for test in ("ch00_q_iterations", "ch00_q_updates", "ch00_q_scheduler"):
        result = graded[("computed", CH)][test]
        assert result["status"] == "graded", result["message"]


@pytest.mark.slow
def test_a_cell_that_raised_keeps_its_answers_and_says_what_it_raised(graded):
    results = graded[("raises", CH)]
    assert results["ch00_q_iterations"]["status"] == "graded"
    assert results["ch00_q_scheduler"]["status"] == "graded"
    failed = results["ch00_q_updates"]
    assert failed["points"] == 0
    assert "raised NameError: name 'epochs_run' is not defined" in failed["message"]
    assert "without the other cells' variables" in failed["message"]


def test_question_cells_run_after_the_imports_of_the_chapters_other_cells(tmp_path):
    build_sources(REPO, tmp_path)
    assignment = load(CH, tmp_path / CH / f"{CH}.ipynb")
    assert assignment.question_prelude.startswith(assignment.prelude)
    added = assignment.question_prelude[len(assignment.prelude) :]
    assert "    from forge_course.data import make_spiral\nexcept ImportError:" in added
    exec(compile(added, "<imports>", "exec"), {})  # each import that fails is skipped
