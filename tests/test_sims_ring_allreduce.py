"""The ring all-reduce and memory views' engines, headless: states, colours, numbers, speed."""

import matplotlib
import matplotlib.pyplot as plt
import pytest

from forge_course.sims.display import PALETTE
from forge_course.sims.ring_allreduce import (
    chunk_colour,
    draw_memory,
    draw_ring,
    memory_rows,
    ring_allreduce_steps,
)

matplotlib.use("Agg")

RUNNING = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [100.0, 200.0, 300.0]]


def test_running_example_step_by_step():
    states = ring_allreduce_steps(RUNNING)
    assert [s["step"] for s in states] == [0, 1, 2, 3, 4]
    assert [s["phase"] for s in states] == ["start"] + ["reduce-scatter"] * 2 + ["all-gather"] * 2
    # Step 1: worker 0 sends chunk 0 to worker 1, which now holds 10 + 1 = 11 summing ranks 0, 1.
    assert states[1]["sends"] == [(0, 1, 0), (1, 2, 1), (2, 0, 2)]
    assert states[1]["chunks"][1][0] == [11.0] and states[1]["ranks"][1][0] == [0, 1]
    # After reduce-scatter, worker r holds the complete chunk (r + 1) mod 3.
    assert [states[2]["chunks"][r][(r + 1) % 3] for r in range(3)] == [[222.0], [333.0], [111.0]]
    assert all(s["ranks"] == [[[0, 1, 2]] * 3] * 3 for s in states[-1:])
    assert states[-1]["chunks"] == [[[111.0], [222.0], [333.0]]] * 3


@pytest.mark.parametrize("n,length", [(2, 1), (4, 10), (5, 3), (7, 7)])
def test_every_worker_ends_with_the_sum_and_counts_grow(n, length):
    values = [[float(r * 100 + i) for i in range(length)] for r in range(n)]
    states = ring_allreduce_steps(values)
    assert len(states) == 2 * n - 1
    total = [sum(col) for col in zip(*values)]
    for worker in states[-1]["chunks"]:
        assert [x for chunk in worker for x in chunk] == total
    counts = [sum(len(c) for w in s["ranks"] for c in w) for s in states]
    assert counts == sorted(counts) and counts[-1] == n * n * n


def test_colours_mark_complete_chunks_green():
    assert chunk_colour(4, 4) == PALETTE["green"]
    assert len({chunk_colour(k, 7) for k in range(1, 7)}) == 6
    assert PALETTE["green"] not in {chunk_colour(k, 7) for k in range(1, 7)}


def test_memory_rows_for_one_billion_parameters_on_eight_ranks():
    totals = [row["total"] / 1e9 for row in memory_rows(1e9, 8)]
    assert totals == [16.0, 9.0, 5.5, 2.0]


def test_drawing_every_step_into_one_axes_ends_on_the_last():
    states = ring_allreduce_steps([[float(i)] * 6 for i in range(4)])
    fig, ax = plt.subplots()
    for i in range(len(states)):
        draw_ring(states, i, ax)
    fig2, ax2 = plt.subplots()
    for stage in range(4):
        draw_memory(1e9, 8, stage, ax2)
    plt.close(fig)
    plt.close(fig2)
    assert ax.get_title().startswith("Ring all-reduce, 4 workers: step 6 of 6")
    assert ax2.get_ylabel() and ax2.get_xlabel().endswith("ZeRO-3 / FSDP: + parameters sharded)")


def test_figures_redrawn_along_the_sliders_equal_ones_drawn_fresh():
    import numpy as np

    from forge_course.sims.display import LiveFigure
    from forge_course.sims.ring_allreduce import RingPicture, memory_picture, ring_allreduce_steps

    states = ring_allreduce_steps([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [100.0, 200.0, 300.0]])

    def live(figsize, picture):  # as the views build their figures
        figure = LiveFigure(figsize)
        drawn = picture(figure.fig)
        figure.moving(drawn.moving_artists)
        return figure, drawn

    (ring, ring_picture), (memory, memory_drawn) = (
        live((7.5, 6.2), lambda fig: RingPicture(fig.subplots(), states)),
        live((7.5, 3.6), memory_picture),
    )
    for index in [*range(len(states)), 0, 3]:
        ring_picture.update(index)
        ring.pixels()
    for params, ranks, stage in ((1e9, 8, 0), (1e9, 64, 3), (3e6, 64, 3), (1e12, 1, 1),
                                 (2e9, 4, 2)):  # fmt: skip
        memory_drawn.update(params, ranks, stage)
        memory.pixels()
    (fresh_ring, fresh_ring_picture), (fresh_memory, fresh_memory_picture) = (
        live((7.5, 6.2), lambda fig: RingPicture(fig.subplots(), states)),
        live((7.5, 3.6), memory_picture),
    )
    fresh_ring_picture.update(3)
    fresh_memory_picture.update(2e9, 4, 2)
    assert np.array_equal(ring.pixels(), fresh_ring.pixels())
    assert np.array_equal(memory.pixels(), fresh_memory.pixels())
