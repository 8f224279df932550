"""Chapter 03's learner half: build each case's labels, batch or shard, call the answer, report."""

from __future__ import annotations

import numbers
from contextlib import contextmanager

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from forge_course.observe.common import Mistake, call_answer
from forge_course.observe.generator import generator_state

# ---------------------------------------------------------------- ch03_inverse_frequency

INVERSE_ID = "ch03_inverse_frequency"


def _labels_input(case: dict):
    labels, kind = case["labels"], case["kind"]
    if kind == "list":
        return list(labels)
    if kind == "NumPy array":
        return np.array(labels, dtype=np.int64)
    return torch.tensor(labels, dtype=getattr(torch, kind.split()[0]))


def label_inverse_frequency(case: dict) -> str:
    article = "an" if case["kind"].startswith("int") else "a"
    return f"{len(case['labels'])} labels, {case['what']}, given as {article} {case['kind']}"


def observe_inverse_frequency(fn, case: dict):
    """What ``fn`` returns for fresh labels of the case's type (a tensor is cloned)."""
    out = call_answer(
        INVERSE_ID, "inverse_frequency_weights", fn, _labels_input(case),
        case=label_inverse_frequency(case),
    )  # fmt: skip
    return out.detach().clone() if isinstance(out, torch.Tensor) else out


# ---------------------------------------------------------------- ch03_shard_indices

SHARD_ID = "ch03_shard_indices"
RNG_KEY = "torch's global random generator"
BAR_KEY = "the check's bar on torch's DistributedSampler"
BAR_HELD = "held while the answer ran"


def label_shard_indices(case: dict) -> str:
    return (
        f"N={case['n']}, world_size={case['world_size']}, shuffle={case['shuffle']}, "
        f"seed={case['seed']}, epoch={case['epoch']}, drop_last={case['drop_last']}"
    )


def _as_int_list(value):
    """Lists of Python ints from lists, tuples, tensors or arrays of integers."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        return value
    plain = []
    for v in value:
        if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point():
            v = v.item()
        plain.append(int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v)
    return plain


def _barred(self):
    raise Mistake(
        SHARD_ID,
        "Your answer iterates torch's own `DistributedSampler`; the exercise asks you to "
        "compute its indices yourself, so this does not score.",
    )


@contextmanager
def _own_code_only():
    """While the answer runs, torch's DistributedSampler refuses to hand out its indices."""
    original = DistributedSampler.__dict__["__iter__"]
    DistributedSampler.__iter__ = _barred
    try:
        yield
    finally:
        DistributedSampler.__iter__ = original


def observe_shard_indices(fn, case: dict) -> dict:
    """Every rank's indices for the case; whether torch's global generator and the check's bar
    on ``DistributedSampler`` were left as they were."""
    state = torch.random.get_rng_state()
    seen, held = {}, True
    try:
        with _own_code_only():
            for rank in range(case["world_size"]):
                out = call_answer(
                    SHARD_ID, "shard_indices", fn, case["n"], rank, case["world_size"],
                    case["shuffle"], case["seed"], case["epoch"], case["drop_last"],
                    case=label_shard_indices(case),
                )  # fmt: skip
                seen[f"rank {rank}'s indices"] = _as_int_list(out)
                held = held and DistributedSampler.__dict__.get("__iter__") is _barred
        left_alone = generator_state(torch.random.get_rng_state()) == generator_state(state)
        seen[RNG_KEY] = "left alone" if left_alone else "reseeded or drawn from"
        seen[BAR_KEY] = BAR_HELD if held else "lifted by the answer"
    finally:
        torch.random.set_rng_state(state)  # the notebook's own random numbers stay as they were
    return seen


# ---------------------------------------------------------------- ch03_pad_collate

COLLATE_ID = "ch03_pad_collate"


def label_pad_collate(case: dict) -> str:
    return f"{case['what']}, {case['dtype']}"


def observe_pad_collate(fn, case: dict):
    """Collate a fresh batch of ``(tensor, int)`` pairs; tensors in the result are cloned."""
    dtype = getattr(torch, case["dtype"])
    batch = [(torch.tensor(s, dtype=dtype), y) for s, y in zip(case["sequences"], case["labels"])]
    options = {} if case["pad_value"] is None else {"pad_value": case["pad_value"]}
    out = call_answer(COLLATE_ID, "pad_collate", fn, batch, **options, case=label_pad_collate(case))
    if isinstance(out, dict):
        return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    return out
