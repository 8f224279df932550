"""Checks for chapter 02, "Datasets and DataLoaders".

Exercises:
    ch02_csv_dataset: ``ReviewsDataset(path, vocabulary)``, a map-style dataset over a CSV file.
    ch02_worker_init: ``worker_init_fn(worker_id)``, distinct and reproducible draws per worker.
Questions:
    ch02_q_unseen, ch02_q_worker_batches, ch02_q_workers.
"""

from __future__ import annotations

import copy
import csv
import gc
import io
import math
import multiprocessing
import random
import re
import tempfile
import warnings
from itertools import combinations
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from forge_course.data import UNK_ID, build_vocabulary, encode, load_reviews, reviews_csv_path
from forge_course.grading.core import Exercise, Mistake, call_answer, grading_seed
from forge_course.reference import datasets as ref
from forge_course.reference.guard import learner_code
from forge_course.reference.sampling import pad_collate

# Workers that fork inherit the learner's functions and classes as they are; spawned workers
# would have to import them by name, which a notebook's definitions do not allow.
_CONTEXT = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
_TIMEOUT = 60  # seconds a worker may take for one batch before the check gives up

# ---------------------------------------------------------------- ch02_csv_dataset

CSV_ID = "ch02_csv_dataset"

# Rows that defeat reading a CSV file by hand: commas and quotes inside a field, a line break
# inside a quoted field, an empty review, capitals, and words the shipped vocabulary lacks.
TRICKY_ROWS = [
    ["Works, mostly.", 1],
    ['He said "wow", then sent it back.', 0],
    ["First line.\nSecond line, same review.", 1],
    ["", 0],
    ["Kettle kettle KETTLE!", 1],
    ["Zebra-striped case; fits well", 1],
    ["Flimsy, noisy, late.", 0],
]


def csv_dataset_cases(thorough: bool = False) -> list[dict]:
    """The shipped file; thorough: a sparse vocabulary, a tricky file, workers, random indices."""
    n = len(load_reviews()[1])
    visible = {
        "rows": None,
        "vocabulary_from": "file",
        "min_count": 1,
        "indices": [0, 1, 6, n - 1, -1, -n],
        "loader": {"batch_size": 16, "seed": 0, "num_workers": 0},
    }
    if not thorough:
        return [visible]
    rng = random.Random(grading_seed())
    return [
        {**visible, "indices": list(range(n))},
        {
            "rows": None,
            "vocabulary_from": "file",
            "min_count": 3,
            "indices": rng.sample(range(-n, n), 24),
            "loader": {"batch_size": 8, "seed": rng.randrange(1000), "num_workers": 2},
        },
        {
            "rows": TRICKY_ROWS,
            "vocabulary_from": "shipped",
            "min_count": 1,
            "indices": list(range(-len(TRICKY_ROWS), len(TRICKY_ROWS))),
            "loader": {"batch_size": 3, "seed": rng.randrange(1000), "num_workers": 0},
        },
    ]


def _label(case: dict) -> str:
    where = "the shipped reviews.csv" if case["rows"] is None else "a small CSV with quoted fields"
    words = "its own words" if case["vocabulary_from"] == "file" else "the shipped reviews' words"
    return f"{where}, vocabulary of {words} with min_count={case['min_count']}"


def _open_files(dataset) -> int:
    """How many open file objects the dataset keeps among its attributes."""
    values = list(vars(dataset).values()) if hasattr(dataset, "__dict__") else []
    return sum(isinstance(v, io.IOBase) and not v.closed for v in values)


def _raised(fn) -> str:
    """The name of the exception ``fn()`` raises, or "nothing" if it returns."""
    try:
        with learner_code():
            fn()
    except Exception as err:
        return type(err).__name__
    return "nothing"


def _copied_item(dataset):
    # deepcopy goes through the same __reduce__ machinery as pickle (an open file or a csv
    # reader fails both), without looking the class up by name, which a class defined in a
    # notebook or an isolated grader would not survive.
    try:
        duplicate = copy.deepcopy(dataset)
    except Exception as err:
        return f"copying fails ({type(err).__name__}: {err})"
    return _pair(call_answer(CSV_ID, "dataset[0]", duplicate.__getitem__, 0, case="of a copy"))


def _pair(item):
    # A list [ids, label] is as good as the tuple the spec shows.
    return list(item) if isinstance(item, (tuple, list)) else item


def observe_csv_dataset(dataset_class, case: dict) -> dict:
    """Build the dataset on the case's file; what it says about length, items, errors, loading.

    An error raised by the learner's code becomes a `Mistake` with a hint when its text points
    at a usual slip (the header read as a review, a line split at commas, an unknown word).
    """
    try:
        return _observe_csv_dataset(dataset_class, case)
    except Mistake as mistake:
        raise _with_hint(mistake, _label(case)) from None


def _observe_csv_dataset(dataset_class, case: dict) -> dict:
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
        n = call_answer(CSV_ID, "len(dataset)", len, dataset)
        seen = {"len(dataset)": n}
        for i in case["indices"]:
            item = call_answer(CSV_ID, f"dataset[{i}]", dataset.__getitem__, i)
            seen[f"dataset[{i}]"] = _pair(item)
        seen["the error of dataset[len(dataset)]"] = _raised(lambda: dataset[n])
        seen["the error of dataset[-len(dataset) - 1]"] = _raised(lambda: dataset[-n - 1])
        seen["open files kept by the dataset"] = _open_files(dataset)
        seen["dataset[0] of a copy made with copy.deepcopy"] = _copied_item(dataset)
        spec = case["loader"]
        loader = DataLoader(
            dataset,
            batch_size=spec["batch_size"],
            shuffle=True,
            generator=torch.Generator().manual_seed(spec["seed"]),
            collate_fn=pad_collate.__wrapped__,  # the reference collate, outside the guard
            num_workers=spec["num_workers"],
            multiprocessing_context=_CONTEXT if spec["num_workers"] else None,
            timeout=_TIMEOUT if spec["num_workers"] else 0,
        )
        seen["batches of a DataLoader with pad_collate"] = call_answer(
            CSV_ID, "iterating a DataLoader over the dataset", list, loader
        )
    return seen


class _Reviews(ref.ReviewsDataset):
    """The reference, built without its guard: what checks compare with, and the base of the
    known wrong datasets below (each reads the file the way a first attempt often does)."""

    __init__ = ref.ReviewsDataset.__init__.__wrapped__


class _SplitOnCommas(_Reviews):
    def __init__(self, path, vocabulary):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()[1:]
        self.token_ids = [encode(line.split(",")[0], vocabulary) for line in lines]
        # The label is the line's last character (a broken line gets 0): it must never crash.
        self.labels = [torch.tensor(int(line[-1]) if line[-1:].isdigit() else 0) for line in lines]


class _SplitOnWhitespace(_Reviews):
    def __init__(self, path, vocabulary):
        rows = ref._read_rows(path)
        self.token_ids = [
            torch.tensor([vocabulary.get(w, UNK_ID) for w in row["text"].lower().split()],
                         dtype=torch.int64)
            for row in rows
        ]  # fmt: skip
        self.labels = [torch.tensor(int(row["label"])) for row in rows]


class _IntLabels(_Reviews):
    def __getitem__(self, index):
        return self.token_ids[index], int(self.labels[index])


class _FloatLabels(_Reviews):
    def __getitem__(self, index):
        return self.token_ids[index], self.labels[index].float()


class _WrapsAround(_Reviews):
    def __getitem__(self, index):
        return super().__getitem__(index % len(self))


class _DictRows(_Reviews):
    def __init__(self, path, vocabulary):
        super().__init__(path, vocabulary)
        self.rows = dict(enumerate(zip(self.token_ids, self.labels)))

    def __getitem__(self, index):
        return self.rows[index + len(self) if index < 0 else index]


class _KeepsFileOpen(_Reviews):
    def __init__(self, path, vocabulary):
        self.file = open(path, newline="", encoding="utf-8")  # noqa: SIM115 (the mistake)
        rows = list(csv.DictReader(self.file))
        self.token_ids = [encode(row["text"], vocabulary) for row in rows]
        self.labels = [torch.tensor(int(row["label"])) for row in rows]


class _ShippedFileOnly(_Reviews):
    def __init__(self, path, vocabulary):
        super().__init__(reviews_csv_path(), vocabulary)


_PAST_THE_END = (
    "an index past the end must raise IndexError, as a list does (a dict raises KeyError; "
    "`index % len` raises nothing): `for review in dataset` and `list(dataset)` stop at that "
    "IndexError, and without it they fail or never end."
)

CSV_DATASET_MISTAKES = [
    (
        "reviews that contain a comma are cut at it: splitting lines on ',' breaks quoted "
        "fields. Read the rows with the csv module (`csv.DictReader`), which understands quotes.",
        _SplitOnCommas,
    ),
    (
        "`text.split()` keeps punctuation and capitals ('it.' is not 'it'), so many words become "
        "<unk>. Split with `tokenize(text)`, or encode with `encode(text, vocabulary)`.",
        _SplitOnWhitespace,
    ),
    (
        "return the label as a tensor, `torch.tensor(label)`: the spec asks for a 0-d int64 "
        "tensor, the type CrossEntropyLoss expects for class indices.",
        _IntLabels,
    ),
    (
        "the label is a float tensor; class labels are int64 (`torch.tensor(int(label))`), "
        "which is what CrossEntropyLoss expects.",
        _FloatLabels,
    ),
    (_PAST_THE_END, _WrapsAround),
    (_PAST_THE_END, _DictRows),
    (
        "the dataset keeps its file open (`open` without `with`). Read inside `with open(...)`: "
        "a kept handle leaks, cannot be copied to spawned workers, and is shared by forked ones.",
        _KeepsFileOpen,
    ),
    (
        "the dataset reads the shipped file whatever `path` it is given: open `path`.",
        _ShippedFileOnly,
    ),
]

# Exceptions whose text points at a usual slip, with what to say about it.
_CSV_EXCEPTION_HINTS = [
    (
        r"for int\(\) with base 10: '\s*label",
        "the first row of the file is the header `text,label`, not a review: skip it, or let "
        "`csv.DictReader` read it as the column names.",
    ),
    (
        r"too many values to unpack|not enough values to unpack",
        "some reviews contain commas (and one a line break) inside quotes: splitting lines by "
        "hand breaks them. Read the rows with the csv module.",
    ),
    (
        r"dataset\[-\d+\]` raised IndexError|raised KeyError: -\d+",
        "negative indices count from the end, as for a list: dataset[-1] is the last review.",
    ),
    (
        r"raised KeyError: '",
        "a word missing from the vocabulary: unknown words map to UNK_ID "
        "(`vocabulary.get(word, UNK_ID)`, or `encode(text, vocabulary)`).",
    ),
    (
        r"closed file",
        "the rows are read after the `with` block closed the file: read them inside it.",
    ),
]


def _with_hint(mistake: Mistake, case: str) -> Mistake:
    text = str(mistake).removeprefix(f"[{CSV_ID}] ")
    if "Likely mistake" in text or "not written yet" in text or "reference" in text:
        return mistake
    for pattern, hint in _CSV_EXCEPTION_HINTS:
        if re.search(pattern, text):
            return Mistake(CSV_ID, f"{text} (case: {case}).\nLikely mistake: {hint}")
    return Mistake(CSV_ID, f"{text} (case: {case}).")


CSV_DATASET = Exercise(
    grade_id=CSV_ID,
    function="ReviewsDataset",
    reference=_Reviews,
    cases=csv_dataset_cases,
    observe=observe_csv_dataset,
    label=_label,
    mistakes=CSV_DATASET_MISTAKES,
    hint="work one review through by hand (`encode(text, vocabulary)`, "
    "`torch.tensor(int(label))`), and index as a list does: negative indices count from the "
    "end, and indices past either end raise IndexError.",
)
check_csv_dataset = CSV_DATASET.check


# ---------------------------------------------------------------- ch02_worker_init

INIT_ID = "ch02_worker_init"
_DATASET_SEED = 7  # seed of the dataset's generators in the main process


def worker_init_cases(thorough: bool = False) -> list[dict]:
    """Two workers, one epoch per run; thorough: two epochs, three workers, persistent workers.

    Every run starts worker processes, which is the slow part, so the visible case starts as few
    as the three properties need (workers differ, a rerun repeats, another seed changes).
    """
    if not thorough:
        return [{"num_workers": 2, "seed": 0, "persistent_workers": False, "epochs": 1}]
    seed = grading_seed()
    return [
        {"num_workers": 2, "seed": seed, "persistent_workers": False, "epochs": 2},
        {"num_workers": 3, "seed": seed + 1, "persistent_workers": True, "epochs": 2},
    ]


class _Probe(ref.RandomDraws):
    """`RandomDraws` whose items also carry the error, if any, of the worker's init function.

    An exception raised in a worker would reach the check only after the DataLoader waited
    seconds for the failed worker to stop; an error written on the worker's copy of the dataset
    arrives with the first batch, and the loader shuts down as usual.
    """

    init_error = ""

    def __getitem__(self, index):
        try:
            item = super().__getitem__(index)
        except Exception as err:  # the generators the learner left behind cannot draw
            failed = f"`dataset[{index}]` then raised {type(err).__name__}: {err}"
            return {"index": index, "worker": -1, "numpy": math.nan, "python": math.nan,
                    "init_error": self.init_error, "item_error": failed}  # fmt: skip
        return {**item, "init_error": self.init_error, "item_error": ""}


def _in_worker(fn):
    """The learner's ``worker_init_fn``, run as learner code, its error kept on the dataset."""

    def init(worker_id):
        try:
            with learner_code():
                fn(worker_id)
        except NotImplementedError:
            error = "NotImplementedError"
        except Exception as err:
            error = f"{type(err).__name__}: {err}"
        else:
            return
        get_worker_info().dataset.init_error = error

    return init


def _init_failure(text: str) -> Mistake:
    if text == "NotImplementedError":
        return Mistake(
            INIT_ID,
            "`worker_init_fn` is not written yet: replace `raise NotImplementedError()` with "
            "your code.",
        )
    if text.startswith("ReferenceCalled: "):
        return Mistake(INIT_ID, text.removeprefix("ReferenceCalled: "))
    message = f"`worker_init_fn` raised {text} inside a DataLoader worker."
    if "2**32" in text:
        message += (
            "\nLikely mistake: `np.random.seed` takes seeds below 2**32, and a worker's seed is "
            "a 64-bit number. Use `np.random.default_rng(seed)` (any size), or `seed % 2**32`."
        )
    return Mistake(INIT_ID, message)


def _loading_failure(text: str) -> Mistake:
    return Mistake(
        INIT_ID,
        f"After `worker_init_fn` ran, {text}. Give the dataset generators that can draw: "
        "`np.random.default_rng(seed)` for `np_rng` and `random.Random(seed)` for `py_rng`.",
    )


def _draws(fn, case: dict, seed: int, epochs: int) -> list[dict]:
    """Per epoch: which worker built each item, and its NumPy and Python draws, by index."""
    with warnings.catch_warnings():
        # More workers than cores is what one case is about: torch's advice is not needed.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        workers, batch_size = case["num_workers"], 2
        loader = DataLoader(
            _Probe(2 * workers * batch_size, seed=_DATASET_SEED),
            batch_size=batch_size,
            num_workers=workers,
            worker_init_fn=_in_worker(fn),
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
                    failed += [_init_failure(e) for e in batch["init_error"] if e]
                    failed += [_loading_failure(e) for e in batch["item_error"] if e]
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
                raise failed[0]
            runs.append(seen)
    return runs


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
    return worker_init_verdict(worker_draws(fn, case))


def _per_worker(epoch: dict, key: str) -> list[list[float]]:
    streams: dict[int, list[float]] = {}
    for worker, value in zip(epoch["worker"], epoch[key]):
        streams.setdefault(worker, []).append(value)
    return list(streams.values())


def _across_workers(epoch: dict, key: str) -> str:
    streams = _per_worker(epoch, key)
    pairs = [(a[: len(b)], b[: len(a)]) for a, b in combinations(streams, 2)]
    if any(a == b for a, b in pairs):
        return "identical"
    if all(x != y for a, b in pairs for x, y in zip(a, b)):
        return "different"
    return "partly identical"


def _compare(a: list, b: list) -> str:
    return "identical" if a == b else "different"


def worker_init_verdict(observation: dict) -> dict[str, str]:
    """The properties the exercise asks for, read off the draws (plain strings)."""
    first = observation["first run"][0]
    again = observation["second run"][0]
    other = observation["run with another seed"][0]
    verdict = {
        "NumPy draws of different workers": _across_workers(first, "numpy"),
        "Python draws of different workers": _across_workers(first, "python"),
        "draws of a second run with the same generator seed": _compare(
            [first["numpy"], first["python"]], [again["numpy"], again["python"]]
        ),
        "NumPy draws with another generator seed": _compare(first["numpy"], other["numpy"]),
        "Python draws with another generator seed": _compare(first["python"], other["python"]),
    }
    for later in observation["first run"][1:2]:
        verdict["NumPy draws in the next epoch"] = _compare(first["numpy"], later["numpy"])
        verdict["Python draws in the next epoch"] = _compare(first["python"], later["python"])
    return verdict


def _seeds_global_generators(worker_id):
    # The fix that blog posts give: it reseeds the module-level generators only.
    np.random.seed(1234 + worker_id)
    random.seed(1234 + worker_id)


def _seeds_from_worker_id(worker_id):
    dataset = get_worker_info().dataset
    dataset.np_rng = np.random.default_rng(worker_id)
    dataset.py_rng = random.Random(worker_id)


def _unseeded(worker_id):
    dataset = get_worker_info().dataset
    dataset.np_rng = np.random.default_rng()
    dataset.py_rng = random.Random()


def _numpy_only(worker_id):
    info = get_worker_info()
    info.dataset.np_rng = np.random.default_rng(info.seed)


def _python_only(worker_id):
    info = get_worker_info()
    info.dataset.py_rng = random.Random(info.seed)


WORKER_INIT_MISTAKES = [
    (
        "the dataset's own generators (`np_rng`, `py_rng`) never get new seeds, so every worker "
        "continues the copy it started with and repeats the others. Seeding the global "
        "`np.random` or `random` does not reach them (and torch already seeds those in each "
        "worker): replace them on `get_worker_info().dataset`.",
        _seeds_global_generators,
    ),
    (
        "the seeds depend on `worker_id` alone: the workers differ, but every run and every "
        "epoch repeats the same draws whatever the loader's generator. Seed from "
        "`get_worker_info().seed` (or `torch.initial_seed()`), which follows the generator and "
        "changes each epoch.",
        _seeds_from_worker_id,
    ),
    (
        "generators made without a seed take fresh entropy from the operating system, so a "
        "rerun with the same generator seed draws other numbers. Seed them from "
        "`get_worker_info().seed`.",
        _unseeded,
    ),
    (
        "only the NumPy generator gets a new seed: the dataset's `py_rng` (a `random.Random`) is "
        "still the copy every worker shares. Seeding the module `random` does not reach it.",
        _numpy_only,
    ),
    (
        "only the Python generator gets a new seed: the dataset's `np_rng` (a NumPy Generator) "
        "is still the copy every worker shares. `np.random.seed` does not reach it.",
        _python_only,
    ),
]


def _worker_init_label(case: dict) -> str:
    persistent = ", persistent workers" if case["persistent_workers"] else ""
    return f"{case['num_workers']} workers, generator seed {case['seed']}{persistent}"


WORKER_INIT = Exercise(
    grade_id=INIT_ID,
    function="worker_init_fn",
    reference=ref.seed_worker.__wrapped__,
    cases=worker_init_cases,
    observe=observe_worker_init,
    label=_worker_init_label,
    mistakes=WORKER_INIT_MISTAKES,
    hint="in each worker, give `get_worker_info().dataset` a new `np_rng` and `py_rng`, both "
    "seeded from `get_worker_info().seed`.",
)
check_worker_init = WORKER_INIT.check

EXERCISES = [CSV_DATASET, WORKER_INIT]
