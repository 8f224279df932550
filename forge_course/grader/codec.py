"""Plain data across the process boundary: JSON with tensors spelled out, never pickle.

Unpickling runs code chosen by whoever wrote the bytes, so a submission could take over the
grading process through a pickled result. JSON carries only numbers, strings, lists and dicts;
a tensor travels as its exact type, dtype, shape, device and values. Anything else arrives as
a description that no reference observation equals, so it fails the comparison with a message.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

_TENSOR, _OTHER, _FLOAT, _TUPLE = "__tensor__", "__unsupported__", "__float__", "__tuple__"


def _float(value: float) -> Any:
    # JSON has no NaN or infinities; spell them out so they survive the trip exactly.
    return value if math.isfinite(value) else {_FLOAT: repr(value)}


def to_plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-ready data. Only exact built-in types and exact `torch.Tensor` pass."""
    if depth > 20:
        return {_OTHER: "a structure nested more than 20 levels deep"}
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return _float(value)
    if kind in (list, tuple):
        items = [to_plain(v, depth + 1) for v in value]
        return items if kind is list else {_TUPLE: items}
    if kind is dict and all(type(k) is str for k in value):
        return {k: to_plain(v, depth + 1) for k, v in value.items()}
    if kind is torch.Tensor:
        data = value.detach().cpu()
        if data.dtype == torch.bfloat16:  # every bfloat16 is exactly a float32
            data = data.float()
        values = data.tolist()
        if data.is_floating_point():
            values = _map_floats(values)
        return {
            _TENSOR: {
                "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape),
                "device": str(value.device),
                "values": values,
            }
        }
    return {_OTHER: f"an object of type {kind.__module__}.{kind.__qualname__}"}


def _map_floats(values: Any) -> Any:
    if isinstance(values, list):
        return [_map_floats(v) for v in values]
    return _float(values)


def _unmap_floats(values: Any) -> Any:
    if isinstance(values, list):
        return [_unmap_floats(v) for v in values]
    if isinstance(values, dict):
        return float(values[_FLOAT])
    return values


class Unsupported(str):
    """A value the worker could not send as plain data; its text says what it was."""


def from_plain(data: Any) -> Any:
    """The inverse of `to_plain` (tensors are rebuilt on their device when it exists here)."""
    if isinstance(data, list):
        return [from_plain(v) for v in data]
    if not isinstance(data, dict):
        return data
    if _FLOAT in data and len(data) == 1:
        return float(data[_FLOAT])
    if _TUPLE in data and len(data) == 1:
        return tuple(from_plain(v) for v in data[_TUPLE])
    if _OTHER in data and len(data) == 1:
        return Unsupported(data[_OTHER])
    if _TENSOR in data and len(data) == 1:
        spec = data[_TENSOR]
        dtype = getattr(torch, spec["dtype"])
        values = _unmap_floats(spec["values"])
        build = torch.float32 if dtype == torch.bfloat16 else dtype
        tensor = torch.tensor(values, dtype=build).reshape(spec["shape"]).to(dtype)
        try:
            return tensor.to(spec["device"])
        except (RuntimeError, AssertionError):
            return tensor
    return {k: from_plain(v) for k, v in data.items()}


def dumps(value: Any) -> str:
    return json.dumps(to_plain(value), allow_nan=False)


def loads(text: str) -> Any:
    return from_plain(json.loads(text))
