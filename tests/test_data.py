"""Tests for forge_course.data.synthetic: shapes, determinism, difficulty, the shipped reviews."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from forge_course.data import (
    PAD_ID,
    UNK_ID,
    build_vocabulary,
    encode,
    load_reviews,
    make_imbalanced,
    make_spiral,
    reviews_csv_path,
    tokenize,
    train_val_split,
)

ROOT = Path(__file__).resolve().parents[1]


# --- spiral -------------------------------------------------------------------------------------


def test_spiral_shapes_dtypes_and_balance():
    X, y = make_spiral(n_per_class=50, classes=3)
    assert X.shape == (150, 2) and X.dtype == torch.float32
    assert y.shape == (150,) and y.dtype == torch.int64
    assert y.bincount().tolist() == [50, 50, 50]
    # Radius grows to 1 along each arm; the jitter is in the angle only.
    assert X.norm(dim=1).max().item() == pytest.approx(1.0, abs=1e-6)


def test_spiral_is_deterministic_under_its_seed_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    X1, y1 = make_spiral(seed=3)
    X2, y2 = make_spiral(seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(X1, X2) and torch.equal(y1, y2)
    assert not torch.equal(make_spiral(seed=4)[0], X1)


def test_spiral_without_noise_lies_on_the_arms():
    X, _ = make_spiral(n_per_class=5, classes=2, noise=0.0)
    # Arm 1 is arm 0 rotated by half a turn.
    torch.testing.assert_close(X[5:], -X[:5], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kwargs", [{"n_per_class": 0}, {"classes": 1}, {"noise": -0.1}])
def test_spiral_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        make_spiral(**kwargs)


def _val_accuracy(model: torch.nn.Module, steps: int) -> float:
    X_train, y_train, X_val, y_val = train_val_split(*make_spiral())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(X_train), y_train).backward()
        optimizer.step()
    with torch.no_grad():
        return (model(X_val).argmax(dim=1) == y_val).float().mean().item()


@pytest.fixture
def one_thread():
    # These matrices are tiny: a second thread only adds contention, which is severe when other
    # test processes share the two cores (measured: 0.3 s on one thread, up to 15 s on two).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_spiral_defeats_a_linear_model_but_not_a_small_mlp(one_thread):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        linear = _val_accuracy(torch.nn.Linear(2, 2), steps=300)
        mlp = torch.nn.Sequential(
            torch.nn.Linear(2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
            torch.nn.Linear(32, 2),
        )  # fmt: skip
        deep = _val_accuracy(mlp, steps=300)
    assert linear < 0.7
    assert deep >= 0.9


def test_train_val_split_partitions_the_rows():
    X = torch.arange(20.0).unsqueeze(1)
    y = torch.arange(20)
    X_train, y_train, X_val, y_val = train_val_split(X, y, val_fraction=0.25, seed=1)
    assert len(X_val) == 5 and len(X_train) == 15
    assert sorted(torch.cat([y_train, y_val]).tolist()) == list(range(20))
    # Rows stay paired.
    assert torch.equal(X_train[:, 0].long(), y_train)
    again = train_val_split(X, y, val_fraction=0.25, seed=1)
    assert torch.equal(again[3], y_val)
    assert not torch.equal(train_val_split(X, y, val_fraction=0.25, seed=2)[3], y_val)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5])
def test_train_val_split_rejects_fractions_outside_0_1(fraction):
    with pytest.raises(ValueError, match="val_fraction"):
        train_val_split(torch.zeros(4, 2), torch.zeros(4), val_fraction=fraction)


def test_train_val_split_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="row"):
        train_val_split(torch.zeros(4, 2), torch.zeros(3))


# --- imbalanced ---------------------------------------------------------------------------------


def test_imbalanced_has_900_dogs_then_100_cats():
    X, y = make_imbalanced()
    assert X.shape == (1000, 2) and X.dtype == torch.float32
    assert y.dtype == torch.int64
    assert y.bincount().tolist() == [900, 100]
    assert torch.equal(y[:900], torch.zeros(900, dtype=torch.int64))
    # Cats sit to the right of dogs on average.
    assert X[y == 1, 0].mean() > X[y == 0, 0].mean() + 1.0


def test_imbalanced_is_deterministic_under_its_seed():
    assert torch.equal(make_imbalanced(seed=5)[0], make_imbalanced(seed=5)[0])
    assert not torch.equal(make_imbalanced(seed=5)[0], make_imbalanced(seed=6)[0])
    assert make_imbalanced(n_major=30, n_minor=7)[1].bincount().tolist() == [30, 7]


# --- reviews ------------------------------------------------------------------------------------


def test_reviews_csv_is_small_balanced_and_varied():
    texts, labels = load_reviews()
    assert 120 <= len(texts) <= 200
    assert set(labels) == {0, 1}
    assert abs(labels.count(1) - labels.count(0)) <= len(labels) // 10
    assert len(set(texts)) == len(texts), "duplicate reviews"
    words = [len(text.split()) for text in texts]
    assert min(words) >= 2 and max(words) <= 30
    assert max(words) >= 25, "the padding chapter needs some long reviews"


def test_reviews_csv_has_the_documented_header():
    with open(reviews_csv_path(), newline="", encoding="utf-8") as f:
        assert next(csv.reader(f)) == ["text", "label"]


def test_reviews_csv_is_declared_as_package_data():
    tomllib = pytest.importorskip("tomllib")  # the standard library has it from Python 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["forge_course"]
    relative = reviews_csv_path().relative_to(ROOT / "forge_course")
    assert any(relative.match(pattern) for pattern in patterns)


def test_tokenize_lowercases_and_drops_punctuation():
    assert tokenize("Great value, SO-called 'fast' kettle; don't!") == [
        "great", "value", "so-called", "fast", "kettle", "don't",
    ]  # fmt: skip
    assert tokenize("...") == []


def test_vocabulary_reserves_pad_and_unk_and_is_deterministic():
    vocabulary = build_vocabulary(["b a a", "c b a"])
    assert vocabulary == {"<pad>": PAD_ID, "<unk>": UNK_ID, "a": 2, "b": 3, "c": 4}
    assert build_vocabulary(["b a a", "c b a"], min_count=2) == {
        "<pad>": 0, "<unk>": 1, "a": 2, "b": 3,
    }  # fmt: skip


def test_encode_maps_words_to_ids_and_unknowns_to_unk():
    vocabulary = build_vocabulary(["the kettle is great"])
    ids = encode("The kettle is broken.", vocabulary)
    assert ids.dtype == torch.int64
    assert ids.tolist() == [vocabulary["the"], vocabulary["kettle"], vocabulary["is"], UNK_ID]
    assert encode("!!!", vocabulary).shape == (0,)


def test_every_review_encodes_without_unknowns_in_its_own_vocabulary():
    texts, _ = load_reviews()
    vocabulary = build_vocabulary(texts)
    for text in texts:
        ids = encode(text, vocabulary)
        assert len(ids) == len(tokenize(text)) >= 2
        assert PAD_ID not in ids.tolist() and UNK_ID not in ids.tolist()
