"""Checks for chapter 07, "Bug museum: silent training failures".

Exercises:
    ch07_grad_norm: ``grad_norm(model) -> float``, the global L2 norm of the gradients.
    ch07_leak_check: ``graph_leaks(obj) -> int``, graph-attached tensors kept in a container.
    ch07_mystery_loops: label each mystery loop with the code of its bug (`check_labels`).
Questions:
    ch07_q_grad_growth, ch07_q_frozen, ch07_q_kept_memory (answers live in the hidden tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, Mistake, call_answer, explain, grading_seed
from forge_course.reference import detectors as ref

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


#: What each kind of model is, for the case label, and what to try when an answer crashes on it.
GRAD_MODELS = {
    "mlp": ("an MLP after one backward", ""),
    "frozen": (
        "an MLP whose first layer is frozen",
        "a frozen parameter (`requires_grad=False`) has `.grad = None`: skip parameters whose "
        "`.grad` is None.",
    ),
    "unused": (
        "a model with a layer the forward never uses",
        "a parameter the forward did not use has `.grad = None` even though it requires grad: "
        "test `p.grad is not None`, not `p.requires_grad`.",
    ),
    "no_backward": (
        "a model before any backward",
        "before the first backward no parameter has a gradient: the norm is then 0.0.",
    ),
    "accumulated": ("an MLP after two backward calls", ""),
    "zeroed": ("an MLP whose first layer's .grad was zeroed in place", ""),
}


def grad_norm_cases(thorough: bool = False) -> list[dict]:
    """An MLP and a half-frozen MLP on the CPU; thorough: every kind, every device, float64."""
    if not thorough:
        return [
            {"model": "mlp", "device": "cpu", "dtype": "float32", "seed": 0},
            {"model": "frozen", "device": "cpu", "dtype": "float32", "seed": 1},
        ]
    seed = grading_seed()
    cases = []
    for i, device in enumerate(available_devices()):
        for j, kind in enumerate(GRAD_MODELS):
            cases.append(
                {
                    "model": kind,
                    "device": str(device),
                    "dtype": "float32",
                    "seed": seed + 10 * i + j,
                }
            )
        if device.type != "mps":  # MPS has no float64
            for kind in ("mlp", "frozen"):
                cases.append(
                    {
                        "model": kind,
                        "device": str(device),
                        "dtype": "float64",
                        "seed": seed + 10 * i + 7,
                    }
                )
    return cases


def _grad_model(case: dict) -> nn.Module:
    """A fresh seeded model in the state the case names, its gradients filled by backward."""
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    torch.manual_seed(case["seed"])
    kind = case["model"]
    if kind == "unused":
        model = _TwoBranch()
    else:
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    model = model.to(device=device, dtype=dtype)
    if kind == "frozen":
        model[0].requires_grad_(False)
    gen = torch.Generator().manual_seed(case["seed"])
    for _ in range({"no_backward": 0, "accumulated": 2}.get(kind, 1)):
        x = torch.randn(6, 4, generator=gen, dtype=dtype).to(device)
        y = torch.randint(0, 3, (6,), generator=gen).to(device)
        # Scaled so the norm is above 1: an answer that clips to 1.0 shows it.
        (5 * nn.functional.cross_entropy(model(x), y)).backward()
    if kind == "zeroed":
        model[0].zero_grad(set_to_none=False)
    return model


def _label(case: dict) -> str:
    return f"{GRAD_MODELS[case['model']][0]}, {case['device']}, {case['dtype']}"


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, float):  # a NumPy float64 is a float: accept it as one
        return float(value)
    return value


def observe_grad_norm(fn: Callable, case: dict) -> dict:
    """What ``fn(model)`` returns, and every gradient after it (a norm must not change them)."""
    model = _grad_model(case)
    returned = call_answer(GRAD_NORM, "grad_norm", fn, model, case=_label(case))
    return {
        "the value returned": _plain(returned),
        "the gradients after the call": {
            name: None if p.grad is None else p.grad.detach().clone()
            for name, p in model.named_parameters()
        },
    }


def _present(model):
    return [p.grad for p in model.parameters() if p.grad is not None]


def _sum_of_norms(model):
    return float(sum(g.norm() for g in _present(model)))


def _no_sqrt(model):
    return float(sum(g.pow(2).sum() for g in _present(model)))


def _mean_of_norms(model):
    norms = [g.norm() for g in _present(model)]
    return float(sum(norms) / len(norms)) if norms else 0.0


def _largest_norm(model):
    return max((g.norm().item() for g in _present(model)), default=0.0)


def _parameter_norm(model):
    return math.sqrt(sum(float(p.detach().pow(2).sum()) for p in model.parameters()))


def _returns_tensor(model):
    grads = _present(model)
    if not grads:
        return torch.tensor(0.0)
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))


def _clips(model):
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0))


GRAD_NORM_MISTAKES = [
    (
        "the result is the sum of the per-parameter norms. The global norm is the square root of "
        "the sum of *squares*: sqrt(‖g₁‖² + ‖g₂‖² + …), never larger than ‖g₁‖ + ‖g₂‖ + ….",
        _sum_of_norms,
    ),
    (
        "the square root is missing: the sum of the squares of the gradients is the norm squared.",
        _no_sqrt,
    ),
    (
        "the result is the mean of the per-parameter norms; the global norm treats every "
        "gradient entry of every parameter as one long vector: sqrt(‖g₁‖² + ‖g₂‖² + …).",
        _mean_of_norms,
    ),
    (
        "the result is the largest per-parameter norm; the global norm combines them all: "
        "sqrt(‖g₁‖² + ‖g₂‖² + …).",
        _largest_norm,
    ),
    (
        "this is the norm of the *parameters* (`p`), not of their gradients (`p.grad`).",
        _parameter_norm,
    ),
    (
        "the function returns a tensor. Return a Python float (`.item()` or `float(...)`), so a "
        "log of norms holds numbers, not tensors.",
        _returns_tensor,
    ),
    (
        "the gradients changed: `clip_grad_norm_` with a finite `max_norm` rescales them as a side "
        "effect. Measuring must not change what it measures: compute the norm yourself, or pass "
        "`max_norm=math.inf`.",
        _clips,
    ),
]


def _with_case_hint(err: Mistake, case: dict) -> Mistake:
    """Add the case's own hint to the message of an answer that raised on it."""
    hint = GRAD_MODELS[case["model"]][1]
    message = str(err).split("] ", 1)[1]
    if not hint or err.__cause__ is None or "Likely mistake" in message:
        return err
    return Mistake(GRAD_NORM, f"{message}\nLikely mistake: {hint}")


def check_grad_norm(grad_norm: Callable, thorough: bool = False) -> None:
    """Compare ``grad_norm`` with the reference; name the usual slip when they differ."""
    for case in grad_norm_cases(thorough):
        try:
            got = observe_grad_norm(grad_norm, case)
        except Mistake as err:
            raise _with_case_hint(err, case) from err.__cause__
        explain(
            GRAD_NORM,
            got,
            observe_grad_norm(ref.grad_norm.__wrapped__, case),
            case=_label(case),
            known_mistakes=[
                (msg, lambda wrong=wrong, case=case: observe_grad_norm(wrong, case))
                for msg, wrong in GRAD_NORM_MISTAKES
            ],
            hint="square every gradient entry of every parameter that has a .grad, add them all "
            "up, take one square root, and return a float.",
        )


# ---------------------------------------------------------------- ch07_leak_check

LEAK_CHECK = "ch07_leak_check"

#: Each container the check builds, with a few words for the case label.
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
}


def leak_cases(thorough: bool = False) -> list[dict]:
    """A list and a nested log on the CPU; thorough: every container, every device, float64."""
    if not thorough:
        return [
            {"name": "list_of_losses", "device": "cpu", "dtype": "float32", "seed": 0},
            {"name": "nested", "device": "cpu", "dtype": "float32", "seed": 1},
        ]
    seed = grading_seed()
    cases = []
    for i, device in enumerate(available_devices()):
        dtype = "float32" if device.type == "mps" else ("float64" if i % 2 else "float32")
        for j, name in enumerate(LEAK_CASES):
            cases.append(
                {"name": name, "device": str(device), "dtype": dtype, "seed": seed + 20 * i + j}
            )
    return cases


def _leak_container(case: dict):
    """The container a case names, built fresh from a small seeded linear model."""
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
    return 0.25


def observe_leak_check(fn: Callable, case: dict) -> dict:
    """What ``fn(container)`` returns for the case's container."""
    returned = call_answer(
        LEAK_CHECK, "graph_leaks", fn, _leak_container(case), case=LEAK_CASES[case["name"]]
    )
    return {"the count returned": _plain(returned)}


def _walk(obj, visit: Callable[[torch.Tensor], bool], open_dict=lambda d: d.values()) -> int:
    if isinstance(obj, torch.Tensor):
        return int(visit(obj))
    if isinstance(obj, dict):
        return sum(_walk(v, visit, open_dict) for v in open_dict(obj))
    if isinstance(obj, (list, tuple)):
        return sum(_walk(v, visit, open_dict) for v in obj)
    return 0


def _requires_grad(obj):
    return _walk(obj, lambda t: t.requires_grad)


def _every_tensor(obj):
    return _walk(obj, lambda t: True)


def _dict_keys(obj):
    return _walk(obj, lambda t: t.grad_fn is not None, open_dict=lambda d: list(d))


def _top_level(obj):
    items = obj.values() if isinstance(obj, dict) else obj
    if not isinstance(items, (list, tuple, type({}.values()))):
        items = [items]
    return sum(isinstance(v, torch.Tensor) and v.grad_fn is not None for v in items)


def _returns_bool(obj):
    return _walk(obj, lambda t: t.grad_fn is not None) > 0


LEAK_MISTAKES = [
    (
        "tensors that merely *require* grad were counted. A parameter or a fresh leaf requires "
        "grad but holds no graph; a tensor holds a graph when its `grad_fn` is not None.",
        _requires_grad,
    ),
    (
        "every tensor was counted. A detached tensor (`loss.detach()`, anything made under "
        "`torch.no_grad()`) holds no graph: count only tensors whose `grad_fn` is not None.",
        _every_tensor,
    ),
    (
        "the dict's keys were searched instead of its values: `for item in d` gives the keys; "
        "use `d.values()`.",
        _dict_keys,
    ),
    (
        "only the top level was searched. Lists, tuples and dicts can hold more containers: "
        "call the function on each item (recursion) to count what is inside them too.",
        _top_level,
    ),
    (
        "the function returns a bool (is there a leak?); the exercise asks how many: an int.",
        _returns_bool,
    ),
]


def check_leak_check(graph_leaks: Callable, thorough: bool = False) -> None:
    """Compare ``graph_leaks`` with the reference on logs of every shape."""
    for case in leak_cases(thorough):
        try:
            got = observe_leak_check(graph_leaks, case)
        except Mistake as err:
            if isinstance(err.__cause__, RecursionError):
                raise Mistake(
                    LEAK_CHECK,
                    f"`graph_leaks` recursed forever (case: {LEAK_CASES[case['name']]}).\n"
                    "Likely mistake: a string is iterable, and each of its characters is a "
                    "string again, so recursing into every iterable never ends. Open only "
                    "lists, tuples and dicts.",
                ) from err.__cause__
            raise
        explain(
            LEAK_CHECK,
            got,
            observe_leak_check(ref.graph_leaks.__wrapped__, case),
            case=LEAK_CASES[case["name"]],
            known_mistakes=[
                (msg, lambda wrong=wrong, case=case: observe_leak_check(wrong, case))
                for msg, wrong in LEAK_MISTAKES
            ],
            hint="a tensor counts 1 when its grad_fn is not None; lists, tuples and dict values "
            "are searched, nested to any depth; everything else counts 0.",
        )


# ---------------------------------------------------------------- ch07_mystery_loops

#: The codes a mystery loop can be labelled with: the loop doctor's codes, and "none".
MYSTERY_CODES = (
    "none",
    "missing_zero_grad",
    "no_eval_mode",
    "train_mode_not_restored",
    "graph_kept_alive",
    "stale_optimizer",
    "softmax_before_cross_entropy",
    "no_learning",
)


def check_labels(
    answer,
    grade_id: str,
    loops: Sequence[str],
    codes: Sequence[str] = MYSTERY_CODES,
    correct: dict[str, str] | None = None,
    hints: dict[str, str] | None = None,
) -> None:
    """Check a ``{loop: code}`` answer: its form (visible tests), then each label (hidden tests).

    Loop names are matched without regard to case or spaces, codes likewise. With ``correct``,
    every wrong label is listed with the hint for its loop, so one message says all there is.
    """
    if answer is None or answer is ...:
        raise Mistake(
            grade_id, f"No answer yet: set it to a dict {{loop: code}} for the loops {list(loops)}."
        )
    if not isinstance(answer, dict):
        raise Mistake(
            grade_id, f"The answer should be a dict {{loop: code}}, got {type(answer).__name__}."
        )
    labels = {str(k).strip().upper(): v for k, v in answer.items()}
    missing = [loop for loop in loops if loop not in labels]
    if missing:
        raise Mistake(grade_id, f"The answer has no label for loop(s) {missing}.")
    extra = [k for k in labels if k not in loops]
    if extra:
        raise Mistake(grade_id, f"There is no loop {extra[0]!r}; the loops are {list(loops)}.")
    for loop in loops:
        label = labels[loop]
        if not isinstance(label, str) or label.strip().lower() not in codes:
            raise Mistake(
                grade_id, f"Loop {loop}: {label!r} is not one of the codes {list(codes)}."
            )
    if correct is None:
        return
    wrong = [loop for loop in loops if labels[loop].strip().lower() != correct[loop]]
    if wrong:
        hints = hints or {}
        lines = [
            f"Loop {loop}: {labels[loop].strip().lower()!r} is not right. {hints.get(loop, '')}"
            for loop in wrong
        ]
        right = len(loops) - len(wrong)
        raise Mistake(
            grade_id,
            f"{right} of {len(loops)} loops labelled right.\n"
            + "\n".join(line.rstrip() for line in lines),
        )


# The records the isolated grader runs (the checks above add per-case hints for notebooks).
EXERCISES = [
    Exercise(
        grade_id=GRAD_NORM,
        function="grad_norm",
        reference=ref.grad_norm.__wrapped__,
        cases=grad_norm_cases,
        observe=observe_grad_norm,
        label=_label,
        mistakes=GRAD_NORM_MISTAKES,
    ),
    Exercise(
        grade_id=LEAK_CHECK,
        function="graph_leaks",
        reference=ref.graph_leaks.__wrapped__,
        cases=leak_cases,
        observe=observe_leak_check,
        label=lambda case: str(case.get("name", case)),
        mistakes=LEAK_MISTAKES,
    ),
]
