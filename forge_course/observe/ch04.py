"""Chapter 04's learner half: build each case's inputs, call the answer, report plain data."""

from __future__ import annotations

import copy

import torch

from forge_course.observe.common import call_answer


def _as_floats(value):
    """Nested lists of floats from lists, tuples, NumPy arrays, NumPy scalars or CPU tensors."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_as_floats(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def observe_hand_step(fn, case: dict) -> dict:
    """Call ``fn`` on a fresh copy of the case, with autograd off, and normalise the numbers."""
    args = copy.deepcopy(case)
    # Autograd is switched off: the exercise is to find the gradients by hand.
    with torch.no_grad():
        out = call_answer(
            "ch04_hand_step", "hand_step", fn, args["W"], args["b"], args["x"], args["t"],
            args["lr"],
        )  # fmt: skip
    if not isinstance(out, dict):
        return {"returned": out}
    return {key: _as_floats(value) for key, value in out.items()}


def _build(case: dict):
    """A fresh seeded model, optimizer, loss and two batches for a train_step case."""
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    gen = torch.Generator().manual_seed(case["seed"])
    torch.manual_seed(case["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = model.to(device=device, dtype=dtype)
    params = model.parameters()
    optimizer = {
        "sgd": lambda: torch.optim.SGD(params, lr=0.1),
        "momentum": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        "adam": lambda: torch.optim.Adam(params, lr=0.05),
    }[case["optimizer"]]()
    batches = []
    for size in (5, 3):
        x = torch.randn(size, 4, generator=gen, dtype=dtype)
        if case["loss"] == "mse":
            y = torch.randn(size, 3, generator=gen, dtype=dtype)
        else:
            y = torch.randint(0, 3, (size,), generator=gen)
        batches.append((x.to(device), y.to(device)))
    loss_fn = torch.nn.MSELoss() if case["loss"] == "mse" else torch.nn.CrossEntropyLoss()
    return model, optimizer, loss_fn, batches


def _plain(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def label_train_step(case: dict) -> str:
    return f"{case['device']}, {case['dtype']}, {case['optimizer']}, {case['loss']} loss"


def observe_train_step(fn, case: dict) -> dict:
    """Two calls on two batches; what each returned and every parameter after each."""
    model, optimizer, loss_fn, batches = _build(case)
    seen = {}
    for call, (x, y) in enumerate(batches, start=1):
        returned = call_answer(
            "ch04_train_step", "train_step", fn, model, optimizer, loss_fn, x, y,
            case=label_train_step(case),
        )  # fmt: skip
        seen[f"the value returned by call {call}"] = _plain(returned)
        seen[f"the parameters after call {call}"] = {
            name: p.detach().clone() for name, p in model.named_parameters()
        }
    return seen
