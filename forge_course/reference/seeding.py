"""Reproducible runs and knowing when to stop: `seed_everything` and `EarlyStopping`.

A training run draws random numbers from several independent generators: Python's ``random``
(often used for data augmentation), NumPy's global generator, and torch's generator on the CPU
and on each GPU (weight initialisation, shuffling, dropout). Seeding one of them leaves the
others free, so `seed_everything` seeds them all.

Seeds alone do not make GPU runs bit-for-bit repeatable: some CUDA kernels add up in an order
that changes from run to run (atomic additions), and cuDNN's benchmark mode may pick a different
algorithm each run. ``deterministic=True`` asks torch for repeatable kernels, and raises an error
where an operation has none, at some cost in speed. On the CPU most kernels are already
deterministic for a fixed number of threads.

Early stopping watches a validation metric and stops training once it has failed to improve for
``patience`` epochs in a row; keep the checkpoint of the best epoch, not the last one.
"""

from __future__ import annotations

import math
import operator
import os
import random

import numpy as np
import torch

from forge_course.reference.guard import reference

__all__ = ["seed_everything", "EarlyStopping"]

# cuBLAS splits large matrix products across a workspace whose layout can vary between runs;
# a fixed workspace configuration makes its reductions repeatable. It is read when a cuBLAS
# handle is created, so it only affects CUDA work that has not started yet.
_CUBLAS_KEY, _CUBLAS_DETERMINISTIC = "CUBLAS_WORKSPACE_CONFIG", ":4096:8"


@reference
def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed every random generator a training run uses, and choose deterministic kernels or not.

    Args:
        seed: a whole number in ``[0, 2**32)`` (NumPy's range).
        deterministic: if True, make torch use only deterministic algorithms, turn cuDNN's
            benchmark off and fix cuBLAS's workspace. If False, undo all of that, so that
            re-running a notebook cell does not leave the session in deterministic mode.

    Notes:
        - ``torch.manual_seed`` seeds the CPU generator and every CUDA (and MPS) device's.
        - ``np.random.seed`` seeds NumPy's *global* generator only. A ``np.random.default_rng()``
          created without a seed is not affected: pass it one.
        - ``PYTHONHASHSEED`` fixes the order of sets of strings in *child* processes started
          later (``DataLoader`` workers that spawn, ``torchrun``); this interpreter's hash seed
          was chosen when it started and cannot change.

    Raises:
        TypeError: if ``seed`` is not a whole number.
        ValueError: if ``seed`` is outside ``[0, 2**32)``.
    """
    seed = operator.index(seed)
    if not 0 <= seed < 2**32:
        raise ValueError(f"`seed` must be in [0, 2**32), got {seed}.")

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)

    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    # Benchmark mode times several algorithms on the first call and keeps the fastest, which
    # can differ between runs. It is off by default in torch; keep it off either way.
    torch.backends.cudnn.benchmark = False
    if deterministic:
        os.environ[_CUBLAS_KEY] = _CUBLAS_DETERMINISTIC
    elif os.environ.get(_CUBLAS_KEY) == _CUBLAS_DETERMINISTIC:
        del os.environ[_CUBLAS_KEY]


@reference
class EarlyStopping:
    """Say when a validation metric has stopped improving.

    Call `step` once per epoch with the epoch's metric; it returns True once ``patience``
    epochs in a row have failed to improve on the best value by more than ``min_delta``.

    Args:
        patience: how many epochs in a row without improvement to tolerate; at least 1.
        min_delta: how much better than the best a value must be to count as an improvement,
            in the metric's own units; at least 0.
        mode: ``"min"`` for a metric that should go down (a loss), ``"max"`` for one that should
            go up (an accuracy).

    Attributes:
        best: the best value so far (``inf`` for ``"min"``, ``-inf`` for ``"max"`` before any).
        best_epoch: the 0-based epoch of ``best``, or None before the first improvement.
        num_bad_epochs: epochs since the last improvement.
        epochs: how many times `step` has been called.

    Raises:
        ValueError: naming the argument, if ``patience``, ``min_delta`` or ``mode`` is invalid.

    Example:
        >>> stopper = EarlyStopping(patience=2)
        >>> [stopper.step(loss) for loss in [1.0, 0.8, 0.9, 0.85]]
        [False, False, False, True]
        >>> stopper.best, stopper.best_epoch
        (0.8, 1)
    """

    def __init__(self, patience: int, min_delta: float = 0.0, mode: str = "min") -> None:
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"`patience` must be a whole number of at least 1, got {patience!r}.")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)):
            raise ValueError(f"`min_delta` must be a number, got {min_delta!r}.")
        if not 0 <= min_delta < math.inf:
            raise ValueError(f"`min_delta` must be finite and at least 0, got {min_delta!r}.")
        if mode not in ("min", "max"):
            raise ValueError(f'`mode` must be "min" or "max", got {mode!r}.')
        self.patience = patience
        self.min_delta = float(min_delta)
        self.mode = mode
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch: int | None = None
        self.num_bad_epochs = 0
        self.epochs = 0

    def _improves(self, value: float) -> bool:
        # A nan compares False with everything, so a nan metric never counts as an improvement.
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def step(self, metric: float) -> bool:
        """Record one epoch's metric (a number or a one-element tensor); True means stop now."""
        value = float(metric)
        if self._improves(value):
            self.best, self.best_epoch, self.num_bad_epochs = value, self.epochs, 0
        else:
            self.num_bad_epochs += 1
        self.epochs += 1
        return self.num_bad_epochs >= self.patience

    def state_dict(self) -> dict[str, float | int | None]:
        """The progress so far, as plain numbers, to store in a checkpoint.

        The settings (``patience``, ``min_delta``, ``mode``) are not included: they come from
        the code that creates the object, as an optimizer's do from the training script.
        """
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "num_bad_epochs": self.num_bad_epochs,
            "epochs": self.epochs,
        }

    def load_state_dict(self, state: dict[str, float | int | None]) -> None:
        """Resume from `state_dict`'s output.

        Raises:
            KeyError: naming the missing entries, if ``state`` lacks any.
        """
        missing = {"best", "best_epoch", "num_bad_epochs", "epochs"} - set(state)
        if missing:
            raise KeyError(f"EarlyStopping state is missing {sorted(missing)}.")
        self.best = float(state["best"])
        self.best_epoch = None if state["best_epoch"] is None else int(state["best_epoch"])
        self.num_bad_epochs = int(state["num_bad_epochs"])
        self.epochs = int(state["epochs"])
