"""The profile explorer's engine: the hand calculation, the prefetch limit, and its view."""

import matplotlib

matplotlib.use("Agg")

import pytest

from forge_course.sims.profile_explorer import (
    ProfilePicture,
    costs,
    draw,
    profile_explorer_view,
    simulate,
)


@pytest.mark.parametrize(
    "workers,step_ms,idle",
    [(0, 11.0, 8 / 11), (1, 8.0, 5 / 8), (2, 4.0, 0.25), (3, 3.0, 0.0), (8, 3.0, 0.0)],
)
def test_the_hand_calculation(workers, step_ms, idle):
    """8 ms to load, 3 to compute: max(C, L / W) with workers, L + C without."""
    timeline = simulate(8, 3, workers, prefetch=2, steps=40)
    assert timeline.steady_step_ms == pytest.approx(step_ms)
    assert timeline.idle_share == pytest.approx(idle)


@pytest.mark.parametrize("workers", range(1, 9))
def test_a_short_run_of_many_workers_gives_the_steady_pace(workers):
    """The view simulates 12 steps: with more workers than fit twice in them, the batches come
    in one or two bursts, and the pace read off the run must still be L / W when loading is
    the slower part (here 27.7 ms a batch against 0.3 ms of compute)."""
    timeline = simulate(27.7, 0.3, workers, prefetch=2, steps=12)
    assert timeline.steady_step_ms == pytest.approx(27.7 / workers)
    assert timeline.idle_share == pytest.approx(1 - 0.3 / (27.7 / workers))


def test_without_workers_the_main_process_loads_then_computes():
    timeline = simulate(5, 2, workers=0, steps=3)
    assert timeline.in_main and timeline.loads == [[(0, 5), (7, 5), (14, 5)]]
    assert timeline.computes == [(5, 2), (12, 2), (19, 2)] and timeline.end_ms == 21


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_batches_in_flight_stay_within_workers_times_prefetch(prefetch):
    """A fast loader and a slow model: the loader runs ahead exactly as far as it may, with at
    most workers × prefetch batches requested and not yet taken by the model (DataLoader's
    rule), and the model never waits once it has started."""
    workers, steps = 2, 30
    timeline = simulate(1, 10, workers, prefetch, steps)
    taken = [start for start, _ in timeline.computes]
    starts = [timeline.loads[j % workers][j // workers][0] for j in range(steps)]
    in_flight = [sum(taken[k] > starts[j] for k in range(j)) for j in range(steps)]
    assert max(in_flight) == workers * prefetch - 1  # plus batch j itself: the limit, reached
    assert timeline.idle_share == 0


def test_prefetch_changes_nothing_in_the_steady_state():
    assert {simulate(12, 5, 2, p, steps=40).steady_step_ms for p in (1, 2, 4)} == {6.0}


def test_costs_grow_with_the_batch():
    assert costs(64, 0.3, 0.5, 0.01) == pytest.approx((19.2, 1.14))


@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"load_ms": -1, "compute_ms": 1}, "load_ms"),
        ({"load_ms": 1, "compute_ms": "3"}, "compute_ms"),
        ({"load_ms": 1, "compute_ms": 1, "workers": 1.5}, "workers"),
        ({"load_ms": 1, "compute_ms": 1, "prefetch": 0}, "prefetch"),
        ({"load_ms": 1, "compute_ms": 1, "steps": True}, "steps"),
    ],
)
def test_bad_settings_are_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        simulate(**kwargs)


def test_drawing_has_a_lane_per_loader_and_one_for_the_model():
    fig = draw(simulate(8, 3, workers=3))
    labels = [t.get_text() for t in fig.axes[0].texts if t.get_visible()]
    assert labels == ["model", "worker 0", "worker 1", "worker 2"]
    assert "step 3.0 ms" in fig.axes[0].get_title()


def test_the_time_axis_and_the_figure_stay_as_the_workers_change():
    """The view redraws only the bars, labels and title as the workers slide."""
    from forge_course.sims.display import LiveFigure

    live = LiveFigure((10, 1.4))
    picture = ProfilePicture(live.fig)
    slowest = simulate(19.2, 0.7, 0).end_ms
    shown = set()
    for workers in range(9):
        timeline = simulate(19.2, 0.7, workers)
        assert timeline.end_ms <= slowest
        picture.update(timeline, span_ms=slowest)
        shown.add((tuple(live.fig.get_size_inches()), picture.ax.get_xlim(), picture.ax.get_ylim()))
    assert len(shown) == 1


def test_the_view_builds_its_widgets_and_fallback(capsys):
    profile_explorer_view(0.3, 0.5, 0.01, workers=2, batch=64)
    shown = capsys.readouterr().out
    assert "application/vnd.jupyter.widget-view+json" in shown and "image/png" in shown


def test_a_figure_redrawn_along_the_sliders_equals_one_drawn_fresh():
    """The view keeps one figure, which grows and shrinks with the loader's lanes."""
    import numpy as np

    from forge_course.sims.display import LiveFigure

    live = LiveFigure((10, 1.4))
    picture = ProfilePicture(live.fig)  # as the view keeps it, drawing only what moves
    live.moving(picture.moving_artists)
    for load, compute, workers, prefetch in ((19.2, 0.7, 4, 2), (8, 3, 0, 2), (8, 3, 8, 1),
                                             (8, 3, 1, 2), (38.4, 1.1, 2, 3)):  # fmt: skip
        picture.update(simulate(load, compute, workers, prefetch), span_ms=240.0)
        live.pixels()
    fresh = LiveFigure((10, 1.4))
    draw(simulate(38.4, 1.1, 2, 3), fig=fresh.fig, span_ms=240.0)
    assert np.array_equal(live.pixels(), fresh.pixels())
