"""The datasets of chapter 02, against the CSV module, torch's DataLoader and real workers.

Some tests start three workers on purpose; on a two-core machine torch warns about that.
"""

import csv
import pickle
import random
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from forge_course.data import UNK_ID, build_vocabulary, encode, load_reviews, reviews_csv_path
from forge_course.reference.datasets import (
    RandomDraws,
    ReviewsDataset,
    ReviewsStream,
    SlowDataset,
    TracedDataset,
    seed_worker,
)
from forge_course.reference.guard import ReferenceCalled, learner_code
from forge_course.reference.sampling import pad_collate

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

TEXTS, LABELS = load_reviews()
VOCABULARY = build_vocabulary(TEXTS)


@pytest.fixture(scope="module")
def reviews():
    return ReviewsDataset(reviews_csv_path(), VOCABULARY)


def test_every_review_is_its_encoded_text_and_label(reviews):
    assert len(reviews) == len(TEXTS) == 164
    for i, (text, label) in enumerate(zip(TEXTS, LABELS)):
        ids, target = reviews[i]
        torch.testing.assert_close(ids, encode(text, VOCABULARY), rtol=0, atol=0)
        assert target.dtype == torch.int64 and target.shape == () and int(target) == label


def test_indexing_follows_a_list(reviews):
    for i in (-1, -164, 5, 163):
        assert torch.equal(reviews[i][0], reviews[i % len(reviews)][0])
    for i in (164, -165):
        with pytest.raises(IndexError):
            reviews[i]
    # Python's fallback iteration stops at IndexError: list() ends, with every review once.
    assert len(list(reviews)) == 164


def test_quoted_fields_and_unknown_words(tmp_path):
    rows = [["Works, mostly.", 1], ['He said "wow".', 0], ["Line one.\nLine two", 1], ["", 0]]
    path = tmp_path / "tricky.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["text", "label"], *rows])
    dataset = ReviewsDataset(path, {"<pad>": 0, "<unk>": 1, "works": 2, "line": 3})
    assert len(dataset) == 4
    assert dataset[0][0].tolist() == [2, UNK_ID]
    assert dataset[2][0].tolist() == [3, UNK_ID, 3, UNK_ID]
    assert dataset[3][0].tolist() == [] and dataset[3][0].dtype == torch.int64


def test_keeps_no_file_and_survives_pickling(reviews):
    copy = pickle.loads(pickle.dumps(reviews))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(reviews, copy))


def test_loads_through_a_dataloader_with_workers(reviews):
    loader = DataLoader(reviews, batch_size=32, collate_fn=pad_collate, num_workers=2)
    labels = torch.cat([batch["labels"] for batch in loader])
    assert labels.tolist() == LABELS


def test_learner_code_may_not_build_the_reference():
    with learner_code(), pytest.raises(ReferenceCalled, match="ReviewsDataset"):
        ReviewsDataset(reviews_csv_path(), VOCABULARY)


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_a_sharded_stream_yields_every_review_once(workers):
    stream = ReviewsStream(reviews_csv_path(), VOCABULARY, shard=True)
    loader = DataLoader(stream, batch_size=16, num_workers=workers, collate_fn=pad_collate)
    assert sorted(torch.cat([b["labels"] for b in loader]).tolist()) == sorted(LABELS)
    assert sum(len(b["labels"]) for b in loader) == 164


def test_an_unsharded_stream_repeats_itself_in_every_worker():
    stream = ReviewsStream(reviews_csv_path(), VOCABULARY, shard=False)
    loader = DataLoader(stream, batch_size=16, num_workers=2, collate_fn=pad_collate)
    sizes = [len(b["labels"]) for b in loader]
    assert sum(sizes) == 2 * 164 and sizes.count(4) == 2  # 164 = 10 × 16 + 4, per worker


def _draws(dataset, seed, worker_init_fn=None, workers=2):
    loader = DataLoader(dataset, batch_size=2, num_workers=workers, worker_init_fn=worker_init_fn,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    by_worker = {}
    for batch in loader:
        for w, a, b in zip(batch["worker"].tolist(), batch["numpy"].tolist(),
                           batch["python"].tolist()):  # fmt: skip
            by_worker.setdefault(w, []).append((a, b))
    return by_worker


def test_workers_repeat_the_datasets_own_generators():
    draws = _draws(RandomDraws(8, seed=3), seed=0)
    assert draws[0] == draws[1]
    # ... and both repeat what the main process's copy would draw first.
    fresh = RandomDraws(8, seed=3)
    assert [d[0] for d in draws[0]] == [fresh.np_rng.random() for _ in range(4)]


def test_torch_reseeds_the_global_generators_in_each_worker():
    # What PyTorch 1.9 changed: np.random and random differ per worker, and follow the seed.
    draws = _draws(RandomDraws(8, source="global"), seed=0)
    assert all(a != b for a, b in zip(draws[0], draws[1]))
    assert _draws(RandomDraws(8, source="global"), seed=0) == draws


def test_numpy_is_seeded_from_a_hash_of_base_seed_and_worker_id():
    # torch and Python take base_seed + worker_id; NumPy's global generator does not.
    from torch.utils.data._utils.worker import _generate_state

    # One item per worker: its draws are the first from each freshly seeded generator.
    loader = DataLoader(RandomDraws(2, source="global"), batch_size=1, num_workers=2)
    for item in loader:
        worker, seed = item["worker"].item(), item["seed"].item()
        hashed = np.random.RandomState(_generate_state(seed - worker, worker)).random_sample()
        assert item["numpy"].item() == hashed
        assert item["numpy"].item() != np.random.RandomState(seed % 2**32).random_sample()
        assert item["python"].item() == random.Random(seed).random()
    assert RandomDraws(1, source="global")[0]["seed"] == -1  # the main process


def _two_epochs(persistent):
    loader = DataLoader(RandomDraws(8), batch_size=2, num_workers=2, worker_init_fn=seed_worker,
                        persistent_workers=persistent,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    epochs = []
    for _ in range(2):
        by_worker = {}
        for batch in loader:
            for w, seed, draw in zip(batch["worker"].tolist(), batch["seed"].tolist(),
                                     batch["numpy"].tolist()):  # fmt: skip
                by_worker.setdefault(w, (seed, []))[1].append(draw)
        epochs.append(by_worker)
    return epochs


def test_persistent_workers_draw_their_seeds_once_and_run_worker_init_fn_once():
    first, second = _two_epochs(persistent=True)
    for w, (seed, draws) in first.items():
        assert second[w][0] == seed
        # Epoch 2 continues the generator seed_worker made in epoch 1: it did not run again.
        assert draws + second[w][1] == np.random.default_rng(seed).random(8).tolist()
    first, second = _two_epochs(persistent=False)
    for w, (seed, _) in first.items():
        assert second[w][0] != seed
        assert second[w][1] == np.random.default_rng(second[w][0]).random(4).tolist()


class _SlowFirstItem(TracedDataset):
    def __getitem__(self, index):
        if index == 0:
            time.sleep(0.5)
        return super().__getitem__(index)


def test_in_order_false_hands_batches_over_as_they_finish():
    def batches(in_order):
        loader = DataLoader(_SlowFirstItem(14), batch_size=2, num_workers=2, in_order=in_order)
        return [(indices[0].item() // 2, workers[0].item()) for indices, workers in loader]

    # In order: batch k from worker k mod 2, the slow batch 0 holding up the rest.
    assert batches(in_order=True) == [(k, k % 2) for k in range(7)]
    # Out of order: worker 1's batches come first, and it takes on batches meant for worker 0.
    out_of_order = batches(in_order=False)
    assert out_of_order[0] == (1, 1)
    assert sorted(k for k, _ in out_of_order) == list(range(7))
    assert sum(w == 1 for _, w in out_of_order) > 3


def test_seed_worker_gives_distinct_reproducible_streams():
    first = _draws(RandomDraws(12), seed=5, worker_init_fn=seed_worker, workers=3)
    assert len({tuple(v) for v in first.values()}) == 3
    assert _draws(RandomDraws(12), seed=5, worker_init_fn=seed_worker, workers=3) == first
    other = _draws(RandomDraws(12), seed=6, worker_init_fn=seed_worker, workers=3)
    assert all(a != b for w in first for a, b in zip(first[w], other[w]))


def test_seed_worker_seeds_from_the_workers_own_seed():
    class Seeds(TracedDataset):
        def __getitem__(self, index):
            info = torch.utils.data.get_worker_info()
            return info.seed, float(info.dataset.np_rng.random()), info.dataset.py_rng.random()

    dataset = Seeds(2)
    dataset.np_rng, dataset.py_rng = np.random.default_rng(0), random.Random(0)
    loader = DataLoader(dataset, batch_size=1, num_workers=2, worker_init_fn=seed_worker)
    for seed, numpy_draw, python_draw in loader:
        assert numpy_draw.item() == np.random.default_rng(seed.item()).random()
        assert python_draw.item() == random.Random(seed.item()).random()


def test_seed_worker_outside_a_worker_says_so():
    with pytest.raises(RuntimeError, match="inside a DataLoader worker"):
        seed_worker(0)


def test_slow_and_traced_datasets():
    features, labels = torch.arange(12.0).reshape(6, 2), torch.arange(6)
    slow = SlowDataset(features, labels, delay=0.001)
    assert torch.equal(slow[4][0], features[4]) and slow[4][1] == 4
    with pytest.raises(ValueError, match="labels"):
        SlowDataset(features, labels[:3])
    batches = list(DataLoader(TracedDataset(6), batch_size=2, num_workers=2))
    assert [b[1].tolist() for b in batches] == [[0, 0], [1, 1], [0, 0]]
    assert list(TracedDataset(3)) == [(0, -1), (1, -1), (2, -1)]
