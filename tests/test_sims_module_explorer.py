"""The module explorer's engine, headless: what it finds must agree with torch's own walk."""

import matplotlib
import pytest
import torch
from torch import nn

from forge_course.sims import module_explorer as mx

matplotlib.use("Agg")

PRESETS = [(model, container) for model in mx.MODELS for container in mx.CONTAINERS]


@pytest.mark.parametrize("model,container", PRESETS)
def test_registered_rows_are_exactly_what_named_modules_walks(model, container):
    net = mx.build(model, container)
    rows = mx.explore(net)
    assert [r.path for r in rows if r.registered] == [name for name, _ in net.named_modules()]
    visible = sum(r.values for r in rows if r.registered)
    assert visible == sum(p.numel() for p in net.parameters())


def test_a_plain_list_hides_the_hidden_layers_from_parameters_and_to():
    plain = mx.explore_preset("MLP", "plain list", moved_to="meta")
    assert (plain.optimizer_sees, plain.total, plain.state_dict_entries) == (27, 139, 2)
    hidden = [r for r in plain.rows if not r.registered]
    assert [r.path for r in hidden] == ["hidden[0]", "hidden[1]"]
    assert all(r.devices == ("cpu",) for r in hidden)  # .to() never reached them
    assert [r.devices for r in plain.rows if r.path == "head"] == [("meta",)]
    assert plain.devices == ("cpu", "meta")


def test_the_module_list_repair_registers_and_moves_everything():
    fixed = mx.explore_preset("MLP", "nn.ModuleList", moved_to="meta")
    assert (fixed.optimizer_sees, fixed.total, fixed.state_dict_entries) == (139, 139, 6)
    assert all(r.registered for r in fixed.rows)
    assert fixed.devices == ("meta",)
    assert [r.path for r in fixed.rows] == ["", "hidden", "hidden.0", "hidden.1", "head"]


def test_batchnorm_buffers_are_listed_and_counted_in_the_state_dict_only():
    bn = mx.explore_preset("MLP with BatchNorm", "nn.ModuleList")
    norm = next(r for r in bn.rows if r.path == "hidden.0.1")
    assert norm.kind == "BatchNorm1d"
    assert norm.buffers == ("running_mean [8]", "running_var [8]", "num_batches_tracked []")
    assert norm.parameters == ("weight [8]", "bias [8]")
    # 139 + two BatchNorms with 8 weights and 8 biases each; their buffers are not parameters.
    assert bn.optimizer_sees == bn.total == 139 + 2 * 16
    # 6 Linear tensors + per BatchNorm 2 parameters and 3 buffers.
    assert bn.state_dict_entries == 6 + 2 * 5


HOOKED = [("plain list", "hidden[1]"), ("nn.ModuleList", "hidden.1")]


@pytest.mark.parametrize("container,path", HOOKED)
def test_the_hook_lives_on_the_layer_object_registered_or_not(container, path):
    rows = mx.explore_preset("MLP with a forward hook", container).rows
    assert {r.path: r.hooks for r in rows if r.hooks} == {path: 1}


def test_plain_dicts_and_non_persistent_buffers_are_shown():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = {"a": nn.Linear(2, 2)}
            self.register_buffer("mean", torch.zeros(2))
            self.register_buffer("scratch", torch.zeros(3), persistent=False)

    rows = mx.explore(Odd())
    assert rows[0].buffers == ("mean [2]", "scratch [3] (not saved)")
    assert [(r.path, r.registered) for r in rows[1:]] == [("experts['a']", False)]


def test_build_rejects_an_unknown_container():
    with pytest.raises(ValueError, match="container must be one of"):
        mx.build("MLP", "tuple")


def test_draw_marks_unregistered_rows_and_left_behind_devices():
    exploration = mx.explore_preset("MLP", "plain list", moved_to="meta")
    fig = mx.draw(exploration, target="meta")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("✗ hidden[0]" in t for t in texts)
    assert "27 of 139 values" in fig.axes[0].get_title(loc="left")
    left_behind = [t for t in fig.axes[0].texts if t.get_text() == "cpu"]
    assert len(left_behind) == 2 and all(t.get_fontweight() == "bold" for t in left_behind)


def test_a_figure_redrawn_along_the_choices_equals_one_drawn_fresh():
    import numpy as np

    from forge_course.sims.display import LiveFigure

    def live_table():  # as the view builds its figure
        live = LiveFigure((11, 1.4))
        return live, mx.TablePicture(live.fig.subplots())

    def drawn(live_and_table, model, container, moved_to):
        live, table = live_and_table
        exploration = mx.explore_preset(model, container, moved_to=moved_to)
        mx.fit_figure(live.fig, exploration)
        table.update(exploration, target=moved_to)
        return live.pixels()

    live = live_table()
    for (model, container), moved_to in zip(PRESETS, ["meta", None, "meta", None, "meta"]):
        drawn(live, model, container, moved_to)
    redrawn = drawn(live, model, container, moved_to)
    assert np.array_equal(redrawn, drawn(live_table(), model, container, moved_to))
