"""Datasets for chapter 02: a CSV read the map-style way and the iterable way, and per-worker seeds.

A *map-style* dataset answers two questions, ``len(dataset)`` and ``dataset[i]``; a ``DataLoader``
picks the indices. An *iterable* dataset only knows how to hand out its examples in order, so
when several workers read it, each must be told which share is its own.

- `ReviewsDataset`: the shipped ``reviews.csv`` as a map-style dataset of ``(token_ids, label)``.
- `ReviewsStream`: the same file as an ``IterableDataset``, split between workers (or not).
- `RandomDraws`: a stand-in for a dataset with random augmentation, holding its own NumPy and
  Python generators; it shows which random numbers each worker draws.
- `seed_worker`: a ``worker_init_fn`` that gives each worker's copy of those generators its own
  reproducible seed.
- `SlowDataset` and `TracedDataset`: in-memory rows with a simulated per-item cost, and indices
  labelled with the worker that loaded them, for measuring and tracing a ``DataLoader``.

Workers started with ``spawn`` (the default on macOS and Windows) import the dataset's class by
name, so classes used with ``num_workers > 0`` live in this module rather than in a notebook.
"""

from __future__ import annotations

import csv
import random
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from forge_course.data import encode
from forge_course.reference.guard import reference

__all__ = [
    "ReviewsDataset",
    "ReviewsStream",
    "RandomDraws",
    "seed_worker",
    "SlowDataset",
    "TracedDataset",
]


def _read_rows(path: str | Path) -> list[dict[str, str]]:
    # newline="" lets the csv module see line breaks inside quoted fields; the file is closed
    # when the block ends, so the dataset holds no handle (one that a spawned worker cannot
    # receive, and that forked workers would share, offset and all).
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@reference
class ReviewsDataset(Dataset):
    """The reviews of a ``text,label`` CSV file as ``(token_ids, label)`` pairs.

    The file is read once, in ``__init__``, and closed; every text is encoded there too, so an
    item costs one list lookup. (A data set too large for memory would store file offsets and
    read one row per item instead; the contract stays the same.)

    Args:
        path: a CSV file with a header row ``text,label``; fields may be quoted and contain
            commas, quotes or line breaks.
        vocabulary: word → id, as made by `forge_course.data.build_vocabulary`; words missing
            from it become ``UNK_ID``.

    Indexing works like a list's: ``dataset[-1]`` is the last review, and an index outside
    ``[-len, len)`` raises ``IndexError``, which is also what ends ``for item in dataset``.
    """

    def __init__(self, path: str | Path, vocabulary: dict[str, int]) -> None:
        rows = _read_rows(path)
        self.token_ids = [encode(row["text"], vocabulary) for row in rows]
        self.labels = [torch.tensor(int(row["label"])) for row in rows]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Review ``index``: ``[length]`` int64 token ids and a 0-d int64 label (1 positive)."""
        return self.token_ids[index], self.labels[index]


class ReviewsStream(IterableDataset):
    """The reviews as a stream: read row by row, never indexed, length unknown to the loader.

    Every worker of a ``DataLoader`` runs ``__iter__`` on its own copy of the dataset. Without
    ``shard`` each of them streams the whole file, so every review arrives once per worker.
    With ``shard`` worker ``k`` of ``W`` keeps rows ``k, k + W, k + 2W, ...`` only.

    Args:
        path: a ``text,label`` CSV file.
        vocabulary: word → id, as for `ReviewsDataset`.
        shard: split the rows between workers using ``get_worker_info()``.
    """

    def __init__(self, path: str | Path, vocabulary: dict[str, int], shard: bool = True) -> None:
        self.path, self.vocabulary, self.shard = Path(path), vocabulary, shard

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()  # None in the main process
        worker, workers = (info.id, info.num_workers) if info and self.shard else (0, 1)
        with open(self.path, newline="", encoding="utf-8") as f:
            for row_number, row in enumerate(csv.DictReader(f)):
                if row_number % workers == worker:
                    yield encode(row["text"], self.vocabulary), torch.tensor(int(row["label"]))


def _worker_id() -> int:
    info = get_worker_info()
    return info.id if info is not None else -1


def _worker_seed() -> int:
    info = get_worker_info()
    return info.seed if info is not None else -1


class RandomDraws(Dataset):
    """A stand-in for a dataset with random augmentation: each item reports the numbers it drew.

    A real augmentation would use its draws to crop, flip or drop words; what decides whether
    two workers repeat each other is only where the draws come from, so this dataset returns
    them. Item ``i`` is ``{"index": i, "worker": id, "seed": int, "numpy": float, "python":
    float}``, where ``worker`` is the loading worker's id and ``seed`` its
    ``get_worker_info().seed`` (both -1 in the main process).

    Args:
        n: number of items.
        seed: seed of the dataset's own generators.
        source: ``"own"`` draws from ``self.np_rng`` (a ``numpy.random.Generator``) and
            ``self.py_rng`` (a ``random.Random``), created here and copied into every worker;
            ``"global"`` draws from the module-level ``np.random`` and ``random``, which the
            DataLoader reseeds in each worker (torch 1.9 and later).
    """

    def __init__(self, n: int, seed: int = 0, source: str = "own") -> None:
        if source not in ("own", "global"):
            raise ValueError(f'`source` must be "own" or "global", got {source!r}.')
        self.n, self.source = n, source
        self.np_rng = np.random.default_rng(seed)
        self.py_rng = random.Random(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, int | float]:
        if not -self.n <= index < self.n:
            raise IndexError(f"index {index} is out of range for {self.n} items")
        if self.source == "own":
            numpy_draw, python_draw = self.np_rng.random(), self.py_rng.random()
        else:
            numpy_draw, python_draw = np.random.random(), random.random()
        return {
            "index": index % self.n,
            "worker": _worker_id(),
            "seed": _worker_seed(),
            "numpy": float(numpy_draw),
            "python": python_draw,
        }


@reference
def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` giving each worker's copy of the dataset its own generators.

    A worker starts with a copy of the dataset as it was in the main process, generators
    included, so without this every worker draws the same numbers. ``get_worker_info().seed``
    (equal to ``torch.initial_seed()`` inside the worker) is ``base_seed + worker_id``, where the
    loader draws ``base_seed`` from its ``generator`` (or torch's global generator) each time it
    starts workers: every epoch, or only once with ``persistent_workers=True``, whose workers
    run this function once and keep drawing from the same generators in later epochs. Either
    way the seeds differ between workers and repeat when the loader's generator is seeded the
    same way.

    Args:
        worker_id: this worker's number, ``0 <= worker_id < num_workers``.

    Raises:
        RuntimeError: if called outside a DataLoader worker.
    """
    info = get_worker_info()
    if info is None:
        raise RuntimeError("seed_worker is a worker_init_fn: it runs inside a DataLoader worker.")
    # np.random.default_rng takes the full 64-bit seed (np.random.seed would reject it), and
    # mixes it through a SeedSequence, so neighbouring seeds give unrelated streams.
    info.dataset.np_rng = np.random.default_rng(info.seed)
    info.dataset.py_rng = random.Random(info.seed)


class SlowDataset(Dataset):
    """Rows of in-memory tensors, each item costing ``delay`` seconds of simulated work.

    ``time.sleep`` stands for the part of loading that waits (a disk or network read); it
    does not occupy a core, so workers overlap it even on a busy machine. Decoding that keeps a
    core busy overlaps only as far as free cores allow.

    Args:
        features: ``[N, ...]`` tensor.
        labels: ``[N]`` tensor.
        delay: seconds slept per item; 0 makes this a plain in-memory dataset.
    """

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, delay: float = 0.0) -> None:
        if len(features) != len(labels):
            raise ValueError(f"{len(features)} feature rows but {len(labels)} labels.")
        self.features, self.labels, self.delay = features, labels, delay

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return self.features[index], self.labels[index]


class TracedDataset(Dataset):
    """Item ``i`` is ``(i, id of the worker that loaded it)``, -1 meaning the main process."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int]:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} is out of range for {self.n} items")
        return index, _worker_id()
