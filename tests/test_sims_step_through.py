"""Chapter 04's step-through view: the cards of one stage, redrawn on the view's one figure."""

import matplotlib
import numpy as np

from forge_course.sims.display import LiveFigure
from forge_course.sims.step_through import FIGSIZE, draw_stage, step_through

matplotlib.use("Agg")

RUNNING_EXAMPLE = ([[0.5, -0.3], [0.2, 0.8]], [0.0, 0.0], [1.0, 2.0], [1.0, 0.0])


def test_a_figure_redrawn_along_the_sliders_equals_one_drawn_fresh():
    live = LiveFigure(FIGSIZE)
    ax = live.fig.subplots()
    for lr in (0.01, 0.5, 0.001):
        stages = step_through(*RUNNING_EXAMPLE, lr=lr)
        for index in range(len(stages)):
            draw_stage(stages, index, ax)
            live.pixels()
    fresh = LiveFigure(FIGSIZE)
    draw_stage(stages, len(stages) - 1, fresh.fig.subplots())
    assert np.array_equal(live.pixels(), fresh.pixels())
