"""Checkpoints that resume a run exactly: same batches, same dropout masks, same losses.

Saving the model's weights is the easy third of a checkpoint. Resuming *exactly* also needs the
optimizer's buffers (momentum, Adam's moments), the scheduler's position, the GradScaler's scale,
where the sampler was inside the epoch, the loop's counters, and the state of every random
number generator the run draws from (Python, NumPy, torch on the CPU and on each GPU). Leave one
out and the resumed run still trains, but it is a different run, and nothing tells you.

A checkpoint here is a plain dict of tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(path, weights_only=True)``, the safe default since torch 2.6: loading it cannot run
code hidden in the file. It is written to a temporary file in the target's folder, flushed and
synced to disk, renamed over the target, and then the folder itself is synced, because the rename
is a change to the folder that a power cut could otherwise undo. A crash during a save never
leaves a half-written file under a checkpoint's name.

Naming scheme: ``step-00000120.pt`` for the checkpoint taken after optimizer step 120
(`checkpoint_path`). When a save replaces an existing file, the old one is kept as
``step-00000120.pt.prev``. `latest_checkpoint` looks at both and returns the newest file that
loads. A save killed half-way leaves a hidden ``.step-….tmp`` file, which is ignored and safe to
delete.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from forge_course.reference.guard import reference

__all__ = [
    "CorruptCheckpoint",
    "ResumableSampler",
    "checkpoint_path",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

FORMAT = "forge-course-checkpoint/1"
_NAME = re.compile(r"^step-(\d+)\.pt(\.prev)?$")
_PLAIN = (bool, int, float, str, type(None))


class CorruptCheckpoint(ValueError):
    """A checkpoint file that is truncated, damaged, or not one `save_checkpoint` wrote."""


# --------------------------------------------------------------------------------------------
# The sampler: a shuffled order that can be resumed in the middle of an epoch.


@reference
class ResumableSampler(Sampler[int]):
    """Yield ``range(data_size)`` in a seeded per-epoch order, and resume mid-epoch.

    The order of epoch ``e`` is ``torch.randperm(data_size)`` drawn from a generator seeded with
    ``seed + e``, so it depends only on the seed and the epoch, never on what ran before. Call
    `set_epoch` at the start of every epoch, as with `DistributedSampler`; otherwise each epoch
    repeats the same order.

    ``position`` counts the indices this sampler has *yielded* in the current epoch. With
    ``num_workers=0`` (the default) the DataLoader asks for the indices of a batch only when the
    loop asks for that batch, so after the loop has received ``k`` batches of size ``B`` the
    position is exactly ``k * B``: yielded and consumed agree. With workers the DataLoader reads
    ``prefetch_factor * num_workers`` batches ahead and the position runs ahead of training; then
    the loop must count the examples it has trained on in this epoch and save
    ``sampler.state_dict(consumed=that_count)`` instead.

    After `load_state_dict`, the next iteration starts at the saved position, but only if it is
    for the saved epoch: `set_epoch` with another epoch starts that epoch from the beginning.

    Give the DataLoader its own generator, ``DataLoader(..., generator=torch.Generator())``.
    Each ``iter(loader)`` draws a seed for its workers, even with ``num_workers=0``, from the
    loader's generator or else from torch's global one. A run resumed mid-epoch starts one more
    iteration than the original did, so with the global generator every later dropout mask
    would shift by one draw. (Workers that draw random numbers themselves restart their streams
    on resume; exact resume with them is beyond this sampler.)
    """

    def __init__(self, data_size: int, seed: int = 0, shuffle: bool = True) -> None:
        if data_size < 0:
            raise ValueError(f"data_size must be >= 0, got {data_size}")
        self.data_size = data_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._resume_at: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields."""
        if epoch != self.epoch:
            # A new epoch starts at its beginning, whatever a loaded state said.
            self._resume_at = None
            self.position = 0
        self.epoch = epoch

    def order(self) -> list[int]:
        """The full order of the current epoch (what an uninterrupted epoch yields)."""
        if not self.shuffle:
            return list(range(self.data_size))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.data_size, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        start = self._resume_at or 0
        self._resume_at = None
        self.position = start
        for index in self.order()[start:]:
            # Count before yielding: once the consumer has the index, it is handed out.
            self.position += 1
            yield index

    def __len__(self) -> int:
        return self.data_size - (self._resume_at or 0)

    def state_dict(self, consumed: int | None = None) -> dict[str, int]:
        """Where the run is: ``{"epoch", "position", "seed"}``.

        Args:
            consumed: examples of the current epoch the loop has actually trained on, counted
                from the epoch's start (a resumed epoch starts at the loaded position). Pass it
                when the DataLoader uses workers (see the class docstring); it replaces the
                sampler's own count, which includes batches prefetched but not yet used.
        """
        position = self.position if consumed is None else consumed
        if not 0 <= position <= self.data_size:
            raise ValueError(f"position {position} is outside 0..{self.data_size}")
        return {"epoch": self.epoch, "position": position, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from `state`: the next iteration yields the index after the last one used."""
        if not 0 <= state["position"] <= self.data_size:
            raise ValueError(
                f"saved position {state['position']} does not fit a dataset of "
                f"{self.data_size} examples: was the checkpoint made with another dataset?"
            )
        self.epoch = int(state["epoch"])
        self.seed = int(state["seed"])
        self.position = int(state["position"])
        self._resume_at = self.position


# --------------------------------------------------------------------------------------------
# Random number generators, as plain values that weights_only loading accepts.


def _rng_state() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss_next],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    # Generator states must be CPU byte tensors, whatever map_location moved them to.
    torch.set_rng_state(state["torch"].cpu())
    cuda_states = state["cuda"]
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(cuda_states) != present:
        warnings.warn(
            f"the checkpoint holds RNG states for {len(cuda_states)} CUDA devices, this machine "
            f"has {present}: only the first {min(len(cuda_states), present)} are restored, so "
            "GPU random draws will differ from the original run.",
            stacklevel=4,
        )
    for device, cuda_state in enumerate(cuda_states[:present]):
        torch.cuda.set_rng_state(cuda_state.cpu(), device)


# --------------------------------------------------------------------------------------------
# Integrity: the zip reader does not notice a damaged byte inside tensor data, so a checkpoint
# carries a digest of its own content and loading recomputes it.


def _digest(obj: Any, hasher: Any | None = None) -> str:
    hasher = hasher or hashlib.sha256()
    if isinstance(obj, torch.Tensor):
        data = obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        hasher.update(f"T{obj.dtype}{tuple(obj.shape)}".encode())
        hasher.update(data.numpy())
    elif isinstance(obj, Mapping):
        hasher.update(b"{")
        for key, value in obj.items():
            _digest(key, hasher)
            _digest(value, hasher)
        hasher.update(b"}")
    elif isinstance(obj, (list, tuple)):
        hasher.update(b"[")
        for item in obj:
            _digest(item, hasher)
        hasher.update(b"]")
    else:
        hasher.update(repr((type(obj).__name__, obj)).encode())
    return hasher.hexdigest()


# --------------------------------------------------------------------------------------------
# Saving and loading.


def checkpoint_path(folder: str | os.PathLike, step: int) -> Path:
    """The file name for the checkpoint taken after optimizer step `step`: ``step-00000120.pt``."""
    return Path(folder) / f"step-{step:08d}.pt"


def _fsync_folder(folder: Path) -> None:
    # The rename lives in the folder's entry table: sync it too, or a power cut can undo it.
    # Windows has no way to open a folder for syncing, and needs none for this.
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@reference
def save_checkpoint(
    path: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
    sampler: ResumableSampler | Mapping[str, int] | None = None,
    **counters: bool | int | float | str | None,
) -> Path:
    """Write everything a run needs to continue exactly, atomically, to `path`.

    Args:
        path: the file to write, usually ``checkpoint_path(folder, step)``.
        model, optimizer, scheduler, scaler: saved through their ``state_dict()``.
        sampler: a `ResumableSampler`, or the dict from ``sampler.state_dict(consumed=...)``
            when the DataLoader uses workers.
        **counters: the loop's own numbers (``epoch=3, step=120, best_loss=0.41``), returned by
            `load_checkpoint`. Plain values only, so the file stays loadable with
            ``weights_only=True``.

    Returns:
        The path written.
    """
    path = Path(path)
    for name, value in counters.items():
        if not isinstance(value, _PLAIN):
            # Fail now, not at resume time when the run that wrote it is gone.
            raise TypeError(
                f"counter {name}={value!r} is a {type(value).__name__}; counters must be plain "
                "numbers, strings, booleans or None (use .item() on a tensor)."
            )
    if sampler is not None and not isinstance(sampler, Mapping):
        sampler = sampler.state_dict()
    payload: dict[str, Any] = {
        "format": FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "sampler": None if sampler is None else dict(sampler),
        "counters": counters,
        "rng": _rng_state(),
    }
    payload["digest"] = _digest(payload)

    path.parent.mkdir(parents=True, exist_ok=True)
    # Same folder as the target, so the final rename stays on one file system and is atomic.
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            os.replace(path, path.with_name(path.name + ".prev"))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def _read(path: Path, map_location: Any = None) -> dict[str, Any]:
    """Load and verify a checkpoint file, or raise `CorruptCheckpoint` naming it."""
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:
        # torch's first sentence names the failure; the rest is advice for other cases.
        reason = (str(error).strip().splitlines() or [""])[0].split(". ")[0][:200]
        raise CorruptCheckpoint(
            f"checkpoint {str(path)!r} cannot be read: the file is corrupt or truncated (a save "
            f"that was interrupted?), or it was not written by save_checkpoint. "
            f"torch.load said: {type(error).__name__}: {reason}"
        ) from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CorruptCheckpoint(
            f"{str(path)!r} loads, but it is not a forge_course checkpoint (no {FORMAT!r} tag)."
        )
    stored = payload.pop("digest", None)
    if stored != _digest(payload):
        raise CorruptCheckpoint(
            f"checkpoint {str(path)!r} is corrupt: its content does not match the digest saved "
            "with it, so some bytes changed after it was written."
        )
    return payload


def _restore(name: str, target: Any, state: Any) -> None:
    # Warnings use stacklevel=4 to point past this helper, load_checkpoint and its @reference
    # wrapper, at the line that called load_checkpoint.
    if target is None:
        if state is not None:
            warnings.warn(
                f"the checkpoint holds {name} state but no {name} was passed: it is not "
                f"restored, so the resumed run will not continue the saved {name}.",
                stacklevel=4,
            )
        return
    if state is None:
        raise ValueError(f"a {name} was passed, but the checkpoint was saved without one.")
    target.load_state_dict(state)


@reference
def load_checkpoint(
    path: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
    sampler: ResumableSampler | None = None,
    map_location: Any = None,
) -> dict[str, Any]:
    """Restore a run saved by `save_checkpoint`: states, sampler position and every RNG.

    Load before drawing any random numbers you want to match the original run: the generators
    are restored last, to exactly where they were when the checkpoint was saved.

    Args:
        path: a checkpoint file.
        model, optimizer, scheduler, scaler, sampler: the objects to restore, built the same
            way as in the run that saved (same architecture, same parameter order).
        map_location: passed to `torch.load`, e.g. ``"cpu"`` to read a GPU run's file.

    Returns:
        The counters given to `save_checkpoint`, e.g. ``{"epoch": 3, "step": 120}``.

    Raises:
        CorruptCheckpoint: the file is truncated, damaged or not a checkpoint.
        FileNotFoundError: there is no such file.
    """
    payload = _read(Path(path), map_location)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    _restore("scheduler", scheduler, payload["scheduler"])
    _restore("scaler", scaler, payload["scaler"])
    _restore("sampler", sampler, payload["sampler"])
    _set_rng_state(payload["rng"])
    return dict(payload["counters"])


@reference
def latest_checkpoint(folder: str | os.PathLike) -> Path | None:
    """The checkpoint with the highest step in `folder` that loads, or None if there is none.

    A file that fails to load (truncated by a crash, damaged) is skipped with a warning naming
    it, and the next newest is tried; a ``.prev`` file counts as a fallback for its step.
    """
    candidates = []
    for entry in Path(folder).glob("step-*.pt*"):
        match = _NAME.match(entry.name)
        if match:
            # For equal steps the current file comes before its .prev backup.
            candidates.append((int(match.group(1)), match.group(2) is None, entry))
    for _, _, entry in sorted(candidates, reverse=True):
        try:
            _read(entry, map_location="cpu")
        except CorruptCheckpoint as error:
            warnings.warn(f"skipping {entry}: {error}", stacklevel=3)
            continue
        return entry
    return None
