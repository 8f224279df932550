"""Answers that chapter 09's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

_LOAD = """
def load_checkpoint(path, model, optimizer, scheduler):
    checkpoint = torch.load(path, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    rng = checkpoint["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "numpy" in rng:
        kind, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return checkpoint["step"]
"""

CHECKPOINT_NO_NUMPY = (
    """
import os
import random
import torch

def save_checkpoint(path, model, optimizer, scheduler, step):
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                  "scheduler": scheduler.state_dict(), "step": step,
                  "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}}
    tmp = str(path) + ".tmp"
    try:
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
"""
    + _LOAD
)

CHECKPOINT_IN_PLACE = (
    """
def save_checkpoint(path, model, optimizer, scheduler, step):
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "step": step,
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}, path)
"""
    + _LOAD
)

CHECKPOINT_UNSAFE_LOAD = """
import os, random, tempfile
import numpy as np
import torch

def save_checkpoint(path, model, optimizer, scheduler, step):
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                  "scheduler": scheduler.state_dict(), "step": step,
                  "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                          "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.remove(tmp)
        raise

def load_checkpoint(path, model, optimizer, scheduler):
    checkpoint = torch.load(path, weights_only=False)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    torch.set_rng_state(checkpoint["rng"]["torch"])
    random.setstate(checkpoint["rng"]["python"])
    kind, keys, pos, has_gauss, cached = checkpoint["rng"]["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return checkpoint["step"]
"""

_PAYLOAD = """
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch


def payload(model, optimizer, scheduler, step):
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "step": step,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}
"""

CHECKPOINT_COPIED_INTO_PLACE = (
    _PAYLOAD
    + """
def save_checkpoint(path, model, optimizer, scheduler, step):
    tmp = str(path) + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(payload(model, optimizer, scheduler, step), f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.remove(tmp)
        raise
    shutil.copyfile(tmp, path)
    os.remove(tmp)
"""
    + _LOAD
)

CHECKPOINT_DELETED_FIRST = (
    _PAYLOAD
    + """
def save_checkpoint(path, model, optimizer, scheduler, step):
    if os.path.exists(path):
        os.remove(path)  # make room for the new one
    tmp = str(path) + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(payload(model, optimizer, scheduler, step), f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.remove(tmp)
        raise
    os.rename(tmp, path)
"""
    + _LOAD
)

CHECKPOINT_SWALLOWED = (
    _PAYLOAD
    + """
def save_checkpoint(path, model, optimizer, scheduler, step):
    tmp = Path(str(path) + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload(model, optimizer, scheduler, step), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        print("could not save the checkpoint:", e)
        tmp.unlink(missing_ok=True)
"""
    + _LOAD
)

CHECKPOINT_UNSYNCED = (
    _PAYLOAD
    + """
def save_checkpoint(path, model, optimizer, scheduler, step):
    tmp = Path(str(path) + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload(model, optimizer, scheduler, step), f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
"""
    + _LOAD
)

CHECKPOINT_OPTIMIZER_NOT_LOADED = (
    _PAYLOAD
    + """
def save_checkpoint(path, model, optimizer, scheduler, step):
    tmp = Path(str(path) + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload(model, optimizer, scheduler, step), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_checkpoint(path, model, optimizer, scheduler):
    checkpoint = torch.load(path, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    rng = checkpoint["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return checkpoint["step"]
"""
)

# Correct, in another style: pathlib, a tuple for NumPy's state, keys as a tensor.
CHECKPOINT_ALTERNATIVE = """
import os
import random
from pathlib import Path

import numpy as np
import torch


def save_checkpoint(path, model, optimizer, scheduler, step):
    path = Path(path)
    state = np.random.get_state()
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "numpy": (state[0], torch.from_numpy(state[1].astype(np.int64)), *state[2:])}
    tmp = path.parent / ("." + path.name + ".partial")
    try:
        with tmp.open("wb") as f:
            torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                            scheduler=scheduler.state_dict(), step=step, rng=rng), f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_checkpoint(path, model, optimizer, scheduler):
    saved = torch.load(path, map_location="cpu", weights_only=True)
    for obj, key in ((model, "model"), (optimizer, "optimizer"), (scheduler, "scheduler")):
        obj.load_state_dict(saved[key])
    version, internal, gauss = saved["rng"]["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, *rest = saved["rng"]["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(saved["rng"]["torch"])
    return int(saved["step"])
"""

_STOPPER = """
import math

class EarlyStopping:
    def __init__(self, patience, min_delta=0.0, mode="min"):
        if patience < 1 or min_delta < 0 or mode not in ("min", "max"):
            raise ValueError("bad settings")
        self.patience, self.min_delta, self.mode = patience, min_delta, mode
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch, self.num_bad_epochs, self.n = None, 0, 0

    def step(self, metric):
        value = float(metric)
        if self.mode == "min":
            improved = value {op} self.best - self.min_delta
        else:
            improved = value {op_max} self.best + self.min_delta
        if improved:
            self.best, self.best_epoch = value, self.n
            {reset}
        else:
            self.num_bad_epochs += 1
        self.n += 1
        return self.num_bad_epochs {stop} self.patience
"""

STOPPING_TIES_IMPROVE = _STOPPER.format(
    op="<=", op_max=">=", reset="self.num_bad_epochs = 0", stop=">="
)
STOPPING_NO_RESET = _STOPPER.format(op="<", op_max=">", reset="pass", stop=">=")
STOPPING_LATE = _STOPPER.format(op="<", op_max=">", reset="self.num_bad_epochs = 0", stop=">")

STOPPING_ALTERNATIVE = """
class EarlyStopping:
    def __init__(self, patience, min_delta=0.0, mode="min"):
        if not (patience >= 1 and min_delta >= 0 and mode in {"min", "max"}):
            raise ValueError(f"bad settings {patience}, {min_delta}, {mode}")
        self.sign = 1.0 if mode == "min" else -1.0
        self.patience, self.min_delta = patience, min_delta
        self.best = self.sign * float("inf")
        self.best_epoch, self.num_bad_epochs, self.history = None, 0, []

    def step(self, metric):
        value = metric.item() if hasattr(metric, "item") else float(metric)
        if self.sign * value < self.sign * self.best - self.min_delta:
            self.best, self.best_epoch, self.num_bad_epochs = value, len(self.history), 0
        else:
            self.num_bad_epochs += 1
        self.history.append(value)
        return self.num_bad_epochs >= self.patience
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch09_checkpoint": [
        (CHECKPOINT_NO_NUMPY, {"ch09_checkpoint_tests": "NumPy's generator is not saved"}),
        (CHECKPOINT_IN_PLACE, {"ch09_checkpoint_tests": "writes straight into the target"}),
        (CHECKPOINT_UNSAFE_LOAD, {"ch09_checkpoint_tests": "unpickling runs code"}),
        (
            CHECKPOINT_COPIED_INTO_PLACE,
            {"ch09_checkpoint_tests": "copying into place is not atomic"},
        ),
        (CHECKPOINT_DELETED_FIRST, {"ch09_checkpoint_tests": "before the new one is safe"}),
        (CHECKPOINT_SWALLOWED, {"ch09_checkpoint_tests": "the error is caught and not raised"}),
        (CHECKPOINT_UNSYNCED, {"ch09_checkpoint_tests": "not synced before the rename"}),
        (
            CHECKPOINT_OPTIMIZER_NOT_LOADED,
            {"ch09_checkpoint_tests": "the optimizer is not restored"},
        ),
    ],
    "ch09_early_stopping": [
        (STOPPING_TIES_IMPROVE, {"ch09_early_stopping_tests": "A plateau is not progress"}),
        (STOPPING_NO_RESET, {"ch09_early_stopping_tests": "is not reset to 0"}),
        (STOPPING_LATE, {"ch09_early_stopping_tests": "it stops one epoch late"}),
    ],
    "ch09_questions": [
        (
            "steps_lost = 49\nweights_only_answer = 'a'\n",
            {
                "ch09_q_steps_lost": "the last complete one",
                "ch09_q_weights_only": "the optimizer's state included",
            },
        ),
        (
            "steps_lost = 100\nweights_only_answer = 'c'\n",
            {
                "ch09_q_steps_lost": "keeps checkpoint 50 intact",
                "ch09_q_weights_only": "map_location",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch09_checkpoint": CHECKPOINT_ALTERNATIVE,
    "ch09_early_stopping": STOPPING_ALTERNATIVE,
    "ch09_questions": "steps_lost = 50.0\nweights_only_answer = ' B '\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch09_checkpoint": (
        "from forge_course.reference import checkpoint as ref\n\n"
        "def save_checkpoint(path, model, optimizer, scheduler, step):\n"
        "    ref.save_checkpoint(path, model, optimizer, scheduler, step=step)\n\n"
        "def load_checkpoint(path, model, optimizer, scheduler):\n"
        "    return ref.load_checkpoint(path, model, optimizer, scheduler)['step']\n"
    ),
    "ch09_early_stopping": "from forge_course.reference.seeding import EarlyStopping\n",
}
