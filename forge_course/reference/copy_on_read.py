"""Copy-on-read: why forked DataLoader workers grow when a dataset holds many Python objects.

On Linux a DataLoader worker starts by ``fork``: it shares the main process's memory pages and
gets a private copy of a page only when one of the two processes writes to it (copy-on-write).
Reading a NumPy array or a tensor writes nothing, so workers share it for free. Reading a
Python object does write: ``x = self.paths[i]`` adds 1 to the object's reference count, which
lives in the object itself. Every page holding an object a worker reads therefore becomes a
private copy in that worker, and over an epoch a worker copies nearly every object of a list.

`growth_per_worker` measures it: each worker reads its *private* memory (``Private_Clean`` and
``Private_Dirty`` in ``/proc/self/smaps_rollup``: the pages no other process maps) when it
starts and after each batch, and reports the difference. `compare` runs one epoch over the
same paths held as a list of ``str`` and as one NumPy array of bytes. `compare_in_fresh_process`
does it in a new interpreter, so that neither the caller's size nor its memory peak is part of
the measurement (a forked worker starts as large as the process it is forked from).

Only Linux has both ``fork`` and ``/proc``: `measurable` says whether this machine does.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

__all__ = [
    "measurable",
    "private_mib",
    "PathLengths",
    "growth_per_worker",
    "str_slot_bytes",
    "compare",
    "compare_in_fresh_process",
]

SMAPS = "/proc/self/smaps_rollup"


def measurable() -> bool:
    """True where workers can be forked and their memory read from ``/proc`` (Linux)."""
    return "fork" in multiprocessing.get_all_start_methods() and os.path.exists(SMAPS)


def private_mib() -> float:
    """This process's private memory in MiB (its USS): the pages that only it maps."""
    kib = 0
    with open(SMAPS) as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                kib += int(line.split()[1])
    return kib / 1024


class PathLengths(Dataset):
    """Item ``i`` is the length of path ``i``: reading the path is all the work."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> int:
        return len(self.paths[index])


def _note_start(worker_id: int) -> None:  # worker_init_fn: runs in each worker as it starts
    get_worker_info().dataset.start_mib = private_mib()


def _report_growth(items: list[int]) -> tuple[int, float]:  # collate_fn: runs in the worker
    info = get_worker_info()
    return info.id, private_mib() - info.dataset.start_mib


def growth_per_worker(
    paths, num_workers: int = 2, shuffle: bool = True, seed: int = 0
) -> dict[int, float]:
    """MiB of private memory each forked worker gained over one epoch of ``PathLengths(paths)``.

    Returns ``{worker id: growth}``, from each worker's last batch (batches of 4,096 items).
    """
    loader = DataLoader(
        PathLengths(paths),
        batch_size=4096,
        shuffle=shuffle,
        num_workers=num_workers,
        worker_init_fn=_note_start,
        collate_fn=_report_growth,
        multiprocessing_context="fork",  # the effect belongs to fork, whatever the default
        generator=torch.Generator().manual_seed(seed),
    )
    return dict(loader)  # a worker's later report replaces its earlier ones


def str_slot_bytes(text: str) -> int:
    """Bytes a ``str`` occupies: ``sys.getsizeof``, rounded up to Python's 16-byte slots."""
    return -(-sys.getsizeof(text) // 16) * 16


def compare(n_paths: int, num_workers: int = 2, shuffle: bool = True, seed: int = 0) -> dict:
    """One epoch over ``n_paths`` paths held two ways; each worker's growth in MiB.

    Returns ``{"slot": bytes per str, "list of str": {...}, "one NumPy array": {...}}``.
    """
    paths = [f"images/{i:06d}.jpg" for i in range(n_paths)]
    result = {"slot": str_slot_bytes(paths[0])}
    result["list of str"] = growth_per_worker(paths, num_workers, shuffle, seed)
    as_bytes = np.array(paths, dtype=np.bytes_)  # one object: n_paths × 17 bytes in one block
    del paths
    result["one NumPy array"] = growth_per_worker(as_bytes, num_workers, shuffle, seed)
    return result


def compare_in_fresh_process(
    n_paths: int, num_workers: int = 2, shuffle: bool = True, seed: int = 0
) -> dict:
    """`compare`, run in a new interpreter started by spawn (which forks the workers)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(compare, n_paths, num_workers, shuffle, seed).result()
