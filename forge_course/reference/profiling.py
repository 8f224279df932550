"""Profiling a training loop: where a step's time goes, read from torch.profiler's table.

A loop marks its phases with ``torch.profiler.record_function("data")``, ``("forward")`` and so
on; the profiler then reports each marked range as a row of ``prof.key_averages()``, next to
the operators that ran inside it.

Inclusive time, not self time
    A row's ``self_cpu_time_total`` is the time spent in the range itself, *minus* every
    operator recorded inside it; ``cpu_time_total`` includes them. A ``forward`` range spends
    almost all its time in ``aten::linear`` and friends, so its self time is small and says
    nothing about how long the forward pass took: a phase is measured by its inclusive time.
    Both are totals over every call (``count``); ``cpu_time`` is the average per call, which
    ranks phases wrongly when one runs more often than another (four forwards per update under
    gradient accumulation).

The input pipeline as the bottleneck
    When examples are decoded in ``__getitem__`` (a file read, a parse, an augmentation), the
    ``data`` phase holds that work, every epoch again. Two fixes, each with a cost: decode once
    and keep the tensors (`preload`, when the data fits in memory), or let DataLoader workers
    decode ahead of the model (``num_workers``), which hides the time only when it can run
    beside the model's own work.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager

import torch
from torch.utils.data import Dataset, TensorDataset

from forge_course.reference.guard import reference

__all__ = ["PHASES", "bottleneck", "phase_ms", "preload", "quiet_profiler", "timed_ms"]

PHASES = ("data", "forward", "backward", "optimizer")  # the record_function labels of the loop


@reference
def bottleneck(averages: Iterable, phases: Sequence[str]) -> tuple[str, float]:
    """The phase that took the most time, and its share of the time of all the phases.

    Args:
        averages: rows of ``prof.key_averages()`` (each with ``.key`` and ``.cpu_time_total``,
            in microseconds, summed over every call). A table grouped by input shape or call
            site has several rows with one key: a phase's time is the sum of its rows.
        phases: the ``record_function`` labels that together cover the step.

    Returns:
        ``(name, share)``: the phase with the largest inclusive CPU time (the first of them in
        ``phases`` on a tie) and its time divided by the sum of every phase's, a float in
        ``(0, 1]``.
    """
    totals = dict.fromkeys(phases, 0.0)
    for row in averages:
        if row.key in totals:
            totals[row.key] += row.cpu_time_total
    name = max(phases, key=lambda phase: totals[phase])
    return name, totals[name] / sum(totals.values())


@reference
def preload(dataset: Dataset) -> Dataset:
    """Every example of ``dataset`` decoded once, stacked into tensors, in the same order.

    A DataLoader over the result gives the same batches as one over ``dataset`` (same sampler,
    same generator), without calling ``dataset[i]`` again in any epoch.
    """
    inputs, targets = zip(*(dataset[i] for i in range(len(dataset))))
    return TensorDataset(torch.stack(inputs), torch.stack(targets))


def phase_ms(averages: Iterable, phases: Sequence[str] = PHASES) -> dict[str, float]:
    """Each phase's inclusive CPU time in milliseconds, summed over its calls."""
    totals = dict.fromkeys(phases, 0.0)
    for row in averages:
        if row.key in totals:
            totals[row.key] += row.cpu_time_total / 1e3
    return totals


@contextmanager
def quiet_profiler():
    """Keep the profiler's routine notices off stderr, where a notebook shows them in red.

    Kineto writes its start and stop lines (``USDT: ... profiler_start``) from C++ straight to
    file descriptor 2, and with ``profile_memory=True`` the CPU allocator warns that blocks
    allocated before the profile began will have no matching allocation (true of every
    profile that starts in the middle of a program). Anything else written there meanwhile is
    passed on.
    """
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines = sink.read().decode("utf-8", "replace").splitlines()
            routine = ("profiler_start", "profiler_stop", "allocated before the profiling started")
            other = [line for line in lines if not any(r in line for r in routine)]
            if other:
                os.write(2, ("\n".join(other) + "\n").encode())


def timed_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock milliseconds of one call of ``fn``, waiting for ``device`` before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3
