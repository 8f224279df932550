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
    if kind.__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return to_plain(value.item(), depth + 1)  # NumPy's own scalars stand for numbers
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
        if values.get(_FLOAT) not in ("nan", "inf", "-inf"):
            raise ValueError("a malformed special float")
        return float(values[_FLOAT])
    return values


class Unsupported(str):
    """A value the worker could not send as plain data; its text says what it was."""


_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64,
              torch.complex128)
}  # fmt: skip
MAX_DEPTH = 40


def from_plain(data: Any, depth: int = 0) -> Any:
    """The inverse of `to_plain` (tensors are rebuilt on their device when it exists here).

    The data may come from a forged line: anything that is not a well-formed value raises
    ``ValueError``, never something else.
    """
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if isinstance(data, list):
        return [from_plain(v, depth + 1) for v in data]
    if not isinstance(data, dict):
        if data is None or type(data) in (bool, int, float, str):
            return data
        raise ValueError(f"not plain data: {type(data).__name__}")
    if len(data) == 1 and _FLOAT in data:
        if data[_FLOAT] not in ("nan", "inf", "-inf"):
            raise ValueError("a malformed special float")
        return float(data[_FLOAT])
    if len(data) == 1 and _TUPLE in data and isinstance(data[_TUPLE], list):
        return tuple(from_plain(v, depth + 1) for v in data[_TUPLE])
    if len(data) == 1 and _OTHER in data:
        return Unsupported(str(data[_OTHER])[:200])
    if len(data) == 1 and _TENSOR in data:
        return _tensor(data[_TENSOR])
    return {str(k): from_plain(v, depth + 1) for k, v in data.items()}


def _tensor(spec: Any) -> torch.Tensor:
    if not isinstance(spec, dict) or spec.get("dtype") not in _DTYPES:
        raise ValueError("a malformed tensor")
    shape = spec.get("shape")
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise ValueError("a malformed tensor shape")
    dtype = _DTYPES[spec["dtype"]]
    try:
        values = _unmap_floats(spec["values"])
        build = torch.float32 if dtype == torch.bfloat16 else dtype
        tensor = torch.tensor(values, dtype=build).reshape(shape).to(dtype)
    except (TypeError, ValueError, RuntimeError, KeyError, RecursionError) as err:
        raise ValueError(f"a malformed tensor ({type(err).__name__})") from None
    try:
        return tensor.to(str(spec.get("device", "cpu")))
    except (RuntimeError, AssertionError, ValueError):
        return tensor


def dumps(value: Any) -> str:
    return json.dumps(to_plain(value), allow_nan=False)


def loads(text: str) -> Any:
    return from_plain(json.loads(text))
