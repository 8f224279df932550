"""Checks for chapter 00, "Vocabulary and training arithmetic".

Exercises:
    ch00_training_arithmetic: ``training_arithmetic(dataset_size, batch_size, epochs,
        accum_steps=1, drop_last=False)``, the dict of counts of
        `forge_course.reference.arithmetic.training_arithmetic`.
    ch00_update_schedule: ``update_schedule(dataset_size, batch_size, accum_steps,
        drop_last=False)``, one ``(size, steps)`` pair per micro-batch of an epoch, as
        `forge_course.reference.schedule.update_schedule`.
Questions (checked in the notebook with this module's `check_number`, which takes NumPy
numbers as well as Python's, and ``check_choice``):
    ch00_q_iterations, ch00_q_updates, ch00_q_scheduler.

Each exercise has two records: one compares with the reference, the other (hidden tests only)
with what a real ``DataLoader`` does, counted by walking it with the correct accumulation loop.
The learner's half, which calls the answer, is `forge_course.observe.ch00`.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch
from torch.utils.data import DataLoader

from forge_course.grading import core
from forge_course.grading.core import Exercise, grading_seed
from forge_course.observe.ch00 import (
    ARITHMETIC_ID,
    SCHEDULE_ID,
    observe_training_arithmetic,
    observe_update_schedule,
)
from forge_course.observe.ch00 import label as _label
from forge_course.reference import arithmetic, schedule


def _case(n: int, b: int, epochs: int = 1, k: int = 1, drop_last: bool = False) -> dict:
    return {
        "dataset_size": n,
        "batch_size": b,
        "epochs": epochs,
        "accum_steps": k,
        "drop_last": drop_last,
    }


def _random_cases(rng: random.Random, count: int, max_n: int) -> list[dict]:
    return [
        _case(
            rng.randint(1, max_n),
            rng.randint(1, 70),
            rng.randint(1, 3),
            rng.randint(1, 9),
            rng.random() < 0.4,
        )
        for _ in range(count)
    ]


def _loader(dataset_size: int, batch_size: int, drop_last: bool) -> DataLoader:
    # collate_fn=len: each batch arrives as its number of examples, no tensor is built.
    return DataLoader(
        range(dataset_size),
        batch_size=batch_size,
        shuffle=True,
        drop_last=drop_last,
        collate_fn=len,
        generator=torch.Generator().manual_seed(0),
    )


# ---------------------------------------------------------------- ch00_training_arithmetic


def training_arithmetic_cases(thorough: bool = False) -> list[dict]:
    """The chapter's worked examples; thorough adds edge cases, the quiz rows and random runs."""
    cases = [
        _case(10_000, 32, 3),  # the running example
        _case(10_000, 32, 3, 4),  # ... with accumulation
        _case(1_000, 64, 5),  # the small hand case
        _case(100, 16, 1, drop_last=True),  # batch assembly with drop_last
        _case(1_024, 32, 2, 4),  # B divides N and K divides the micro-batches
        _case(100, 16, 2, 3, drop_last=True),  # drop_last with accumulation
        _case(5, 8, 3, 2, drop_last=True),  # N < B with drop_last: not one batch
    ]
    if thorough:
        cases += [
            _case(50_000, 256),
            _case(20_000, 64, 10, 4),
            _case(5, 8, 3, 2),  # N < B: one partial batch
            _case(1, 1, 1),
            _case(64, 64, 2, drop_last=True),
            _case(7, 1, 2, 3),
            _case(10, 3, 3, 5),  # fewer micro-batches than K
        ]
        cases += _random_cases(random.Random(grading_seed()), 8, max_n=3_000)
    return cases


def count_on_a_dataloader(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    """The counts of `training_arithmetic`, taken as the correct loop walks a real DataLoader."""
    loader = _loader(dataset_size, batch_size, drop_last)
    micro = updates = seen = 0
    sizes: list[int] = []
    for _ in range(epochs):
        sizes = []
        for i, size in enumerate(loader):
            micro += 1
            seen += size
            sizes.append(size)
            if (i + 1) % accum_steps == 0 or i + 1 == len(loader):
                updates += 1
    return {
        "iters_per_epoch": len(sizes),
        "last_batch_size": sizes[-1] if sizes else 0,
        "micro_steps": micro,
        "updates_per_epoch": updates // epochs,
        "total_updates": updates,
        "effective_batch_size": batch_size * accum_steps,
        "examples_seen": seen,
    }


def _wrong_arithmetic(
    *,
    floor_count=False,
    naive_tail=False,
    updates_floor_n=False,
    last_is_remainder=False,
    ignore_drop_last=False,
    dropped_are_seen=False,
    updates_from_n=False,
    effective_is_b=False,
    updates_over_run=False,
    micro_is_updates=False,
    one_too_many=False,
    iters_only_rounded_down=False,
    last_full_when_none=False,
    seen_full_batches=False,
    micro_per_epoch=False,
    total_per_epoch=False,
    seen_per_epoch=False,
):
    def wrong(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
        n, b, k = dataset_size, batch_size, accum_steps
        dropping = drop_last and not ignore_drop_last
        rounds_down = dropping or floor_count
        if rounds_down or (iters_only_rounded_down and not drop_last):
            iters = n // b
        elif one_too_many:
            iters = n // b + 1
        else:
            iters = -(-n // b)
        if rounds_down:
            last = b if iters or last_full_when_none else 0
        else:
            last = n % b if last_is_remainder else n - (iters - 1) * b
        seen = iters * b if (rounds_down and not dropped_are_seen) or seen_full_batches else n
        if naive_tail:
            per_epoch = iters // k
        elif updates_floor_n:
            per_epoch = n // (b * k)
        elif updates_from_n:
            per_epoch = -(-n // (b * k))
        else:
            per_epoch = -(-iters // k)
        total = -(-iters * epochs // k) if updates_over_run else per_epoch * epochs
        return {
            "iters_per_epoch": iters,
            "last_batch_size": last,
            "micro_steps": total
            if micro_is_updates
            else iters * (1 if micro_per_epoch else epochs),
            "updates_per_epoch": per_epoch,
            "total_updates": per_epoch if total_per_epoch else total,
            "effective_batch_size": b if effective_is_b else b * k,
            "examples_seen": seen * (1 if seen_per_epoch else epochs),
        }

    return wrong


_ROUNDED_DOWN = (
    "I = N / B is rounded down (`N // B`, `int(N / B)`) or to the nearest (`round(N / B)`: "
    "10,000 / 32 = 312.5 rounds to 312), so the partial last batch is lost. Without "
    "`drop_last` it is still a micro-batch: an epoch has I = ceil(N / B) of them."
)

ARITHMETIC_MISTAKES = [
    (
        "updates_per_epoch counts only full groups of K micro-batches (I // K). The correct loop "
        "also updates on the last, shorter group, so an epoch makes ceil(I / K) updates; a loop "
        "that steps only when `(i + 1) % K == 0` leaves that group's gradients in `.grad`.",
        _wrong_arithmetic(naive_tail=True),
    ),
    (
        "`N // B` rounds down, and loses the partial last batch: without `drop_last` it is "
        "still a micro-batch, so an epoch has I = ceil(N / B) of them, not N // B.",
        _wrong_arithmetic(floor_count=True),
    ),
    (
        "`N // (B·K)` rounds down, and loses the last, shorter group of each epoch: the correct "
        "loop updates on it too, so an epoch makes ceil(I / K) updates, I = ceil(N / B).",
        _wrong_arithmetic(updates_floor_n=True),
    ),
    (
        "`N % B` is 0 when B divides N, but then the last batch is a full one: "
        "last_batch_size = N − (I − 1)·B.",
        _wrong_arithmetic(last_is_remainder=True),
    ),
    (
        "`drop_last=True` throws the partial last batch away: an epoch has N // B micro-batches, "
        "all of B examples.",
        _wrong_arithmetic(ignore_drop_last=True),
    ),
    (
        "with `drop_last=True` the N mod B dropped examples are never seen: examples_seen is "
        "(N // B)·B per epoch.",
        _wrong_arithmetic(dropped_are_seen=True),
    ),
    (
        "ceil(N / (B·K)) also counts the examples `drop_last=True` throws away. Count the updates "
        "from the micro-batches that exist: ceil(I / K), with I = N // B.",
        _wrong_arithmetic(updates_from_n=True),
    ),
    (
        "the effective batch is the number of examples behind one update: B·K.",
        _wrong_arithmetic(effective_is_b=True),
    ),
    (
        "the loop's count of micro-batches starts again every epoch, and every epoch ends with "
        "its own update on the last group: total_updates = updates_per_epoch × epochs, "
        "not ceil(micro_steps / K).",
        _wrong_arithmetic(updates_over_run=True),
    ),
    (
        "micro_steps counts forward and backward passes, one per micro-batch (I × epochs), "
        "whatever K is; optimizer updates are total_updates.",
        _wrong_arithmetic(micro_is_updates=True),
    ),
    (
        "`N // B + 1` (or `int(N / B) + 1`) is one batch too many when B divides N: then there "
        "is no partial batch, and I = N / B. `math.ceil(N / B)` is right in both cases.",
        _wrong_arithmetic(one_too_many=True),
    ),
    (_ROUNDED_DOWN, _wrong_arithmetic(iters_only_rounded_down=True)),
    (_ROUNDED_DOWN, _wrong_arithmetic(iters_only_rounded_down=True, last_is_remainder=True)),
    (
        "with `drop_last=True` and N < B there is not one full batch: the epoch has no "
        "micro-batch at all, so last_batch_size is 0, not B.",
        _wrong_arithmetic(last_full_when_none=True),
    ),
    (
        "without `drop_last` the last batch holds only the N − (I − 1)·B examples left over, "
        "so an epoch sees each of the N examples once: examples_seen = N × epochs, not I·B × "
        "epochs.",
        _wrong_arithmetic(seen_full_batches=True),
    ),
    (
        "micro_steps counts the micro-batches of the whole run, not of one epoch: "
        "iters_per_epoch × epochs.",
        _wrong_arithmetic(micro_per_epoch=True),
    ),
    (
        "total_updates counts the updates of the whole run, not of one epoch: "
        "updates_per_epoch × epochs.",
        _wrong_arithmetic(total_per_epoch=True),
    ),
    (
        "examples_seen counts the examples of the whole run, not of one epoch: "
        "the examples of one epoch × epochs.",
        _wrong_arithmetic(seen_per_epoch=True),
    ),
]

TRAINING_ARITHMETIC = Exercise(
    grade_id=ARITHMETIC_ID,
    function="training_arithmetic",
    reference=arithmetic.training_arithmetic.__wrapped__,
    cases=training_arithmetic_cases,
    observe=observe_training_arithmetic,
    label=_label,
    mistakes=ARITHMETIC_MISTAKES,
    hint="work the running example by hand (N=10,000, B=32, K=4: 313 micro-batches, the last "
    "of 16, 79 updates per epoch) and compare each key in turn.",
)

# Hidden tests only: the same cases, the expected counts taken from a real DataLoader.
TRAINING_ARITHMETIC_ON_A_DATALOADER = dataclasses.replace(
    TRAINING_ARITHMETIC,
    reference=count_on_a_dataloader,
    cases=lambda thorough: training_arithmetic_cases(True) if thorough else [],
    label=lambda case: f"{_label(case)}; counted on a real DataLoader",
)


def check_training_arithmetic(fn, thorough: bool = False) -> None:
    """Compare with the reference; with ``thorough``, also with a real DataLoader's counts."""
    TRAINING_ARITHMETIC.check(fn, thorough)
    TRAINING_ARITHMETIC_ON_A_DATALOADER.check(fn, thorough)


# ---------------------------------------------------------------- ch00_update_schedule


def update_schedule_cases(thorough: bool = False) -> list[dict]:
    """The leak example, the running example, drop_last, and a K that divides the epoch."""
    cases = [
        _case(100, 16, k=4),
        _case(10_000, 32, k=4),
        _case(100, 16, k=3, drop_last=True),
        _case(1_024, 32, k=4),
    ]
    if thorough:
        cases += [
            _case(5, 8, k=2, drop_last=True),  # nothing at all
            _case(5, 8, k=2),  # one partial micro-batch, and it must step
            _case(7, 1, k=3),
            _case(64, 64, drop_last=True),
            _case(10, 3, k=5),  # the whole epoch is one short group
            _case(1, 1),
            _case(20_000, 64, k=4),
        ]
        cases += _random_cases(random.Random(grading_seed() + 1), 8, max_n=3_000)
    return [{key: value for key, value in case.items() if key != "epochs"} for case in cases]


def schedule_on_a_dataloader(dataset_size, batch_size, accum_steps, drop_last=False):
    """The schedule a real DataLoader gives, with the correct loop deciding when to step."""
    loader = _loader(dataset_size, batch_size, drop_last)
    return [
        (size, (i + 1) % accum_steps == 0 or i + 1 == len(loader)) for i, size in enumerate(loader)
    ]


def _wrong_schedule(
    *,
    naive=False,
    step_first=False,
    every_step=False,
    all_full=False,
    last_is_remainder=False,
    ignore_drop_last=False,
    floor_count=False,
):
    def wrong(dataset_size, batch_size, accum_steps, drop_last=False):
        n, b, k = dataset_size, batch_size, accum_steps
        dropping = drop_last and not ignore_drop_last
        iters = n // b if dropping or floor_count else -(-n // b)
        sizes = [b] * iters
        if iters and not (dropping or floor_count or all_full):
            sizes[-1] = n % b if last_is_remainder else n - (iters - 1) * b
        pairs = []
        for i, size in enumerate(sizes):
            if naive:
                steps = (i + 1) % k == 0
            elif step_first:
                steps = i % k == 0
            else:
                steps = every_step or (i + 1) % k == 0 or i + 1 == iters
            pairs.append((size, steps))
        return pairs

    return wrong


SCHEDULE_MISTAKES = [
    (
        "the last, shorter group of micro-batches gets no update: its gradients stay in `.grad` "
        "and leak into the first update of the next epoch. Also step after the last micro-batch "
        "of the epoch: `(i + 1) % K == 0 or i + 1 == I`.",
        _wrong_schedule(naive=True),
    ),
    (
        "the updates come after micro-batches 0, K, 2K, … (counting from 0). An update closes a "
        "group, so it comes after the K-th micro-batch: `(i + 1) % K == 0`.",
        _wrong_schedule(step_first=True),
    ),
    (
        "an update after every micro-batch ignores `accum_steps`: step once per group of K.",
        _wrong_schedule(every_step=True),
    ),
    (
        "every micro-batch is listed with B examples, but the last one holds only what is left "
        "over: N − (I − 1)·B.",
        _wrong_schedule(all_full=True),
    ),
    (
        "`N % B` is 0 when B divides N, but then the last micro-batch is a full one of B.",
        _wrong_schedule(last_is_remainder=True),
    ),
    (
        "`drop_last=True` throws the partial last batch away: N // B micro-batches, all of B.",
        _wrong_schedule(ignore_drop_last=True),
    ),
    (
        "`N // B` rounds down: without `drop_last` the partial last batch is still a "
        "micro-batch, so there are ceil(N / B) of them, not N // B.",
        _wrong_schedule(floor_count=True),
    ),
]

UPDATE_SCHEDULE = Exercise(
    grade_id=SCHEDULE_ID,
    function="update_schedule",
    reference=schedule.update_schedule.__wrapped__,
    cases=update_schedule_cases,
    observe=observe_update_schedule,
    label=_label,
    mistakes=SCHEDULE_MISTAKES,
    hint="walk the leak example by hand: N=100, B=16, K=4 gives six micro-batches of 16 and one "
    "of 4, with updates after the 4th and the 7th.",
)

# Hidden tests only: the same cases, the expected schedule taken from a real DataLoader.
UPDATE_SCHEDULE_ON_A_DATALOADER = dataclasses.replace(
    UPDATE_SCHEDULE,
    reference=schedule_on_a_dataloader,
    cases=lambda thorough: update_schedule_cases(True) if thorough else [],
    label=lambda case: f"{_label(case)}; listed from a real DataLoader",
)


def check_update_schedule(fn, thorough: bool = False) -> None:
    """Compare with the reference; with ``thorough``, also with a real DataLoader's batches."""
    UPDATE_SCHEDULE.check(fn, thorough)
    UPDATE_SCHEDULE_ON_A_DATALOADER.check(fn, thorough)


# ---------------------------------------------------------------- questions


def check_number(answer, grade_id: str, expected: float | None = None, **options) -> None:
    """`forge_course.grading.check_number`, with a NumPy number taken as the number it holds.

    A count worked out with NumPy (``np.ceil(N / B)``, ``np.int64(N) // B``) is a NumPy scalar,
    not a Python ``int`` or ``float``; it is as good an answer.
    """
    __tracebackhide__ = True  # IPython and pytest show the learner's frames, not ours
    if isinstance(answer, np.number):
        answer = answer.item()
    core.check_number(answer, grade_id, expected, **options)


EXERCISES = [
    TRAINING_ARITHMETIC,
    TRAINING_ARITHMETIC_ON_A_DATALOADER,
    UPDATE_SCHEDULE,
    UPDATE_SCHEDULE_ON_A_DATALOADER,
]
