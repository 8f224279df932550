"""Checks for chapter 13, "Profiling": the grader's half.

The learner's half, `forge_course.observe.ch13`, builds the inputs, calls the answer and
reports; here are the cases, the references, the known mistakes and what counts as equal. No
check reads a clock: the profile tables hold fixed numbers, and the data pipeline is judged by
how many times it decodes each example.

Exercises:
    ch13_bottleneck: ``bottleneck(averages, phases) -> (name, share)``, the phase with the most
        inclusive CPU time in a ``key_averages()`` table, and its share of all the phases' time.
    ch13_preload: ``preload(dataset) -> Dataset``, every example decoded once, in ``preload``
        and never after it; the same batches.
Questions:
    ch13_q_step_ms, ch13_q_phase_time, ch13_q_sync.
"""

from __future__ import annotations

import random

import torch
from torch.utils.data import TensorDataset

from forge_course.grading.core import Exercise, grading_seed
from forge_course.observe.ch13 import (
    label_bottleneck,
    label_preload,
    observe_bottleneck,
    observe_preload,
)
from forge_course.reference import profiling as ref_profiling

PHASES = list(ref_profiling.PHASES)

# ---------------------------------------------------------------- ch13_bottleneck

# [key, count, cpu_time_total (µs), self_cpu_time_total (µs)], as a real profile lists them.
# A profile taken with `schedule(...)` has a `ProfilerStep*` row, a whole step with every phase
# inside it: the largest row of the table, and no phase.
_PLAIN_LOOP = [
    ["ProfilerStep*", 5, 19400, 700],
    ["data", 5, 9500, 500],
    ["enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 5, 9000, 8800],
    ["forward", 5, 3000, 900],
    ["aten::linear", 10, 1900, 100],
    ["aten::addmm", 10, 1500, 1300],
    ["backward", 5, 5200, 1800],
    ["autograd::engine::evaluate_function: AddmmBackward0", 10, 2500, 300],
    ["aten::mm", 20, 2000, 1900],
    ["optimizer", 5, 1000, 200],
    ["Optimizer.step#SGD.step", 5, 800, 600],
]
# Four micro-batches per update: data, forward and backward run four times as often.
_ACCUMULATING_LOOP = [
    ["data", 20, 2000, 100],
    ["forward", 20, 6000, 1500],
    ["aten::addmm", 40, 4000, 3600],
    ["backward", 20, 9000, 2500],
    ["aten::mm", 80, 6000, 5800],
    ["optimizer", 5, 4500, 4000],
    ["Optimizer.step#AdamW.step", 5, 4300, 500],
    ["aten::_foreach_mul_", 5, 1200, 1200],
]
# The model runs on two views of each batch, and the table is grouped by call site
# (`key_averages(group_by_stack_n=1)`): "forward" comes in two rows, which add up.
_SPLIT_ROWS = [
    ["data", 5, 2000, 100],
    ["forward", 5, 3000, 500],
    ["forward", 5, 3500, 400],
    ["aten::addmm", 20, 5200, 4900],
    ["backward", 5, 5000, 1000],
    ["aten::mm", 20, 3900, 3800],
    ["optimizer", 5, 1000, 300],
]
# The pipeline fixed: the model's own work is the bottleneck now.
_FIXED_PIPELINE = [
    ["ProfilerStep*", 8, 12100, 500],
    ["data", 8, 400, 350],
    ["forward", 8, 5100, 700],
    ["aten::linear", 16, 4100, 200],
    ["aten::native_dropout", 8, 300, 280],
    ["backward", 8, 4900, 1900],
    ["AddmmBackward0", 16, 2600, 300],
    ["optimizer", 8, 1200, 900],
]
# Forward and backward take exactly as long: the first of them in `phases` is the bottleneck.
# Listed as `table(sort_by="cpu_time_total")` shows them; the visible case's shuffle (seed 3)
# then puts backward's row before forward's, so naming the first tied phase in the table's order
# fails there too.
_TIED = [
    ["ProfilerStep*", 6, 11000, 500],
    ["forward", 6, 4200, 600],
    ["backward", 6, 4200, 900],
    ["aten::linear", 12, 3400, 200],
    ["aten::mm", 24, 3200, 3100],
    ["optimizer", 6, 1500, 1300],
    ["data", 6, 600, 550],
]


def bottleneck_cases(thorough: bool = False) -> list[dict]:
    """The plain loop (with its `ProfilerStep*` row), the accumulating loop, a phase split over
    two rows and a tie; thorough adds a fixed pipeline, other row orders and other time scales
    (shares unchanged)."""
    plans = [
        ("a loop of 5 steps", _PLAIN_LOOP),
        ("4 micro-batches per update, 5 updates", _ACCUMULATING_LOOP),
        ("forward in two rows, one per call site", _SPLIT_ROWS),
        ("forward and backward tied", _TIED),
    ]
    if not thorough:
        return [{"name": name, "rows": rows, "phases": PHASES, "scale": 1.0, "seed": i}
                for i, (name, rows) in enumerate(plans)]  # fmt: skip
    plans.append(("the pipeline fixed, 8 steps", _FIXED_PIPELINE))
    rng = random.Random(grading_seed())
    return [
        {
            "name": name,
            "rows": rows,
            "phases": PHASES,
            "scale": rng.choice([0.5, 1.0, 3.0]),
            "seed": rng.randrange(2**31),
        }  # fmt: skip
        for name, rows in plans
        for _ in range(2)
    ]


def _wrong_bottleneck(*, time="cpu_time_total", over_all_rows=False):
    """A known mistake; like most answers that keep one number per key, it keeps a phase's
    last row only."""

    def wrong(averages, phases):
        totals = {row.key: getattr(row, time) for row in averages if row.key in phases}
        name = max(phases, key=lambda phase: totals.get(phase, 0.0))
        whole = sum(getattr(row, time) for row in averages) if over_all_rows else None
        return name, totals[name] / (whole or sum(totals.values()))

    return wrong


def _last_on_a_tie(averages, phases):
    totals = dict.fromkeys(phases, 0.0)
    for row in averages:
        if row.key in totals:
            totals[row.key] += row.cpu_time_total
    name, time = sorted(totals.items(), key=lambda item: item[1])[-1]
    return name, time / sum(totals.values())


def _first_in_the_table_on_a_tie(averages, phases):
    totals = {}
    for row in averages:
        if row.key in phases:
            totals[row.key] = totals.get(row.key, 0.0) + row.cpu_time_total
    name = max(totals, key=totals.get)
    return name, totals[name] / sum(totals.values())


def _largest_row_of_the_table(averages, phases):
    totals = {}
    for row in averages:
        totals[row.key] = totals.get(row.key, 0.0) + row.cpu_time_total
    name = max(totals, key=totals.get)
    return name, totals[name] / sum(totals[phase] for phase in phases)


_TIE = (
    "two phases tie for the most time, and the one named is not the first of them in "
    "`phases`. `sorted(...)[-1]` gives the last of equal times, and `max` over a dict filled in "
    "the table's order the first in that order: rank `phases` itself, as "
    "`max(phases, key=...)` does, so that the first tied phase in `phases` wins."
)

BOTTLENECK_MISTAKES = [
    (
        "only one row of a phase was counted. A table grouped by input shape or call site "
        "(`group_by_stack_n`) lists a phase once per group: add up every row whose key is the "
        "phase's.",
        _wrong_bottleneck(),
    ),
    (
        "the phases were ranked by self time (`self_cpu_time_total`). A phase's self time leaves "
        "out every operator recorded inside it, which for `forward` is nearly all of it: use the "
        "inclusive `cpu_time_total`.",
        _wrong_bottleneck(time="self_cpu_time_total"),
    ),
    (
        "the phases were ranked by their time per call (`cpu_time`). Under accumulation the "
        "forward runs four times for every optimizer step: compare totals over the run "
        "(`cpu_time_total`).",
        _wrong_bottleneck(time="cpu_time"),
    ),
    (
        "the share was taken of the sum of every row of the table. Rows nest (an `aten::addmm` "
        "is inside `forward`), so that sum counts the same time several times: divide by the "
        "sum of the phases' times.",
        _wrong_bottleneck(over_all_rows=True),
    ),
    (
        "the name was taken from the largest row of the whole table, and that row is no phase: "
        "`ProfilerStep*` is a whole step, with every phase inside it. Compare only the rows "
        "whose key is one of `phases`.",
        _largest_row_of_the_table,
    ),
    (_TIE, _last_on_a_tie),
    (_TIE, _first_in_the_table_on_a_tie),
]

BOTTLENECK = Exercise(
    grade_id="ch13_bottleneck",
    function="bottleneck",
    reference=ref_profiling.bottleneck.__wrapped__,
    cases=bottleneck_cases,
    observe=observe_bottleneck,
    label=label_bottleneck,
    mistakes=BOTTLENECK_MISTAKES,
    hint="keep the rows whose `.key` is one of the phases, compare their `cpu_time_total`, and "
    "divide the largest by the sum over the phases.",
)
check_bottleneck = BOTTLENECK.check


# ---------------------------------------------------------------- ch13_preload


def preload_cases(thorough: bool = False) -> list[dict]:
    """20 examples in batches of 6; thorough adds one partial batch, odd sizes, other seeds."""
    if not thorough:
        return [{"n": 20, "features": 3, "batch": 6, "seed": 0}]
    seed = grading_seed()
    plans = [(20, 3, 6), (37, 4, 8), (5, 2, 8), (64, 1, 16)]
    return [{"n": n, "features": f, "batch": b, "seed": seed + i}
            for i, (n, f, b) in enumerate(plans)]  # fmt: skip


def _unchanged(dataset):
    return dataset


def _decodes_twice(dataset):
    inputs = torch.stack([dataset[i][0] for i in range(len(dataset))])
    targets = torch.stack([dataset[i][1] for i in range(len(dataset))])
    return TensorDataset(inputs, targets)


def _drops_last(dataset):
    pairs = [dataset[i] for i in range(len(dataset) - 1)]
    return TensorDataset(torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs]))


def _float_targets(dataset):
    pairs = [dataset[i] for i in range(len(dataset))]
    return TensorDataset(
        torch.stack([x for x, _ in pairs]), torch.Tensor([int(y) for _, y in pairs])
    )


def _lazy_cache(dataset):
    class DecodedOnFirstUse(torch.utils.data.Dataset):
        def __init__(self):
            self.kept = {}

        def __len__(self):
            return len(dataset)

        def __getitem__(self, i):
            if i not in self.kept:
                self.kept[i] = dataset[i]
            return self.kept[i]

    return DecodedOnFirstUse()


def _reordered(dataset):
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1))
    pairs = [dataset[int(i)] for i in order]
    return TensorDataset(torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs]))


PRELOAD_MISTAKES = [
    (
        "the dataset came back unchanged, so every epoch decoded every example again. Decode "
        "each example once, in `preload`, and return a dataset of the decoded tensors.",
        _unchanged,
    ),
    (
        "each example was decoded twice: `dataset[i]` decodes both its input and its target, so "
        "take both from one call.",
        _decodes_twice,
    ),
    (
        "the last example is missing: `range(len(dataset))` already stops before the end.",
        _drops_last,
    ),
    (
        "the targets came back as floats (`torch.Tensor(...)` makes float32): stack the target "
        "tensors as they are, so their dtype (long, for class labels) is kept.",
        _float_targets,
    ),
    (
        "the examples were stored in another order, so the same sampler picks other examples. "
        "Keep index i's example at index i: shuffling is the DataLoader's job.",
        _reordered,
    ),
    (
        "the examples are decoded on first use (a lazy cache), so `dataset[i]` is still called "
        "after `preload` returns: all through the first epoch, and with `num_workers > 0` in "
        "every epoch, since each worker fills its own copy of the cache. Decode every example "
        "in `preload` itself and return a dataset of the decoded tensors.",
        _lazy_cache,
    ),
]

PRELOAD = Exercise(
    grade_id="ch13_preload",
    function="preload",
    reference=ref_profiling.preload.__wrapped__,
    cases=preload_cases,
    observe=observe_preload,
    label=label_preload,
    mistakes=PRELOAD_MISTAKES,
    hint="call `dataset[i]` once for every i in order, stack the inputs and the targets, and "
    "return `TensorDataset(inputs, targets)`.",
)
check_preload = PRELOAD.check

EXERCISES = [BOTTLENECK, PRELOAD]
