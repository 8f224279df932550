"""The tape recorder's engine, headless: graphs, gradients by hand, accumulation, layout, speed."""

import time

import matplotlib
import pytest
import torch

from forge_course.sims.tape import EXPRESSIONS, TapeRecorder, draw_tape, layers

matplotlib.use("Agg")


def kinds(state):
    return [node.kind for node in state.nodes]


def test_running_example_graph_and_gradients_match_the_hand_calculation():
    # L = (w·x + x)² at x = 2, w = 3: y = 6, z = 8, L = 64; dL/dz = 2z = 16, dL/dy = 16,
    # dL/dw = 16·x = 32, dL/dx = 16·w + 16 = 64 (two paths into x).
    tape = TapeRecorder("running example", x=2.0, w=3.0)
    state = tape.backward()
    assert kinds(state) == [
        "PowBackward0", "AddBackward0", "MulBackward0", "AccumulateGrad", "AccumulateGrad",
    ]  # fmt: skip
    by_label = {node.label: node for node in state.nodes}
    assert {k: by_label[k].value for k in ("L", "z", "y", "leaf x", "leaf w")} == {
        "L": 64.0, "z": 8.0, "y": 6.0, "leaf x": 2.0, "leaf w": 3.0,
    }  # fmt: skip
    assert {k: by_label[k].grad for k in ("L", "z", "y", "leaf x", "leaf w")} == {
        "L": 1.0, "z": 16.0, "y": 16.0, "leaf x": 64.0, "leaf w": 32.0,
    }  # fmt: skip
    assert by_label["leaf x"].total == 64.0 and by_label["leaf w"].total == 32.0


def test_backward_twice_adds_and_zero_grad_clears():
    tape = TapeRecorder("running example", x=2.0, w=3.0)
    assert tape.state().calls == 0
    assert all(node.grad is None and node.total is None for node in tape.state().nodes)
    tape.backward()
    state = tape.backward()
    assert state.calls == 2
    assert state.history == {"x": [64.0, 128.0], "w": [32.0, 64.0]}
    leaves = {n.label: n for n in state.nodes if n.kind == "AccumulateGrad"}
    # Each call adds the same gradient; the leaf's .grad is the running sum.
    assert (leaves["leaf x"].grad, leaves["leaf x"].total) == (64.0, 128.0)
    assert "2 backward calls" in state.caption and "64 → 128" in state.caption
    state = tape.zero_grad()
    assert state.calls == 0 and state.history == {"x": [], "w": []}
    assert all(n.total is None for n in state.nodes)
    assert tape.backward().history == {"x": [64.0], "w": [32.0]}


def test_changing_an_input_starts_afresh():
    tape = TapeRecorder("running example", x=2.0, w=3.0)
    tape.backward()
    state = tape.record("running example", x=1.0, w=3.0)
    assert state.calls == 0
    # At x = 1: z = 4, dL/dz = 8, dL/dx = 8·(w + 1) = 32, dL/dw = 8·x = 8.
    assert tape.backward().history == {"x": [32.0], "w": [8.0]}


@pytest.mark.parametrize(
    "x,expected",
    [(1.5, ["MulBackward0", "AccumulateGrad", "PowBackward0", "AccumulateGrad"]),
     (-1.0, ["SubBackward0", "AccumulateGrad", "AccumulateGrad"])],
)  # fmt: skip
def test_the_branch_taken_decides_the_graph(x, expected):
    assert kinds(TapeRecorder("branch", x=x, w=2.0).state()) == expected


@pytest.mark.parametrize("n", [1, 2, 5])
def test_the_loop_records_one_product_per_pass(n):
    tape = TapeRecorder("loop", x=1.5, w=-2.0, n=n)
    state = tape.backward()
    assert kinds(state).count("MulBackward0") == n
    # L = x·wⁿ: dL/dx = wⁿ, dL/dw = n·x·wⁿ⁻¹.
    assert state.history["x"] == [pytest.approx((-2.0) ** n)]
    assert state.history["w"] == [pytest.approx(n * 1.5 * (-2.0) ** (n - 1))]


def test_detach_lets_gradient_through_one_factor_only():
    # L = y·y.detach() with y = w·x = 6: dL/dy = 6 (not 2y = 12), so dL/dw = 6·2, dL/dx = 6·3.
    assert TapeRecorder("detach", x=2.0, w=3.0).backward().history == {"x": [18.0], "w": [12.0]}


def test_every_expression_agrees_with_autograd_and_torch_func():
    for name, expression in EXPRESSIONS.items():
        for x, w in [(2.0, 3.0), (-1.5, 0.5)]:
            history = TapeRecorder(name, x=x, w=w, n=3).backward().history
            leaves = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, w)]
            grads = torch.autograd.grad(expression.build(*leaves, 3)["L"], leaves)
            assert history == {"x": [grads[0].item()], "w": [grads[1].item()]}, name


def test_layers_put_every_input_below_the_node_that_uses_it():
    # 0 → 1 → 2 and 0 → 2: node 2 sits below node 1, not beside it.
    assert layers([[1, 2], [2], []]) == [0, 1, 2]
    for name in EXPRESSIONS:
        state = TapeRecorder(name, x=1.0, w=2.0, n=4).state()
        for node in state.nodes:
            for target in node.inputs:
                assert state.nodes[target].position[1] < node.position[1], name


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="unknown expression"):
        TapeRecorder("nope")
    with pytest.raises(ValueError, match="at least 1"):
        TapeRecorder("loop", n=0)


def test_a_light_interaction_answers_in_under_50_ms():
    tape = TapeRecorder()
    tape.backward()  # warm-up
    start = time.perf_counter()
    for _ in range(20):
        tape.record("loop", x=1.0, w=2.0, n=5)
        tape.backward()
    assert (time.perf_counter() - start) / 20 < 0.05


def test_draw_tape_labels_every_node():
    state = TapeRecorder().backward()
    fig = draw_tape(state)
    texts = [t.get_text() for t in fig.axes[0].texts if t.get_text()]  # arrows have no text
    assert [t.split("\n")[0] for t in texts] == [node.kind for node in state.nodes]
    assert "x = 2\n+64  →  .grad 64" in texts[3]
    assert "after 1 backward call" in fig.axes[0].get_title()


def test_a_figure_redrawn_along_the_controls_equals_one_drawn_fresh():
    import numpy as np

    from forge_course.sims.display import LiveFigure
    from forge_course.sims.tape import TapePicture, figsize

    live = LiveFigure((6.4, 1.6))
    picture = TapePicture(live.fig.subplots())
    live.moving(picture.moving_artists)  # as the view: the tape's artists drawn per event

    def drawn(state):
        live.fig.set_size_inches(figsize(state))  # as the view does
        picture.update(state)
        live.pixels()

    tape = TapeRecorder("running example", 2.0, 3.0)
    # Through every expression, and between two graphs of one shape and limits ("loop" with
    # n = 2 and "detach"), and both of "branch"'s graphs.
    runs = [*((e, -1.5, 3) for e in EXPRESSIONS), ("loop", 1.0, 2), ("detach", 1.0, 3),
            ("branch", 1.5, 3), ("branch", -1.0, 3)]  # fmt: skip
    for expression, x, n in runs:
        drawn(tape.record(expression, x, 2.0, n))
        drawn(tape.backward())
    fresh = LiveFigure((6.4, 1.6))
    draw_tape(TapeRecorder("branch", -1.0, 2.0).backward(), fresh.fig.subplots())
    fresh.fig.set_size_inches(figsize(TapeRecorder("branch", -1.0, 2.0).state()))
    assert np.array_equal(live.pixels(), fresh.pixels())
