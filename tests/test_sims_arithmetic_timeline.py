"""The training-arithmetic calculator's engine, driven headless."""

from __future__ import annotations

import matplotlib
import pytest

from forge_course.reference.arithmetic import training_arithmetic
from forge_course.sims import arithmetic_timeline as sim

matplotlib.use("Agg")


def test_numbers_are_the_references():
    tl = sim.timeline(10_000, 32, 3, 4)
    assert tl.numbers == training_arithmetic(10_000, 32, 3, 4)


def test_the_leak_example_block_by_block():
    tl = sim.timeline(100, 16, 3, 4)
    assert [b.size for b in tl.blocks] == [16] * 6 + [4]
    assert [b.index for b in tl.blocks if b.steps] == [3, 6]
    assert [b.index for b in tl.blocks if b.naive_steps] == [3]
    assert [b.index for b in tl.blocks if b.tail] == [4, 5, 6]
    assert tl.naive == {
        "updates_per_epoch": 1,
        "total_updates": 3,
        "stale_micro_batches": 3,
        "stale_examples": 36,
    }
    assert tl.hidden == 0 and tl.gap_x is None and tl.dropped == 0


def test_running_example_shows_both_ends_of_a_long_epoch():
    tl = sim.timeline(10_000, 32, 3, 4)
    shown = [b.index for b in tl.blocks]
    assert shown == [*range(sim.HEAD), *range(313 - sim.TAIL, 313)]
    assert tl.hidden == 313 - sim.HEAD - sim.TAIL
    # The partial batch and the one-micro-batch tail group are at the end, in view.
    assert (tl.blocks[-1].size, tl.blocks[-1].tail, tl.blocks[-1].steps) == (16, True, True)
    assert not tl.blocks[-1].naive_steps
    assert tl.naive["updates_per_epoch"] == 78 and tl.naive["stale_examples"] == 16
    # Blocks never overlap, and the gap sits between the two ends.
    xs = [b.x for b in tl.blocks]
    assert all(b - a >= 1 for a, b in zip(xs, xs[1:]))
    assert xs[sim.HEAD] - xs[sim.HEAD - 1] == 1 + sim.GAP


def test_the_first_update_is_in_view_even_for_a_large_k():
    tl = sim.timeline(10_000, 8, 1, 16)
    assert any(b.naive_steps for b in tl.blocks if tl.gap_x is None or b.x < tl.gap_x)


def test_drop_last_drops_the_partial_batch():
    tl = sim.timeline(100, 16, 1, drop_last=True)
    assert [b.size for b in tl.blocks] == [16] * 6
    assert tl.dropped == 4


def test_drop_last_with_n_below_b_leaves_nothing():
    tl = sim.timeline(5, 8, 2, 2, drop_last=True)
    assert tl.blocks == () and tl.dropped == 5
    assert "No micro-batch at all" in sim.summary(tl)[2]
    sim.draw_timeline(tl)  # draws an empty epoch without error


def test_a_naive_loop_with_fewer_micro_batches_than_k_never_steps():
    tl = sim.timeline(10, 3, 3, 5)
    assert tl.naive["updates_per_epoch"] == 0
    assert tl.numbers["updates_per_epoch"] == 1
    assert "never steps" in sim.summary(tl)[2]


def test_when_k_divides_the_epoch_both_loops_agree():
    tl = sim.timeline(1024, 32, 2, 4)
    assert all(b.steps == b.naive_steps for b in tl.blocks)
    assert "the same" in sim.summary(tl)[2]


def test_many_epochs_draw_the_first_three_and_the_last():
    assert sim.timeline(100, 16, 10, 4).rows == (1, 2, 3, 10)
    assert sim.timeline(100, 16, 4, 4).rows == (1, 2, 3, 4)


def test_summary_of_the_running_example():
    lines = sim.summary(sim.timeline(10_000, 32, 3, 4))
    assert "313 micro-batches per epoch (last of 16), 939 in all; 30,000 examples" in lines[0]
    assert "effective batch 128, 79 updates per epoch, 237 in all" in lines[1]
    assert "78 updates per epoch, 234 in all; 1 micro-batch (16 examples)" in lines[2]


def test_presets_are_valid_runs():
    for values in sim.PRESETS.values():
        sim.timeline(*values)


def test_the_drawing_has_both_loops_and_the_numbers():
    fig = sim.draw_timeline(sim.timeline(100, 16, 3, 4))
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[0].startswith("Correct loop") and titles[1].startswith("Naive loop")
    counts = [ax.get_title(loc="right") for ax in fig.axes]
    assert counts == ["2 updates per epoch", "1 update per epoch"]
    assert "7 micro-batches per epoch" in fig.get_suptitle()


def test_a_long_epoch_keeps_its_axes_whatever_k():
    """K moves the blocks' colours and the bars, not the axes: a view redraws only those."""
    from forge_course.sims.display import LiveFigure

    live = LiveFigure((10, 2.2))
    picture = sim.TimelinePicture(live.fig, with_summary=False)
    shown = set()
    for k in range(1, 17):
        picture.update(sim.timeline(10_000, 32, 3, k))
        shown.add((tuple(live.fig.get_size_inches()), live.fig.axes[1].get_xlim(),
                   *(ax.get_ylim() for ax in live.fig.axes)))  # fmt: skip
    assert len(shown) == 1


def test_the_view_builds_and_shows_a_fallback_picture(monkeypatch):
    pytest.importorskip("ipywidgets")
    shown = []
    monkeypatch.setattr(sim, "show", lambda widget, fig: shown.append((widget, fig)))
    sim.arithmetic_timeline_view(100, 16, 3, 4)
    ((widget, fig),) = shown
    assert "Correct loop" in fig.axes[0].get_title(loc="left")
    descriptions = [w.description for w in widget.children[1].children[0].children]
    assert descriptions == ["N (examples)", "B (batch)", "epochs"]


def test_a_preset_sets_every_control_and_redraws_once(monkeypatch):
    pytest.importorskip("ipywidgets")
    shown, drawn = [], []
    monkeypatch.setattr(sim, "show", lambda widget, fig: shown.append(widget))
    real_update = sim.TimelinePicture.update
    monkeypatch.setattr(
        sim.TimelinePicture, "update", lambda self, tl: drawn.append(tl) or real_update(self, tl)
    )
    sim.arithmetic_timeline_view()
    preset, controls = shown[0].children[0], shown[0].children[1]
    drawn.clear()
    preset.value = "the leak: N=100, B=16, K=4, 3 epochs"
    assert len(drawn) == 1
    tl = drawn[0]
    assert (tl.dataset_size, tl.batch_size, tl.epochs, tl.accum_steps, tl.drop_last) == (
        100, 16, 3, 4, False,
    )  # fmt: skip
    controls.children[1].children[1].value = True  # drop_last
    assert drawn[-1].drop_last and drawn[-1].dropped == 4
    numbers = shown[0].children[2].value  # printed beside the figure
    assert "6 micro-batches per epoch" in numbers and "(4 dropped per epoch)" in numbers


def test_a_figure_redrawn_along_the_sliders_equals_one_drawn_fresh():
    import numpy as np

    from forge_course.sims.display import LiveFigure

    live = LiveFigure((10, 2.2))
    picture = sim.TimelinePicture(live.fig, with_summary=False)
    live.moving(picture.moving_artists)  # as the view: only what changes is drawn per event
    runs = [(10_000, 32, 3, 4), (100, 16, 6, 4, True), (1_000, 64, 5, 1), (100, 16, 3, 4),
            (10_000, 32, 3, 7), (10_000, 8, 10, 16), (9_000, 32, 7, 2),
            (100, 16, 3, 3)]  # fmt: skip
    for values in runs:
        picture.update(sim.timeline(*values))
        live.pixels()
    fresh = LiveFigure((10, 2.2))
    sim.TimelinePicture(fresh.fig, with_summary=False).update(sim.timeline(100, 16, 3, 3))
    assert np.array_equal(live.pixels(), fresh.pixels())
