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
# there (buffers and hooks), what the parameters start from, how to share, freeze and group
# them, and how models, tensors and whole batches move between devices.
#
# **By the end of this chapter you can:**
#
# 1. predict what `parameters()`, `state_dict()` and `.to()` see from how `__init__` assigns
#    attributes, and repair a model whose layers sit in a plain Python list;
# 2. count a model's parameters by hand (a tied one once, the frozen ones apart), tell
#    parameters from buffers, and check how they were initialised;
# 3. record what any layer returns with a forward hook, remove the hook cleanly, and say why
#    you call `model(x)` and not `model.forward(x)`;
# 4. load a checkpoint that does not quite match (`strict=False`, `map_location`), read what
#    it reports, and fine-tune from it: freeze parameters, and give the optimizer parameter
#    groups with their own learning rate and weight decay;
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
DEPTH = 10  # Linear + ReLU layers in the initialisation experiment
WIDTH = 128  # inputs and outputs of each of those layers
DEEP_BATCH = 256  # examples sent through that stack
VOCAB, DIM = 10, 4  # the tied-weights example: a vocabulary of 10 tokens, vectors of 4 values

import copy
import io
import math
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
# The normalisation layers (for Exercise 3): _NormBase covers every BatchNorm and InstanceNorm.
NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm)
NORM_TYPES += (nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()  # torch 2.4 and later
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
# ## Where the starting values come from: initialisation
#
# A layer fills its parameters the moment it is built, in its `reset_parameters()` method, with
# numbers drawn from the global random generator. `nn.Linear` calls
# `nn.init.kaiming_uniform_(weight, a=math.sqrt(5))`, a formula made for leaky ReLU layers
# that, with this `a`, comes down to something simple. Its gain is
# $\sqrt{2 / (1 + a^2)} = \sqrt{2/6} = 1/\sqrt{3}$, the standard deviation it aims for is
# $\text{gain}/\sqrt{\text{fan\_in}}$ (fan_in: the number of inputs each output sums), and a
# uniform distribution with that spread reaches $\sqrt{3}$ standard deviations either side:
#
# $$\text{bound} = \sqrt{3} \cdot \frac{1}{\sqrt{3}} \cdot \frac{1}{\sqrt{\text{fan\_in}}}
# = \frac{1}{\sqrt{\text{fan\_in}}}.$$
#
# The bias is drawn from the same range, $U(-1/\sqrt{\text{fan\_in}}, 1/\sqrt{\text{fan\_in}})$.
# For `nn.Linear(256, 128)`, fan_in = 256: the bound is $1/16 = 0.0625$, and the standard
# deviation $0.0625/\sqrt{3} \approx 0.0361$. The next cell checks the formula against
# `nn.init.calculate_gain`, the layer's values against the bound and the spread, and then draws
# the same numbers by hand from the same seed: the weight first, then the bias.

# %%
fan_in, fan_out = 256, 128
gain = nn.init.calculate_gain("leaky_relu", math.sqrt(5))
weight_bound = math.sqrt(3) * gain / math.sqrt(fan_in)  # what kaiming_uniform_ computes
bias_bound = 1 / math.sqrt(fan_in)  # what Linear.reset_parameters computes for the bias
assert math.isclose(gain, 1 / math.sqrt(3)) and math.isclose(weight_bound, bias_bound)
torch.manual_seed(SEED)
layer = nn.Linear(fan_in, fan_out)
print(f"bound 1/√{fan_in} = {bias_bound:.4f}; the weight spans "
      f"[{layer.weight.min():.5f}, {layer.weight.max():.5f}], "
      f"the bias [{layer.bias.min():.4f}, {layer.bias.max():.4f}]")  # fmt: skip
assert max(layer.weight.abs().max(), layer.bias.abs().max()) <= bias_bound
spread = layer.weight.std().item()
print(f"weight std {spread:.4f}; the formula's bound/√3 = {bias_bound / math.sqrt(3):.4f}")
assert abs(spread - bias_bound / math.sqrt(3)) < 0.02 * bias_bound
torch.manual_seed(SEED)
weight_by_hand = torch.empty(fan_out, fan_in).uniform_(-weight_bound, weight_bound)
bias_by_hand = torch.empty(fan_out).uniform_(-bias_bound, bias_bound)
assert torch.equal(layer.weight, weight_by_hand) and torch.equal(layer.bias, bias_by_hand)
print(
    "drawn by hand from the same seed: the same", fan_in * fan_out + fan_out, "values, bit for bit"
)

# %% [markdown]
# ### `nn.init`: refilling parameters in place
#
# To start from other values, overwrite them. The functions of `nn.init` end in `_`, PyTorch's
# mark for "changes its argument in place": `nn.init.zeros_(b)`, `nn.init.normal_(w, std=0.02)`,
# `nn.init.kaiming_normal_(w, nonlinearity="relu")`. A parameter is a leaf of the autograd
# graph that requires a gradient, and autograd refuses to change such a leaf in place while it
# records: the operation would give the leaf a history, and it would stop being a leaf. The
# `nn.init` functions write under `torch.no_grad()` for that reason, and code of your own that
# writes into a parameter must do the same.
#
# `model.apply(fn)` calls `fn` on every submodule, children before their parent and the model
# itself last, and returns the model. An initialisation function therefore checks the type of
# the module it is given, and leaves alone what it does not know.

# %%
torch.manual_seed(SEED)
model = ref_modules.MLP(SIZES)
try:
    model.head.weight.normal_()
except RuntimeError as err:
    print("in place, outside no_grad:", err)
else:
    raise AssertionError("a parameter was changed in place while autograd was recording")
with torch.no_grad():
    model.head.weight.normal_(std=0.01)  # allowed: nothing is recorded
visited = []


def init_for_relu(module):
    visited.append(type(module).__name__)
    if isinstance(module, nn.Linear):
        nn.init.kaiming_normal_(module.weight, nonlinearity="relu")  # std √(2 / fan_in)
        nn.init.zeros_(module.bias)


returned = model.apply(init_for_relu)
print("model.apply visited, in order:", visited)
assert returned is model and visited == ["Linear", "Linear", "ModuleList", "Linear", "MLP"]
assert all(torch.count_nonzero(layer.bias) == 0 for layer in [*model.hidden, model.head])

# %% [markdown]
# ### Why the scale matters: a signal through ten layers
#
# Send inputs whose mean square is $q$ through `Linear(fan_in, fan_out)` and a ReLU. Each
# output before the ReLU sums fan_in products $w_i x_i$ of independent, zero-mean weights, so
# its variance is $\text{fan\_in} \cdot \text{Var}(w) \cdot q$, plus the bias's variance. The
# ReLU zeroes the negative half of that symmetric distribution, which halves the mean square.
# Layer after layer:
#
# $$q_{l+1} = \tfrac{1}{2}\left(\text{fan\_in} \cdot \text{Var}(w) \cdot q_l
# + \text{Var}(b)\right), \qquad q_0 = 1.$$
#
# With `WIDTH` = 128 inputs per layer and `DEPTH` = 10 layers, for three ways to start:
#
# | initialisation | Var(w) | factor $\text{fan\_in} \cdot \text{Var}(w)/2$ per layer | root mean square after 10 layers |
# | --- | --- | --- | --- |
# | PyTorch's default, $U(\pm 1/\sqrt{128})$ | $1/(3 \cdot 128)$ | $1/6$ | falls until the bias term holds it: $q^* = \frac{1/768}{1 - 1/6} = 1/640$, so $\sqrt{q^*} \approx 0.040$ |
# | `kaiming_normal_(nonlinearity="relu")`, zero bias | $2/128$ | $1$ | stays at $1$ |
# | `normal_(std=0.01)`, zero bias | $10^{-4}$ | $0.0064$ | $\sqrt{0.0064^{10}} = 0.0064^{5} \approx 1.1 \cdot 10^{-11}$ |
#
# (The default's bias variance is $1/(3 \cdot 128) = 1/384$, half of which is $1/768$.) The
# next cell sends `DEEP_BATCH` random inputs through the three stacks, built from the same
# seed, measures the root mean square after every layer, and checks it against the recursion.
# Each layer's factor is itself random (128 weights per output are a small sample), so the
# measurement may stray from the prediction by a few tens of percent; the check allows a
# factor of 2.5, while the three stacks differ by factors of thousands.

# %%
gen = torch.Generator().manual_seed(SEED)
x_deep = torch.randn(DEEP_BATCH, WIDTH, generator=gen)


def kaiming_relu(module):
    if isinstance(module, nn.Linear):
        nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
        nn.init.zeros_(module.bias)


def too_small(module):
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.01)
        nn.init.zeros_(module.bias)


inits = {  # name: (init function or None for the default, Var(w) · fan_in, Var(b))
    "default": (None, 1 / 3, 1 / (3 * WIDTH)),
    "kaiming_normal_(relu)": (kaiming_relu, 2.0, 0.0),
    "normal_(std=0.01)": (too_small, 0.01**2 * WIDTH, 0.0),
}
measured, predicted = {}, {}
for name, (init, fan_var_w, var_b) in inits.items():
    torch.manual_seed(SEED)
    stack = nn.Sequential(*[m for _ in range(DEPTH) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())])
    if init is not None:
        stack.apply(init)
    h, q, measured[name], predicted[name] = x_deep, 1.0, [], []
    with torch.no_grad():  # only looking: no graph needed
        for linear, relu in zip(stack[::2], stack[1::2]):
            h = relu(linear(h))
            q = (fan_var_w * q + var_b) / 2
            measured[name].append(h.pow(2).mean().sqrt().item())
            predicted[name].append(math.sqrt(q))
    ratios = [m / p for m, p in zip(measured[name], predicted[name])]
    assert all(0.4 < r < 2.5 for r in ratios), (name, ratios)
    print(f"{name:22} after layer 1: {measured[name][0]:.3g}, after layer {DEPTH}: "
          f"{measured[name][-1]:.3g} (predicted {predicted[name][-1]:.3g})")  # fmt: skip

fig, ax = plt.subplots(figsize=(7, 3.6))
layers_axis = range(1, DEPTH + 1)
for (name, values), colour in zip(
    measured.items(), (PALETTE["vermillion"], PALETTE["blue"], PALETTE["orange"])
):
    ax.plot(layers_axis, values, "o-", color=colour, label=f"{name}, measured")
    ax.plot(layers_axis, predicted[name], "--", color=colour, lw=1, label=f"{name}, predicted")
ax.set_yscale("log")
ax.set(xlabel="layer (Linear + ReLU)", ylabel="root mean square of the output",
       title=f"{DEPTH} layers of width {WIDTH}: the signal under three initialisations")  # fmt: skip
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# *Alt text: on a logarithmic scale, three measured curves with dashed predictions next to
# them. The kaiming curve stays near 1; the default one falls over the first layers and levels
# off near 0.04; the normal(0.01) one falls in a straight line, about twelve times lower per
# layer, to about 10⁻¹¹.*
#
# The same factors act on the gradients flowing back through those weights, so a stack that
# starts too small learns almost nothing in its early layers. PyTorch's default is not wrong:
# for one layer, or the shallow running example, it keeps values in range, and normalisation
# layers and residual connections (which most deep models have) rescue deep stacks. But the
# default is not the formula for ReLU networks, and only measuring shows what a model gets.
#
# *Try it:* change `nonlinearity="relu"` to `"linear"` in `kaiming_relu` (gain 1 instead of
# √2: predict the factor per layer first), or set `DEPTH = 30` at the top.
#
# ### Seeding: the same weights on every run
#
# The initial values come from the global generator, in the order the layers are built. The
# same seed and the same order give the same weights: that is why the broken and the repaired
# model above started equal. Anything that draws a random number in between (another layer, a
# data split, a `torch.randn`) shifts everything built after it. To make a model's start
# independent of what ran before, give the initialisation its own generator: every `nn.init`
# function that draws random numbers (`uniform_`, `normal_`, `kaiming_uniform_`,
# `xavier_normal_` and the rest) takes `generator=`.


# %%
def seeded(extra_draw=False):
    torch.manual_seed(SEED)
    if extra_draw:
        torch.randn(1)  # anything that draws: a data split, a dropout mask, one more layer
    return ref_modules.MLP(SIZES)


def init_with(generator):
    def init(module):
        if isinstance(module, nn.Linear):
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu", generator=generator)
            nn.init.zeros_(module.bias)

    return init


def same_weights(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


first, again, shifted = seeded(), seeded(), seeded(extra_draw=True)
assert same_weights(first, again) and not same_weights(first, shifted)
print("same seed, same order: identical; one extra draw first: every value differs:",
      bool((first.head.weight != shifted.head.weight).all()))  # fmt: skip
for model in (first, shifted):
    model.apply(init_with(torch.Generator().manual_seed(SEED)))
assert same_weights(first, shifted)
print("initialised again from a generator of their own: identical")

# %% [markdown]
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
# ## Tied parameters: one tensor in two places
#
# A language model looks each token up in an embedding table of shape `[vocab, dim]`, and at
# the end scores every token of the vocabulary with a linear layer whose weight has the same
# shape, `[vocab, dim]`. Many models (GPT-2 among them) use one tensor for both. The line
# `self.out.weight = self.embed.weight` files the *same* `Parameter` object in two modules'
# `_parameters`: a tie is identity of one Python object, not two tensors that happen to be
# equal.
#
# The smallest such model maps a token to scores for the next one, `logits = E[t] Eᵀ`, with
# `VOCAB` = 10 tokens and vectors of `DIM` = 4 values: one table of $10 \cdot 4 = 40$ values.
# `parameters()` lists every parameter once, however many places hold it, so the optimizer
# steps it once; `named_parameters(remove_duplicate=False)` shows the places. `state_dict()`
# keeps a key for each place, both pointing at the same memory, and `torch.save` writes that
# memory once.


# %%
class TiedBigram(nn.Module):
    """Scores for the next token: logits = E[token] @ Eᵀ, one [VOCAB, DIM] table used twice."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight  # the tie: out's own weight is dropped

    def forward(self, tokens):
        return self.out(self.embed(tokens))


def untied_copy(model):
    """The same values in two separate Parameters: what the tie would be without it."""
    twin = copy.deepcopy(model)
    twin.out.weight = nn.Parameter(twin.embed.weight.detach().clone())
    return twin


torch.manual_seed(SEED)
tied = TiedBigram(VOCAB, DIM)
places = [name for name, _ in tied.named_parameters(remove_duplicate=False)]
listed = list(tied.parameters())
print("places:", places, "| parameters() lists", len(listed), "tensor of",
      sum(p.numel() for p in listed), "values")  # fmt: skip
assert places == ["embed.weight", "out.weight"] and len(listed) == 1
assert sum(p.numel() for p in listed) == VOCAB * DIM == 40
untied = untied_copy(tied)
assert sum(p.numel() for p in untied.parameters()) == 2 * VOCAB * DIM

state = tied.state_dict()
assert list(state) == ["embed.weight", "out.weight"]
assert state["embed.weight"].data_ptr() == state["out.weight"].data_ptr()
files = {}
for name, model in (("tied", tied), ("untied", untied)):
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    files[name] = buffer
print(f"saved: {len(files['tied'].getvalue())} bytes tied, "
      f"{len(files['untied'].getvalue())} untied")  # fmt: skip
assert len(files["untied"].getvalue()) - len(files["tied"].getvalue()) >= VOCAB * DIM * 4
files["tied"].seek(0)
reloaded = torch.load(files["tied"], weights_only=True)
assert reloaded["embed.weight"].data_ptr() == reloaded["out.weight"].data_ptr()
print("state_dict: two keys, one memory; torch.load gives back one memory too")

# %% [markdown]
# ### The gradient of a tied parameter is the sum of both uses
#
# Write $E$ for the table, $t$ for a batch of `BATCH` tokens, $y$ for the tokens that follow.
# Then $h = E[t]$ (rows of $E$), $z = h E^\top$ and $L$ is the mean cross-entropy. Chapter 04
# gave $\partial L / \partial z = (\mathrm{softmax}(z) - \mathrm{onehot}(y)) / B$. From there
# $E$ gets a gradient along two paths:
#
# * as the output layer's weight: $(\partial L / \partial z)^\top h$, a `[VOCAB, DIM]` matrix;
# * as the embedding table: $\partial L / \partial h = (\partial L / \partial z) E$, one row per
#   token in the batch, each added to the row of $E$ it was looked up from.
#
# Autograd adds the two into the one `.grad`. The next cell computes both paths by hand,
# checks their sum against the tied model's gradient, and each path against the untied copy,
# whose two parameters get one path each.

# %%
gen = torch.Generator().manual_seed(SEED)
tokens = torch.randint(VOCAB, (BATCH,), generator=gen)
following = torch.randint(VOCAB, (BATCH,), generator=gen)
for model in (tied, untied):
    nn.functional.cross_entropy(model(tokens), following).backward()

E = tied.embed.weight.detach()
h = E[tokens]
dz = (torch.softmax(h @ E.T, dim=1) - nn.functional.one_hot(following, VOCAB)) / BATCH
through_out = dz.T @ h
through_embed = torch.zeros_like(E).index_add_(0, tokens, dz @ E)
torch.testing.assert_close(tied.embed.weight.grad, through_out + through_embed)
torch.testing.assert_close(untied.out.weight.grad, through_out)
torch.testing.assert_close(untied.embed.weight.grad, through_embed)
print(f"gradient norms: through the output {through_out.norm():.4f}, through the embedding "
      f"{through_embed.norm():.4f}, tied .grad {tied.embed.weight.grad.norm():.4f} (their sum)")  # fmt: skip

# %% [markdown]
# ### What keeps a tie, and what breaks it
#
# * `load_state_dict` copies values *into* the tensors the model already has, so the tie
#   stays. But both keys are copied into the one tensor, module by module: from the checkpoint
#   of an untied model, `out.weight` (the later module) wins and `embed.weight`'s values are
#   lost, with no warning.
# * `copy.deepcopy` remembers what it has already copied, so the copy is tied too.
# * `.to(device)` puts the moved data under the *same* `Parameter` when the two kinds of tensor
#   allow it, and the tie stays. When they do not, it makes a new `Parameter` for each place,
#   and the tie is gone. PyTorch decides with `torch._has_compatible_shallow_copy_type`, whose
#   source lists dense CPU, CUDA and MPS tensors as compatible with each other, and `meta` (the
#   stand-in for a GPU on a machine without one) as not. The cell asks it for `OTHER`, checks
#   the answer against what happened, and ties again where the move broke the tie.
# * Assigning a new `nn.Parameter` to one place breaks the tie: `untied_copy` above did that
#   on purpose, and had 80 values.


# %%
def is_tied(model):
    return model.out.weight is model.embed.weight


torch.manual_seed(SEED + 1)
fresh_tied = TiedBigram(VOCAB, DIM)
fresh_tied.load_state_dict(tied.state_dict())
assert is_tied(fresh_tied) and torch.equal(fresh_tied.embed.weight, tied.embed.weight)
untied_checkpoint = {"embed.weight": torch.zeros(VOCAB, DIM), "out.weight": torch.ones(VOCAB, DIM)}
fresh_tied.load_state_dict(untied_checkpoint)
print("loaded an untied checkpoint: still tied?", is_tied(fresh_tied), "| values now:",
      fresh_tied.embed.weight.unique().tolist(), "(out.weight's)")  # fmt: skip
assert is_tied(fresh_tied) and bool((fresh_tied.embed.weight == 1).all())
assert is_tied(copy.deepcopy(tied))

moved = copy.deepcopy(tied).to(OTHER)
same_object_possible = torch._has_compatible_shallow_copy_type(
    torch.empty(0), torch.empty(0, device=OTHER)
)
print(f".to({OTHER}): still tied?", is_tied(moved))
assert is_tied(moved) == same_object_possible
if not is_tied(moved):
    moved.out.weight = moved.embed.weight  # tie again after moving
assert is_tied(moved) and len(list(moved.parameters())) == 1

# %% [markdown]
# *Try it:* swap the order of the two keys in `untied_checkpoint` and predict which values win.
# (The order of the modules decides, not the order of the keys.)
#
# ## Frozen parameters: `requires_grad_(False)`
#
# Fine-tuning often keeps a pre-trained body fixed and trains a new head.
# `p.requires_grad_(False)` (or `module.requires_grad_(False)`, for all of a module's
# parameters) tells autograd not to compute that parameter's gradient: backward leaves its
# `.grad` at `None`, and skips the work.
# Freeze the running example's hidden layers and what is left to train is the head: 27 of 139
# values, the same 27 the broken model showed its optimizer, this time on purpose.
#
# Optimizers skip every parameter whose `.grad` is `None`, weight decay included. So an AdamW
# given *all* the parameters, with a weight decay of 0.5, leaves the frozen ones exactly where
# they were, like one given only the trainable ones. The next cell runs both for three steps.


# %%
def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def frozen_mlp():
    torch.manual_seed(SEED)
    model = ref_modules.MLP(SIZES)
    model.hidden.requires_grad_(False)  # the "pre-trained body"
    return model


runs = {}
for given in ("all parameters", "trainable only"):
    model = frozen_mlp()
    start = [p.detach().clone() for p in model.parameters()]
    params = model.parameters() if given == "all parameters" else trainable(model)
    optimizer = torch.optim.AdamW(params, lr=0.1, weight_decay=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x_train), y_train).backward()
        optimizer.step()
    assert all(p.grad is None for p in model.hidden.parameters())
    moved_by = [(p - p0).abs().max().item() for p, p0 in zip(model.parameters(), start)]
    runs[given] = model
    print(f"{given:15} trainable {sum(p.numel() for p in trainable(model))} of "
          f"{sum(p.numel() for p in model.parameters())}; largest move per tensor "
          f"{[round(m, 4) for m in moved_by]}; AdamW keeps state for {len(optimizer.state)}")  # fmt: skip
    assert moved_by[:4] == [0.0] * 4 and min(moved_by[4:]) > 0
assert all(torch.equal(a, b) for a, b in zip(*(m.parameters() for m in runs.values())))

# %% [markdown]
# What protects a frozen parameter is `.grad is None`, not `requires_grad=False` itself. A
# parameter that was trained before it was frozen still has a `.grad` tensor, and
# `zero_grad(set_to_none=False)` turns it into zeros instead of `None`. AdamW does not skip a
# zero gradient: its decay multiplies the weight by $1 - \text{lr} \cdot \text{wd}
# = 1 - 0.1 \cdot 0.5 = 0.95$ on every step, and SGD with momentum would keep moving it too.
# Build the optimizer over the trainable parameters only, and a frozen one cannot move whatever
# its `.grad` holds.

# %%
torch.manual_seed(SEED)
model = ref_modules.MLP(SIZES)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
nn.functional.mse_loss(model(x_train), y_train).backward()  # still trainable: .grad is a tensor
model.hidden.requires_grad_(False)
optimizer.zero_grad(set_to_none=False)  # zeros, not None
before = model.hidden[0].weight.detach().clone()
nn.functional.mse_loss(model(x_train), y_train).backward()
optimizer.step()
assert torch.count_nonzero(model.hidden[0].weight.grad) == 0
torch.testing.assert_close(model.hidden[0].weight.detach(), before * (1 - 0.1 * 0.5))
print("frozen, zero gradient, AdamW: the weight became 0.95 × itself; largest move",
      f"{(model.hidden[0].weight - before).abs().max().item():.4f}")  # fmt: skip

# %% [markdown]
# ### `eval()` is not freezing, and freezing is not `eval()`
#
# `model.eval()` changes how some modules compute (dropout off, BatchNorm normalising with its
# running statistics); it does not stop gradients. And freezing does not stop BatchNorm from
# updating its running statistics: they are buffers, changed by the forward pass in training
# mode, with no gradient and no optimizer involved. A frozen BatchNorm in training mode drifts
# towards the statistics of the new data: after one batch with mean about 5, its running mean
# is $0.9 \cdot 0 + 0.1 \cdot 5 \approx 0.5$. To keep its statistics, put it in eval mode,
# again after every `model.train()`, which switches it back.

# %%
norm = nn.BatchNorm1d(3).requires_grad_(False)
batch = torch.randn(64, 3, generator=torch.Generator().manual_seed(SEED)) + 5.0
norm(batch)
print("frozen BatchNorm, train mode: running_mean",
      [round(v, 3) for v in norm.running_mean.tolist()],
      "| num_batches_tracked", norm.num_batches_tracked.item())  # fmt: skip
torch.testing.assert_close(norm.running_mean, 0.1 * batch.mean(dim=0))
norm.eval()
kept = norm.running_mean.clone()
norm(batch)
assert torch.equal(norm.running_mean, kept)
body = nn.Sequential(nn.Linear(3, 3), norm).train()
print("after body.train(), the norm is in training mode again:", norm.training)
assert norm.training
body.eval()
body(batch).sum().backward()
assert body[0].weight.grad is not None
print("in eval mode the Linear still got a gradient:", body[0].weight.grad is not None)

# %% [markdown]
# *Try it:* in the zero-gradient cell, call `optimizer.zero_grad()` with its default
# (`set_to_none=True`) and predict what the frozen weight does then; the check in that cell
# will tell you.
#
# ## Parameter groups: different settings for different parameters
#
# An optimizer keeps a list of parameter groups, `optimizer.param_groups`: dicts, each with
# its own `"params"` and its own settings (`lr`, `weight_decay`, `momentum`, …). What a group
# does not set comes from the optimizer's arguments. Two uses are everywhere:
#
# * **no weight decay on biases and normalisation layers.** Decay pulls values towards 0 to keep
#   the weights that multiply inputs small; a bias multiplies nothing, and pulling a norm
#   layer's scale towards 0 shrinks everything it outputs.
# * **a smaller learning rate for a pre-trained body** than for a new head.
#
# `ref_modules.decay_groups(model, weight_decay)`, the reference answer to the next exercise,
# does the first split by module type: weights of the layers that multiply decay, biases and
# every parameter of a normalisation layer do not, and frozen parameters are left out. For
# `Sequential(Linear(4, 8), BatchNorm1d(8), ReLU(), Linear(8, 3))`, by hand: decay
# $4 \cdot 8 + 8 \cdot 3 = 56$ values, no decay $8 + 8 + 8 + 3 = 27$.
#
# On AdamW's first step the moment estimates are $\hat m = g$ and $\hat v = g^2$, so each
# parameter moves to $p \cdot (1 - \text{lr} \cdot \text{wd}) - \text{lr} \cdot g / (|g| +
# \epsilon)$, with its own group's `wd`. The next cell checks every parameter against that.

# %%
torch.manual_seed(SEED)
net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
groups = ref_modules.decay_groups(net, weight_decay=0.1)
names = {id(p): name for name, p in net.named_parameters()}
for group in groups:
    print(f"weight_decay {group['weight_decay']}: {sum(p.numel() for p in group['params'])} "
          f"values in {[names[id(p)] for p in group['params']]}")  # fmt: skip
assert [sum(p.numel() for p in g["params"]) for g in groups] == [56, 27]
assert set(NORM_TYPES) == set(ref_modules.NORM_TYPES)  # the chapter's tuple is the reference's

lr, eps = 0.01, 1e-8
optimizer = torch.optim.AdamW(groups, lr=lr, eps=eps)
start = [[p.detach().clone() for p in g["params"]] for g in groups]
nn.functional.mse_loss(net(x_train), y_train).backward()
optimizer.step()
for group, group_start in zip(optimizer.param_groups, start):
    for p, p0 in zip(group["params"], group_start):
        g = p.grad
        by_hand = p0 * (1 - lr * group["weight_decay"]) - lr * g / (g.abs() + eps)
        torch.testing.assert_close(p.detach(), by_hand)
print("every parameter moved as its own group's AdamW formula says")

# %% [markdown]
# ## Exercise 3 · `ch05_decay_groups`: weight decay where it belongs
#
# Write `decay_groups(model, weight_decay)` that returns two parameter groups, ready for
# `torch.optim.AdamW(groups, lr=...)`, in this order:
#
# 1. `{"params": [...], "weight_decay": weight_decay}`: the parameters that decay;
# 2. `{"params": [...], "weight_decay": 0.0}`: every parameter named `bias` (the last part of
#    its dotted name) and every parameter of a normalisation layer, that is of a module that is
#    an instance of `NORM_TYPES` (defined in the chapter's first code cell: BatchNorm,
#    LayerNorm, GroupNorm, …). Write the `0.0`: a group without its own `weight_decay` takes the optimizer's.
#
# List only trainable parameters (`requires_grad`), each one once, even when it is tied into
# two places; the order inside a group does not matter. `model.named_parameters()` gives each
# parameter once with its dotted name, and `model.get_submodule(name.rpartition(".")[0])` is
# the module that holds it.
#
# The visible check uses the model above; the hidden one adds tied weights, a frozen body and
# other norm layers.


# %% nbgrader={"grade_id": "ch05_decay_groups", "solution": true}
def decay_groups(model, weight_decay):
    ### BEGIN SOLUTION
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        owner, _, leaf = name.rpartition(".")
        if leaf == "bias" or isinstance(model.get_submodule(owner), NORM_TYPES):
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch05_decay_groups_tests", "grade": true, "points": 2}
# Visible tests: Sequential(Linear, BatchNorm1d, ReLU, Linear) with weight_decay=0.1.
from forge_course.grading import ch05

ch05.check_decay_groups(decay_groups)
print("decay_groups: weights decay, biases and norms do not, frozen left out, tied listed once.")
### BEGIN HIDDEN TESTS
ch05.check_decay_groups(decay_groups, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ### A learning rate per group, changed while training, and groups added later
#
# Back to fine-tuning the running example: the head learns with `LR`, the hidden layers with a
# tenth of it. Plain SGD moves each parameter by exactly $-\text{lr} \cdot g$, with its
# group's `lr`. A group's settings can change between steps: a learning-rate scheduler works
# by writing a new `optimizer.param_groups[i]["lr"]` into every group, each from its own
# starting rate.
#
# A typical schedule starts with the body frozen and the optimizer built over the head only,
# then unfreezes the body. `requires_grad_(True)` gives the body gradients again, but the
# optimizer was never told about it, so it is not stepped: the bug of parameters created after
# the optimizer. `optimizer.add_param_group({...})` tells it. A parameter may be in one group
# only; adding it twice raises.


# %%
def sgd_step(model, optimizer):
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x_train), y_train).backward()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    return [p.detach() - p0 for p, p0 in zip(model.parameters(), before)]


torch.manual_seed(SEED)
model = ref_modules.MLP(SIZES)
optimizer = torch.optim.SGD(
    [{"params": model.hidden.parameters(), "lr": LR / 10}, {"params": model.head.parameters()}],
    lr=LR,
)
print("lr per group:", [g["lr"] for g in optimizer.param_groups])
for lr_body in (LR / 10, LR / 100):
    optimizer.param_groups[0]["lr"] = lr_body  # what a scheduler does before a step
    changes = sgd_step(model, optimizer)
    for (name, p), change in zip(model.named_parameters(), changes):
        group_lr = lr_body if name.startswith("hidden") else LR
        torch.testing.assert_close(change, -group_lr * p.grad)
    print(f"body lr {lr_body:g}: every change equals −lr·grad with its group's lr")
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)  # halves each group
print("a scheduler that halves the rate writes", [g["lr"] for g in optimizer.param_groups])
assert all(math.isclose(g["lr"], lr) for g, lr in zip(optimizer.param_groups, (LR / 200, LR / 2)))

model = frozen_mlp()
optimizer = torch.optim.SGD(model.head.parameters(), lr=LR)
sgd_step(model, optimizer)
model.hidden.requires_grad_(True)  # unfrozen, but the optimizer does not know
changes = sgd_step(model, optimizer)
print("unfrozen, not added: hidden.0.weight has a gradient:",
      model.hidden[0].weight.grad is not None, "| moved", changes[0].abs().max().item())  # fmt: skip
assert changes[0].abs().max() == 0
optimizer.add_param_group({"params": model.hidden.parameters(), "lr": LR / 10})
changes = sgd_step(model, optimizer)
print(f"after add_param_group: moved {changes[0].abs().max().item():.5f}; lr per group",
      [g["lr"] for g in optimizer.param_groups])  # fmt: skip
assert changes[0].abs().max() > 0
try:
    optimizer.add_param_group({"params": model.head.parameters()})
except ValueError as err:
    print("adding the head twice:", err)
else:
    raise AssertionError("a parameter was accepted in two groups")

# %% [markdown]
# *Try it:* add an `nn.LayerNorm(3)` after the last layer of `net` and see which group its two
# parameters join; or set the body's learning rate to 0 and check that it never moves.
#
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
# ## Exercise 4 · `ch05_to_device`: move a nested batch
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
#
# **Question 4 (`ch05_q_tied_count`).** How many values does `model.parameters()` hold for the
# model below? Set `tied_count` to a number.
#
# ```python
# class TinyLM(nn.Module):
#     def __init__(self):
#         super().__init__()
#         self.embed = nn.Embedding(100, 16)
#         self.out = nn.Linear(16, 100)
#         self.out.weight = self.embed.weight
#
# model = TinyLM()
# ```

# %% nbgrader={"grade_id": "ch05_questions", "solution": true}
param_count = None
to_answer = None
strict_answer = None
tied_count = None
### BEGIN SOLUTION
param_count = 77
to_answer = "b"
strict_answer = "b"
tied_count = 1700
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

# %% nbgrader={"grade_id": "ch05_q_tied_count", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(tied_count, "ch05_q_tied_count")
### BEGIN HIDDEN TESTS
check_number(
    tied_count,
    "ch05_q_tied_count",
    expected=1700,
    hints={
        3300: "the tied weight is one Parameter in two places, and parameters() lists it once.",
        3200: "the tied weight is listed once, not twice; and out has a bias (100 values).",
        1600: "nn.Linear has a bias unless bias=False: out adds 100 values of its own.",
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
# model.apply(init_fn)                         # init_fn on every submodule; nn.init.*_ work in place
# self.out.weight = self.embed.weight          # tied: listed once, its gradient the sum of both uses
# model.body.requires_grad_(False)             # frozen: .grad stays None, BatchNorm statistics still move
# optimizer = torch.optim.AdamW(decay_groups(model, 0.1), lr=lr)  # Exercise 3: none on biases, norms
# optimizer.param_groups[0]["lr"] = lr         # what a scheduler does before each step
# optimizer.add_param_group({"params": model.body.parameters(), "lr": lr / 10})  # unfrozen later
# ```
#
# * `parameters()`, `state_dict()` and `.to()` see what `__setattr__` filed in `_parameters`,
#   `_modules` and `_buffers`. The running example holds 139 values; its plain-list version
#   showed the optimizer 27, and its hidden layers moved by exactly 0.
# * Buffers are saved and moved but never optimized; `persistent=False` ones are not saved.
# * `nn.Linear` starts from $U(\pm 1/\sqrt{\text{fan\_in}})$. Through 10 ReLU layers of width 128
#   that shrinks the signal by $\sqrt{6}$ a layer until the biases hold it near 0.04;
#   `kaiming_normal_(nonlinearity="relu")` keeps it near 1, and `normal_(std=0.01)` loses it
#   (about $10^{-11}$). Seed before building, or give `nn.init` its own generator.
# * A tied parameter is one object: one entry in `parameters()`, two keys in `state_dict()`,
#   one `.grad` that sums both uses. `load_state_dict` and `deepcopy` keep the tie; a new
#   `Parameter`, or `.to()` where the data cannot be swapped in place (`meta`), breaks it.
# * A frozen parameter is safe because its `.grad` is `None`; a zero `.grad` still gets weight
#   decay. `eval()` does not freeze, and freezing does not stop BatchNorm's statistics.
# * Each parameter group has its own settings; a parameter unfrozen after the optimizer was
#   built moves only once `add_param_group` tells the optimizer about it.
# * A forward hook sees a module's output; keep a detached copy, and remove the hook.
# * Every tensor in an operation must be on one device; the error names the line where they
#   met, not the line that forgot to move one.
#
# Next, chapter 06 turns to the evaluation loop: `eval()` and `no_grad()`, two switches that
# are easy to confuse.
