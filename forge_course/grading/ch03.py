"""Checks for chapter 03, "Shuffling, samplers and collation": the grader half.

Exercises:
    ch03_inverse_frequency: ``inverse_frequency_weights(labels) -> [N] float64 tensor``.
    ch03_shard_indices: ``shard_indices(dataset_size, rank, world_size, shuffle, seed, epoch,
        drop_last) -> list[int]``, compared with torch's own ``DistributedSampler``.
    ch03_pad_collate: ``pad_collate(batch, pad_value=0) -> {"input_ids", "attention_mask",
        "labels"}``.
Questions (checked in the notebook with `check_number` / `check_choice`):
    ch03_q_duplicates, ch03_q_cat_odds, ch03_q_set_epoch, ch03_q_replacement.

`EXERCISES` lists the records the isolated grader runs. ``ch03_shard_indices`` has two: one
against the reference, and (hidden cases only) one against torch's real ``DistributedSampler``.
The learner half, which builds the inputs and calls the answer, is `forge_course.observe.ch03`.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import torch
from torch.utils.data import DistributedSampler

from forge_course.grading.core import Exercise, grading_seed
from forge_course.observe.ch03 import (
    BAR_HELD,
    BAR_KEY,
    COLLATE_ID,
    INVERSE_ID,
    SHARD_ID,
    label_inverse_frequency,
    label_pad_collate,
    label_shard_indices,
    observe_inverse_frequency,
    observe_pad_collate,
    observe_shard_indices,
)
from forge_course.observe.common import Tampered
from forge_course.reference import sampling as ref

# The oracle iterates torch's DistributedSampler, which the learner half bars while it observes
# (an answer must compute the indices itself): the oracle keeps the method from before any bar.
_SAMPLER_ITER = DistributedSampler.__iter__

# ---------------------------------------------------------------- ch03_inverse_frequency

KINDS = ("list", "NumPy array", "int64 tensor", "int32 tensor")

# The chapter's running example (FACTS.md): 900 dogs (label 0) and 100 cats (label 1).
DOGS_AND_CATS = {
    "labels": [0] * 900 + [1] * 100,
    "kind": "int64 tensor",
    "what": "900 dogs, 100 cats",
}


def _labels_case(rng: random.Random) -> dict:
    classes = rng.sample(range(60), rng.randint(1, 6))  # ids need not be 0..K-1
    n = rng.randint(len(classes), 150)
    labels = classes + [rng.choice(classes) for _ in range(n - len(classes))]
    rng.shuffle(labels)
    return {"labels": labels, "kind": rng.choice(KINDS), "what": f"classes {sorted(classes)}"}


def inverse_frequency_cases(thorough: bool = False) -> list[dict]:
    """The 900/100 example and three classes; thorough: one class, odd ids, every input type."""
    cases = [
        DOGS_AND_CATS,
        {"labels": [1, 2, 0, 2, 1, 2], "kind": "list", "what": "classes 0, 1, 2"},
    ]
    if thorough:
        cases += [
            {"labels": [4] * 5, "kind": "int64 tensor", "what": "a single class"},
            {"labels": [3, 7, 3, 42, 7, 3], "kind": "NumPy array", "what": "class ids 3, 7, 42"},
            {"labels": [1, 0, 1, 1], "kind": "int32 tensor", "what": "classes 0, 1"},
            {"labels": [2], "kind": "list", "what": "one example"},
        ]
        rng = random.Random(grading_seed())
        cases += [_labels_case(rng) for _ in range(8)]
    return cases


def _counts(labels) -> tuple[list[int], Counter]:
    labels = [int(v) for v in torch.as_tensor(labels).tolist()]
    return labels, Counter(labels)


def _frequency(labels):
    labels, counts = _counts(labels)
    return torch.tensor([counts[v] / len(labels) for v in labels], dtype=torch.float64)


def _per_class(labels):
    _, counts = _counts(labels)
    return torch.tensor([1 / counts[c] for c in sorted(counts)], dtype=torch.float64)


def _float32(labels):
    labels, counts = _counts(labels)
    return torch.tensor([1 / counts[v] for v in labels])


def _times_n(labels):
    labels, counts = _counts(labels)
    return torch.tensor([len(labels) / counts[v] for v in labels], dtype=torch.float64)


def _normalised(labels):
    labels, counts = _counts(labels)
    weights = torch.tensor([1 / counts[v] for v in labels], dtype=torch.float64)
    return weights / weights.sum()


def _integer_division(labels):
    labels, counts = _counts(labels)
    return torch.tensor([1 // counts[v] for v in labels])


def _grouped_by_class(labels):
    _, counts = _counts(labels)
    return torch.tensor(
        [1 / counts[c] for c in sorted(counts) for _ in range(counts[c])], dtype=torch.float64
    )


INVERSE_FREQUENCY_MISTAKES = [
    (
        "these weights grow with the class count (count / N), so the common class is drawn even "
        "more often. Inverse frequency is 1 / count: the rarer the class, the larger its weight.",
        _frequency,
    ),
    (
        "one weight per *class* came back, but WeightedRandomSampler needs one weight per "
        "*example*: weights[i] = 1 / (number of examples whose label is labels[i]).",
        _per_class,
    ),
    (
        "the values are right but the dtype is float32: build the tensor with "
        "dtype=torch.float64, the dtype WeightedRandomSampler turns its weights into.",
        _float32,
    ),
    (
        "the weights are N / count. WeightedRandomSampler would not notice a constant factor, "
        "but the exercise asks for exactly 1 / count, so that each class's weights add up to 1.",
        _times_n,
    ),
    (
        "the weights were normalised to add up to 1 over all examples. Leave them as 1 / count: "
        "then they add up to 1 within each class.",
        _normalised,
    ),
    (
        "`1 // count` is integer division, so the weights became 0 (or 1 for a class of one). "
        "Divide as floats: 1 / count.",
        _integer_division,
    ),
    (
        "the weights are grouped class by class instead of following the examples: weights[i] "
        "must belong to labels[i], whatever order the labels come in.",
        _grouped_by_class,
    ),
]


INVERSE_FREQUENCY = Exercise(
    grade_id=INVERSE_ID,
    function="inverse_frequency_weights",
    reference=ref.inverse_frequency_weights.__wrapped__,
    cases=inverse_frequency_cases,
    observe=observe_inverse_frequency,
    label=label_inverse_frequency,
    mistakes=INVERSE_FREQUENCY_MISTAKES,
    hint="weights[i] = 1 / (how many labels equal labels[i]), as a float64 tensor of length N; "
    "count the classes with torch.unique(..., return_counts=True) or a Counter.",
)
check_inverse_frequency = INVERSE_FREQUENCY.check


# ---------------------------------------------------------------- ch03_shard_indices


def _shard_case(n, world_size, shuffle=True, seed=0, epoch=0, drop_last=False) -> dict:
    return {"n": n, "world_size": world_size, "shuffle": shuffle, "seed": seed, "epoch": epoch,
            "drop_last": drop_last}  # fmt: skip


def shard_cases(thorough: bool = False) -> list[dict]:
    """N=10 on 3 ranks: plain, shuffled at epoch 1, drop_last; thorough: edge cases and 30 more."""
    cases = [
        _shard_case(10, 3, shuffle=False),
        _shard_case(10, 3, shuffle=True, seed=0, epoch=1),
        _shard_case(10, 3, shuffle=False, drop_last=True),
    ]
    if thorough:
        cases += [
            _shard_case(2, 5, shuffle=True, seed=3),  # fewer examples than ranks: wrap twice
            _shard_case(2, 5, shuffle=False, drop_last=True),  # ... or nothing at all
            _shard_case(0, 2),
            _shard_case(12, 4, seed=5, epoch=2, drop_last=True),
            _shard_case(7, 1, seed=1, epoch=4),
        ]
        rng = random.Random(grading_seed())
        for _ in range(30):
            cases.append(
                _shard_case(
                    rng.randint(0, 150), rng.randint(1, 8), rng.random() < 0.8,
                    rng.randrange(2**16), rng.randint(0, 20), rng.random() < 0.4,
                )
            )  # fmt: skip
    return cases


def distributed_sampler_indices(
    dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False
) -> list[int]:
    """What torch's own ``DistributedSampler`` hands ``rank`` in ``epoch``: the oracle."""
    sampler = DistributedSampler(
        range(dataset_size), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
        drop_last=drop_last,
    )  # fmt: skip
    sampler.set_epoch(epoch)
    return list(_SAMPLER_ITER(sampler))


def _order(n, shuffle, seed):
    if not shuffle:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def _per_rank(n, world_size, drop_last):
    return n // world_size if drop_last else -(-n // world_size)


def _wrapped(order, total):
    return [order[i % len(order)] for i in range(total)] if order else []


def _no_padding(n, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    order = _order(n, shuffle, seed + epoch)
    if drop_last:
        order = order[: n // world_size * world_size]
    return order[rank::world_size]


def _ignores_epoch(n, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    total = _per_rank(n, world_size, drop_last) * world_size
    return _wrapped(_order(n, shuffle, seed), total)[rank::world_size]


def _blocks(n, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    per_rank = _per_rank(n, world_size, drop_last)
    padded = _wrapped(_order(n, shuffle, seed + epoch), per_rank * world_size)
    return padded[rank * per_rank : (rank + 1) * per_rank]


def _pads_once(n, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    order = _order(n, shuffle, seed + epoch)
    total = _per_rank(n, world_size, drop_last) * world_size
    padded = (order + order[: total - n])[:total]
    return padded[rank:total:world_size]


def _pads_with_last(n, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    order = _order(n, shuffle, seed + epoch)
    total = _per_rank(n, world_size, drop_last) * world_size
    padded = (order + order[-1:] * (total - n))[:total]
    return padded[rank:total:world_size]


def _ignores_drop_last(n, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    total = _per_rank(n, world_size, False) * world_size
    return _wrapped(_order(n, shuffle, seed + epoch), total)[rank::world_size]


def _global_seed(n, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    order = list(range(n))
    if shuffle:
        torch.manual_seed(seed + epoch)
        order = torch.randperm(n).tolist()
    total = _per_rank(n, world_size, drop_last) * world_size
    return _wrapped(order, total)[rank::world_size]


def _python_shuffle(n, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    order = list(range(n))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    total = _per_rank(n, world_size, drop_last) * world_size
    return _wrapped(order, total)[rank::world_size]


SHARD_MISTAKES = [
    (
        "there is no padding. Without drop_last every rank must read ceil(N / world_size) "
        "indices, so DistributedSampler pads the order by wrapping around to its start "
        "(N=10 on 3 ranks: rank 1 reads [1, 4, 7, 0]).",
        _no_padding,
    ),
    (
        "the order ignores `epoch`: seed the generator with seed + epoch. This is what "
        "set_epoch feeds in; without it every epoch repeats the first one's order.",
        _ignores_epoch,
    ),
    (
        "each rank took a contiguous block. DistributedSampler interleaves: rank r reads "
        "positions r, r + world_size, r + 2·world_size, ... of the padded order.",
        _blocks,
    ),
    (
        "the padding wraps around only once. When N is smaller than the padding needed "
        "(fewer examples than ranks) the order must be repeated more than once.",
        _pads_once,
    ),
    (
        "the padding repeats the last index; DistributedSampler pads with the *start* of the "
        "order: padded[i] = order[i mod N].",
        _pads_with_last,
    ),
    (
        "drop_last is ignored: with drop_last=True cut the order to N // world_size · "
        "world_size indices instead of padding it.",
        _ignores_drop_last,
    ),
    (
        "the indices are right, but the answer reseeds torch's *global* generator "
        "(torch.manual_seed), which resets the randomness of everything else in the program "
        "every epoch. Draw from a private torch.Generator().manual_seed(seed + epoch).",
        _global_seed,
    ),
    (
        "the order comes from Python's random module. DistributedSampler draws "
        "torch.randperm(N, generator=g) with g = torch.Generator().manual_seed(seed + epoch); "
        "any other generator gives another order.",
        _python_shuffle,
    ),
]


def _prepare_shard(observation, target, case: dict):
    """An answer that lifted the check's bar on DistributedSampler is not graded."""
    if isinstance(observation, dict) and observation.get(BAR_KEY, BAR_HELD) != BAR_HELD:
        raise Tampered(
            SHARD_ID,
            "Not graded: your answer tampered with the check's instruments (it replaced "
            "`DistributedSampler.__iter__`, which the check bars while your answer runs). "
            "Compute the indices yourself.",
        )
    return observation


SHARD_INDICES = Exercise(
    grade_id=SHARD_ID,
    function="shard_indices",
    reference=ref.shard_indices.__wrapped__,
    cases=shard_cases,
    observe=observe_shard_indices,
    label=label_shard_indices,
    mistakes=SHARD_MISTAKES,
    hint="draw the order (torch.randperm with a generator seeded seed + epoch, or 0..N-1), pad "
    "it by wrapping around (or cut it with drop_last), then take every world_size-th index "
    "starting at rank.",
    prepare=_prepare_shard,
)

# Hidden tests only: the same cases, the expected indices taken from torch's DistributedSampler.
SHARD_INDICES_ON_THE_SAMPLER = dataclasses.replace(
    SHARD_INDICES,
    reference=distributed_sampler_indices,
    cases=lambda thorough: shard_cases(True) if thorough else [],
    label=lambda case: f"{label_shard_indices(case)}; compared with torch's DistributedSampler",
)


def check_shard_indices(shard_indices, thorough: bool = False) -> None:
    """Compare every rank with the reference; with ``thorough``, also with DistributedSampler."""
    SHARD_INDICES.check(shard_indices, thorough)
    SHARD_INDICES_ON_THE_SAMPLER.check(shard_indices, thorough)


# ---------------------------------------------------------------- ch03_pad_collate

# The first three reviews of forge_course.data, encoded with its vocabulary.
THREE_REVIEWS = {
    "sequences": [[165, 6], [117, 445], [2, 156, 268, 139, 3, 2, 76, 203, 319]],
    "labels": [1, 0, 1],
    "dtype": "int64",
    "pad_value": None,
    "what": "the first three reviews, default pad_value",
}


def _collate_case(sequences, labels, dtype="int64", pad_value=None, what="") -> dict:
    return {"sequences": sequences, "labels": labels, "dtype": dtype, "pad_value": pad_value,
            "what": what}  # fmt: skip


def collate_cases(thorough: bool = False) -> list[dict]:
    """Three reviews, a custom pad value, and each case the exercise text names (another integer
    dtype, real tokens equal to pad_value, empty sequences, all empty); thorough: more dtypes,
    a batch of one, random batches."""
    cases = [
        THREE_REVIEWS,
        _collate_case([[4, 5, 6], [7], [8, 9]], [0, 1, 1], pad_value=-1, what="pad_value=-1"),
        _collate_case([[5, 0, 3], [0], [7, 7, 7, 7]], [1, 0, 1], "int32",
                      what="int32 ids, token 0 inside a sequence"),
        _collate_case([[9, 5, 5], [5]], [1, 1], pad_value=5,
                      what="pad_value=5 and real tokens equal to 5"),
        _collate_case([[], [3, 1], []], [0, 1, 0], what="empty sequences"),
        _collate_case([[], []], [1, 0], "int32", what="only empty sequences"),
    ]  # fmt: skip
    if thorough:
        cases += [
            _collate_case([[255, 1], [2]], [0, 1], "uint8", what="uint8 ids"),
            _collate_case([[9, 8, 7]], [1], pad_value=2, what="a batch of one"),
        ]  # fmt: skip
        rng = random.Random(grading_seed())
        for _ in range(6):
            size = rng.randint(1, 8)
            sequences = [
                [rng.randint(0, 20) for _ in range(rng.randint(0, 12))] for _ in range(size)
            ]
            cases.append(
                _collate_case(
                    sequences, [rng.randint(0, 1) for _ in range(size)],
                    rng.choice(["int64", "int32"]), rng.choice([None, 0, -1, 3]),
                    what=f"{size} random sequences",
                )
            )  # fmt: skip
    return cases


def _collate_variant(*, mask="lengths", mask_dtype=torch.long, ids_dtype=None, fill=True,
                     left=False, labels_as_list=False, labels_dtype=torch.long):  # fmt: skip
    def collate(batch, pad_value=0):
        sequences = [s for s, _ in batch]
        width = max(len(s) for s in sequences)
        dtype = ids_dtype or sequences[0].dtype
        ids = torch.full((len(batch), width), pad_value if fill else 0, dtype=dtype)
        lengths = torch.zeros((len(batch), width), dtype=torch.bool)
        for row, s in enumerate(sequences):
            cols = slice(width - len(s), width) if left else slice(0, len(s))
            ids[row, cols] = s.to(dtype)
            lengths[row, cols] = True
        real = {"lengths": lengths, "ids": ids != pad_value, "inverted": ~lengths}[mask]
        labels = [y for _, y in batch]
        label_dtype = dtype if labels_dtype == "ids" else labels_dtype  # "ids": the ids' dtype
        return {
            "input_ids": ids,
            "attention_mask": real.to(mask_dtype),
            "labels": labels if labels_as_list else torch.tensor(labels, dtype=label_dtype),
        }

    return collate


_LABELS_INT64 = (
    "labels should be int64 (torch.long) whatever dtype the token ids have: CrossEntropyLoss "
    "refuses int32 class indices. torch.tensor(labels) makes int64 from Python ints."
)

PAD_COLLATE_MISTAKES = [
    (
        "attention_mask should hold 1s and 0s as torch.long; torch.ones and torch.zeros make "
        "float32 unless you pass dtype=torch.long.",
        _collate_variant(mask_dtype=torch.float32),
    ),
    (
        "attention_mask is bool; the convention (and the reference) is torch.long 1s and 0s: "
        "add .long() or build it with dtype=torch.long.",
        _collate_variant(mask_dtype=torch.bool),
    ),
    (
        "the mask was computed as input_ids != pad_value, which marks a real token that happens "
        "to equal pad_value as padding. Build the mask from each sequence's length.",
        _collate_variant(mask="ids"),
    ),
    (
        "the mask is inverted: 1 marks real tokens, 0 marks padding.",
        _collate_variant(mask="inverted"),
    ),
    (
        "the padding positions hold 0 instead of pad_value: fill with the pad_value argument.",
        _collate_variant(fill=False),
    ),
    (
        "input_ids should keep the sequences' dtype, but it became int64: torch.zeros(..., "
        "dtype=torch.long) or torch.tensor(...) changes it. Use dtype=sequences[0].dtype or "
        "sequences[0].new_full(...).",
        _collate_variant(ids_dtype=torch.int64),
    ),
    (
        "input_ids holds floats: torch.zeros and torch.full without a dtype make float32, and "
        "an embedding layer needs integer ids. Keep the sequences' dtype.",
        _collate_variant(ids_dtype=torch.float32),
    ),
    (
        "the padding went on the left. Pad on the right: real tokens first, then padding (and "
        "the same in the mask).",
        _collate_variant(left=True),
    ),
    (
        "labels should be a tensor of shape [B]: torch.tensor(labels).",
        _collate_variant(labels_as_list=True),
    ),
    (_LABELS_INT64, _collate_variant(labels_dtype=torch.int32)),
    (_LABELS_INT64, _collate_variant(labels_dtype="ids")),
]


PAD_COLLATE = Exercise(
    grade_id=COLLATE_ID,
    function="pad_collate",
    reference=ref.pad_collate.__wrapped__,
    cases=collate_cases,
    observe=observe_pad_collate,
    label=label_pad_collate,
    mistakes=PAD_COLLATE_MISTAKES,
    hint="pad every sequence on the right to the longest in the batch with pad_value; the mask "
    "is 1 on the first len(sequence) positions of each row, 0 after.",
)
check_pad_collate = PAD_COLLATE.check

EXERCISES = [INVERSE_FREQUENCY, SHARD_INDICES, SHARD_INDICES_ON_THE_SAMPLER, PAD_COLLATE]
