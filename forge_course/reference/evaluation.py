"""Measuring a model without changing it: the evaluation loop and a prediction helper.

Evaluation looks like training without ``backward`` and ``step``, and three details make it
right or quietly wrong:

1. **Eval mode.** ``model.eval()`` switches dropout off and makes batch norm use its running
   statistics; otherwise every evaluation measures a different random sub-network. Afterwards
   each module gets back its own previous mode, not ``model.train()``: a training loop that
   calls ``evaluate`` goes on in train mode, a served model stays in eval mode, and a batch
   norm frozen in eval mode while the rest trains stays frozen. This is the course's one rule
   for evaluation helpers (chapter 06); chapters 07 and 12 follow it.
2. **No graph.** Under ``torch.no_grad()`` autograd records nothing, so the activations that
   ``backward`` would need are not stored. ``torch.inference_mode()`` goes a step further: its
   tensors can never join a graph later, which lets PyTorch skip some bookkeeping.
3. **The whole set's mean.** The mean loss is what ``loss_fn`` would give on every example at
   once, as one batch. With ``reduction="mean"`` a batch's loss is its sum divided by what the
   loss counts in it, and averaging those means over-weights a short last batch (10 examples in
   batches of 4 give means over 4, 4 and 2). So add up each batch's ``reduction="sum"`` loss
   and what the loss divides by, and divide once at the end. What it divides by: for
   ``CrossEntropyLoss`` (and ``NLLLoss``) the total class weight ``weight[t]`` of the targets
   ``t`` that are not ``ignore_index`` (their number, without ``weight``); for every other loss
   the number of targets. When every example counts once, that is the batch size, and the sum
   is the batch mean times the batch size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch

from forge_course.reference.guard import reference

__all__ = ["counted", "evaluate", "predict"]


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    # A model can mix modes (say a frozen BatchNorm kept in eval while the rest trains), so
    # remember every submodule's own flag, not just the top one, and restore them even on error.
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def counted(loss_fn: Callable, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which targets ``loss_fn`` counts (a bool mask) and what its mean divides their sum by.

    ``CrossEntropyLoss`` and ``NLLLoss`` skip targets equal to ``ignore_index`` and weigh each
    counted target ``t`` by ``weight[t]``; every other loss counts each target once.
    """
    mask = torch.ones_like(targets, dtype=torch.bool)
    if not isinstance(loss_fn, (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)):
        return mask, mask.sum()
    if targets.is_floating_point():  # class probabilities: every row counts once
        return mask, mask.sum()
    mask = targets != loss_fn.ignore_index
    if loss_fn.weight is None:
        return mask, mask.sum()
    return mask, loss_fn.weight[targets[mask]].sum()


@reference
def evaluate(
    model: torch.nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: torch.nn.Module,
    device: torch.device | str,
) -> tuple[float, float]:
    """The mean loss and the accuracy of ``model`` over every example in ``loader``.

    Args:
        model: a classifier already on ``device``, returning ``[..., classes]`` scores.
        loader: yields ``(inputs, targets)`` batches; ``targets`` hold one class index per
            prediction (``[B]`` for ``[B, classes]`` outputs). Batches may differ in size.
        loss_fn: one of torch's loss modules with ``reduction="mean"``, such as
            ``CrossEntropyLoss`` (with class ``weight``, ``ignore_index`` or label smoothing)
            or ``MultiMarginLoss``. Its settings are left as they are: the sums come from a
            copy of it with ``reduction="sum"``.
        device: where each batch is moved before the forward pass.

    Returns:
        ``(mean_loss, accuracy)`` as Python floats. ``mean_loss`` is what ``loss_fn`` gives on
        all the examples as one batch: the sum of the batches' ``reduction="sum"`` losses over
        the sum of what each batch's mean divides by (`counted`). ``accuracy`` is the fraction
        of counted targets (those not ``ignore_index``) whose highest score is the target.

    Raises:
        ValueError: if the loader yields no counted target.
    """
    summed = copy.copy(loss_fn)  # a shallow copy: the caller's loss keeps its own reduction
    summed.reduction = "sum"
    total_loss = total_weight = 0.0
    correct = count = 0
    with _eval_mode(model), torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            mask, weight = counted(loss_fn, targets)
            total_loss += summed(outputs, targets).item()
            total_weight += weight.item()
            correct += (outputs.argmax(dim=-1) == targets)[mask].sum().item()
            count += int(mask.sum().item())
    if count == 0:
        raise ValueError("The loader yielded no counted target, so there is nothing to average.")
    return total_loss / total_weight, correct / count


@reference
def predict(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The class each input is predicted to belong to, for serving or a confusion matrix.

    Args:
        model: a classifier returning ``[..., classes]`` scores.
        x: a batch of inputs; it is moved to the model's device.

    Returns:
        ``[...]`` int64 class indices (the argmax over the last dimension) on the model's
        device. They are inference tensors: fine to read, compare and plot, but not to use in
        a computation that autograd should record.
    """
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else x.device
    with _eval_mode(model), torch.inference_mode():
        return model(x.to(device)).argmax(dim=-1)
