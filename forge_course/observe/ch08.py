"""Chapter 08's learner half: run the answer's ``fit`` on a case's config, report its history."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from forge_course.observe.common import call_answer

# ---------------------------------------------------------------- ch08_fit

#: The history's keys, in the order they are compared: the learning rates explain the rest.
HISTORY_KEYS = ("lr", "train_loss", "val_accuracy")


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


def observe_fit(fn: Callable, case: dict) -> dict:
    """Run ``fn(config, device)`` on a fresh copy of the case's config; report its history.

    The config is every key of the case but ``device``. A well-formed history comes back as
    three 1-D tensors: learning rates in float64 on the CPU (host arithmetic), losses and
    accuracies in float32 on the case's device (so that device's tolerance applies). A key that
    is missing is left out; a value that is not a list of numbers comes back as a description.
    """
    config = {key: value for key, value in case.items() if key != "device"}
    with _one_thread():
        history = call_answer("ch08_fit", "fit", fn, config, case["device"], case=label_fit(case))
    if not isinstance(history, dict):
        return {"returned": type(history).__name__}
    return {
        key: _series(history[key], *(("cpu", torch.float64) if key == "lr" else
                                     (case["device"], torch.float32)))
        for key in HISTORY_KEYS
        if key in history
    }  # fmt: skip


# ---------------------------------------------------------------- ch08_arena_config


def observe_arena_config(fn: Callable, case: dict):
    """What ``make_arena_config()`` returns: the grader runs the config, not the answer."""
    return call_answer("ch08_arena_config", "make_arena_config", fn)
