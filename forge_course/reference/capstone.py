"""The capstone: chapter 04's plain loop, the production loop built on it, and a smoke test.

`plain_fit` is the loop of chapter 04 and nothing more. `fit` is the same loop with the
production lines added: clipping, a per-batch scheduler, a sample-weighted training loss, a
checkpoint every ``every`` updates (atomic, from chapter 09), validation done right (chapter 06),
a log record per epoch and early stopping. Every line of `plain_fit` appears unchanged in `fit`,
in the same order, so ``difflib`` shows the production loop as pure additions; a test keeps it so.

`smoke_test` is the check to run before any long training: a working loop can drive the loss of
one small, fixed batch down in a few steps, and a broken one (an update that never happens, a
gradient that never arrives) cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from forge_course.reference.checkpoint import checkpoint_path, save_checkpoint
from forge_course.reference.evaluation import evaluate
from forge_course.reference.guard import reference
from forge_course.reference.seeding import EarlyStopping


def plain_fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    """Chapter 04's loop: the five lines of a step, repeated over batches and epochs."""
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
    return model


def _quiet(record: dict) -> None:
    """The default logger: drop the record."""


@reference
def fit(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable,
    train_loader,
    val_loader,
    epochs: int,
    device: torch.device | str,
    *,
    folder: str | Path | None = None,
    every: int = 100,
    max_norm: float = 1.0,
    patience: int = 5,
    log: Callable[[dict], None] = _quiet,
) -> torch.nn.Module:
    """`plain_fit` plus the production lines; the loop doctor finds nothing in it.

    Args:
        model, optimizer, loss_fn, train_loader, val_loader, epochs, device: as for the loop
            doctor's ``fit``. The model is moved to ``device``; batches are moved one by one.
        folder: where to write a checkpoint every ``every`` optimizer updates; None writes none.
        every: updates between checkpoints.
        max_norm: the gradient norm clipped to before each update.
        patience: epochs without a better validation accuracy before stopping early.
        log: called once per epoch with a dict of plain numbers (step, losses, accuracy).

    Returns:
        The trained model (the same object, moved to ``device``).
    """
    model.to(device)
    total = epochs * len(train_loader)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    stopper = EarlyStopping(patience=patience, mode="max")
    step = 0
    for _ in range(epochs):
        model.train()
        loss_sum, seen = 0.0, 0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            loss_sum, seen = loss_sum + loss.item() * len(y), seen + len(y)
            if folder is not None and step % every == 0:
                path = checkpoint_path(folder, step)  # written to a temporary file, then renamed
                save_checkpoint(path, model, optimizer, scheduler, step=step)
        val_loss, val_accuracy = evaluate(model, val_loader, loss_fn, device)
        log({"step": step, "train_loss": loss_sum / seen, "val_loss": val_loss,
             "val_accuracy": val_accuracy})  # fmt: skip
        if stopper.step(val_accuracy):
            break
    return model


@reference
def smoke_test(
    make_model: Callable[[], torch.nn.Module],
    make_optimizer: Callable,
    loss_fn: Callable,
    batch: tuple[torch.Tensor, torch.Tensor],
    steps: int = 10,
) -> tuple[list[float], bool]:
    """Train a fresh model on one fixed batch for ``steps`` updates; did the loss fall?

    Args:
        make_model: builds the model, already on the batch's device.
        make_optimizer: ``make_optimizer(model.parameters())`` builds the optimizer.
        loss_fn: ``loss_fn(outputs, targets)`` gives a scalar tensor.
        batch: ``(x, y)``, used for every step.
        steps: how many updates.

    Returns:
        ``(losses, passed)``: ``losses[i]`` is the loss of step ``i``'s forward pass (before its
        update) as a float; ``passed`` is True when the last loss is lower than the first.
    """
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    x, y = batch
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, losses[-1] < losses[0]
