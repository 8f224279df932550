"""Gradient checkpointing: keep a few activations, recompute the rest during backward.

A plain forward pass keeps every tensor that backward will need (see `saved_activation_bytes`):
for a stack of ``N`` blocks, memory grows with ``N``. Checkpointing cuts the stack into
*segments* and, inside each one, keeps nothing but the segment's input. When backward reaches a
segment, it runs that segment's forward again, this time keeping its activations, and
backpropagates through it at once. Memory held between forward and backward drops to one
input per segment; the price is a second forward pass through every checkpointed segment.

How many segments
    With ``k`` segments, the forward pass keeps ``k`` segment inputs, and backward briefly
    holds one recomputed segment (``N / k`` blocks' activations) on top of them. Few segments
    make that recomputed segment large; many segments keep many inputs. When a block's
    activations are about the size of its input, ``k = √N`` balances the two and memory grows
    like ``√N`` instead of ``N``. The extra compute is about one more forward pass, wherever the
    boundaries are, because every checkpointed block runs forward twice.

Why ``use_reentrant=False``
    The older, "reentrant" implementation only gives parameters a gradient when some *input* of
    the segment requires grad: an ordinary input batch does not, and the layers then silently
    get no gradient. It also ignores ``torch.autograd.grad`` and keyword arguments. The
    non-reentrant implementation has none of these limits, and torch asks every caller to choose
    ``use_reentrant`` explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from forge_course.reference.guard import reference

__all__ = ["segment_sizes", "checkpointed_forward"]


def segment_sizes(n_layers: int, segments: int) -> list[int]:
    """How many consecutive layers each segment gets: sizes differ by at most one, longer first.

    The same split as ``numpy.array_split``: 5 layers in 2 segments are ``[3, 2]``.

    Raises:
        ValueError: unless ``1 <= segments <= n_layers``.
    """
    if isinstance(segments, bool) or not isinstance(segments, int):
        raise ValueError(f"`segments` must be a whole number, got {segments!r}.")
    if not 1 <= segments <= n_layers:
        raise ValueError(
            f"`segments` must be between 1 and {n_layers} (the layers), got {segments}."
        )
    base, extra = divmod(n_layers, segments)
    return [base + 1] * extra + [base] * (segments - extra)


def _run(layers: Sequence[Callable]) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(h: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            h = layer(h)
        return h

    return run


@reference
def checkpointed_forward(
    layers: Sequence[Callable], x: torch.Tensor, segments: int
) -> torch.Tensor:
    """Run ``layers`` one after another on ``x``, checkpointing each of ``segments`` segments.

    Args:
        layers: the blocks in order (a list, an ``nn.ModuleList`` or an ``nn.Sequential``).
        x: the input batch.
        segments: how many consecutive groups to cut ``layers`` into (`segment_sizes`); every
            group, the last one too, keeps only its input for backward.

    Returns:
        The same tensor as running the layers plainly, with the same gradients in backward.
    """
    layers = list(layers)
    start = 0
    for size in segment_sizes(len(layers), segments):
        segment = layers[start : start + size]
        start += size
        x = checkpoint(_run(segment), x, use_reentrant=False)
    return x
