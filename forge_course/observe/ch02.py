"""Chapter 02's learner half: write each case's file, build loaders, call the answer, report.

An error raised by the learner's code does not end an observation here: it comes back as
``{FAILED: message}``, so that the grader half can add what the error usually means (with
``len(dataset)``, where it was read before: a wrong length is often why a later step failed).
"""

from __future__ import annotations

import copy
import csv
import gc
import io
import math
import multiprocessing
import random
import tempfile
import types
import warnings
from itertools import combinations
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from forge_course.data import build_vocabulary, load_reviews, reviews_csv_path
from forge_course.observe import by_value
from forge_course.observe.common import Mistake, call_answer

FAILED = "failed"  # the key of an observation that is an error message
LENGTH = "len(dataset)"

# Workers that fork inherit the learner's functions and classes as they are; spawned workers
# would have to import them by name, which a notebook's definitions do not allow.
_CONTEXT = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
_TIMEOUT = 60  # seconds a worker may take for one batch before the check gives up


def _failed(grade_id: str, mistake: Mistake) -> dict[str, str]:
    return {FAILED: str(mistake).removeprefix(f"[{grade_id}] ")}


# ---------------------------------------------------------------- ch02_csv_dataset

CSV_ID = "ch02_csv_dataset"


def _open_files(dataset) -> int:
    """How many open file objects the dataset keeps among its attributes."""
    values = list(vars(dataset).values()) if hasattr(dataset, "__dict__") else []
    return sum(isinstance(v, io.IOBase) and not v.closed for v in values)


def _raised(name: str, fn) -> str:
    """The name of the exception ``fn()`` raises, or "nothing" if it returns."""
    try:
        call_answer(CSV_ID, name, fn)
    except Mistake as mistake:
        if isinstance(mistake.__cause__, Exception) and f"`{name}` raised" in str(mistake):
            return type(mistake.__cause__).__name__
        raise  # not an error of the answer's own: the guard, or an unwritten answer
    return "nothing"


def _pair(item):
    # A list [ids, label] is as good as the tuple the spec shows.
    return list(item) if isinstance(item, (tuple, list)) else item


def _items(batch: list) -> list:
    """A ``collate_fn`` that keeps a batch's items as they are (the chapter's items are ragged,
    and a loader of them is what this observation is about, not how to pad them)."""
    return [_pair(item) for item in batch]


def _copied_item(dataset):
    # deepcopy goes through the same __reduce__ machinery as pickle (an open file or a csv
    # reader fails both), without looking the class up by name, which a class defined in a
    # notebook or an isolated grader would not survive.
    try:
        duplicate = copy.deepcopy(dataset)
    except Exception as err:
        return f"copying fails ({type(err).__name__}: {err})"
    return _pair(call_answer(CSV_ID, "dataset[0]", duplicate.__getitem__, 0, case="of a copy"))


def observe_csv_dataset(dataset_class, case: dict) -> dict:
    """Build the dataset on the case's file; what it says about length, items, errors, loading."""
    seen: dict = {}
    try:
        return _observe_csv_dataset(dataset_class, case, seen)
    except Mistake as mistake:
        kept = {LENGTH: seen[LENGTH]} if LENGTH in seen else {}
        return {**_failed(CSV_ID, mistake), **kept}


def _observe_csv_dataset(dataset_class, case: dict, seen: dict) -> dict:
    """Fills ``seen`` as it goes, so that what was seen before an error is still there."""
    with tempfile.TemporaryDirectory() as folder:
        path = reviews_csv_path()
        if case["rows"] is not None:
            path = Path(folder) / "reviews.csv"
            with open(path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerows([["text", "label"], *case["rows"]])
        texts = load_reviews(path if case["vocabulary_from"] == "file" else None)[0]
        vocabulary = build_vocabulary(texts, min_count=case["min_count"])
        # Built through a lambda, so that an answer which *is* the reference class still counts
        # as learner code and trips the guard.
        dataset = call_answer(
            CSV_ID, "ReviewsDataset(path, vocabulary)", lambda: dataset_class(path, vocabulary)
        )
        n = seen[LENGTH] = call_answer(CSV_ID, "len(dataset)", len, dataset)
        for i in case["indices"]:
            item = call_answer(CSV_ID, f"dataset[{i}]", dataset.__getitem__, i)
            seen[f"dataset[{i}]"] = _pair(item)
        seen["the error of dataset[len(dataset)]"] = _raised(
            "dataset[len(dataset)]", lambda: dataset[n]
        )
        seen["the error of dataset[-len(dataset) - 1]"] = _raised(
            "dataset[-len(dataset) - 1]", lambda: dataset[-n - 1]
        )
        seen["open files kept by the dataset"] = _open_files(dataset)
        seen["dataset[0] of a copy made with copy.deepcopy"] = _copied_item(dataset)
        spec = case["loader"]
        workers = spec["num_workers"]
        if _CONTEXT is None and by_value.defined_here(type(dataset)):
            # No fork here (Windows): a spawned worker would import the notebook's class by
            # name, which it cannot. With no worker the batches are the same, and the copy
            # above is what a spawned worker would have received.
            workers = 0
        loader = DataLoader(
            dataset,
            batch_size=spec["batch_size"],
            shuffle=True,
            generator=torch.Generator().manual_seed(spec["seed"]),
            collate_fn=_items,
            num_workers=workers,
            multiprocessing_context=_CONTEXT if workers else None,
            timeout=_TIMEOUT if workers else 0,
        )
        seen["the items of each batch of a shuffled DataLoader"] = call_answer(
            CSV_ID, "iterating a DataLoader over the dataset", list, loader
        )
    return seen


# ---------------------------------------------------------------- ch02_worker_init

INIT_ID = "ch02_worker_init"
_DATASET_SEED = 7  # seed of the dataset's generators in the main process


class _Draws(Dataset):
    """The dataset of the exercise: random augmentation from its own ``np_rng`` and ``py_rng``.

    Each item reports the worker that built it, its two draws, and the errors, if any, of the
    worker's init function and of the draws. An exception raised in a worker would reach the
    check only after the DataLoader waited seconds for the failed worker to stop; an error
    written on the worker's copy of the dataset arrives with the first batch, and the loader
    shuts down as usual.
    """

    init_error = ""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.np_rng = np.random.default_rng(seed)
        self.py_rng = random.Random(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        info = get_worker_info()
        item = {"worker": info.id if info is not None else -1, "init_error": self.init_error}
        try:  # whatever generators the learner left behind
            item["numpy"], item["python"] = float(self.np_rng.random()), float(self.py_rng.random())
            item["item_error"] = ""
        except Exception as err:
            item["numpy"] = item["python"] = math.nan
            error = f"{type(err).__name__}: {err}"
            item["item_error"] = (
                f"After `worker_init_fn` ran, `dataset[{index}]` then raised {error}"
            )
        return item


class _InWorker:
    """The learner's ``worker_init_fn``, its error kept on the worker's copy of the dataset.

    Forked workers inherit it. Spawned ones (Windows: no fork) receive it pickled, and a
    function defined in a notebook cell cannot be imported by name there: it travels by value.
    """

    def __init__(self, fn) -> None:
        self.fn = fn

    def __reduce__(self):
        if isinstance(self.fn, types.FunctionType):
            return _rebuilt, (by_value.pack(self.fn),)
        return _InWorker, (self.fn,)  # a callable object: pickled as it is

    def __call__(self, worker_id: int) -> None:
        try:
            call_answer(INIT_ID, "worker_init_fn", self.fn, worker_id,
                        case="in a DataLoader worker")  # fmt: skip
        except Mistake as mistake:
            get_worker_info().dataset.init_error = str(mistake).removeprefix(f"[{INIT_ID}] ")


def _rebuilt(packed: dict) -> _InWorker:
    return _InWorker(by_value.unpack(packed, packed["unsent"]))


def _draws(fn, case: dict, seed: int, epochs: int) -> list[dict]:
    """Per epoch: which worker built each item, and its NumPy and Python draws, in order."""
    with warnings.catch_warnings():
        # More workers than cores is what one case is about: torch's advice is not needed.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        workers, batch_size = case["num_workers"], 2
        loader = DataLoader(
            _Draws(2 * workers * batch_size, seed=_DATASET_SEED),
            batch_size=batch_size,
            num_workers=workers,
            worker_init_fn=_InWorker(fn),
            generator=torch.Generator().manual_seed(seed),
            persistent_workers=case["persistent_workers"],
            multiprocessing_context=_CONTEXT,
            timeout=_TIMEOUT,
        )
        runs = []
        for _ in range(epochs):
            seen, failed, crashed = {"worker": [], "numpy": [], "python": []}, [], None
            try:
                for batch in loader:
                    for key in seen:
                        seen[key] += batch[key].tolist()
                    failed += [e for e in batch["init_error"] + batch["item_error"] if e]
            except Exception as err:  # the loader itself failed: a timeout, a dead worker
                first = (str(err).strip().splitlines() or [""])[0]
                crashed = Mistake(INIT_ID, f"The DataLoader failed: {type(err).__name__}: {first}")
            if crashed is not None:
                # Collect the failed iterator now, outside the `except` and in this process:
                # left for later, a forked worker of the next loader would inherit it and try
                # to shut down workers that are not its own.
                gc.collect()
                raise crashed
            if failed:
                raise Mistake(INIT_ID, failed[0])
            runs.append(seen)
    return runs


def _streams(epoch: dict, key: str) -> dict[int, list[float]]:
    """Each worker's own draws of one kind, in the order it made them."""
    streams: dict[int, list[float]] = {}
    for worker, value in zip(epoch["worker"], epoch[key]):
        streams.setdefault(worker, []).append(value)
    return streams


def _across_workers(epoch: dict, key: str) -> str:
    streams = list(_streams(epoch, key).values())
    pairs = [(a[: len(b)], b[: len(a)]) for a, b in combinations(streams, 2)]
    if any(a == b for a, b in pairs):
        return "identical"
    if all(x != y for a, b in pairs for x, y in zip(a, b)):
        return "different"
    return "partly identical"


def _repeating(first: dict, later: dict, key: str) -> str:
    """The workers that draw, at some position of their own stream, what they drew before."""
    before, after = _streams(first, key), _streams(later, key)
    same = [w for w in sorted(before) if any(x == y for x, y in zip(before[w], after.get(w, [])))]
    if not same:
        return "none"
    return ("worker " if len(same) == 1 else "workers ") + ", ".join(map(str, same))


def _compare(a: list, b: list) -> str:
    return "identical" if a == b else "different"


def worker_init_verdict(observation: dict) -> dict[str, str]:
    """The properties the exercise asks for, read off each worker's own draws (plain strings)."""
    first = observation["first run"][0]
    again = observation["second run"][0]
    other = observation["run with another seed"][0]
    verdict = {
        "NumPy draws of different workers": _across_workers(first, "numpy"),
        "Python draws of different workers": _across_workers(first, "python"),
        "draws of a second run with the same generator seed": _compare(
            [first["numpy"], first["python"]], [again["numpy"], again["python"]]
        ),
        "workers whose NumPy draws repeat with another generator seed": _repeating(
            first, other, "numpy"
        ),
        "workers whose Python draws repeat with another generator seed": _repeating(
            first, other, "python"
        ),
    }
    for later in observation["first run"][1:2]:
        verdict["workers whose NumPy draws repeat in the next epoch"] = _repeating(
            first, later, "numpy"
        )
        verdict["workers whose Python draws repeat in the next epoch"] = _repeating(
            first, later, "python"
        )
    return verdict


def worker_draws(fn, case: dict) -> dict:
    """Three runs: the case's epochs with its seed, one epoch with it again, one with seed + 1."""
    if not callable(fn):
        kind = type(fn).__name__
        raise Mistake(INIT_ID, f"`worker_init_fn` should be a function, but it is {kind}.")
    seed = case["seed"]
    return {
        "first run": _draws(fn, case, seed, epochs=case["epochs"]),
        "second run": _draws(fn, case, seed, epochs=1),
        "run with another seed": _draws(fn, case, seed + 1, epochs=1),
    }


def observe_worker_init(fn, case: dict) -> dict[str, str]:
    """Run real workers with ``fn`` as ``worker_init_fn``; the properties of their draws."""
    try:
        return worker_init_verdict(worker_draws(fn, case))
    except Mistake as mistake:
        return _failed(INIT_ID, mistake)
