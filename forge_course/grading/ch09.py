"""Checks for chapter 09, "The production loop": the grader's half.

Exercises:
    ch09_checkpoint: ``save_checkpoint(path, model, optimizer, scheduler, step)`` and
        ``load_checkpoint(path, model, optimizer, scheduler) -> step``, graded as two halves
        (`forge_course.observe.ch09`): what the learner's save writes during a run that is then
        killed, compared entry by entry with what the spec's save writes at the same moment,
        with how each save puts its file at `path` and whether it was synced before, plus a
        save that fails half-way; and the learner's load resuming a killed run with
        fresh objects from another seed, which must reproduce the uninterrupted run bit for
        bit, plus a file with code hidden in it.
    ch09_early_stopping: ``class EarlyStopping(patience, min_delta=0.0, mode="min")``.
Questions:
    ch09_q_steps_lost, ch09_q_weights_only.

The checkpoint format the exercise asks for (smaller than `forge_course.reference.checkpoint`):

    {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
     "scheduler": scheduler.state_dict(), "step": step,
     "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, grading_seed
from forge_course.observe.ch09 import (
    CHECKPOINT,
    STOPPING,
    label_checkpoint,
    label_early_stopping,
    observe_early_stopping,
    observe_load,
    observe_save,
)
from forge_course.reference.guard import reference
from forge_course.reference.seeding import EarlyStopping as _ReferenceStopper

# ---------------------------------------------------------------- the spec's own save and load


def _numpy_state() -> list:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]


@reference
def spec_save_checkpoint(path, model, optimizer, scheduler, step) -> None:
    """Write the exercise's checkpoint atomically: temp file, flush, fsync, rename (the text's
    recipe also syncs the folder after the rename, which only a power cut would show)."""
    path = Path(path)
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": step,
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": _numpy_state(),
        },
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@reference
def spec_load_checkpoint(path, model, optimizer, scheduler) -> int:
    """Restore what `spec_save_checkpoint` wrote; return the saved step."""
    payload = torch.load(path, weights_only=True)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    rng = payload["rng"]
    torch.set_rng_state(rng["torch"].cpu())
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    return int(payload["step"])


def checkpoint_cases(thorough: bool = False) -> list[dict]:
    """Killed mid-run on the CPU; thorough: other seeds and kill points, every device."""
    if not thorough:
        return [{"seed": 0, "steps": 12, "every": 4, "crash_at": 11, "device": "cpu"}]
    seed = grading_seed()
    plans = [(12, 4, 11), (15, 5, 11), (10, 3, 7), (9, 2, 9)]
    return [
        {"seed": seed + 10 * i + j, "steps": s, "every": e, "crash_at": c, "device": str(dev)}
        for i, dev in enumerate(available_devices())
        for j, (s, e, c) in enumerate(plans)
    ]


# ------------------------------------------------ half 1: known wrong saves
# Each forgets one thing, or writes in a way that is not safe.


def _payload(model, optimizer, scheduler, step, **rng):
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": _numpy_state()}
    state.update(rng)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": step,
        "rng": {key: value for key, value in state.items() if value is not None},
    }


def _write_synced(payload, file) -> None:
    torch.save(payload, file)
    file.flush()
    os.fsync(file.fileno())


def _atomic(payload, path):
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            _write_synced(payload, file)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _save_without(key):
    def save(path, model, optimizer, scheduler, step):
        _atomic(_payload(model, optimizer, scheduler, step, **{key: None}), path)

    return save


def _save_numpy_array(path, model, optimizer, scheduler, step):
    _atomic(_payload(model, optimizer, scheduler, step, numpy=list(np.random.get_state())), path)


def _save_in_place(path, model, optimizer, scheduler, step):
    torch.save(_payload(model, optimizer, scheduler, step), path)


def _save_no_cleanup(path, model, optimizer, scheduler, step):
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    with open(tmp, "wb") as file:
        _write_synced(_payload(model, optimizer, scheduler, step), file)
    os.replace(tmp, path)


def _save_tmp_elsewhere(path, model, optimizer, scheduler, step):
    with tempfile.NamedTemporaryFile(suffix=".pt", delete=False) as file:  # tempfile's folder
        try:
            _write_synced(_payload(model, optimizer, scheduler, step), file)
        except BaseException:
            file.close()
            os.unlink(file.name)
            raise
    shutil.move(file.name, path)


def _save_no_optimizer(path, model, optimizer, scheduler, step):
    payload = _payload(model, optimizer, scheduler, step)
    payload["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).state_dict()
    _atomic(payload, path)


def _save_folder_left_open(path, model, optimizer, scheduler, step):
    _atomic(_payload(model, optimizer, scheduler, step), path)
    folder = os.open(Path(path).parent, os.O_RDONLY)
    os.fsync(folder)  # never closed


def _save_copied_into_place(path, model, optimizer, scheduler, step):
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            _write_synced(_payload(model, optimizer, scheduler, step), file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    shutil.copyfile(tmp, path)
    tmp.unlink()


def _save_deleting_first(path, model, optimizer, scheduler, step):
    Path(path).unlink(missing_ok=True)
    _atomic(_payload(model, optimizer, scheduler, step), path)


def _save_swallowing_errors(path, model, optimizer, scheduler, step):
    with contextlib.suppress(Exception):  # the mistake: the caller never hears of a failure
        _atomic(_payload(model, optimizer, scheduler, step), path)


def _save_unsynced(path, model, optimizer, scheduler, step):
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    try:
        torch.save(_payload(model, optimizer, scheduler, step), tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _save_synced_after_the_rename(path, model, optimizer, scheduler, step):
    _save_unsynced(path, model, optimizer, scheduler, step)
    with open(path, "rb") as file:
        os.fsync(file.fileno())


SAVE_MISTAKES = [
    (
        "NumPy's generator is not saved, so a resumed run draws other noise. Save "
        "`np.random.get_state()` with its key array as a list.",
        _save_without("numpy"),
    ),
    (
        "Python's `random` is not saved, so a resumed run draws other augmentation factors. "
        "Save `random.getstate()`.",
        _save_without("python"),
    ),
    (
        "torch's CPU generator is not saved, so a resumed run picks other batches. Save "
        "`torch.get_rng_state()`.",
        _save_without("torch"),
    ),
    (
        "the optimizer's state is missing: without its momentum buffers the first updates "
        "after the resume differ. Save `optimizer.state_dict()`.",
        _save_no_optimizer,
    ),
    (
        "`np.random.get_state()` holds a NumPy array, which `torch.load(..., "
        "weights_only=True)` refuses to unpickle. Store its keys with `.tolist()`.",
        _save_numpy_array,
    ),
    (
        "`torch.save(checkpoint, path)` writes straight into the target, so a save that fails "
        "half-way destroys the previous checkpoint. Write to a temporary file in the same "
        "folder, then `os.replace` it onto `path`.",
        _save_in_place,
    ),
    (
        "a failed save leaves its temporary file behind. Delete it (`tmp.unlink()`) before "
        "re-raising the error, e.g. in `except BaseException:`.",
        _save_no_cleanup,
    ),
    (
        "the temporary file is written outside the checkpoint's folder (`tempfile` puts it in "
        "the system's temporary folder unless told otherwise). A rename is atomic only within "
        "one file system, and a move across two copies the file into place, so a crash "
        "mid-copy leaves half a checkpoint at `path`. Create it next to the target: "
        "`dir=path.parent`, or `path.with_name(path.name + '.tmp')`.",
        _save_tmp_elsewhere,
    ),
    (
        "the folder opened for `os.fsync` is never closed: every save leaves one file "
        "descriptor open, and a long run reaches the process's limit. Close it in a "
        "`finally:` (`os.close(folder)`).",
        _save_folder_left_open,
    ),
    (
        "copying into place is not atomic: `shutil.copyfile(tmp, path)` (or `shutil.copy`) "
        "writes `path` byte by byte, so a crash mid-copy leaves half a checkpoint under its "
        "name. Rename with `os.replace(tmp, path)`, which swaps the name in one step.",
        _save_copied_into_place,
    ),
    (
        "the previous checkpoint is deleted (`os.remove(path)`) before the new one is safe: "
        "a crash in between leaves no checkpoint at all. Do not delete it: `os.replace(tmp, "
        "path)` replaces it in one step.",
        _save_deleting_first,
    ),
    (
        "the error is caught and not raised again (`except Exception: print(...)`), so the "
        "caller carries on as if the checkpoint had been written. Delete the temporary file, "
        "then let the error out: end the `except` block with `raise`.",
        _save_swallowing_errors,
    ),
    (
        "the temporary file is not synced before the rename: the rename can reach the disk "
        "before the bytes do, and a power cut then leaves a correctly named file of zeros. "
        "Inside the `with` block, call `file.flush()` then `os.fsync(file.fileno())`.",
        _save_unsynced,
    ),
    (
        "the file is synced only after `os.replace`: a power cut between the two can leave a "
        "correctly named file of zeros. Sync the temporary file (`file.flush()`, "
        "`os.fsync(file.fileno())`) before the rename.",
        _save_synced_after_the_rename,
    ),
]

CHECKPOINT_SAVE = Exercise(
    grade_id=CHECKPOINT,
    function="save_checkpoint",
    reference=spec_save_checkpoint.__wrapped__,
    cases=checkpoint_cases,
    observe=observe_save,
    label=label_checkpoint,
    mistakes=SAVE_MISTAKES,
    hint="the checkpoint needs every state the next step reads: model, optimizer, scheduler, "
    "step, and the three generators; write it to a temporary file in the same folder, "
    "flush and `os.fsync` it, rename it onto `path` with `os.replace`, and let any error "
    "out.",
)


# ------------------------------------------------ half 2: known wrong loads


def _load_unsafe(path, model, optimizer, scheduler):
    payload = torch.load(path, weights_only=False)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    rng = payload["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return payload["step"]


def _load_without(part):
    def load(path, model, optimizer, scheduler):
        payload = torch.load(path, weights_only=True)
        model.load_state_dict(payload["model"])
        if part != "optimizer":
            optimizer.load_state_dict(payload["optimizer"])
        if part != "scheduler":
            scheduler.load_state_dict(payload["scheduler"])
        rng = payload["rng"]
        if part != "torch":
            torch.set_rng_state(rng["torch"])
        if part != "python":
            random.setstate(rng["python"])
        if part != "numpy":
            kind, keys, pos, has_gauss, cached = rng["numpy"]
            np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        return None if part == "step" else payload["step"]

    return load


LOAD_MISTAKES = [
    (
        "`torch.load(..., weights_only=False)` (or a torch older than 2.6 without the "
        "argument) unpickles anything, and unpickling runs code named in the file. Pass "
        "`weights_only=True`.",
        _load_unsafe,
    ),
    ("the step is not returned: `return checkpoint['step']`.", _load_without("step")),
    (
        "the optimizer is not restored, so its momentum buffers start again from zero and the "
        "updates after the resume differ. Call `optimizer.load_state_dict(...)`.",
        _load_without("optimizer"),
    ),
    (
        "the scheduler is not restored, so the learning rate starts its schedule again. Call "
        "`scheduler.load_state_dict(...)`.",
        _load_without("scheduler"),
    ),
    (
        "NumPy's generator is not restored: `np.random.set_state(...)` with the keys turned "
        "back into a `np.uint32` array.",
        _load_without("numpy"),
    ),
    ("Python's `random` is not restored: `random.setstate(...)`.", _load_without("python")),
    ("torch's CPU generator is not restored: `torch.set_rng_state(...)`.", _load_without("torch")),
]

CHECKPOINT_LOAD = Exercise(
    grade_id=CHECKPOINT,
    function="load_checkpoint",
    reference=spec_load_checkpoint.__wrapped__,
    cases=checkpoint_cases,
    observe=observe_load,
    label=label_checkpoint,
    mistakes=LOAD_MISTAKES,
    hint="restore every entry the save wrote (the generators last, after everything else) and "
    "return the step.",
)


def check_checkpoint(save_fn, load_fn, thorough: bool = False) -> None:
    """Both halves: what the learner's save writes, then the learner's load resuming a run."""
    CHECKPOINT_SAVE.check(save_fn, thorough)
    CHECKPOINT_LOAD.check(load_fn, thorough)


# ---------------------------------------------------------------- ch09_early_stopping

NAN = math.nan


def early_stopping_cases(thorough: bool = False) -> list[dict]:
    """A falling then rising loss, and every case the exercise text names: min_delta edges,
    ties, NaN in both modes, tensors, bad settings; thorough adds a random walk."""
    cases = [
        {
            "patience": 2,
            "min_delta": 0.0,
            "mode": "min",
            "metrics": [1.0, 0.8, 0.9, 0.85, 0.7, 0.75, 0.72],
        },  # fmt: skip
    ]
    cases += [
        {"patience": 1, "min_delta": 0.0, "mode": "min", "metrics": [0.5, 0.5, 0.5]},
        {"patience": 3, "min_delta": 0.0, "mode": "min", "metrics": [0.5, 0.5, 0.4, 0.4, 0.4]},
        {"patience": 2, "min_delta": 0.25, "mode": "min", "metrics": [2.0, 1.75, 1.5, 1.0, 0.9]},
        {"patience": 3, "min_delta": 0.05, "mode": "min", "metrics": [1.0, 0.96, 0.94, 0.9, 0.8]},
        {"patience": 2, "min_delta": 0.0, "mode": "min", "metrics": [NAN, 1.0, NAN, NAN, 0.5]},
        {"patience": 3, "min_delta": 0.0, "mode": "max", "metrics": [NAN, 0.5, NAN, 0.6, NAN]},
        {"patience": 2, "min_delta": 0.0, "mode": "max", "metrics": [0.5, 0.7, 0.7, 0.6, 0.9]},
        {"patience": 2, "min_delta": 0.1, "mode": "max", "metrics": [0.5, 0.55, 0.65, 0.8]},
        {
            "patience": 3,
            "min_delta": 0.0,
            "mode": "min",
            "metrics": [0.9, 0.8, 0.85, 0.7],
            "tensors": True,
        },  # fmt: skip
        {"patience": 0, "min_delta": 0.0, "mode": "min", "metrics": []},
        {"patience": 2, "min_delta": -0.1, "mode": "min", "metrics": []},
        {"patience": 2, "min_delta": 0.0, "mode": "mean", "metrics": []},
    ]
    if thorough:
        rng = random.Random(grading_seed())
        walk = [round(1.0 + rng.uniform(-0.1, 0.1) - 0.01 * i, 3) for i in range(12)]
        cases.append({"patience": 4, "min_delta": 0.02, "mode": "min", "metrics": walk})
    return cases


def _reference_stopper(patience, min_delta=0.0, mode="min"):
    """The reference class, built without the guard that refuses it to learners' code."""
    stopper = _ReferenceStopper.__new__(_ReferenceStopper)
    _ReferenceStopper.__init__.__wrapped__(stopper, patience, min_delta, mode)
    return stopper


def _stopper_variant(improves, counts=lambda bad, patience: bad >= patience, reset=True):
    class Wrong:
        def __init__(self, patience, min_delta=0.0, mode="min"):
            if patience < 1 or min_delta < 0 or mode not in ("min", "max"):
                raise ValueError("invalid settings")
            self.patience, self.min_delta, self.mode = patience, min_delta, mode
            self.best = math.inf if mode == "min" else -math.inf
            self.best_epoch, self.num_bad_epochs, self.epochs = None, 0, 0

        def step(self, metric):
            value = float(metric)
            if improves(self, value):
                self.best, self.best_epoch = value, self.epochs
                if reset:
                    self.num_bad_epochs = 0
            else:
                self.num_bad_epochs += 1
            self.epochs += 1
            return counts(self.num_bad_epochs, self.patience)

    return Wrong


def _sign(s):
    return 1 if s.mode == "min" else -1


STOPPING_MISTAKES = [
    (
        "a value equal to the best counts as an improvement (`<=` instead of `<`). A plateau "
        "is not progress: only a value *strictly* better than `best - min_delta` resets the "
        "count.",
        _stopper_variant(lambda s, v: _sign(s) * v <= _sign(s) * s.best - s.min_delta),
    ),
    (
        "`min_delta` is ignored: an improvement must beat the best by *more than* min_delta.",
        _stopper_variant(lambda s, v: _sign(s) * v < _sign(s) * s.best),
    ),
    (
        "the count of bad epochs is not reset to 0 when the metric improves.",
        _stopper_variant(lambda s, v: _sign(s) * v < _sign(s) * s.best - s.min_delta, reset=False),
    ),
    (
        "it stops one epoch late: return True once `num_bad_epochs >= patience`, not `>`.",
        _stopper_variant(
            lambda s, v: _sign(s) * v < _sign(s) * s.best - s.min_delta,
            counts=lambda bad, patience: bad > patience,
        ),
    ),
    (
        'mode="max" is ignored: for an accuracy, larger is better.',
        _stopper_variant(lambda s, v: v < s.best - s.min_delta if s.mode == "min" else v < s.best),
    ),
    (
        "a NaN counts as an improvement (`not value >= best` is True for NaN). Compare so that "
        "NaN is never better: `value < best - min_delta` is False for NaN.",
        _stopper_variant(lambda s, v: not _sign(s) * v >= _sign(s) * s.best - s.min_delta),
    ),
]

EARLY_STOPPING = Exercise(
    grade_id=STOPPING,
    function="EarlyStopping",
    reference=_reference_stopper,
    cases=early_stopping_cases,
    observe=observe_early_stopping,
    label=label_early_stopping,
    mistakes=STOPPING_MISTAKES,
    hint='an improvement is `value < best - min_delta` for "min" (`value > best + min_delta` '
    'for "max"); on one, set best, best_epoch and reset num_bad_epochs; otherwise add 1; '
    "return num_bad_epochs >= patience.",
)
check_early_stopping = EARLY_STOPPING.check

EXERCISES = [CHECKPOINT_SAVE, CHECKPOINT_LOAD, EARLY_STOPPING]
