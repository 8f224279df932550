# %% [markdown]
# # Chapter 01 · Tensors and the autograd tape
#
# A training loop asks one question over and over: *how should each number change to lower the
# loss?* PyTorch answers it by recording every operation on the way forward and replaying the
# record backwards. This chapter opens that record. It starts with the tensor itself (what it
# holds, where, and whether it shares memory), then follows one small expression through the
# recording, the backward pass and the rules that make `backward()` refuse or, worse, silently
# give a wrong answer. It ends with two backward passes you write yourself.
#
# **By the end of this chapter you can:**
#
# 1. read a tensor's dtype, device and shape, and say when two tensors share memory;
# 2. compute a small gradient by hand along every path of the graph, walk the graph that
#    autograd recorded through `grad_fn.next_functions`, and run it as a backward pass of your
#    own, node by node in topological order (and show why breadth-first gets it wrong);
# 3. predict what `backward()` does to `.grad` on a second call, when it refuses to run, and
#    what `retain_graph`, `no_grad`, `detach`, `.data` and `.item()` change; ask for
#    gradients with `torch.autograd.grad` instead (a second derivative too), and watch or
#    change one with a hook;
# 4. read an in-place "version" error and name the tensor it is about, and let anomaly mode
#    name the line that made a `nan` gradient;
# 5. write a `torch.autograd.Function` with its own backward (a stable log-sum-exp, a
#    straight-through rounding) and verify it with `gradcheck`.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
COPY_ELEMENTS = 4_000_000  # float32 elements in the from_numpy timing (4 bytes each: 16 MB)
TIMING_REPEATS = 15  # each timing is the median of this many runs
STE_STEPS = 30  # steps of the straight-through training demo
STE_LR = 0.1  # learning rate of that demo (plain SGD)

import re
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch

from forge_course import pick_device
from forge_course.device import describe
from forge_course.sims.display import PALETTE

device = pick_device()
torch.manual_seed(SEED)
print("Running on", describe(device))


def median_ms(fn, *args, repeats=TIMING_REPEATS):
    """The median wall time of ``fn(*args)`` in milliseconds."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2] * 1e3


# %% [markdown]
# ## A tensor: numbers, a dtype, a device, a shape
#
# A tensor is a block of memory plus a description of how to read it. Three attributes tell you
# almost everything:
#
# * **`dtype`**: the type of each element. Python floats become `float32` (the default), Python
#   ints become `int64`. An integer tensor combined with a float becomes float (`float32`).
# * **`device`**: where the memory lives, `cpu` or a GPU (`cuda:0`, `mps`). An operation needs
#   all its tensors on one device; `.to(device)` returns a copy on that device (or the tensor
#   itself, if it is already there).
# * **`shape`**: how many elements along each dimension.
#
# **Hand calculation: how many bytes?** Memory is the number of elements times the bytes per
# element. A 1000 × 1000 matrix has $10^6$ elements; in `float32` (4 bytes each) that is
# $4{,}000{,}000$ bytes, about 3.8 MiB; in `float64`, $8{,}000{,}000$ bytes. A vector of 1000
# `int64` indices takes $1000 \times 8 = 8{,}000$ bytes. The next cell asks PyTorch.

# %%
matrix = torch.zeros(1000, 1000)
print(f"{'tensor':22} {'dtype':14} {'device':7} {'shape':20} bytes")
for name, t in {
    "zeros(1000, 1000)": matrix,
    "...in float64": matrix.double(),
    "arange(1000)": torch.arange(1000),
    "ints + 0.5": torch.arange(3) + 0.5,
    f"...moved to {device.type}": matrix.to(device),
}.items():
    size = t.numel() * t.element_size()
    assert size == t.untyped_storage().nbytes()  # what the allocator holds for it
    print(f"{name:22} {str(t.dtype):14} {str(t.device):7} {str(tuple(t.shape)):20} {size:,}")
assert matrix.numel() * matrix.element_size() == 4_000_000
assert torch.arange(1000).element_size() * 1000 == 8_000
print("The byte counts agree with the hand calculation.")

# %% [markdown]
# ## `torch.from_numpy` shares memory
#
# `torch.from_numpy(arr)` does not copy: the tensor reads the NumPy array's memory, so a write
# through either one shows up in both. `torch.tensor(arr)` makes an independent copy. Two more
# details: NumPy's default float is `float64`, and `from_numpy` keeps it, so such a tensor is
# `float64` too; and any conversion (`.float()`, `.to(device)` onto a GPU) copies.

# %%
arr = np.array([1.0, 2.0, 3.0])
shared = torch.from_numpy(arr)
copied = torch.tensor(arr)
arr[0] = 100.0  # a write through NumPy ...
shared[2] = -1.0  # ... and one through torch
print("NumPy array:       ", arr)
print("from_numpy tensor: ", shared)
print("torch.tensor copy: ", copied)
print(
    "same memory?",
    np.shares_memory(arr, shared.numpy()),
    "| copy shares?",
    np.shares_memory(arr, copied.numpy()),
)

# %% [markdown]
# Not copying also means not paying for a copy. The next cell times both ways of making a
# tensor from arrays of two sizes, on this machine.

# %%
sizes = {"1 MB": COPY_ELEMENTS // 16, f"{COPY_ELEMENTS * 4 / 1e6:.0f} MB": COPY_ELEMENTS}
print(f"{'array':8} {'from_numpy (ms)':>16} {'torch.tensor (ms)':>18}")
timings = {}
for label, n in sizes.items():
    big = np.zeros(n, dtype=np.float32)
    timings[label] = (median_ms(torch.from_numpy, big), median_ms(torch.tensor, big))
    print(f"{label:8} {timings[label][0]:16.4f} {timings[label][1]:18.3f}")
share_ms, copy_ms = timings[label]
print(f"at {label}: torch.tensor took {copy_ms / share_ms:,.0f}× as long as from_numpy")
del big

# %% [markdown]
# `from_numpy` only wraps memory that already exists: its time is a few microseconds whatever
# the size. `torch.tensor` allocates new memory and copies every byte into it, which is orders
# of magnitude slower. (On a busy machine the copy times jump around, because PyTorch splits
# large copies across threads that have to wait for a free core; compare the two columns
# rather than the two rows.)
#
# ## The running example: a tape of three operations
#
# Set `requires_grad=True` on a tensor and autograd starts recording what is computed from it.
# Our running example has two such tensors, $x = 2$ and $w = 3$, and three operations:
#
# $$y = w \cdot x, \qquad z = y + x, \qquad L = z^2 .$$
#
# Each result carries `grad_fn`, the node that will compute its gradient in the backward pass.
# Tensors you created yourself are **leaves**: they have no `grad_fn`. So is every tensor that
# does not require grad, even the result of an operation: nothing was recorded for it, so
# backward has nowhere to go past it.

# %%
x = torch.tensor(2.0, requires_grad=True, device=device)
w = torch.tensor(3.0, requires_grad=True, device=device)
y = w * x
z = y + x
L = z**2
for name, t in {"x": x, "w": w, "y": y, "z": z, "L": L}.items():
    print(
        f"{name}: value {t.item():4}  requires_grad={t.requires_grad}  is_leaf={t.is_leaf!s:5}  grad_fn={t.grad_fn}"
    )
doubled = torch.tensor(2.0, device=device) * 3  # an operation's result that needs no gradient
print(f"2 * 3 without requires_grad: is_leaf={doubled.is_leaf}, grad_fn={doubled.grad_fn}")
assert doubled.is_leaf and x.is_leaf and not y.is_leaf

# %% [markdown]
# Each node points to the nodes that made its inputs through `next_functions`: a tuple with one
# `(node, output_number)` pair per input, in the order the operation received them. `node`
# produced that input (`None` if the input needs no gradient), and `output_number` says
# **which of that node's outputs** it was. It is not the input's position: every operation
# below has one output, so every number printed is 0, `AddBackward0`'s second input included.
# Following the pairs from `L.grad_fn` walks the whole recording. A leaf shows up as an
# `AccumulateGrad` node, whose `.variable` is the leaf itself: it is where backward will add
# the leaf's gradient.

# %%
pow_node = L.grad_fn
add_node = pow_node.next_functions[0][0]
mul_node = add_node.next_functions[0][0]
print("L.grad_fn                  ", pow_node)
print("  its next_functions       ", pow_node.next_functions)
print("AddBackward0.next_functions", add_node.next_functions)
print("MulBackward0.next_functions", mul_node.next_functions)
x_node = add_node.next_functions[1][0]
print("AddBackward0's 2nd input is x's AccumulateGrad:", x_node.variable is x)
print("MulBackward0 reaches the same node again:      ", mul_node.next_functions[1][0] is x_node)

# %% [markdown]
# The number matters for an operation with several outputs. `unbind` splits a tensor into its
# elements with one node, `UnbindBackward0`, that makes them all. Multiply the second element
# by the first, and the product's first input is output **1** of that node, its second input
# output **0**: backward uses the number to know which slice of the split tensor's gradient
# each incoming gradient fills.

# %%
pair = torch.tensor([1.0, 2.0], device=device, requires_grad=True)
first, second = pair.unbind()
product = second * first
print("MulBackward0.next_functions", product.grad_fn.next_functions)
assert [number for _, number in product.grad_fn.next_functions] == [1, 0]
product.backward()
print(f"pair.grad = {pair.grad.tolist()}: d(second·first)/d first = second, and the reverse")

# %% [markdown]
# $x$ is reached twice, once through $y$ and once directly from $z$, but it has **one**
# `AccumulateGrad` node: the recording is a graph (a DAG), not a tree. The picture below is
# drawn from these `next_functions`, by the tape recorder you will use later in the chapter.
# Arrows point the way backward walks, from the loss to the leaves.

# %%
from forge_course.sims.tape import TapeRecorder, draw_tape

draw_tape(
    TapeRecorder("running example", x=2.0, w=3.0).state(),
    title="The recorded graph of L = (w·x + x)², before backward",
)
plt.show()

# %% [markdown]
# *Alt text: four rows of boxes joined by arrows: PowBackward0 (L = 64) at the top, then
# AddBackward0 (z = 8), then MulBackward0 (y = 6), then two orange AccumulateGrad boxes side by
# side for the leaves x = 2 and w = 3. AddBackward0 has a second, curved arrow straight to x's
# box. No gradients are known yet.*
#
# ## Backward by hand
#
# `L.backward()` starts from $\partial L/\partial L = 1$ and, node by node, multiplies the
# gradient arriving at each node by the derivative of that node's operation (the chain rule).
# Where a tensor is used twice, the gradients arriving along both paths **add up**.
#
# **Forward.** $y = 3 \cdot 2 = 6$, $z = 6 + 2 = 8$, $L = 8^2 = 64$.
#
# **Backward, one node at a time.**
#
# * Pow: $\partial L/\partial z = 2z = 16$.
# * Add: $z = y + x$ passes 16 on unchanged to both inputs: $\partial L/\partial y = 16$, and
#   16 towards $x$ (path 1).
# * Mul: $y = w \cdot x$ sends each input the other one, times 16:
#   $\partial L/\partial w = 16 \cdot x = 32$, and $16 \cdot w = 48$ towards $x$ (path 2).
# * $x$'s `AccumulateGrad` receives both paths: $\partial L/\partial x = 16 + 48 = 64$.
#
# **Check by algebra.** $L = (wx + x)^2 = x^2 (w + 1)^2$, so
# $\partial L/\partial x = 2x(w+1)^2 = 2 \cdot 2 \cdot 16 = 64$ and
# $\partial L/\partial w = 2x^2(w+1) = 2 \cdot 4 \cdot 4 = 32$.
#
# Only leaves keep their gradient in `.grad`; `retain_grad()` asks autograd to keep an
# intermediate one too, here $y$'s and $z$'s.

# %%
y.retain_grad()
z.retain_grad()
L.backward()
by_hand = {"dL/dz": 16.0, "dL/dy": 16.0, "dL/dw": 32.0, "dL/dx": 64.0}
autograd = {"dL/dz": z.grad, "dL/dy": y.grad, "dL/dw": w.grad, "dL/dx": x.grad}
for name, value in autograd.items():
    assert value.item() == by_hand[name]
    print(f"{name}: by hand {by_hand[name]:5}   autograd {value.item()}")
print("Every gradient worked out by hand agrees with autograd.")

# %% [markdown]
# ### `backward()` starts from one number
#
# `L.backward()` means "start from $\partial L/\partial L = 1$". That only makes sense when $L$ is a
# single number: for a tensor of several values, autograd cannot know which combination of
# them you want the gradient of, and refuses. Reduce to a scalar first (a loss is a sum or a
# mean over the batch), or say which combination yourself: `v.backward(g)` computes the gradient
# of `(g * v).sum()`. That `g` is the *upstream gradient*, the same thing every node receives
# from the nodes above it.

# %%
v = torch.tensor([1.0, 2.0], requires_grad=True)
try:
    (v * v).backward()
except RuntimeError as err:
    print("backward on 2 numbers:", err)
(v * v).sum().backward()
print("gradient of sum(v²) = 2v:               ", v.grad)
v.grad = None
(v * v).backward(torch.tensor([1.0, 0.5]))
print("with upstream g = [1, 0.5], g · 2v:      ", v.grad)
assert v.grad.tolist() == [2.0, 2.0]

# %% [markdown]
# ## Exercise 1 · `ch01_graph_walk`: walk the recorded graph
#
# Write `graph_nodes(tensor)` that returns the **class name** (`type(node).__name__`) of every
# node reachable from `tensor.grad_fn`, **each node once**, in **breadth-first** order:
#
# 1. start with `tensor.grad_fn`;
# 2. then the nodes in its `next_functions`, in order; then theirs, and so on, taking nodes
#    first in, first out (a `collections.deque` with `popleft()`);
# 3. skip `None` entries (an input that needs no gradient, such as the constant in `x * 2`),
#    and skip a node that is already in the list (the *node*, not its name: two products are
#    two different `MulBackward0` nodes);
# 4. return `[]` when `tensor.grad_fn` is `None`: a leaf, which is a tensor you created or
#    any result that needs no gradient, such as one computed under `torch.no_grad()`.
#
# For the running example, `graph_nodes(L)` is
# `['PowBackward0', 'AddBackward0', 'MulBackward0', 'AccumulateGrad', 'AccumulateGrad']`:
# x's `AccumulateGrad` comes before w's because `AddBackward0` reaches it first.

# %% nbgrader={"grade_id": "ch01_graph_walk", "solution": true}
from collections import deque


def graph_nodes(tensor):
    ### BEGIN SOLUTION
    if tensor.grad_fn is None:
        return []
    seen = {tensor.grad_fn}
    queue = deque([tensor.grad_fn])
    names = []
    while queue:
        node = queue.popleft()
        names.append(type(node).__name__)
        for next_node, _ in node.next_functions:
            if next_node is not None and next_node not in seen:
                seen.add(next_node)
                queue.append(next_node)
    return names
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch01_graph_walk_tests", "grade": true, "points": 2}
# Visible tests: the running example (and h·h + h, h = sigmoid(x)), a·b + c·d, a constant
# operand, and a leaf.
from forge_course.grading import ch01

ch01.check_graph_walk(graph_nodes)
print("graph_nodes: right nodes, each once, in breadth-first order, on all four expressions.")
### BEGIN HIDDEN TESTS
ch01.check_graph_walk(graph_nodes, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Backward yourself: every node once, in topological order
#
# `graph_nodes` lists the nodes; `backward()` *runs* them. Every node is callable: give it
# the gradient of the loss with respect to the node's output, and `node(grad)` applies that
# one operation's chain rule and returns the gradients with respect to its inputs, one per
# entry of `next_functions` (a lone tensor when there is one input). So backward is a loop
# over the nodes with an inbox for each:
#
# 1. post $\partial L/\partial L = 1$ to `loss.grad_fn`;
# 2. take the next node, **add up** everything in its inbox (a tensor used on two paths
#    receives two gradients: this is the "paths add up" of the hand calculation), call
#    `node(total)`, and post each returned gradient to the inbox of the matching
#    `next_functions` node;
# 3. do not call an `AccumulateGrad` node (it would add into `.grad`): the total in its inbox
#    is the gradient of its leaf, `node.variable`.
#
# Step 2 has one condition: a node may run only when **every** node that sends it gradient
# has run, or its total is missing a path. An order with that property is a *topological
# order*, and a depth-first search from the loss gives one: append each node to a list only
# after everything below it (post-order), then reverse the list. In post-order a node comes
# after every node it sends gradient to, so reversed, it comes before all of them. This
# walker handles nodes with one output only (every output number 0), which covers the
# graphs below.


# %%
def topological_order(loss):
    """Every node reachable from ``loss.grad_fn``, each before all the nodes it sends to."""
    order, seen = [], set()

    def visit(node):
        seen.add(node)
        for next_node, _ in node.next_functions:
            if next_node is not None and next_node not in seen:
                visit(next_node)
        order.append(node)  # post-order: after every node below it

    visit(loss.grad_fn)
    return order[::-1]


def backward_by_walking(loss, order=topological_order):
    """``{leaf: dloss/dleaf}`` from calling each node of ``order(loss)`` once, in that order.

    Also returns what is left in the inboxes afterwards: gradients posted to a node that had
    already run. It is empty when the order is topological.
    """
    inbox = {loss.grad_fn: [torch.ones_like(loss)]}
    gradients = {}
    with torch.no_grad():  # the chain rule's arithmetic itself need not be recorded
        for node in order(loss):
            total = sum(inbox.pop(node))  # every path's contribution, added up
            if type(node).__name__ == "AccumulateGrad":
                gradients[node.variable] = total
                continue
            outputs = node(total)
            if isinstance(outputs, torch.Tensor):
                outputs = (outputs,)
            for (next_node, number), grad in zip(node.next_functions, outputs):
                assert number == 0, "this walker handles nodes with one output only"
                if next_node is not None:
                    inbox.setdefault(next_node, []).append(grad)
    return gradients, inbox


x.grad, w.grad = None, None
L = (w * x + x) ** 2
print("topological order:", [type(node).__name__ for node in topological_order(L)])
walked, left_over = backward_by_walking(L)
L.backward()
for name, leaf in (("x", x), ("w", w)):
    print(f"dL/d{name}: walked {walked[leaf].item()}, L.backward() {leaf.grad.item()}")
    assert torch.equal(walked[leaf], leaf.grad)
assert not left_over

# One tensor on two paths: h feeds exp() and the product h·tanh(h), and both reach v and s.
v = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
s = torch.tensor([1.5, 0.5, -2.0], requires_grad=True)
h = v * s
two_paths = (h.exp() + h * h.tanh()).sum()
walked, left_over = backward_by_walking(two_paths)
two_paths.backward()
torch.testing.assert_close(walked[v], v.grad)
torch.testing.assert_close(walked[s], s.grad)
assert not left_over
print(f"h = v·s on two paths: walked     d/dv = {[round(g, 4) for g in walked[v].tolist()]}")
print(f"{'':21}backward() d/dv = {[round(g, 4) for g in v.grad.tolist()]}")

# %% [markdown]
# PyTorch's engine gets the same guarantee without a search: before it runs anything, it
# counts for each node how many nodes send it gradient, and runs a node when that many have
# arrived. It also does one thing this walker leaves out: where an operation broadcast an
# input (a scalar times a vector), the node returns that input's gradient in the broadcast
# shape, and the engine sums it back to the input's shape. Make `s` a single number above
# (`torch.tensor(1.5, requires_grad=True)`) and the comparison fails: the walker's gradient
# for `s` has three numbers where `s.grad` has one.
#
# ### Why not breadth-first?
#
# Exercise 1's breadth-first order also starts at the loss and works down, and on the running
# example it happens to give the right answer: `MulBackward0` comes before x's
# `AccumulateGrad`. It fails as soon as a node is reached along two paths of **different
# lengths**. Take $h = w \cdot x$ and $L = h + h^2$, at $x = 2$, $w = 3$: $h = 6$, $L = 42$.
#
# * **By hand.** $\partial L/\partial h = 1 + 2h = 13$: 1 along the short path (`AddBackward0`
#   → `MulBackward0`) and $2h = 12$ along the long one (`AddBackward0` → `PowBackward0` →
#   `MulBackward0`). So $\partial L/\partial x = 13 \cdot w = 39$ and
#   $\partial L/\partial w = 13 \cdot x = 26$.
# * **Breadth-first** takes `AddBackward0`'s inputs in order: `MulBackward0` (the first
#   input, $h$) before `PowBackward0`. So `MulBackward0` runs with the 1 that has arrived so
#   far and sends $1 \cdot w = 3$ to $x$ and $1 \cdot x = 2$ to $w$. Then `PowBackward0` runs
#   and posts its 12 to `MulBackward0`, which will not run again: $\partial L/\partial x$
#   comes out as 3 instead of 39, and no error says so.
# * **Topological order** puts `PowBackward0` before `MulBackward0` (it sends to it), so
#   `MulBackward0` runs once, with $1 + 12 = 13$.
#
# The next cell runs the same walker with both orders; the breadth-first one comes from the
# course's reference `recorded_graph`, the answer to exercise 1.

# %%
from forge_course.reference import autograd_tape as tape_ref

h = w * x
L = h + h**2
expected = {"breadth-first": (3.0, 2.0, {"MulBackward0": [12.0]}), "topological": (39.0, 26.0, {})}
for label, order in {
    "breadth-first": lambda t: tape_ref.recorded_graph(t).nodes,
    "topological": topological_order,
}.items():
    walked, left_over = backward_by_walking(L, order)
    late = {type(node).__name__: [g.item() for g in grads] for node, grads in left_over.items()}
    print(f"{label:13} order {[type(node).__name__ for node in order(L)]}")
    print(f"{'':13} dL/dx = {walked[x].item()}, dL/dw = {walked[w].item()}, too late: {late}")
    assert (walked[x].item(), walked[w].item(), late) == expected[label]

# %% [markdown]
# *Try it:* write the loss as `h**2 + h` instead. Breadth-first now meets `PowBackward0`
# first and gets 39 and 26: whether it is right depends on the order of an operation's
# inputs, which is no way to compute a gradient. Then make the long path longer
# (`h + (h**2).exp()`) and predict what arrives too late.

# %% [markdown]
# ## `.grad` adds up
#
# `backward()` does not *set* `.grad`, it *adds* to it. Record the same forward again and call
# `backward()` a second time without clearing: each leaf's `.grad` grows by the same gradient
# again. By hand: after two calls $x$ holds $64 + 64 = 128$ and $w$ holds $32 + 32 = 64$; after
# three, 192 and 96.

# %%
x.grad, w.grad = None, None  # start clean: this is what zero_grad() does by default
for call in range(1, 4):
    L = (w * x + x) ** 2  # a new forward records a new graph
    L.backward()
    print(f"after backward call {call}: x.grad = {x.grad.item():5}   w.grad = {w.grad.item():4}")
assert (x.grad.item(), w.grad.item()) == (192.0, 96.0)

# %% [markdown]
# This is exactly why every training loop clears gradients before `backward()`
# (`optimizer.zero_grad()`, which sets each `.grad` to `None`), and it is also what makes
# gradient accumulation possible (chapter 10).
#
# ## After `backward()` the graph is freed
#
# To compute gradients, some nodes keep tensors from the forward pass: `PowBackward0` needs
# $z$ to compute $2z$, `MulBackward0` needs $w$ and $x$. These *saved tensors* are what a
# recording costs in memory, and `backward()` releases them as it goes. The nodes remain, but
# they cannot run again, so a second `backward()` through the same graph raises an error.

# %%
x.grad, w.grad = None, None
L = (w * x + x) ** 2
print("saved by PowBackward0 before backward:", L.grad_fn._saved_self)
L.backward()
try:
    L.grad_fn._saved_self
except RuntimeError as err:
    print("after backward, reading it raises: ", str(err).split(".")[0] + ".")
try:
    L.backward()
except RuntimeError as err:
    print("a second backward raises:          ", str(err).split(".")[0] + ".")

# %% [markdown]
# `retain_graph=True` keeps the saved tensors, so the graph can be walked again. The gradients
# still add up: two calls give $x$ twice 64. Use it only when two backward passes really must
# share one forward, and let the last call free the graph.

# %%
x.grad, w.grad = None, None
L = (w * x + x) ** 2
L.backward(retain_graph=True)  # keep the saved tensors for one more pass
L.backward()  # the last pass frees them
print("x.grad after two passes over one graph:", x.grad.item())
assert x.grad.item() == 128.0

# %% [markdown]
# A trap: the same error appears in a loop that carries a value from one step to the next (a
# running state, a moving average) without detaching it. Each step's graph then hangs on to
# the previous step's, which the previous `backward()` already freed. `retain_graph=True`
# silences the error, but then nothing is ever freed: the graph behind each loss contains
# every earlier step, and each `backward()` walks all of it. The cure is to `detach()` the
# carried value. The next cell counts the nodes behind the loss with the course's reference
# graph walker (the answer to exercise 1, so this cell does not depend on yours).

# %%
gain = torch.tensor(0.5, requires_grad=True)
for fix in ("retain_graph=True", "detach()"):
    state, sizes = torch.zeros(()), []
    for _ in range(30):
        carried = state.detach() if fix == "detach()" else state
        state = carried * gain + 1.0
        loss = state**2
        loss.backward(retain_graph=fix == "retain_graph=True")
        sizes.append(len(tape_ref.graph_nodes(loss)))
    print(f"{fix:18} nodes behind the loss at steps 1, 10, 30: {sizes[0]}, {sizes[9]}, {sizes[29]}")

# %% [markdown]
# ## Gradients without `.grad`: `torch.autograd.grad`
#
# `backward()` writes into the leaves' `.grad`, adding to what is there. When you want a
# gradient as a value (a penalty on it, a check, a meta-learning step), ask for it:
# `torch.autograd.grad(L, (x, w))` returns the tuple $(\partial L/\partial x,
# \partial L/\partial w)$ and leaves every `.grad` alone. It takes any tensor of the graph as
# an input, not only leaves: here $\partial L/\partial z = 16$ without `retain_grad()`. Like
# `backward()`, it frees the graph unless told `retain_graph=True`.

# %%
x.grad, w.grad = None, None
z = w * x + x
L = z**2
dx, dw, dz = torch.autograd.grad(L, (x, w, z))
print(f"torch.autograd.grad: dL/dx = {dx.item()}, dL/dw = {dw.item()}, dL/dz = {dz.item()}")
print(f"and .grad is untouched: x.grad = {x.grad}, w.grad = {w.grad}")
assert (dx.item(), dw.item(), dz.item()) == (64.0, 32.0, 16.0) and x.grad is None

# %% [markdown]
# ### A second derivative: `create_graph=True`
#
# A gradient is normally a plain result: backward records nothing while it runs. With
# `create_graph=True` it records its own operations, so the gradient has a `grad_fn` and can
# be differentiated again. By hand, from $\partial L/\partial x = 2x(w+1)^2$ and
# $\partial L/\partial w = 2x^2(w+1)$:
#
# $$\frac{\partial^2 L}{\partial x^2} = 2(w+1)^2 = 2 \cdot 16 = 32, \qquad
#   \frac{\partial^2 L}{\partial w^2} = 2x^2 = 8 .$$

# %%
L = (w * x + x) ** 2
dx, dw = torch.autograd.grad(L, (x, w), create_graph=True)
print(f"dL/dx = {dx.item()} with grad_fn={type(dx.grad_fn).__name__}")
(dxx,) = torch.autograd.grad(dx, x, retain_graph=True)  # dw's graph shares nodes with it
(dww,) = torch.autograd.grad(dw, w)
print(f"d²L/dx² = {dxx.item()} (by hand 32), d²L/dw² = {dww.item()} (by hand 8)")
assert (dxx.item(), dww.item()) == (32.0, 8.0)

(plain,) = torch.autograd.grad((w * x + x) ** 2, x)  # without create_graph
try:
    torch.autograd.grad(plain, x)
except RuntimeError as err:
    print(f"without create_graph: grad_fn={plain.grad_fn}, and differentiating it again: {err}")

# %% [markdown]
# ### Tensor hooks: look at a gradient, or change it
#
# `t.register_hook(fn)` asks backward to call `fn(grad)` with $\partial L/\partial t$ once it
# is complete (all paths added up). If `fn` returns a tensor, that tensor replaces the
# gradient for everything further down; if it returns `None`, the gradient goes on
# unchanged. Hooks on one tensor run in the order they were registered. `register_hook`
# returns a handle, and `handle.remove()` takes the hook off again: a hook left behind keeps
# acting on every later backward through that tensor.
#
# On the running example, a hook on $y = w \cdot x$ sees $\partial L/\partial y = 16$. A second
# hook that returns `grad * 0` cuts the path through $y$: $w$ gets 0, and $x$ keeps only the
# direct path, 16 instead of 64. After `remove()`, the next backward is back to 64 and 32.

# %%
x.grad, w.grad = None, None
y = w * x
L = (y + x) ** 2
seen = []
look = y.register_hook(lambda grad: seen.append(grad.item()))  # returns None: only looks
cut = y.register_hook(lambda grad: grad * 0)  # returns a tensor: replaces the gradient
L.backward(retain_graph=True)
print(f"the hook saw dL/dy = {seen}; path cut: x.grad = {x.grad.item()}, w.grad = {w.grad.item()}")
assert seen == [16.0] and (x.grad.item(), w.grad.item()) == (16.0, 0.0)
cut.remove()
look.remove()
x.grad, w.grad = None, None
L.backward()
print(f"after remove(): x.grad = {x.grad.item()}, w.grad = {w.grad.item()}, hook calls {len(seen)}")
assert (x.grad.item(), w.grad.item()) == (64.0, 32.0) and seen == [16.0]

# %% [markdown]
# *Try it:* register the printing hook on the leaf `x` instead: it is called once, with 64,
# the sum of both paths. Chapter 10 uses a hook to fake an overflowing gradient.

# %% [markdown]
# ## Simulation: the tape recorder
#
# Choose an **expression** and the values of **x** and **w** (and **n** for the loop): the
# recorder runs the forward and draws the graph it recorded. Each box shows the node's class,
# the value it produced and, after **backward**, the gradient that reached it (for a leaf: what
# this call added, and the total in `.grad`). Things to try:
#
# * press **backward** twice: the intermediate gradients stay the same (each press records a
#   fresh forward), but the leaves' `.grad` doubles; **zero_grad** clears it;
# * **branch** with x > 0 and then x < 0: the graph itself changes;
# * **loop**: one `MulBackward0` per pass, and all of them feed the same `w`;
# * **detach**: only one factor of $y \cdot y$ passes gradient back.
#
# *Without a widget front end this cell shows the running example after one and after two
# presses of backward, side by side.*

# %%
from forge_course.sims.tape import tape_view

tape_view("running example", x=2.0, w=3.0)

# %% [markdown]
# *Alt text: the controls (expression, x, w, n, and the backward and zero_grad buttons) above
# the recorded graph of the running example. In the still picture, two copies of the graph
# side by side: every node shows the same gradient in both (dL/dz = 16, dL/dy = 16, and +64 for
# x, +32 for w), but the leaves' .grad reads 64 and 32 after one call and 128 and 64 after two.*
#
# A light interaction should answer within 50 ms. The next cell measures, on this machine, one
# press of **backward** in the engine (forward, backward, and the description of every node)
# and, separately, drawing the figure.

# %%
tape = TapeRecorder("loop", x=1.5, w=-2.0, n=5)
engine_ms = median_ms(tape.backward)
draw_ms = median_ms(lambda: plt.close(draw_tape(tape.state())), repeats=3)
verdict = "within" if engine_ms < 50 else "over"
print(
    f"engine: {engine_ms:.2f} ms per press of backward ({verdict} 50 ms); drawing: {draw_ms:.0f} ms"
)

# %% [markdown]
# ## Define-by-run: the code that ran is the graph
#
# Autograd never sees your `if` or `for`: it records the operations that actually ran. A
# branch records only the side taken; a loop records one set of nodes per pass. The gradient
# is therefore exactly the gradient of what was computed this time. Here is a forward with
# both, walked with the reference `graph_nodes`.


# %%
def branchy(x, w, repeats):
    out = w * x**3 if x > 0 else w - x
    for _ in range(repeats):
        out = out * w
    return out


for x_value, repeats in [(1.5, 0), (-1.0, 0), (1.5, 2)]:
    xv = torch.tensor(x_value, requires_grad=True)
    wv = torch.tensor(2.0, requires_grad=True)
    out = branchy(xv, wv, repeats)
    out.backward()
    print(f"x = {x_value:4}, {repeats} loop passes: {tape_ref.graph_nodes(out)}")
    print(f"{'':26}dout/dx = {xv.grad.item():g}, dout/dw = {wv.grad.item():g}")

# %% [markdown]
# At $x = 1.5$ the graph is $w \cdot x^3$ and $\partial/\partial x = 3wx^2 = 13.5$; at $x = -1$
# it is $w - x$ and $\partial/\partial x = -1$. Neither graph knows the other branch exists.
#
# ## Under `torch.no_grad()` nothing is recorded
#
# A common claim is that `torch.no_grad()` inside a forward "still builds a graph node" that
# backward then skips. It does not: inside the block no node is created at all. The result has
# `requires_grad=False` and `grad_fn=None`: to autograd it is a constant, a leaf. Anything computed
# from it later starts a new recording that cannot reach back past it.

# %%
xv = torch.tensor(2.0, requires_grad=True)
wv = torch.tensor(3.0, requires_grad=True)
h = wv * xv
with torch.no_grad():
    scale = h * 2  # computed, not recorded
print(
    f"inside no_grad: scale = {scale.item()}, requires_grad={scale.requires_grad}, grad_fn={scale.grad_fn}"
)
out = scale * wv
out.backward()
print("graph of out:", tape_ref.graph_nodes(out), "| its inputs:", out.grad_fn.next_functions)
print(f"dout/dw = {wv.grad.item()} (just scale: the path through h is gone); x.grad = {xv.grad}")
assert scale.grad_fn is None and xv.grad is None and wv.grad.item() == 12.0

# %% [markdown]
# ## In-place changes and the version counter
#
# Saved tensors are only useful if nobody changes them before backward. Every tensor carries a
# **version counter** that each in-place operation (`mul_`, `+=`, `x[0] = ...`) increments.
# A node records the version of each tensor it saves; backward checks it and refuses to
# compute with a tensor that has changed since. `sigmoid` saves its *output*
# ($\sigma' = \sigma(1-\sigma)$), so changing that output in place breaks the backward pass.

# %%
a = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
s = a.sigmoid()  # SigmoidBackward0 saves s itself
print("version of s after sigmoid:", s._version)
s.mul_(2)  # in place: the saved s is now wrong
print("version of s after mul_:   ", s._version)
try:
    s.sum().backward()
except RuntimeError as err:
    message = str(err)
print(message)

# %% [markdown]
# The message says everything needed to find the culprit. The next cell takes it apart:
#
# * **which tensor**: its type and shape, `torch.FloatTensor [3]` (float32, three elements,
#   on the CPU);
# * **who made it**: output 0 of the sigmoid, so it is $s$;
# * **which version**: backward expected the version saved during the forward (0) and found a
#   later one (1): exactly one in-place operation happened in between.
#
# The fix is to write out of place (`s = s * 2` makes a new tensor and leaves the saved one
# alone), or to `clone()` before modifying.

# %%
found = re.search(
    r"\[(?P<tensor>.+?\])\], which is output (?P<output>\d+) of (?P<op>\w+), "
    r"is at version (?P<now>\d+); expected version (?P<saved>\d+)",
    message,
)
print(f"tensor:   {found['tensor']}\nmade by:  output {found['output']} of {found['op']}")
print(f"versions: saved at {found['saved']}, now {found['now']}")
assert int(found["now"]) == s._version and int(found["saved"]) == 0

s = a.sigmoid()
s = s * 2  # out of place: a new tensor, the saved one untouched
s.sum().backward()
print("out of place, backward works: a.grad =", a.grad)

# %% [markdown]
# ## `detach()`, `.data` and `.item()`
#
# Three ways to get at a tensor's values without recording anything. They differ in what they
# share with the original and in what autograd can still see:
#
# | | shares memory with `y` | in-place change seen by autograd | result |
# | --- | --- | --- | --- |
# | `y.detach()` | yes | **yes**: it shares `y`'s version counter | a tensor, `requires_grad=False` |
# | `y.data` | yes | **no**: it has a version counter of its own | a tensor, `requires_grad=False` |
# | `y.item()` | no, a copy | nothing to see | a Python number (one element only) |
#
# The difference in the middle column matters. `exp` saves its output (the derivative of
# $e^x$ is $e^x$), so modifying `y = x.exp()` in place corrupts its backward. Through
# `detach()` the corruption is caught; through `.data` it is not, and the gradient is silently
# wrong.

# %%
xe = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
correct = xe.exp().detach()
print("correct gradient of sum(exp(x)): ", correct)

y = xe.exp()
d = y.detach()
print("detach shares memory:", d.data_ptr() == y.data_ptr())
d.mul_(2)
try:
    y.sum().backward()
except RuntimeError as err:
    print("after detach().mul_(2): backward refuses:", str(err).split(":")[0])

y = xe.exp()
y.data.mul_(2)
print(f"after .data.mul_(2): y's version is still {y._version}; backward runs ...")
y.sum().backward()
print("... and returns                  ", xe.grad, "← twice too big, no error")

value = y[0].item()
print(
    f".item() gives a Python {type(value).__name__}, {value}: a copy of one number, outside torch"
)

# %% [markdown]
# Use `.detach()` (or `torch.no_grad()`) when you need a tensor outside the graph, `.item()`
# for a number to log or print, and leave `.data` alone: it is an old API that survives mostly
# in legacy code.
#
# ## A backward of your own: a stable log-sum-exp
#
# $\operatorname{lse}(x) = \log \sum_i e^{x_i}$ turns up in every softmax and cross-entropy.
# Written as it reads, it breaks for large inputs: $e^{x}$ overflows to `inf` above about 88.7
# in `float32` and above about 709.8 in `float64`, and then the log of `inf` is `inf` (and
# very negative inputs underflow to $\log 0 = -\infty$). The figure evaluates the naive formula
# on the logits $[s,\ s-1,\ s-2]$ as $s$ grows from 0 to 1000 (in steps of 0.01), in both
# dtypes, next to `torch.logsumexp`, and marks where each result is finite.

# %%
scales = torch.linspace(0.0, 1000.0, 100_001, dtype=torch.float64)  # steps of 0.01
logits = scales[:, None] - torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
rows = {}
for dtype in (torch.float32, torch.float64):
    name = str(dtype).replace("torch.", "")
    naive = logits.to(dtype).exp().sum(1).log()
    broken = scales[~torch.isfinite(naive)][0].item()
    # By hand: the sum is e^s · 1.503215, so it overflows where s = log(largest float) − 0.407606.
    predicted = np.log(torch.finfo(dtype).max) - 0.407606
    assert abs(broken - predicted) < 0.02
    print(f"naive log-sum-exp in {name}: first inf at s = {broken:.2f} (by hand {predicted:.2f})")
    rows[f"naive, {name}"] = broken
stable = torch.logsumexp(logits.float(), 1)
assert torch.isfinite(stable).all()
rows["torch.logsumexp, float32"] = scales[-1].item()

fig, ax = plt.subplots(figsize=(8, 2.6))
for i, edge in enumerate(rows.values()):
    ax.barh(i, edge, color=PALETTE["blue"], label="finite" if i == 0 else None)
    if edge < scales[-1]:
        ax.barh(i, scales[-1].item() - edge, left=edge, color=PALETTE["vermillion"], hatch="//",
                label="inf" if i == 0 else None)  # fmt: skip
        ax.text(edge + 8, i, f"inf from s = {edge:.1f}", va="center", color="white", fontsize=9)
ax.set_yticks(range(len(rows)), list(rows))
ax.invert_yaxis()
ax.set(xlabel="largest logit s", ylabel="implementation, dtype", xlim=(0, 1000),
       title="Is log-sum-exp of [s, s−1, s−2] finite?")  # fmt: skip
ax.legend(fontsize=8, loc="lower right")
plt.show()

# %% [markdown]
# *Alt text: three horizontal bars over s from 0 to 1000. The naive float32 bar is finite
# (blue) only up to s = 88.3 and inf (red, hatched) after; the naive float64 bar is finite up
# to s = 709.4; torch.logsumexp in float32 is finite all the way.*
#
# The naive results turn to `inf` a little before $e^{s}$ itself overflows, because the *sum*
# is larger than its largest term: it is $e^{s} \cdot 1.503215$ (the hand calculation below),
# so it overflows at $s = \log(\text{largest float}) - 0.41$: $88.72 - 0.41 \approx 88.3$ in
# `float32` and $709.78 - 0.41 \approx 709.4$ in `float64`. The cell checked both against the
# measured points.
#
# The cure is to subtract the maximum $m$ first: $\operatorname{lse}(x) = m + \log \sum_i
# e^{x_i - m}$. Every exponent is then at most 0, so no term exceeds 1 and the largest term is
# exactly 1, which keeps the log finite too.
#
# **Hand calculation.** For $x = [1000,\ 999,\ 998]$, $m = 1000$ and
#
# $$\operatorname{lse}(x) = 1000 + \log\left(e^{0} + e^{-1} + e^{-2}\right)
#   = 1000 + \log(1 + 0.367879 + 0.135335) = 1000 + \log 1.503215 = 1000.407606 .$$
#
# **The gradient.** $\partial \operatorname{lse}/\partial x_i = e^{x_i} / \sum_j e^{x_j}
# = e^{x_i - \operatorname{lse}(x)}$, which is the **softmax** of $x$:
# $[1,\ 0.367879,\ 0.135335] / 1.503215 = [0.665241,\ 0.244728,\ 0.090031]$, summing to 1.
# The stable forward already computes both parts of that ratio, shifted by $m$: the terms
# $e^{x_i - m}$ and their sum. Their quotient is the softmax, with no overflow anywhere.
# ($e^{x_i - \operatorname{lse}}$ is another stable way, since its exponents are never
# positive, though a little less precise in `float32`, where $\operatorname{lse}$ near 1000 is
# rounded to the nearest $6 \cdot 10^{-5}$.)

# %%
hand = torch.tensor([1000.0, 999.0, 998.0], dtype=torch.float64, requires_grad=True)
lse = torch.logsumexp(hand, 0)
lse.backward()
print(f"lse by hand 1000.407606, torch {lse.item():.6f}")
print(
    f"softmax by hand [0.665241, 0.244728, 0.090031], torch {[round(v, 6) for v in hand.grad.tolist()]}"
)
assert abs(lse.item() - 1000.407606) < 1e-6
assert torch.allclose(
    hand.grad, torch.tensor([0.665241, 0.244728, 0.090031], dtype=torch.float64), rtol=0, atol=1e-6
)

# %% [markdown]
# ### How a `torch.autograd.Function` works
#
# Subclass `torch.autograd.Function` and write two static methods:
#
# * `forward(ctx, x, dim)` computes the result from plain tensors (nothing inside it is
#   recorded) and stores what backward will need: `ctx.save_for_backward(tensor, ...)` for
#   tensors, attributes such as `ctx.dim = dim` for anything else;
# * `backward(ctx, grad_output)` receives $\partial L/\partial\,\text{output}$, the gradient
#   arriving from above, and returns $\partial L/\partial\,\text{input}$ **for each input of
#   forward**, in order: a tensor for `x`, `None` for `dim`.
#
# You call it as `LogSumExp.apply(x, dim)`; the result's `grad_fn` is a `LogSumExpBackward`
# node that runs your backward. `grad_output` has the shape of the result, which lacks the
# summed dimension: `grad_output.unsqueeze(dim)` puts it back so it multiplies the softmax
# row by row.
#
# ## Exercise 2 · `ch01_logsumexp`: a log-sum-exp that does not overflow
#
# Complete `LogSumExp` so that `LogSumExp.apply(x, dim)` equals `torch.logsumexp(x, dim)` (the
# summed dimension removed) for any shape, stays finite for logits near ±1000, and has the
# gradient `softmax(x, dim) * grad_output.unsqueeze(dim)`. Keep it a `torch.autograd.Function`
# (its own `forward` and `backward`, and the `apply` it inherits). Build the forward from
# `amax`, `exp`, `sum` and `log`: calling `torch.logsumexp` (under any of its names) would skip
# the point of the exercise, so neither `forward` nor `backward` may call it, and the check
# watches for it. Leave `x` as it is: compute `x - m` as a new tensor, and write nothing into
# `x` at any point, in place or through `.data`, not even to put it back afterwards. Make sure
# the softmax used in backward cannot overflow either: save it from the forward, or compute it
# from shifted exponents. The hidden tests also run `gradcheck` in `float64`.


# %% nbgrader={"grade_id": "ch01_logsumexp", "solution": true}
class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ### BEGIN SOLUTION
        m = x.amax(dim=dim, keepdim=True)
        exps = torch.exp(x - m)  # every exponent <= 0: no overflow, and the largest term is 1
        total = exps.sum(dim=dim, keepdim=True)
        ctx.save_for_backward(exps / total)  # the softmax: all that backward needs
        ctx.dim = dim
        return (m + torch.log(total)).squeeze(dim)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        (softmax,) = ctx.saved_tensors
        return softmax * grad_output.unsqueeze(ctx.dim), None
        ### END SOLUTION


# %% nbgrader={"grade_id": "ch01_logsumexp_tests", "grade": true, "points": 3}
# Visible tests: the hand example [1000, 999, 998], and a 3×4 batch along the last dim.
from forge_course.grading import ch01

ch01.check_logsumexp(LogSumExp)
print("LogSumExp: finite at 1000, equal to torch.logsumexp, gradient equal to the softmax.")
### BEGIN HIDDEN TESTS
ch01.check_logsumexp(LogSumExp, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# `torch.autograd.gradcheck` is how to trust a hand-written backward: it nudges every input by
# a tiny amount, measures how the output moves (finite differences), and compares that with
# what your backward returns. It needs `float64`, because in `float32` the nudges drown in
# rounding. The next cell runs it on the reference version of the exercise, and compares the
# reference with the naive formula differentiated by autograd at logits near 1000.

# %%
gen = torch.Generator().manual_seed(SEED)
probe = (torch.randn(4, 5, generator=gen, dtype=torch.float64) + 1000.0).requires_grad_()
print(
    "gradcheck, float64, logits near 1000:",
    torch.autograd.gradcheck(lambda t: tape_ref.LogSumExp.apply(t, 1), (probe,)),
)

big_logits = torch.tensor([[1000.0, 999.0, 998.0]], device=device, requires_grad=True)
naive = big_logits.exp().sum(1).log()
naive.sum().backward()
print(
    f"naive formula through autograd: value {naive.tolist()}, gradient {big_logits.grad.tolist()}"
)
big_logits.grad = None
stable = tape_ref.LogSumExp.apply(big_logits, 1)
stable.sum().backward()
print(
    f"our Function:                   value {stable.tolist()}, gradient {big_logits.grad.tolist()}"
)
print("its node in the graph:", tape_ref.graph_nodes(stable))

# %% [markdown]
# The naive formula's gradient is `nan`: going backward, the log contributes
# $1/\sum e^{x} = 1/\infty = 0$, the exp multiplies that by $e^{1000} = \infty$, and
# $0 \cdot \infty$ is `nan`. The custom Function's forward and backward both stay finite.
#
# ### Where did the `nan` come from? Anomaly mode
#
# Nothing failed above: the naive gradient came back `nan`, and backward said nothing. In
# **anomaly mode** backward checks what every node returns and raises at the first node whose
# gradient holds a `nan`; and since the mode also records where each forward operation was
# called, it says which line of *your* code made that node. Switch it on for a block with
# `with torch.autograd.detect_anomaly():`, or with `torch.autograd.set_detect_anomaly(True)`
# (a switch that also works as a `with`). It slows every operation down, so it is for finding
# a bug, not for training runs; chapter 07 uses it to hunt a `nan` in a model.
#
# The forward line arrives as a `UserWarning` next to the error, and `detect_anomaly()` also
# warns that it is on. The next cell records both with `warnings.catch_warnings(record=True)`,
# so nothing lands on stderr, and prints the error and the end of the recorded traceback: its
# last two frames, this cell and the function that called `exp`.


# %%
def naive_lse(t):
    return t.exp().sum(1).log()


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")  # record every warning, even one shown before
    with torch.autograd.detect_anomaly():
        try:
            naive_lse(big_logits).sum().backward()
        except RuntimeError as err:
            anomaly_error = str(err)
print("the error:", anomaly_error)
for warning in caught:
    first_line, *rest = str(warning.message).split(" (Triggered internally")[0].splitlines()
    print("warning:", first_line)
    if rest:
        print("\n".join(rest[-4:]))
        assert "in naive_lse" in rest[-2] and "t.exp()" in rest[-1]
assert "ExpBackward0" in anomaly_error

with torch.autograd.set_detect_anomaly(True):
    assert torch.is_anomaly_enabled()
assert not torch.is_anomaly_enabled()  # the with block switched it off again

# %% [markdown]
# ## A gradient that lies on purpose: the straight-through estimator
#
# Rounding is everywhere in quantised models, and its derivative is useless: `round` is flat
# between integers, so its gradient is 0 almost everywhere (and undefined at the jumps).
# Anything that passes through `torch.round` stops learning. The **straight-through
# estimator** (STE) keeps the rounded value in the forward but, in the backward, passes the
# incoming gradient through unchanged, as if the operation had been the identity. The left
# plot shows the forward, the right the gradient autograd returns for each version.

# %%
grid = torch.linspace(-2.0, 2.0, 401, requires_grad=True)
torch.round(grid).sum().backward()
round_grad = grid.grad.clone()
grid.grad = None
tape_ref.round_ste(grid).sum().backward()
ste_grad = grid.grad.clone()

fig, (ax_value, ax_grad) = plt.subplots(1, 2, figsize=(10, 3.4))
ax_value.plot(
    grid.detach(),
    torch.round(grid.detach()),
    color=PALETTE["blue"],
    label="round(x): the forward of both",
)
ax_value.plot(grid.detach(), grid.detach(), ":", color=PALETTE["grey"], label="identity")
ax_value.set(xlabel="x", ylabel="value", title="Forward: the value is rounded")
ax_grad.plot(grid.detach(), round_grad, color=PALETTE["vermillion"], lw=2, label="torch.round")
ax_grad.plot(grid.detach(), ste_grad, "--", color=PALETTE["green"], lw=2, label="straight-through")
ax_grad.set(
    xlabel="x",
    ylabel="d out / d x (from autograd)",
    title="Backward: the gradient",
    ylim=(-0.2, 1.3),
)
for ax in (ax_value, ax_grad):
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: left, a staircase (round) and a dotted diagonal (identity) from −2 to 2. Right,
# the gradient autograd returns: a flat red line at 0 for `torch.round`, a dashed green line
# at 1 for the straight-through version.*
#
# ## Exercise 3 · `ch01_straight_through`: rounding with a straight-through gradient
#
# Write `round_ste(x)` whose value equals `torch.round(x)` (halves go to the even neighbour:
# $0.5 \to 0$, $1.5 \to 2$) and whose backward passes `grad_output` on unchanged, for any
# shape, dtype and device. The result must stay in the graph, and the gradient must keep
# flowing past it when `x` is itself the output of earlier operations. Return a new tensor and
# leave `x` as it was: no in-place change to it at any point, not even through `.data` and not
# even to put it back afterwards (the caller still needs its values, and autograd would not see
# the change). A `torch.autograd.Function` works;
# so does a one-line trick with `detach()`, if you find it.


# %% nbgrader={"grade_id": "ch01_straight_through", "solution": true}
class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        return torch.round(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        return grad_output
        ### END SOLUTION


def round_ste(x):
    ### BEGIN SOLUTION
    return RoundSTE.apply(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch01_straight_through_tests", "grade": true, "points": 2}
# Visible tests: x = [-1.5, -0.6, -0.4, 0.4, 0.5, 1.5, 2.7] with upstream gradient [1, ..., 7].
from forge_course.grading import ch01

ch01.check_straight_through(round_ste)
print("round_ste: rounds like torch.round, and passes the gradient straight through.")
### BEGIN HIDDEN TESTS
ch01.check_straight_through(round_ste, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# What the lie buys: a weight that is rounded before use can still learn. The model below is
# $\hat t = \operatorname{round}(w) \cdot x$ with targets $t = 3x$, trained with SGD from
# $w = 0.2$. Through `torch.round`, $w$ receives a zero gradient and never moves. Through the
# reference straight-through rounding it climbs until $\operatorname{round}(w) = 3$, where the
# loss is exactly 0.

# %%
inputs = torch.linspace(-1.0, 1.0, 32, device=device)
targets = 3 * inputs
curves = {}
for name, rounding in {"torch.round": torch.round, "straight-through": tape_ref.round_ste}.items():
    weight = torch.tensor(0.2, device=device, requires_grad=True)
    history = []
    for _ in range(STE_STEPS):
        loss = ((rounding(weight) * inputs - targets) ** 2).mean()
        weight.grad = None
        loss.backward()
        with torch.no_grad():
            weight -= STE_LR * weight.grad
        history.append((weight.item(), loss.item()))
    curves[name] = history
    print(
        f"{name:16}: after {STE_STEPS} steps w = {history[-1][0]:.4f}, round(w) = {round(history[-1][0])}, loss = {history[-1][1]:.4f}"
    )

fig, ax = plt.subplots(figsize=(7, 3.2))
for (name, history), colour in zip(curves.items(), [PALETTE["vermillion"], PALETTE["green"]]):
    ax.plot([h[0] for h in history], color=colour, marker=".", label=name)
ax.axhspan(2.5, 3.5, color=PALETTE["sky"], alpha=0.25, label="round(w) = 3: loss 0")
ax.set(xlabel="SGD step", ylabel="weight w", title="Training a weight that is rounded before use")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# *Alt text: the weight trained through `torch.round` stays flat at 0.2 for all steps; the
# weight trained with the straight-through estimator climbs, more slowly as round(w) nears 3,
# and stops just inside the shaded band between 2.5 and 3.5, where round(w) = 3 and the loss
# is 0.*
#
# ## Check your understanding
#
# **Question 1 (`ch01_q_grad_sum`).** What is `x.grad` after this code? Set `grad_sum` to a
# number.
#
# ```python
# x = torch.tensor(3.0, requires_grad=True)
# for _ in range(2):
#     loss = x * x + x
#     loss.backward()
# ```
#
# **Question 2 (`ch01_q_data`).** What happens here? Set `data_answer` to one letter.
#
# ```python
# x = torch.tensor([0.0, 1.0], requires_grad=True)
# y = x.exp()
# y.data.mul_(2)
# y.sum().backward()
# ```
#
# * **a**: backward raises a RuntimeError: `y` was modified by an in-place operation.
# * **b**: backward runs, and `x.grad` is $2e^{x}$: wrong, with no error.
# * **c**: backward runs, and `x.grad` is $e^{x}$: `.data` modified a copy.
# * **d**: `x.grad` stays `None`: `.data` cut `y` off the graph.
#
# **Question 3 (`ch01_q_no_grad`).** A model's forward computes
# `with torch.no_grad(): h = self.encoder(inputs)` and then returns `self.head(h)`. After
# `loss.backward()`, which is true? Set `no_grad_answer` to one letter.
#
# * **a**: the encoder's parameters get gradients as usual; `no_grad` only skips saving
#   tensors for backward.
# * **b**: `h.grad_fn` is `None`; the encoder's parameters get no gradient (their `.grad`
#   stays `None`) while the head's do.
# * **c**: `h.grad_fn` is a node that backward skips, so the encoder's `.grad` are tensors of
#   zeros.
# * **d**: `loss.backward()` raises an error, because `h` does not require grad.

# %% nbgrader={"grade_id": "ch01_questions", "solution": true}
grad_sum = None
data_answer = None
no_grad_answer = None
### BEGIN SOLUTION
grad_sum = 14
data_answer = "b"
no_grad_answer = "b"
### END SOLUTION

# %% nbgrader={"grade_id": "ch01_q_grad_sum", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(grad_sum, "ch01_q_grad_sum")
### BEGIN HIDDEN TESTS
check_number(
    grad_sum,
    "ch01_q_grad_sum",
    expected=14,
    hints={
        7: "that is one call. backward adds into .grad, so the second call adds another 2x + 1 = 7.",
        12: "d(x·x)/dx = 2x = 6 per call, but the + x term adds 1 more each time.",
        6: "d(x·x)/dx = 6 is only part of one call: + x adds 1, and the second call adds it all again.",
        24: ".grad holds the derivative 2x + 1, not the value of x·x + x.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch01_q_data", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(data_answer, "ch01_q_data", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    data_answer,
    "ch01_q_data",
    choices="abcd",
    correct="b",
    why_not={
        "a": ".data has a version counter of its own, so autograd never learns of the change. "
        "With .detach() it would raise.",
        "c": ".data shares y's memory; nothing is copied, so exp's saved output is doubled.",
        "d": ".data does not touch y's graph: y still has grad_fn=ExpBackward0.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch01_q_no_grad", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(no_grad_answer, "ch01_q_no_grad", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    no_grad_answer,
    "ch01_q_no_grad",
    choices="abcd",
    correct="b",
    why_not={
        "a": "under no_grad nothing is recorded at all, so no gradient can reach the encoder.",
        "c": "no node is created (h.grad_fn is None), and a parameter no gradient reaches keeps "
        ".grad = None, not zeros.",
        "d": "the loss still depends on the head's parameters, so backward runs; only the "
        "encoder is cut off.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# t = torch.from_numpy(arr)                  # shares arr's memory: a write to either shows in both
# x = torch.tensor(2.0, requires_grad=True)  # without it: nothing is recorded, x.grad stays None
# loss.backward()                            # one number (else v.backward(g)); ADDS into .grad; frees the graph
# optimizer.zero_grad()                      # (x.grad = None) without it: the next backward adds to the last
# loss.backward(retain_graph=True)           # only for two backwards over one forward; a carried value wants detach()
# loss.grad_fn.next_functions                # the recorded DAG: (node that made the input, which of its outputs), None, AccumulateGrad
# node(grad)                                 # one node's chain rule; run each once, after all its senders (DFS post-order, reversed)
# torch.autograd.grad(L, (x, w))             # the gradients returned, .grad untouched; create_graph=True to differentiate again
# handle = t.register_hook(fn)               # fn(grad) sees dL/dt and may return a replacement; handle.remove() when done
# with torch.no_grad(): ...                  # nothing is recorded (grad_fn is None): the path is cut
# y.detach(); y.item()                       # not y.data: its in-place changes go unseen, gradients silently wrong
# s = s * 2                                  # not s.mul_(2) on a saved tensor: "is at version 1; expected version 0"
# class F(torch.autograd.Function): ...      # forward saves with ctx; backward returns a gradient per input
# torch.autograd.gradcheck(F.apply, (x64,))  # float64: without it, a wrong backward trains silently on
# with torch.autograd.detect_anomaly(): ...  # raises at the first node returning nan, names the forward line; slow
# x + (torch.round(x) - x).detach()          # straight-through: round's value, the identity's gradient
# ```
#
# * A tensor is memory plus dtype, device and shape; bytes = elements × element size.
# * The graph is a DAG of nodes linked by `next_functions`; gradients along several paths add.
# * Backward calls each node once, with the sum of everything sent to it, so a node must come
#   after all its senders: a topological order. Breadth-first can run a node too early.
# * The graph is whatever ran: branches and loops decide its shape, `no_grad` leaves it out.
# * A custom Function replaces autograd's backward with yours: subtract the max to keep
#   log-sum-exp finite; let rounding pass gradient straight through.
#
# Next, chapter 02 feeds the loop with data: Datasets, DataLoaders and their workers.
