"""Checks for chapter 04, "Anatomy of one training step".

Exercises:
    ch04_hand_step: one SGD step of ``y = W·x + b`` with MSE, by hand (no autograd).
    ch04_train_step: ``train_step(model, optimizer, loss_fn, x, y) -> float``.
Questions:
    ch04_q_grad_multiple, ch04_q_softmax.
"""

from __future__ import annotations

import random

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, grading_seed
from forge_course.observe.ch04 import label_train_step, observe_hand_step, observe_train_step
from forge_course.reference import step as ref

# ---------------------------------------------------------------- ch04_hand_step

# The running example of the chapter (FACTS.md): its results are worked out in the markdown.
RUNNING_EXAMPLE = {
    "W": [[0.5, -0.3], [0.2, 0.8]],
    "b": [0.0, 0.0],
    "x": [1.0, 2.0],
    "t": [1.0, 0.0],
    "lr": 0.01,
}


def _random_linear_case(rng: random.Random, m: int, n: int) -> dict:
    value = lambda: round(rng.uniform(-2, 2), 3)
    return {
        "W": [[value() for _ in range(n)] for _ in range(m)],
        "b": [value() for _ in range(m)],
        "x": [value() for _ in range(n)],
        "t": [value() for _ in range(m)],
        "lr": rng.choice([0.01, 0.1, 0.5]),
    }


def hand_step_cases(thorough: bool = False) -> list[dict]:
    """The running example and a 3-output layer; thorough adds random shapes, including m = 1."""
    rng = random.Random(grading_seed() if thorough else 4)
    cases = [RUNNING_EXAMPLE, _random_linear_case(rng, 3, 2)]
    if thorough:
        cases += [_random_linear_case(rng, m, n) for m, n in [(1, 1), (1, 3), (3, 4), (4, 2)]]
    return cases


def _wrong_hand_step(*, mean=True, two=True, sign=1.0, transpose=False, loss_sum=False):
    def wrong(W, b, x, t, lr):
        m = len(t)
        y, loss = ref.evaluate_linear(W, b, x, t)
        if loss_sum:
            loss *= m
        dy = [(2 if two else 1) * (yi - ti) / (m if mean else 1) for yi, ti in zip(y, t)]
        dW = (
            [[gi * xj for gi in dy] for xj in x]
            if transpose
            else [[gi * xj for xj in x] for gi in dy]
        )
        W_new = (
            [[w - sign * lr * g for w, g in zip(r, gr)] for r, gr in zip(W, dW)]
            if not transpose
            else W
        )
        b_new = [bi - sign * lr * g for bi, g in zip(b, dy)]
        return {
            "y": y,
            "loss": loss,
            "dL_dy": dy,
            "dL_dW": dW,
            "dL_db": dy,
            "W_new": W_new,
            "b_new": b_new,
        }

    return wrong


HAND_STEP_MISTAKES = [
    (
        "the loss is the *mean* over the m outputs, so dL/dy = 2(y − t)/m. "
        "Without the 1/m every gradient is m times too big.",
        _wrong_hand_step(mean=False),
    ),
    (
        "the derivative of (y − t)² is 2(y − t): the factor 2 is missing.",
        _wrong_hand_step(two=False),
    ),
    (
        "dL/dy = (y − t) holds only when the two slips cancel (m = 2): the loss is the mean of "
        "squares, so dL/dy = 2(y − t)/m.",
        _wrong_hand_step(mean=False, two=False),
    ),
    (
        "SGD moves *against* the gradient: W_new = W − lr·dL/dW, not W + lr·dL/dW.",
        _wrong_hand_step(sign=-1.0),
    ),
    (
        "dL/dW has the shape of W (outputs × inputs): row i is dL/dy_i times x, "
        "the outer product dL/dy ⊗ x, not x ⊗ dL/dy.",
        _wrong_hand_step(transpose=True),
    ),
    ("the loss is the mean of the squared errors, not their sum.", _wrong_hand_step(loss_sum=True)),
]


HAND_STEP = Exercise(
    grade_id="ch04_hand_step",
    function="hand_step",
    reference=ref.hand_step.__wrapped__,
    cases=hand_step_cases,
    observe=observe_hand_step,
    label=lambda case: f"W is {len(case['W'])}×{len(case['x'])}, lr={case['lr']}",
    mistakes=HAND_STEP_MISTAKES,
    hint="work one number through by hand (y = [-0.1, 1.8], L = 2.225 in the running example) "
    "and compare each key in turn.",
)
check_hand_step = HAND_STEP.check


# ---------------------------------------------------------------- ch04_train_step


def train_step_cases(thorough: bool = False) -> list[dict]:
    """CPU, float32: momentum with MSE, and SGD with cross-entropy (a loss whose arguments
    cannot be swapped unseen); thorough adds every device, float64 and Adam."""
    if not thorough:
        cpu = {"device": "cpu", "dtype": "float32"}
        return [
            {**cpu, "optimizer": "momentum", "loss": "mse", "seed": 0},
            {**cpu, "optimizer": "sgd", "loss": "ce", "seed": 1},
        ]
    seed = grading_seed()
    cases = []
    for i, device in enumerate(available_devices()):
        for j, (dtype, opt, loss) in enumerate(
            [("float32", "sgd", "ce"), ("float64", "adam", "mse"), ("float32", "momentum", "ce")]
        ):
            if dtype == "float64" and device.type == "mps":
                continue  # MPS has no float64.
            cases.append(
                {
                    "device": str(device),
                    "dtype": dtype,
                    "optimizer": opt,
                    "loss": loss,
                    "seed": seed + 10 * i + j,
                }
            )
    return cases


def _no_zero_grad(model, optimizer, loss_fn, x, y):
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def _step_before_backward(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    optimizer.step()
    loss.backward()
    return loss.item()


def _returns_tensor(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def _forward_skips_hooks(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = loss_fn(model.forward(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def _eval_mode_step(model, optimizer, loss_fn, x, y):
    model.eval()
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    model.train()
    return loss.item()


def _forward_twice(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    logged = loss_fn(model(x), y).item()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return logged


TRAIN_STEP_MISTAKES = [
    (
        "`optimizer.zero_grad()` is missing: `.grad` still holds the first batch's gradient, so "
        "the second update uses the sum of both. Clear the gradients at the start of every step.",
        _no_zero_grad,
    ),
    (
        "the parameters never move. `optimizer.step()` must run after `loss.backward()` and "
        "before the next `zero_grad()`: check that `step()` is there, that it comes after "
        "`backward()`, and that no `zero_grad()` sits between the two.",
        _step_before_backward,
    ),
    (
        "the function returns the loss *tensor*. Return `loss.item()`, a plain number: that is "
        "what a caller logs and adds up, and a kept tensor holds its graph's nodes (backward "
        "has freed what they saved, but not the nodes).",
        _returns_tensor,
    ),
    (
        "`model.forward(x)` skips the model's hooks (this model has a forward hook that changes "
        "its output). Call the model itself, `model(x)`: `__call__` runs the hooks around "
        "`forward`.",
        _forward_skips_hooks,
    ),
    (
        "the forward ran in eval mode (dropout off, batch norm on its running statistics). A "
        "training step runs the model in the mode its caller set: no `model.eval()` in it.",
        _eval_mode_step,
    ),
    (
        "the model ran forward twice in one step (once for the number returned, once for "
        "backward): the second forward drew new dropout masks and moved batch norm's running "
        "statistics again. One forward per step; return that loss's `.item()`.",
        _forward_twice,
    ),
]


def _train_step_raised(message: str, case: dict) -> str:
    # Class indices (int64) reached a kernel that needs floats: in a step, only the targets are
    # integers, so they went where the loss expects the model's output.
    if "not implemented for 'Long'" not in message:
        return ""
    return (
        "the loss got the targets where it expects the model's output. A loss takes the "
        "output first and the targets second: `loss_fn(model(x), y)`. (A mean squared error "
        "gives the same value either way round, so only some losses show it.)"
    )


TRAIN_STEP = Exercise(
    grade_id="ch04_train_step",
    function="train_step",
    reference=ref.train_step.__wrapped__,
    cases=train_step_cases,
    observe=observe_train_step,
    label=label_train_step,
    mistakes=TRAIN_STEP_MISTAKES,
    raised_hint=_train_step_raised,
    hint="the order is zero_grad → forward → loss → backward → step, then return loss.item().",
)
check_train_step = TRAIN_STEP.check

EXERCISES = [HAND_STEP, TRAIN_STEP]
