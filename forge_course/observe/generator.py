"""Torch's global CPU generator compared by its state's fields, and the change said in words."""

from __future__ import annotations

import numpy as np
import torch

# What `torch.get_rng_state()` holds on the CPU (ATen's CPUGeneratorImplState, 5056 bytes), field
# by field: the struct's padding bytes are not part of the generator's state, so they are left
# out of the comparison, and a changed seed is told apart from numbers drawn.
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


def generator_state(state: torch.Tensor) -> tuple:
    """The fields of a CPU generator's state, from `torch.get_rng_state()` (its bytes whole,
    where their number is not that of the layout above)."""
    state = state.numpy().tobytes()
    if len(state) != CPU_GENERATOR_STATE.itemsize:
        return (state,)
    fields = np.frombuffer(state, CPU_GENERATOR_STATE)[0]
    return tuple(np.asarray(fields[name]).tobytes() for name in CPU_GENERATOR_STATE.names)


def generator_change(before: tuple, after: tuple) -> str:
    """How the generator changed between two `generator_state`s, in words."""
    reseeded = len(before) > 1 and before[0] != after[0]
    return "reseeded (torch.manual_seed or torch.seed)" if reseeded else "advanced"
