"""Chapter 07's learner half: build each case's model or log, call the answer, report plain data."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from forge_course.observe.common import call_answer

# ---------------------------------------------------------------- ch07_grad_norm

GRAD_NORM = "ch07_grad_norm"


class _TwoBranch(nn.Module):
    """A model with a layer the forward never uses: its parameters require grad, get none."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 3)
        self.spare = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


class _Twins(nn.Module):
    """Two branches built alike and summed: two distinct parameters with equal gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(4, 3)
        self.right = nn.Linear(4, 3)
        self.right.load_state_dict(self.left.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(x)


def _tied() -> nn.Module:
    """An encoder and a decoder that share one weight, as tied embeddings do: one parameter
    held by two layers (``model.parameters()`` yields it once)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4, bias=False))
    model[2].weight = model[0].weight
    return model


#: Each kind of model a grad_norm case builds, in a few words for messages.
GRAD_MODELS = {
    "mlp": "an MLP after one backward",
    "frozen": "an MLP whose first layer is frozen",
    "unused": "a model with a layer the forward never uses",
    "no_backward": "a model before any backward",
    "accumulated": "an MLP after two backward calls",
    "zeroed": "an MLP whose first layer's .grad was zeroed in place",
    "tied": "a model whose two layers share one weight",
    "twins": "a model with two parameters whose gradients are equal",
}


def label_grad_norm(case: dict) -> str:
    return f"{GRAD_MODELS[case['model']]}, {case['device']}, {case['dtype']}"


def _grad_model(case: dict) -> nn.Module:
    """A fresh seeded model in the state the case names, its gradients filled by backward."""
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    torch.manual_seed(case["seed"])
    kind = case["model"]
    if kind == "unused":
        model = _TwoBranch()
    elif kind == "tied":
        model = _tied()
    elif kind == "twins":
        model = _Twins()
    else:
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    model = model.to(device=device, dtype=dtype)
    if kind == "frozen":
        model[0].requires_grad_(False)
    gen = torch.Generator().manual_seed(case["seed"])
    for _ in range({"no_backward": 0, "accumulated": 2}.get(kind, 1)):
        x = torch.randn(6, 4, generator=gen, dtype=dtype).to(device)
        y = torch.randint(0, 3 if kind != "tied" else 4, (6,), generator=gen).to(device)
        # Scaled so that the norm is above 1: an answer that clips to 1.0 shows it.
        (5 * nn.functional.cross_entropy(model(x), y)).backward()
    if kind == "zeroed":
        model[0].zero_grad(set_to_none=False)
    return model


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, float):  # a NumPy float64 is a float: accept it as one
        return float(value)
    return value


def observe_grad_norm(fn: Callable, case: dict) -> dict:
    """What ``fn(model)`` returns, and every gradient after the call (a measurement must leave
    them as they were)."""
    model = _grad_model(case)
    returned = call_answer(GRAD_NORM, "grad_norm", fn, model, case=label_grad_norm(case))
    return {
        "the value returned": _plain(returned),
        "the gradients after the call": {
            name: None if p.grad is None else p.grad.detach().clone()
            for name, p in model.named_parameters()
        },
    }


# ---------------------------------------------------------------- ch07_leak_check

LEAK_CHECK = "ch07_leak_check"

#: Each object a leak_check case builds, in a few words for messages.
LEAK_CASES = {
    "list_of_losses": "three losses in a list",
    "mixed_log": "a log mixing floats, a detached loss, a loss, a string and None",
    "nested": "losses in nested dicts and lists",
    "leaves": "a parameter, its gradient and an output, in a tuple",
    "no_graph": "tensors made under no_grad, an argmax and a fresh leaf",
    "running_total": "a single tensor, total = total + loss",
    "deep": "losses nested four lists deep",
    "empty": "empty lists and tuples in a dict",
    "number": "a plain float",
    "text": "a plain string",
    "nothing": "None",
    "stored_twice": "two losses, one of them stored in three places",
    "tensor_keys": "a dict with a loss as one of its keys",
    "sets": "losses in a set and a frozenset, and one in a tuple",
}


def label_leak_check(case: dict) -> str:
    return f"{LEAK_CASES[case['name']]}, {case['device']}, {case['dtype']}"


def _leak_object(case: dict):
    """The object a case names, built fresh from a small seeded linear model."""
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    torch.manual_seed(case["seed"])
    model = nn.Linear(3, 2).to(device=device, dtype=dtype)
    x = torch.randn(4, 3, dtype=dtype, device=device)

    def loss() -> torch.Tensor:
        return model(x).pow(2).mean()

    name = case["name"]
    if name == "list_of_losses":
        return [loss(), loss(), loss()]
    if name == "mixed_log":
        return [loss().item(), loss().detach(), loss(), "epoch 1", None]
    if name == "nested":
        return {
            "last": loss(),
            "train": [loss(), loss().detach(), 0.5],
            "val": {"loss": loss(), "accuracy": 0.75},
            "notes": "run 3",
        }
    if name == "leaves":
        loss().backward()
        return (model.weight, model.weight.grad, model(x))
    if name == "no_graph":
        with torch.no_grad():
            scores = model(x)
        return [scores, model(x).argmax(dim=1), torch.zeros(2, requires_grad=True)]
    if name == "running_total":
        total = 0.0
        for _ in range(3):
            total = total + loss()
        return total
    if name == "deep":
        return [[[[loss()]]], ([loss()], "done")]
    if name == "empty":
        return {"losses": [], "steps": (), "best": None}
    if name == "text":
        return "epoch 3: loss 0.25"
    if name == "nothing":
        return None
    if name == "stored_twice":
        first, last = loss(), loss()
        return {"history": [first, last], "last": last, "best": {"loss": last}}
    if name == "tensor_keys":
        return {loss(): "the first loss", "train": loss(), "val": loss()}
    if name == "sets":
        return {"seen": {loss(), loss()}, "frozen": frozenset([loss()]), "kept": (loss(),)}
    if name == "number":
        return 0.25
    raise ValueError(f"no leak_check case is called {name!r}")


def observe_leak_check(fn: Callable, case: dict) -> dict:
    """What ``fn(obj)`` returns for the case's object."""
    returned = call_answer(
        LEAK_CHECK, "graph_leaks", fn, _leak_object(case), case=label_leak_check(case)
    )
    return {"the count returned": _plain(returned)}
