"""Chapter 04's checks: correct answers in any style pass; each typical mistake is named."""

import numpy as np
import pytest
import torch

from forge_course.grading import Mistake, ch04
from forge_course.reference import step
from tests.helpers.copied import copied


def numpy_hand_step(W, b, x, t, lr):
    W, b, x, t = (np.asarray(a, dtype=float) for a in (W, b, x, t))
    y = W @ x + b
    g = 2 * (y - t) / len(t)
    return {"y": y, "loss": float(np.mean((y - t) ** 2)), "dL_dy": g, "dL_dW": np.outer(g, x),
            "dL_db": g, "W_new": W - lr * np.outer(g, x), "b_new": b - lr * g}  # fmt: skip


def loop_hand_step(W, b, x, t, lr):
    m, n = len(W), len(x)
    out = {"y": [], "dL_dy": [], "dL_dW": [], "W_new": [], "b_new": []}
    loss = 0.0
    for i in range(m):
        yi = b[i]
        for j in range(n):
            yi += W[i][j] * x[j]
        out["y"].append(yi)
        loss += (yi - t[i]) ** 2 / m
        gi = 2 * (yi - t[i]) / m
        out["dL_dy"].append(gi)
        out["dL_dW"].append([gi * x[j] for j in range(n)])
        out["W_new"].append([W[i][j] - lr * gi * x[j] for j in range(n)])
        out["b_new"].append(b[i] - lr * gi)
    return {**out, "loss": loss, "dL_db": out["dL_dy"]}


def autograd_hand_step(W, b, x, t, lr):
    W = torch.tensor(W, requires_grad=True)
    loss = ((W @ torch.tensor(x) + torch.tensor(b) - torch.tensor(t)) ** 2).mean()
    loss.backward()
    return {"y": [], "loss": loss.item()}


@pytest.mark.parametrize("answer", [numpy_hand_step, loop_hand_step])
def test_hand_step_accepts_correct_answers_in_any_style(answer):
    ch04.check_hand_step(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch04.HAND_STEP_MISTAKES, ids=range(6))
def test_hand_step_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch04.check_hand_step(wrong)
    assert message in str(caught.value)


def test_hand_step_must_not_use_autograd():
    with pytest.raises(Mistake, match="does not require grad"):
        ch04.check_hand_step(autograd_hand_step)


def test_hand_step_reports_a_missing_key():
    with pytest.raises(Mistake, match="missing the key.*'dL_db'"):
        ch04.check_hand_step(lambda *a: {k: v for k, v in copied(step.hand_step)(*a).items()
                                         if k != "dL_db"})  # fmt: skip


def zero_grad_last(model, optimizer, loss_fn, x, y):
    loss = loss_fn(model.forward(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return float(loss)


def detached_return(model, optimizer, loss_fn, x, y):
    model.zero_grad()
    out = model(x)
    loss = loss_fn(out, y)
    loss.backward()
    optimizer.step()
    return loss.detach().cpu().item()


@pytest.mark.parametrize("answer", [copied(step.train_step), zero_grad_last, detached_return])
def test_train_step_accepts_correct_answers_in_any_style(answer):
    ch04.check_train_step(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch04.TRAIN_STEP_MISTAKES, ids=range(3))
def test_train_step_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch04.check_train_step(wrong)
    assert message in str(caught.value)


def no_step(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss.item()


def zero_grad_between(model, optimizer, loss_fn, x, y):
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    return loss.item()


@pytest.mark.parametrize("wrong", [no_step, zero_grad_between])
def test_orders_that_never_move_are_named(wrong):
    with pytest.raises(Mistake, match="the parameters never move"):
        ch04.check_train_step(wrong)


def test_train_step_under_no_grad_fails_with_the_error():
    def no_grad_step(model, optimizer, loss_fn, x, y):
        optimizer.zero_grad()
        with torch.no_grad():
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    with pytest.raises(Mistake, match="does not require grad"):
        ch04.check_train_step(no_grad_step)


def test_calling_the_reference_does_not_score():
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch04.check_train_step(lambda *args: step.train_step(*args))
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch04.check_hand_step(step.hand_step)


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    monkeypatch.setenv("FORGE_GRADING_SEED", "1")
    first = ch04.hand_step_cases(thorough=True)
    monkeypatch.setenv("FORGE_GRADING_SEED", "2")
    assert ch04.hand_step_cases(thorough=True) != first
    assert ch04.hand_step_cases(thorough=False) == ch04.hand_step_cases(thorough=False)


def _correct_step_then(leave):
    """The reference step (undoing what ``leave`` did last time first), then ``leave(model)``."""

    def answer(model, optimizer, loss_fn, x, y):
        torch.set_grad_enabled(True)
        model.train()
        model.requires_grad_(True)
        loss = copied(step.train_step)(model, optimizer, loss_fn, x, y)
        leave(model)
        return loss

    return answer


# Each step returns the right loss and leaves the right parameters, and something else wrong.
LEFT_BEHIND = {
    "grad mode: on → off": lambda model: torch.set_grad_enabled(False),
    "model[0]'s mode: train → eval": lambda model: model.eval(),
    "model[2].weight.requires_grad: True → False": lambda model: model.requires_grad_(False),
    "default dtype: torch.float32 → torch.float64": lambda model: torch.set_default_dtype(
        torch.float64
    ),
    "autocast: [] → ['cpu']": lambda model: torch.autocast("cpu").__enter__(),
    "torch's global generator: advanced": lambda model: torch.rand(1),
    "hooks on model[1]: 0 → 1": lambda model: model[1].register_forward_hook(lambda *a: None),
}


@pytest.mark.parametrize("named", list(LEFT_BEHIND))
def test_a_step_that_leaves_something_changed_is_wrong_and_says_what(named):
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    try:
        with pytest.raises(Mistake, match="changed behind it") as caught:
            ch04.check_train_step(_correct_step_then(LEFT_BEHIND[named]))
    finally:  # what the answer left must not reach the next test
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        if torch.is_autocast_enabled("cpu"):
            torch.set_autocast_enabled("cpu", False)
            while torch.autocast_decrement_nesting() > 0:
                pass
    assert named in str(caught.value)
