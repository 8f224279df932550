"""A failed check, as the learner sees it in a notebook: the message and their own code only."""

import re

import nbformat
import pytest

from forge_course.check import errors, execute
from forge_course.observe.common import Mistake, call_answer
from forge_course.observe.shown import render
from tests.answers.ch04 import TRAIN_STEP_NO_ZERO_GRAD

RAISES_INSIDE = """
def scaled(loss):
    return loss * "2"

def train_step(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = scaled(loss_fn(model(x), y))
    loss.backward()
    optimizer.step()
    return loss.item()
"""
CHECK = "from forge_course.grading import ch04\nch04.check_train_step(train_step)"


def _shown(answer: str, tmp_path) -> str:
    """The traceback text a kernel shows for the check of ``answer``, colours removed."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(answer.strip()),
                                         nbformat.v4.new_code_cell(CHECK)])  # fmt: skip
    nbformat.write(nb, tmp_path / "answer.ipynb")
    (failure,) = errors(execute(tmp_path / "answer.ipynb").cells[1])
    assert failure["ename"] == "Mistake"  # still an error: the cell fails, nbgrader counts it
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(failure["traceback"]))


@pytest.mark.slow
def test_a_wrong_answer_shows_the_message_and_nothing_of_the_course(tmp_path):
    text = _shown(TRAIN_STEP_NO_ZERO_GRAD, tmp_path)
    assert text.startswith("Check failed [ch04_train_step]")
    assert "Likely mistake: `optimizer.zero_grad()` is missing" in text
    assert "forge_course" not in text and "site-packages" not in text and "File " not in text


@pytest.mark.slow
def test_an_error_in_the_learners_code_shows_their_lines_only(tmp_path):
    text = _shown(RAISES_INSIDE, tmp_path)
    assert "`train_step` raised TypeError" in text
    assert "Where it happened in your code:" in text
    assert re.search(r"Cell In\[\d+\], line 6, in train_step\n +loss = scaled", text), text
    assert re.search(r"Cell In\[\d+\], line 2, in scaled\n +return loss \* \"2\"", text), text
    assert "forge_course" not in text and "site-packages" not in text


def test_frames_of_the_course_and_of_libraries_are_left_out(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("import torch\n\ndef f():\n    return torch.ones(2) @ 'x'\n")
    scope: dict = {}
    exec(compile(mine.read_text(), str(mine), "exec"), scope)
    with pytest.raises(Mistake) as caught:
        call_answer("ch99_demo", "f", scope["f"])
    lines = render(caught.value)
    assert "[ch99_demo] `f` raised TypeError" in lines[0]
    assert [line.strip() for line in lines[2:4]] == [
        f"{mine}, line 4, in f",
        "return torch.ones(2) @ 'x'",
    ], lines
    assert not any("forge_course" in line or "torch/" in line for line in lines), lines
