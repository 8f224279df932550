"""Where a model input came from: the training set, the validation set, or neither.

Which loader yielded last says little about what a forward is doing: a loop may cache its
batches, build its own DataLoader over the datasets, interleave the two loaders or train on
both. So the doctor labels each forward by its input instead. The patient's examples are all
distinct, so every row of an input can be looked up among them:

1. a tensor a given loader yielded is remembered as it is handed out (found by identity, even on
   a device whose values cannot be read, such as ``meta``);
2. otherwise each row's bytes are looked up among the training and validation examples. Moving a
   batch to a device, caching it, concatenating or indexing it keeps the rows' values, so a
   derived tensor is found too.

An input whose rows match nothing (data the loop made up or transformed, a meta tensor whose
values cannot be read) has no source; for the validation checks only, the doctor then falls back
on the loader that yielded last (see `instruments.ForwardRecord.validation`).
"""

from __future__ import annotations

import weakref

import torch

TRAIN, VAL, BOTH = "train", "val", "both"
UNREADABLE = "unreadable"  # the rows could not be read (a meta tensor, integers, a scalar)


class Sources:
    """Looks up which of the patient's datasets a tensor's rows belong to."""

    def __init__(self, train_features: torch.Tensor, val_features: torch.Tensor) -> None:
        self._rows: dict[bytes, str] = {}
        for source, features in ((TRAIN, train_features), (VAL, val_features)):
            for row in _rows(features):
                self._rows[row] = source
        self._yielded: dict[int, tuple[weakref.ref, str]] = {}  # id -> (tensor, source)

    def remember(self, batch, source: str) -> None:
        """Note the tensors of a batch a given loader is handing out."""
        for item in batch if isinstance(batch, list | tuple) else (batch,):
            if isinstance(item, torch.Tensor):
                self._yielded[id(item)] = (weakref.ref(item), source)

    def of(self, tensor: torch.Tensor) -> str | None:
        """TRAIN, VAL, BOTH (rows from each), None (no row is one of the patient's examples) or
        UNREADABLE."""
        known = self._yielded.get(id(tensor))
        if known is not None and known[0]() is tensor:
            return known[1]
        if tensor.device.type == "meta" or not tensor.is_floating_point() or tensor.dim() == 0:
            return UNREADABLE
        found = {self._rows.get(row) for row in _rows(tensor)} - {None}
        if not found:
            return None
        return found.pop() if len(found) == 1 else BOTH


def _rows(features: torch.Tensor) -> list[bytes]:
    """Each row's float32 bytes, the form rows are compared in (a 1-D tensor is one row)."""
    rows = features.detach().reshape(-1, features.shape[-1])
    array = rows.to("cpu", torch.float32).contiguous().numpy()
    return [row.tobytes() for row in array]
