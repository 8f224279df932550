"""Learning-rate schedulers: how often each one was stepped, and what its schedule was sized for.

A scheduler's constructor arguments say which unit it counts in only when they are tied to the
run: the doctor calls `fit` with ``epochs`` epochs of ``len(train_loader)`` batches. Its *length*
is what ends or repeats it, and comes in three kinds:

- ``whole``: the whole schedule, which must not be stepped past (``OneCycleLR.total_steps``
  raises, ``CosineAnnealingLR.T_max`` turns the rate back up);
- ``period``: a decay period (``StepLR.step_size``, the last of ``MultiStepLR.milestones``),
  counted in epochs in torch's documentation;
- ``ramp``: a warm-up or decay that then holds its last value (``total_iters`` of ``LinearLR``,
  ``ConstantLR`` and ``PolynomialLR``), short ones being usual per batch.

Any other scheduler (``ExponentialLR``, ``LambdaLR``, ``ReduceLROnPlateau``...) has no length the
doctor can read, so its rate is never questioned. The doctor sees each call of ``step()`` (not
the one a scheduler makes on itself when it is built) by wrapping `LRScheduler.step` while `fit`
runs. `findings.scheduler_wrong_rate` says which lengths it reads as epochs or as batches.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from torch.optim import lr_scheduler

# Attribute holding the schedule's length, and the kind of length, per scheduler class.
LENGTH_ATTRIBUTE = {
    "OneCycleLR": ("total_steps", "whole"),
    "CosineAnnealingLR": ("T_max", "whole"),
    "StepLR": ("step_size", "period"),
    "LinearLR": ("total_iters", "ramp"),
    "ConstantLR": ("total_iters", "ramp"),
    "PolynomialLR": ("total_iters", "ramp"),
}


@dataclass
class SchedulerRecord:
    """One scheduler that `fit` stepped, and when."""

    name: str  # class name
    length: int | None  # see the module docstring; None when it has none
    kind: str  # "whole", "period" or "ramp" (see the module docstring); "" without a length
    length_label: str  # e.g. "T_max=2"
    epochs_of_steps: list[int] = field(default_factory=list)  # training passes begun at each step
    first_lr: float | None = None
    last_lr: float | None = None

    def steps_in_one_epoch(self) -> int:
        """Most steps between the starts of two passes over the training loader."""
        counts: dict[int, int] = {}
        for epoch in self.epochs_of_steps:
            counts[epoch] = counts.get(epoch, 0) + 1
        return max(counts.values(), default=0)


def _length(scheduler) -> tuple[int | None, str, str]:
    name = type(scheduler).__name__
    if name == "MultiStepLR":
        milestones = sorted(scheduler.milestones)
        if milestones:
            return milestones[-1], "period", f"milestones={milestones}"
        return None, "", ""
    attribute, kind = LENGTH_ATTRIBUTE.get(name, (None, ""))
    value = getattr(scheduler, attribute, None) if attribute else None
    if not isinstance(value, int):
        return None, "", ""
    return value, kind, f"{attribute}={value}"


@contextlib.contextmanager
def watching_schedulers(note: Callable[[object], None]) -> Iterator[None]:
    """Call ``note(scheduler)`` before every ``step()`` of an `LRScheduler` inside the block."""
    original = lr_scheduler.LRScheduler.step

    @functools.wraps(original)
    def step(self, *args, **kwargs):
        # The constructor's own first step runs with `_step_count` still 0.
        if getattr(self, "_step_count", 0) > 0:
            note(self)
        return original(self, *args, **kwargs)

    lr_scheduler.LRScheduler.step = step
    try:
        yield
    finally:
        lr_scheduler.LRScheduler.step = original


class SchedulerLog:
    """The schedulers `fit` stepped, in the order they were first stepped."""

    def __init__(self) -> None:
        self.records: dict[int, SchedulerRecord] = {}
        self._alive: list[object] = []  # keeps ids unique while the run lasts

    def stepped(self, scheduler, epoch: int) -> None:
        record = self.records.get(id(scheduler))
        if record is None:
            record = SchedulerRecord(type(scheduler).__name__, *_length(scheduler))
            self.records[id(scheduler)] = record
            self._alive.append(scheduler)
            record.first_lr = _lr(scheduler)
        record.epochs_of_steps.append(epoch)

    def finish(self) -> None:
        """Note each scheduler's last learning rate, then let the schedulers go."""
        for scheduler in self._alive:
            self.records[id(scheduler)].last_lr = _lr(scheduler)
        self._alive.clear()


def _lr(scheduler) -> float | None:
    groups = getattr(getattr(scheduler, "optimizer", None), "param_groups", None)
    return float(groups[0]["lr"]) if groups else None
