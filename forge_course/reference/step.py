"""One training step, twice: by hand in plain Python, and as the five lines every PyTorch loop has.

The hand version is the arithmetic of chapter 04's running example: a linear layer
``y = W·x + b`` with mean-squared-error loss and plain SGD. Written without torch, every number
it returns can be checked on paper; tests check it against autograd too.

The torch version is the order that makes a step correct:

1. ``optimizer.zero_grad()``: ``.grad`` adds up across ``backward`` calls, so clear it first.
2. ``output = model(x)``: the forward pass records the graph.
3. ``loss = loss_fn(output, y)``: one number to improve.
4. ``loss.backward()``: fills ``.grad`` of every parameter, then frees the graph.
5. ``optimizer.step()``: moves each parameter against its gradient.
"""

from __future__ import annotations

import torch

from forge_course.reference.guard import reference

Matrix = list[list[float]]
Vector = list[float]


def _forward(W: Matrix, b: Vector, x: Vector) -> Vector:
    return [sum(w * xj for w, xj in zip(row, x)) + bi for row, bi in zip(W, b)]


def _mse(y: Vector, t: Vector) -> float:
    return sum((yi - ti) ** 2 for yi, ti in zip(y, t)) / len(y)


@reference
def hand_step(W: Matrix, b: Vector, x: Vector, t: Vector, lr: float) -> dict[str, object]:
    """One SGD step of ``y = W·x + b`` with MSE loss (mean over the outputs), by hand.

    Args:
        W: weights, ``m`` rows of ``n`` floats (the layer maps ``n`` inputs to ``m`` outputs).
        b: bias, ``m`` floats.
        x: one input, ``n`` floats.
        t: its target, ``m`` floats.
        lr: learning rate.

    Returns:
        ``y`` (m), ``loss`` (float), ``dL_dy`` (m), ``dL_dW`` (m×n), ``dL_db`` (m),
        ``W_new`` (m×n) and ``b_new`` (m), all plain Python floats.
    """
    m = len(t)
    y = _forward(W, b, x)
    loss = _mse(y, t)
    # d/dy_i of (1/m)·Σ(y_i − t_i)² is 2(y_i − t_i)/m: the 1/m of the mean stays in.
    dL_dy = [2 * (yi - ti) / m for yi, ti in zip(y, t)]
    # y_i = Σ_j W_ij·x_j + b_i, so dL/dW_ij = dL/dy_i·x_j (an outer product), dL/db_i = dL/dy_i.
    dL_dW = [[gi * xj for xj in x] for gi in dL_dy]
    dL_db = list(dL_dy)
    W_new = [[w - lr * g for w, g in zip(row, grow)] for row, grow in zip(W, dL_dW)]
    b_new = [bi - lr * g for bi, g in zip(b, dL_db)]
    return {
        "y": y,
        "loss": loss,
        "dL_dy": dL_dy,
        "dL_dW": dL_dW,
        "dL_db": dL_db,
        "W_new": W_new,
        "b_new": b_new,
    }


def evaluate_linear(W: Matrix, b: Vector, x: Vector, t: Vector) -> tuple[Vector, float]:
    """The output and MSE loss of ``y = W·x + b``: to check that a step lowered the loss."""
    y = _forward(W, b, x)
    return y, _mse(y, t)


@reference
def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
) -> float:
    """One optimizer update on the batch ``(x, y)``; returns the batch's loss as a Python float.

    Returning ``loss.item()`` rather than ``loss`` gives the caller what it needs: a number to
    log and compare, holding no device memory and no autograd history. (Memory is not the
    reason: ``backward`` has already freed the tensors the graph saved, even if the caller keeps
    the loss tensor. Only a loss that no backward ran through holds its graph's activations.)
    """
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
