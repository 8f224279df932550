"""Checks for chapter 02, "Datasets and DataLoaders": the grader half.

Exercises:
    ch02_csv_dataset: ``ReviewsDataset(path, vocabulary)``, a map-style dataset over a CSV file.
    ch02_worker_init: ``worker_init_fn(worker_id)``, distinct and reproducible draws per worker.
Questions:
    ch02_q_unseen, ch02_q_worker_batches, ch02_q_workers (`check_number` accepts NumPy numbers).

The learner half, which builds the files and loaders and calls the answer, is
`forge_course.observe.ch02`. An answer that raises comes back from it as ``{FAILED: message}``
(with ``len(dataset)``, if it was read first); ``prepare`` below turns that into a `Mistake`,
with what the error usually means.
"""

from __future__ import annotations

import csv
import random
import re

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from forge_course.data import UNK_ID, encode, load_reviews, reviews_csv_path
from forge_course.grading import core
from forge_course.grading.core import Exercise, Mistake, grading_seed
from forge_course.observe.ch02 import (
    CSV_ID,
    FAILED,
    INIT_ID,
    LENGTH,
    observe_csv_dataset,
    observe_worker_init,
)
from forge_course.reference import datasets as ref


def _failure(observation) -> str | None:
    """The error message an observation is, or None when it is an observation of results."""
    if isinstance(observation, dict) and FAILED in observation:
        return str(observation[FAILED])
    return None


# ---------------------------------------------------------------- ch02_csv_dataset

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


class _Reviews(Dataset):
    """A right dataset, the base of the known wrong ones below (each reads the file the way a
    first attempt often does). Not the reference: a class built on the reference's methods
    trips the guard wherever it runs as an answer, and the tests run these as answers."""

    def __init__(self, path, vocabulary):
        rows = ref._read_rows(path)
        self.token_ids = [encode(row["text"], vocabulary) for row in rows]
        self.labels = [torch.tensor(int(row["label"])) for row in rows]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.token_ids[index], self.labels[index]


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


def _review_count(case: dict) -> int:
    """How many reviews the case's file holds: what ``len(dataset)`` should be."""
    return len(load_reviews()[1]) if case["rows"] is None else len(case["rows"])


def _wrong_length(length: int, case: dict, then: str) -> Mistake:
    """The length named first: an answer that failed later, after counting wrong, most likely
    failed because of it (a DataLoader asks for every index below ``len(dataset)``)."""
    n = _review_count(case)
    message = (
        f"len(dataset) should be {n}, the number of reviews in the file, but it is {length} "
        f"(case: {_label(case)})."
    )
    if length == n + 1:
        message += (
            "\nLikely mistake: `__len__` counts one line too many: the header `text,label` (or "
            "an empty line at the end of the file) is not a review. Return the number of "
            "reviews you read, such as `len(self.labels)`."
        )
    return Mistake(CSV_ID, f"{message}\nThen {then}.")


def _prepare_csv_dataset(observation, target, case: dict):
    """An error of the answer becomes a `Mistake`, with a hint when its text points at a slip,
    or, if the answer got the length wrong before it failed, about the length."""
    text = _failure(observation)
    if text is None:
        return observation
    if "not written yet" in text or "reference" in text:
        raise Mistake(CSV_ID, text)
    length = observation.get(LENGTH)
    if isinstance(length, int) and length != _review_count(case):
        raise _wrong_length(length, case, text)
    for pattern, hint in _CSV_EXCEPTION_HINTS:
        if re.search(pattern, text):
            raise Mistake(CSV_ID, f"{text} (case: {_label(case)}).\nLikely mistake: {hint}")
    raise Mistake(CSV_ID, f"{text} (case: {_label(case)}).")


CSV_DATASET = Exercise(
    grade_id=CSV_ID,
    function="ReviewsDataset",
    reference=ref.ReviewsDataset,
    cases=csv_dataset_cases,
    observe=observe_csv_dataset,
    label=_label,
    mistakes=CSV_DATASET_MISTAKES,
    hint="work one review through by hand (`encode(text, vocabulary)`, "
    "`torch.tensor(int(label))`), and index as a list does: negative indices count from the "
    "end, and indices past either end raise IndexError.",
    prepare=_prepare_csv_dataset,
)
check_csv_dataset = CSV_DATASET.check


# ---------------------------------------------------------------- ch02_worker_init


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


def _prepare_worker_init(observation, target, case: dict):
    """An error of the answer or of the loader becomes a `Mistake`, with what it usually means."""
    text = _failure(observation)
    if text is None:
        return observation
    if text.startswith("`worker_init_fn` raised") and "2**32" in text:
        text += (
            "\nLikely mistake: `np.random.seed` takes seeds below 2**32, and a worker's seed is "
            "a 64-bit number. Use `np.random.default_rng(seed)` (any size), or `seed % 2**32`."
        )
    elif text.startswith("After `worker_init_fn` ran"):
        text += (
            ".\nGive the dataset generators that can draw: `np.random.default_rng(seed)` for "
            "`np_rng` and `random.Random(seed)` for `py_rng`."
        )
    raise Mistake(INIT_ID, text)


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


def _skips_worker_zero(worker_id):
    info = get_worker_info()
    if worker_id:  # the slip: 0 is false, so worker 0 keeps the generators it was copied with
        info.dataset.np_rng = np.random.default_rng(info.seed)
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
        "the seeds depend on `worker_id` alone: the workers differ, but every run repeats the "
        "same draws whatever the loader's generator (and, unless the workers persist, so does "
        "every epoch). Seed from `get_worker_info().seed` (or `torch.initial_seed()`), which "
        "follows the generator and is drawn anew each time the workers start.",
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
    (
        "worker 0 keeps the generators it was copied with, so its draws do not follow the "
        "loader's generator: every run starts them where the dataset left them (`if worker_id:` "
        "is false for worker 0). Every worker, worker 0 included, needs new `np_rng` and "
        "`py_rng`.",
        _skips_worker_zero,
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
    prepare=_prepare_worker_init,
)
check_worker_init = WORKER_INIT.check

EXERCISES = [CSV_DATASET, WORKER_INIT]


# ---------------------------------------------------------------- questions


def check_number(answer, grade_id: str, expected: float | None = None, **options) -> None:
    """`forge_course.grading.check_number`, for answers computed with NumPy too: a NumPy integer
    or float (``np.int64(4)``, ``np.float32(4.0)``) is the number it holds."""
    __tracebackhide__ = True  # IPython and pytest show the learner's frames, not ours
    if isinstance(answer, np.integer | np.floating):
        answer = answer.item()
    core.check_number(answer, grade_id, expected, **options)
