"""The bug detector's engine, headless: each bug leaves its own signature, and only that one."""

from __future__ import annotations

import matplotlib
import pytest
import torch

from forge_course.sims import bug_detector as bd

matplotlib.use("Agg")

STEPS = 60  # 10 epochs: enough for every signature, quick enough for the suite


@pytest.fixture(scope="module")
def clean():
    return bd.run((), STEPS, seed=0)


def test_every_curve_has_its_length(clean):
    assert set(clean) == set(bd.CURVES)
    for key in ("loss", "grad_norm", "live_graphs", "live_kib"):
        assert len(clean[key]) == STEPS
    assert clean["eval_step"] == list(range(bd.EVAL_EVERY, STEPS + 1, bd.EVAL_EVERY))
    for key in ("val_loss", "val_gap", "val_accuracy"):
        assert len(clean[key]) == len(clean["eval_step"])
    assert bd.run((), 7, seed=0)["eval_step"] == [5, 7]  # the last step is always validated


def test_the_bug_free_run_learns_and_keeps_nothing(clean):
    assert clean["val_loss"][-1] < clean["val_loss"][0] - 0.1
    assert set(clean["val_gap"]) == {0.0}
    assert max(clean["live_graphs"]) <= 1
    assert max(clean["live_kib"]) == min(clean["live_kib"])


def test_runs_are_deterministic_and_leave_the_global_random_state_alone():
    key = (frozenset({"no_eval_mode"}), 12, 3)
    bd._CACHE.pop(key, None)
    state = torch.get_rng_state()
    first = bd.run({"no_eval_mode"}, 12, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    bd._CACHE.pop(key)
    assert bd.run({"no_eval_mode"}, 12, seed=3) == first


def test_no_zero_grad_makes_the_applied_gradient_norm_grow(clean):
    bug = bd.run({"no_zero_grad"}, STEPS, seed=0)
    assert bug["grad_norm"][0] == clean["grad_norm"][0]  # the first step has nothing to add to
    assert max(bug["grad_norm"]) > 10 * max(clean["grad_norm"])
    assert bug["loss"][-1] > 2 * clean["loss"][-1]


def test_no_eval_mode_changes_validation_only(clean):
    bug = bd.run({"no_eval_mode"}, STEPS, seed=0)
    assert bug["loss"] == clean["loss"]  # training is untouched, Dropout draws included
    assert all(gap > 0 for gap in bug["val_gap"])


def test_kept_graphs_grow_one_per_step_without_holding_activations(clean):
    bug = bd.run({"kept_graph"}, STEPS, seed=0)
    assert bug["live_graphs"] == list(range(1, STEPS + 1))
    assert bug["live_kib"] == clean["live_kib"]  # backward already freed what they saved
    assert bug["loss"] == clean["loss"]


def test_validation_graphs_cost_memory_only_when_kept(clean):
    alone = bd.run({"eval_records_graph"}, STEPS, seed=0)
    assert max(alone["live_graphs"]) <= 2
    assert max(alone["live_kib"]) == max(clean["live_kib"])
    kept = bd.run({"eval_records_graph", "kept_graph"}, STEPS, seed=0)
    evaluations = len(kept["eval_step"])
    assert kept["live_graphs"][-1] == STEPS + evaluations
    per_evaluation = (kept["live_kib"][-1] - kept["live_kib"][0]) / (evaluations - 1)
    assert per_evaluation > 10  # each kept validation graph holds its activations


def test_retain_graph_grows_memory_only_with_kept_losses(clean):
    alone = bd.run({"retain_graph"}, STEPS, seed=0)
    assert max(alone["live_kib"]) == min(alone["live_kib"]) > max(clean["live_kib"])
    kept = bd.run({"retain_graph", "kept_graph"}, STEPS, seed=0)
    steps = kept["live_kib"]
    growth = [b - a for a, b in zip(steps, steps[1:])]
    assert min(growth) > 0 and max(growth) == pytest.approx(min(growth))


def test_softmax_and_stale_head_stall_the_loss(clean):
    softmax = bd.run({"softmax_before_ce"}, STEPS, seed=0)
    stale = bd.run({"stale_head"}, STEPS, seed=0)
    assert softmax["grad_norm"][0] < clean["grad_norm"][0] / 2
    for bug in (softmax, stale):
        assert bug["val_loss"][-1] > clean["val_loss"][-1] + 0.1


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="Unknown bug"):
        bd.run({"no_zero_grads"})
    with pytest.raises(ValueError, match="at least 1"):
        bd.run((), steps=0)


def test_progress_is_reported_and_cached_runs_answer_at_once():
    seen = []
    bd._CACHE.pop((frozenset({"stale_head"}), 9, 1), None)
    bd.run({"stale_head"}, 9, seed=1, progress=seen.append)
    assert seen == list(range(1, 10))
    cached = bd._CACHE[(frozenset({"stale_head"}), 9, 1)]
    again = bd.run({"stale_head"}, 9, seed=1, progress=seen.append)
    assert len(seen) == 9, "a cached run trains nothing, so it reports no progress"
    assert bd._CACHE[(frozenset({"stale_head"}), 9, 1)] is cached and again == cached


def test_draw_and_the_view_render_headless(clean):
    fig = bd.draw(bd.run({"kept_graph"}, STEPS, seed=0), clean, "kept graph")
    assert len(fig.axes) == 6
    assert [ax.get_title() for ax in fig.axes] == [panel[2] for panel in bd.PANELS]
    bd.bug_detector_view(initial={"kept_graph"}, steps=30, seed=0)
    assert "validate without model.eval()" in bd.describe_bugs({"no_eval_mode"})


def test_a_picture_updated_run_after_run_equals_one_drawn_fresh(clean):
    import numpy as np

    from forge_course.sims.display import LiveFigure

    live = LiveFigure(bd.FIGSIZE)
    picture = bd.CurvesPicture(live.fig)
    live.moving(picture.moving_artists)  # as the view does: the axes never change between runs
    limits = None
    for bugs in ({"kept_graph"}, {"no_eval_mode", "stale_head"}, {"no_eval_mode"}):
        picture.update(bd.run(bugs, STEPS, seed=0), clean, bd.describe_bugs(bugs))
        live.pixels()
        # Runs of other ranges move the hand-drawn y axes, not the axes: no full redraw.
        assert limits in (None, [(ax.get_xlim(), ax.get_ylim()) for ax in picture.axes])
        limits = [(ax.get_xlim(), ax.get_ylim()) for ax in picture.axes]
    fresh = LiveFigure(bd.FIGSIZE)
    last = bd.run({"no_eval_mode"}, STEPS, seed=0)
    bd.CurvesPicture(fresh.fig).update(last, clean, bd.describe_bugs({"no_eval_mode"}))
    assert np.array_equal(live.pixels(), fresh.pixels())
