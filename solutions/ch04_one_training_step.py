# %% [markdown]
# # Chapter 04 · Anatomy of one training step
#
# Every PyTorch training script, however long, repeats five lines in a fixed order. This
# chapter takes one step apart: first on paper, with a layer small enough to compute by hand,
# then in PyTorch, where each line does exactly one of the things you did on paper. Then it
# breaks the order on purpose, so you can recognise each broken order by its numbers.
#
# **By the end of this chapter you can:**
#
# 1. compute one SGD step of a linear layer with MSE loss by hand: forward, loss, gradients,
#    update;
# 2. name the five operations of a step in their order, and what silently breaks when one is
#    missing or moved;
# 3. write `train_step(model, optimizer, loss_fn, x, y)` that works on any device and returns
#    a plain number;
# 4. explain why `nn.CrossEntropyLoss` must be given logits, not probabilities.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
LR = 0.01  # learning rate of the running example (SGD)
DEMO_STEPS = 40  # steps in the "broken order" experiment
TIMING_REPEATS = 30  # timings are the median of this many runs

import time

import matplotlib.pyplot as plt
import torch

from forge_course import pick_device
from forge_course.device import describe
from forge_course.sims.display import PALETTE

device = pick_device()
torch.manual_seed(SEED)
print("Running on", describe(device))

# %% [markdown]
# ## The running example
#
# One linear layer with two inputs and two outputs, $y = W x + b$, and one training example:
#
# $$W = \begin{bmatrix} 0.5 & -0.3 \\ 0.2 & 0.8 \end{bmatrix},\quad
#   b = \begin{bmatrix} 0 \\ 0 \end{bmatrix},\quad
#   x = \begin{bmatrix} 1 \\ 2 \end{bmatrix},\quad
#   t = \begin{bmatrix} 1 \\ 0 \end{bmatrix}$$
#
# The loss is the mean squared error over the two outputs,
# $L = \frac{1}{2}\sum_i (y_i - t_i)^2$, and the optimizer is plain SGD with learning rate
# $0.01$: every parameter moves by $-0.01$ times its gradient.
#
# ## The five operations, in order
#
# | # | line | what it does | without it, or out of order |
# | --- | --- | --- | --- |
# | 1 | `optimizer.zero_grad()` | clears `.grad` of every parameter | `.grad` keeps adding up: each update uses the sum of all past gradients |
# | 2 | `output = model(x)` | forward pass; records the graph of operations | nothing to differentiate |
# | 3 | `loss = loss_fn(output, y)` | reduces the batch to one number | `backward()` needs a scalar |
# | 4 | `loss.backward()` | walks the graph backwards, **adds** each gradient into `.grad`, frees the graph | `step()` finds no gradients, or last step's |
# | 5 | `optimizer.step()` | moves each parameter against its `.grad` | the model never changes |
#
# A learning-rate scheduler, if there is one, steps after the optimizer. Leave out the forward
# or the loss and the script stops: there is nothing to call `backward()` on, or not one number
# (`RuntimeError: grad can be implicitly created only for scalar outputs`). Leave out
# `zero_grad()`, `backward()` or `step()`, or shuffle the three in any order that still calls
# `backward()` after the loss exists, and nothing raises an error at all; the rest of this
# chapter shows what each of those mistakes looks like instead.

# %% [markdown]
# ## One step by hand
#
# **Forward.** Each output is a row of $W$ times $x$, plus the bias:
# $y_1 = 0.5\cdot 1 + (-0.3)\cdot 2 + 0 = -0.1$ and $y_2 = 0.2\cdot 1 + 0.8\cdot 2 + 0 = 1.8$,
# so $y = [-0.1,\ 1.8]$.
#
# **Loss.** The errors are $y - t = [-1.1,\ 1.8]$, so
# $L = \frac{1}{2}\left((-1.1)^2 + 1.8^2\right) = \frac{1}{2}(1.21 + 3.24) = 2.225$.
#
# **Backward.** Differentiate the mean: $\partial L/\partial y_i = 2(y_i - t_i)/2 = y_i - t_i$,
# so $\partial L/\partial y = [-1.1,\ 1.8]$. Because $y_i = \sum_j W_{ij} x_j + b_i$, each weight's
# gradient is its output's gradient times its input, $\partial L/\partial W_{ij} =
# \partial L/\partial y_i \cdot x_j$ (an outer product), and the bias gets the output's gradient
# unchanged:
#
# $$\frac{\partial L}{\partial W} = \begin{bmatrix} -1.1\cdot 1 & -1.1\cdot 2 \\ 1.8\cdot 1 & 1.8\cdot 2\end{bmatrix}
#   = \begin{bmatrix} -1.1 & -2.2 \\ 1.8 & 3.6 \end{bmatrix},\qquad
#   \frac{\partial L}{\partial b} = \begin{bmatrix} -1.1 \\ 1.8 \end{bmatrix}$$
#
# **Update.** $W' = W - 0.01\,\partial L/\partial W$ and $b' = b - 0.01\,\partial L/\partial b$:
#
# $$W' = \begin{bmatrix} 0.511 & -0.278 \\ 0.182 & 0.764 \end{bmatrix},\qquad
#   b' = \begin{bmatrix} 0.011 \\ -0.018 \end{bmatrix}$$
#
# **Did it help?** With the new parameters $y' = [0.511 - 0.556 + 0.011,\
# 0.182 + 1.528 - 0.018] = [-0.034,\ 1.692]$ and
# $L' = \frac{1}{2}(1.034^2 + 1.692^2) = \frac{1}{2}(1.069156 + 2.862864) = 1.96601$.
# The loss fell from 2.225 to 1.96601.
#
# The next cell asks autograd for the same numbers.

# %%
W = torch.tensor([[0.5, -0.3], [0.2, 0.8]], dtype=torch.float64, requires_grad=True)
b = torch.zeros(2, dtype=torch.float64, requires_grad=True)
x = torch.tensor([1.0, 2.0], dtype=torch.float64)
t = torch.tensor([1.0, 0.0], dtype=torch.float64)

y = W @ x + b
y.retain_grad()  # keep dL/dy too: autograd normally keeps gradients of leaves only
loss = ((y - t) ** 2).mean()
loss.backward()
with torch.no_grad():
    W_new, b_new = W - LR * W.grad, b - LR * b.grad
    loss_new = ((W_new @ x + b_new - t) ** 2).mean()

by_hand = {
    "y": [-0.1, 1.8],
    "loss": 2.225,
    "dL/dy": [-1.1, 1.8],
    "dL/dW": [[-1.1, -2.2], [1.8, 3.6]],
    "dL/db": [-1.1, 1.8],
    "W'": [[0.511, -0.278], [0.182, 0.764]],
    "b'": [0.011, -0.018],
    "L'": 1.96601,
}
autograd = {
    "y": y, "loss": loss, "dL/dy": y.grad, "dL/dW": W.grad, "dL/db": b.grad,
    "W'": W_new, "b'": b_new, "L'": loss_new,
}  # fmt: skip
for name, value in autograd.items():
    torch.testing.assert_close(value.detach(), torch.tensor(by_hand[name], dtype=torch.float64))
    print(f"{name:6} by hand {str(by_hand[name]):28} autograd {value.detach().tolist()}")
print("Every number worked out by hand agrees with autograd.")

# %% [markdown]
# ## Exercise 1 · `ch04_hand_step`: the step in plain Python
#
# Write `hand_step(W, b, x, t, lr)` for a linear layer of any size: `W` is a list of `m` rows
# of `n` floats, `b` and `t` have `m` floats, `x` has `n`. Return a dict with the keys `"y"`,
# `"loss"`, `"dL_dy"`, `"dL_dW"`, `"dL_db"`, `"W_new"` and `"b_new"` (lists or NumPy arrays of
# the shapes of the tensors they stand for; `"loss"` a number). The loss is the mean over the
# `m` outputs, as above. Use plain Python or NumPy, not autograd: the check calls it with grad
# mode off, and an answer that records a graph all the same (inside `torch.enable_grad()`, say)
# fails.


# %% nbgrader={"grade_id": "ch04_hand_step", "solution": true}
def hand_step(W, b, x, t, lr):
    ### BEGIN SOLUTION
    m = len(t)
    y = [sum(w * xj for w, xj in zip(row, x)) + bi for row, bi in zip(W, b)]
    loss = sum((yi - ti) ** 2 for yi, ti in zip(y, t)) / m
    dL_dy = [2 * (yi - ti) / m for yi, ti in zip(y, t)]
    dL_dW = [[g * xj for xj in x] for g in dL_dy]
    W_new = [[w - lr * g for w, g in zip(row, grow)] for row, grow in zip(W, dL_dW)]
    b_new = [bi - lr * g for bi, g in zip(b, dL_dy)]
    return {
        "y": y,
        "loss": loss,
        "dL_dy": dL_dy,
        "dL_dW": dL_dW,
        "dL_db": dL_dy,
        "W_new": W_new,
        "b_new": b_new,
    }
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch04_hand_step_tests", "grade": true, "points": 2}
# Visible tests: the running example and a layer with three outputs.
from forge_course.grading import ch04

ch04.check_hand_step(hand_step)
print("hand_step: correct on the running example and on a 3×2 layer.")
### BEGIN HIDDEN TESTS
ch04.check_hand_step(hand_step, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Simulation: step through one iteration
#
# Move the **stage** slider to watch the iteration fill in, one operation at a time: new tensors
# are orange, tensors already known are blue, tensors not computed yet are grey. Move **lr** to
# see the update grow with the learning rate; past 1/6 the step overshoots the target, and
# past 1/3 it overshoots so far that the loss after it is *higher* (the cell after the
# simulation shows why those are the thresholds here).
#
# *Without a widget front end this cell shows the forward, backward and check stages as one
# still picture: rows of labelled boxes holding the numbers worked out above.*

# %%
from forge_course.sims.step_through import step_through_view

step_through_view(W=[[0.5, -0.3], [0.2, 0.8]], b=[0.0, 0.0], x=[1.0, 2.0], t=[1.0, 0.0], lr=LR)

# %% [markdown]
# **Why 1/3.** A step moves weight $W_{ij}$ by $-\text{lr} \cdot \partial L/\partial y_i \cdot
# x_j$ and bias $b_i$ by $-\text{lr} \cdot \partial L/\partial y_i$, so output $y_i$ moves by
# $-\text{lr} \cdot \partial L/\partial y_i \cdot (\lVert x \rVert^2 + 1)$. Here
# $\partial L/\partial y_i = y_i - t_i$ and $\lVert x \rVert^2 + 1 = 1 + 4 + 1 = 6$: every error
# $y_i - t_i$ is multiplied by $1 - 6\,\text{lr}$, and the loss by $(1 - 6\,\text{lr})^2$. The
# loss after the step is lower while $|1 - 6\,\text{lr}| < 1$, that is for $0 < \text{lr} < 1/3$;
# at $\text{lr} = 1/6$ the step lands exactly on the target. The course's reference step agrees:

# %%
from forge_course.reference.step import evaluate_linear
from forge_course.reference.step import hand_step as reference_step

for step_lr in (0.1, 1 / 6, 1 / 3, 0.4):
    stepped = reference_step([[0.5, -0.3], [0.2, 0.8]], [0.0, 0.0], [1.0, 2.0], [1.0, 0.0], step_lr)
    _, loss_after = evaluate_linear(stepped["W_new"], stepped["b_new"], [1.0, 2.0], [1.0, 0.0])
    predicted = 2.225 * (1 - 6 * step_lr) ** 2
    assert abs(loss_after - predicted) < 1e-12
    print(
        f"lr = {step_lr:.4f}: loss 2.225 → {loss_after:.4f}; 2.225 × (1 − 6·lr)² = {predicted:.4f}"
    )

# %% [markdown]
# ## `.grad` adds up
#
# `backward()` does not *set* `.grad`; it *adds* to it. Call it twice on the running example
# without clearing and the gradient doubles: exactly $2 \times [-1.1,\ -2.2]$ in the first row.

# %%
W = torch.tensor([[0.5, -0.3], [0.2, 0.8]], requires_grad=True)
for call in range(1, 4):
    loss = ((W @ torch.tensor([1.0, 2.0]) - torch.tensor([1.0, 0.0])) ** 2).mean()
    loss.backward()
    print(f"after backward call {call}: W.grad[0] = {W.grad[0].tolist()}")

# %% [markdown]
# Summing is what makes gradient accumulation possible (chapter 10), and it is why the loop
# clears gradients first. With the default `set_to_none=True`, `zero_grad()` sets `.grad` to
# `None`, and the next `backward()` writes a fresh tensor instead of adding.
#
# `None` and a tensor of zeros are not the same to an optimizer, though. `step()` skips a
# parameter whose `.grad` is `None`; a parameter whose `.grad` holds zeros is updated with a
# zero gradient, and an optimizer with state still moves it: SGD with momentum by its velocity,
# AdamW by its running averages and its weight decay. That matters whenever a parameter gets
# no gradient in a step: a branch the forward did not use, a frozen layer (chapter 07). The
# next cell gives one parameter a gradient in the first step only, and measures how far it
# moves in the four steps after, with each kind of `zero_grad()`.


# %%
def idle_drift(make_optimizer, set_to_none, steps=5):
    """How far a parameter that gets a gradient in the first step only moves after it."""
    used = torch.nn.Parameter(torch.tensor([1.0, -1.0], device=device))
    idle = torch.nn.Parameter(torch.tensor([1.0, -1.0], device=device))
    optimizer = make_optimizer([used, idle])
    for step in range(steps):
        optimizer.zero_grad(set_to_none=set_to_none)
        loss = (used**2).sum() + ((idle**2).sum() if step == 0 else 0)
        loss.backward()
        optimizer.step()
        if step == 0:
            after_first_step = idle.detach().clone()
    return (idle.detach() - after_first_step).norm().item()


optimizers = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1),
    "SGD, momentum 0.9": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.1),
}
print("distance the idle parameter moved in steps 2-5:")
for name, make in optimizers.items():
    as_none, as_zeros = idle_drift(make, set_to_none=True), idle_drift(make, set_to_none=False)
    print(f"  {name:18} .grad = None: {as_none:.4f}   .grad = zeros: {as_zeros:.4f}")
    assert as_none == 0 and (as_zeros > 0) == (name != "SGD")

# %% [markdown]
# With plain SGD the two agree: a zero gradient moves nothing. With momentum or AdamW, zeros keep
# the parameter moving for many steps after its last real gradient, while `None` leaves it where
# it is. Which one a model needs depends on why the gradient is missing; what matters is that
# the choice changes the updates, silently. PyTorch's default is `None`.

# %% [markdown]
# ## Broken orders, measured
#
# The next cell trains the same small network (2 → 16 → 1, SGD with momentum) for
# `DEMO_STEPS` steps with four versions of the loop, on the same data from the same start:
#
# * **correct**: zero_grad, forward, loss, backward, step;
# * **zero_grad last**: forward, loss, backward, step, zero_grad. Also correct: what matters is
#   that `.grad` is clear before the next `backward()`;
# * **no zero_grad**: the gradient the optimizer sees is the running sum of all gradients so far;
# * **step before backward**: zero_grad, forward, loss, step, backward. `step()` finds `.grad`
#   cleared and does nothing; the fresh gradient is cleared at the next `zero_grad()`. The model
#   never moves. A missing `step()`, or a `zero_grad()` between `backward()` and `step()`, gives
#   the same flat line.
#
# The left plot shows the loss, the right the norm of the gradient the optimizer used.


# %%
def make_regression(seed, n=64):
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.rand(n, 2, generator=gen) * 4 - 2
    targets = torch.sin(inputs[:, :1]) + 0.5 * inputs[:, 1:]
    return inputs.to(device), targets.to(device)


def run_loop(order, steps=DEMO_STEPS):
    torch.manual_seed(SEED)
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    net = net.to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
    mse = torch.nn.MSELoss()
    losses, norms = [], []
    for i in range(steps):
        inputs, targets = make_regression(SEED + i % 8)
        if order in ("correct", "step before backward"):
            opt.zero_grad()
        loss = mse(net(inputs), targets)
        if order == "step before backward":
            opt.step()
        loss.backward()
        norms.append(torch.stack([p.grad.norm() for p in net.parameters()]).norm().item())
        if order != "step before backward":
            opt.step()
        if order == "zero_grad last":
            opt.zero_grad()
        losses.append(loss.item())
    return losses, norms


orders = {
    "correct": PALETTE["blue"],
    "zero_grad last": PALETTE["sky"],
    "no zero_grad": PALETTE["vermillion"],
    "step before backward": PALETTE["orange"],
}
results = {order: run_loop(order) for order in orders}

fig, (ax_loss, ax_norm) = plt.subplots(1, 2, figsize=(11, 3.8))
for order, colour in orders.items():
    losses, norms = results[order]
    style = "--" if order == "zero_grad last" else "-"
    ax_loss.plot(losses, style, color=colour, label=order)
    ax_norm.plot(norms, style, color=colour, label=order)
first = results["no zero_grad"][1][0]
steps = range(1, DEMO_STEPS + 1)
ax_norm.plot(range(DEMO_STEPS), [k * first for k in steps], ":", color=PALETTE["black"],
             label="k × the first gradient (a linear sum)")  # fmt: skip
ax_loss.set(xlabel="step", ylabel="training loss (MSE)", yscale="log", title="Loss per step")
ax_norm.set(xlabel="step", ylabel="norm of .grad after backward", yscale="log",
            title="Gradient in .grad")  # fmt: skip
ax_norm.legend(fontsize=8)
ax_loss.legend(fontsize=8)
fig.tight_layout()
plt.show()
for order in orders:
    print(f"{order:38} loss after {DEMO_STEPS} steps: {results[order][0][-1]:.4f}")

# %% [markdown]
# *Alt text: two line charts over 40 steps. Left: the correct loop's loss falls steadily and
# "zero_grad last" lies exactly on top of it; "step before backward" hovers at the starting
# loss; "no zero_grad" swings and ends far above the correct loop. Right, on a log scale: the
# norm of `.grad` under "no zero_grad" first follows the dotted line of a plain running sum,
# then climbs past it once the weights themselves go astray; the others stay small.*
#
# Check the printed losses: "correct" and "zero_grad last" agree to the last digit. Read the
# right-hand plot with care: without `zero_grad`, `.grad` is the **sum** of every gradient so
# far. While those gradients point roughly the same way the sum grows about linearly with the
# number of steps (the dotted line); that alone is not an exponential. The explosion comes
# after, when the oversized steps push the weights where the gradients themselves are huge.
# No error is raised at any point.

# ## `nn.CrossEntropyLoss` wants logits
#
# `nn.CrossEntropyLoss` applies `log_softmax` itself. If the model already ends in `softmax`,
# the loss squashes probabilities a second time. Nothing raises an error. Two things change.
#
# * **The gradient shrinks.** With logits $z$, the gradient of the loss with respect to $z$ is
#   $\text{softmax}(z) - \text{one-hot}(y)$. With probabilities $p = \text{softmax}(z)$ in
#   front, that vector is multiplied by the derivative of the model's own softmax, the matrix
#   $\text{diag}(p) - p\,p^\top$. At the start of training the $K$ outputs are nearly equal, so
#   $p \approx 1/K$ everywhere and this matrix scales the gradient by about $1/K$: about 3 times
#   smaller with 3 classes, 10 times with 10.
# * **The loss has a floor.** Every input to `log_softmax` lies in $[0, 1]$, so the right class
#   can never get a probability near 1, and the loss can never get near zero.
#
# **By hand: where $\text{softmax}(z) - \text{one-hot}(y)$ comes from.** For one example with
# logits $z$ and class $y$, $L = -\log p_y = -z_y + \log \sum_j e^{z_j}$. The derivative of the
# second term with respect to $z_k$ is $e^{z_k} / \sum_j e^{z_j} = p_k$, and the first term adds
# $-1$ at $k = y$ only: $\partial L / \partial z_k = p_k - [k = y]$. With $z = [2, 1, 0]$ and
# $y = 0$, $p = [0.665, 0.245, 0.090]$ and the gradient is $[-0.335, 0.245, 0.090]$. With
# `reduction="mean"` over a batch of $B$, each row is divided by $B$. The cell below checks this
# against autograd.

# %%
logits = torch.tensor([[2.0, 1.0, 0.0], [0.5, -1.0, 3.0]], requires_grad=True)
classes = torch.tensor([0, 2])
torch.nn.functional.cross_entropy(logits, classes).backward()  # the mean over 2 examples
one_hot = torch.nn.functional.one_hot(classes, num_classes=3)
by_hand = (logits.detach().softmax(dim=1) - one_hot) / len(classes)
assert torch.allclose(logits.grad, by_hand)
print("p - one-hot for z = [2, 1, 0], y = 0:",
      [round(v, 3) for v in (len(classes) * logits.grad[0]).tolist()])  # fmt: skip

# %% [markdown]
#
# The next cell trains the same network both ways on points around $K$ centres, for an easy
# problem ($K = 3$) and a harder one ($K = 10$), and prints the gradient at step 1, the
# accuracy after 150 steps and the floor.


# %%
def train_classifier(softmax_first, n_classes, steps=150):
    gen = torch.Generator().manual_seed(SEED)
    angles = torch.arange(n_classes) * 2 * torch.pi / n_classes
    centres = 2 * torch.stack([angles.cos(), angles.sin()], dim=1)  # on a circle of radius 2
    labels = torch.randint(0, n_classes, (300,), generator=gen)
    inputs = centres[labels] + 0.6 * torch.randn(300, 2, generator=gen)
    inputs, labels = inputs.to(device), labels.to(device)
    torch.manual_seed(SEED)
    net = torch.nn.Sequential(
        torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, n_classes)
    ).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    cross_entropy = torch.nn.CrossEntropyLoss()
    losses, first_grad_norm = [], None
    for _ in range(steps):
        opt.zero_grad()
        out = net(inputs)
        loss = cross_entropy(out.softmax(dim=1) if softmax_first else out, labels)
        loss.backward()
        if first_grad_norm is None:
            first_grad_norm = torch.stack([p.grad.norm() for p in net.parameters()]).norm().item()
        opt.step()
        losses.append(loss.item())
    accuracy = (net(inputs).argmax(dim=1) == labels).float().mean().item()
    return losses, first_grad_norm, accuracy


runs = {(k, first): train_classifier(first, k) for k in (3, 10) for first in (False, True)}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
for ax, k in zip(axes, (3, 10)):
    ax.plot(runs[k, False][0], color=PALETTE["blue"], label="logits → CrossEntropyLoss (correct)")
    ax.plot(runs[k, True][0], color=PALETTE["vermillion"], label="softmax → CrossEntropyLoss (bug)")
    ax.set(xlabel="step", ylabel="cross-entropy loss", title=f"{k} classes, same model and lr")
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
for k in (3, 10):
    _, grad_logits, acc_logits = runs[k, False]
    softmax_losses, grad_softmax, acc_softmax = runs[k, True]
    floor = torch.log(torch.e + torch.tensor(k - 1.0)).item() - 1  # -log(e / (e + K - 1))
    print(f"{k:2} classes: gradient norm at step 1 {grad_logits:.4f} (logits) vs "
          f"{grad_softmax:.4f} (softmax first), {grad_logits / grad_softmax:.1f}× smaller; "
          f"accuracy after 150 steps {acc_logits:.1%} vs {acc_softmax:.1%}; "
          f"lowest loss reachable with softmax first {floor:.3f}")  # fmt: skip
    assert k / 2 < grad_logits / grad_softmax < 2 * k and min(softmax_losses) > floor
    if k == 3:  # the bug hides: the same ranking of an easy problem, to within a point
        assert abs(acc_logits - acc_softmax) <= 0.01
    else:  # the bug shows: far behind after the same number of steps
        assert acc_softmax < acc_logits - 0.15

# %% [markdown]
# *Alt text: two panels of loss against step. With 3 classes the correct run's loss falls
# towards zero, and the softmax-first run's loss falls more slowly and levels off well above
# it. With 10 classes the correct run's loss falls steadily, and the softmax-first run's
# barely moves.*
#
# Read the printed lines. The gradient ratios are close to $K$, as the derivation says. On the
# easy problem softmax first ends at the same accuracy (the cell checks: to within a point):
# ranking 3 well-separated classes does not need large gradients, so accuracy hides the bug,
# and only the loss and the gradient show it. With 10 classes the gradient is about 10 times
# smaller at the same learning rate, and after the same 150 steps softmax first is far behind.
# The floors are why the loss curves level off: when the probabilities going in are perfect (1
# for the right class, 0 for the others), `log_softmax` of them still gives the right class only
# $e/(e + K - 1)$, about 0.58 with 3 classes, so the loss stays above 0.55. The model is pushed
# towards a target it can never reach.

# %% [markdown]
# ## Exercise 2 · `ch04_train_step`: the five lines
#
# Write `train_step(model, optimizer, loss_fn, x, y)` that performs **one** optimizer update on
# the batch `(x, y)` and returns the loss as a **Python float**. It must work for any model,
# optimizer, loss and device: the check runs it twice in a row, with SGD, momentum and Adam,
# regression and classification, in float32 and float64, on every device this machine has.
# `x` and `y` are already on the model's device. The model has dropout, batch norm and a forward
# hook, and its caller has put it in train mode: call the model itself (`model(x)`, which runs
# its hooks), once, in the mode you were given, and leave everything else as you found it.


# %% nbgrader={"grade_id": "ch04_train_step", "solution": true}
def train_step(model, optimizer, loss_fn, x, y):
    ### BEGIN SOLUTION
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch04_train_step_tests", "grade": true, "points": 3}
# Visible tests: two steps on a small network, with SGD + momentum and a squared error, then
# plain SGD and cross-entropy, compared with the reference.
from forge_course.grading import ch04

ch04.check_train_step(train_step)
print("train_step: both steps match the reference, and it returns a float.")
### BEGIN HIDDEN TESTS
ch04.check_train_step(train_step, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## What a kept loss tensor holds
#
# Why return `loss.item()` and not `loss`? A common answer is that a kept loss tensor keeps its
# graph alive, and with it every activation the forward saved. After `backward()` that is not
# so: backward frees the tensors the graph saved, whether or not something still refers to the
# loss. The next cell counts the bytes autograd saved in one forward pass of a small MLP, and
# the bytes still held afterwards, with the course's `LiveGraphMemory` (it sees every saved
# tensor through `torch.autograd.graph.saved_tensors_hooks`, on any device).

# %%
from forge_course.sims.train_vs_eval import LiveGraphMemory

torch.manual_seed(SEED)
net = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
net = net.to(device)
inputs = torch.randn(256, 512, device=device)
labels = torch.randint(0, 10, (256,), device=device)
memory = LiveGraphMemory()
with memory:
    kept_loss = torch.nn.functional.cross_entropy(net(inputs), labels)
held_before = memory.live_bytes()
kept_loss.backward()
held_after = memory.live_bytes()
with memory:  # three losses that no backward runs through, as in an evaluation without no_grad
    unbackwarded = [torch.nn.functional.cross_entropy(net(inputs), labels) for _ in range(3)]
held_unbackwarded = memory.live_bytes()
for moment, held in (
    ("one loss, before its backward", held_before),
    ("the same loss, still kept, after its backward", held_after),
    ("3 kept losses that no backward ran through", held_unbackwarded),
):
    print(f"saved tensors held: {moment:46} {held / 2**10:6,.0f} KiB")
assert held_before > 0 and held_after == 0 and held_unbackwarded > held_before
del kept_loss, unbackwarded

# %% [markdown]
# So memory after `backward()` is not the reason. The reason is what the caller needs: a plain
# number to log, compare, average and write to a file, which holds nothing on the device and
# carries no autograd history (summing kept loss tensors would build yet another graph). A kept
# tensor does hold a whole graph's activations in one case, the last line above: a loss that
# no backward ran through, such as an evaluation loss computed without `torch.no_grad()`
# (chapter 06). One cost comes with `.item()`: on a GPU it makes the CPU wait until the device
# has finished the step.
#
# ## What one step costs, measured
#
# A common rule of thumb says the backward pass costs about twice the forward: for every
# matrix product in the forward, backward computes two (the gradient with respect to the
# input and the one with respect to the weight). The next cell times forward, backward and
# `step()` on your device for a 4-layer MLP and a batch of 256. Treat the ratio it prints as a
# measurement of *this* model on *this* device, not a law.


# %%
def timed(fn, sync):
    samples = []
    for _ in range(TIMING_REPEATS):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2] * 1e3  # median, in milliseconds


sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
torch.manual_seed(SEED)
layers = [module for _ in range(3) for module in (torch.nn.Linear(512, 512), torch.nn.ReLU())]
mlp = torch.nn.Sequential(*layers, torch.nn.Linear(512, 10)).to(device)
opt = torch.optim.SGD(mlp.parameters(), lr=0.01, momentum=0.9)
batch = torch.randn(256, 512, device=device)
labels = torch.randint(0, 10, (256,), device=device)
cross_entropy = torch.nn.CrossEntropyLoss()
state = {}


def forward():
    state["loss"] = cross_entropy(mlp(batch), labels)


def forward_backward():
    opt.zero_grad()
    forward()
    state["loss"].backward()


forward_backward()  # warm-up: first calls allocate memory and pick kernels
opt.step()
phases = {
    "forward": timed(forward, sync),
    "forward + backward": timed(forward_backward, sync),
    "step": timed(opt.step, sync),
}
backward_ms = phases["forward + backward"] - phases["forward"]
fig, ax = plt.subplots(figsize=(6, 2.6))
names = ["forward", "backward", "optimizer step"]
values = [phases["forward"], backward_ms, phases["step"]]
ax.barh(names, values, color=[PALETTE["blue"], PALETTE["orange"], PALETTE["green"]])
ax.set(xlabel="milliseconds (median)", ylabel="phase of the step",
       title=f"One step of a 4-layer MLP on {device.type}")  # fmt: skip
ax.invert_yaxis()
plt.show()
print(
    f"forward {values[0]:.2f} ms, backward {values[1]:.2f} ms, step {values[2]:.2f} ms: "
    f"backward took {backward_ms / phases['forward']:.1f}× the forward on this device."
)

# %% [markdown]
# *Alt text: three horizontal bars, the time of forward, backward and the optimizer step; the
# printed line gives the measured values.*
#
# ## Where the scheduler goes
#
# A scheduler changes the learning rate between steps, and "step" means whatever you call
# `scheduler.step()` after. `StepLR(step_size=2, gamma=0.5)` halves the learning rate every
# two calls: every two **epochs** if called once per epoch, every two **batches** if called in
# the batch loop. The scheduler must step after `optimizer.step()`; PyTorch warns if it does not,
# because the first learning rate would be skipped.


# %%
def learning_rates(per_batch, epochs=3, batches=4):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    seen = []
    for _ in range(epochs):
        for _ in range(batches):
            seen.append(opt.param_groups[0]["lr"])
            opt.step()
            if per_batch:
                sched.step()
        if not per_batch:
            sched.step()
    return seen


print("lr per batch, scheduler stepped once per epoch:", learning_rates(per_batch=False))
print("lr per batch, scheduler stepped every batch:   ", learning_rates(per_batch=True))

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch04_q_grad_multiple`).** A loop forgets `optimizer.zero_grad()`. It is fed
# the same batch three times with `lr = 0`, so the weights never move. After the third
# `backward()`, `.grad` is how many times the gradient of one `backward()`? Set
# `grad_multiple` to a number.
#
# **Question 2 (`ch04_q_softmax`).** A classifier ends in `nn.Softmax(dim=1)` and is trained
# with `nn.CrossEntropyLoss()`. What happens? Set `softmax_answer` to one letter.
#
# * **a**: PyTorch raises an error, because the inputs are not logits.
# * **b**: training is unaffected; softmax of probabilities changes nothing.
# * **c**: it trains without error, but the loss cannot approach zero and the gradients are
#   smaller, so it learns more slowly (how much more depends on the number of classes).
# * **d**: the loss becomes NaN after a few steps.

# %% nbgrader={"grade_id": "ch04_questions", "solution": true}
grad_multiple = None
softmax_answer = None
### BEGIN SOLUTION
grad_multiple = 3
softmax_answer = "c"
### END SOLUTION

# %% nbgrader={"grade_id": "ch04_q_grad_multiple", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(grad_multiple, "ch04_q_grad_multiple")
### BEGIN HIDDEN TESTS
check_number(
    grad_multiple,
    "ch04_q_grad_multiple",
    expected=3,
    hints={
        1: "backward adds to .grad; it does not replace it.",
        2: "count the first backward too: three calls add three gradients.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch04_q_softmax", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(softmax_answer, "ch04_q_softmax", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    softmax_answer,
    "ch04_q_softmax",
    choices="abcd",
    correct="c",
    why_not={
        "a": "CrossEntropyLoss accepts any real numbers, probabilities included, without error.",
        "b": "log_softmax of values in [0, 1] is not the identity: the loss cannot go to zero.",
        "d": "probabilities are bounded, so nothing overflows: it is slow, not NaN.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# def train_step(model, optimizer, loss_fn, x, y):
#     optimizer.zero_grad()          # without it: .grad is the sum of every past gradient
#     loss = loss_fn(model(x), y)    # model(x), not model.forward(x); logits into CrossEntropyLoss
#     loss.backward()                # without it, or after step(): no gradient, or last step's
#     optimizer.step()               # without it: nothing ever changes
#     return loss.item()             # a plain float to log (backward already freed the saved tensors)
# ```
#
# * One step on paper: forward $y = [-0.1, 1.8]$, loss $2.225$, gradients by the chain rule,
#   update, and the loss falls to $1.96601$.
# * `backward()` adds into `.grad`; `zero_grad()` is what makes each step use only its batch.
# * Softmax before `CrossEntropyLoss` raises nothing; it puts a floor under the loss and makes
#   the first gradients about $K$ times smaller for $K$ classes: invisible in accuracy on an
#   easy 3-class problem, far behind on a 10-class one.
# * `zero_grad()` leaves `None` by default; zeros instead keep SGD with momentum and AdamW moving
#   a parameter that got no gradient.
# * A scheduler steps after the optimizer, once per epoch or once per batch as it was designed.
#
# Next, chapter 05 looks inside `model` itself: which attributes become parameters, and what
# moves when you call `.to(device)`.
