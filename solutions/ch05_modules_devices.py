# %% [markdown]
# # Chapter 05 · nn.Module and devices
#
# A model is a tree of modules, and PyTorch finds everything it needs by walking that tree:
# the optimizer gets its parameters from it, a checkpoint is a list of its tensors, and
# `.to(device)` moves what hangs on it. Whatever is not in the tree is invisible to all three,
# and mostly they say nothing about it. The optimizer objects only to a model with no parameter
# at all, and the errors that come later (a layer left behind meeting a moved input, a strict
# `load_state_dict` missing keys) point far from the line that forgot to register something.
# All three appear below. This chapter shows how things get into the tree, what else hangs
# there (buffers and hooks), and how models, tensors and whole batches move between devices.
#
# **By the end of this chapter you can:**
#
# 1. predict what `parameters()`, `state_dict()` and `.to()` see from how `__init__` assigns
#    attributes, and repair a model whose layers sit in a plain Python list;
# 2. count a model's parameters by hand, and tell parameters from buffers;
# 3. record what any layer returns with a forward hook, remove the hook cleanly, and say why
#    you call `model(x)` and not `model.forward(x)`;
# 4. load a checkpoint that does not quite match (`strict=False`, `map_location`) and read
#    what it reports;
# 5. move models and nested batches to a device, knowing that `.to()` changes a module in
#    place but returns a new tensor.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
SIZES = [4, 8, 8, 3]  # the running example: 4 inputs, two hidden layers of 8, 3 outputs
BATCH = 16  # examples in the running example's training batch
STEPS = 60  # SGD steps in the "who gets trained" experiments
LR = 0.3  # learning rate of those steps
RECORD_BATCH = 512  # examples in the activation-recording example
TIMING_REPEATS = 100  # the explorer's latency is the median of this many calls

import io
import time

import matplotlib.pyplot as plt
import torch
from torch import nn

from forge_course import pick_device
from forge_course.device import describe
from forge_course.sims.display import PALETTE

device = pick_device()
# Where the demos move things. With only a CPU, the `meta` device stands in for a GPU: its
# tensors have a shape, a dtype and a device, but no data, so every move is still visible.
OTHER = device if device.type != "cpu" else torch.device("meta")
torch.manual_seed(SEED)
print("Running on", describe(device))
print("Moves are shown to:", OTHER)

# %% [markdown]
# ## What `self.name = value` does
#
# `nn.Module` overrides Python's `__setattr__`. When `__init__` runs `self.fc = nn.Linear(4, 8)`,
# the module looks at the value's type before storing it, and files it in one of three
# dictionaries that every Module has:
#
# | assigned in `__init__` | filed in | seen by |
# | --- | --- | --- |
# | an `nn.Parameter` | `self._parameters` | `parameters()` (so the optimizer), `state_dict()`, `.to()` |
# | an `nn.Module` | `self._modules` | all of the above, for everything it holds, recursively; `train()`/`eval()` |
# | a tensor passed to `self.register_buffer(name, t)` | `self._buffers` | `state_dict()`, `.to()`; **not** `parameters()` |
# | anything else: a plain tensor, a list, a dict, a number | the ordinary `__dict__` | nothing |
#
# The last row holds the trap. A Python list of layers is "anything else": the list is stored
# as a plain attribute, and `nn.Module` never looks inside it. The next cell assigns one of
# each and asks where each one went.


# %%
class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)  # a Module
        self.scale = nn.Parameter(torch.ones(1))  # a Parameter
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))  # a buffer
        self.offset = torch.zeros(2)  # a plain tensor
        self.layers = [nn.Linear(2, 2)]  # a plain list that holds a Module


tiny = Tiny()
registries = ("_modules", "_parameters", "_buffers")
for attr in ("fc", "scale", "calls", "offset", "layers"):
    where = [name for name in registries if attr in getattr(tiny, name)]
    print(f"self.{attr:7} is filed in {where[0] if where else '__dict__ (not registered)'}")
print("named_parameters():", [name for name, _ in tiny.named_parameters()])
print("state_dict():      ", list(tiny.state_dict()))

# %% [markdown]
# `offset` and the layer inside `layers` appear nowhere. The second `nn.Linear` still works if
# `forward` calls it; it is simply not part of the model as far as PyTorch is concerned.
#
# ## The running example: a model that hides its layers
#
# Here is a small multi-layer perceptron, 4 → 8 → 8 → 3, written the way many first attempts
# are: the hidden layers go into a list, so that the number of layers can follow `sizes`.
# Its forward pass is right. Everything else about it is quietly broken.


# %%
class PlainListMLP(nn.Module):
    """The running example, with its bug: the hidden layers sit in a plain Python list."""

    def __init__(self, sizes):
        super().__init__()
        pairs = list(zip(sizes[:-1], sizes[1:]))  # [(4, 8), (8, 8), (8, 3)]
        self.hidden = [nn.Linear(n_in, n_out) for n_in, n_out in pairs[:-1]]
        self.head = nn.Linear(*pairs[-1])

    def forward(self, x):
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


# %% [markdown]
# ### Counting parameters by hand
#
# `nn.Linear(n_in, n_out)` holds a weight of shape `[n_out, n_in]` and a bias of `n_out`
# values, so $n_\text{in} \cdot n_\text{out} + n_\text{out}$ parameters. For the running
# example:
#
# | layer | weight | bias | values |
# | --- | --- | --- | --- |
# | hidden 0, `Linear(4, 8)` | $4 \cdot 8 = 32$ | 8 | 40 |
# | hidden 1, `Linear(8, 8)` | $8 \cdot 8 = 64$ | 8 | 72 |
# | head, `Linear(8, 3)` | $8 \cdot 3 = 24$ | 3 | 27 |
# | **total** | | | **139**, in 6 tensors |
#
# `PlainListMLP.parameters()` sees only the head: 27 values in 2 tensors. The other
# $139 - 27 = 112$ values, $112 / 139 \approx 81\%$ of the model, are invisible. The next cell
# counts both ways.

# %%
torch.manual_seed(SEED)
broken = PlainListMLP(SIZES)
broken_layers = {"hidden 0": broken.hidden[0], "hidden 1": broken.hidden[1], "head": broken.head}
by_hand = {"hidden 0": 40, "hidden 1": 72, "head": 27}
for name, layer in broken_layers.items():
    counted = sum(p.numel() for p in layer.parameters())
    assert counted == by_hand[name]
    print(f"{name:9} {counted:4} values")
in_forward = sum(by_hand.values())
seen = sum(p.numel() for p in broken.parameters())
assert (in_forward, seen) == (139, 27)
print(f"forward uses {in_forward} values; parameters() holds {seen}, in "
      f"{len(list(broken.parameters()))} tensors: {in_forward - seen} are invisible "
      f"({(in_forward - seen) / in_forward:.0%}).")  # fmt: skip
print("state_dict():", list(broken.state_dict()))

# %% [markdown]
# ### The optimizer never updates what it cannot see
#
# An optimizer is built from `model.parameters()`, so here it gets the head only. It does not
# complain: only a model with *no* registered parameter makes it raise, and two tensors are
# enough to keep it quiet. The next cell shows the one error, then trains the broken model for
# `STEPS` steps and measures how far each layer moved. (It trains on the CPU on purpose: the
# next section shows that this model cannot run anywhere else.)


# %%
class AllInAList(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(2, 2)]


try:
    torch.optim.SGD(AllInAList().parameters(), lr=LR)
except ValueError as err:
    print("with no registered parameter:", err)
else:
    raise AssertionError("the optimizer accepted a model with no registered parameter")

gen = torch.Generator().manual_seed(SEED)
x_train = torch.randn(BATCH, SIZES[0], generator=gen)
teacher = torch.randn(SIZES[0], SIZES[-1], generator=gen)
y_train = torch.sin(x_train @ teacher)  # a smooth target the MLP can learn


def train(model, steps=STEPS):
    """SGD on the fixed batch; the loss before every step, and each layer's largest move."""
    layers = {"hidden 0": model.hidden[0], "hidden 1": model.hidden[1], "head": model.head}
    start = {name: layer.weight.detach().clone() for name, layer in layers.items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x_train), y_train)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    moved = {
        name: (layer.weight - start[name]).abs().max().item() for name, layer in layers.items()
    }
    return losses, moved


broken_losses, broken_moved = train(broken)
for name, change in broken_moved.items():
    print(f"{name:9} largest weight change after {STEPS} steps: {change:.6f}")
print(f"loss {broken_losses[0]:.4f} → {broken_losses[-1]:.4f}: only the head learned.")

# %% [markdown]
# The hidden weights moved by exactly 0. Backward did compute their gradients (autograd
# follows the forward pass, list or no list), but no optimizer was told about them, so
# `.grad` piled up on them and nobody read it.
#
# ### `.to()` does not move what it cannot see, and devices must match
#
# `.to(device)` walks the same tree. After `.to(OTHER)` the head is on `OTHER` and the
# hidden layers are still on the CPU. Every operation needs all of its tensors on one device
# (the one exception: a 0-dimensional CPU tensor, such as `torch.tensor(2.0)`, may join a GPU
# operation), and PyTorch never copies between devices behind your back. So the first hidden
# layer, still on the CPU, receives an input that is not:

# %%
torch.manual_seed(SEED)
moved = PlainListMLP(SIZES).to(OTHER)
print("head:    ", moved.head.weight.device)
print("hidden 0:", moved.hidden[0].weight.device)
try:
    moved(torch.randn(2, SIZES[0], device=OTHER))
except RuntimeError as err:
    print("RuntimeError:", err)
else:
    raise AssertionError("a layer left on the CPU took an input on another device")
scalar = torch.tensor(2.0)  # the exception to the rule: a 0-dimensional CPU tensor
print("0-dim CPU tensor × tensor on OTHER gives a tensor on", (scalar * moved.head.weight).device)

# %% [markdown]
# On a GPU the message starts *"Expected all tensors to be on the same device, but …"* and names
# the two devices; with the `meta` stand-in it reads as printed above. Either way the message
# points at the line that met the mismatch, not at the line that caused it, here `__init__`.
# When it appears, look for a tensor that was never moved: a plain attribute, a layer in a
# list, or a batch moved with `x.to(device)` but not assigned (last section).
#
# ## `nn.ModuleList`: a list that registers
#
# `nn.ModuleList` is a Python list that is also a Module. Assigning it registers it in
# `_modules`, and it registers each item as a child named `"0"`, `"1"`, …, so the hidden
# layers' tensors get the names `hidden.0.weight`, `hidden.0.bias`, `hidden.1.weight`, and so
# on. It has no `forward`: you iterate over it, exactly as over the list. Its relatives:
# `nn.ModuleDict` for layers by name, `nn.ParameterList` and `nn.ParameterDict` for bare
# parameters, and `nn.Sequential` for layers that always run one after another as one call.
#
# ## Exercise 1 · `ch05_repair_model`: register the hidden layers
#
# Write `MLP(sizes)`: the same computation as `PlainListMLP` (a ReLU after every hidden layer,
# none after the head), with every layer registered. Keep the hidden layers in `self.hidden`,
# an `nn.ModuleList` holding only the `nn.Linear` layers, and the last layer in `self.head`,
# so that the `state_dict` keys are exactly `hidden.0.weight`, `hidden.0.bias`, …,
# `head.weight`, `head.bias`: the names a checkpoint of the intended model carries. `sizes`
# has at least two numbers; `MLP([3, 5])` has no hidden layer at all.
#
# The check counts the parameters, reads the names, compares outputs with fixed weights,
# moves the model with `.to()` (to `meta` as well) and checks that a backward pass reaches
# every parameter that `model.parameters()` lists.


# %% nbgrader={"grade_id": "ch05_repair_model", "solution": true}
class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        ### BEGIN SOLUTION
        pairs = list(zip(sizes[:-1], sizes[1:]))
        self.hidden = nn.ModuleList([nn.Linear(n_in, n_out) for n_in, n_out in pairs[:-1]])
        self.head = nn.Linear(*pairs[-1])
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)
        ### END SOLUTION


# %% nbgrader={"grade_id": "ch05_repair_model_tests", "grade": true, "points": 3}
# Visible tests: MLP([4, 8, 8, 3]) on the CPU, compared with the reference.
from forge_course.grading import ch05

ch05.check_repair_model(MLP)
print("MLP: 139 parameters, the right names and outputs, moves with .to(), gradients reach all.")
### BEGIN HIDDEN TESTS
ch05.check_repair_model(MLP, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Broken and repaired, trained side by side
#
# The next cell builds the broken model and the repaired one (the course's reference `MLP`)
# from the same seed. They create their layers in the same order, so they start from the same
# weights, and the only difference is what the optimizer is given.

# %%
from forge_course.reference import modules as ref_modules

torch.manual_seed(SEED)
broken = PlainListMLP(SIZES)
torch.manual_seed(SEED)
repaired = ref_modules.MLP(SIZES)
for a, b in zip([*broken.hidden, broken.head], [*repaired.hidden, repaired.head]):
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
print(f"same start; the optimizer is given {sum(p.numel() for p in broken.parameters())} values "
      f"(broken) and {sum(p.numel() for p in repaired.parameters())} (repaired).")  # fmt: skip

broken_losses, broken_moved = train(broken)
repaired_losses, repaired_moved = train(repaired)

fig, (ax_loss, ax_move) = plt.subplots(1, 2, figsize=(11, 3.6))
ax_loss.plot(repaired_losses, color=PALETTE["blue"], label="nn.ModuleList (repaired)")
ax_loss.plot(broken_losses, color=PALETTE["vermillion"], label="plain list (broken)")
ax_loss.set(xlabel="step", ylabel="training loss (MSE)", title="Same start, same data, same lr")
ax_loss.legend(fontsize=8)
names = list(repaired_moved)
positions = torch.arange(len(names)).float()
ax_move.bar(positions - 0.2, [repaired_moved[n] for n in names], 0.4, color=PALETTE["blue"],
            label="nn.ModuleList (repaired)")  # fmt: skip
ax_move.bar(positions + 0.2, [broken_moved[n] for n in names], 0.4, color=PALETTE["vermillion"],
            label="plain list (broken)")  # fmt: skip
ax_move.set_xticks(positions.tolist(), names)
ax_move.set(xlabel="layer", ylabel=f"largest weight change in {STEPS} steps",
            title="Which layers were trained")  # fmt: skip
ax_move.legend(fontsize=8)
fig.tight_layout()
plt.show()
for name in names:
    print(
        f"{name:9} moved {broken_moved[name]:.6f} (broken), {repaired_moved[name]:.6f} (repaired)"
    )
print(f"loss after {STEPS} steps: {broken_losses[-1]:.4f} (broken), {repaired_losses[-1]:.4f} "
      "(repaired)")  # fmt: skip

# %% [markdown]
# *Alt text: left, two loss curves over 60 steps from the same starting loss; the repaired
# model's falls further than the broken one's. Right, bars of each layer's largest weight
# change: the broken model's hidden layers have no bar at all (a change of exactly 0), its
# head has one; all three layers of the repaired model moved.*
#
# The broken model still learns a little, through its head, which is what makes the bug hard
# to spot: the loss goes down, just not as far as it should.
#
# ## Buffers: state that is not learned
#
# Some tensors belong to a model without being trained by gradient descent: BatchNorm's running
# mean and variance, a fixed mask, the mean and spread used to standardise inputs. Register
# them with `self.register_buffer(name, tensor)`. A buffer is saved in `state_dict()` and moves
# with `.to()`, but it is not in `parameters()`, so no optimizer touches it. With
# `persistent=False` it still moves with the model, but is left out of the checkpoint: right
# for something cheap to recompute, such as a cached lookup table.
#
# | | `nn.Parameter` | buffer | buffer, `persistent=False` | plain tensor attribute |
# | --- | --- | --- | --- | --- |
# | in `parameters()` (so updated by the optimizer) | yes | no | no | no |
# | in `state_dict()` (so saved and loaded) | yes | yes | no | no |
# | moved by `.to()` | yes | yes | yes | no |
#
# The next cell builds a module with one of each and checks every cell of that table.


# %%
class Standardize(nn.Module):
    """x ↦ weight · (x − mean) / std: a learned weight, fixed statistics, a cached table."""

    def __init__(self, mean, std):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(len(mean)))
        self.register_buffer("mean", torch.as_tensor(mean))
        self.register_buffer("std", torch.as_tensor(std))
        self.register_buffer("table", torch.arange(4.0), persistent=False)
        self.note = torch.zeros(1)  # plain attribute: forgotten by everything

    def forward(self, x):
        return self.weight * (x - self.mean) / self.std


scaler = Standardize([0.5, -1.0], [2.0, 4.0]).to(OTHER)
table = {
    "in parameters()": {name for name, _ in scaler.named_parameters()},
    "in state_dict()": set(scaler.state_dict()),
    "moved by .to()": {n for n in ("weight", "mean", "std", "table", "note")
                       if getattr(scaler, n).device == torch.empty(0, device=OTHER).device},
}  # fmt: skip
expected = {
    "in parameters()": {"weight"},
    "in state_dict()": {"weight", "mean", "std"},
    "moved by .to()": {"weight", "mean", "std", "table"},
}
assert table == expected
for row, members in table.items():
    print(f"{row:16} {sorted(members)}")

# %% [markdown]
# BatchNorm is the buffer everyone meets first. Its `weight` and `bias` are parameters; its
# `running_mean`, `running_var` and `num_batches_tracked` are buffers, updated by the
# **forward pass** in training mode, with no optimizer involved:

# %%
norm = nn.BatchNorm1d(3)
print("parameters:", [name for name, _ in norm.named_parameters()])
print("buffers:   ", [name for name, _ in norm.named_buffers()])
before = norm.running_mean.clone()
norm(torch.randn(64, 3, generator=torch.Generator().manual_seed(SEED)) + 5.0)  # one forward
print(f"running_mean {before.tolist()} → {[round(v, 3) for v in norm.running_mean.tolist()]} "
      f"after one forward, num_batches_tracked = {norm.num_batches_tracked.item()}")  # fmt: skip

# %% [markdown]
# With the default momentum of 0.1 the running mean moves a tenth of the way to the batch mean
# (about 5 here), so to about 0.5 after one batch. Keep BatchNorm layers in a plain list and
# these statistics are neither saved nor moved: the module explorer below shows it.
#
# ## Calling the model, or calling `.forward`
#
# `model(x)` runs `nn.Module.__call__`, which does more than `forward`: it runs the module's
# **forward pre-hooks**, then `forward`, then its **forward hooks** (and sets up backward hooks
# if there are any). A forward hook is a function `hook(module, inputs, output)` attached with
# `module.register_forward_hook(hook)`; it sees every output of that module, which makes it
# the tool for recording activations, checking for NaNs, or measuring shapes without touching
# the model's code.
#
# `model.forward(x)` calls the method and nothing else, so the model's own hooks do not run.
# The submodules' hooks still do, because `forward` calls *them* as `self.head(x)`. The next
# cell counts.

# %%
torch.manual_seed(SEED)
model = ref_modules.MLP(SIZES)
calls = {"model": 0, "head": 0}


def counter(key):
    def hook(module, inputs, output):
        calls[key] += 1

    return hook


on_model = model.register_forward_hook(counter("model"))
on_head = model.head.register_forward_hook(counter("head"))
x = torch.randn(2, SIZES[0])
model(x)
print("after model(x):        ", calls)
model.forward(x)
print("after model.forward(x):", calls)
on_model.remove()
on_head.remove()

# %% [markdown]
# The model's hook ran once, for `model(x)` only; the head's ran twice. Call the model, never
# its `forward`: hooks that others attach (a model-summary tool, a feature extractor, the
# recorder you write next) would be skipped, silently.
#
# **Hooks stay until removed.** `register_forward_hook` returns a handle; `handle.remove()`
# detaches the hook. A notebook cell that registers a hook and is run three times leaves three
# hooks, each firing on every forward pass, each keeping whatever it stores:

# %%
seen_shapes, handles = [], []
for run in range(1, 4):  # stands for running a registering cell three times
    handles.append(
        model.head.register_forward_hook(lambda m, i, out: seen_shapes.append(tuple(out.shape)))
    )  # a real re-run would lose the earlier handles; this demo keeps them to clean up
    print(f"after run {run}: {len(model.head._forward_hooks)} hook(s) on model.head")
model(x)
print("one forward pass recorded", len(seen_shapes), "outputs:", seen_shapes)
for handle in handles:
    handle.remove()

# %% [markdown]
# ### What a hook sees, and what it keeps
#
# A hook sees the *module's* output. In our MLP the ReLU is a function call inside `forward`,
# not a module, so no hook can see it: a hook on `hidden.0` records the values *before* the
# ReLU, negatives included.
#
# What a hook stores stays in memory until you drop it. Recording the outputs of `hidden.0`,
# `hidden.1` and `head` for a batch of 512 float32 examples keeps
# $512 \cdot (8 + 8 + 3) \cdot 4 = 512 \cdot 19 \cdot 4 = 38{,}912$ bytes. The count grows with
# the batch and with the layers' widths, and a hook that is never removed adds it again on
# every forward pass: that is why a recorder must remove its hooks. The next cell records with
# the reference answer to the next exercise and checks the byte count.

# %%
gen = torch.Generator().manual_seed(SEED)
x_record = torch.randn(RECORD_BATCH, SIZES[0], generator=gen)
recorded = ref_modules.record_activations(repaired, x_record, ["hidden.0", "hidden.1", "head"])
kept = sum(t.numel() * t.element_size() for t in recorded.values())
assert kept == RECORD_BATCH * (8 + 8 + 3) * 4 == 38_912
print(f"recorded {[f'{k} {list(v.shape)}' for k, v in recorded.items()]}: {kept:,} bytes")
print("hooks left on the model:", sum(len(m._forward_hooks) for m in repaired.modules()))

fig, ax = plt.subplots(figsize=(7, 3.4))
for (name, values), colour in zip(
    recorded.items(), (PALETTE["blue"], PALETTE["orange"], PALETTE["green"])
):
    ax.hist(values.flatten().tolist(), bins=60, histtype="step", lw=1.5, color=colour, label=name)
ax.axvline(0, color=PALETTE["grey"], lw=0.8)
ax.set(xlabel="recorded output value", ylabel="count",
       title=f"What forward hooks saw: {RECORD_BATCH} inputs, trained MLP")  # fmt: skip
ax.legend(fontsize=8)
plt.show()
negative = (recorded["hidden.0"] < 0).float().mean().item()
print(f"{negative:.0%} of hidden.0's recorded outputs are negative: the ReLU comes after the hook.")

# %% [markdown]
# *Alt text: outlines of three histograms of recorded values, one per layer, spread on both
# sides of a vertical line at 0; the printed line gives the share of negative values for
# `hidden.0`.*
#
# ## Exercise 2 · `ch05_activation_recorder`: record with hooks, leave nothing behind
#
# Write `record_activations(model, x, layer_names)` that returns a dict mapping each name in
# `layer_names` to what that submodule returned while the model ran **once** on `x`.
#
# * Names are spelled as in `model.named_modules()`: `"hidden.0"`, `"encoder.2.0"`; `""` is the
#   model itself. `model.get_submodule(name)` finds the module.
# * Store `output.detach().clone()`: detached, so nothing keeps the graph alive, and copied, so
#   a later in-place operation (`nn.ReLU(inplace=True)`) cannot change what you recorded.
# * A module that runs twice in one forward pass keeps its last output.
# * Leave no hook behind: remove your hooks, and only yours, before returning, **even if the
#   forward pass raises** (`try:` … `finally:`). Hooks the caller had put on the model stay.
# * If you create the hook functions in a loop, make sure each one knows its own name (a loop
#   variable is read when the hook *runs*, after the loop has ended).
#
# `x` is already on the model's device. The visible check uses an `nn.Sequential` with an
# in-place ReLU; the hidden one adds nested modules, a layer used twice, and every device.


# %% nbgrader={"grade_id": "ch05_activation_recorder", "solution": true}
def record_activations(model, x, layer_names):
    ### BEGIN SOLUTION
    recorded = {}

    def recorder(name):
        def hook(module, inputs, output):
            recorded[name] = output.detach().clone()

        return hook

    handles = []
    try:
        for name in layer_names:
            handles.append(model.get_submodule(name).register_forward_hook(recorder(name)))
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return recorded
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch05_activation_recorder_tests", "grade": true, "points": 3}
# Visible tests: Sequential(Linear, ReLU(inplace=True), Linear) with names "0", "1" and "".
from forge_course.grading import ch05

ch05.check_activation_recorder(record_activations)
print("record_activations: right outputs, detached copies, one pass, no hook left behind.")
### BEGIN HIDDEN TESTS
ch05.check_activation_recorder(record_activations, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Simulation: the module explorer
#
# The explorer walks a model the way `named_modules()` does, and also looks inside plain
# lists, tuples and dicts among its attributes, where `nn.Module` never looks. Each line is one
# submodule with its own parameters, buffers, hooks and the devices its tensors are on.
#
# * **model**: the running example; the same with a BatchNorm after each hidden layer (watch
#   the buffers); the same with a forward hook on the last hidden layer.
# * **layers in**: a plain list or an `nn.ModuleList`.
# * **device**: as built, or after `.to(OTHER)`.
#
# Try: BatchNorm in a plain list after `.to()`: the statistics stay behind and `state_dict()`
# has 2 entries instead of 16. The hook in a plain list still fires (it lives on the layer
# object), but `model.get_submodule("hidden.1")` cannot reach that layer, so a recorder could
# not attach to it by name.
#
# *Without a widget front end this cell shows the running example after `.to()`: first in a
# plain list, then in an `nn.ModuleList`, as two tables.*

# %%
from forge_course.sims.module_explorer import explore_preset, module_explorer_view

module_explorer_view(target=str(OTHER))

# %% [markdown]
# *Alt text: two tables of the running example's modules, one line per module with columns
# module, parameters, buffers, hooks, device. In the plain-list table the two hidden layers are
# shaded and marked ✗ (not registered), and their device is cpu while the head's is the target;
# the title says model.parameters() holds 27 of 139 values. In the ModuleList table every line
# is registered and on the target device, 139 of 139 values.*
#
# Each interaction rebuilds a model, moves it and walks it. The next cell times that on this
# machine, and, separately, the drawing of the table.

# %%
from forge_course.sims.module_explorer import draw

explore_preset("MLP with BatchNorm", "plain list", moved_to=str(OTHER))  # warm-up
timings = []
for _ in range(TIMING_REPEATS):
    start = time.perf_counter()
    exploration = explore_preset("MLP with BatchNorm", "plain list", moved_to=str(OTHER))
    timings.append(time.perf_counter() - start)
engine_ms = sorted(timings)[len(timings) // 2] * 1e3
start = time.perf_counter()
figure = draw(exploration, target=str(OTHER))
figure.canvas.draw()
draw_ms = (time.perf_counter() - start) * 1e3
plt.close(figure)
print(f"engine: {engine_ms:.2f} ms per interaction (median of {TIMING_REPEATS}); "
      f"drawing the table: {draw_ms:.0f} ms.")  # fmt: skip

# %% [markdown]
# ## `state_dict` and `load_state_dict(strict=False)`
#
# `state_dict()` maps each parameter's and each persistent buffer's dotted name to its tensor.
# `load_state_dict(sd)` copies values in by name. By default (`strict=True`) any name that is
# missing from `sd`, or in `sd` but not in the model, raises an error that lists them. With
# `strict=False` it loads every name that matches and *returns* the two lists, as
# `missing_keys` and `unexpected_keys`; what was missing keeps whatever values it had. A shape
# that does not match raises in both modes.
#
# A checkpoint of the broken model shows why you must read those lists. It holds 2 entries,
# the head's, because the hidden layers were never in its `state_dict()`.

# %%
torch.manual_seed(SEED)
checkpoint = PlainListMLP(SIZES).state_dict()  # what torch.save would have written
torch.manual_seed(SEED + 1)
fresh = ref_modules.MLP(SIZES)
start_hidden = fresh.hidden[0].weight.detach().clone()
try:
    fresh.load_state_dict(checkpoint)
except RuntimeError as err:
    print("strict=True raises:", str(err).splitlines()[1].strip())
else:
    raise AssertionError("strict=True loaded a checkpoint with keys missing")
report = fresh.load_state_dict(checkpoint, strict=False)
print("strict=False returns missing_keys:", report.missing_keys)
print("                  unexpected_keys:", report.unexpected_keys)
assert torch.equal(fresh.hidden[0].weight, start_hidden)
assert torch.equal(fresh.head.weight, checkpoint["head.weight"])
print("the head was loaded; hidden.0.weight still holds its random initial values.")
try:
    fresh.load_state_dict({**checkpoint, "head.bias": torch.zeros(5)}, strict=False)
except RuntimeError as err:
    print("a wrong shape raises even with strict=False:", str(err).splitlines()[1].strip())

# %% [markdown]
# No warning was printed: `strict=False` is a promise that you will read the report. It is the
# right tool when the difference is intended (a new head on a pre-trained body: the head's
# keys are missing, on purpose). When names merely changed, rename the keys instead, and load
# strictly:

# %%
renamed = {key.replace("hidden.", "layers."): value for key, value in repaired.state_dict().items()}
print("a checkpoint with other names:", list(renamed)[:2], "...")
fixed = {key.replace("layers.", "hidden."): value for key, value in renamed.items()}
print("renamed back and loaded strictly:", fresh.load_state_dict(fixed))

# %% [markdown]
# ## `map_location`: where loaded tensors go
#
# `torch.save` records, for each tensor, the device it was on, and `torch.load` puts it back
# there. A checkpoint written on `cuda:0` therefore fails to load on a machine without CUDA,
# unless `map_location` says where the tensors should go instead: `torch.load(path,
# map_location="cpu")`, or `map_location=device`. Pass it every time and the question of where
# the file came from disappears. The next cell saves the repaired model from `device`, lets a
# `map_location` function report the device each tensor was saved from, and loads the file
# to `OTHER`. (On a CPU-only machine every tensor was saved from `cpu`; the file cannot
# record a GPU that was not there.)

# %%
buffer = io.BytesIO()
torch.save(repaired.to(device).state_dict(), buffer)
repaired.to("cpu")
saved_from = set()


def report_location(storage, location):
    saved_from.add(location)  # the device the file recorded for this tensor
    return storage  # leave it on the CPU


buffer.seek(0)
torch.load(buffer, map_location=report_location, weights_only=True)
print("the file recorded:", sorted(saved_from))
buffer.seek(0)
loaded = torch.load(buffer, map_location=OTHER, weights_only=True)
print("loaded with map_location=OTHER:", sorted({str(t.device) for t in loaded.values()}))

# %% [markdown]
# ## `.to()`: in place for a module, a new tensor for a tensor
#
# `model.to(device)` moves the model's parameters and buffers and returns the model itself, so
# `model.to(device)` and `model = model.to(device)` do the same thing. `x.to(device)` leaves `x`
# where it was and returns a **new** tensor on `device` (or `x` itself, with no copy, if it is
# already there). A bare `x.to(device)` moves a copy and throws it away.

# %%
x = torch.ones(2, SIZES[0])
x.to(OTHER)  # the classic bug: the moved copy is discarded
print("after x.to(OTHER):      x is on", x.device)
x = x.to(OTHER)
print("after x = x.to(OTHER):  x is on", x.device)

torch.manual_seed(SEED)
model = ref_modules.MLP(SIZES)
returned = model.to(OTHER)
print("model.to(OTHER) returns the model itself:", returned is model,
      "| its parameters are on", next(model.parameters()).device)  # fmt: skip
y = torch.ones(3)
print("a tensor already on the device comes back as itself:", y.to("cpu") is y)

# %% [markdown]
# A batch is rarely one tensor. A `DataLoader` hands out whatever the dataset and the collate
# function build: a tuple `(inputs, targets)`, a dict of tensors with some strings in it, a
# named tuple. `.to()` exists on tensors and modules only; a dict has none, so each tensor
# inside must be moved, and the structure rebuilt around them.
#
# ## Exercise 3 · `ch05_to_device`: move a nested batch
#
# Write `to_device(batch, device)` that returns a copy of `batch` with every tensor replaced by
# `tensor.to(device)`:
#
# * dicts come back as dicts with the same keys, lists as lists, tuples as tuples, and a
#   **named tuple** as the same named tuple type (it takes its fields as separate arguments:
#   `type(batch)(*items)`);
# * containers may be nested to any depth;
# * anything else (numbers, strings, `None`, NumPy arrays) comes back as it is;
# * the batch passed in is not changed.
#
# The check moves batches to the `meta` device, so that a tensor that did not move shows up
# even on a machine with only a CPU; the hidden check adds deep nesting and every device.


# %% nbgrader={"grade_id": "ch05_to_device", "solution": true}
def to_device(batch, device):
    ### BEGIN SOLUTION
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch05_to_device_tests", "grade": true, "points": 2}
# Visible tests: a dict holding tensors, a named tuple, strings and numbers, moved to meta.
from forge_course.grading import ch05

ch05.check_to_device(to_device)
print("to_device: every tensor moved, every container kept its type, the input untouched.")
### BEGIN HIDDEN TESTS
ch05.check_to_device(to_device, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch05_q_param_count`).** Count by hand: how many values does
# `model.parameters()` hold for the model below? Set `param_count` to a number.
#
# ```python
# model = nn.Sequential(nn.Linear(10, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2))
# ```
#
# **Question 2 (`ch05_q_to_semantics`).** On a machine with a GPU, this runs. What happens?
# Set `to_answer` to one letter.
#
# ```python
# model = nn.Linear(3, 1)
# x = torch.ones(2, 3)
# model.to("cuda")
# x.to("cuda")
# out = model(x)
# ```
#
# * **a**: it works: both the model and `x` are on the GPU.
# * **b**: `RuntimeError`: the model moved, but `x.to("cuda")` returned a moved copy that
#   nobody kept, so `x` is still on the CPU.
# * **c**: `RuntimeError`: neither moved, because neither result was assigned.
# * **d**: it works: PyTorch copies `x` to the model's device when it has to.
#
# **Question 3 (`ch05_q_strict_false`).** A checkpoint has every key of a model except
# `head.weight` and `head.bias`. What does `model.load_state_dict(checkpoint, strict=False)` do
# with the head? Set `strict_answer` to one letter.
#
# * **a**: the call raises a `RuntimeError` that lists the two missing keys.
# * **b**: the head keeps the values it had (for a new model, its random initialisation); the
#   two names are in the returned `missing_keys`, and nothing else tells you.
# * **c**: the head is set to zeros.
# * **d**: nothing is loaded at all, because the checkpoint does not match the model.

# %% nbgrader={"grade_id": "ch05_questions", "solution": true}
param_count = None
to_answer = None
strict_answer = None
### BEGIN SOLUTION
param_count = 77
to_answer = "b"
strict_answer = "b"
### END SOLUTION

# %% nbgrader={"grade_id": "ch05_q_param_count", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(param_count, "ch05_q_param_count")
### BEGIN HIDDEN TESTS
check_number(
    param_count,
    "ch05_q_param_count",
    expected=77,
    hints={
        88: "BatchNorm's running_mean, running_var and num_batches_tracked are buffers: in "
        "state_dict(), not in parameters().",
        87: "running_mean and running_var are buffers, not parameters.",
        67: "BatchNorm1d(5) has parameters too: a weight and a bias of 5 values each.",
        70: "each Linear layer has a bias: 5 values for the first, 2 for the second.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch05_q_to_semantics", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(to_answer, "ch05_q_to_semantics", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    to_answer,
    "ch05_q_to_semantics",
    choices="abcd",
    correct="b",
    why_not={
        "a": "x.to(...) does not change x: it returns a new tensor, which was thrown away.",
        "c": "for a module, .to() works in place (and returns the module): the model did move.",
        "d": "PyTorch never moves tensors between devices behind your back.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch05_q_strict_false", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(strict_answer, "ch05_q_strict_false", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    strict_answer,
    "ch05_q_strict_false",
    choices="abcd",
    correct="b",
    why_not={
        "a": "that is what the default, strict=True, does.",
        "c": "load_state_dict only copies values found in the checkpoint; it never invents any.",
        "d": "with strict=False every name that matches is loaded.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# self.hidden = nn.ModuleList(layers)          # a plain list: no optimizer, no checkpoint, no .to()
# self.register_buffer("mean", mean)           # a plain tensor attribute is neither saved nor moved
# handle = layer.register_forward_hook(hook)   # then handle.remove() in `finally:`, or it stays
# output = model(x)                            # model.forward(x) skips the model's own hooks
# report = model.load_state_dict(sd, strict=False)  # read report.missing_keys: they kept their values
# sd = torch.load(path, map_location=device)   # without it, a GPU checkpoint fails on a CPU machine
# model.to(device)                             # in place: modules move their parameters and buffers
# x = x.to(device)                             # a new tensor: without `x =`, nothing moved
# ```
#
# * `parameters()`, `state_dict()` and `.to()` see what `__setattr__` filed in `_parameters`,
#   `_modules` and `_buffers`. The running example holds 139 values; its plain-list version
#   showed the optimizer 27, and its hidden layers moved by exactly 0.
# * Buffers are saved and moved but never optimized; `persistent=False` ones are not saved.
# * A forward hook sees a module's output; keep a detached copy, and remove the hook.
# * Every tensor in an operation must be on one device; the error names the line where they
#   met, not the line that forgot to move one.
#
# Next, chapter 06 turns to the evaluation loop: `eval()` and `no_grad()`, two switches that
# are easy to confuse.
