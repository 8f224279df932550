"""Chapter 04's step-through view: the cards of one stage, redrawn on the view's one figure."""

import re

import matplotlib
import numpy as np
import pytest

from forge_course.sims.display import LiveFigure
from forge_course.sims.step_through import FIGSIZE, StagesPicture, draw_stage, step_through

matplotlib.use("Agg")

RUNNING_EXAMPLE = ([[0.5, -0.3], [0.2, 0.8]], [0.0, 0.0], [1.0, 2.0], [1.0, 0.0])


def test_a_figure_redrawn_along_the_sliders_equals_one_drawn_fresh():
    live = LiveFigure(FIGSIZE)
    picture = StagesPicture(live.fig.subplots())
    live.moving(picture.moving_artists)  # as the view does: cards, values and title redrawn
    for lr in (0.01, 0.5, 0.001):
        stages = step_through(*RUNNING_EXAMPLE, lr=lr)
        for index in (*range(len(stages)), 2, 0, len(stages) - 1):
            picture.update(stages, index)
            live.pixels()
    fresh = LiveFigure(FIGSIZE)
    draw_stage(stages, len(stages) - 1, fresh.fig.subplots())
    assert np.array_equal(live.pixels(), fresh.pixels())


@pytest.mark.parametrize(
    "example,says",
    [
        (
            ([[0.5, -0.3], [0.2, 0.8]], [0.0, 0.0], [1.0, 2.0, 3.0], [1.0, 0.0]),
            "W has 2 columns but x has 3 numbers",
        ),
        (
            ([[0.5, -0.3], [0.2, 0.8]], [0.0], [1.0, 2.0], [1.0, 0.0]),
            "W has 2 rows but b has 1 numbers",
        ),
        (([[0.5, -0.3]], [0.0], [1.0, 2.0], [1.0, 0.0]), "W has 1 rows but t has 2 numbers"),
        (("0.5, -0.3", [0.0], [1.0, 2.0], [1.0]), "W should be a list of lists of numbers"),
        (([0.5, -0.3], [0.0], [1.0, 2.0], [1.0]), "W should be a list of lists of numbers"),
        (([[0.5, "a"]], [0.0], [1.0, 2.0], [1.0]), "W should be a list of lists of numbers"),
    ],
)
def test_an_example_that_does_not_fit_is_named_in_one_sentence(example, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        step_through(*example)


def test_tensors_and_arrays_are_accepted_and_lr_must_be_positive():
    import torch

    W, b, x, t = RUNNING_EXAMPLE
    as_tensors = step_through(torch.tensor(W, dtype=torch.float64), np.array(b), torch.tensor(x), t)
    assert as_tensors == step_through(*RUNNING_EXAMPLE)
    with pytest.raises(ValueError, match="lr should be a positive number"):
        step_through(*RUNNING_EXAMPLE, lr="0.1")
