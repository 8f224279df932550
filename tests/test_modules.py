"""Tests for forge_course.reference.modules, against torch's own machinery, on every device."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch
import torch.fx
from torch import nn
from torch.utils import _pytree as pytree

from forge_course.device import available_devices, tolerance
from forge_course.reference.guard import ReferenceCalled, learner_code
from forge_course.reference.modules import MLP, decay_groups, record_activations, to_device

DEVICES = pytest.mark.parametrize("device", available_devices(), ids=str)


def _seeded_mlp(sizes, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MLP(sizes)


# ---------------------------------------------------------------- MLP


def test_every_layer_is_registered_with_checkpoint_names():
    model = _seeded_mlp([4, 8, 8, 3])
    assert list(model.state_dict()) == [
        "hidden.0.weight", "hidden.0.bias", "hidden.1.weight", "hidden.1.bias",
        "head.weight", "head.bias",
    ]  # fmt: skip
    # 4·8 + 8, 8·8 + 8, 8·3 + 3: the chapter's hand count.
    assert sum(p.numel() for p in model.parameters()) == 40 + 72 + 27 == 139


@DEVICES
@pytest.mark.parametrize("sizes", [[4, 8, 8, 3], [3, 5], [6, 16, 16, 16, 2]], ids=str)
def test_forward_equals_torch_sequential_with_the_same_weights(device, sizes):
    model = _seeded_mlp(sizes).to(device)
    layers = []
    for layer in [*model.hidden, model.head]:
        layers += [layer, nn.ReLU()]
    sequential = nn.Sequential(*layers[:-1])  # no ReLU after the head
    x = torch.randn(5, sizes[0], device=device)
    torch.testing.assert_close(model(x), sequential(x), **tolerance(torch.float32, device))


def test_to_moves_every_layer_and_a_step_updates_every_parameter():
    model = _seeded_mlp([4, 8, 8, 3])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).pow(2).mean().backward()
    optimizer.step()
    assert all(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    model.to("meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model(torch.empty(2, 4, device="meta")).shape == (2, 3)


def test_needs_two_sizes():
    with pytest.raises(ValueError, match="input and an output size"):
        MLP([4])


# ---------------------------------------------------------------- record_activations


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.act = nn.ReLU(inplace=True)
        self.shared = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.act(self.embed(x))
        h = h + self.shared(h)
        return self.head(self.shared(h))


class _Recorder(torch.fx.Interpreter):
    """torch.fx replays the traced graph node by node: an independent view of every output."""

    def __init__(self, module):
        super().__init__(torch.fx.symbolic_trace(module))
        self.outputs = {}

    def run_node(self, node):
        result = super().run_node(node)
        if node.op == "call_module":
            self.outputs[node.target] = result.detach().clone()  # the last call wins
        return result


@DEVICES
def test_recorded_outputs_equal_a_torch_fx_replay(device):
    torch.manual_seed(0)
    model = Residual().to(device)
    x = torch.randn(5, 4, device=device)
    replay = _Recorder(model)
    expected_output = replay.run(x)
    got = record_activations(model, x, ["embed", "act", "shared", "head", ""])
    assert set(got) == {"embed", "act", "shared", "head", ""}
    for name, value in replay.outputs.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0)
    torch.testing.assert_close(got[""], expected_output.detach(), rtol=0, atol=0)
    assert not any(v.requires_grad for v in got.values())


def test_an_in_place_relu_does_not_overwrite_what_was_recorded():
    torch.manual_seed(0)
    model = Residual()
    got = record_activations(model, torch.randn(8, 4), ["embed"])
    assert (got["embed"] < 0).any()  # recorded before the in-place ReLU clipped it


def test_hooks_are_removed_even_when_the_forward_pass_raises_and_others_are_kept():
    model = Residual()
    theirs = model.head.register_forward_hook(lambda *args: None)
    record_activations(model, torch.randn(2, 4), ["embed", "head", ""])
    with pytest.raises(RuntimeError):
        record_activations(model, torch.randn(2, 5), ["embed", "head"])
    with pytest.raises(AttributeError):
        record_activations(model, torch.randn(2, 4), ["embed", "no_such_layer"])
    hooks = {name: len(m._forward_hooks) for name, m in model.named_modules()}
    assert hooks == {"": 0, "embed": 0, "act": 0, "shared": 0, "head": 1}
    theirs.remove()


# ---------------------------------------------------------------- to_device

Pair = namedtuple("Pair", ["inputs", "targets"])


def _batch():
    return {
        "x": torch.randn(4, 3),
        "pair": Pair(torch.ones(2), [torch.zeros(1), "id-7"]),
        "nested": ({"mask": torch.ones(4, dtype=torch.bool)}, None, 3, np.arange(2)),
        "text": "hello",
        "empty": [[], (), {}],
    }


def _torch_tree_map(batch, device):
    """torch's own traversal of nested containers (what torch.compile and FSDP use)."""
    return pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, batch)


def _summary(value):
    """The structure with each tensor replaced by its device, dtype and shape."""
    return pytree.tree_map(
        lambda v: (str(v.device), v.dtype, tuple(v.shape)) if isinstance(v, torch.Tensor) else v,
        value,
    )


@pytest.mark.parametrize("device", ["meta", *map(str, available_devices())])
def test_to_device_agrees_with_torch_pytree(device):
    got, want = to_device(_batch(), device), _torch_tree_map(_batch(), device)
    assert pytree.tree_structure(got) == pytree.tree_structure(want)
    assert repr(_summary(got)) == repr(_summary(want))
    assert isinstance(got["pair"], Pair) and isinstance(got["nested"], tuple)


def test_to_device_leaves_the_batch_it_was_given_unchanged():
    batch = _batch()
    moved = to_device(batch, "meta")
    assert batch["x"].device.type == "cpu" and moved["x"].device.type == "meta"
    assert moved["text"] is batch["text"]


def test_a_tensor_already_there_is_returned_as_is():
    x = torch.ones(3)
    assert to_device(x, "cpu") is x


def test_learner_code_may_not_call_the_references():
    with learner_code():
        with pytest.raises(ReferenceCalled):
            to_device(torch.ones(1), "cpu")
        with pytest.raises(ReferenceCalled):
            MLP([2, 1])
        with pytest.raises(ReferenceCalled):
            record_activations(nn.Linear(2, 1), torch.ones(1, 2), [""])
        with pytest.raises(ReferenceCalled):
            decay_groups(nn.Linear(2, 1), 0.1)


# ---------------------------------------------------------------- decay_groups


def _normed():
    """Linear, BatchNorm, ReLU, Linear, LayerNorm: weights, biases and norms of two kinds."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3), nn.LayerNorm(3)
        )


def _names(model, params):
    by_id = {id(p): name for name, p in model.named_parameters()}
    return [by_id[id(p)] for p in params]


def test_weights_decay_and_biases_and_norms_do_not():
    model = _normed()
    decay, no_decay = decay_groups(model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert _names(model, decay["params"]) == ["0.weight", "3.weight"]
    assert _names(model, no_decay["params"]) == [
        "0.bias", "1.weight", "1.bias", "3.bias", "4.weight", "4.bias",
    ]  # fmt: skip
    # 4·8 + 8·3 = 56 values decay; 8 + 8 + 8 + 3 + 3 + 3 = 33 do not.
    assert sum(p.numel() for p in decay["params"]) == 56
    assert sum(p.numel() for p in no_decay["params"]) == 33


def test_frozen_parameters_are_left_out_and_tied_ones_listed_once():
    model = _normed()
    model[0].requires_grad_(False)
    decay, no_decay = decay_groups(model, 0.1)
    assert _names(model, decay["params"]) == ["3.weight"]
    assert "0.bias" not in _names(model, no_decay["params"])

    tied = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight
    decay, no_decay = decay_groups(tied, 0.1)
    assert len(decay["params"]) == 1 and decay["params"][0] is tied[0].weight
    assert no_decay["params"] == []
    torch.optim.AdamW(decay_groups(tied, 0.1))  # torch refuses a parameter listed twice


def test_adamw_over_the_groups_equals_two_optimizers_and_the_hand_formula():
    lr, wd, eps = 0.01, 0.5, 1e-8
    models = [_normed() for _ in range(3)]
    grouped = torch.optim.AdamW(decay_groups(models[0], wd), lr=lr, eps=eps)
    decay, no_decay = decay_groups(models[1], wd)
    split = [
        torch.optim.AdamW(decay["params"], lr=lr, weight_decay=wd, eps=eps),
        torch.optim.AdamW(no_decay["params"], lr=lr, weight_decay=0.0, eps=eps),
    ]
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    start = [p.detach().clone() for p in models[2].parameters()]
    for model, optimizers in ((models[0], [grouped]), (models[1], split)):
        model(x).pow(2).mean().backward()
        for optimizer in optimizers:
            optimizer.step()
    models[2](x).pow(2).mean().backward()
    for (name, a), b, p0, p in zip(
        models[0].named_parameters(), models[1].parameters(), start, models[2].parameters()
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        # AdamW's first step: m̂ = g and v̂ = g², so p ← p·(1 − lr·wd) − lr·g / (|g| + eps).
        decays = name in ("0.weight", "3.weight")
        g = p.grad
        hand = p0 * (1 - lr * (wd if decays else 0.0)) - lr * g / (g.abs() + eps)
        torch.testing.assert_close(a.detach(), hand)
