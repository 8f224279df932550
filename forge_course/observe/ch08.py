"""Chapter 08's learner half: run the answer's ``fit`` on a case's config, report its history."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.optim import optimizer as optimizer_module  # not an attribute of torch.optim

from forge_course.data import make_spiral, train_val_split
from forge_course.observe.common import INSTRUMENT_TAMPERED, call_answer

# ---------------------------------------------------------------- ch08_fit

#: The history's keys, in the order they are compared: the learning rates explain the rest.
HISTORY_KEYS = ("lr", "train_loss", "val_accuracy")
#: What the run did besides its history: judged (a graph during validation breaks rule 7)...
VALIDATION_GRAD = "validation forward passes with autograd on"
#: ...and only explained (the rate each step used, which the recorded rates should be).
STEP_LR = "the rate each optimizer.step() used"


@contextmanager
def _one_thread() -> Iterator[None]:
    """A model this small trains fastest on one intra-op thread; the setting is put back after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def label_fit(case: dict) -> str:
    return (
        f"{case['optimizer']}, lr {case['lr']:g}, weight_decay {case['weight_decay']:g}, "
        f"{case['scheduler']} schedule, {case['epochs']} epochs, batch size {case['batch_size']}, "
        f"dropout {case['dropout']:g}, seed {case['seed']}, {case['device']}"
    )


def _series(values, device: str, dtype: torch.dtype):
    """A list of numbers as a 1-D tensor; anything else as a description of what it is."""
    if not isinstance(values, (list, tuple)):
        return {"type": type(values).__name__}
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = "tensor" if isinstance(value, torch.Tensor) else type(value).__name__
            return {"entry": i, "type": kind, "value": repr(value)[:80]}
    return torch.tensor([float(v) for v in values], dtype=dtype, device=device)


class _Watch:
    """Two global hooks for the length of a run: one before every `optimizer.step()` (the rate
    it is about to use), one before every forward of the spiral model's first layer (a forward
    over validation rows with autograd on records a graph the spec says not to).

    The hooks are the process's, but only the calling thread's steps and forwards count: the
    grader observes references in threads beside others that train (the arena's runs).
    """

    def __init__(self):
        self.thread = threading.get_ident()
        # The chapter's track (its settings cell builds the same), to tell validation rows.
        X, y = make_spiral(n_per_class=200, classes=2, noise=0.2, seed=0)
        X_val = train_val_split(X, y, val_fraction=0.25, seed=0)[2]
        self.val_rows = set(map(tuple, X_val.tolist()))
        self.rates: list[float] = []
        self.validation_with_grad = 0
        self.intact = True

    def _before_step(self, optimizer, args, kwargs) -> None:
        if threading.get_ident() != self.thread:
            return
        try:
            self.rates.append(float(optimizer.param_groups[0]["lr"]))
        except (TypeError, ValueError, KeyError, IndexError):  # not a rate: the step goes on
            self.rates.append(math.nan)

    def _before_forward(self, module: nn.Module, args: tuple) -> None:
        # Only the first layer sees the rows, and only a forward that records a graph counts.
        if not (isinstance(module, nn.Linear) and module.in_features == 2):
            return
        if threading.get_ident() != self.thread:
            return
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is None or x.dim() != 2 or not torch.is_grad_enabled():
            return
        rows = set(map(tuple, x.detach().cpu().tolist()))
        if rows and rows <= self.val_rows:
            self.validation_with_grad += 1

    @contextmanager
    def watching(self) -> Iterator[None]:
        forward = nn.modules.module.register_module_forward_pre_hook(self._before_forward)
        step = optimizer_module.register_optimizer_step_pre_hook(self._before_step)
        try:
            yield
        finally:
            self.intact = (
                forward.id in nn.modules.module._global_forward_pre_hooks
                and step.id in optimizer_module._global_optimizer_pre_hooks
            )
            forward.remove()
            step.remove()


def observe_fit(fn: Callable, case: dict) -> dict:
    """Run ``fn(config, device)`` on a fresh copy of the case's config; report its history,
    and how the run validated and stepped.

    The config is every key of the case but ``device``. A well-formed history comes back as
    three 1-D tensors: learning rates in float64 on the CPU (host arithmetic), losses and
    accuracies in float32 on the case's device (so that device's tolerance applies). A key that
    is missing is left out; a value that is not a list of numbers comes back as a description.
    Then the number of validation forwards run with autograd on, and the rate each optimizer
    step used (float64, on the CPU).
    """
    config = {key: value for key, value in case.items() if key != "device"}
    watch = _Watch()
    with _one_thread(), watch.watching():
        history = call_answer("ch08_fit", "fit", fn, config, case["device"], case=label_fit(case))
    if not isinstance(history, dict):
        return {"returned": type(history).__name__}
    seen = {
        key: _series(history[key], *(("cpu", torch.float64) if key == "lr" else
                                     (case["device"], torch.float32)))
        for key in HISTORY_KEYS
        if key in history
    }  # fmt: skip
    seen[VALIDATION_GRAD] = watch.validation_with_grad if watch.intact else INSTRUMENT_TAMPERED
    seen[STEP_LR] = torch.tensor(watch.rates, dtype=torch.float64)
    return seen


# ---------------------------------------------------------------- ch08_arena_config


def observe_arena_config(fn: Callable, case: dict):
    """What ``make_arena_config()`` returns: the grader runs the config, not the answer."""
    return call_answer("ch08_arena_config", "make_arena_config", fn)
