"""The train-vs-eval engine, headless: what each press shows is what PyTorch does."""

from __future__ import annotations

import copy
import gc
import time

import matplotlib
import pytest
import torch

from forge_course.reference.memory import saved_activation_bytes
from forge_course.sims.train_vs_eval import LiveGraphMemory, TrainVsEval, draw_presses

matplotlib.use("Agg")


def test_a_replay_gives_the_same_presses():
    first, second = TrainVsEval(seed=3), TrainVsEval(seed=3)
    assert [first.press() for _ in range(3)] == [second.press() for _ in range(3)]


def test_the_engine_leaves_the_global_random_state_alone():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    TrainVsEval(seed=0).press()
    assert torch.equal(torch.rand(3), expected)


def test_train_outputs_change_from_press_to_press_and_eval_outputs_do_not():
    sim = TrainVsEval(seed=0)
    presses = [sim.press() for _ in range(4)]
    train = [p.train.outputs for p in presses]
    evaluation = [p.eval.outputs for p in presses]
    assert all(a != b for a, b in zip(train, train[1:]))
    assert all(e == evaluation[0] for e in evaluation)


def test_dropout_masks_in_train_mode_and_none_in_eval_mode():
    sim = TrainVsEval(seed=1, p=0.5, batch=8, hidden=16)
    dropped = [sum(map(sum, sim.press().train.dropped)) for _ in range(10)]
    # 128 units per press at p = 0.5: the share dropped over 10 presses is close to one half.
    assert 0.4 < sum(dropped) / (10 * 128) < 0.6
    assert not any(map(any, sim.press().eval.dropped))


def test_kept_units_are_scaled_by_one_over_keep_probability():
    sim = TrainVsEval(seed=2, p=0.25)
    press = sim.press()
    with torch.no_grad():
        linear, norm, tanh, _, _ = sim.eval_model
        active = tanh(torch.nn.functional.batch_norm(linear(sim.x), None, None, training=True))
    hidden = torch.tensor(press.train.hidden, dtype=torch.float32)
    kept = hidden != 0
    torch.testing.assert_close(hidden[kept], active[kept] / 0.75)


def test_p_zero_drops_nothing_and_train_outputs_repeat():
    sim = TrainVsEval(seed=0, p=0.0)
    first, second = sim.press(), sim.press()
    assert not any(map(any, first.train.dropped))
    assert first.train.outputs == second.train.outputs


def test_batch_norm_uses_the_batch_mean_in_train_and_the_running_mean_in_eval():
    sim = TrainVsEval(seed=0)
    running_before = sim.eval_model[1].running_mean.tolist()
    press = sim.press()
    batch_mean = sim.train_model[0](sim.x).mean(dim=0).tolist()
    assert press.train.mean_used == pytest.approx(batch_mean)
    assert press.eval.mean_used == pytest.approx(running_before)
    assert press.eval.running_mean == pytest.approx(running_before)


def test_train_mode_moves_the_running_mean_by_momentum_even_under_no_grad():
    sim = TrainVsEval(seed=0)
    old = torch.tensor(sim.train_model[1].running_mean.tolist(), dtype=torch.float64)
    press = sim.press(no_grad=True)
    batch_mean = torch.tensor(press.train.mean_used, dtype=torch.float64)
    # PyTorch's update: running ← (1 − momentum)·running + momentum·batch, momentum 0.1.
    expected = 0.9 * old + 0.1 * batch_mean
    torch.testing.assert_close(
        torch.tensor(press.train.running_mean, dtype=torch.float64), expected, rtol=1e-6, atol=1e-7
    )


def test_saved_bytes_equal_the_reference_count_and_vanish_under_no_grad():
    sim = TrainVsEval(seed=0)
    expected_train = saved_activation_bytes(copy.deepcopy(sim.train_model), sim.x.clone())
    expected_eval = saved_activation_bytes(sim.eval_model, sim.x.clone())
    press = sim.press()
    assert (press.saved_train_bytes, press.saved_eval_bytes) == (expected_train, expected_eval)
    # Dropout saves its mask and output in train mode only: eval mode records less, not nothing.
    assert 0 < press.saved_eval_bytes < press.saved_train_bytes
    quiet = sim.press(no_grad=True)
    assert (quiet.saved_train_bytes, quiet.saved_eval_bytes, quiet.held_bytes) == (0, 0, 0)


def test_graph_memory_grows_only_while_outputs_with_graphs_are_kept():
    sim = TrainVsEval(seed=0)
    assert sim.press().held_bytes == 0  # outputs dropped: their graphs died with them
    held = [sim.press(keep=True).held_bytes for _ in range(4)]
    steps = [b - a for a, b in zip(held, held[1:])]
    # Every kept press adds the same amount (the running-statistics buffers count once).
    assert held[0] > 0 and len(set(steps)) == 1 and steps[0] > 0
    assert sim.press(keep=True, no_grad=True).held_bytes == held[-1]
    sim.kept.clear()
    assert sim.memory.live_bytes() == 0


def test_live_graph_memory_counts_a_running_total_that_keeps_every_graph():
    memory = LiveGraphMemory()
    layer = torch.nn.Linear(10, 1)
    total, totals = 0.0, []
    with memory:
        for _ in range(3):
            total = total + layer(torch.randn(4, 10)).sum()  # keeps each batch's graph
            totals.append(memory.live_bytes())
    # Each batch adds its 4×10 float32 input; the sum's graph keeps all of them alive.
    assert totals == [160, 320, 480]
    del total
    gc.collect()
    assert memory.live_bytes() == 0


def test_live_graph_memory_does_not_change_what_backward_computes():
    torch.manual_seed(0)
    layer, x = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU()), torch.randn(5, 3)
    layer(x).pow(2).sum().backward()
    expected = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    with LiveGraphMemory():
        loss = layer(x).pow(2).sum()
    loss.backward()
    for p, grad in zip(layer.parameters(), expected):
        torch.testing.assert_close(p.grad, grad)


def test_live_graph_memory_blocks_cannot_nest():
    memory = LiveGraphMemory()
    with memory, pytest.raises(RuntimeError, match="cannot nest"), memory:
        pass


def test_a_press_answers_within_50_ms():
    sim = TrainVsEval(seed=0)
    sim.press()
    timings = []
    for _ in range(15):
        start = time.perf_counter()
        sim.press()
        timings.append(time.perf_counter() - start)
    assert sorted(timings)[len(timings) // 2] < 0.05


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="at least 2"):
        TrainVsEval(batch=1)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        TrainVsEval(p=1.0)


def test_the_drawing_has_two_rows_of_panels_and_a_memory_bar():
    import matplotlib.figure
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from forge_course.sims.outlines import outline
    from forge_course.sims.train_vs_eval import _NUMBER_SIZE, _TEXT_SIZE, PressesPicture

    sim = TrainVsEval(seed=0)
    presses = [sim.press(), sim.press(), sim.press(keep=True)]
    assert len(draw_presses(presses).axes) == 2 * 4 + 1
    fig = matplotlib.figure.Figure()
    FigureCanvasAgg(fig)
    picture = PressesPicture.for_presses(fig, presses)
    picture.update(presses)
    texts = [t.get_text() for t in fig.findobj(Text) if t.get_text()]
    assert sum(t.startswith("TRAIN mode") for t in texts) == 2
    assert [t for t in texts if "press " in t][:2] == ["press 2 · grad on", "press 3 · grad on"]
    assert f" {presses[-1].held_bytes:,} bytes · 2 outputs kept" in texts
    # The numbers a press changes are outlines: the last row's train-mode ones, and outputs.
    train, last = picture.sides[-1][0], presses[-1].train
    numbers = [f"{sum(map(sum, last.dropped))} of 32", f"{last.mean_used[0]:+.3f}",
               f"{last.running_mean[0]:+.3f}"]  # fmt: skip
    expected = [outline(n, _TEXT_SIZE, *at) for n, at in zip(numbers, train.number_places)]
    expected += [
        outline(f"{v:.2f}", _NUMBER_SIZE, ha="center", va="center")
        for row in last.outputs
        for v in row
    ]
    shown = train.numbers.get_paths() + train.values.get_paths()
    assert all(np.array_equal(a.vertices, b.vertices) for a, b in zip(shown, expected, strict=True))


def test_the_view_opens_on_two_presses_and_its_buttons_answer(monkeypatch):
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from forge_course.sims import train_vs_eval

    shown = {}
    monkeypatch.setattr(train_vs_eval, "show", lambda widget, fig: shown.update(w=widget, f=fig))
    train_vs_eval.train_vs_eval_view(seed=0)
    forward, reset, p_slider = shown["w"].children[0].children
    assert [forward.description, reset.description, p_slider.description] == [
        "forward", "reset", "dropout p",
    ]  # fmt: skip
    assert "press 2 · grad on" in [t.get_text() for t in shown["f"].findobj(Text)]
    plt.close(shown["f"])
    forward.click()
    reset.click()


def test_a_picture_updated_press_after_press_equals_one_drawn_fresh():
    import numpy as np

    from forge_course.sims.display import LiveFigure
    from forge_course.sims.train_vs_eval import PressesPicture, _figsize

    sim = TrainVsEval(seed=0)
    presses = [sim.press(), sim.press()]
    live = LiveFigure(_figsize(2))
    picture = PressesPicture.for_presses(live.fig, presses)
    live.moving(picture.moving_artists)  # as the view does: only what a press changes redrawn
    picture.update(presses)
    live.pixels()
    # Held bytes grow past the memory axis' first limit, so its background is redrawn once.
    for p, no_grad, keep in ((0.9, False, True), (0.0, True, False), (0.3, False, True)):
        sim.p = p
        presses.append(sim.press(no_grad=no_grad, keep=keep))
        picture.update(presses)
        live.pixels()
    fresh = LiveFigure(_figsize(2))
    PressesPicture.for_presses(fresh.fig, presses).update(presses)
    assert np.array_equal(live.pixels(), fresh.pixels())
