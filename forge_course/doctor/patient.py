"""The patient: a small, seeded three-class problem and a tiny network for the doctor to train.

Everything is sized so that one examination takes milliseconds on a CPU, and so that each bug has
somewhere to show: Dropout makes train and eval mode give different outputs, the classifier is a
separate `head` that a loop can replace, and an epoch has a prime number of batches (7), so every
accumulation factor from 2 to 6 leaves a partial group at its end.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

SEED = 0  # seeds the data, the initial weights, the Dropout masks and the shuffling order
N_FEATURES = 8  # inputs per example
N_CLASSES = 3
HIDDEN = 16  # hidden units
DROPOUT = 0.25  # probability of zeroing a hidden unit in train mode
BATCH_SIZE = 8
N_TRAIN = 52  # 6 batches of 8 and a last one of 4: 7 batches per epoch
N_VAL = 24  # 3 validation batches
LEARNING_RATE = 0.1  # of the plain SGD optimizer handed to the loop


def batches_per_epoch() -> int:
    """Batches the training loader yields per pass."""
    return -(-N_TRAIN // BATCH_SIZE)


class PatientNet(nn.Module):
    """Linear → ReLU → Dropout → Linear, with the last layer kept apart as `head`.

    `forward` looks `head` up on every call, so a loop that swaps in a new head (the transfer
    learning move) really trains with it; that is how a stale optimizer can show.
    """

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(N_FEATURES, HIDDEN), nn.ReLU(), nn.Dropout(DROPOUT))
        self.head = nn.Linear(HIDDEN, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores (logits) of shape (batch, N_CLASSES) for features (batch, N_FEATURES)."""
        return self.head(self.body(x))


def make_datasets(generator: torch.Generator) -> tuple[TensorDataset, TensorDataset]:
    """Train and validation sets drawn around the same three class centres.

    The classes overlap a little (unit noise around centres about 4 apart), so the loss keeps
    falling for a while and a working loop produces ordinary, non-zero gradients.
    """
    centres = 2.0 * torch.randn(N_CLASSES, N_FEATURES, generator=generator)

    def sample(n: int) -> TensorDataset:
        labels = torch.arange(n) % N_CLASSES
        features = centres[labels] + torch.randn(n, N_FEATURES, generator=generator)
        return TensorDataset(features, labels)

    return sample(N_TRAIN), sample(N_VAL)
