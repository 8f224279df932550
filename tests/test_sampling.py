"""Tests for forge_course.reference.sampling, each against the torch machinery it stands for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, WeightedRandomSampler

from forge_course.data import build_vocabulary, encode, load_reviews, make_imbalanced
from forge_course.reference.guard import ReferenceCalled, learner_code
from forge_course.reference.sampling import (
    LengthBucketSampler,
    inverse_frequency_weights,
    pad_collate,
    padding_tokens,
    shard_indices,
)

# --- inverse_frequency_weights ------------------------------------------------------------------


def test_weights_are_one_over_class_count():
    _, y = make_imbalanced()
    weights = inverse_frequency_weights(y)
    assert weights.dtype == torch.float64 and weights.shape == (1000,)
    assert torch.equal(weights[:900], torch.full((900,), 1 / 900, dtype=torch.float64))
    assert torch.equal(weights[900:], torch.full((100,), 1 / 100, dtype=torch.float64))
    # Each cat is 9 times as likely as each dog; each class carries the same total weight.
    assert (weights[900] / weights[0]).item() == pytest.approx(9.0, rel=1e-12)
    assert weights[y == 0].sum().item() == pytest.approx(weights[y == 1].sum().item(), rel=1e-12)


@pytest.mark.parametrize(
    "labels",
    [[5, -1, 5, 7], np.array([5, -1, 5, 7]), torch.tensor([5, -1, 5, 7], dtype=torch.int32)],
    ids=["list", "ndarray", "tensor"],
)
def test_weights_accept_lists_arrays_and_tensors_of_any_integers(labels):
    expected = torch.tensor([0.5, 1.0, 0.5, 1.0], dtype=torch.float64)
    assert torch.equal(inverse_frequency_weights(labels), expected)


@pytest.mark.parametrize("labels", [[0.0, 1.0], [[0, 1], [1, 0]], []], ids=["float", "2d", "empty"])
def test_weights_reject_labels_that_are_not_a_1d_integer_sequence(labels):
    with pytest.raises(ValueError, match="labels"):
        inverse_frequency_weights(labels)


def test_weighted_random_sampler_draws_batches_about_half_cats():
    _, y = make_imbalanced()
    draws = 100_000
    generator = torch.Generator().manual_seed(0)
    sampler = WeightedRandomSampler(inverse_frequency_weights(y), draws, generator=generator)
    drawn = torch.tensor(list(sampler))
    cats = (y[drawn] == 1).float().mean().item()
    assert cats == pytest.approx(0.5, abs=0.01)
    # Per example: a cat is drawn about 9 times as often as a dog.
    per_example = torch.bincount(drawn, minlength=1000).double()
    ratio = per_example[900:].mean() / per_example[:900].mean()
    assert ratio.item() == pytest.approx(9.0, rel=0.05)
    # Without the weights the draws follow the 90/10 split, so the check above can fail.
    uniform = torch.tensor(
        list(WeightedRandomSampler(torch.ones(1000), draws, generator=generator))
    )
    assert (y[uniform] == 1).float().mean().item() == pytest.approx(0.1, abs=0.01)


# --- pad_collate --------------------------------------------------------------------------------

token_lists = st.lists(st.lists(st.integers(1, 500), max_size=12), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(sequences=token_lists, pad_value=st.integers(-1, 3), as_tensors=st.booleans())
def test_pad_collate_matches_pad_sequence(sequences, pad_value, as_tensors):
    tensors = [torch.tensor(s, dtype=torch.int64) for s in sequences]
    batch = [(t if as_tensors else s, i % 2) for i, (s, t) in enumerate(zip(sequences, tensors))]
    out = pad_collate(batch, pad_value=pad_value)

    expected = pad_sequence(tensors, batch_first=True, padding_value=pad_value)
    assert torch.equal(out["input_ids"], expected)
    lengths = torch.tensor([len(s) for s in sequences])
    width = expected.shape[1]
    expected_mask = (torch.arange(width) < lengths.unsqueeze(1)).long()
    assert out["attention_mask"].dtype == torch.long
    assert torch.equal(out["attention_mask"], expected_mask)
    assert torch.equal(out["labels"], torch.tensor([i % 2 for i in range(len(sequences))]))


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.float32])
def test_pad_collate_keeps_the_sequences_dtype(dtype):
    batch = [
        (torch.tensor([1, 2, 3], dtype=dtype), 0),
        ([], 1),
        (torch.tensor([4], dtype=dtype), 0),
    ]
    out = pad_collate(batch)
    assert out["input_ids"].dtype == dtype
    assert out["input_ids"].tolist() == [[1, 2, 3], [0, 0, 0], [4, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 0], [1, 0, 0]]


def test_pad_collate_with_only_empty_sequences_gives_width_zero():
    out = pad_collate([([], 0), (torch.tensor([], dtype=torch.int64), 1)])
    assert out["input_ids"].shape == (2, 0) and out["input_ids"].dtype == torch.int64
    assert out["attention_mask"].shape == (2, 0)
    assert out["labels"].tolist() == [0, 1]


def test_pad_collate_explains_bad_batches():
    with pytest.raises(ValueError, match="empty"):
        pad_collate([])
    with pytest.raises(ValueError, match="dtypes"):
        pad_collate([(torch.tensor([1]), 0), (torch.tensor([1.0]), 1)])
    with pytest.raises(ValueError, match="1-D"):
        pad_collate([(torch.ones(2, 2, dtype=torch.long), 0)])


def test_pad_collate_works_as_a_dataloader_collate_fn_on_the_reviews():
    texts, labels = load_reviews()
    vocabulary = build_vocabulary(texts)
    data = [(encode(text, vocabulary), label) for text, label in zip(texts, labels)]
    loader = DataLoader(data, batch_size=16, collate_fn=pad_collate)
    first = next(iter(loader))
    lengths = [len(ids) for ids, _ in data[:16]]
    assert first["input_ids"].shape == (16, max(lengths))
    assert first["attention_mask"].sum(dim=1).tolist() == lengths
    assert first["labels"].tolist() == labels[:16]


# --- shard_indices ------------------------------------------------------------------------------


def test_shard_indices_pads_by_wrapping_around():
    assert shard_indices(10, 1, 3, shuffle=False) == [1, 4, 7, 0]
    assert shard_indices(10, 0, 3, shuffle=False) == [0, 3, 6, 9]
    assert shard_indices(10, 2, 3, shuffle=False) == [2, 5, 8, 1]
    assert shard_indices(10, 1, 3, shuffle=False, drop_last=True) == [1, 4, 7]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    n=st.integers(0, 200),
    world_size=st.integers(1, 8),
    data=st.data(),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 20),
)
def test_shard_indices_match_distributed_sampler(
    n, world_size, data, shuffle, drop_last, seed, epoch
):
    rank = data.draw(st.integers(0, world_size - 1), label="rank")
    sampler = DistributedSampler(
        range(n), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
        drop_last=drop_last,
    )  # fmt: skip
    sampler.set_epoch(epoch)
    assert shard_indices(n, rank, world_size, shuffle, seed, epoch, drop_last) == list(sampler)


def test_shards_cover_the_data_set_and_change_with_the_epoch():
    shards = [shard_indices(100, rank, 4, seed=7, epoch=2) for rank in range(4)]
    assert sorted(i for shard in shards for i in shard) == list(range(100))
    assert shard_indices(100, 0, 4, seed=7, epoch=3) != shards[0]


@pytest.mark.parametrize("rank, world_size", [(3, 3), (-1, 3), (0, 0), (1.0, 3), (True, 3)])
def test_shard_indices_rejects_impossible_ranks(rank, world_size):
    with pytest.raises(ValueError, match="rank|world_size"):
        shard_indices(10, rank, world_size)


# --- LengthBucketSampler and padding_tokens -----------------------------------------------------


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=150),
    batch_size=st.integers(1, 16),
    multiplier=st.integers(1, 6),
    shuffle=st.booleans(),
    epoch=st.integers(0, 5),
)
def test_bucket_sampler_yields_every_index_once_in_len_batches(
    lengths, batch_size, multiplier, shuffle, epoch
):
    sampler = LengthBucketSampler(
        lengths, batch_size, shuffle=shuffle, bucket_size_multiplier=multiplier
    )
    sampler.set_epoch(epoch)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert sum(len(batch) != batch_size for batch in batches) <= 1


def test_bucket_sampler_without_shuffle_and_one_big_chunk_sorts_by_length():
    lengths = [5, 1, 4, 1, 3, 9, 2, 6]
    sampler = LengthBucketSampler(lengths, 3, shuffle=False, bucket_size_multiplier=10)
    assert list(sampler) == [[1, 3, 6], [4, 2, 0], [7, 5]]


def test_bucket_sampler_is_deterministic_and_reshuffles_each_epoch():
    lengths = list(range(50))
    a = LengthBucketSampler(lengths, 4, seed=1, bucket_size_multiplier=3)
    b = LengthBucketSampler(lengths, 4, seed=1, bucket_size_multiplier=3)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    assert list(LengthBucketSampler(lengths, 4, seed=2, bucket_size_multiplier=3)) != first


def test_bucket_multiplier_one_gives_the_batches_of_plain_random_batching():
    lengths = torch.randint(1, 30, (97,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = LengthBucketSampler(lengths, 8, seed=3, bucket_size_multiplier=1)
    sampler.set_epoch(2)
    order = torch.randperm(97, generator=torch.Generator().manual_seed(3 + 2)).tolist()
    random_batches = list(BatchSampler(order, 8, drop_last=False))
    assert {frozenset(b) for b in sampler} == {frozenset(b) for b in random_batches}
    assert padding_tokens(lengths, sampler) == padding_tokens(lengths, random_batches)


def test_bucketing_saves_most_of_the_padding_on_the_reviews():
    texts, _ = load_reviews()
    lengths = [len(text.split()) for text in texts]
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0)).tolist()
    random_padding = padding_tokens(lengths, BatchSampler(order, 8, drop_last=False))
    bucket_padding = padding_tokens(lengths, LengthBucketSampler(lengths, 8))
    assert bucket_padding < random_padding / 4


def test_padding_tokens_by_hand_and_against_the_attention_mask():
    assert padding_tokens([3, 1, 4, 1, 5], [[0, 1], [2, 3, 4]]) == (2 * 3 - 4) + (3 * 5 - 10)
    assert padding_tokens([3, 1], []) == 0

    texts, labels = load_reviews()
    vocabulary = build_vocabulary(texts)
    data = [(encode(text, vocabulary), label) for text, label in zip(texts, labels)]
    lengths = [len(ids) for ids, _ in data]
    sampler = LengthBucketSampler(lengths, 8, bucket_size_multiplier=2)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=pad_collate)
    zeros_in_masks = sum(int((batch["attention_mask"] == 0).sum()) for batch in loader)
    assert padding_tokens(lengths, sampler) == zeros_in_masks


def test_bucket_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        LengthBucketSampler([1, 2], 0)
    with pytest.raises(ValueError, match="bucket_size_multiplier"):
        LengthBucketSampler([1, 2], 1, bucket_size_multiplier=0)
    with pytest.raises(ValueError, match="lengths"):
        LengthBucketSampler([1, -2], 1)


def test_learner_code_may_not_call_the_references():
    with learner_code():
        with pytest.raises(ReferenceCalled):
            shard_indices(10, 0, 2)
        with pytest.raises(ReferenceCalled):
            LengthBucketSampler([1, 2], 1)
