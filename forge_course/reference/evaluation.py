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
3. **Weighted means.** With ``reduction="mean"`` each batch's loss is a mean over that batch.
   Averaging those means over-weights a short last batch (10 examples in batches of 4 give means
   over 4, 4 and 2), so each batch mean is multiplied back by its size and the sum divided by
   the number of examples. That holds when every example counts once in its batch's mean; a
   class-weighted or ``ignore_index`` loss divides by the weight of the targets it counts, and
   its dataset mean is the sum of ``reduction="sum"`` losses over that total weight instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch

from forge_course.reference.guard import reference

__all__ = ["evaluate", "predict"]


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


@reference
def evaluate(
    model: torch.nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device | str,
) -> tuple[float, float]:
    """The mean loss and the accuracy of ``model`` over every example in ``loader``.

    Args:
        model: a classifier already on ``device``, returning ``[..., classes]`` scores.
        loader: yields ``(inputs, targets)`` batches; ``targets`` hold one class index per
            prediction (``[B]`` for ``[B, classes]`` outputs). Batches may differ in size.
        loss_fn: a loss whose value is the mean over the batch with every example counting
            once (``reduction="mean"``, no class ``weight``, no ``ignore_index``), such as
            ``torch.nn.CrossEntropyLoss()`` (label smoothing allowed) or
            ``torch.nn.MultiMarginLoss()``. With class weights or ignored targets the batch
            mean divides by their total weight or count instead, and weighing it by the batch
            size would be wrong. Its settings are left as they are.
        device: where each batch is moved before the forward pass.

    Returns:
        ``(mean_loss, accuracy)`` as Python floats: the loss averaged over all predictions
        (not over batches), and the fraction of predictions whose highest score is the target.

    Raises:
        ValueError: if the loader yields no batch.
    """
    total_loss = 0.0
    correct = 0
    count = 0
    with _eval_mode(model), torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            n = targets.numel()
            # The loss is a mean over this batch: weigh it by the batch's size.
            total_loss += loss_fn(outputs, targets).item() * n
            correct += (outputs.argmax(dim=-1) == targets).sum().item()
            count += n
    if count == 0:
        raise ValueError("The loader yielded no examples, so there is nothing to average.")
    return total_loss / count, correct / count


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
