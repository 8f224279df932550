"""A data set that decodes every example on every access, as one read from files does.

Chapter 13 profiles a loop whose input pipeline is its bottleneck; this is that pipeline's
data set. It lives with the course's data (not with the references) because the checks' learner
half builds it too.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

__all__ = ["DecodingDataset"]


class DecodingDataset(Dataset):
    """Examples stored as text and decoded on every access, like rows read from a file.

    ``__getitem__`` parses a comma-separated line into a float tensor and waits ``latency_s``
    (a disk or network read). ``decoded`` counts the calls that decode, so a test can see how
    often each example was decoded without timing anything. An index past the end raises
    `IndexError` before it counts: that is how iterating over the data set stops, and it decodes
    nothing.

    Args:
        inputs: float tensor ``[N, F]``; targets: long tensor ``[N]``.
        latency_s: seconds each access waits, standing for a read.
    """

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, latency_s: float = 0.0):
        self.lines = [",".join(repr(v) for v in row.tolist()) for row in inputs]
        self.targets = targets.tolist()
        self.latency_s = latency_s
        self.decoded = 0

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        line, target = self.lines[i], self.targets[i]
        self.decoded += 1
        if self.latency_s:
            time.sleep(self.latency_s)
        x = torch.tensor([float(v) for v in line.split(",")])
        return x, torch.tensor(target)
