# %% [markdown]
# # Chapter 07 · Bug museum: silent training failures
#
# The worst training bugs raise no error. The loop runs, the loss prints, and the model learns
# the wrong thing, or nothing, or slowly eats the machine's memory. Each one leaves a trace in a
# number nobody was looking at: the gradient norm, the count of autograd graphs still alive, the
# bytes of activations still held, or two evaluations of the same model that disagree. This
# chapter walks through a museum of such bugs, reproduces each one on the same small model, and
# plots its signature. Then it builds the detectors that see them, and finishes with the loop
# doctor, which runs them all at once.
#
# **By the end of this chapter you can:**
#
# 1. recognise each common silent bug by its signature in the loss, the gradient norm, the
#    memory or the spread of repeated evaluations, and name the line that causes it;
# 2. write two detectors yourself: `grad_norm(model)` and `graph_leaks(obj)`;
# 3. say, with measurements, when a stale optimizer moves frozen weights and when kept graphs
#    really cost memory;
# 4. find the operation that made a NaN with anomaly detection, and clip gradients knowing what
#    `clip_grad_norm_` returns;
# 5. run the loop doctor on a training loop and read its report.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # seeds the data, the weights, Dropout, and every experiment below
STEPS = 150  # optimizer updates per museum run: 25 epochs of 6 batches
REPEATS = 10  # evaluations of one trained model in the wrong-mode exhibit
LEAK_STEPS = 30  # training steps in the memory experiments
MYSTERY_EPOCHS = 8  # epochs each mystery loop trains for
LEAK_NOISE = 0.8  # angle noise (radians) of the data-leakage spiral: its arms overlap

import math
import warnings

import matplotlib.pyplot as plt
import torch
from torch import nn

from forge_course import available_devices, pick_device
from forge_course.device import describe
from forge_course.sims.display import PALETTE

device = pick_device()
# Every model here is tiny: a second CPU thread would only add hand-offs between threads.
torch.set_num_threads(1)
torch.manual_seed(SEED)
print("Running on", describe(device))

# %% [markdown]
# ## The museum's model
#
# Every exhibit uses the same patient: 300 points on a three-armed spiral (one arm per class),
# split into 240 training points, served as 6 batches of 40, and 60 validation points. The model
# is a small MLP, $2 \to 64 \to 64 \to 3$, with ReLU, a Dropout layer ($p = 0.2$) after the first
# layer, and the last layer kept apart as `model.head`. It trains with SGD, learning rate 0.2
# and momentum 0.9. Here is the loop, split the way most training scripts are: build the
# optimizer, train one epoch, evaluate. `evaluate` follows chapter 06's rule: eval mode for the
# forward pass, then each module's own mode put back as it was found.


# %%
from forge_course.sims import bug_detector as bd


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=bd.LEARNING_RATE, momentum=0.9)


def train_epoch(model, optimizer, loss_fn, batches, log):
    model.train()
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        log.append(loss.item())


def evaluate(model, loss_fn, X, y):
    modes = {module: module.training for module in model.modules()}
    model.eval()
    with torch.no_grad():
        loss = loss_fn(model(X.to(device)), y.to(device)).item()
    for module, training in modes.items():
        module.training = training
    return loss


batches, X_val, y_val = bd.make_data(SEED)
print(f"{len(batches)} training batches of {len(batches[0][0])}, {len(X_val)} validation points")

# %% [markdown]
# The simulation engine `forge_course.sims.bug_detector` runs this same loop on the CPU, with a
# switch for each bug, and records four signals after every step:
#
# | signal | how it is measured | which bugs it shows |
# | --- | --- | --- |
# | loss | `loss.item()` | anything that stops learning |
# | gradient norm | $\sqrt{\sum \lVert g \rVert^2}$ over the gradients the optimizer is about to apply | a `.grad` that keeps adding up |
# | graphs alive, activation bytes held | `detectors.ActivationWatch`: weak references to each forward's graph and each layer's output | graphs and activations kept by the loop |
# | gap between two evaluations of the same model | run validation twice in a row and subtract | validation with Dropout still on |
#
# The next cell runs the bug-free loop: the baseline every exhibit is compared with.

# %%
correct = bd.run((), steps=STEPS, seed=SEED)

fig, (ax_data, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
points = torch.cat([x for x, _ in batches])
labels_ = torch.cat([y for _, y in batches])
for k, colour in enumerate((PALETTE["blue"], PALETTE["orange"], PALETTE["green"])):
    arm = points[labels_ == k]
    ax_data.scatter(arm[:, 0], arm[:, 1], s=10, color=colour, label=f"class {k}")
ax_data.set(xlabel="x₁", ylabel="x₂", title="The 240 training points", aspect="equal")
ax_data.legend(fontsize=8)
ax_loss.plot(range(1, STEPS + 1), correct["loss"], color=PALETTE["sky"], label="training batch")
ax_loss.plot(correct["eval_step"], correct["val_loss"], color=PALETTE["blue"], lw=2,
             label="validation")  # fmt: skip
ax_loss.set(xlabel="step", ylabel="cross-entropy loss", title="The bug-free loop")
ax_loss.legend(fontsize=8)
fig.tight_layout()
plt.show()
print(f"validation loss {correct['val_loss'][0]:.3f} → {correct['val_loss'][-1]:.3f}, "
      f"validation accuracy after {STEPS} steps: {correct['val_accuracy'][-1]:.1%}")  # fmt: skip

# %% [markdown]
# *Alt text: left, three interleaved spiral arms of blue, orange and green points. Right, the
# loss of each training batch (light, noisy) and the validation loss (dark, smooth) both fall
# over 150 steps; the printed line gives the start and end values and the final accuracy.*

# %% [markdown]
# ## Exhibit 1 · The missing `zero_grad()`
#
# `backward()` adds each new gradient into `.grad`. Without `optimizer.zero_grad()`, `.grad`
# after $k$ steps is the **sum** of $k$ gradients, and the optimizer applies that sum.
#
# **By hand.** Take chapter 04's layer, whose gradient on its one example is
# $\partial L/\partial W = \begin{bmatrix} -1.1 & -2.2 \\ 1.8 & 3.6 \end{bmatrix}$ and
# $\partial L/\partial b = [-1.1,\ 1.8]$. Its norm, over all six entries, is
#
# $$\lVert g \rVert = \sqrt{1.21 + 4.84 + 3.24 + 12.96 + 1.21 + 3.24} = \sqrt{26.7} = 5.16720.$$
#
# Keep the weights still ($lr = 0$) and call `backward()` $k$ times without clearing: `.grad`
# is $k \cdot g$, so its norm is $k \cdot 5.16720$: $5.16720$, $10.33441$, $15.50161$, …,
# and $51.67204$ after 10 calls. The norm grows **linearly**: twice the steps, twice the norm.
# An exponential would multiply by a fixed factor at every step instead.

# %%
W = torch.tensor([[0.5, -0.3], [0.2, 0.8]], dtype=torch.float64, requires_grad=True)
b = torch.zeros(2, dtype=torch.float64, requires_grad=True)
x1, t1 = (
    torch.tensor([1.0, 2.0], dtype=torch.float64),
    torch.tensor([1.0, 0.0], dtype=torch.float64),
)
for k in range(1, 11):
    ((W @ x1 + b - t1) ** 2).mean().backward()  # no zero_grad, no step
    norm = torch.cat([W.grad.flatten(), b.grad.flatten()]).norm().item()
    assert math.isclose(norm, k * math.sqrt(26.7), rel_tol=1e-12)
    if k in (1, 2, 3, 10):
        print(f"after {k:2} backward calls: ‖.grad‖ = {norm:.5f} = {k} × {math.sqrt(26.7):.5f}")
print("The norm is k times the single gradient's norm, as worked out by hand.")

# %% [markdown]
# On the museum's model the gradient changes from batch to batch, so the sum is not exactly
# $k \cdot g$. The next cell measures three runs of `STEPS` steps:
#
# * **bug-free**: the loop above;
# * **no `zero_grad`, weights frozen** (no `optimizer.step()`): `.grad` is the pure running sum
#   of the batch gradients, which here all point roughly the same way;
# * **no `zero_grad`**: the real bug. The optimizer applies the running sum, on top of its
#   momentum.


# %%
def summed_gradient_norms(steps):
    """‖.grad‖ after each backward, with no zero_grad and no step: the running sum alone."""
    torch.manual_seed(SEED)
    model = bd.SpiralNet()
    norms = []
    for step in range(steps):
        x, y = batches[step % len(batches)]
        nn.functional.cross_entropy(model(x), y).backward()
        norms.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())
    return norms


summed = summed_gradient_norms(STEPS)
no_zero_grad = bd.run({"no_zero_grad"}, steps=STEPS, seed=SEED)

fig, (ax_norm, ax_loss) = plt.subplots(1, 2, figsize=(11, 3.8))
steps_axis = range(1, STEPS + 1)
ax_norm.plot(steps_axis, correct["grad_norm"], color=PALETTE["blue"], label="bug-free")
ax_norm.plot(steps_axis, summed, color=PALETTE["orange"], label="no zero_grad, weights frozen")
ax_norm.plot(steps_axis, no_zero_grad["grad_norm"], color=PALETTE["vermillion"],
             label="no zero_grad")  # fmt: skip
ax_norm.set(xlabel="step", ylabel="norm of .grad at the update", title="Gradient norm")
ax_norm.legend(fontsize=8)
ax_loss.plot(steps_axis, correct["loss"], color=PALETTE["blue"], label="bug-free")
ax_loss.plot(steps_axis, no_zero_grad["loss"], color=PALETTE["vermillion"], label="no zero_grad")
ax_loss.set(xlabel="step", ylabel="training loss", yscale="log", title="Loss")
ax_loss.legend(fontsize=8)
fig.tight_layout()
plt.show()
half = STEPS // 2
print(f"weights frozen: ‖.grad‖ at step {half} = {summed[half - 1]:.2f}, at step {STEPS} = "
      f"{summed[-1]:.2f} (ratio {summed[-1] / summed[half - 1]:.2f}; linear growth gives 2)")  # fmt: skip
print(f"largest norm applied: bug-free {max(correct['grad_norm']):.2f}, "
      f"no zero_grad {max(no_zero_grad['grad_norm']):.2f}")  # fmt: skip
print(f"loss after {STEPS} steps: bug-free {correct['loss'][-1]:.3f}, "
      f"no zero_grad {no_zero_grad['loss'][-1]:.3f}")  # fmt: skip

# %% [markdown]
# *Alt text: left, the gradient norm per step. The bug-free run stays low; with the weights
# frozen the running sum climbs along a nearly straight line; the real no-zero_grad run climbs
# steeply at first and then levels off, far above the bug-free run. Right, on a log scale, the
# bug-free loss falls while the no-zero_grad loss rises by orders of magnitude.*
#
# Read the printed ratio: with the weights frozen, doubling the steps about doubles the norm.
# That is the sum at work, not an exponential. In the real bug the optimizer applies the growing
# sum, the weights overshoot and the loss explodes; where the norm levels off, the new batch
# gradients no longer point the way the sum does, so adding them stops making it longer. The
# signature to remember: **a gradient norm far above the bug-free run's, and growing while the
# loss is not falling.** To see it you have to log the gradient norm, which is the first
# exercise.

# %% [markdown]
# ## Exercise 1 · `ch07_grad_norm`: log the gradient norm
#
# Write `grad_norm(model)` that returns the global L2 norm of the gradients of `model` as a
# **Python float**: the square root of the sum of the squares of every entry of every `.grad`,
# as if all gradients were one long vector. Skip parameters whose `.grad` is None (frozen
# parameters, and parameters the forward did not use); if no parameter has a gradient, return
# `0.0`. Do not change any gradient. The result equals what
# `torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf)` returns: each
# parameter counts once, as `model.parameters()` yields it, so a weight shared by two layers
# (tied embeddings) counts once, and two different parameters count twice even when their
# gradients are equal.
#
# The tests run it on models with frozen and unused layers, a shared weight and two twin
# layers, before any backward, after two backward calls and after an in-place
# `zero_grad(set_to_none=False)`, in float32 and float64, on every device this machine has; the
# hidden tests draw new weights every time they run.


# %% nbgrader={"grade_id": "ch07_grad_norm", "solution": true}
def grad_norm(model):
    ### BEGIN SOLUTION
    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += p.grad.detach().pow(2).sum().item()
    return math.sqrt(total)
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch07_grad_norm_tests", "grade": true, "points": 3}
# Visible tests: every kind of model above, on every device, and two of them in float64.
from forge_course.grading import ch07

ch07.check_grad_norm(grad_norm)
print("grad_norm: correct on every kind of model, with and without gradients.")
### BEGIN HIDDEN TESTS
ch07.check_grad_norm(grad_norm, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# PyTorch computes the same number whenever it clips: `clip_grad_norm_` returns the norm it
# measured *before* clipping, and with `max_norm=inf` it leaves the gradients as they are. The
# course's reference `detectors.grad_norm` agrees with it (the cell uses the reference, so it
# runs whatever your answer above does):

# %%
from forge_course.reference import detectors

torch.manual_seed(SEED)
probe = bd.SpiralNet().to(device)
x, y = batches[0]
nn.functional.cross_entropy(probe(x.to(device)), y.to(device)).backward()
from_torch = torch.nn.utils.clip_grad_norm_(probe.parameters(), max_norm=math.inf).item()
print(
    f"detectors.grad_norm: {detectors.grad_norm(probe):.6f}   clip_grad_norm_(inf): {from_torch:.6f}"
)

# %% [markdown]
# ## Exhibit 2 · Evaluating in train mode
#
# `model.eval()` switches Dropout off (and makes BatchNorm use its running statistics). Forget
# it, and every evaluation measures a different random sub-network: the same model, on the same
# data, gives a different answer each time you ask. That is the signature: **evaluate twice and
# compare.** The next cell trains the museum model, then measures its validation accuracy
# `REPEATS` times after `model.eval()`, and `REPEATS` times with the same code minus
# `model.eval()`.


# %%
def accuracy(model, X, y):
    with torch.no_grad():
        return (model(X.to(device)).argmax(dim=1) == y.to(device)).float().mean().item()


torch.manual_seed(SEED)
trained = bd.SpiralNet().to(device)
optimizer = make_optimizer(trained)
for _ in range(STEPS // len(batches)):
    train_epoch(trained, optimizer, nn.CrossEntropyLoss(), batches, [])

modes = {}
trained.eval()
modes["model.eval()"] = [accuracy(trained, X_val, y_val) for _ in range(REPEATS)]
trained.train()  # the bug: validation with Dropout still on
modes["no model.eval()"] = [accuracy(trained, X_val, y_val) for _ in range(REPEATS)]

fig, ax = plt.subplots(figsize=(6.5, 2.6))
for row, values in enumerate(modes.values()):
    colour = PALETTE["blue"] if row == 0 else PALETTE["vermillion"]
    ax.scatter([100 * v for v in values], [row] * len(values), color=colour, s=40, alpha=0.6)
ax.set(yticks=[0, 1], yticklabels=list(modes), ylim=(-0.6, 1.6), ylabel="mode",
       xlabel="validation accuracy (%)",
       title=f"One trained model, evaluated {REPEATS} times in each mode")  # fmt: skip
fig.tight_layout()
plt.show()
for name, values in modes.items():
    print(
        f"{name:16} {len(set(values))} distinct value(s), from {min(values):.1%} to {max(values):.1%}"
    )
for training in (False, True):  # a served model, then one in training: each keeps its mode
    trained.train(training)
    evaluate(trained, nn.CrossEntropyLoss(), X_val, y_val)
    assert all(module.training == training for module in trained.modules())

# %% [markdown]
# *Alt text: a strip plot with two rows. With model.eval() all ten dots sit on one value; without
# it the ten dots are spread over a range of accuracies; the printed lines give the ranges.*
#
# A validation curve measured in train mode is noisy, and it is biased too: the network it
# measures is a thinned one. The mirror-image bug, training in eval mode because validation
# left the model in eval mode and nothing switched it back, silently switches Dropout off for
# the rest of training. The correct `evaluate` above follows chapter 06's rule: it sets
# `model.eval()` first and gives every module its own mode back last, so a served model stays
# in eval mode and a training one goes on training (the last lines of the cell check both).
# Ending it with `model.train()` instead would switch Dropout back on in a served model.
# `train_epoch` also calls `model.train()` as it starts.

# %% [markdown]
# ## Exhibit 3 · Kept graphs, and what they really cost
#
# A tensor computed with autograd on carries its graph: `loss.grad_fn` leads back through every
# operation of the forward. Keep the tensor (`log.append(loss)`, `total += loss`) and you keep
# the graph. How much memory that holds depends on one thing: **did backward run through it?**
# `backward()` frees the activations the graph saved, so a training loss kept after backward
# holds the graph's nodes but none of its activations. A loss that never goes through backward
# (a validation loss computed without `torch.no_grad()`) holds every activation of its forward.
#
# The next cell trains for `LEAK_STEPS` steps, validating after each one, in seven versions that
# differ in a line or two, and measures after every step the graphs alive and the KiB of layer
# outputs still held (with `detectors.ActivationWatch`, which keeps nothing alive itself).


# %%
def leak_experiment(keep=None, val_graph=False, retain=False, steps=LEAK_STEPS):
    """Graphs alive and KiB of activations held after each step, and the log's graph count."""
    torch.manual_seed(SEED)
    model = bd.SpiralNet().to(device)
    optimizer = make_optimizer(model)
    loss_fn = nn.CrossEntropyLoss()
    X_v, y_v = X_val.to(device), y_val.to(device)
    log, total, graphs, kib = [], 0.0, [], []
    with detectors.ActivationWatch(model) as watch:
        for step in range(steps):
            x, y = (t.to(device) for t in batches[step % len(batches)])
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward(retain_graph=retain)
            optimizer.step()
            if keep == "total":
                total += loss
            log.append(loss if keep == "loss" else loss.item())
            model.eval()
            with torch.set_grad_enabled(val_graph):  # False is torch.no_grad()
                val_loss = loss_fn(model(X_v), y_v)
            model.train()
            log.append(val_loss if keep == "val" else val_loss.item())
            graphs.append(watch.live_graphs())
            kib.append(watch.live_bytes() / 1024)
    return graphs, kib, detectors.graph_leaks([log, total])


variants = {
    "log.append(loss.item())": {},
    "log.append(loss)": {"keep": "loss"},
    "total += loss": {"keep": "total"},
    "no no_grad in validation": {"val_graph": True},
    "no no_grad, log.append(val_loss)": {"val_graph": True, "keep": "val"},
    "backward(retain_graph=True)": {"retain": True},
    "retain_graph=True, log.append(loss)": {"retain": True, "keep": "loss"},
}
leaks = {name: leak_experiment(**kwargs) for name, kwargs in variants.items()}

fig, (ax_graphs, ax_kib) = plt.subplots(1, 2, figsize=(12, 3.6), sharey=True)
names = list(leaks)
for ax, index, colour, title in (
    (ax_graphs, 0, PALETTE["blue"], f"Graphs alive after {LEAK_STEPS} steps"),
    (ax_kib, 1, PALETTE["vermillion"], f"KiB of activations held after {LEAK_STEPS} steps"),
):
    ax.barh(names, [leaks[name][index][-1] for name in names], color=colour)
    ax.set(title=title, xlabel="graphs alive" if index == 0 else "activations held (KiB)")
ax_graphs.set_ylabel("loop")
ax_graphs.invert_yaxis()
fig.tight_layout()
plt.show()
print(f"{'version':38} {'graphs':>6} {'KiB held':>9} {'KiB/step':>9} {'graph_leaks(log)':>17}")
for name, (graphs, kib, leaked) in leaks.items():
    per_step = (kib[-1] - kib[0]) / (LEAK_STEPS - 1)
    print(f"{name:38} {graphs[-1]:6} {kib[-1]:9.1f} {per_step:9.2f} {leaked:17}")

# %% [markdown]
# *Alt text: two bar charts over the seven versions. Left, graphs alive after 30 steps: one or
# two for the item(), no-no_grad and retain_graph-only versions, about thirty for every version
# that keeps tensors. Right, KiB held: near zero for most versions, a little for the two that
# hold one graph's activations at a time, and by far the most for the kept validation loss
# without no_grad and for retain_graph with a kept loss. The table gives the numbers and the
# growth per step.*
#
# Read the table row by row:
#
# * `log.append(loss)` and `total += loss` keep a graph per step (the running total is one
#   tensor, but its graph links every loss it has summed: `graph_leaks` counts one tensor, the
#   watch sees every graph). Backward already freed their activations, so the KiB stay flat here;
#   what stays is the graphs' bookkeeping (their nodes), which the watch does not count.
# * Validation without `torch.no_grad()` does **not** by itself make memory grow: its graph is
#   dropped with `val_loss` at the next step. What `no_grad` saves is the memory of that one
#   forward's graph, measured in the next cell.
# * Keeping the validation loss of a forward without `no_grad` is the expensive leak: every
#   step's full set of activations stays, and memory climbs until the process dies.
# * `retain_graph=True` alone holds one graph's activations a little longer (until `loss` is
#   reassigned); together with a kept loss, no graph is ever freed.

# %%
torch.manual_seed(SEED)
probe = bd.SpiralNet().to(device).eval()
with detectors.ActivationWatch(probe) as watch:
    val_loss = nn.functional.cross_entropy(probe(X_val.to(device)), y_val.to(device))
    recorded = watch.live_bytes()
    del val_loss
    with torch.no_grad():
        val_loss = nn.functional.cross_entropy(probe(X_val.to(device)), y_val.to(device))
    not_recorded = watch.live_bytes()
print(f"one validation forward of {len(X_val)} points holds {recorded / 1024:.1f} KiB of "
      f"activations with autograd on, {not_recorded / 1024:.1f} KiB under torch.no_grad()")  # fmt: skip

# %% [markdown]
# ### `retain_graph=True` in a loop
#
# `retain_graph=True` usually enters a loop as a "fix". A state carried from one step to the
# next without `detach()` (an RNN's hidden state, a running statistic) links every step's graph
# to the previous one. The second `backward()` then has to go back through the first step's
# graph, whose saved tensors are already freed, and PyTorch refuses. `retain_graph=True`
# silences that error, keeps every graph, and makes each backward run through all earlier
# steps. With an optimizer stepping in between, the version counter (next exhibits) stops it one
# step later, because the old graphs saved weights that `step()` has since changed. The cure is
# to cut the chain: `h = h.detach()` at the start of each step.


# %%
def carried_state(retain, detach, steps=3):
    """Train an RNN cell whose hidden state is carried across steps; return the first error."""
    torch.manual_seed(SEED)
    cell = nn.RNNCell(2, 8).to(device)
    opt = torch.optim.SGD(cell.parameters(), lr=0.1)
    h = torch.zeros(4, 8, device=device)
    for step in range(1, steps + 1):
        if detach:
            h = h.detach()
        h = cell(torch.randn(4, 2, device=device), h)
        opt.zero_grad()
        try:
            h.pow(2).mean().backward(retain_graph=retain)
        except RuntimeError as err:
            return f"step {step}: {str(err).split('. ')[0]}."
        opt.step()
    return f"all {steps} steps ran"


for retain, detach in [(False, False), (True, False), (False, True)]:
    print(f"retain_graph={retain!s:5} detach={detach!s:5} → {carried_state(retain, detach)}")

# %% [markdown]
# ## Exercise 2 · `ch07_leak_check`: count the graphs a log keeps
#
# Write `graph_leaks(obj)` that returns, as an **int**, how many tensors in `obj` still carry an
# autograd graph, that is have a `grad_fn` that is not None. `obj` may be a tensor, a number, a
# string, `None`, or lists, tuples and dicts of these nested to any depth. Search dict values,
# never keys, even when a key is a tensor. Open only lists, tuples and dicts: anything else
# counts 0, a set or a frozenset of losses included. A parameter or any other leaf tensor
# carries no graph even when it requires grad, and neither does a detached tensor. The count is
# of places: a tensor stored twice (in a list and again as `last`) counts twice, so do not
# de-duplicate.
#
# Careful with strings: a string is iterable, and so is each of its characters.
#
# The tests cover each of these: losses in lists, nested dicts and deep lists, a log mixing
# numbers, strings and `None`, a parameter and its gradient, tensors made under `no_grad`, an
# integer `argmax`, a running total, empty containers, a loss stored twice, a loss as a dict key,
# losses in a set, on every device this machine has; the hidden tests draw new numbers every time
# they run.


# %% nbgrader={"grade_id": "ch07_leak_check", "solution": true}
def graph_leaks(obj):
    ### BEGIN SOLUTION
    if isinstance(obj, torch.Tensor):
        return int(obj.grad_fn is not None)
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(graph_leaks(item) for item in obj)
    return 0
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch07_leak_check_tests", "grade": true, "points": 2}
# Visible tests: every object above, on every device.
from forge_course.grading import ch07

ch07.check_leak_check(graph_leaks)
print("graph_leaks: counts the graph-carrying tensors in every kind of log.")
### BEGIN HIDDEN TESTS
ch07.check_leak_check(graph_leaks, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Exhibit 4 · The stale optimizer
#
# An optimizer receives its parameters once, when it is built, and keeps state for them
# (momentum buffers, Adam's moment estimates). Two things can go stale.
#
# **Freezing after the optimizer was built.** Set `requires_grad=False` on some parameters and
# backward stops filling their `.grad`. What the optimizer does next depends on `zero_grad`:
# with the default `set_to_none=True` their `.grad` stays `None` and `step()` skips them; with
# `set_to_none=False` it stays a tensor of zeros, and an optimizer with momentum or weight decay
# keeps moving them. The next cell measures it: 5 steps of training, then the body is frozen,
# then 20 more steps.


# %%
def frozen_drift(build, set_to_none, steps=20):
    """How far the frozen body moves in `steps` steps after freezing, and its .grad then."""
    torch.manual_seed(SEED)
    model = bd.SpiralNet().to(device)
    optimizer = build(model.parameters())
    loss_fn = nn.CrossEntropyLoss()

    def one_step(i):
        x, y = (t.to(device) for t in batches[i % len(batches)])
        optimizer.zero_grad(set_to_none=set_to_none)
        loss_fn(model(x), y).backward()
        optimizer.step()

    for i in range(5):  # train a little first: the optimizer now has momentum / moments
        one_step(i)
    model.body.requires_grad_(False)  # freeze the body
    before = [p.detach().clone() for p in model.body.parameters()]
    for i in range(steps):
        one_step(i)
    moved = math.sqrt(
        sum((p - q).pow(2).sum().item() for p, q in zip(model.body.parameters(), before))
    )
    grad = model.body[0].weight.grad
    return moved, "None" if grad is None else f"zeros {list(grad.shape)}"


optimizers = {
    "SGD": lambda params: torch.optim.SGD(params, lr=bd.LEARNING_RATE),
    "SGD + momentum 0.9": lambda params: torch.optim.SGD(params, lr=bd.LEARNING_RATE, momentum=0.9),
    "AdamW, weight decay 0.01": lambda params: torch.optim.AdamW(
        params, lr=0.01, weight_decay=0.01
    ),
}
drift = {
    (name, set_to_none): frozen_drift(build, set_to_none)
    for name, build in optimizers.items()
    for set_to_none in (True, False)
}

fig, ax = plt.subplots(figsize=(7, 3))
for offset, set_to_none, colour in (
    (-0.2, True, PALETTE["blue"]),
    (0.2, False, PALETTE["vermillion"]),
):
    heights = [drift[(name, set_to_none)][0] for name in optimizers]
    ax.bar([i + offset for i in range(len(optimizers))], heights, width=0.4, color=colour,
           label=f"zero_grad(set_to_none={set_to_none})")  # fmt: skip
ax.set(xticks=range(len(optimizers)), xticklabels=list(optimizers), xlabel="optimizer",
       ylabel="distance moved (L2 norm)", title="How far frozen weights move in 20 steps")  # fmt: skip
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
for (name, set_to_none), (moved, grad) in drift.items():
    print(f"{name:25} set_to_none={set_to_none!s:5}  frozen .grad: {grad:12} moved {moved:.6f}")

# %% [markdown]
# *Alt text: grouped bars for three optimizers. With set_to_none=True every bar is zero. With
# set_to_none=False, plain SGD's bar is zero but SGD with momentum and AdamW have clearly
# non-zero bars: the frozen weights kept moving.*
#
# So freezing is safe with the default `zero_grad()`, and with plain SGD; it is not with
# `set_to_none=False` and momentum or weight decay. The clean fix is to build the optimizer over
# the parameters you mean to train: `torch.optim.SGD([p for p in model.parameters() if
# p.requires_grad], ...)`.
#
# **A new layer after the optimizer was built.** This one always bites. Fine-tuning code often
# loads a model, builds the optimizer, then replaces the classifier:
# `model.head = nn.Linear(64, 3)`. The new head's parameters are not in the optimizer, so they
# get gradients forever and are never updated; the model trains its body around a random head.
# A one-line check catches it: every parameter that requires grad must be in some param group.

# %%
torch.manual_seed(SEED)
model = bd.SpiralNet().to(device)
optimizer = make_optimizer(model)
model.head = nn.Linear(bd.HIDDEN, 3).to(device)  # the bug: a new head after the optimizer
head_before = model.head.weight.detach().clone()
body_before = model.body[0].weight.detach().clone()
for _ in range(5):
    train_epoch(model, optimizer, nn.CrossEntropyLoss(), batches, [])
held = {id(p) for group in optimizer.param_groups for p in group["params"]}
missing = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in held]
print(f"head moved {(model.head.weight - head_before).norm().item():.6f}, "
      f"body moved {(model.body[0].weight - body_before).norm().item():.6f}")  # fmt: skip
print("parameters the optimizer does not hold:", missing)

# %% [markdown]
# ## Exhibit 5 · Softmax before `CrossEntropyLoss`, next to the stale head
#
# Chapter 04 showed that `nn.CrossEntropyLoss` applies `log_softmax` itself, so a model that
# ends in `softmax` squashes twice: the loss cannot get near zero and its gradients shrink. Both
# this bug and the stale head share a signature: **a loss that falls, but slowly, and stalls
# high**, with gradients no bigger than normal. Nothing in the numbers screams; only the
# comparison does.

# %%
softmax_run = bd.run({"softmax_before_ce"}, steps=STEPS, seed=SEED)
stale_run = bd.run({"stale_head"}, steps=STEPS, seed=SEED)
runs = {"bug-free": (correct, "blue"), "softmax before CE": (softmax_run, "orange"),
        "new head after the optimizer": (stale_run, "vermillion")}  # fmt: skip

fig, (ax_val, ax_norm) = plt.subplots(1, 2, figsize=(11, 3.8))
for name, (curves, colour) in runs.items():
    ax_val.plot(curves["eval_step"], curves["val_loss"], color=PALETTE[colour], label=name)
    ax_norm.plot(range(1, STEPS + 1), curves["grad_norm"], color=PALETTE[colour], label=name, lw=1)
ax_val.set(xlabel="step", ylabel="validation loss", title="Validation loss")
ax_norm.set(xlabel="step", ylabel="gradient norm applied", title="Gradient norm")
ax_val.legend(fontsize=8)
fig.tight_layout()
plt.show()
for name, (curves, _) in runs.items():
    print(
        f"{name:30} val loss {curves['val_loss'][-1]:.3f}, val accuracy {curves['val_accuracy'][-1]:.1%}"
    )
for curves in (softmax_run, stale_run):  # stalls high, with gradients no larger than the bug-free
    assert curves["val_loss"][-1] > correct["val_loss"][-1] + 0.3
    assert max(curves["grad_norm"]) <= max(correct["grad_norm"])

# %% [markdown]
# *Alt text: left, three validation-loss curves; the bug-free one falls furthest, the
# softmax-first and stale-head ones stay near their starting value. Right, their gradient norms:
# the two buggy runs' norms are not larger than the bug-free run's.*

# %% [markdown]
# ## Simulation: the bug detector
#
# Tick any combination of bugs and watch the six panels: the grey dashed curves are the
# bug-free run, the orange-red ones the run with your bugs. Every run is real training of the
# museum's model (a progress bar shows while it runs; a combination you have seen before comes
# back from a cache at once). Things to try:
#
# * **validate without torch.no_grad()** alone, then with **history.append(loss)**: the first
#   leaves memory flat, the pair makes it climb;
# * **loss.backward(retain_graph=True)** alone, then with **history.append(loss)**;
# * **validate without model.eval()**: only the last panel changes;
# * **no optimizer.zero_grad()** with any other bug: it dominates every panel.
#
# *Without a widget front end this cell shows the starting state: the two memory bugs together.
# Graphs alive and activations held climb with every step (the activations in a staircase, one
# stair per validation), while loss, gradient norm and accuracy lie exactly on the bug-free run.*

# %%
bd.bug_detector_view(initial={"eval_records_graph", "kept_graph"}, steps=STEPS, seed=SEED)

# %% [markdown]
# ## Exhibit 6 · Bugs that do raise, and their silent cousins
#
# Some mistakes stop the loop with an error. The message is precise once you know how to read
# it; the danger is the "fix" that silences it. The next cell triggers four of them and prints
# the first sentence of each error.


# %%
def first_sentence(fn):
    """Run `fn` and return the first sentence of the RuntimeError it raises."""
    try:
        fn()
    except RuntimeError as err:
        return str(err).split(". ")[0].split("\n")[0]
    return "no error"


torch.manual_seed(SEED)
model = bd.SpiralNet().to(device)
x, y = (t.to(device) for t in batches[0])


def training_under_no_grad():
    with torch.no_grad():  # left over from an evaluation helper
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()


def in_place_after_save():
    hidden = torch.sigmoid(model.body[0](x))  # sigmoid saves its output for backward
    hidden[:, 0] = 0.0  # an in-place write into that saved output
    hidden.sum().backward()


def non_scalar_backward():
    per_example = nn.functional.cross_entropy(model(x), y, reduction="none")  # shape [40]
    per_example.backward()


def same_graph_twice():
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    loss.backward()


for fn in (training_under_no_grad, in_place_after_save, non_scalar_backward, same_graph_twice):
    print(f"{fn.__name__:24} → {first_sentence(fn)}")

# %% [markdown]
# * **Training under `no_grad`** raises at `backward()`: nothing was recorded. Its silent cousin
#   wraps only *part* of the forward, say a feature extractor, in `no_grad()` "for speed": the
#   loss still has a graph (through the head), backward runs, and the body never learns. Check
#   which parameters receive a gradient (next cell).
# * **In-place writes** bump a tensor's *version counter*. Autograd records the version of every
#   tensor it saves, and refuses to use one that changed since. Write `hidden = hidden * mask`
#   (a new tensor) instead of modifying in place.
# * **Non-scalar backward**: `backward()` needs one number to differentiate. Reduce first
#   (`.mean()`, as the default `reduction` does), or pass `gradient=torch.ones_like(...)`, which
#   is the same as `.sum()`. Mean and sum differ by the batch size, and so do their gradients.
# * **Backward twice through one graph** fails because the first backward freed it. As in the
#   carried-state case above, the fix is almost never `retain_graph=True`.

# %%
x_, y_ = batches[0]
versions = torch.ones(3)
print("version counter before an in-place add:", versions._version, end="")
versions.add_(1)
print(", after:", versions._version)

torch.manual_seed(SEED)
model = bd.SpiralNet()
with torch.no_grad():
    features = model.body(x_)  # the silent cousin: the body under no_grad
nn.functional.cross_entropy(model.head(features), y_).backward()
print("parameters with a gradient:", [n for n, p in model.named_parameters() if p.grad is not None])
print("parameters without one:   ", [n for n, p in model.named_parameters() if p.grad is None])

model.eval()  # Dropout off, so that both forwards below compute the same function
per_example = nn.functional.cross_entropy(model(x_), y_, reduction="none")
model.zero_grad()
per_example.backward(gradient=torch.ones_like(per_example))
via_ones = model.head.bias.grad.clone()
model.zero_grad()
nn.functional.cross_entropy(model(x_), y_, reduction="sum").backward()
assert torch.allclose(via_ones, model.head.bias.grad)
print(
    "backward(gradient=ones) gives exactly the gradient of .sum(); .mean() divides it by", len(y_)
)

# %% [markdown]
# ## Exhibit 7 · Data leakage
#
# Leakage is a bug in the data, not the loop: validation examples that the model also trained
# on. Validation accuracy then measures memory, not generalisation, and looks too good. The
# next cell uses a spiral whose arms overlap (angle noise `LEAK_NOISE`), so that even a perfect
# model cannot be right everywhere, and a wide MLP that can memorise its training points. It
# holds out 60 validation points and 60 test points, and trains twice: on the 180 training
# points only (honest), and on those plus the 60 validation points (leaky, as when a data set
# is de-duplicated or re-split after validation rows were copied into it). The test points are
# never trained on in either run.

# %%
from forge_course.data import make_spiral, train_val_split

X, y = make_spiral(n_per_class=100, classes=3, noise=LEAK_NOISE, seed=SEED)
X_tr, y_tr, X_held, y_held = train_val_split(X, y, val_fraction=0.4, seed=SEED)
split = {"validation": (X_held[:60], y_held[:60]), "test": (X_held[60:], y_held[60:])}


def train_wide(X_fit, y_fit, steps=300):
    """Full-batch Adam on a 2 → 128 → 128 → 3 MLP; validation and test accuracy as it trains."""
    torch.manual_seed(SEED)
    net = nn.Sequential(nn.Linear(2, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                        nn.Linear(128, 3)).to(device)  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    X_fit, y_fit = X_fit.to(device), y_fit.to(device)
    curves = {"train": [], "validation": [], "test": []}
    for step in range(1, steps + 1):
        opt.zero_grad()
        nn.functional.cross_entropy(net(X_fit), y_fit).backward()
        opt.step()
        if step % 20 == 0:
            curves["train"].append(accuracy(net, X_fit, y_fit))
            for name, (X_s, y_s) in split.items():
                curves[name].append(accuracy(net, X_s, y_s))
    return curves


honest = train_wide(X_tr, y_tr)
leaky = train_wide(
    torch.cat([X_tr, split["validation"][0]]), torch.cat([y_tr, split["validation"][1]])
)

fig, ax = plt.subplots(figsize=(7, 3.8))
at = range(20, 301, 20)
ax.plot(at, leaky["train"], color=PALETTE["grey"], label="training accuracy")
ax.plot(at, leaky["validation"], color=PALETTE["vermillion"], label="validation, leaky split")
ax.plot(at, honest["validation"], color=PALETTE["blue"], label="validation, honest split")
ax.plot(at, leaky["test"], ":", color=PALETTE["vermillion"], label="test, leaky run")
ax.plot(at, honest["test"], ":", color=PALETTE["blue"], label="test, honest run")
ax.set(xlabel="step", ylabel="accuracy", title="Validation accuracy with and without leakage")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
for name, run in (("honest", honest), ("leaky", leaky)):
    print(f"{name:6} train {run['train'][-1]:.1%}  validation {run['validation'][-1]:.1%}  "
          f"test {run['test'][-1]:.1%}")  # fmt: skip

# %% [markdown]
# *Alt text: the leaky run's validation accuracy climbs with its training accuracy, well above
# the honest run's validation accuracy, while the test accuracies of both runs (dotted) stay
# far below the leaky validation accuracy.*
#
# The signature: **validation accuracy that tracks training accuracy**, where an honest split
# shows a gap. The test set, untouched, gives the leaky run away. Other routes to the same
# bug: rows duplicated across the split, and preprocessing fitted on all the data (the mean and
# standard deviation for normalisation, a vocabulary, feature selection) before splitting. Split
# first; fit every statistic on the training part only.

# %% [markdown]
# ## Exhibit 8 · The wrong device
#
# A module's `.to(device)` moves it in place; a tensor's `.to(device)` returns a **new** tensor
# and leaves the original where it was. `x.to(device)` on a line of its own does nothing. If
# the model and the batch end up on different devices, PyTorch raises "Expected all tensors to
# be on the same device". The silent version forgets `.to(device)` for both: everything runs,
# on the CPU, while the GPU sits idle.
#
# On a machine with only a CPU there is no second device to get wrong, so this cell shows the
# same trap with a dtype (which behaves like a device: `.to()` returns a new tensor), and the
# check that catches both. On a machine with a GPU it also shows the real error.

# %%
print("devices here:", [str(d) for d in available_devices()])
batch = torch.zeros(2, 2)
batch.to(torch.float64)  # the result is thrown away
print("after batch.to(float64) alone:", batch.dtype)
batch = batch.to(torch.float64)
print("after batch = batch.to(float64):", batch.dtype)


def devices_used(model, *tensors):
    """Every device the model's parameters and the tensors live on: one, in a correct loop."""
    return {str(p.device) for p in model.parameters()} | {str(t.device) for t in tensors}


model = bd.SpiralNet().to(device)
x = batches[0][0].to(device)
print("model and batch on:", devices_used(model, x))
if device.type == "cpu":
    print("Only a CPU here: the mismatch cannot happen on this machine; the check above is the "
          "one to keep for a GPU machine.")  # fmt: skip
else:
    print("batch left on the CPU →", first_sentence(lambda: model(batches[0][0])))

# %% [markdown]
# ## The tools: gradient norms, clipping, NaN checks, anomaly detection
#
# **Log the gradient norm every step.** It is one number, it is free to compute next to the
# update, and it shows accumulation (Exhibit 1), vanishing gradients (a loop that does not
# learn) and explosions before the loss does.
#
# **Clip with `clip_grad_norm_`, and log what it returns.** `clip_grad_norm_(params, max_norm)`
# measures the global norm $n$; if $n$ is above `max_norm`, it multiplies every gradient by
# $\text{max\_norm} / (n + 10^{-6})$. It returns $n$, the norm **before** clipping, which is the
# number to log.
#
# By hand on chapter 04's gradient, with `max_norm=1`: $n = 5.16720$ (Exhibit 1), the factor is
# $1 / (5.16720 + 10^{-6}) = 0.193528$, so the clipped $\partial L / \partial W$ is
# $\begin{bmatrix} -0.212881 & -0.425762 \\ 0.348351 & 0.696702 \end{bmatrix}$, and the norm
# after clipping is $5.16720 \times 0.193528 = 0.9999998$: one, less the $10^{-6}$ that guards
# against dividing by zero.

# %%
W = torch.tensor([[0.5, -0.3], [0.2, 0.8]], dtype=torch.float64, requires_grad=True)
b = torch.zeros(2, dtype=torch.float64, requires_grad=True)
((W @ x1 + b - t1) ** 2).mean().backward()
returned = torch.nn.utils.clip_grad_norm_([W, b], max_norm=1.0).item()
after = torch.cat([W.grad.flatten(), b.grad.flatten()]).norm().item()
by_hand = {"returned": 5.16720, "factor": 0.193528,
           "clipped dL/dW": [[-0.212881, -0.425762], [0.348351, 0.696702]], "norm after": 0.9999998}  # fmt: skip
measured = {"returned": returned, "factor": W.grad[0, 0].item() / -1.1,
            "clipped dL/dW": W.grad.tolist(), "norm after": after}  # fmt: skip
for name, value in measured.items():
    torch.testing.assert_close(torch.tensor(value, dtype=torch.float64),
                               torch.tensor(by_hand[name], dtype=torch.float64), rtol=0, atol=5e-6)  # fmt: skip
    print(f"{name:14} by hand {str(by_hand[name]):42} torch {value}")
print("clip_grad_norm_ returned the norm before clipping, as worked out by hand.")

# %% [markdown]
# **Check for NaN, and find where it came from.** A NaN anywhere poisons every weight it
# touches within one step. Check the loss before `backward()` (`torch.isfinite(loss)`), and the
# gradients after it (`detectors.nonfinite_grads(model)`). When the loss is finite but a
# gradient is not, the culprit is in backward, and `torch.autograd.detect_anomaly()` finds it:
# it records where every forward operation was called, and stops backward at the first
# function that returns NaN, printing the forward line that created it.
#
# The classic case: a hand-written Euclidean distance, `sqrt(sum((a - b)²))`, on a row where
# `a == b`. The forward gives 0, a fine value; the derivative of $\sqrt{u}$ at $u = 0$ is
# infinite, and the chain rule multiplies that infinity by the zero difference: NaN.

# %%
prediction = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
target = torch.tensor([[1.0, 2.0], [0.0, 0.0]])  # the first row is already perfect


def distance_loss():
    difference = prediction - target
    squared = difference**2
    distance = squared.sum(dim=1).sqrt()
    return distance.mean()


loss = distance_loss()
loss.backward()
print("loss finite:", bool(torch.isfinite(loss)), f"({loss.item():.4f})")
print("gradient:", prediction.grad.tolist())
prediction.grad = None

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.autograd.detect_anomaly():
        try:
            distance_loss().backward()
        except RuntimeError as err:
            print("anomaly mode:", err)
where = [str(w.message) for w in caught if "Traceback of forward call" in str(w.message)]
lines = where[0].splitlines() if where else []
# The traceback's last frame in this notebook names the forward line; torch's own frames follow.
ours = [i for i, line in enumerate(lines) if "in distance_loss" in line]
print("created by:", lines[ours[-1] + 1].strip() if ours else "(no traceback recorded)")
prediction.grad = None

# %% [markdown]
# Anomaly mode names `PowBackward0`: the first backward function whose *output* held a NaN. The
# infinity came one step earlier, from `sqrt`'s backward; `pow`'s backward multiplied it by the
# zero difference. So read the named line and its neighbours. The fix is a norm whose backward
# handles zero, `torch.linalg.vector_norm(difference, dim=1)`, or `sqrt(u + ε)`:

# %%
distance = torch.linalg.vector_norm(prediction - target, dim=1).mean()
distance.backward()
print("vector_norm gradient:", prediction.grad.tolist())
prediction.grad = None

# %% [markdown]
# ## Exercise 3 · `ch07_mystery_loops`: name the bug
#
# Below are six versions of the museum's loop, **A** to **F**. Each one rewrites exactly one of
# the three functions above (`make_optimizer`, `train_epoch`, `evaluate`). Some of the rewrites
# are bugs, at most one per loop; one loop may be correct. Read the code, then look at what each
# loop did when it ran (the figure after the code), and label every loop with one code from:
#
# | code | the bug |
# | --- | --- |
# | `none` | no bug: the rewrite is harmless |
# | `missing_zero_grad` | `.grad` is not cleared before every backward |
# | `no_eval_mode` | validation runs with Dropout on |
# | `train_mode_not_restored` | training runs with Dropout off after the first validation |
# | `graph_kept_alive` | graph-carrying tensors are kept across batches |
# | `stale_optimizer` | some trained parameters are not in the optimizer |
# | `softmax_before_cross_entropy` | the loss receives probabilities |
# | `no_learning` | no update ever applies a gradient |
#
# These are the loop doctor's codes (last section).


# %%
def train_epoch_a(model, optimizer, loss_fn, batches, log):
    model.train()
    optimizer.zero_grad()
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        log.append(loss.item())


def evaluate_b(model, loss_fn, X, y):
    modes = {module: module.training for module in model.modules()}
    model.eval
    with torch.no_grad():
        loss = loss_fn(model(X.to(device)), y.to(device)).item()
    for module, training in modes.items():
        module.training = training
    return loss


def train_epoch_c(model, optimizer, loss_fn, batches, log):
    model.train()
    for x, y in batches:
        prediction = model(x.to(device))
        loss = loss_fn(prediction, y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        log.append(loss.detach().cpu().item())


def train_epoch_d(model, optimizer, loss_fn, batches, log):
    model.train()
    epoch_loss = 0.0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        epoch_loss += loss
    log.append(epoch_loss.item() / len(batches))


def make_optimizer_e(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=bd.LEARNING_RATE, momentum=0.9)
    model.head = nn.Linear(bd.HIDDEN, 3).to(device)  # a fresh classifier for our three classes
    return optimizer


def train_epoch_f(model, optimizer, loss_fn, batches, log):
    model.train()
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        probabilities = model(x).softmax(dim=1)
        loss = loss_fn(probabilities, y)
        loss.backward()
        optimizer.step()
        log.append(loss.item())


mystery = {
    "A": (make_optimizer, train_epoch_a, evaluate),
    "B": (make_optimizer, train_epoch, evaluate_b),
    "C": (make_optimizer, train_epoch_c, evaluate),
    "D": (make_optimizer, train_epoch_d, evaluate),
    "E": (make_optimizer_e, train_epoch, evaluate),
    "F": (make_optimizer, train_epoch_f, evaluate),
}

# %% [markdown]
# The next cell runs each loop for `MYSTERY_EPOCHS` epochs under instruments that do not change
# what the loop does: a forward hook on the loss function records each training loss, a step
# hook on the optimizer records the norm of the gradient each update applies
# (`detectors.grad_norm`), `detectors.ActivationWatch` counts the graphs alive after each
# update, and after every epoch the loop's own `evaluate` runs twice.


# %%
def examine(make_opt, train, validate, epochs=MYSTERY_EPOCHS):
    torch.manual_seed(SEED)
    model = bd.SpiralNet().to(device)
    optimizer = make_opt(model)
    loss_fn = nn.CrossEntropyLoss()
    held = nn.ParameterList(p for group in optimizer.param_groups for p in group["params"])
    seen = {"loss": [], "grad_norm": [], "graphs": [], "val": []}
    training = [False]
    loss_fn.register_forward_hook(
        lambda module, args, out: seen["loss"].append(out.item()) if training[0] else None
    )
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen["grad_norm"].append(detectors.grad_norm(held))
    )
    with detectors.ActivationWatch(model) as watch:
        optimizer.register_step_post_hook(
            lambda opt, args, kwargs: seen["graphs"].append(watch.live_graphs())
        )
        for _ in range(epochs):
            training[0] = True
            train(model, optimizer, loss_fn, batches, [])
            training[0] = False
            seen["val"].append([validate(model, loss_fn, X_val, y_val) for _ in range(2)])
    return seen


specimens = {name: examine(*functions) for name, functions in mystery.items()}

panels = {  # each column: its title, its y axis
    "loss": ("training loss", "cross-entropy"),
    "grad_norm": ("gradient norm", "L2 norm"),
    "graphs": ("graphs alive", "graphs"),
    "val_gap": ("gap between two evaluations", "|loss₁ − loss₂|"),
}
fig, axes = plt.subplots(len(specimens), 4, figsize=(12, 1.8 * len(specimens)), sharex="col",
                         sharey="col")  # fmt: skip
for row, (name, seen) in enumerate(specimens.items()):
    seen["val_gap"] = [abs(first - second) for first, second in seen["val"]]
    for col, (key, (title, ylabel)) in enumerate(panels.items()):
        ax = axes[row, col]
        ax.plot(range(1, len(seen[key]) + 1), seen[key], ".-" if key == "val_gap" else "-",
                color=PALETTE["blue"], lw=1)  # fmt: skip
        if key in ("loss", "grad_norm"):
            bd.log_axis(ax)
        ax.set_ylabel(ylabel, fontsize=8)
        if row == 0:
            ax.set_title(title)
    axes[row, 0].annotate(f"loop {name}", xy=(0, 0.5), xycoords="axes fraction", xytext=(-52, 0),
                          textcoords="offset points", rotation=90, ha="right", va="center",
                          fontsize=11, fontweight="bold")  # fmt: skip
for col, unit in enumerate(("optimizer update", "optimizer update", "optimizer update", "epoch")):
    axes[-1, col].set_xlabel(unit)
fig.suptitle(f"Six mystery loops, {MYSTERY_EPOCHS} epochs each, as the instruments saw them")
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: a grid with one row per loop A to F and four columns: training loss and gradient
# norm on log scales, graphs alive after each update, and the gap between two evaluations of
# the model after each epoch. The rows differ in the ways the exhibits above taught: look for a
# saw-tooth, a gap that is not zero, a loss that stalls high, gradients that stay small.*
#
# Set `labels` to a dict from each loop's letter to its code, for example
# `labels = {"A": "none", "B": "no_learning", ...}`.

# %% nbgrader={"grade_id": "ch07_mystery_loops", "solution": true}
labels = None
### BEGIN SOLUTION
labels = {
    "A": "missing_zero_grad",
    "B": "no_eval_mode",
    "C": "none",
    "D": "graph_kept_alive",
    "E": "stale_optimizer",
    "F": "softmax_before_cross_entropy",
}
### END SOLUTION

# %% nbgrader={"grade_id": "ch07_mystery_loops_tests", "grade": true, "points": 3}
# Visible tests: one label for each loop A to F, each one of the codes in the table; in the
# self-study notebook, each label is also checked against its answer key.
from forge_course.grading.ch07 import check_labels

check_labels(labels, "ch07_mystery_loops", loops=list("ABCDEF"))
print("labels: a valid code for each of the six loops (and, with an answer key, each right).")
### BEGIN HIDDEN TESTS
check_labels(
    labels,
    "ch07_mystery_loops",
    loops=list("ABCDEF"),
    correct={
        "A": "missing_zero_grad",
        "B": "no_eval_mode",
        "C": "none",
        "D": "graph_kept_alive",
        "E": "stale_optimizer",
        "F": "softmax_before_cross_entropy",
    },
    hints={
        "A": "Look at where `optimizer.zero_grad()` sits, and at the saw-tooth of its gradient "
        "norm, which restarts with every epoch.",
        "B": "Read the line of its `evaluate` that should switch to eval mode (what does "
        "`model.eval` without parentheses do?), and compare its two evaluations per epoch.",
        "C": "Zeroing after `step()` and logging `loss.detach().cpu().item()` are both fine: its "
        "panels match a healthy loop's.",
        "D": "`epoch_loss += loss` adds tensors, not numbers: look at its graphs-alive panel.",
        "E": "Which head's parameters does the optimizer hold after `make_optimizer_e` returns?",
        "F": "What does its loss function receive, logits or probabilities?",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## The loop doctor: all the detectors at once
#
# `forge_course.doctor.diagnose(fit)` runs a training function on a small seeded problem of its
# own (a tiny MLP with Dropout and a separate `head`, 7 training and 3 validation batches) with
# every instrument of this chapter attached: forward hooks, gradient hooks, every optimizer
# step, the loaders and the loss. Then it names each bug it saw, with a stable code (the codes
# of Exercise 3) and the evidence from the run. `fit` is called as
# `fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)`.
#
# Here is a loop with two of the museum's bugs in it, and the same loop repaired.

# %%
from forge_course.doctor import diagnose


def fit_buggy(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
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
            history.append(loss)  # bug: keeps every step's autograd nodes
        with torch.no_grad():  # bug: no model.eval(), so Dropout stays on
            val = sum(loss_fn(model(x.to(device)), y.to(device)).item() for x, y in val_loader)
        history.append(val / len(val_loader))
    return history


def fit_repaired(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
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
            history.append(loss.item())
        model.eval()
        with torch.no_grad():
            val = sum(loss_fn(model(x.to(device)), y.to(device)).item() for x, y in val_loader)
        history.append(val / len(val_loader))
    return history


print(diagnose(fit_buggy, device=device))
print()
print(diagnose(fit_repaired, device=device))

# %% [markdown]
# The doctor reports what it saw, not what it guesses: each finding carries the evidence from
# this run. Run it on your own loops, from Python or from a shell
# (`forge-course doctor script.py:fit`); and once you have answered Exercise 3, try it on the
# mystery loops too, by putting their pieces together into a `fit`.

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch07_q_grad_growth`).** A loop forgets `optimizer.zero_grad()`. It is fed the
# same batch again and again with `lr = 0`, so the weights never move and every `backward()`
# produces the same gradient $g$. After 10 `backward()` calls, the norm of `.grad` is how many
# times $\lVert g \rVert$? Set `grad_growth` to a number.
#
# **Question 2 (`ch07_q_frozen`).** You build `AdamW(model.parameters(), weight_decay=0.01)`,
# train for a while, then freeze the backbone with `requires_grad_(False)` and go on training
# with `optimizer.zero_grad()` (the default) at the start of every step. What happens to the
# frozen weights? Set `frozen_answer` to one letter.
#
# * **a**: weight decay keeps shrinking them a little at every step.
# * **b**: they stay exactly as they are: their `.grad` is `None`, so AdamW skips them.
# * **c**: PyTorch raises an error, because the optimizer holds parameters that do not require
#   grad.
# * **d**: Adam's moment estimates keep moving them, more slowly each step.
#
# **Question 3 (`ch07_q_kept_memory`).** Which of these loops makes the activation memory grow
# fastest, step after step? Set `memory_answer` to one letter.
#
# * **a**: training that logs `losses.append(loss)` after `loss.backward()`.
# * **b**: validation without `torch.no_grad()` that logs `val_loss.item()`.
# * **c**: validation without `torch.no_grad()` that logs `val_losses.append(val_loss)`.
# * **d**: training with `loss.backward(retain_graph=True)` that logs `loss.item()`.

# %% nbgrader={"grade_id": "ch07_questions", "solution": true}
grad_growth = None
frozen_answer = None
memory_answer = None
### BEGIN SOLUTION
grad_growth = 10
frozen_answer = "b"
memory_answer = "c"
### END SOLUTION

# %% nbgrader={"grade_id": "ch07_q_grad_growth", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(grad_growth, "ch07_q_grad_growth")
### BEGIN HIDDEN TESTS
check_number(
    grad_growth,
    "ch07_q_grad_growth",
    expected=10,
    hints={
        100: "the norm of k equal vectors added up is k times one norm; k² would be the norm squared.",
        math.sqrt(10): "√k is how sums of *independent* random gradients grow; identical "
        "gradients add up in a straight line.",
        2
        ** 10: "the sum grows linearly, not exponentially: each call adds g, it does not double .grad.",
        9: "count the first backward too: ten calls add ten gradients.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch07_q_frozen", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(frozen_answer, "ch07_q_frozen", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    frozen_answer,
    "ch07_q_frozen",
    choices="abcd",
    correct="b",
    why_not={
        "a": "that happens with zero_grad(set_to_none=False), when .grad is a tensor of zeros; "
        "the default leaves it None and the optimizer skips the parameter (Exhibit 4).",
        "c": "optimizers accept parameters that do not require grad; nothing is raised.",
        "d": "a parameter whose .grad is None is skipped entirely, moments and all.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch07_q_kept_memory", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(memory_answer, "ch07_q_kept_memory", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    memory_answer,
    "ch07_q_kept_memory",
    choices="abcd",
    correct="c",
    why_not={
        "a": "backward already freed those graphs' activations: the graphs pile up, but "
        "Exhibit 3's table shows no activation bytes held by them.",
        "b": "each validation graph is dropped with its loss at the next step: memory stays flat.",
        "d": "the retained graph is freed when `loss` is reassigned: one graph's activations at "
        "a time, not more each step.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# optimizer = make_optimizer(model)           # after the model is final: a later head is never trained
# for x, y in loader:
#     x, y = x.to(device), y.to(device)       # reassign: tensor.to() returns a new tensor
#     optimizer.zero_grad()                   # without it: .grad is the running sum, its norm grows
#     loss = loss_fn(model(x), y)             # logits in; no no_grad() around training
#     if not torch.isfinite(loss):            # a NaN poisons every weight in one step
#         raise FloatingPointError(f"loss is {loss.item()}")
#     loss.backward()                         # once per graph; no retain_graph=True to silence errors
#     norm = clip_grad_norm_(model.parameters(), max_norm)  # returns the norm before clipping: log it
#     optimizer.step()
#     log.append(loss.item())                 # a number: a kept tensor keeps its autograd nodes
# modes = {m: m.training for m in model.modules()}  # chapter 06's rule, before model.eval()
# model.eval()                                # without it: Dropout on, evaluations disagree
# with torch.no_grad():                       # without it: each forward records a graph
#     ...
# for m, training in modes.items():           # without it: the rest of training runs in eval
#     m.training = training                   #   mode (model.train() would unfreeze a frozen BN)
# ```
#
# * Every silent bug has a signature: the gradient norm (accumulation, vanishing, explosion),
#   the graphs and bytes still alive (kept tensors), two evaluations that disagree (train mode),
#   a loss that stalls high (softmax first, a stale head), validation that tracks training
#   (leakage).
# * A kept graph costs what backward has not freed: nodes after backward, every activation
#   without it.
# * A frozen parameter with the default `zero_grad()` stays put; with `set_to_none=False`,
#   momentum and weight decay move it.
# * `detect_anomaly()` names the first backward function that produced a NaN and the forward
#   line behind it; `clip_grad_norm_` returns the norm before clipping.
# * The loop doctor runs all of these checks on a whole loop.
#
# Next, chapter 08 puts the loop to work on the spiral, with optimizers, schedules and a
# scoreboard.
