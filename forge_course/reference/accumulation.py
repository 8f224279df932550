"""Gradient accumulation: one optimizer update from several micro-batches, equal to one big batch.

Activation memory grows with the batch, so a batch that does not fit is split into micro-batches:
run forward and backward on each in turn, let ``.grad`` add up (``backward`` adds, it never
replaces), then make one optimizer update. Only one micro-batch's activations are alive at a time.

Why each micro-batch's loss is weighted by ``n_i / N``
    The big batch's loss is the mean over its ``N`` examples. Split into micro-batches of sizes
    ``n_1 … n_K`` with means ``L_1 … L_K``, that mean is ``Σ_i (n_i / N)·L_i``, and gradients are
    linear, so backpropagating ``(n_i / N)·L_i`` for each micro-batch adds up to exactly the
    big batch's gradient. The familiar ``loss / K`` is the special case of equal sizes. With
    uneven sizes (the last batch of a ``DataLoader`` is usually short) ``1 / K`` gives every
    example of a short micro-batch more say than the others: with sizes ``[32, 32, 32, 4]`` each
    of the last 4 examples gets 1/16 of the loss and each of the other 96 gets 1/128, where
    all 100 should get 1/100.

Why ``if (i + 1) % K == 0: optimizer.step()`` leaks
    If an epoch has ``I`` micro-batches and ``K`` does not divide ``I``, the last ``I mod K``
    backward passes fill ``.grad`` and no update follows. The next epoch's first update then
    adds those stale gradients to its own ``K`` micro-batches (and after the last epoch they are
    simply lost). The epoch also makes ``I // K`` updates instead of ``ceil(I / K)``. The loop
    here groups micro-batches and makes one update per group, the last, shorter group included.

Two more rules of the correct loop:

- Clip the accumulated gradient once, just before the update: clipping each micro-batch's share
  would clip pieces of a gradient, not the gradient.
- A learning-rate scheduler that counts steps counts optimizer updates, not micro-batches.

The equivalence is exact for models without batch statistics. ``BatchNorm`` normalises each
micro-batch with that micro-batch's own mean and variance, so there accumulation only
approximates the big batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

from forge_course.reference.guard import reference

__all__ = ["accumulate_step", "train_epoch_accumulated"]

Batch = tuple[torch.Tensor, torch.Tensor]


def _positive_int(name: str, value: object) -> int:
    # bool is a subclass of int, but `accum_steps=True` is a mistake, not one step.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a whole number of at least 1, got {value!r}.")
    return value


@reference
def accumulate_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: torch.nn.Module,
    micro_batches: Sequence[Batch],
    max_grad_norm: float | None = None,
) -> float:
    """One optimizer update from several micro-batches, equal to one step on all of them at once.

    Args:
        model: the network; its parameters are on the same device as the batches.
        optimizer: the optimizer over ``model``'s parameters.
        loss_fn: returns the *mean* loss over a batch (the default ``reduction="mean"``).
        micro_batches: ``(x, y)`` pairs, sizes ``n_1 … n_K`` along dimension 0, possibly uneven.
        max_grad_norm: if given, the accumulated gradient's total 2-norm is clipped to it.

    Returns:
        The mean loss over all ``N = Σ n_i`` examples (each micro-batch weighted by ``n_i / N``),
        as a Python float, measured with the parameters before the update.

    Raises:
        ValueError: if ``micro_batches`` is empty.
    """
    if len(micro_batches) == 0:
        raise ValueError("`micro_batches` is empty: an update needs at least one (x, y) pair.")
    total = sum(len(x) for x, _ in micro_batches)

    # Whatever an earlier step left in .grad would be added to this update's gradient.
    optimizer.zero_grad()
    loss_sum = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model(x), y)
        (loss * (len(x) / total)).backward()
        # Sum detached values: the total is only reported, so autograd need not record the sum.
        loss_sum = loss_sum + loss.detach() * len(x)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    # Leave nothing behind for the next update, or for whoever looks at .grad after us.
    optimizer.zero_grad()
    return float(loss_sum) / total


def _groups(batches: Iterable[Batch], size: int) -> Iterator[list[Batch]]:
    """Consecutive groups of ``size`` batches; the last group holds whatever is left."""
    group: list[Batch] = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    # The tail: fewer than `size` micro-batches, but still real examples that deserve an update.
    if group:
        yield group


@reference
def train_epoch_accumulated(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: torch.nn.Module,
    loader: Iterable[Batch],
    accum_steps: int,
    max_grad_norm: float | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> dict[str, int | float]:
    """One epoch with gradient accumulation: one update per ``accum_steps`` micro-batches.

    The loop collects ``accum_steps`` micro-batches from ``loader`` and hands them to
    `accumulate_step`. Holding a group's *inputs* costs little; its activations are still
    created and freed one micro-batch at a time. The last group may be shorter and gets its own
    update, so an epoch of ``I`` micro-batches makes ``ceil(I / accum_steps)`` updates and ends
    with every ``.grad`` cleared.

    Args:
        model: the network; batches are moved to the device of its first parameter.
        optimizer: the optimizer over ``model``'s parameters.
        loss_fn: returns the mean loss over a batch.
        loader: yields ``(x, y)`` micro-batches, for example a ``DataLoader``.
        accum_steps: ``K``, micro-batches per optimizer update.
        max_grad_norm: if given, each update's accumulated gradient is clipped to this 2-norm.
        scheduler: a per-update scheduler (``OneCycleLR``, say); stepped once after each update.

    Returns:
        ``updates`` (optimizer updates made), ``samples`` (examples seen) and ``mean_loss``: the
        epoch's loss averaged over examples, not over micro-batches, so a short last batch
        counts for what it holds.

    Raises:
        ValueError: if ``accum_steps`` is not a whole number of at least 1, or the loader is empty.
    """
    k = _positive_int("accum_steps", accum_steps)
    device = next(model.parameters()).device
    model.train()
    updates, samples, loss_sum = 0, 0, 0.0
    for group in _groups(loader, k):
        group = [(x.to(device), y.to(device)) for x, y in group]
        n = sum(len(x) for x, _ in group)
        loss_sum += accumulate_step(model, optimizer, loss_fn, group, max_grad_norm) * n
        samples += n
        updates += 1
        if scheduler is not None:
            scheduler.step()
    if samples == 0:
        raise ValueError("`loader` yielded no batches: there is nothing to train on.")
    return {"updates": updates, "samples": samples, "mean_loss": loss_sum / samples}
