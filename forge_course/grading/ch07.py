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

from forge_course.device import available_devices
from forge_course.grading import answers
from forge_course.grading.core import Exercise, Mistake, grading_seed
from forge_course.observe.ch07 import (
    GRAD_MODELS,
    LEAK_CASES,
    label_grad_norm,
    label_leak_check,
    observe_grad_norm,
    observe_leak_check,
)
from forge_course.reference import detectors as ref

# ---------------------------------------------------------------- ch07_grad_norm

#: What to try when an answer crashes on a kind of model (the exercise text names each one).
GRAD_MODEL_HINTS = {
    "frozen": "a frozen parameter (`requires_grad=False`) has `.grad = None`: skip parameters "
    "whose `.grad` is None.",
    "unused": "a parameter the forward did not use has `.grad = None` even though it requires "
    "grad: test `p.grad is not None`, not `p.requires_grad`.",
    "no_backward": "before the first backward no parameter has a gradient: the norm is then 0.0.",
}


def grad_norm_cases(thorough: bool = False) -> list[dict]:
    """Every kind of model the exercise names, on every device, and two of them in float64;
    thorough: the same with new seeds every grading run."""
    if not thorough:
        cases = [
            {"model": kind, "device": str(device), "dtype": "float32", "seed": 10 * i + j}
            for i, device in enumerate(available_devices())
            for j, kind in enumerate(GRAD_MODELS)
        ]
        return cases + [
            {"model": kind, "device": "cpu", "dtype": "float64", "seed": 7 + j}
            for j, kind in enumerate(("mlp", "frozen"))
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
                    {"model": kind, "device": str(device), "dtype": "float64",
                     "seed": seed + 10 * i + 7}
                )  # fmt: skip
    return cases


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


def _each_holder(model):
    """Every place a parameter is held: a weight shared by two layers counts twice."""
    grads = [p.grad for _, p in model.named_parameters(remove_duplicate=False)]
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads if g is not None))


def _once_per_value(model):
    """De-duplicated by the gradient's value: distinct parameters with equal gradients merge."""
    squares = {float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None}
    return math.sqrt(sum(squares))


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
    (
        "a weight shared by two layers was counted twice. It is one parameter with one `.grad`: "
        "`model.parameters()` yields it once, while `named_parameters(remove_duplicate=False)`, "
        "`state_dict(keep_vars=True)` or each module's own parameters yield it once per layer.",
        _each_holder,
    ),
    (
        "two parameters whose gradients have the same value were counted once. They are "
        "different parameters: de-duplicate nothing beyond what `model.parameters()` does (it "
        "drops a parameter held twice, by identity, never by value).",
        _once_per_value,
    ),
]


def _grad_norm_raised(message: str, case: dict) -> str:
    """The kind of model's own hint, for an answer that raised on it."""
    return GRAD_MODEL_HINTS.get(case["model"], "") if "` raised " in message else ""


GRAD_NORM = Exercise(
    grade_id="ch07_grad_norm",
    function="grad_norm",
    reference=ref.grad_norm.__wrapped__,
    cases=grad_norm_cases,
    observe=observe_grad_norm,
    label=label_grad_norm,
    mistakes=GRAD_NORM_MISTAKES,
    hint="square every gradient entry of every parameter that has a .grad, add them all up, "
    "take one square root, and return a float.",
    raised_hint=_grad_norm_raised,
)
check_grad_norm = GRAD_NORM.check


# ---------------------------------------------------------------- ch07_leak_check


def leak_cases(thorough: bool = False) -> list[dict]:
    """Every object the exercise names, on every device; thorough: the same in float64 on every
    other device, with new seeds every grading run."""
    if not thorough:
        return [
            {"name": name, "device": str(device), "dtype": "float32", "seed": 20 * i + j}
            for i, device in enumerate(available_devices())
            for j, name in enumerate(LEAK_CASES)
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


def _walk(obj, visit: Callable[[torch.Tensor], bool], open_dict=dict.values, opened=(list, tuple)):
    if isinstance(obj, torch.Tensor):
        return int(visit(obj))
    if isinstance(obj, dict):
        return sum(_walk(v, visit, open_dict, opened) for v in open_dict(obj))
    if isinstance(obj, opened):
        return sum(_walk(v, visit, open_dict, opened) for v in obj)
    return 0


def _holds_graph(tensor: torch.Tensor) -> bool:
    return tensor.grad_fn is not None


def _requires_grad(obj):
    return _walk(obj, lambda t: t.requires_grad)


def _every_tensor(obj):
    return _walk(obj, lambda t: True)


def _dict_keys(obj):
    return _walk(obj, _holds_graph, open_dict=list)


def _keys_and_values(obj):
    return _walk(obj, _holds_graph, open_dict=lambda d: [*d, *d.values()])


def _opens_sets(obj):
    return _walk(obj, _holds_graph, opened=(list, tuple, set, frozenset))


def _once_each(obj):
    seen = set()

    def first_time(tensor):
        new = _holds_graph(tensor) and id(tensor) not in seen
        seen.add(id(tensor))
        return new

    return _walk(obj, first_time)


def _top_level(obj):
    items = obj.values() if isinstance(obj, dict) else obj
    if not isinstance(items, (list, tuple, type({}.values()))):
        items = [items]
    return sum(isinstance(v, torch.Tensor) and v.grad_fn is not None for v in items)


def _returns_bool(obj):
    return _walk(obj, _holds_graph) > 0


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
        "the dict's keys were searched as well as its values. A log's entries are its values; "
        "search `d.values()` only, even when a key is a tensor.",
        _keys_and_values,
    ),
    (
        "a set was searched. Only lists, tuples and dicts are opened; a set, a frozenset or any "
        "other object counts 0.",
        _opens_sets,
    ),
    (
        "a tensor stored in several places was counted once. The count is of places: a tensor "
        "stored twice counts twice, so drop the de-duplication (by `id()`, with a set, by value "
        "or by storage).",
        _once_each,
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


def _leak_check_raised(message: str, case: dict) -> str:
    if "` raised RecursionError" not in message:
        return ""
    return (
        "a string is iterable, and each of its characters is a string again, so recursing into "
        "every iterable never ends. Open only lists, tuples and dicts."
    )


LEAK_CHECK = Exercise(
    grade_id="ch07_leak_check",
    function="graph_leaks",
    reference=ref.graph_leaks.__wrapped__,
    cases=leak_cases,
    observe=observe_leak_check,
    label=label_leak_check,
    mistakes=LEAK_MISTAKES,
    hint="a tensor counts 1 when its grad_fn is not None, every time it is stored; lists, tuples "
    "and dict values are searched, nested to any depth; everything else counts 0.",
    raised_hint=_leak_check_raised,
)


check_leak_check = LEAK_CHECK.check


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
    *,
    key: dict | None = None,
) -> None:
    """Check a ``{loop: code}`` answer: its form, then each label: with ``correct`` (hidden
    tests) or with a self-study notebook's answer ``key`` (`forge_course.grading.answers`).

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
    if correct is not None:
        wrong = [loop for loop in loops if labels[loop].strip().lower() != correct[loop]]
    elif key is not None:
        wrong = answers.wrongly_labelled(key, grade_id, labels)
        hints = key["hints"]
    else:
        return
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


EXERCISES = [GRAD_NORM, LEAK_CHECK]
