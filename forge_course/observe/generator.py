"""Torch's global CPU generator compared by its state's fields, and the change said in words."""

from __future__ import annotations

import numpy as np
import torch

# What `torch.get_rng_state()` holds on the CPU (ATen's CPUGeneratorImplState, 5056 bytes), field
# by field. Only the fields that decide what the generator draws next are compared: the struct's
# padding, the two legacy fields ATen no longer uses (normal_x, normal_rho) and a cached normal
# sample whose flag says it is not valid are not state, so they cannot make a call look as if it
# had drawn numbers.
CPU_GENERATOR_STATE = np.dtype(
    {
        "names": ["seed", "left", "seeded", "next", "engine", "normal_x", "normal_y",
                  "normal_rho", "normal_is_valid", "float_normal", "float_normal_is_valid"],
        "formats": ["<u8", "<i4", "<i4", "<u8", ("<u8", 624), "<f8", "<f8", "<f8", "<i4", "<f4",
                    "u1"],
        "offsets": [0, 8, 12, 16, 24, 5016, 5024, 5032, 5040, 5048, 5052],
        "itemsize": 5056,
    }
)  # fmt: skip
COMPARED = ("seed", "left", "seeded", "next", "engine", "normal_is_valid", "normal_y",
            "float_normal_is_valid", "float_normal")  # fmt: skip
CACHED_IF = {"normal_y": "normal_is_valid", "float_normal": "float_normal_is_valid"}


def generator_state(state: torch.Tensor) -> tuple:
    """The fields of a CPU generator's state that decide what it draws next, from
    `torch.get_rng_state()` (its bytes whole, where their number is not that of the layout)."""
    state = state.numpy().tobytes()
    if len(state) != CPU_GENERATOR_STATE.itemsize:
        return (state,)
    fields = np.frombuffer(state, CPU_GENERATOR_STATE)[0]
    return tuple(
        None if name in CACHED_IF and not fields[CACHED_IF[name]] else fields[name].tolist()
        for name in COMPARED
    )


def generator_change(before: tuple, after: tuple) -> str:
    """How the generator changed between two `generator_state`s, in words."""
    if len(before) == 1 or len(after) == 1:
        return "advanced"
    was, now = dict(zip(COMPARED, before)), dict(zip(COMPARED, after))
    if was["seed"] != now["seed"]:
        return "reseeded (torch.manual_seed or torch.seed)"
    if any(was[name] != now[name] for name in ("left", "next", "engine")):
        return "advanced (numbers drawn from it)"
    return "advanced (its cached normal sample used or made)"
