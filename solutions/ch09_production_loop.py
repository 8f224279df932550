# %% [markdown]
# # Chapter 09 · The production loop
#
# Chapter 04's loop trains a model. A production loop also survives being killed, refuses to
# run code hidden in a file, stops when validation stops improving, repeats itself under a
# seed, keeps one bad batch from throwing the weights away, and reports what it is doing.
# Each of these is a few lines added to the plain loop; this chapter adds them one at a time
# to one running example and measures what each costs and what breaks without it.
#
# **By the end of this chapter you can:**
#
# 1. write a checkpoint that resumes a run *bit for bit*, mid-epoch (model, optimizer,
#    scheduler, counters, sampler position and every random generator), and write it
#    atomically;
# 2. load checkpoints with `torch.load(..., weights_only=True)` and say what it protects you
#    from;
# 3. stop training with `EarlyStopping` on a real validation curve, and log the epoch's
#    sample-weighted mean loss rather than the last batch's;
# 4. seed a run, switch on deterministic algorithms and measure what that costs here;
# 5. clip gradients, log to TensorBoard, show a progress bar, and list what a container needs.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
EPOCHS = 5  # epochs of the running example (10 steps each)
EVERY = 4  # optimizer steps between checkpoints in the crash replay
KILL_AT = 23  # the replayed process is killed during this step
PATIENCE = 10  # early stopping: epochs without improvement before stopping
MAX_NORM = 0.5  # gradient clipping threshold (L2 norm over all parameters)
TIMING_STEPS = 60  # training steps per timing of deterministic algorithms
TIMING_REPEATS = 5  # timings per setting; the median is reported

import math
import os
import pickle
import random
import stat
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from forge_course import pick_device
from forge_course.device import describe
from forge_course.sims.display import PALETTE

torch.set_num_threads(1)  # the replayed processes use one thread; so does this kernel
device = pick_device()
print("Running on", describe(device))
# Checkpoints and logs of this session go here; the folder is removed when the kernel stops.
work_folder = tempfile.TemporaryDirectory(prefix="ch09-")
work = Path(work_folder.name)

# %% [markdown]
# ## The running example
#
# A small MLP (2 → 32 → 32 → 2, with dropout) classifies the points of the 2-D spiral: 400
# points, 300 for training and 100 held out, batches of 32 in an order reshuffled every epoch
# by a `ResumableSampler`. AdamW updates it; a `StepLR` multiplies the learning rate by 0.8
# after every epoch. The same function, `build`, also sets up the training *processes* that the
# crash replay below kills and resumes, so everything in this chapter is one run.
#
# Here is chapter 04's plain loop, run for one epoch:

# %%
from forge_course.sims import crash_replay

model, optimizer, scheduler, sampler, loader = crash_replay.build(SEED)
sizes, losses = [], []
model.train()
for x, y in loader:  # chapter 04's loop: nothing else
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    sizes.append(len(x))
    losses.append(loss.item())
scheduler.step()
print("batch sizes:", sizes)
print("batch losses:", [round(v, 4) for v in losses])

# %% [markdown]
# ### Which loss to log (hand calculation)
#
# Many scripts log `loss.item()` of the last batch as "the epoch's loss". Here the last batch
# holds $300 - 9 \cdot 32 = 12$ examples: it is one noisy sample of 12. The epoch's loss is
# the mean over the 300 examples, so each batch counts in proportion to its size:
#
# $$\bar L = \frac{\sum_b n_b L_b}{\sum_b n_b}, \qquad \text{weight of a full batch} =
# \frac{32}{300} \approx 0.1067, \quad \text{of the last} = \frac{12}{300} = 0.04.$$
#
# The "mean of batch means" gives every batch $1/10 = 0.1$, so it over-weights the last batch
# by $0.1 / 0.04 = 2.5\times$; logging the last batch alone gives it weight 1. The next cell
# checks the weights and prints the three numbers for the epoch above.

# %%
weights = [n / sum(sizes) for n in sizes]
assert sizes == [32] * 9 + [12]
assert math.isclose(weights[0], 32 / 300) and math.isclose(weights[-1], 0.04)
assert math.isclose((1 / len(sizes)) / weights[-1], 2.5)
weighted = sum(n * v for n, v in zip(sizes, losses)) / sum(sizes)
print(f"sample-weighted mean: {weighted:.4f}   mean of batch means: {np.mean(losses):.4f}   "
      f"last batch only: {losses[-1]:.4f}")  # fmt: skip

# %% [markdown]
# ## A full checkpoint
#
# To continue a run *exactly*, the next step must find every value it reads where the killed
# run left it. Listing what step 21 reads gives the checkpoint:
#
# | entry | why the next step needs it | without it |
# | --- | --- | --- |
# | `model.state_dict()` | the weights | training starts over |
# | `optimizer.state_dict()` | AdamW's two moving averages and step count per parameter | the first updates after a resume are different (and, for Adam, too large) |
# | `scheduler.state_dict()` | how far along the schedule is | the learning rate starts its schedule again |
# | `scaler.state_dict()` (with fp16 AMP) | the current loss scale | a few skipped or overflowing steps |
# | counters: epoch, step, best metric | where the loop is; what "better" means | a checkpoint overwritten by a worse one; wrong step numbers in the logs |
# | sampler epoch and position | which examples this epoch has used | some examples seen twice, others never, this epoch |
# | RNG: Python `random`, NumPy, torch CPU, each CUDA device | augmentation, dropout, shuffling | other random draws: a different, unrepeatable run |
#
# `forge_course.reference.checkpoint.save_checkpoint` writes all of it as one dict of tensors,
# numbers, strings, lists and dicts. The next cell saves the model above after its first epoch
# and looks inside the file.
#
# ### How big is it? (hand calculation)
#
# The model holds $(2 \cdot 32 + 32) + (32 \cdot 32 + 32) + (32 \cdot 2 + 2) = 96 + 1056 + 66 =
# 1218$ float32 values: $1218 \cdot 4 = 4872$ bytes. AdamW keeps two more values per
# parameter (`exp_avg`, `exp_avg_sq`), $2 \cdot 4872 = 9744$ bytes, plus a one-value float32
# `step` per parameter tensor, $6 \cdot 4 = 24$ bytes: the optimizer's state is twice the model.
# torch's CPU generator state is a 5056-byte tensor (its Mersenne Twister's 624 words, with
# the seed and the cached normal draws), and each CUDA device adds 16 bytes: its Philox
# generator needs only a 64-bit seed and a 64-bit offset into its stream. Without a GPU the
# tensors add up to $4872 + 9744 + 24 + 5056 = 19{,}696$ bytes (16 more per GPU); the file adds
# Python's and NumPy's states (624 numbers each, stored as plain lists) and the zip container.

# %%
from forge_course.reference import checkpoint as ckpt


def tensor_bytes(obj):
    """Bytes held in the tensors of a nested dict/list."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


path = ckpt.save_checkpoint(ckpt.checkpoint_path(work / "demo", 10), model, optimizer, scheduler,
                       sampler=sampler, epoch=0, step=10, best_loss=weighted)  # fmt: skip
payload = torch.load(path, weights_only=True)
for key in ("model", "optimizer", "scheduler", "sampler", "counters", "rng"):
    print(f"{key:10} {tensor_bytes(payload[key]):6} bytes of tensors   {str(payload[key])[:60]}…")
assert tensor_bytes(payload["model"]) == 1218 * 4 == 4872
assert tensor_bytes(payload["optimizer"]) == 2 * 4872 + 6 * 4
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
assert tensor_bytes(payload["rng"]) == 5056 + 16 * gpus  # CPU generator + one Philox per GPU
print(f"tensors: {tensor_bytes(payload)} bytes; the file: {path.stat().st_size} bytes")

# %% [markdown]
# ## Writing it atomically
#
# `torch.save(checkpoint, path)` opens `path`, empties it, and then writes. A process killed
# half-way (pre-empted, out of memory, out of disk) leaves a truncated file under the
# checkpoint's name, and the previous checkpoint, which lived at that name, is gone. The safe
# order is four steps:
#
# 1. write to a **temporary file in the same folder**;
# 2. `file.flush()` then `os.fsync(file.fileno())`: the bytes leave Python's buffer, then the
#    operating system's cache, for the disk (without it, a power cut after the rename can leave
#    a correctly named file of zeros);
# 3. `os.replace(tmp, path)`: a rename within one file system is atomic, so any reader sees
#    either the old complete file or the new complete one, never a mixture;
# 4. **sync the folder**: open it (`os.open(folder, os.O_RDONLY | os.O_DIRECTORY)`), `os.fsync`
#    that descriptor, close it. The rename changed the folder's list of names, and that list
#    sits in the operating system's cache like any other write: syncing the file does not sync
#    the folder that names it (Linux's `fsync(2)` manual says so), so without this a power cut
#    can bring back the old name, or none. (Windows cannot open a folder this way; there the
#    step is skipped.)
#
# If anything fails, delete the temporary file and re-raise. The next cell records what the
# reference's `save_checkpoint` hands to `os.fsync` during one save: a file or a folder.


# %%
def fsync_calls(save):
    """Run `save()` and list what each `os.fsync` call synced, in order: "file" or "folder"."""
    synced, real_fsync = [], os.fsync

    def recording_fsync(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    os.fsync = recording_fsync
    try:
        save()
    finally:
        os.fsync = real_fsync
    return synced


target = ckpt.checkpoint_path(work / "synced", 10)
synced = fsync_calls(lambda: ckpt.save_checkpoint(target, model, optimizer, scheduler, step=10))
print(f"os.fsync calls during one save: {synced}")
assert synced == (["file", "folder"] if hasattr(os, "O_DIRECTORY") else ["file"])

# %% [markdown]
# The file first, before the rename; the folder last, after it. The next cell makes a save fail
# half-way (an object whose pickling raises, as a full disk would) over a good checkpoint, first
# with plain `torch.save`, then with the reference's atomic save.


# %%
class DiskFull:
    """Stands in for a full disk: writing this object raises half-way through the file."""

    def __reduce__(self):
        raise OSError("no space left on device (simulated)")


class BrokenScheduler:
    def state_dict(self):
        return {"last_epoch": 1, "note": DiskFull()}


for how in ("plain torch.save", "atomic save_checkpoint"):
    folder = work / how.replace(" ", "_")
    target = ckpt.checkpoint_path(folder, 10)
    ckpt.save_checkpoint(target, model, optimizer, scheduler, sampler=sampler, epoch=0, step=10)
    try:
        if how == "plain torch.save":
            torch.save({"model": model.state_dict(), "scheduler": BrokenScheduler().state_dict()},
                       target)  # fmt: skip
        else:
            ckpt.save_checkpoint(target, model, optimizer, BrokenScheduler(), epoch=0, step=10)
    except OSError as err:
        print(f"{how}: the save raised {err}")
    try:
        torch.load(target, weights_only=True)
        state = "still loads"
    except Exception as err:  # noqa: BLE001
        state = f"no longer loads ({type(err).__name__})"
    print(f"   the previous checkpoint {state}; files in the folder: "
          f"{sorted(p.name for p in folder.iterdir())}")  # fmt: skip

# %% [markdown]
# ## `weights_only=True`: a checkpoint is a program
#
# `torch.save` uses `pickle`, and a pickle is a small program: it may say *"call this function
# with these arguments"* to rebuild an object. Unpickling a file from someone else runs
# whatever they put there. Since torch 2.6, `torch.load` defaults to `weights_only=True`, which
# unpickles only tensors, numbers, strings, lists, tuples, dicts and a few torch types, and
# refuses any other function or class. Pass it explicitly anyway: older torch versions and
# some libraries still default to `False`.
#
# The next cell writes a file whose pickle calls `print` on loading (a harmless stand-in for
# `os.system`), then loads it both ways.


# %%
class Payload:
    def __reduce__(self):
        return (print, ("!!! this line was run by the file being loaded",))


hostile = work / "hostile.pt"
torch.save({"model": model.state_dict(), "extra": Payload()}, hostile)
print("weights_only=False:")
torch.load(hostile, weights_only=False)
print("weights_only=True:")
try:
    torch.load(hostile, weights_only=True)
except pickle.UnpicklingError as err:
    reason = next(line for line in str(err).splitlines() if "Unsupported global" in line)
    print("   refused:", reason.strip())

# %% [markdown]
# This is also why the reference stores NumPy's generator state with its key array turned into
# a list: a NumPy array is not on the allowed list, and a checkpoint that `weights_only=True`
# refuses is a checkpoint nobody should load.
#
# ## Exercise 1 · `ch09_checkpoint`: save and resume exactly
#
# Write two functions for a smaller checkpoint than the reference's:
#
# * `save_checkpoint(path, model, optimizer, scheduler, step)` writes **this dict** to `path`
#   (a `str` or a `pathlib.Path`: accept both):
#
#   ```python
#   {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
#    "scheduler": scheduler.state_dict(), "step": step,
#    "rng": {"torch": torch.get_rng_state(),
#            "python": random.getstate(),
#            "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}
#   ```
#
#   where `kind, keys, pos, has_gauss, cached = np.random.get_state()`. Write it atomically:
#   to a temporary file in the same folder, flushed and `os.fsync`ed, then `os.replace`d onto
#   `path`, then the folder synced (step 4 above; only a power cut would show a missing folder
#   sync, so the check cannot test that one, but it does count the descriptors a save leaves
#   open: close the folder you opened). If writing fails, delete the temporary file and let
#   the error propagate: `path` must still hold the previous checkpoint, and no other file may
#   be left.
# * `load_checkpoint(path, model, optimizer, scheduler)` loads it with
#   `torch.load(path, weights_only=True)`, restores the three objects and the three generators
#   (`torch.set_rng_state`, `random.setstate`, `np.random.set_state` with the keys as a
#   `np.uint32` array), and returns the step.
#
# The check trains a small model whose steps draw from all three generators, checkpoints every
# few steps and stops during a step (the crash). Each function is judged on its own:
#
# * your save is called at every checkpoint, and what your file holds when the run is killed
#   must equal, entry by entry, what a correct save writes at that moment (tuples or lists,
#   tensors or lists for NumPy's keys: the spelling does not matter, the values do);
# * while each save runs, the check reads the kernel's record of what happens to the name
#   `path` (on Linux): it may change only by the rename, never be written into (a copy onto it
#   is a write) nor deleted first. It also notes each `os.fsync`, `os.fdatasync` and `os.sync`
#   call: the file renamed onto `path` must have been synced before the rename. (Whether you
#   flushed first it cannot see: bytes still in Python's buffer miss the sync.)
# * a save that fails half-way over a good checkpoint must raise, and leave that checkpoint
#   and the folder as they were (a backup of the previous checkpoint, such as a `.prev` file,
#   is fine; a temporary file outside the checkpoint's folder is not);
# * your load is given a correct file, with fresh objects built from *another* seed, and the
#   run it resumes must finish exactly as an uninterrupted run, losses and final weights bit
#   for bit; then files with code hidden in them must not run it.
#
# The hidden check adds other seeds and crash points, and every device.


# %% nbgrader={"grade_id": "ch09_checkpoint", "solution": true}
def save_checkpoint(path, model, optimizer, scheduler, step):
    ### BEGIN SOLUTION
    path = Path(path)
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": step,
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
        },
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if hasattr(os, "O_DIRECTORY"):  # the rename is an entry in the folder: sync it too
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    ### END SOLUTION


def load_checkpoint(path, model, optimizer, scheduler):
    ### BEGIN SOLUTION
    checkpoint = torch.load(path, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    rng = checkpoint["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return checkpoint["step"]
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch09_checkpoint_tests", "grade": true, "points": 4}
# Visible tests: 12 steps, a checkpoint every 4, killed during step 11, on the CPU.
from forge_course.grading import ch09

ch09.check_checkpoint(save_checkpoint, load_checkpoint)
print("save_checkpoint and load_checkpoint: the resumed run equals the uninterrupted one.")
### BEGIN HIDDEN TESTS
ch09.check_checkpoint(save_checkpoint, load_checkpoint, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Crash and resume, with a real process
#
# Now the real thing. `python -m forge_course.sims.crash_replay FOLDER` trains the running
# example for 5 epochs (50 steps) in separate processes, each saving a full checkpoint every
# `EVERY` = 4 steps with the reference. The next cell runs it: two processes at once, one
# uninterrupted, the other sending itself **SIGKILL** during step `KILL_AT` = 23, after
# `backward()` and before `optimizer.step()`. SIGKILL cannot be caught: no `finally:`, no
# `atexit`, exactly what a pre-empted machine or the out-of-memory killer does. Once it is dead,
# a third process resumes the killed run from its newest checkpoint. (On Linux the command
# imports torch once and forks the three from itself: importing torch is most of a new Python's
# start. Each builds its model, optimizer and data from scratch; only the files on disk pass
# from the killed run to the resumed one.)
#
# **By hand.** Checkpoints are written after steps 4, 8, …, 20; the one after 24 never
# happens. An epoch holds 10 steps, so the checkpoint after step 20 was taken at the end of
# epoch 1 (counting from 0), before its `scheduler.step()`. The resume re-enters epoch 1 with
# no batch left in it, steps the scheduler, and starts epoch 2 at step 21. Steps 21 and 22 had
# completed and are redone, step 23 was cut off; the resumed process logs steps 21 to 50, 30
# steps. Every logged loss of the resumed
# run must equal the uninterrupted run's, to the last bit.

# %%
replay = crash_replay.replay(work / "replay", kill_at=KILL_AT)
straight, killed, resumed = replay["uninterrupted"], replay["killed"], replay["resumed"]
assert replay["resumed_from"] == 20 and min(resumed) == 21 and len(resumed) == 30
assert max(killed) == KILL_AT
print("the killed process's exit code:", replay["returncode"], "(-9 on Linux and macOS: SIGKILL)")
print("checkpoints it left:", replay["checkpoints"])
joined = {**killed, **resumed}  # the resumed process's losses replace the killed one's
difference = max(abs(joined[step] - straight[step]) for step in straight)
print(f"steps compared: {len(straight)}; max |resumed - uninterrupted| = {difference}")
fig = crash_replay.draw_replay(replay, KILL_AT)
plt.show()

# %% [markdown]
# *Alt text: training loss over 50 optimizer steps. A thick grey curve is the uninterrupted
# process. A vermillion curve with dots, the killed process, follows it exactly up to step 23
# and stops there. A dashed blue curve, the resumed process, starts at step 21 and runs to step
# 50 exactly on top of the grey one; dotted vertical lines mark step 20 (the checkpoint) and
# step 23 (the kill).*
#
# The difference is exactly 0.0. Two details make it so, both in the reference's docstring:
# the `DataLoader` gets its own `generator` (each `iter(loader)` draws a seed from it, and the
# resumed process starts one more iteration than the original), and every process uses one
# thread so that sums are added in the same order. With `num_workers > 0`, the loader reads
# ahead, so the position to save is the number of examples *trained on*, not the number
# the sampler handed out: `sampler.state_dict(consumed=...)`.
#
# ## Early stopping on a real validation curve
#
# With few examples and a big model, the validation loss falls, bottoms out and climbs again
# as the model starts to memorise noise. The next cell trains such a model on 60 spiral points
# (validated on 240 others) for 80 epochs and asks the reference `EarlyStopping(patience=10)`
# after every epoch whether to stop. (It keeps training past the stop only to draw the whole
# curve.)

# %%
from forge_course.data import make_spiral, train_val_split
from forge_course.reference.seeding import EarlyStopping as ReferenceEarlyStopping

X, y = make_spiral(n_per_class=150, noise=0.4, seed=1)
x_small, y_small, x_val, y_val = train_val_split(X, y, val_fraction=0.8, seed=1)
torch.manual_seed(SEED)
big = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
big_optimizer = torch.optim.Adam(big.parameters(), lr=0.01)
stopper = ReferenceEarlyStopping(patience=PATIENCE)
train_curve, val_curve, stopped_at = [], [], None
for epoch in range(80):
    big_optimizer.zero_grad()
    loss = nn.functional.cross_entropy(big(x_small), y_small)
    loss.backward()
    big_optimizer.step()
    with torch.no_grad():
        val_loss = nn.functional.cross_entropy(big(x_val), y_val).item()
    train_curve.append(loss.item())
    val_curve.append(val_loss)
    if stopper.step(val_loss) and stopped_at is None:
        stopped_at = epoch
print(f"best validation loss {stopper.best:.4f} at epoch {stopper.best_epoch}; "
      f"stop signalled at epoch {stopped_at} (= {stopper.best_epoch} + {PATIENCE}); "
      f"validation loss at epoch 79: {val_curve[-1]:.4f}")  # fmt: skip
assert stopped_at == stopper.best_epoch + PATIENCE

fig, ax = plt.subplots(figsize=(8, 3.4))
ax.plot(train_curve, color=PALETTE["blue"], label="training loss (60 points)")
ax.plot(val_curve, color=PALETTE["orange"], label="validation loss (240 points)")
ax.axvline(stopper.best_epoch, color=PALETTE["green"], ls="--", label="best epoch: keep this")
ax.axvline(stopped_at, color=PALETTE["vermillion"], ls=":", label=f"stop (patience {PATIENCE})")
ax.set(xlabel="epoch (one full-batch step each)", ylabel="cross-entropy loss",
       title="Early stopping: stop when validation has not improved for 10 epochs")  # fmt: skip
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: two loss curves over 80 epochs. The training loss falls steadily towards zero.
# The validation loss falls until the dashed green line (the best epoch), then rises for the
# rest of the run; a dotted vermillion line 10 epochs after the best marks where early stopping
# ends the run.*
#
# Keep the checkpoint of the *best* epoch, not the last: by the time the stop is signalled the
# model has had `PATIENCE` epochs to get worse. And put the stopper's state (`best`,
# `num_bad_epochs`) into the checkpoint's counters, or a resumed run forgets how long it has
# been waiting.
#
# ## Exercise 2 · `ch09_early_stopping`
#
# Write `class EarlyStopping` with `__init__(self, patience, min_delta=0.0, mode="min")` and
# `step(self, metric) -> bool`:
#
# * a value **improves** when it is better than `best` by *more than* `min_delta`:
#   `value < best - min_delta` for `mode="min"`, `value > best + min_delta` for `"max"`.
#   A value equal to the best is not an improvement, and NaN never is;
# * on an improvement set `best = value`, `best_epoch` = the number of earlier calls, and
#   `num_bad_epochs = 0`; otherwise add 1 to `num_bad_epochs`;
# * return `True` once `num_bad_epochs >= patience`;
# * before any call: `best` is `math.inf` (`-math.inf` for `"max"`), `best_epoch` is `None`,
#   `num_bad_epochs` is 0;
# * `metric` may be a float or a one-element tensor: keep `best` a Python float;
# * raise `ValueError` if `patience < 1`, `min_delta < 0` or `mode` is neither `"min"` nor
#   `"max"`.


# %% nbgrader={"grade_id": "ch09_early_stopping", "solution": true}
class EarlyStopping:
    def __init__(self, patience, min_delta=0.0, mode="min"):
        ### BEGIN SOLUTION
        if patience < 1 or min_delta < 0 or mode not in ("min", "max"):
            raise ValueError(f"invalid settings: {patience=}, {min_delta=}, {mode=}")
        self.patience, self.min_delta, self.mode = patience, min_delta, mode
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch = None
        self.num_bad_epochs = 0
        self.calls = 0
        ### END SOLUTION

    def step(self, metric):
        ### BEGIN SOLUTION
        value = float(metric)
        if self.mode == "min":
            improved = value < self.best - self.min_delta
        else:
            improved = value > self.best + self.min_delta
        if improved:
            self.best, self.best_epoch, self.num_bad_epochs = value, self.calls, 0
        else:
            self.num_bad_epochs += 1
        self.calls += 1
        return self.num_bad_epochs >= self.patience
        ### END SOLUTION


# %% nbgrader={"grade_id": "ch09_early_stopping_tests", "grade": true, "points": 2}
# Visible tests: patience 2 on the losses 1.0, 0.8, 0.9, 0.85, 0.7, 0.75, 0.72.
from forge_course.grading import ch09

ch09.check_early_stopping(EarlyStopping)
print("EarlyStopping: the same answers, best values and counts as the reference.")
### BEGIN HIDDEN TESTS
ch09.check_early_stopping(EarlyStopping, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Seeding, and what deterministic algorithms cost
#
# `seed_everything(seed)` seeds Python's `random`, NumPy's global generator and torch's (CPU
# and every GPU). Same seed, same code, same machine: same run. Two things can still differ:
#
# * on GPUs, some kernels add in an order that changes from run to run (atomic additions), and
#   cuDNN may pick its algorithm by timing. `torch.use_deterministic_algorithms(True)` makes
#   torch use repeatable kernels, or raise an error where an operation has none;
# * the number of threads changes how a CPU splits (and so adds up) large sums.
#
# The promise is "same machine, same software, same settings": a checkpoint resumed on
# another kind of GPU continues correctly, but not bit for bit. The next cell repeats a seeded
# run, then times `TIMING_STEPS` training steps of the running example with deterministic
# algorithms off and on, interleaved, `TIMING_REPEATS` times each.

# %%
from forge_course.reference.seeding import seed_everything


def timed_steps(deterministic):
    """Seconds for TIMING_STEPS steps of the running example, and the last loss."""
    seed_everything(SEED, deterministic=deterministic)
    net, opt, _, _, batches = crash_replay.build(SEED)
    net.to(device)
    start = time.perf_counter()
    done = 0
    while done < TIMING_STEPS:
        for x, y in batches:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            done += 1
            if done == TIMING_STEPS:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, loss.item()


timings = {False: [], True: []}
last_loss = {}
for _ in range(TIMING_REPEATS):
    for mode in (False, True):
        seconds, last_loss[mode] = timed_steps(mode)
        timings[mode].append(seconds)
seed_everything(SEED, deterministic=False)  # leave the session as it was
off, on = (float(np.median(timings[m])) * 1e3 / TIMING_STEPS for m in (False, True))
print(f"same seed, same last loss with both settings: {last_loss[False] == last_loss[True]}")
print(f"per step on {device}: {off:.2f} ms deterministic off, {on:.2f} ms on "
      f"(ratio {on / off:.2f}; medians of {TIMING_REPEATS})")  # fmt: skip

fig, ax = plt.subplots(figsize=(6, 2.6))
ax.barh(["off", "on"], [off, on], color=[PALETTE["grey"], PALETTE["blue"]])
ax.set(xlabel="milliseconds per training step (median)", ylabel="deterministic algorithms",
       title=f"Cost of use_deterministic_algorithms on {device.type}")  # fmt: skip
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: two horizontal bars, milliseconds per training step with deterministic algorithms
# off and on, measured on this device.*
#
# On a CPU the two bars are usually within the noise of a shared machine (the ratio printed
# above, not a claim): most CPU kernels are already deterministic, so the switch changes
# almost nothing here. On a GPU, operations such as `index_add_` and scatter-based backward
# passes switch to other kernels, and a few raise an error because none is deterministic; what
# that costs depends on the model, so measure it there: this cell does, when run on a GPU.
#
# ## Gradient clipping (hand calculation)
#
# `torch.nn.utils.clip_grad_norm_(params, max_norm)` treats all gradients as one long vector.
# If its L2 norm exceeds `max_norm`, every gradient is multiplied by `max_norm / norm`; the
# direction is kept, the length is capped. It **returns the norm before clipping**, which is
# the number to log: a spike in it is the first sign of an exploding run.
#
# By hand: two parameters with gradients $[3]$ and $[4]$ have norm $\sqrt{9 + 16} = 5$. With
# `max_norm = 1` both are multiplied by $1/5$: $[0.6]$ and $[0.8]$, norm 1. The call returns 5.

# %%
a, b = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
a.grad, b.grad = torch.tensor([3.0]), torch.tensor([4.0])
returned = torch.nn.utils.clip_grad_norm_([a, b], max_norm=1.0)
print(f"returned {returned.item()}; gradients now {a.grad.item():.1f} and {b.grad.item():.1f}")
assert returned.item() == 5.0
assert torch.allclose(torch.cat([a.grad, b.grad]), torch.tensor([0.6, 0.8]))

# %% [markdown]
# Clip after `backward()` and before `optimizer.step()`; with gradient accumulation, after the
# last micro-batch (chapter 10); with fp16 AMP, after `scaler.unscale_(optimizer)`, or the
# threshold applies to the scaled gradients.
#
# ## Logging to TensorBoard, with a progress bar
#
# The next cell trains the running example for `EPOCHS` epochs with both the clipping and the
# logging lines: it writes the pre-clip gradient norm and the batch loss at every step, and the
# sample-weighted epoch mean at every epoch, with a real `SummaryWriter` into a temporary
# folder, under a `tqdm.auto` progress bar. Then it reads the event file back with
# TensorBoard's own `EventAccumulator` and plots what TensorBoard would show. (`tensorboard
# --logdir <folder>` serves the same file in a browser.)

# %%
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter
from tqdm.auto import tqdm

log_dir = work / "runs" / "ch09"
model, optimizer, scheduler, sampler, loader = crash_replay.build(SEED)
model.to(device)
writer = SummaryWriter(log_dir)
step = 0
for epoch in tqdm(range(EPOCHS), desc="epochs"):
    sampler.set_epoch(epoch)
    model.train()
    total, count = 0.0, 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        step += 1
        total, count = total + loss.item() * len(x), count + len(x)
        writer.add_scalar("loss/batch", loss.item(), step)
        writer.add_scalar("grad_norm/before_clip", norm.item(), step)
    scheduler.step()
    writer.add_scalar("loss/epoch_mean", total / count, step)
writer.close()

events = EventAccumulator(str(log_dir))
events.Reload()
print("tags in the event file:", events.Tags()["scalars"])
fig, (ax_loss, ax_norm) = plt.subplots(1, 2, figsize=(11, 3.4))
for tag, colour in (("loss/batch", PALETTE["sky"]), ("loss/epoch_mean", PALETTE["blue"])):
    scalars = events.Scalars(tag)
    ax_loss.plot([s.step for s in scalars], [s.value for s in scalars], color=colour,
                 marker="o" if tag.endswith("mean") else None, label=tag)  # fmt: skip
ax_loss.set(xlabel="optimizer step", ylabel="cross-entropy loss", title="Read back: losses")
ax_loss.legend(fontsize=8)
norms = events.Scalars("grad_norm/before_clip")
ax_norm.plot([s.step for s in norms], [s.value for s in norms], color=PALETTE["orange"])
ax_norm.axhline(MAX_NORM, color=PALETTE["vermillion"], ls="--", label=f"max_norm = {MAX_NORM}")
ax_norm.set(xlabel="optimizer step", ylabel="gradient L2 norm before clipping",
            title="Read back: what clip_grad_norm_ returned")  # fmt: skip
ax_norm.legend(fontsize=8)
fig.tight_layout()
plt.show()
clipped = sum(s.value > MAX_NORM for s in norms)
print(f"{clipped} of {len(norms)} steps had a norm above {MAX_NORM} and were clipped")

# %% [markdown]
# *Alt text: left, the per-step batch loss (a jagged light-blue line) and the per-epoch
# sample-weighted mean (dark-blue dots on a smooth line) over 50 steps, both falling. Right,
# the gradient norm before clipping at every step, with a dashed line at the clipping
# threshold.*
#
# The batch loss jumps around; the epoch mean is what to compare between epochs and runs.
# Write scalars against the optimizer step, so that runs with other batch sizes, or resumed
# ones, line up on one axis.
#
# ## Simulation: the pipeline builder
#
# Every component of this chapter is a few lines added to chapter 04's loop, mostly outside
# its four core lines. Tick components to see the loop assembled: `+` marks a line a
# component adds, `~` a line of the plain loop it changes, and the colour says which
# component. Untick everything to get chapter 04's loop back.
#
# *Without a widget front end this cell shows the loop with every component on.*

# %%
from forge_course.sims.pipeline_builder import COMPONENTS, build_loop, pipeline_builder_view

pipeline_builder_view()

# %% [markdown]
# *Alt text: the production loop's code, 28 lines. Lines added by a component are marked +
# and shaded in its colour (seeding purple, checkpointing blue, early stopping vermillion,
# clipping orange, logging green, progress bar sky blue); the two changed lines, marked ~, are
# the epoch range (checkpointing) and the batch loop wrapped in tqdm (progress bar). The
# unmarked lines are chapter 04's loop.*
#
# The next cell counts the lines each component adds and times the engine and the HTML
# rendering of one click.

# %%
from forge_course.sims.pipeline_builder import loop_html

plain = build_loop()
print(f"chapter 04's loop: {len(plain.lines)} lines")
for component in COMPONENTS:
    code = build_loop({component})
    print(f"  + {component:15} adds {len(code.added)}, changes {len(code.changed)}")
full = build_loop(set(COMPONENTS))
print(f"everything: {len(full.lines)} lines, of which {len(plain.lines) - len(full.changed)} "
      "are chapter 04's, unchanged")  # fmt: skip
start = time.perf_counter()
for _ in range(100):
    loop_html(build_loop(set(COMPONENTS)))
print(f"one click (build + HTML): {(time.perf_counter() - start) * 10:.3f} ms")

# %% [markdown]
# ## What a container needs
#
# Training in a container (Docker, Kubernetes, a cloud job) adds three checks:
#
# * **Shared memory.** `DataLoader` workers hand batches to the main process through
#   `/dev/shm`. Docker gives a container 64 MB of it by default, and a few batches of images
#   fill that: workers die with *"bus error"* or *"DataLoader worker exited unexpectedly"*.
#   Start it with `--shm-size=2g` (or `--ipc=host`), or mount a memory-backed volume at
#   `/dev/shm` in Kubernetes.
# * **Unbuffered logs.** Python buffers `print` when its output is not a terminal, so a job's
#   log can lag minutes behind, and the last lines before a crash are lost with the buffer.
#   Set `PYTHONUNBUFFERED=1` (the replay's processes above run with it).
# * **A device check at start.** A job that silently falls back to the CPU because the GPU
#   was not passed through "works", on the wrong device. Print the device first, and fail
#   fast if the job expects a GPU and has none (here: set `FORGE_REQUIRE_GPU=1`).
#
# The next cell reports all three for this machine.

# %%
import shutil

shm = Path("/dev/shm")
if shm.exists():
    print(f"/dev/shm: {shutil.disk_usage(shm).total / 2**20:.0f} MiB")
else:
    print("/dev/shm: not present (not Linux): DataLoader workers use another mechanism")
print("PYTHONUNBUFFERED in this kernel:", os.environ.get("PYTHONUNBUFFERED", "not set"))
print("device:", describe(device))
if os.environ.get("FORGE_REQUIRE_GPU") and device.type == "cpu":
    raise SystemExit("this job needs a GPU and found none")

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch09_q_steps_lost`).** A run saves a checkpoint (atomically) right after
# every 50th optimizer step: after steps 50, 100, 150, … The process can be killed at any
# moment, including while a checkpoint is being written. At most how many *completed*
# optimizer steps must the resumed run redo? Set `steps_lost` to a number.
#
# **Question 2 (`ch09_q_weights_only`).** Why load with `torch.load(path,
# weights_only=True)`? Set `weights_only_answer` to one letter.
#
# * **a**: it skips the optimizer's state, so loading is faster.
# * **b**: unpickling can call any function the file names; `weights_only=True` only
#   rebuilds tensors and plain containers and refuses anything else.
# * **c**: it loads the tensors onto the CPU whatever device they were saved from.
# * **d**: it checks the file's checksum and rejects a truncated file.

# %% nbgrader={"grade_id": "ch09_questions", "solution": true}
steps_lost = None
weights_only_answer = None
### BEGIN SOLUTION
steps_lost = 50
weights_only_answer = "b"
### END SOLUTION

# %% nbgrader={"grade_id": "ch09_q_steps_lost", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(steps_lost, "ch09_q_steps_lost")
### BEGIN HIDDEN TESTS
check_number(
    steps_lost,
    "ch09_q_steps_lost",
    expected=50,
    hints={
        49: "a kill *while checkpoint 100 is being written* (after step 100 completed) leaves "
        "checkpoint 50, the last complete one: steps 51 to 100 are redone.",
        51: "the step that was running when the kill came was not completed; count completed "
        "steps only.",
        100: "an atomic write keeps checkpoint 50 intact while 100 is being written.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch09_q_weights_only", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(weights_only_answer, "ch09_q_weights_only", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    weights_only_answer,
    "ch09_q_weights_only",
    choices="abcd",
    correct="b",
    why_not={
        "a": "weights_only loads every entry of the file, the optimizer's state included.",
        "c": "that is map_location's job.",
        "d": "torch.load does not verify a checksum; a truncated file fails (or not) either way.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# seed_everything(SEED)                          # else: another run every time
# save_checkpoint(path, model, optimizer, scheduler, sampler=sampler, epoch=e, step=s)
#                                                # model + optimizer + scheduler + counters +
#                                                # sampler position + every RNG; else: not the same run
# tmp → flush → os.fsync → os.replace(tmp, path) # else: a crash mid-save destroys the last checkpoint
#   → os.fsync(the folder's descriptor)          # else: a power cut can undo the rename
# torch.load(path, weights_only=True)            # else: loading a file runs code from it
# DataLoader(..., generator=torch.Generator())   # else: a mid-epoch resume shifts later random draws
# norm = clip_grad_norm_(model.parameters(), 1.0)  # returns the pre-clip norm: log it
# total += loss.item() * len(x); count += len(x) # log total / count, not the last batch's loss
# writer.add_scalar("loss/epoch_mean", total / count, step)
# if stopper.step(val_loss): break               # and keep the best epoch's checkpoint
# for x, y in tqdm(loader): ...                  # progress you can see
# ```
#
# * A resume killed by SIGKILL during step 23 and resumed from step 20 reproduced all 50
#   losses with a maximum difference of 0.0: only because the checkpoint held every state the
#   next step reads.
# * The checkpoint of a 1218-parameter model held 4872 bytes of weights and 9768 of AdamW
#   state: the optimizer is twice the model.
# * Early stopping ends the run `PATIENCE` epochs after the best one; keep the best.
# * Deterministic algorithms cost what the timing above measured on this device; on a CPU
#   that is usually within the noise, on a GPU measure it.
# * In a container: enough `/dev/shm`, `PYTHONUNBUFFERED=1`, and the device printed first.
#
# Next, chapter 10 scales the loop on one device: gradient accumulation, mixed precision,
# gradient checkpointing and `torch.compile`.
