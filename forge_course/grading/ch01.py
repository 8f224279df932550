"""Checks for chapter 01, "Tensors and the autograd tape".

Exercises:
    ch01_graph_walk: ``graph_nodes(tensor) -> list[str]``, the recorded graph breadth-first.
    ch01_logsumexp: ``LogSumExp``, a ``torch.autograd.Function`` for a stable log-sum-exp.
    ch01_straight_through: ``round_ste(x)``, rounding with a straight-through gradient.
Questions:
    ch01_q_grad_sum, ch01_q_data, ch01_q_no_grad.

Every case is plain data (an expression's name, a seed, sizes, a dtype, a device); the learner's
half, `forge_course.observe.ch01`, builds the inputs fresh from it for each call, so it can run
in another process. When an answer raises, that half reports the error as data, and this one
adds what the error usually means (``prepare``).
"""

from __future__ import annotations

import random
from collections import deque

import torch

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, Mistake, grading_seed
from forge_course.observe.ch01 import (
    GRAPH_WALK_ID,
    LOGSUMEXP_ID,
    RAISED_IN,
    STRAIGHT_THROUGH_ID,
    WATCH_INTACT,
    label_graph_walk,
    label_logsumexp,
    label_straight_through,
    logits,
    observe_graph_walk,
    observe_logsumexp,
    observe_straight_through,
)
from forge_course.reference import autograd_tape as ref


def _with_hint(grade_id: str, raised: str, hints: dict[str, str]) -> Mistake:
    """A `Mistake` for an error the answer raised, with the likely mistake its text gives away."""
    for clue, hint in hints.items():
        if clue in raised:
            return Mistake(grade_id, f"{raised}\nLikely mistake: {hint}")
    return Mistake(grade_id, raised)


# ---------------------------------------------------------------- ch01_graph_walk

VISIBLE_EXPRESSIONS = ("running example", "two products", "constant operand", "a leaf")


def graph_walk_cases(thorough: bool = False) -> list[dict]:
    """Four expressions on the CPU; thorough: every expression on every device, random sizes."""
    if not thorough:
        return [_also({"expression": e, "device": "cpu", "seed": 0}) for e in VISIBLE_EXPRESSIONS]
    rng = random.Random(grading_seed())
    names = [
        *VISIBLE_EXPRESSIONS,
        "under no_grad",
        "a layer",
        "shared subexpression",
        "loop",
        "unbind",
        "custom Function",
        "detach",
        "sum of products",
    ]
    return [
        _also(
            {
                "expression": name,
                "device": str(device),
                "seed": rng.randrange(2**31),
                "n": rng.randint(2, 5),
            }
        )
        for device in available_devices()
        for name in names
    ]


def _also(case: dict) -> dict:
    """The running example, with h·h + h walked as well: on the running example a walk from the
    end of a stack and one that takes each node's inputs in reverse give the same names, and
    h·h + h tells them apart (`observe_graph_walk`)."""
    if case["expression"] != "running example":
        return case
    return {**case, "also": "shared subexpression"}


def _walk(
    tensor,
    *,
    queue=True,
    seen_by="node",
    name=lambda n: type(n).__name__,
    leaves=True,
    root=True,
    reverse=False,
):
    """A configurable walk, to reproduce the usual wrong answers exactly."""
    if tensor.grad_fn is None:
        return []
    start = (
        [tensor.grad_fn] if root else [n for n, _ in tensor.grad_fn.next_functions if n is not None]
    )
    todo, seen, names = deque(start), set(start), []
    while todo:
        node = todo.popleft() if queue else todo.pop()
        if seen_by == "name" and name(node) in names:
            continue
        names.append(name(node))
        inputs = node.next_functions[::-1] if reverse else node.next_functions
        for nxt, _ in inputs:
            if nxt is None or (seen_by == "node" and nxt in seen):
                continue
            seen.add(nxt)
            todo.append(nxt)
    return [n for n in names if leaves or n != "AccumulateGrad"]


def _depth_first(tensor):
    names, seen = [], set()

    def visit(node):
        seen.add(node)
        names.append(type(node).__name__)
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                visit(nxt)

    if tensor.grad_fn is not None:
        visit(tensor.grad_fn)
    return names


_DEPTH_FIRST = (
    "the nodes are right but the order is depth-first. Breadth-first lists all of a node's "
    "inputs before any of theirs: take nodes from the front of a queue "
    "(`collections.deque.popleft()`), not by recursion or from the end of a stack."
)

GRAPH_WALK_MISTAKES = [
    (
        "a node reached along two paths is listed twice. The graph is a DAG, not a tree: keep a "
        "set of the nodes already seen and skip them.",
        lambda t: _walk(t, seen_by="nothing"),
    ),
    (_DEPTH_FIRST, _depth_first),  # by recursion
    (_DEPTH_FIRST, lambda t: _walk(t, queue=False)),  # from the end of a stack
    (
        "each node's inputs are queued in reverse. Breadth-first takes them in the order "
        "`next_functions` lists them: `for next_node, _ in node.next_functions`, not "
        "`reversed(...)` or `[::-1]`.",
        lambda t: _walk(t, reverse=True),
    ),
    (
        "nodes are told apart by their names. Two different operations can have the same class "
        "name (two products are two `MulBackward0` nodes): remember the node objects you have "
        "seen, not their names.",
        lambda t: _walk(t, seen_by="name"),
    ),
    (
        "`node.name()` spells a leaf's node 'torch::autograd::AccumulateGrad'. Use the class "
        "name, `type(node).__name__`.",
        lambda t: _walk(t, name=lambda n: n.name()),
    ),
    (
        "the `AccumulateGrad` nodes are missing. A leaf that requires grad is a node too: the one "
        "that adds the gradient into its `.grad`.",
        lambda t: _walk(t, leaves=False),
    ),
    (
        "the list should start with `tensor.grad_fn` itself, then the nodes it leads to.",
        lambda t: _walk(t, root=False),
    ),
]


GRAPH_WALK_ERRORS = {
    "'NoneType' object has no attribute": "`next_functions` holds `None` for an input that "
    "needs no gradient, and `grad_fn` is `None` for a tensor that recorded nothing (return `[]` "
    "then). Skip `None` wherever it appears.",
    "'Tensor' object has no attribute": "start the walk at `tensor.grad_fn`: the tensor itself "
    "is not a node.",
}


def _prepare_graph_walk(seen, target, case: dict):
    """An error, or nodes where names belong, explained before any comparison."""
    if isinstance(seen, dict) and "raised" in seen:
        raise _with_hint(GRAPH_WALK_ID, seen["raised"], GRAPH_WALK_ERRORS)
    # A case that walks a second graph observes a dict of the two lists.
    lists = list(seen.values()) if isinstance(seen, dict) else [seen]
    if any(
        isinstance(item, dict) and "autograd node" in item
        for listed in lists
        if isinstance(listed, list)
        for item in listed
    ):
        raise Mistake(
            GRAPH_WALK_ID,
            f"`graph_nodes` returned the nodes themselves (case: {case['expression']}).\n"
            "Likely mistake: return their class names, `type(node).__name__`.",
        )
    return seen


GRAPH_WALK = Exercise(
    grade_id=GRAPH_WALK_ID,
    function="graph_nodes",
    reference=ref.graph_nodes.__wrapped__,
    cases=graph_walk_cases,
    observe=observe_graph_walk,
    label=label_graph_walk,
    mistakes=GRAPH_WALK_MISTAKES,
    hint="walk from `tensor.grad_fn`; for each node, its `next_functions` in order, skipping "
    "`None` and nodes already listed; take nodes first in, first out.",
    prepare=_prepare_graph_walk,
)
check_graph_walk = GRAPH_WALK.check


# ---------------------------------------------------------------- ch01_logsumexp


class _ReferenceLogSumExp(torch.autograd.Function):
    """The reference, without the tripwire that stops learner code from calling it."""

    forward = staticmethod(ref.LogSumExp.forward.__wrapped__)
    backward = staticmethod(ref.LogSumExp.backward.__wrapped__)


#: The hand calculation of the chapter: logsumexp([1000, 999, 998]) = 1000.4076...
HAND_LOGITS = [1000.0, 999.0, 998.0]


def logsumexp_cases(thorough: bool = False) -> list[dict]:
    """The hand example and a small batch on the CPU; thorough: large, tiny, mixed and square
    logits, several shapes and dims, gradcheck in float64, every device."""
    if not thorough:
        return [
            {"logits": HAND_LOGITS, "dim": 0, "dtype": "float32", "device": "cpu", "seed": 0},
            {
                "shape": [3, 4],
                "dim": -1,
                "offset": [0.0],
                "dtype": "float32",
                "device": "cpu",
                "seed": 1,
            },
        ]
    rng = random.Random(grading_seed())
    cases = []
    for device in available_devices():
        dtypes = ["float32"] if device.type == "mps" else ["float32", "float64"]  # MPS: no float64
        for dtype in dtypes:
            common = {"dtype": dtype, "device": str(device)}
            seed = lambda: rng.randrange(2**31)
            cases += [
                {"logits": HAND_LOGITS, "dim": 0, "seed": seed(), **common},
                {"shape": [3, 4], "dim": 1, "offset": [1000.0], "seed": seed(), **common},
                {"shape": [6], "dim": -1, "offset": [-1000.0], "seed": seed(), **common},
                # Rows far apart: one maximum for the whole tensor is not enough.
                {
                    "shape": [3, 5],
                    "dim": -1,
                    "offset": [1000.0, 0.0, -1000.0],
                    "seed": seed(),
                    **common,
                },
                {"shape": [4, 4], "dim": -1, "offset": [0.0], "seed": seed(), **common},
                {"shape": [2, 3, 5], "dim": 1, "offset": [0.0], "seed": seed(), **common},
                {"shape": [5, 3], "dim": 0, "offset": [0.0], "seed": seed(), **common},
            ]
    return cases


# What an error raised in `forward` usually means; those below, raised in `backward`.
LOGSUMEXP_FORWARD_ERRORS = {
    "must match the size of tensor": "in `forward`, a tensor reduced over `dim` has lost that "
    "dimension, so it no longer lines up with `x`: the maximum `x.amax(dim)` without "
    "`keepdim=True`, or a sum you divide by. Keep the dimension with `keepdim=True` (or put it "
    "back with `.unsqueeze(dim)`, at `dim` itself, not at the end), and squeeze only the result.",
}

LOGSUMEXP_ERRORS = {
    "must match the size of tensor": "`grad_output` has the summed dimension removed. "
    "Put it back with `grad_output.unsqueeze(dim)` before multiplying by the softmax.",
    "incorrect number of gradients": "`backward` returns one gradient per input of `forward`: "
    "`return grad_x, None` (None for `dim`, which is not a tensor).",
    "invalid gradient": "the gradient `backward` returns must have the shape of `x`: the "
    "softmax times `grad_output.unsqueeze(dim)`.",
}


def _lse_function(forward, backward):
    """A Function class from two plain functions: how the known mistakes are written."""
    return type("LogSumExp", (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward),
    })  # fmt: skip


def _saving(ctx, x, dim, out):
    ctx.save_for_backward(x, torch.softmax(x, dim))
    ctx.dim = dim
    return out


def _stable(x, dim):
    m = x.amax(dim=dim, keepdim=True)
    return m + (x - m).exp().sum(dim, keepdim=True).log()  # the summed dim kept


def _forward_stable(ctx, x, dim):
    return _saving(ctx, x, dim, _stable(x, dim).squeeze(dim))


def _forward_keepdim(ctx, x, dim):
    return _saving(ctx, x, dim, _stable(x, dim))


def _forward_calls_logsumexp(ctx, x, dim):
    return _saving(ctx, x, dim, torch.logsumexp(x, dim))


def _forward_shifts_x(ctx, x, dim):
    m = x.amax(dim=dim, keepdim=True)
    x.sub_(m)  # the caller's logits, shifted in place
    return _saving(ctx, x, dim, (m + x.exp().sum(dim, keepdim=True).log()).squeeze(dim))


def _forward_shifts_x_and_back(ctx, x, dim):
    m = x.amax(dim=dim, keepdim=True)
    x.data.sub_(m)  # shifted in place through .data, then shifted back: no trace left
    out = (m + x.exp().sum(dim, keepdim=True).log()).squeeze(dim)
    x.data.add_(m)
    return _saving(ctx, x, dim, out)


def _forward_naive(ctx, x, dim):
    return _saving(ctx, x, dim, x.exp().sum(dim).log())


def _forward_max_not_added(ctx, x, dim):
    m = x.amax(dim=dim, keepdim=True)
    return _saving(ctx, x, dim, (x - m).exp().sum(dim).log())


def _forward_one_max(ctx, x, dim):
    m = x.amax()
    return _saving(ctx, x, dim, m + (x - m).exp().sum(dim).log())


def _backward_softmax(ctx, grad_output):
    return ctx.saved_tensors[1] * grad_output.unsqueeze(ctx.dim), None


def _backward_naive_softmax(ctx, grad_output):
    x, _ = ctx.saved_tensors
    return x.exp() / x.exp().sum(ctx.dim, keepdim=True) * grad_output.unsqueeze(ctx.dim), None


def _backward_no_upstream(ctx, grad_output):
    return ctx.saved_tensors[1], None


def _backward_no_unsqueeze(ctx, grad_output):
    return ctx.saved_tensors[1] * grad_output, None


class _NotAFunction:
    """A class whose ``apply`` is ``torch.logsumexp``: autograd's own backward, none of its own."""

    apply = staticmethod(torch.logsumexp)


class _ApplyReplaced(torch.autograd.Function):
    """A Function whose inherited ``apply`` is replaced by ``torch.logsumexp``: its own
    ``forward`` and ``backward`` never run."""

    apply = staticmethod(torch.logsumexp)
    forward = staticmethod(_forward_stable)
    backward = staticmethod(_backward_softmax)


_KEEPDIM = (
    "`torch.logsumexp(x, dim)` removes the summed dimension: squeeze the result "
    "(`.squeeze(dim)`), or sum without `keepdim=True`."
)

LOGSUMEXP_MISTAKES = [
    (
        "`LogSumExp.apply(x, dim)` should run a `torch.autograd.Function` of your own: a class "
        "derived from `torch.autograd.Function`, with static `forward` and `backward` methods "
        "and the `apply` it inherits. Here autograd differentiates something else.",
        _NotAFunction,
    ),
    (
        "`LogSumExp.apply(x, dim)` should run a `torch.autograd.Function` of your own, but the "
        "class replaces the `apply` it inherits with `torch.logsumexp`, so its `forward` and "
        "`backward` never run. Delete that line: `apply` comes from `torch.autograd.Function`.",
        _ApplyReplaced,
    ),
    (
        "`torch.logsumexp` does the work the exercise asks you to write. Build the forward from "
        "`amax`, `exp`, `sum` and `log`, and call `torch.logsumexp` in neither `forward` nor "
        "`backward`.",
        _lse_function(_forward_calls_logsumexp, _backward_softmax),
    ),
    (_KEEPDIM, _lse_function(_forward_keepdim, _backward_no_unsqueeze)),
    (
        "`forward` changes `x` in place (`x -= m`, `x.sub_(m)`, or through `.data`), so the "
        "caller's logits are no longer what they were. Compute `x - m` as a new tensor.",
        _lse_function(_forward_shifts_x, _backward_softmax),
    ),
    (
        "`forward` writes into `x` (through `.data`, or in place) and puts it back afterwards. "
        "The caller's logits may be read meanwhile (another thread, a hook, a view of them), "
        "and autograd never sees a write through `.data`: compute `x - m` as a new tensor and "
        "leave `x` alone.",
        _lse_function(_forward_shifts_x_and_back, _backward_softmax),
    ),
    (
        "`exp` overflows: exp(1000) is inf even in float64 (and exp(−1000) is 0, whose log is "
        "−inf). Subtract the maximum m before `exp`, and add it back after the `log`.",
        _lse_function(_forward_naive, _backward_softmax),
    ),
    (
        "the maximum is subtracted but not added back: log Σ exp(x − m) is lse(x) − m. "
        "Return m + log Σ exp(x − m).",
        _lse_function(_forward_max_not_added, _backward_softmax),
    ),
    (
        "one maximum for the whole tensor is not enough: a row far below it underflows to "
        "exp(...) = 0, and log 0 = −inf. Subtract each row's own maximum, "
        "`x.amax(dim, keepdim=True)`.",
        _lse_function(_forward_one_max, _backward_softmax),
    ),
    (
        "the softmax in `backward` overflows: exp(x) / Σ exp(x) is inf / inf = nan for logits "
        "near 1000. Compute it as exp(x − lse), from the result you saved in `forward`.",
        _lse_function(_forward_stable, _backward_naive_softmax),
    ),
    (
        "`backward` ignores `grad_output`. The chain rule multiplies the local gradient (the "
        "softmax) by the gradient arriving from above: `softmax * grad_output.unsqueeze(dim)`.",
        _lse_function(_forward_stable, _backward_no_upstream),
    ),
    (
        "`grad_output` has the summed dimension removed, so `softmax * grad_output` broadcasts "
        "it along the wrong axis. Multiply by `grad_output.unsqueeze(dim)`.",
        _lse_function(_forward_stable, _backward_no_unsqueeze),
    ),
]


def _rounding_rtol(case: dict) -> float:
    """How far two stable answers may drift apart in the case's dtype.

    Both ``exp(x − lse)`` and ``softmax(x)`` are stable ways to get the gradient, but the first
    inherits the rounding of ``lse``: about eps·|lse| relative, 6e-5 for float32 logits near
    1000, more than float32's usual tolerance. Allow four times that.
    """
    x = logits(case)
    return 4 * torch.finfo(x.dtype).eps * max(1.0, x.abs().max().item())


def _snap(seen, target, rtol: float):
    """``seen`` with each float tensor that is within ``rtol`` of ``target``'s replaced by it."""
    if not (isinstance(seen, dict) and isinstance(target, dict)):
        return seen
    snapped = dict(seen)
    for key, value in seen.items():
        other = target.get(key)
        if (
            isinstance(value, torch.Tensor)
            and isinstance(other, torch.Tensor)
            and value.is_floating_point()
            and (value.dtype, value.shape, value.device) == (other.dtype, other.shape, other.device)
            and torch.allclose(value, other, rtol=rtol, atol=1e-6, equal_nan=True)
        ):
            snapped[key] = other
    return snapped


def _prepare_logsumexp(seen, target, case: dict):
    """A tampered instrument or an error explained first; then rounding forgiven (`_snap`)."""
    if not isinstance(seen, dict):
        return seen
    if seen.get(WATCH_INTACT) is False:
        raise Mistake(
            LOGSUMEXP_ID,
            "Not graded: your code took away the check's instrument, the function mode that "
            "watches for `torch.logsumexp` while `LogSumExp` runs. Leave torch's function modes "
            "as they are.",
        )
    if "raised" in seen:
        value, want = seen.get("value"), target.get("value")
        if (
            isinstance(value, torch.Tensor)
            and isinstance(want, torch.Tensor)
            and value.shape != want.shape  # the shape went wrong first: say so
        ):
            raise Mistake(
                LOGSUMEXP_ID,
                f"the result should have shape {list(want.shape)}, but it has shape "
                f"{list(value.shape)} (case: {label_logsumexp(case)}).\n"
                f"Likely mistake: {_KEEPDIM}",
            )
        in_forward = seen.get(RAISED_IN) == "forward"
        hints = LOGSUMEXP_FORWARD_ERRORS if in_forward else LOGSUMEXP_ERRORS
        raise _with_hint(LOGSUMEXP_ID, seen["raised"], hints)
    return _snap(seen, target, _rounding_rtol(case))


LOGSUMEXP = Exercise(
    grade_id=LOGSUMEXP_ID,
    function="LogSumExp",
    reference=_ReferenceLogSumExp,
    cases=logsumexp_cases,
    observe=observe_logsumexp,
    label=label_logsumexp,
    mistakes=LOGSUMEXP_MISTAKES,
    hint="forward: m = x.amax(dim, keepdim=True), then m + log Σ exp(x − m), squeezed; "
    "backward: exp(x − lse) * grad_output, both with the summed dim put back, and None for `dim`.",
    prepare=_prepare_logsumexp,
)
check_logsumexp = LOGSUMEXP.check


# ---------------------------------------------------------------- ch01_straight_through


class _ReferenceRoundSTE(torch.autograd.Function):
    forward = staticmethod(ref.RoundSTE.forward.__wrapped__)
    backward = staticmethod(ref.RoundSTE.backward.__wrapped__)


#: Halves round to the even neighbour, as `torch.round` does: 0.5 → 0, 1.5 → 2, −1.5 → −2.
STE_VALUES = [-1.5, -0.6, -0.4, 0.4, 0.5, 1.5, 2.7]


def straight_through_cases(thorough: bool = False) -> list[dict]:
    """A vector with halves, on the CPU; thorough: matrices, float64, a non-leaf input, and
    every device."""
    if not thorough:
        return [
            {"values": STE_VALUES, "dtype": "float32", "device": "cpu", "scale": 1.0, "seed": 0}
        ]
    rng = random.Random(grading_seed())
    cases = []
    for device in available_devices():
        dtypes = ["float32"] if device.type == "mps" else ["float32", "float64"]
        for dtype in dtypes:
            common = {"dtype": dtype, "device": str(device)}
            cases += [
                {"values": STE_VALUES, "scale": 1.0, "seed": rng.randrange(2**31), **common},
                {
                    "shape": [rng.randint(2, 5), rng.randint(2, 5)],
                    "scale": 1.0,
                    "seed": rng.randrange(2**31),
                    **common,
                },
                # The input is itself the output of an operation: the gradient must reach its leaf.
                {"shape": [4, 3], "scale": 2.5, "seed": rng.randrange(2**31), **common},
            ]
    return cases


def _plain_round(x):
    return torch.round(x)


def _detached(x):
    return torch.round(x).detach()


class _OnesBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad_output):
        return torch.ones_like(grad_output)


class _ClippedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * (x.abs() <= 1)


def _floor(x):
    return x + (torch.floor(x) - x).detach()


def _detached_the_wrong_part(x):
    return torch.round(x) + (x - torch.round(x)).detach()


def _rounds_x_in_place(x):
    x.data.round_()
    return x


def _rounds_x_and_back(x):
    saved = x.detach().clone()
    x.data.round_()  # rounded in place through .data, used, then put back
    out = x + 0
    x.data.copy_(saved)
    return out


STRAIGHT_THROUGH_MISTAKES = [
    (
        "the gradient is all zeros: that is `round`'s own derivative, flat between integers. "
        "The straight-through backward returns `grad_output` unchanged instead.",
        _plain_round,
    ),
    (
        "the result is cut off from the graph (`requires_grad` is False), so no gradient can "
        "flow back. Detach only the difference: `x + (torch.round(x) - x).detach()`.",
        _detached,
    ),
    (
        "`backward` returns ones instead of `grad_output`: it throws away the gradient arriving "
        "from above. Straight-through means passing `grad_output` on unchanged.",
        _OnesBackward.apply,
    ),
    (
        "gradient passes only where |x| ≤ 1 (the 'clipped' straight-through variant). This "
        "exercise asks for the plain one: `grad_output` unchanged everywhere.",
        _ClippedBackward.apply,
    ),
    (
        "the value should be `torch.round(x)`: rounding to the nearest integer (halves to the "
        "even one), not `floor` or truncation.",
        _floor,
    ),
    (
        "the wrong part is detached: `round(x) + (x - round(x)).detach()` has the value x and "
        "`round`'s zero gradient. Detach the correction instead: `x + (round(x) - x).detach()`.",
        _detached_the_wrong_part,
    ),
    (
        "`round_ste` rounds the caller's `x` in place (through `.data`): the value and the "
        "gradient look right, but the caller's tensor has changed, and autograd never saw it. "
        "Leave `x` as it is and return a new tensor: `x + (torch.round(x) - x).detach()`.",
        _rounds_x_in_place,
    ),
    (
        "`round_ste` writes into the caller's `x` (through `.data`) and puts it back: while it "
        "runs `x` is not what the caller made, and autograd never sees the write. Leave `x` "
        "alone and build the result as a new tensor: `x + (torch.round(x) - x).detach()`.",
        _rounds_x_and_back,
    ),
]


def _prepare_straight_through(seen, target, case: dict):
    if isinstance(seen, dict) and "raised" in seen:
        raise Mistake(STRAIGHT_THROUGH_ID, seen["raised"])
    return seen


STRAIGHT_THROUGH = Exercise(
    grade_id=STRAIGHT_THROUGH_ID,
    function="round_ste",
    reference=_ReferenceRoundSTE.apply,
    cases=straight_through_cases,
    observe=observe_straight_through,
    label=label_straight_through,
    mistakes=STRAIGHT_THROUGH_MISTAKES,
    hint="the value is torch.round(x); the gradient reaching x is the upstream gradient, "
    "unchanged; x itself stays as it was.",
    prepare=_prepare_straight_through,
)
check_straight_through = STRAIGHT_THROUGH.check

EXERCISES = [GRAPH_WALK, LOGSUMEXP, STRAIGHT_THROUGH]
