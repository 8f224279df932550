"""The course's data: small, made on the spot from a seed, or shipped in the package. No downloads.

- `make_spiral`: two (or more) interleaved spiral arms in 2-D. No straight line separates them,
  so a linear model stays near chance while a small MLP gets nearly all of them right: the
  data set of the training simulator.
- `make_imbalanced`: 900 "dogs" and 100 "cats", two overlapping clouds in 2-D, for the chapter
  on class imbalance and weighted sampling.
- `reviews.csv`: 164 short product reviews written for this course (label 1 positive, 0
  negative), 2 to 29 words long; `load_reviews`, `build_vocabulary` and `encode` turn them into
  the variable-length sequences of token ids that the padding chapter batches.

Every generator takes a ``seed`` and draws from its own ``torch.Generator``: the same seed gives
the same tensors, and the global random state is left untouched.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

__all__ = [
    "make_spiral",
    "train_val_split",
    "make_imbalanced",
    "reviews_csv_path",
    "load_reviews",
    "tokenize",
    "build_vocabulary",
    "encode",
    "PAD_ID",
    "UNK_ID",
]

PAD_ID = 0  # token id of "<pad>": the default pad value of reference.sampling.pad_collate
UNK_ID = 1  # token id of "<unk>": any word the vocabulary has not seen

# How far each arm winds around the centre, in full turns. One turn puts the arms side by side
# at every angle, which is what defeats a linear model.
_SPIRAL_TURNS = 1.0


def _generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def make_spiral(
    n_per_class: int = 200, classes: int = 2, noise: float = 0.2, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Points on interleaved spiral arms, one arm per class.

    Each arm starts at the centre and winds outwards one full turn to radius 1; the arms are
    rotated ``360° / classes`` from each other. Every point's angle is jittered by Gaussian noise,
    so the arms blur near the centre, where they meet.

    Args:
        n_per_class: points on each arm.
        classes: number of arms (and classes), at least 2.
        noise: standard deviation of the angle jitter, in radians. 0.2 keeps the arms apart
            except near the centre.
        seed: seed of the jitter.

    Returns:
        ``X``: ``[classes * n_per_class, 2]`` float32 coordinates, within radius 1;
        ``y``: ``[classes * n_per_class]`` int64 class labels. Rows are grouped by class (all of
        class 0 first), so shuffle before batching, for example with `train_val_split`.
    """
    if n_per_class < 1 or classes < 2:
        raise ValueError(f"Need n_per_class >= 1 and classes >= 2, got {n_per_class}, {classes}.")
    if noise < 0:
        raise ValueError(f"`noise` is a standard deviation and cannot be negative, got {noise}.")
    generator = _generator(seed)
    # Position along the arm, 0 at the centre to 1 at the tip; it is also the radius.
    along = torch.linspace(0.0, 1.0, n_per_class, dtype=torch.float64)
    points, labels = [], []
    for k in range(classes):
        jitter = noise * torch.randn(n_per_class, generator=generator, dtype=torch.float64)
        angle = 2 * math.pi * (_SPIRAL_TURNS * along + k / classes) + jitter
        points.append(torch.stack([along * torch.cos(angle), along * torch.sin(angle)], dim=1))
        labels.append(torch.full((n_per_class,), k, dtype=torch.int64))
    return torch.cat(points).to(torch.float32), torch.cat(labels)


def train_val_split(
    X: torch.Tensor, y: torch.Tensor, val_fraction: float = 0.25, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shuffle the rows once and hold out a fraction of them for validation.

    Args:
        X: ``[N, ...]`` features.
        y: ``[N]`` labels, row for row with ``X``.
        val_fraction: share of the rows held out, strictly between 0 and 1 (rounded to whole
            rows; both parts keep at least one row).
        seed: seed of the shuffle.

    Returns:
        ``(X_train, y_train, X_val, y_val)``; every row lands in exactly one part.
    """
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} rows but y has {len(y)}; they must match row for row.")
    if not 0 < val_fraction < 1:
        raise ValueError(f"`val_fraction` must be between 0 and 1, got {val_fraction}.")
    if len(X) < 2:
        raise ValueError(f"Cannot split {len(X)} rows into two non-empty parts.")
    n_val = min(max(round(len(X) * val_fraction), 1), len(X) - 1)
    order = torch.randperm(len(X), generator=_generator(seed))
    val, train = order[:n_val], order[n_val:]
    return X[train], y[train], X[val], y[val]


def make_imbalanced(
    n_major: int = 900, n_minor: int = 100, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A two-class data set where one class is rare: the course's 900 dogs and 100 cats.

    Dogs (label 0) form a unit Gaussian cloud around ``(-1, 0)``, cats (label 1) one around
    ``(1, 0)``. The clouds overlap, so a classifier trained on the raw counts learns that
    "dog" is the safe guess and misses many cats, which weighted sampling corrects.

    Args:
        n_major: number of dogs (label 0).
        n_minor: number of cats (label 1).
        seed: seed of the point clouds.

    Returns:
        ``X``: ``[n_major + n_minor, 2]`` float32 features; ``y``: int64 labels. All dogs come
        first, so a sequential sampler shows the imbalance at its worst.
    """
    if n_major < 1 or n_minor < 1:
        raise ValueError(f"Both classes need at least one example, got {n_major}, {n_minor}.")
    generator = _generator(seed)
    centres = torch.tensor([[-1.0, 0.0], [1.0, 0.0]])
    y = torch.cat([torch.zeros(n_major, dtype=torch.int64), torch.ones(n_minor, dtype=torch.int64)])
    X = centres[y] + torch.randn(len(y), 2, generator=generator)
    return X, y


def reviews_csv_path() -> Path:
    """The shipped ``reviews.csv`` (columns ``text,label``), installed with the package as data."""
    return Path(__file__).with_name("reviews.csv")


def load_reviews(path: str | Path | None = None) -> tuple[list[str], list[int]]:
    """Read the reviews: their texts and their labels (1 positive, 0 negative), in file order."""
    with open(path or reviews_csv_path(), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [row["text"] for row in rows], [int(row["label"]) for row in rows]


def tokenize(text: str) -> list[str]:
    """Lower-case words: letters, digits and inner apostrophes or hyphens; punctuation dropped."""
    return re.findall(r"[a-z0-9]+(?:['-][a-z0-9]+)*", text.lower())


def build_vocabulary(texts: Iterable[str], min_count: int = 1) -> dict[str, int]:
    """Map every word seen at least ``min_count`` times to an integer id.

    Ids 0 and 1 are reserved for ``"<pad>"`` and ``"<unk>"``; words follow from the most frequent
    down, ties in alphabetical order, so the same texts always give the same ids.
    """
    counts = Counter(word for text in texts for word in tokenize(text))
    kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    vocabulary = {"<pad>": PAD_ID, "<unk>": UNK_ID}
    for word in kept:
        vocabulary[word] = len(vocabulary)
    return vocabulary


def encode(text: str, vocabulary: dict[str, int]) -> torch.Tensor:
    """The text as a ``[length]`` int64 tensor of token ids; unknown words become `UNK_ID`."""
    ids = [vocabulary.get(word, UNK_ID) for word in tokenize(text)]
    return torch.tensor(ids, dtype=torch.int64)
