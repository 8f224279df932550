"""Chapter 13's learner half: build each case's profile table or dataset, call the answer, report.

`ch13_bottleneck` is judged on tables built from plain numbers: real ``FunctionEventAvg`` rows
(the type ``prof.key_averages()`` holds), so an answer meets what a real profile gives it, but
with times fixed by the case, so the verdict never depends on the machine's speed.

`ch13_preload` is judged without a clock: the dataset counts how often it decodes an example,
and the observation holds the batches a seeded DataLoader gives over three epochs of the
answer's dataset, the decodes `preload` itself made, and those made after it returned (a lazy
cache decodes there, in the first epoch).
"""

from __future__ import annotations

import random

import torch
from torch.autograd.profiler_util import EventList, FunctionEventAvg
from torch.utils.data import DataLoader

from forge_course.data.decoding import DecodingDataset
from forge_course.observe.common import Mistake, call_answer

BOTTLENECK, PRELOAD = "ch13_bottleneck", "ch13_preload"


# ---------------------------------------------------------------- ch13_bottleneck


def label_bottleneck(case: dict) -> str:
    return f"{case['name']}, phases {case['phases']}"


def profile_table(case: dict) -> EventList:
    """The case's rows as ``prof.key_averages()`` would hold them, in an order set by its seed.

    Each row of ``case["rows"]`` is ``[key, count, cpu_time_total_us, self_cpu_time_total_us]``;
    every time is multiplied by the case's ``scale`` (shares do not change).
    """
    rows = []
    for key, count, total, own in case["rows"]:
        row = FunctionEventAvg()
        row.key, row.count = key, count
        row.cpu_time_total = total * case["scale"]
        row.self_cpu_time_total = own * case["scale"]
        rows.append(row)
    random.Random(case["seed"]).shuffle(rows)
    return EventList(rows)


def observe_bottleneck(fn, case: dict) -> dict:
    """The phase named and the share returned for the case's table."""
    table = profile_table(case)
    returned = call_answer(BOTTLENECK, "bottleneck", fn, table, list(case["phases"]),
                           case=label_bottleneck(case))  # fmt: skip
    if not isinstance(returned, tuple | list) or len(returned) != 2:
        raise Mistake(BOTTLENECK, f"`bottleneck` should return a pair (phase name, share), but "
                      f"it returned {returned!r} ({label_bottleneck(case)}).")  # fmt: skip
    name, share = returned
    if isinstance(share, torch.Tensor) and share.numel() == 1:
        share = share.item()
    return {"the phase": name, "its share of the phases' time": share}


# ---------------------------------------------------------------- ch13_preload


def label_preload(case: dict) -> str:
    return f"{case['n']} examples of {case['features']} features, batches of {case['batch']}"


def _dataset(case: dict) -> DecodingDataset:
    gen = torch.Generator().manual_seed(case["seed"])
    inputs = torch.randn(case["n"], case["features"], generator=gen)
    targets = torch.randint(0, 3, (case["n"],), generator=gen)
    return DecodingDataset(inputs, targets)


def observe_preload(fn, case: dict) -> dict:
    """Three shuffled epochs over the answer's dataset: the batches, and the decodes made in
    `preload` and after it returned."""
    source = _dataset(case)
    prepared = call_answer(PRELOAD, "preload", fn, source, case=label_preload(case))
    in_preload = source.decoded
    try:
        length = len(prepared)
        loader = DataLoader(prepared, batch_size=case["batch"], shuffle=True,
                            generator=torch.Generator().manual_seed(case["seed"]))  # fmt: skip
        batches = [[x.clone(), y.clone()] for _ in range(3) for x, y in loader]
    except Exception as err:  # noqa: BLE001  (said in words: a DataLoader could not use it)
        raise Mistake(PRELOAD, f"a DataLoader could not read what `preload` returned "
                      f"({type(prepared).__name__}): {type(err).__name__}: {err} "
                      f"({label_preload(case)}).") from None  # fmt: skip
    return {
        "the length of the returned dataset": length,
        "the batches of three shuffled epochs": batches,
        "the decodes (dataset[i] calls) in preload": in_preload,
        "the decodes (dataset[i] calls) after preload returned, over three epochs": (
            source.decoded - in_preload
        ),
    }
