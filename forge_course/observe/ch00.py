"""Chapter 00's learner half: call the answer with a case's numbers, report what it counted."""

from __future__ import annotations

import numbers
from collections.abc import Iterator

import numpy as np

from forge_course.observe.common import Mistake, call_answer

ARITHMETIC_ID = "ch00_training_arithmetic"
SCHEDULE_ID = "ch00_update_schedule"

# The keys the exercise text asks for: the form of an answer, not its values.
ARITHMETIC_KEYS = (
    "iters_per_epoch",
    "last_batch_size",
    "micro_steps",
    "updates_per_epoch",
    "total_updates",
    "effective_batch_size",
    "examples_seen",
)


def label(case: dict) -> str:
    """A case in a few words: ``N=10,000, B=32, 3 epochs, K=4, drop_last=False``."""
    epochs = ""
    if "epochs" in case:
        epochs = f", {case['epochs']} epoch{'s' if case['epochs'] > 1 else ''}"
    return (
        f"N={case['dataset_size']:,}, B={case['batch_size']}{epochs}, K={case['accum_steps']}, "
        f"drop_last={case['drop_last']}"
    )


def _whole(value):
    """NumPy and other integer types as a plain int; anything else as it is."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return value


def observe_training_arithmetic(fn, case: dict) -> dict:
    """Call ``fn`` with the case's five arguments; its dict, integer types made plain ints."""
    out = call_answer(
        ARITHMETIC_ID,
        "training_arithmetic",
        fn,
        case["dataset_size"],
        case["batch_size"],
        case["epochs"],
        case["accum_steps"],
        case["drop_last"],
        case=label(case),
    )
    if not isinstance(out, dict):
        raise Mistake(
            ARITHMETIC_ID,
            f"`training_arithmetic` should return a dict with the keys {list(ARITHMETIC_KEYS)}, "
            f"but it returned {out!r:.80}.",
        )
    return {str(key): _whole(value) for key, value in out.items()}


def _pair(item, index: int) -> tuple[int, bool]:
    """One (size, steps) pair from a tuple or list; a `Mistake` if it is not one."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        size, steps = _whole(item[0]), item[1]
        if (
            isinstance(size, int)
            and not isinstance(size, bool)
            and isinstance(steps, (bool, np.bool_))
        ):
            return size, bool(steps)
    raise Mistake(
        SCHEDULE_ID,
        "`update_schedule` should return one (size, steps) pair per micro-batch, such as "
        f"(16, False): a whole number and a bool. Item {index} is {item!r:.60}.",
    )


def observe_update_schedule(fn, case: dict) -> dict:
    """The learner's schedule, checked for form, with the three counts it implies first."""
    out = call_answer(
        SCHEDULE_ID,
        "update_schedule",
        fn,
        case["dataset_size"],
        case["batch_size"],
        case["accum_steps"],
        case["drop_last"],
        case=label(case),
    )
    if isinstance(out, Iterator):
        out = list(out)  # a generator function is a fine answer too
    if not isinstance(out, (list, tuple)):
        raise Mistake(
            SCHEDULE_ID,
            f"`update_schedule` should return a list of (size, steps) pairs, but it returned "
            f"{out!r:.80}.",
        )
    pairs = [_pair(item, i) for i, item in enumerate(out)]
    # Counts first: "the number of optimizer updates should be 2" says more than a list index.
    return {
        "the number of micro-batches": len(pairs),
        "the number of examples": sum(size for size, _ in pairs),
        "the number of optimizer updates": sum(steps for _, steps in pairs),
        "the schedule": [{"size": size, "steps": steps} for size, steps in pairs],
    }
