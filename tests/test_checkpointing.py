"""The segmented checkpointed forward agrees with the plain forward and keeps fewer bytes."""

import numpy as np
import pytest
import torch
from torch.utils.checkpoint import checkpoint_sequential

from forge_course.reference.checkpointing import checkpointed_forward, segment_sizes
from forge_course.reference.memory import saved_activation_bytes


def _blocks(n, width=8, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.nn.ModuleList(
        torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        ).to(dtype)
        for _ in range(n)
    )


def _outputs_and_grads(forward, layers, x):
    x = x.clone().requires_grad_()
    out = forward(layers, x)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in layers.parameters()]
    layers.zero_grad()
    return out.detach(), x.grad, grads


def _plain(layers, x):
    for layer in layers:
        x = layer(x)
    return x


@pytest.mark.parametrize("n,segments", [(5, 1), (5, 2), (5, 3), (5, 5), (6, 4)])
def test_same_outputs_and_gradients_as_the_plain_forward(n, segments):
    layers = _blocks(n)
    x = torch.randn(3, 8, dtype=torch.float64)
    want = _outputs_and_grads(_plain, layers, x)
    got = _outputs_and_grads(lambda mods, h: checkpointed_forward(mods, h, segments), layers, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_agrees_with_torch_checkpoint_sequential():
    layers = _blocks(6)
    x = torch.randn(3, 8, dtype=torch.float64)
    ours = _outputs_and_grads(lambda mods, h: checkpointed_forward(mods, h, 3), layers, x)
    torch_s = _outputs_and_grads(
        lambda mods, h: checkpoint_sequential(
            torch.nn.Sequential(*mods), 3, h, use_reentrant=False
        ),
        layers,
        x,
    )
    torch.testing.assert_close(ours, torch_s, rtol=0, atol=0)


def test_keeps_one_input_per_segment():
    layers = _blocks(16, width=8, dtype=torch.float32)
    x = torch.randn(4, 8)
    plain = saved_activation_bytes(_plain, layers, x)
    assert plain == 16 * 9 * 4 * 8 * 4  # per block: input (8), GELU input (32), its output (32)
    for k in (1, 2, 4, 16):
        assert saved_activation_bytes(checkpointed_forward, layers, x, k) == k * 4 * 8 * 4
    # torch's own sequential helper leaves the last segment plain, so it keeps more.
    seq = torch.nn.Sequential(*layers)
    assert saved_activation_bytes(checkpoint_sequential, seq, 4, x, use_reentrant=False) > 4 * 128


def test_parameters_get_gradients_when_the_input_does_not_require_grad():
    layers = _blocks(4)
    checkpointed_forward(layers, torch.randn(2, 8, dtype=torch.float64), 2).sum().backward()
    assert all(p.grad is not None for p in layers.parameters())


@pytest.mark.parametrize("n,k", [(1, 1), (5, 2), (7, 3), (16, 4), (16, 16), (10, 4)])
def test_segment_sizes_split_like_numpy(n, k):
    assert segment_sizes(n, k) == [len(a) for a in np.array_split(range(n), k)]


@pytest.mark.parametrize("k", [0, 6, 2.0, True])
def test_segment_sizes_reject_impossible_counts(k):
    with pytest.raises(ValueError):
        segment_sizes(5, k)
