# %% [markdown]
# # Chapter 00 · Vocabulary and training arithmetic
#
# "Train for 3 epochs with batch size 32" fixes, before a single line runs, how many batches
# the model sees, how many times the optimizer updates it, and how many examples pass through
# it. Learning-rate schedules, logs and checkpoints are set up in those units, so the counts
# have to be right. A wrong count almost never raises an error (the one that does, a scheduler
# stepped past its end, is below): a schedule ends early, a plot's x-axis means something else,
# a few examples' gradients land in the wrong update.
#
# This chapter names each term, counts one running example by hand, checks every count
# against a real `DataLoader`, and then finds the place where the usual gradient-accumulation
# loop quietly gets it wrong.
#
# **By the end of this chapter you can:**
#
# 1. say what a batch, an iteration, an epoch, a micro-batch, the effective batch and an
#    optimizer update are, and which of them a given counter counts;
# 2. work out the iterations per epoch, the size of the last batch, and what `drop_last`
#    changes, by hand and in code;
# 3. count optimizer updates under gradient accumulation, the last, shorter group of each epoch
#    included, and write the loop that updates on that group;
# 4. give a per-update learning-rate scheduler (`OneCycleLR`) the right number of steps.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
N, B, EPOCHS = 10_000, 32, 3  # the running example: examples, batch size, passes over the data
K = 4  # micro-batches per optimizer update, in the sections on accumulation
LEAK_N, LEAK_B = 100, 16  # examples and batch size of the tiny model in "The tail of an epoch"
LR = 0.5  # its SGD learning rate
MAX_LR = 0.1  # peak learning rate of the scheduler experiment
TIMING_REPEATS = 20  # the simulation engine's time is the median of this many runs

import copy
import math
import time
import warnings

import matplotlib.pyplot as plt
import torch
from torch.utils.data import DataLoader, TensorDataset

from forge_course import pick_device
from forge_course.device import describe, tolerance
from forge_course.sims.display import PALETTE

device = pick_device()
torch.manual_seed(SEED)
print("Running on", describe(device))

# %% [markdown]
# ## The words, on one running example
#
# The running example: a training set of $N = 10{,}000$ examples, a batch size of $B = 32$, and
# 3 epochs. Later sections add gradient accumulation over $K = 4$ micro-batches.
#
# | term | what it is | running example |
# | --- | --- | --- |
# | dataset size $N$ | examples in the training set, `len(dataset)` | 10,000 |
# | batch size $B$ | examples the `DataLoader` hands over at once, the `batch_size` argument | 32 |
# | iteration | one turn of the inner loop: one batch through forward and backward | 313 per epoch |
# | epoch | one pass over the whole training set: every example once | 313 iterations |
# | last (partial) batch | what is left over when $B$ does not divide $N$ | 16 examples |
# | `drop_last=True` | `DataLoader` option: throw the partial last batch away | 312 iterations |
# | optimizer update | one `optimizer.step()`: the parameters change | 939 in the run; 237 with $K = 4$ |
# | micro-batch | a batch whose gradient is added to `.grad` without an update | 32 examples |
# | accumulation steps $K$ | micro-batches per optimizer update | 4 |
# | effective batch | examples behind one update, $B \cdot K$ | 128 |
#
# In a plain loop, *iteration* and *step* name the same thing: one batch, one forward and
# backward pass, one update. Gradient accumulation pulls them apart, because several
# iterations (micro-batches) share one update, and that is where most counting mistakes come
# from. With accumulation, never say "step" without saying which of the two you mean.
#
# A word on "batch": textbooks separate *batch* gradient descent (the whole training set per
# update), *mini-batch* (a subset) and *stochastic* (one example). In PyTorch code,
# `batch_size` always means the mini-batch, and so does this course.

# %% [markdown]
# ## Counting the running example by hand
#
# **Iterations per epoch.** $10{,}000 / 32 = 312.5$, and a `DataLoader` cannot hand out half a
# batch. It hands out 312 full batches, $312 \times 32 = 9{,}984$ examples, and then one more
# with the $10{,}000 - 9{,}984 = 16$ left over. An epoch is $\lceil 10{,}000 / 32 \rceil = 313$
# iterations, and its last batch holds 16 examples.
#
# **Steps.** Without accumulation every iteration ends in an update: $3 \times 313 = 939$
# steps.
#
# **Examples seen.** Each epoch sees every example once: $3 \times 10{,}000 = 30{,}000$
# example passes, which is also $3 \times (312 \times 32 + 16)$.
#
# **A smaller one.** $N = 1{,}000$, $B = 64$, 5 epochs: $1{,}000 / 64 = 15.625$, so an epoch
# is 16 iterations, 15 full batches ($15 \times 64 = 960$ examples) and a last one of
# $1{,}000 - 960 = 40$. That makes $5 \times 16 = 80$ steps and $5 \times (15 \times 64 + 40)
# = 5{,}000$ example passes.
#
# **With `drop_last=True`** the running example loses its partial batch: 312 iterations per
# epoch, all of 32 examples, $3 \times 312 = 936$ steps and $3 \times 9{,}984 = 29{,}952$
# example passes; 16 examples sit out each epoch.
#
# **In general**, an epoch has $I = \lceil N / B \rceil$ iterations and the last batch holds
# $N - (I - 1) \cdot B$ examples. (Not $N \bmod B$: when $B$ divides $N$ that is 0, while the
# last batch is then a full one.)
#
# The next cell walks a real, shuffled `DataLoader` over the indices $0 \dots N-1$ and counts
# what comes out, for all three.


# %%
def count_batches(dataset_size, batch_size, epochs, drop_last=False):
    """Walk a real DataLoader for `epochs` epochs and count the batches that come out."""
    loader = DataLoader(
        range(dataset_size),
        batch_size=batch_size,
        shuffle=True,
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(SEED),
    )
    sizes = [len(batch) for _ in range(epochs) for batch in loader]
    per_epoch = len(sizes) // epochs
    return {
        "iterations per epoch": per_epoch,
        "last batch": sizes[per_epoch - 1],
        "steps": len(sizes),
        "examples seen": sum(sizes),
    }


by_hand = {
    (N, B, EPOCHS, False): {"iterations per epoch": 313, "last batch": 16, "steps": 939,
                            "examples seen": 30_000},
    (1_000, 64, 5, False): {"iterations per epoch": 16, "last batch": 40, "steps": 80,
                            "examples seen": 5_000},
    (N, B, EPOCHS, True): {"iterations per epoch": 312, "last batch": 32, "steps": 936,
                           "examples seen": 29_952},
}  # fmt: skip
for (n, b, epochs, drop_last), expected in by_hand.items():
    counted = count_batches(n, b, epochs, drop_last)
    assert counted == expected, f"the DataLoader gives {counted}"
    print(f"N={n:,}, B={b}, {epochs} epochs, drop_last={drop_last}: {counted}")
print("Every count worked out by hand is what the DataLoader does.")

# %% [markdown]
# ## The last batch, and `drop_last`
#
# A smaller case to see the batches one by one: $N = 100$, $B = 16$. By hand, $100 / 16 =
# 6.25$: six full batches hold $6 \times 16 = 96$ examples and a seventh holds the last 4.
# With `drop_last=True` the `DataLoader` stops after the six full batches, and the 4 examples
# left over are not seen in that epoch.
#
# Which 4? Without shuffling, always the same ones: examples 96 to 99 are never seen, in any
# epoch. With shuffling, each epoch drops a different 4, so over several epochs every
# example is very likely seen. The next cell checks both, over 3 epochs.

# %%
sizes = [len(batch) for batch in DataLoader(range(100), batch_size=16)]
sizes_dropped = [len(batch) for batch in DataLoader(range(100), batch_size=16, drop_last=True)]
assert sizes == [16] * 6 + [4] and sizes_dropped == [16] * 6
print("drop_last=False:", len(sizes), "batches of", sizes)
print("drop_last=True: ", len(sizes_dropped), "batches of", sizes_dropped)

for shuffle in (False, True):
    loader = DataLoader(
        range(100), batch_size=16, shuffle=shuffle, drop_last=True,
        generator=torch.Generator().manual_seed(SEED),
    )  # fmt: skip
    never_seen = set(range(100))
    for epoch in range(1, 4):
        seen = {int(i) for batch in loader for i in batch}
        never_seen -= seen
        print(f"shuffle={shuffle!s:5}, epoch {epoch}: dropped {sorted(set(range(100)) - seen)}")
    print(f"shuffle={shuffle!s:5}: {len(never_seen)} examples never seen in 3 epochs\n")

# %% [markdown]
# Why would anyone throw examples away? Mostly because some code cannot cope with a small last
# batch. `BatchNorm` in training mode normalises each channel with the mean and variance of all
# the values that channel has in the batch. For `BatchNorm1d` on feature vectors, shape
# `[batch, features]`, that is one value per example, so a batch of one example has one value
# per channel and no variance. With $N = 33$ and $B = 16$ the last batch holds exactly one
# example:

# %%
batchnorm = torch.nn.BatchNorm1d(2)  # a new module is in training mode
features = torch.randn(33, 2, generator=torch.Generator().manual_seed(SEED))
raised = {}
for drop_last in (False, True):
    try:
        for batch in DataLoader(features, batch_size=16, drop_last=drop_last):
            batchnorm(batch)
        raised[drop_last] = False
        print(f"drop_last={drop_last}: every batch went through")
    except ValueError as err:
        raised[drop_last] = True
        print(f"drop_last={drop_last}: the batch of {len(batch)} raised ValueError: {err}")
assert raised == {False: True, True: False}

# An image has one value per pixel in each channel, so a batch of one image has 16 here.
one_image = torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(SEED))
normalised = torch.nn.BatchNorm2d(2)(one_image)
print(f"BatchNorm2d, a batch of one 4×4 image: went through, output shape {list(normalised.shape)}")

# %% [markdown]
# So the error is specific to one value per channel (feature vectors, or images of 1×1
# pixel). A batch of one image passes, but its statistics come from a single example, so a
# tiny last batch still normalises differently from the others.
#
# The other reasons are softer: a last batch of 4 gives a noisier gradient than one of 16, yet
# the update applies it with the same learning rate; and some code (a compiled graph, a model
# that reshapes by batch size) expects every batch to have the same shape. For evaluation,
# never drop: every example should count.

# %% [markdown]
# ## Micro-batches, the effective batch and gradient accumulation
#
# The memory a training step needs has two parts. The parameters, their `.grad` and the
# optimizer's state do not depend on the batch. The activations autograd keeps for the
# backward pass do, in proportion to the batch. The next cell measures both for a small MLP on
# your device: it counts the bytes of every tensor autograd saves during one forward pass,
# exactly, with `torch.autograd.graph.saved_tensors_hooks`.

# %%
from forge_course.reference.memory import saved_activation_bytes

torch.manual_seed(SEED)
mlp = torch.nn.Sequential(
    torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
    torch.nn.Linear(512, 10),
).to(device)  # fmt: skip
grad_bytes = sum(p.numel() * p.element_size() for p in mlp.parameters())
saved = {}
for batch_size in (B, B * K):
    saved[batch_size] = saved_activation_bytes(mlp, torch.randn(batch_size, 256, device=device))
    print(f"batch of {batch_size:3}: {saved[batch_size] / 2**10:6.0f} KiB saved for backward")
print(f"the .grad of every parameter: {grad_bytes / 2**10:.0f} KiB, for any batch size")
print(f"a batch {K}× larger keeps {saved[B * K] / saved[B]:.1f}× the activations")

# %% [markdown]
# So a batch too big for memory can be split. **Gradient accumulation** runs forward and
# backward on $K$ *micro-batches* of $B$ examples one after the other, lets their gradients add
# up in `.grad` (`backward()` adds, it never replaces; chapter 04), and only then makes one
# optimizer update. That update has seen $B \cdot K$ examples, the **effective batch**, while
# memory holds one micro-batch's activations at a time. Dividing each micro-batch's loss by
# $K$ turns the sum of $K$ mean losses into their average:
#
# ```python
# for i, (x, y) in enumerate(loader):
#     loss = loss_fn(model(x), y) / K
#     loss.backward()                                   # adds into .grad
#     if (i + 1) % K == 0 or i + 1 == len(loader):      # a full group, or the end of the epoch
#         optimizer.step()
#         optimizer.zero_grad()
# ```
#
# Keep an eye on the second half of that `if`; a later section is about what happens without
# it.
#
# **The running example with $K = 4$, by hand.** The effective batch is $32 \times 4 = 128$.
# An epoch is still 313 micro-batches (accumulation changes the updates, not the data), so the
# run is still $3 \times 313 = 939$ forward and backward passes over 30,000 example passes.
# The micro-batches form groups of 4: $313 = 78 \times 4 + 1$, so each epoch has 78 full
# groups (312 micro-batches, 9,984 examples) and a last group of a single micro-batch: the
# partial batch of 16. One update per group gives $\lceil 313 / 4 \rceil = 79$ updates per
# epoch and $3 \times 79 = 237$ in the run.
#
# **A shortcut.** $\lceil N / (B K) \rceil = \lceil 10{,}000 / 128 \rceil = \lceil 78.125
# \rceil = 79$ as well, and not by chance: $\lceil \lceil N/B \rceil / K \rceil = \lceil N /
# (BK) \rceil$ for all positive whole numbers. Write $m = \lceil N/(BK) \rceil$. Then $N \le
# mBK$, so $N/B \le mK$, and as $mK$ is a whole number, $\lceil N/B \rceil \le mK$ and the
# left side is at most $m$. It is also at least $m$, because $\lceil N/B \rceil \ge N/B$.
#
# Both formulas count the last, shorter group as an update. They describe a loop that steps on
# that group, like the one above. With `drop_last=True`, count from the micro-batches that
# exist instead: $\lceil \lfloor N/B \rfloor / K \rceil$, for the running example
# $\lceil 312 / 4 \rceil = 78$ updates per epoch and 234 in the run ($312 = 78 \times 4$
# leaves no short group).
#
# The next cell counts the updates the loop above makes on a real `DataLoader`, with and
# without `drop_last`, and checks the identity for every $N \le 600$, $B \le 40$, $K \le 12$.


# %%
def count_updates(dataset_size, batch_size, accum_steps, epochs, drop_last=False):
    """Walk a real DataLoader with the loop above, counting micro-batches and updates."""
    loader = DataLoader(range(dataset_size), batch_size=batch_size, drop_last=drop_last)
    micro_batches = updates = 0
    for _ in range(epochs):
        for i, _batch in enumerate(loader):
            micro_batches += 1
            if (i + 1) % accum_steps == 0 or i + 1 == len(loader):
                updates += 1
    return micro_batches, updates


for drop_last, expected in [(False, (939, 237)), (True, (936, 234))]:
    micro_batches, updates = count_updates(N, B, K, EPOCHS, drop_last)
    assert (micro_batches, updates) == expected
    print(f"N={N:,}, B={B}, K={K}, {EPOCHS} epochs, drop_last={drop_last}: "
          f"{micro_batches} micro-batches, {updates} updates ({updates // EPOCHS} per epoch)")  # fmt: skip
assert math.ceil(313 / 4) == math.ceil(N / (B * K)) == 79

n = torch.arange(1, 601).view(-1, 1, 1)
b = torch.arange(1, 41).view(1, -1, 1)
k = torch.arange(1, 13).view(1, 1, -1)
ceil_div = lambda top, bottom: -(-top // bottom)  # whole-number ceiling, no floats
same = ceil_div(ceil_div(n, b), k) == ceil_div(n, b * k)
assert bool(same.all())
print(f"ceil(ceil(N/B)/K) == ceil(N/(B·K)) in all {same.numel():,} cases tried")

# %% [markdown]
# ## Exercise 1 · `ch00_training_arithmetic`: the counts of a run
#
# Write `training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1,
# drop_last=False)`. It returns a dict of whole numbers (Python `int`s) with exactly these
# keys:
#
# | key | what it counts | running example, $K = 4$ |
# | --- | --- | --- |
# | `"iters_per_epoch"` | micro-batches per epoch, `len(loader)` | 313 |
# | `"last_batch_size"` | examples in the last batch of an epoch (0 if there is no batch) | 16 |
# | `"micro_steps"` | micro-batches, that is forward and backward passes, in the whole run | 939 |
# | `"updates_per_epoch"` | optimizer updates per epoch, the last, shorter group included | 79 |
# | `"total_updates"` | optimizer updates in the whole run | 237 |
# | `"effective_batch_size"` | $B \cdot K$ | 128 |
# | `"examples_seen"` | example passes in the whole run; dropped examples are not seen | 30,000 |
#
# `drop_last` works as in `DataLoader`. With `drop_last=True` and fewer examples than one
# batch there is no batch at all, and every count but `effective_batch_size` is 0. The hidden
# tests compare your counts with a real `DataLoader` too.


# %% nbgrader={"grade_id": "ch00_training_arithmetic", "solution": true}
def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    ### BEGIN SOLUTION
    if drop_last:
        iters = dataset_size // batch_size
        last = batch_size if iters > 0 else 0
        seen_per_epoch = iters * batch_size
    else:
        iters = math.ceil(dataset_size / batch_size)
        last = dataset_size - (iters - 1) * batch_size
        seen_per_epoch = dataset_size
    updates_per_epoch = math.ceil(iters / accum_steps)
    return {
        "iters_per_epoch": iters,
        "last_batch_size": last,
        "micro_steps": iters * epochs,
        "updates_per_epoch": updates_per_epoch,
        "total_updates": updates_per_epoch * epochs,
        "effective_batch_size": batch_size * accum_steps,
        "examples_seen": seen_per_epoch * epochs,
    }
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch00_training_arithmetic_tests", "grade": true, "points": 3}
# Visible tests: the chapter's worked examples, drop_last (with N < B too), and a batch size
# that divides N.
from forge_course.grading import ch00

ch00.check_training_arithmetic(training_arithmetic)
print("training_arithmetic: right on every worked example, with and without drop_last.")
### BEGIN HIDDEN TESTS
ch00.check_training_arithmetic(training_arithmetic, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Simulation: the training-arithmetic calculator
#
# Set $N$, $B$, $K$, the number of epochs and `drop_last`, or pick a preset from this
# chapter. The calculator prints the counts and draws every epoch as a row of micro-batches:
# the height of a block is its size, groups of $K$ alternate in two blues, a black bar marks an
# optimizer update. A long epoch shows its first and last micro-batches, with the number left
# out in between; the end is where the partial batch and the last, shorter group sit (orange).
#
# The lower panel runs the same epochs with the loop that steps only when `(i + 1) % K == 0`.
# Its last group (hatched) gets no update, and the first update of the next epoch (a red bar)
# applies it late. Things to try:
#
# * $K = 1$, or $N = 1{,}024$, $B = 32$, $K = 4$: $K$ divides the micro-batches, and the two
#   loops agree;
# * the preset "the leak": 3 of the 7 micro-batches of every epoch wait for the next epoch;
# * $N = 10$, $B = 3$, $K = 5$: an epoch has fewer micro-batches than $K$, and the lower loop
#   never updates at all;
# * `drop_last` with $N = 5$, $B = 8$: no batch at all.
#
# *Without a widget front end this cell shows the running example with $K = 4$.*

# %%
from forge_course.sims.arithmetic_timeline import arithmetic_timeline_view, draw_timeline, timeline

arithmetic_timeline_view(dataset_size=N, batch_size=B, epochs=EPOCHS, accum_steps=K)

# %% [markdown]
# *Alt text: two panels, "Correct loop" above "Naive loop", each with three rows (epochs 1 to
# 3) of small blocks: micro-batches 1 to 16, a gap marked "⋯ 281 ⋯", then micro-batches 298 to
# 313. Black bars after every fourth block mark updates. The last block of each row is half as
# tall (16 examples) and orange. In the upper panel a bar follows it; in the lower panel it is
# hatched, with no bar, and the first update of epochs 2 and 3 is drawn in red. The text above
# gives 313 micro-batches per epoch, 79 updates per epoch and 237 in all for the correct loop,
# 78 and 234 for the naive one.*
#
# The calculator's engine is a pure function of the five settings; the view only draws what it
# returns. The next cell times the engine at the sliders' largest setting, and a whole redraw
# (engine, figure, PNG) for comparison.


# %%
from forge_course.sims.display import figure_png


def median_ms(fn, repeats):
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2] * 1e3


largest = (20_000, 1, 10, 16, False)  # N, B, epochs, K, drop_last: 20,000 micro-batches
engine_ms = median_ms(lambda: timeline(*largest), TIMING_REPEATS)
redraw_ms = median_ms(lambda: figure_png(draw_timeline(timeline(*largest))), 3)
print(f"engine: {engine_ms:.1f} ms (median of {TIMING_REPEATS}); "
      f"whole redraw: {redraw_ms:.0f} ms (median of 3)")  # fmt: skip

# %% [markdown]
# ## The tail of an epoch: where the common loop leaks
#
# Many accumulation loops step with `if (i + 1) % K == 0` alone. When $K$ divides the number
# of micro-batches $I$, that is all they need. When it does not, the last $I \bmod K$
# micro-batches of the epoch run forward and backward, add their gradients to `.grad`, and
# the epoch ends without an update and without `zero_grad()`. The gradients wait. The next
# epoch's first update adds them to its own $K$ micro-batches, and after the last epoch they
# are simply never used.
#
# **By hand**, for a tiny model on $N = 100$ points, $B = 16$, $K = 4$: an epoch is 7
# micro-batches, six of 16 and one of 4. The common loop steps after the 4th, so the first
# update applies $4 \times 16 = 64$ examples' gradients. Micro-batches 5 to 7, $16 + 16 + 4 =
# 36$ examples, stay in `.grad`. In epoch 2 the first update applies those 36 together with
# 64 new ones: 100 examples. Over 3 epochs the common loop makes 3 updates (64, 100, 100) and
# leaves 36 unused; the correct loop makes $\lceil 7/4 \rceil \times 3 = 6$ (64, 36, 64, 36,
# 64, 36).
#
# The next cell trains a small network on 100 spiral points both ways, on exactly the same
# batches, and records the examples behind each update and the norm of what is left in
# `.grad` at the end of each epoch.

# %%
from forge_course.data import make_spiral

points, classes = make_spiral(n_per_class=LEAK_N // 2, seed=SEED)
loader = DataLoader(
    TensorDataset(points, classes), batch_size=LEAK_B, shuffle=True,
    generator=torch.Generator().manual_seed(SEED),
)  # fmt: skip
# The batches of every epoch, fixed in advance, so that every loop below sees the same ones.
epoch_batches = [[(x.to(device), y.to(device)) for x, y in loader] for _ in range(EPOCHS)]
cross_entropy = torch.nn.CrossEntropyLoss()


def fresh_model():
    torch.manual_seed(SEED)
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    net = net.to(device)
    return net, torch.optim.SGD(net.parameters(), lr=LR)


def grad_norm(net):
    """The norm of everything in .grad; 0 when zero_grad() has set it to None."""
    grads = [p.grad.norm() for p in net.parameters() if p.grad is not None]
    return torch.stack(grads).norm().item() if grads else 0.0


def train(net, optimizer, batches_per_epoch, step_on_tail):
    """The accumulation loop, with a record of what each update applied and what was left."""
    record = {"update after micro-batch": [], "examples behind it": [], "left in .grad": []}
    in_grad = micro_batches = 0
    for batches in batches_per_epoch:
        for i, (x, y) in enumerate(batches):
            (cross_entropy(net(x), y) / K).backward()
            in_grad, micro_batches = in_grad + len(x), micro_batches + 1
            if (i + 1) % K == 0 or (step_on_tail and i + 1 == len(batches)):
                optimizer.step()
                optimizer.zero_grad()
                record["update after micro-batch"].append(micro_batches)
                record["examples behind it"].append(in_grad)
                in_grad = 0
        record["left in .grad"].append(grad_norm(net))
    record["never applied"] = in_grad
    return record


naive = train(*fresh_model(), epoch_batches, step_on_tail=False)
fixed = train(*fresh_model(), epoch_batches, step_on_tail=True)
assert naive["examples behind it"] == [64, 100, 100] and naive["never applied"] == 36
assert fixed["examples behind it"] == [64, 36] * 3 and fixed["never applied"] == 0
for name, record in [("naive", naive), ("fixed", fixed)]:
    norms = [round(g, 4) for g in record["left in .grad"]]
    print(f"{name}: examples behind each update {record['examples behind it']}, "
          f"never applied {record['never applied']}; norm of .grad after each epoch {norms}")  # fmt: skip

fig, (ax_updates, ax_left) = plt.subplots(1, 2, figsize=(11, 3.6), width_ratios=[1.6, 1])
for name, record, colour, shift in [
    ("naive: step if (i + 1) % K == 0", naive, PALETTE["vermillion"], -0.2),
    ("fixed: ... or i + 1 == len(loader)", fixed, PALETTE["blue"], 0.2),
]:
    at = [a + shift for a in record["update after micro-batch"]]
    ax_updates.bar(at, record["examples behind it"], width=0.4, color=colour, label=name)
micro_per_epoch = len(epoch_batches[0])
ax_updates.bar(EPOCHS * micro_per_epoch - 0.2, naive["never applied"], width=0.4, color="white",
               edgecolor=PALETTE["vermillion"], hatch="////", label="naive: never applied")  # fmt: skip
for e in range(1, EPOCHS):
    ax_updates.axvline(e * micro_per_epoch + 0.5, color=PALETTE["grey"], linestyle="--")
ax_updates.set(xlabel="micro-batches since the start (dashed: end of an epoch)",
               ylabel="examples behind the update", title="What each optimizer update applies")  # fmt: skip
ax_updates.set(xticks=range(1, EPOCHS * micro_per_epoch + 1), ylim=(0, 140))
ax_updates.tick_params(axis="x", labelsize=7)
ax_updates.legend(fontsize=8, loc="upper left", ncol=2)
epochs_axis = torch.arange(1, EPOCHS + 1)
ax_left.bar(epochs_axis - 0.2, naive["left in .grad"], width=0.4, color=PALETTE["vermillion"],
            label="naive")  # fmt: skip
ax_left.bar(epochs_axis + 0.2, fixed["left in .grad"], width=0.4, color=PALETTE["blue"],
            label="fixed")  # fmt: skip
ax_left.set(xlabel="epoch", ylabel="norm of .grad", xticks=epochs_axis.tolist(),
            title="Left in .grad when the epoch ends")  # fmt: skip
ax_left.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: left, a bar chart over 21 micro-batches with dashed lines at the ends of epochs 1
# and 2. The naive loop has three bars, 64, 100 and 100 examples, and a hatched bar of 36 at
# the end; the fixed loop has six bars alternating 64 and 36. Right, for each of the three
# epochs, a red bar for the norm the naive loop leaves in `.grad` and no visible blue bar
# (zero) for the fixed loop.*
#
# **How much does the leak change an update?** With plain SGD an update is $\theta \leftarrow
# \theta - \text{lr} \cdot g$. At the start of epoch 2 the leaky update applies
# $g_\text{new} + g_\text{left}$, a clean one (the same parameters, `.grad` cleared first)
# applies $g_\text{new}$, so the two results differ by exactly $\text{lr} \cdot
# g_\text{left}$, whatever the model. The next cell makes both updates and checks that.

# %%
net, optimizer = fresh_model()
train(net, optimizer, epoch_batches[:1], step_on_tail=False)  # epoch 1 with the common loop
left_over = [p.grad.clone() for p in net.parameters()]
clean_net = copy.deepcopy(net)
clean_optimizer = torch.optim.SGD(clean_net.parameters(), lr=LR)
clean_optimizer.zero_grad()  # the clean update starts from an empty .grad
applied = {}
for name, model, opt in [("leaky", net, optimizer), ("clean", clean_net, clean_optimizer)]:
    for x, y in epoch_batches[1][:K]:  # the first group of epoch 2
        (cross_entropy(model(x), y) / K).backward()
    applied[name] = grad_norm(model)
    opt.step()

with torch.no_grad():
    apart = [
        p_clean - p_leaky for p_leaky, p_clean in zip(net.parameters(), clean_net.parameters())
    ]
for difference, g_left in zip(apart, left_over):
    torch.testing.assert_close(difference, LR * g_left, **tolerance(torch.float32, device))
left_norm = torch.cat([g.flatten() for g in left_over]).norm().item()
apart_norm = torch.cat([d.flatten() for d in apart]).norm().item()
print(f"left in .grad after epoch 1 (36 examples): norm {left_norm:.4f}")
print(f"gradient norm the first update of epoch 2 applies: leaky {applied['leaky']:.4f}, "
      f"clean {applied['clean']:.4f}")  # fmt: skip
print(f"distance between the two updated models {apart_norm:.5f}; "
      f"lr × {left_norm:.4f} = {LR * left_norm:.5f}")  # fmt: skip

# %% [markdown]
# Nothing raised an error, so the leak is easy to miss. What it does: the first update of
# every later epoch applies the gradients of more examples than the others (here 100 instead
# of 64, the summed losses of 7 micro-batches where a group has 4, with the same learning
# rate); the last epoch's tail is computed and thrown away; and the run makes fewer updates
# than a scheduler set up with $\lceil I/K \rceil$ per epoch expects (3 instead of 6 here).
#
# **The fix** is the second condition of the loop: also step after the last micro-batch of the
# epoch, `or i + 1 == len(loader)`. If the loader has no length (an `IterableDataset`), step
# once more after the inner loop when `(i + 1) % K != 0`. One more detail: dividing by $K$
# gives the short last group a smaller gradient than a full one (here 3 micro-batches count
# 3/4), and a micro-batch of 4 examples the same weight as one of 16. Chapter 10 weights each
# micro-batch by its share of the group's examples, so that every update equals one big batch
# exactly, for models whose output for an example depends on that example alone. A `BatchNorm`
# layer in training mode breaks that: it normalises with each micro-batch's own statistics, so
# no weighting makes the accumulated gradient the big batch's (chapter 10 measures the gap).

# %% [markdown]
# ## Exercise 2 · `ch00_update_schedule`: one epoch, micro-batch by micro-batch
#
# Write `update_schedule(dataset_size, batch_size, accum_steps, drop_last=False)`. It lists
# one epoch as the fixed loop runs it: a list with one `(size, steps)` pair per micro-batch,
# in order, where `size` is the number of examples in it and `steps` is `True` if
# `optimizer.step()` runs right after it. For the leak example:
#
# ```python
# update_schedule(100, 16, 4) == [(16, False), (16, False), (16, False), (16, True),
#                                 (16, False), (16, False), (4, True)]
# ```
#
# The number of `True`s is then the updates per epoch of Exercise 1. The hidden tests compare
# your list with what a real `DataLoader` hands out.


# %% nbgrader={"grade_id": "ch00_update_schedule", "solution": true}
def update_schedule(dataset_size, batch_size, accum_steps, drop_last=False):
    ### BEGIN SOLUTION
    full, rest = divmod(dataset_size, batch_size)
    sizes = [batch_size] * full
    if rest and not drop_last:
        sizes.append(rest)
    return [
        (size, (i + 1) % accum_steps == 0 or i + 1 == len(sizes)) for i, size in enumerate(sizes)
    ]
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch00_update_schedule_tests", "grade": true, "points": 3}
# Visible tests: the leak example, the running example, drop_last, and K dividing the epoch.
from forge_course.grading import ch00

ch00.check_update_schedule(update_schedule)
print("update_schedule: the right sizes, and an update on the last group of every epoch.")
### BEGIN HIDDEN TESTS
ch00.check_update_schedule(update_schedule, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## What "step" counts: schedulers and loggers
#
# An accumulation loop has two counters: micro-batches (939 in the running example with
# $K = 4$) and optimizer updates (237). A learning-rate scheduler counts whatever you call
# `scheduler.step()` after, so the lengths you give it (`total_steps`, `T_max`, `step_size`,
# a warm-up) must be in the same unit as the calls.
#
# | scheduler, as usually set up | `scheduler.step()` goes | with accumulation |
# | --- | --- | --- |
# | `StepLR(step_size=…)`, `CosineAnnealingLR(T_max=epochs)`, `ExponentialLR` | once per epoch | unchanged: once per epoch |
# | `OneCycleLR(total_steps=…)`, a warm-up of $n$ steps, `CosineAnnealingLR(T_max=updates)` | after every update | right after each `optimizer.step()`, never per micro-batch; total $= 79 \times 3 = 237$ |
#
# The next cell runs the running example's 939 micro-batches and 237 updates (the update
# schedule comes from the course's reference of Exercise 2) with four set-ups, and records the
# learning rate each update uses:
#
# 1. `OneCycleLR(total_steps=237)`, stepped after each update: the right one;
# 2. `OneCycleLR(total_steps=939)`, stepped after each update: lengths counted in
#    micro-batches;
# 3. `OneCycleLR(total_steps=237)`, stepped after every micro-batch;
# 4. `CosineAnnealingLR(T_max=237)`, stepped after every micro-batch.

# %%
from forge_course.reference import schedule as schedule_ref

one_epoch = schedule_ref.update_schedule(N, B, K)  # 313 (size, steps) pairs, 79 updates
total_micro = EPOCHS * len(one_epoch)
total_updates = EPOCHS * sum(steps for _, steps in one_epoch)
assert (total_micro, total_updates) == (939, 237)


def lr_per_update(make_scheduler, per_micro_batch):
    """The learning rate each update of the run uses, and the error that stopped it, if any."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=MAX_LR)
    scheduler = make_scheduler(optimizer)
    used = []
    with warnings.catch_warnings():
        # Stepping per micro-batch calls the scheduler before the first update, and PyTorch
        # warns about that order; here it is the experiment, not a slip.
        warnings.simplefilter("ignore", UserWarning)
        try:
            for _ in range(EPOCHS):
                for _size, steps in one_epoch:
                    if steps:
                        used.append(optimizer.param_groups[0]["lr"])
                        optimizer.step()
                    if steps or per_micro_batch:
                        scheduler.step()
        except ValueError as err:
            return used, f"ValueError: {err}"
    return used, ""


def one_cycle(total):
    return lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, MAX_LR, total_steps=total)


def cosine(total):
    return lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)


setups = [  # (label, scheduler, stepped per micro-batch?, colour)
    (f"OneCycleLR(total_steps={total_updates}), per update", one_cycle(total_updates), False,
     PALETTE["blue"]),
    (f"OneCycleLR(total_steps={total_micro}), per update", one_cycle(total_micro), False,
     PALETTE["orange"]),
    (f"OneCycleLR(total_steps={total_updates}), per micro-batch", one_cycle(total_updates), True,
     PALETTE["vermillion"]),
    (f"CosineAnnealingLR(T_max={total_updates}), per micro-batch", cosine(total_updates), True,
     PALETTE["purple"]),
]  # fmt: skip
fig, ax = plt.subplots(figsize=(11, 3.8))
for name, make, per_micro_batch, colour in setups:
    used, error = lr_per_update(make, per_micro_batch)
    ax.plot(range(1, len(used) + 1), used, color=colour, label=name)
    if error:
        ax.plot(len(used), used[-1], "x", color=colour, markersize=10, mew=2)
    print(f"{name:46} {len(used):3} updates, last lr {used[-1]:.4f}. {error}")
ax.set(xlabel="optimizer update", ylabel="learning rate", xlim=(0, total_updates + 5),
       title=f"One run of {total_updates} updates ({total_micro} micro-batches, K = {K})")  # fmt: skip
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: learning rate against optimizer update, 1 to 237. The right set-up (blue) rises to
# 0.1 and falls back to almost zero by update 237. With total_steps=939 (orange) the rate is
# still rising at update 237 and has not reached its peak. OneCycleLR stepped per micro-batch
# (red) rises and falls within the first 59 updates and stops there, marked with a cross.
# CosineAnnealingLR stepped per micro-batch (purple) falls to zero and climbs back up twice.*
#
# Only one of the three wrong set-ups announces itself, and only because `OneCycleLR` refuses
# to step past its length: the printed `ValueError` comes at micro-batch 238, three quarters
# of the way through epoch 1. The other two run to the end with a schedule that has nothing to
# do with the one intended: one never leaves its warm-up, the other cycles.
#
# **Loggers** have the same problem with their x-axis. `SummaryWriter.add_scalar(tag, value,
# global_step)` plots whatever number you pass as `global_step`. Log against the update counter
# to line the curve up with the scheduler, or against examples seen to compare runs with
# different $K$. A micro-batch counter stretches the same run to 939 on the x-axis, where the
# scheduler counted 237.
# (What to log matters too: the mean loss over the examples of an update or an epoch, not the
# last micro-batch's loss; chapter 10.)

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch00_q_iterations`).** A data set has 50,000 examples and the `DataLoader`
# has `batch_size=256` (no `drop_last`). How many iterations does one epoch take? Set
# `q_iterations` to a number.
#
# **Question 2 (`ch00_q_updates`).** $N = 20{,}000$, $B = 64$, $K = 4$, 10 epochs, and the
# loop steps after every $K$-th micro-batch and after the last one of each epoch. How many
# optimizer updates does the whole run make? Set `q_updates` to a number.
#
# **Question 3 (`ch00_q_scheduler`).** The running example ($N = 10{,}000$, $B = 32$,
# $K = 4$, 3 epochs: 939 micro-batches, 237 updates) uses `OneCycleLR`. Which set-up is
# right? Set `q_scheduler` to one letter.
#
# * **a**: `total_steps=939`, `scheduler.step()` right after each `optimizer.step()`.
# * **b**: `total_steps=237`, `scheduler.step()` right after each `optimizer.step()`.
# * **c**: `total_steps=237`, `scheduler.step()` right after each `loss.backward()`.
# * **d**: `total_steps=3`, `scheduler.step()` at the end of each epoch.

# %% nbgrader={"grade_id": "ch00_questions", "solution": true}
q_iterations = None
q_updates = None
q_scheduler = None
### BEGIN SOLUTION
q_iterations = 196
q_updates = 790
q_scheduler = "b"
### END SOLUTION

# %% nbgrader={"grade_id": "ch00_q_iterations", "grade": true, "points": 1}
from forge_course.grading.ch00 import check_number  # Python's numbers or NumPy's

check_number(q_iterations, "ch00_q_iterations")
### BEGIN HIDDEN TESTS
check_number(
    q_iterations,
    "ch00_q_iterations",
    expected=196,
    hints={
        195: "50,000 // 256 rounds down: 195 full batches hold 49,920 examples, and the 80 left "
        "over make one more, partial batch. Round up: ceil(50,000 / 256).",
        195.3125: "a number of batches is a whole number: the partial batch counts, so round up.",
        80: "80 is the size of the last batch, not the number of batches.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch00_q_updates", "grade": true, "points": 1}
from forge_course.grading.ch00 import check_number  # Python's numbers or NumPy's

check_number(q_updates, "ch00_q_updates")
### BEGIN HIDDEN TESTS
per_epoch = (
    "the count of micro-batches starts again every epoch, and each epoch ends with its own "
    "update: count the updates of one epoch, then multiply by 10."
)
check_number(
    q_updates,
    "ch00_q_updates",
    expected=790,
    hints={
        780: "10 × 78 rounds down somewhere. 20,000 // 64 = 312 loses the partial batch: an "
        "epoch has ceil(20,000 / 64) = 313 micro-batches. And 313 // 4 = 78 is what a loop that "
        "steps only when (i + 1) % K == 0 makes; this one also steps on the last group of each "
        "epoch (313 = 78 × 4 + 1).",
        3130: "3,130 counts micro-batches (313 per epoch); an update comes once per group of 4.",
        3120: "3,120 counts micro-batches, and 20,000 // 64 = 312 rounds down: an epoch has "
        "313 of them, and an update comes once per group of 4.",
        79: "79 is the number per epoch; the run has 10 epochs.",
        78: "313 // 4 = 78 rounds down, and counts one epoch: the last, shorter group of each "
        "epoch gets its own update (79 per epoch), and the run has 10 epochs.",
        781: "200,000 // 256 rounds down, and counts the run as one long epoch. " + per_epoch,
        782: per_epoch,
        783: per_epoch,
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch00_q_scheduler", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(q_scheduler, "ch00_q_scheduler", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    q_scheduler,
    "ch00_q_scheduler",
    choices="abcd",
    correct="b",
    why_not={
        "a": "939 counts micro-batches, but the scheduler steps once per update: when training "
        "ends the schedule is a quarter done and still warming up.",
        "c": "stepped after every micro-batch, a schedule of 237 steps runs out at micro-batch "
        "238, three quarters of the way through epoch 1, and OneCycleLR raises a ValueError.",
        "d": "OneCycleLR is made to step after every update; stepped once per epoch, the "
        "learning rate takes only three values in the whole run.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# loader = DataLoader(dataset, batch_size=B, shuffle=True)  # len(loader) = ceil(N / B); the last
#                                                           # batch holds N - (len - 1)·B
# updates_per_epoch = math.ceil(len(loader) / K)            # the last, shorter group counts
# scheduler = OneCycleLR(optimizer, max_lr, total_steps=updates_per_epoch * epochs)
# for epoch in range(epochs):
#     for i, (x, y) in enumerate(loader):
#         loss = loss_fn(model(x), y) * len(x) / group_n    # group_n: examples in this update
#         loss.backward()                                   # adds into .grad
#         if (i + 1) % K == 0 or i + 1 == len(loader):      # without the `or`: the tail leaks
#             optimizer.step()
#             optimizer.zero_grad()
#             scheduler.step()                              # per update, never per micro-batch
# ```
#
# * An epoch has $\lceil N/B \rceil$ iterations; the last batch holds $N - (I - 1) B$, which is
#   not $N \bmod B$ when $B$ divides $N$. Without the ceiling, the partial batch is lost from
#   the count.
# * `drop_last=True` makes $\lfloor N/B \rfloor$ iterations; the dropped examples differ per
#   epoch only if the loader shuffles. Without it, a `BatchNorm1d` on feature vectors raises
#   on a last batch of one example (one value per channel); a batch of one image passes.
# * With accumulation, one update sees the effective batch $B \cdot K$; an epoch makes
#   $\lceil I/K \rceil = \lceil N/(BK) \rceil$ updates, but only if the loop also steps on the
#   last group. Without `or i + 1 == len(loader)`, that group's gradients leak into the next
#   epoch's first update, and the last epoch's are never used.
# * Scheduler lengths and `scheduler.step()` calls must count the same thing; with
#   accumulation, per-update schedulers count optimizer updates. Otherwise the schedule ends
#   early, never finishes its warm-up, or cycles, mostly without an error.
#
# Next, chapter 01 opens the autograd tape that `backward()` walks.
