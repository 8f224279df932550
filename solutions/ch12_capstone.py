# %% [markdown]
# # Chapter 12 · Cheat sheet and capstone
#
# Eleven chapters took the training loop apart one line at a time. This one puts it back
# together: every line on one page, with what it does, what silently breaks without it, and
# the chapter that taught it. Then it grows chapter 04's plain loop into a production loop one
# marked line at a time, runs a smoke test that catches a broken loop in a fraction of a
# second, and ends with the capstone: a complete `fit` that the loop doctor finds nothing wrong
# with and that trains a spiral classifier to a target accuracy on any device.
#
# **By the end of this chapter you can:**
#
# 1. read any training script and say, line by line, what each line does and what breaks
#    without it;
# 2. turn a plain loop into a production loop (clipping, scheduler, checkpoints, validation,
#    logging, early stopping) and say what each addition buys;
# 3. write a smoke test that tells a working training setup from a silently broken one in
#    seconds;
# 4. write a complete `fit` that passes the loop doctor and reaches a target accuracy.
#
# The same table, loop and smoke test are in the printable page `docs/cheat_sheet.md`.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
N_PER_CLASS = 200  # spiral points per class: 400 in all, 100 held out for validation
BATCH_SIZE = 32  # training batches: 9 of 32 and a last one of 12 per epoch
EPOCHS = 20  # epochs of the production run
EVERY = 50  # optimizer updates between checkpoints
SMOKE_STEPS = 10  # updates in the smoke test

import difflib
import inspect
import math
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from forge_course import pick_device
from forge_course.data import make_spiral, train_val_split
from forge_course.device import describe
from forge_course.sims.display import PALETTE

torch.set_num_threads(1)  # tiny models: extra threads only add hand-offs on a busy machine
device = pick_device()
print("Running on", describe(device))

# %% [markdown]
# ## The whole loop on one page
#
# | part | line | what it does | what silently breaks without it | ch. |
# | --- | --- | --- | --- | --- |
# | data | `Dataset` with `__len__` and `__getitem__` | one example by index | nothing to batch | 02 |
# | data | `DataLoader(ds, batch_size=B, shuffle=True)` | batches, last one partial unless `drop_last` | fixed order: the model learns the order | 00, 02 |
# | data | a sampler (`WeightedRandomSampler`, `DistributedSampler` + `set_epoch(e)`) | decides which indices each batch and rank gets | rare classes starve; without `set_epoch` every epoch repeats one order | 03 |
# | data | `worker_init_fn` seeding NumPy/`random` per worker, `generator=` | distinct, reproducible randomness in each worker | every worker draws the same "random" augmentation | 02 |
# | step | `model.train()` | Dropout drops, BatchNorm learns batch statistics | after validation, training runs with Dropout off | 06 |
# | step | `x, y = x.to(device), y.to(device)` | batch on the model's device | an error, or a run that silently stays on the CPU | 05 |
# | step | `optimizer.zero_grad()` | clears `.grad` | each update uses the sum of every past gradient | 04 |
# | step | `loss = loss_fn(model(x), y)` | forward and loss; logits into `CrossEntropyLoss` | softmax first: smaller gradients, and a loss that cannot reach 0 | 04 |
# | step | `loss.backward()` | adds each gradient into `.grad` | `step()` has nothing to apply | 01, 04 |
# | step | `clip_grad_norm_(params, max_norm)` | caps the update's size after a bad batch | one spike can throw the weights far away | 07 |
# | step | `optimizer.step()` | moves the weights | the model never changes | 04 |
# | step | `scheduler.step()` (after `optimizer.step()`) | next learning rate, per batch or per epoch as designed | the first rate is skipped, or the schedule runs at the wrong speed | 04, 08 |
# | eval | `model.eval()` | Dropout off, BatchNorm uses running statistics | noisy, pessimistic validation numbers | 06 |
# | eval | `with torch.no_grad():` | records no graph | activations kept for a backward that never comes | 06 |
# | eval | `total += loss.item() * len(y)`, then `/ seen` | sample-weighted mean | a short last batch counts as much as a full one | 06 |
# | eval | each module's mode restored (`{m: m.training for m in model.modules()}` before `model.eval()`, set back after) | training goes on in train mode; a served model or a frozen BatchNorm stays in eval mode | training runs with Dropout off; a bare `model.train()` instead unfreezes a frozen BatchNorm | 06 |
# | production | `seed_everything(seed)` before building data and model | one seed decides the run | runs that cannot be reproduced or compared | 09 |
# | production | `save_checkpoint(...)` every k updates, to a temporary file then renamed | a crash loses at most k updates; never a half-written file | a crash loses the run, or leaves a corrupt checkpoint | 09 |
# | production | resume: model, optimizer, scheduler, scaler, sampler position, every RNG | continues bit for bit | a resumed run that is quietly a different run | 09 |
# | production | `EarlyStopping(patience)` on a validation metric | stops when validation stops improving | hours spent overfitting | 09 |
# | production | log the epoch's sample-weighted mean of `loss.item()` | an honest training curve | a logged `loss` tensor keeps its graph's nodes, and reading it later waits for the device; the last batch alone is noise | 09 |
# | scaling | accumulate: `(loss * len(x) / group_examples).backward()` (each micro-batch weighted by its share of the update's examples), step every K **and on the last partial group** | a big batch from small ones | `loss / K` over-weights a short micro-batch's examples; the tail's gradients leak into the next epoch | 10 |
# | scaling | `torch.autocast(device.type, dtype)`: bf16 where the hardware has it (Ampere and later GPUs, CPUs with AVX512-BF16 or AMX), else fp16 with a `GradScaler` | faster, smaller activations where the device supports it | fp16 gradients underflow to 0 without a scaler; bf16 on a CPU without it is slower than fp32 | 10 |
#
# Few of these lines announce their absence. A `Dataset` without `__len__` or `__getitem__`
# raises as soon as the `DataLoader` asks for them, and a batch left on the CPU raises at the
# first forward pass of a model on a GPU (on a CPU-only machine it runs, and waits for the
# first GPU). Every other row fails silently: the loop runs, and learns less or the wrong thing.
# That is why the rest of this chapter is about *checking* a loop: with a diff you can read, a
# smoke test, and the doctor.

# %% [markdown]
# ## From the plain loop to the production loop
#
# Chapter 04's loop is five lines inside two `for` loops. The production loop in
# `forge_course.reference.capstone.fit` is that loop with lines **added**: not one line of the
# plain loop is changed or removed. The next cell takes both functions' source (from the line
# `model.to(device)` on, so the signatures and docstrings are left out) and prints the diff:
# `+` marks a line the production loop adds, two spaces a line both share.


# %%
from forge_course.reference import capstone


def loop_body(fn):
    """The source lines of `fn` from `model.to(device)` to the end."""
    lines = inspect.getsource(fn).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "model.to(device)")
    return lines[start:]


diff = list(difflib.ndiff(loop_body(capstone.plain_fit), loop_body(capstone.fit)))
shown = [line for line in diff if not line.startswith("?")]
print("\n".join(shown))
added = sum(line.startswith("+ ") for line in shown)
removed = sum(line.startswith("- ") for line in shown)
shared = sum(line.startswith("  ") for line in shown)
print(f"\n{shared} lines shared, {added} lines added, {removed} removed")
assert removed == 0, "the production loop should only add lines to the plain loop"

# %% [markdown]
# What each group of `+` lines buys:
#
# * **a schedule** (`CosineAnnealingLR` over every update, `scheduler.step()` after each
#   `optimizer.step()`): the learning rate falls along half a cosine to 0 at the end of the run;
# * **clipping** (`clip_grad_norm_`): no single batch can move the weights by more than
#   `max_norm` times the learning rate (for plain SGD; with Adam, clipping keeps one spike from
#   dominating its running averages);
# * **counters and an honest training loss** (`step`, `loss_sum`, `seen`): the epoch's loss is
#   weighted by batch size, so the last batch of 12 counts 12/300 of it, not 1/10;
# * **checkpoints** every `every` updates, each written to a temporary file and renamed, so a
#   crash never leaves a half-written file under a checkpoint's name;
# * **validation done right** (chapter 06's `evaluate`: eval mode, no graph, sample-weighted,
#   every module's mode put back), **a log record** and **early stopping** once per epoch.
#
# Seeding is not in `fit` because it must happen *before* the data and the model are built:
# the next cell does it first.

# %% [markdown]
# ### How many checkpoints? By hand
#
# The spiral has $2 \times 200 = 400$ points; a quarter, 100, is held out, leaving 300 for
# training. With batches of 32 an epoch is $\lceil 300/32 \rceil = 10$ updates ($9 \times 32 =
# 288$, and a last batch of $300 - 288 = 12$). Twenty epochs make $20 \times 10 = 200$ updates.
# A checkpoint is written whenever the update count is a multiple of 50: after updates 50, 100,
# 150 and 200, so **4 files**, the last one holding exactly the final weights. (Early stopping
# with a patience of 5 epochs could end the run sooner; the next cell gives it a patience of
# 20 so the run is the full 200 updates, and checks every number above.)


# %%
from forge_course.reference.checkpoint import load_checkpoint
from forge_course.reference.seeding import seed_everything


def spiral_loaders(seed):
    X, y = make_spiral(n_per_class=N_PER_CLASS, classes=2, noise=0.2, seed=seed)
    X_train, y_train, X_val, y_val = train_val_split(X, y, val_fraction=0.25, seed=seed)
    shuffle = torch.Generator().manual_seed(seed)
    train = DataLoader(TensorDataset(X_train, y_train), BATCH_SIZE, shuffle=True, generator=shuffle)
    return train, DataLoader(TensorDataset(X_val, y_val), batch_size=50)


def make_model(p_drop=0.1):
    return nn.Sequential(
        nn.Linear(2, 64), nn.ReLU(), nn.Dropout(p_drop), nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 2),
    )  # fmt: skip


seed_everything(SEED)  # first: the data, the initial weights and the shuffling follow from it
train_loader, val_loader = spiral_loaders(SEED)
model = make_model()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
history = []
start = time.perf_counter()
with tempfile.TemporaryDirectory() as folder:
    capstone.fit(
        model, optimizer, nn.CrossEntropyLoss(), train_loader, val_loader, EPOCHS, device,
        folder=folder, every=EVERY, patience=EPOCHS, log=history.append,
    )  # fmt: skip
    run_seconds = time.perf_counter() - start
    files = sorted(path.name for path in Path(folder).iterdir())
    restored = make_model().to(device)
    restored_optimizer = torch.optim.Adam(restored.parameters())
    restored_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(restored_optimizer, T_max=1)
    counters = load_checkpoint(
        Path(folder) / files[-1], restored, restored_optimizer, restored_scheduler
    )

print(f"{len(train_loader.dataset)} training examples, {len(train_loader)} updates per epoch")
print(f"updates: {history[-1]['step']}, checkpoint files: {files}")
print(f"the last checkpoint's counters: {counters}")
same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                              restored.state_dict().values()))  # fmt: skip
print(f"the last checkpoint holds exactly the final weights: {same}")
print(f"final validation accuracy {history[-1]['val_accuracy']:.1%}, in {run_seconds:.1f} s")
assert (len(train_loader.dataset), len(train_loader), history[-1]["step"]) == (300, 10, 200)
assert len(files) == 4 and counters == {"step": 200} and same

# %%
epochs = range(1, len(history) + 1)
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 3.6))
ax_loss.plot(epochs, [r["train_loss"] for r in history], color=PALETTE["blue"], label="training")
ax_loss.plot(epochs, [r["val_loss"] for r in history], color=PALETTE["orange"], label="validation")
ax_loss.set(xlabel="epoch", ylabel="cross-entropy (sample-weighted mean)", title="Loss per epoch")
ax_loss.legend(fontsize=8)
ax_acc.plot(epochs, [r["val_accuracy"] for r in history], color=PALETTE["green"])
for k in range(EVERY, history[-1]["step"] + 1, EVERY):
    ax_acc.axvline(k / len(train_loader), color=PALETTE["grey"], linestyle=":")
ax_acc.set(xlabel="epoch", ylabel="validation accuracy", ylim=(0.4, 1.02),
           title="Validation accuracy (dotted: a checkpoint)")  # fmt: skip
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: left, training and validation loss per epoch, both falling over 20 epochs; right,
# validation accuracy per epoch rising towards the value printed above, with dotted vertical
# lines at epochs 5, 10, 15 and 20, where the four checkpoints were written.*

# %% [markdown]
# ## The smoke test: ten steps on one batch
#
# Before a long run, train a fresh model on **one small, fixed batch** for a few steps. A model
# with far more parameters than the batch has examples can memorise it, so in a working loop the
# loss falls at once. In a broken loop it cannot fall: when the update never happens (learning
# rate 0, a missing `step()`), when no gradient reaches the weights (a loss rebuilt from
# `loss.item()`, an output detached or computed under `no_grad`), or when the step is so large it
# diverges. It takes a fraction of a second and needs no data pipeline, no validation and no
# patience, which is why it is the first thing to run.
#
# Switch regularisation off for the smoke test (here Dropout, `p_drop=0`): with Dropout on,
# the loss of a broken loop jitters from mask to mask and can end lower than it started by
# luck alone; with it off, a loop that changes nothing gives the same loss every step.
#
# ### The first loss, by hand
#
# A smoke test also checks the *starting* loss. If the last layer starts at zero, every logit is
# 0, so softmax gives each of the 2 classes probability $1/2$ and the cross-entropy of every
# example is $-\ln(1/2) = \ln 2 \approx 0.6931$. With $C$ classes it would be $\ln C$
# ($\ln 10 \approx 2.3026$ for ten). A first loss far from that means the loss or the labels are
# not what you think.

# %%
smoke_x, smoke_y = (t[:16].to(device) for t in next(iter(spiral_loaders(SEED)[0])))


def zero_head_model():
    torch.manual_seed(SEED)
    net = make_model(p_drop=0.0)  # regularisation off: the test asks "can it memorise?"
    nn.init.zeros_(net[-1].weight)
    nn.init.zeros_(net[-1].bias)
    return net.to(device)


n_params = sum(p.numel() for p in zero_head_model().parameters())
first = nn.CrossEntropyLoss()(zero_head_model()(smoke_x), smoke_y).item()
print(f"{n_params:,} parameters for {len(smoke_y)} examples")
print(f"first loss {first:.4f}, ln 2 = {math.log(2):.4f}")
assert math.isclose(first, math.log(2), rel_tol=1e-6)

# %% [markdown]
# Now the measurement: the same model and batch, the reference `smoke_test`, one working setup
# and three silently broken ones.


# %%
def rebuilt_loss(outputs, targets):  # the bug: a new tensor with the right value, no graph
    value = nn.functional.cross_entropy(outputs, targets).item()
    return torch.tensor(value, device=outputs.device, requires_grad=True)


class NoStep(torch.optim.Adam):  # the bug: as if `optimizer.step()` were missing
    def step(self, closure=None):
        return None


setups = {
    "working (Adam, lr 0.01)": (lambda p: torch.optim.Adam(p, lr=0.01), nn.CrossEntropyLoss()),
    "learning rate 0": (lambda p: torch.optim.Adam(p, lr=0.0), nn.CrossEntropyLoss()),
    "loss rebuilt from .item()": (lambda p: torch.optim.Adam(p, lr=0.01), rebuilt_loss),
    "optimizer.step() missing": (lambda p: NoStep(p, lr=0.01), nn.CrossEntropyLoss()),
}
colours = [PALETTE["blue"], PALETTE["orange"], PALETTE["vermillion"], PALETTE["purple"]]
smoke = {}
start = time.perf_counter()
for name, (make_optimizer, loss_fn) in setups.items():
    smoke[name] = capstone.smoke_test(
        zero_head_model, make_optimizer, loss_fn, (smoke_x, smoke_y), SMOKE_STEPS
    )
smoke_seconds = (time.perf_counter() - start) / len(setups)
for name, (losses, passed) in smoke.items():
    print(f"{name:26} {'PASS' if passed else 'FAIL'}  " + " ".join(f"{v:.4f}" for v in losses))
working = smoke["working (Adam, lr 0.01)"][0]
assert working[-1] < working[0] and [passed for _, passed in smoke.values()] == [1, 0, 0, 0]
print(f"one smoke test took {smoke_seconds * 1e3:.0f} ms; the 20-epoch run {run_seconds:.1f} s")

fig, ax = plt.subplots(figsize=(6.5, 3.6))
for (name, (losses, _)), colour, style in zip(smoke.items(), colours, ["-", "--", "-.", ":"]):
    ax.plot(range(1, SMOKE_STEPS + 1), losses, style, color=colour, label=name, marker=".")
ax.set(xlabel="step", ylabel="loss on the fixed batch", title="Smoke test: 10 steps, 16 examples")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# *Alt text: four loss curves over 10 steps, all starting at ln 2 ≈ 0.693. The working setup
# falls step after step; the three broken ones lie on one flat line at 0.693.*
#
# The three broken setups print *exactly* the same loss ten times: nothing in the model
# changed. None of them raised an error. A real run with any of these bugs would print a loss
# every epoch for hours before anyone noticed the flat line; the smoke test shows it in the
# time printed above.

# %% [markdown]
# ## Exercise 1 · `ch12_smoke_test`: write the smoke test
#
# Write `smoke_test(make_model, make_optimizer, loss_fn, batch, steps=10)`:
#
# * build the model once with `make_model()` (it is already on the batch's device) and the
#   optimizer once with `make_optimizer(model.parameters())`;
# * then, `steps` times, do one ordinary update on `batch = (x, y)`: zero the gradients,
#   forward, `loss_fn(outputs, y)`, backward, step;
# * return `(losses, passed)`: `losses` is a list of `steps` Python floats, `losses[i]` the loss
#   of step `i`'s forward pass (the one `backward()` ran on, before its update); `passed` is
#   `True` when the last loss is strictly lower than the first.
#
# The check runs it on working setups (it must say `True`) and on silently broken ones: a
# learning rate of 0, a loss rebuilt from `loss.item()`, an optimizer whose `step()` does
# nothing, a learning rate so large the loss explodes, and one where the loss falls for one
# step and then diverges (it must say `False`: the last loss is the one that counts), on every
# device. It counts what your function builds and how its optimizer steps, so build the model
# and the optimizer with the functions given, once each.


# %% nbgrader={"grade_id": "ch12_smoke_test", "solution": true}
def smoke_test(make_model, make_optimizer, loss_fn, batch, steps=10):
    ### BEGIN SOLUTION
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    x, y = batch
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, losses[-1] < losses[0]
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch12_smoke_test_tests", "grade": true, "points": 3}
# Visible tests: two working setups (one whose loss swings) and four broken ones, on this
# notebook's device.
from forge_course.grading import ch12

ch12.check_smoke_test(smoke_test)
print(
    "smoke_test: the working setups pass; lr 0, a rebuilt loss, a missing step and a loss that "
    "dips then diverges fail."
)
### BEGIN HIDDEN TESTS
ch12.check_smoke_test(smoke_test, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## The loop doctor's second opinion
#
# A smoke test checks the step. It cannot see the mistakes outside it: validation in train
# mode, validation that records a graph, training that goes on with Dropout off after the first
# validation. The loop doctor (chapter 07) runs a whole `fit` on its own small problem and
# watches for those. The production loop above gets a clean report; the loop below forgets
# `model.train()` after validating, a bug that a loss curve hides well.


# %%
from forge_course.doctor import diagnose


def fit_forgets_train_mode(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    model.train()  # only once, before the first epoch
    for _ in range(epochs):
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(device))
    return model


print("production loop:", diagnose(capstone.fit).codes)
report = diagnose(fit_forgets_train_mode)
print(report)
assert diagnose(capstone.fit).ok and report.codes == ["train_mode_not_restored"]

# %% [markdown]
# ## Exercise 2 · `ch12_capstone`: the complete `fit`
#
# Write `fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)`: train for
# `epochs` epochs, each one pass over `train_loader` with one update of the `optimizer` you are
# given per batch, and validate after each epoch: one full pass over `val_loader`, in eval mode
# and without recording a graph, with train mode back before the next epoch's training. You may
# return anything (the check looks at the model, which you train in place). It is checked in
# two ways, on every device present:
#
# 1. **the loop doctor** runs your `fit` on its own small problem and must find nothing in the
#    training (no missing `zero_grad`, train mode back for training, no graphs kept, the device
#    used, ...);
# 2. **on the spiral** (300 training points in 10 batches, the model above, Adam with learning
#    rate 0.01) with 30 epochs, the check counts the given optimizer's updates (30 × 10 = 300),
#    the epochs followed by a complete validation pass (30), and the validation forwards made
#    in train mode or recording a graph (0), telling validation from training by the examples
#    that go in, so batches you move to the device once and reuse are fine; and the trained
#    model must reach at least 85% validation accuracy. That is well below what a correct loop
#    reaches (compare the production run's accuracy printed above), so it only fails when
#    something is wrong.
#
# Clipping, a per-batch scheduler, logging and checkpoints are welcome but not required; early
# stopping is not: every epoch runs.


# %% nbgrader={"grade_id": "ch12_capstone", "solution": true}
def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    ### BEGIN SOLUTION
    model.to(device)
    history = []
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        correct, seen = 0, 0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                correct += (model(x).argmax(dim=1) == y).sum().item()
                seen += len(y)
        history.append(correct / seen)
    model.train()
    return history
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch12_capstone_tests", "grade": true, "points": 4}
# Visible tests: the loop doctor, and 30 epochs on the spiral, on this notebook's device.
from forge_course.grading import ch12

ch12.check_capstone(fit)
print("fit: the loop doctor finds nothing, and the spiral reaches the target accuracy.")
### BEGIN HIDDEN TESTS
ch12.check_capstone(fit, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch12_q_checkpoints`).** A run has 1,000 training examples, batches of 64, no
# `drop_last`, and trains for 5 epochs. It writes a checkpoint whenever the number of optimizer
# updates so far is a multiple of 25. How many checkpoints does it write? Set `checkpoints` to
# a number.
#
# **Question 2 (`ch12_q_smoke`).** A loop passes the smoke test: the loss on one fixed batch
# falls over 10 steps. Which bug can it still have? Set `smoke_answer` to one letter.
#
# * **a**: `optimizer.step()` is never called.
# * **b**: the learning rate is 0.
# * **c**: validation runs with the model in train mode.
# * **d**: the loss is rebuilt from `loss.item()`, so no gradient reaches the weights.

# %% nbgrader={"grade_id": "ch12_questions", "solution": true}
checkpoints = None
smoke_answer = None
### BEGIN SOLUTION
checkpoints = 3
smoke_answer = "c"
### END SOLUTION

# %% nbgrader={"grade_id": "ch12_q_checkpoints", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(checkpoints, "ch12_q_checkpoints")
### BEGIN HIDDEN TESTS
check_number(
    checkpoints,
    "ch12_q_checkpoints",
    expected=3,
    hints={
        4: "an epoch is ceil(1000 / 64) = 16 updates, so 80 in all; 80 is not a multiple of 25, "
        "so the checkpoints come after updates 25, 50 and 75 only.",
        3.2: "count whole checkpoints: one after each multiple of 25 reached.",
        200: "count optimizer updates (16 per epoch), not examples.",
        0: "an epoch is 16 updates, so 80 in all: multiples of 25 are reached along the way.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch12_q_smoke", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(smoke_answer, "ch12_q_smoke", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    smoke_answer,
    "ch12_q_smoke",
    choices="abcd",
    correct="c",
    why_not={
        "a": "without step() the weights never change, so the loss on the batch stays flat.",
        "b": "with a learning rate of 0 every step leaves the weights as they were: a flat loss.",
        "d": "with no gradient reaching the weights nothing moves: the loss stays flat.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the loop, with what breaks without each line
#
# ```python
# seed_everything(seed)                        # before data and model: else not reproducible
# model.to(device)                             # else an error, or a run left on the CPU
# for _ in range(epochs):
#     model.train()                            # else Dropout stays off after validation
#     for x, y in train_loader:
#         x, y = x.to(device), y.to(device)
#         optimizer.zero_grad()                # else .grad sums every past gradient
#         loss = loss_fn(model(x), y)          # logits, not probabilities
#         loss.backward()                      # else nothing to apply
#         clip_grad_norm_(params, max_norm)    # else one bad batch can throw the weights away
#         optimizer.step()                     # else the model never changes
#         scheduler.step()                     # after step(), else the first rate is skipped
#         if step % every == 0: save_checkpoint(...)  # atomic; else a crash loses the run
#     evaluate(model, val_loader, loss_fn, device)    # eval + no_grad + weighted + mode restored
#     if stopper.step(val_accuracy): break     # else hours spent overfitting
# ```
#
# * The production loop is the plain loop plus lines: the diff above counts them and shows that
#   none of the plain loop's lines changed.
# * A smoke test (10 steps on one batch of 16) catches an update that never happens or a
#   gradient that never arrives in a fraction of a second; a first loss of $\ln C$ with a zero
#   last layer checks the loss itself.
# * The loop doctor catches what the smoke test cannot see: validation in the wrong mode or with
#   a graph, and train mode not restored.
# * Exact resume, mid-epoch and bit for bit, is chapter 09's `ResumableSampler` and
#   `load_checkpoint`; accumulation and AMP are chapter 10's.
