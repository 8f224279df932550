"""Checks for chapter 01, "Tensors and the autograd tape".

Exercises:
    ch01_graph_walk: ``graph_nodes(tensor) -> list[str]``, the recorded graph breadth-first.
    ch01_logsumexp: ``LogSumExp``, a ``torch.autograd.Function`` for a stable log-sum-exp.
    ch01_straight_through: ``round_ste(x)``, rounding with a straight-through gradient.
Questions:
    ch01_q_grad_sum, ch01_q_data, ch01_q_no_grad.

Every case is plain data (an expression's name, a seed, sizes, a dtype, a device); the inputs
are built fresh from it for each call, so the learner's half can run in another process.
"""

from __future__ import annotations

import random
from collections import deque

import torch

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, Mistake, call_answer, explain, grading_seed
from forge_course.reference import autograd_tape as ref


def _call(grade_id: str, name: str, fn, *args, case: str, hints: dict[str, str]):
    """`call_answer`, plus a likely mistake when the error's text gives one away."""
    try:
        return call_answer(grade_id, name, fn, *args, case=case)
    except Mistake as err:
        said = str(err).removeprefix(f"[{grade_id}] ")
        for clue, hint in hints.items():
            if clue in said:
                raise Mistake(grade_id, f"{said}\nLikely mistake: {hint}") from err
        raise


def _safely(observe, wrong, case: dict):
    """Observe a known wrong implementation; None when it fails outright (it cannot match then)."""
    try:
        return observe(wrong, case)
    except Mistake:
        return None


# ---------------------------------------------------------------- ch01_graph_walk


def _scalars(gen: torch.Generator, n: int, device: str) -> list[torch.Tensor]:
    values = torch.randn(n, generator=gen).tolist()
    return [torch.tensor(v, device=device, requires_grad=True) for v in values]


def build_expression(case: dict) -> torch.Tensor:
    """The tensor whose recorded graph a graph-walk case asks about."""
    name, device = case["expression"], case["device"]
    gen = torch.Generator().manual_seed(case["seed"])
    if name == "running example":  # L = (w·x + x)²: x is reached twice
        x = torch.tensor(2.0, device=device, requires_grad=True)
        w = torch.tensor(3.0, device=device, requires_grad=True)
        return (w * x + x) ** 2
    if name == "two products":  # a·b + c·d: breadth-first and depth-first orders differ
        a, b, c, d = _scalars(gen, 4, device)
        return a * b + c * d
    if name == "constant operand":  # the 2 and the ones need no gradient: None in next_functions
        x = torch.randn(3, generator=gen).to(device).requires_grad_()
        return (x * 2 + torch.ones(3, device=device)).sum()
    if name == "a leaf":  # nothing recorded: grad_fn is None
        return torch.randn(3, generator=gen).to(device).requires_grad_()
    if name == "under no_grad":
        a, b = _scalars(gen, 2, device)
        with torch.no_grad():
            return a * b
    if name == "a layer":  # linear → relu → mean: Addmm, a transposed weight, two parameters
        weight = torch.randn(3, 4, generator=gen).to(device).requires_grad_()
        bias = torch.randn(3, generator=gen).to(device).requires_grad_()
        inputs = torch.randn(5, 4, generator=gen).to(device)
        return torch.nn.functional.linear(inputs, weight, bias).relu().mean()
    if name == "shared subexpression":  # h = sigmoid(x) is used three times
        (x,) = _scalars(gen, 1, device)
        h = x.sigmoid()
        return h * h + h
    if name == "loop":  # y ← y·w, n times: a chain of n products sharing w
        x, w = _scalars(gen, 2, device)
        y = x
        for _ in range(case["n"]):
            y = y * w
        return y
    if name == "unbind":  # one node with two outputs, both used
        v = torch.randn(2, generator=gen).to(device).requires_grad_()
        a, b = v.unbind()
        return a * b + a
    if name == "custom Function":
        x = torch.randn(2, 3, generator=gen).to(device).requires_grad_()
        (w,) = _scalars(gen, 1, device)
        return (ref.LogSumExp.apply(x, -1) * w).sum()
    if name == "detach":  # the detached copy of x is a constant: only one path to x is recorded
        x, w = _scalars(gen, 2, device)
        return x.detach() * w + x
    if name == "sum of products":  # Σ wᵢ·xᵢ with every term using the same bias b
        xs, ws = _scalars(gen, case["n"], device), _scalars(gen, case["n"], device)
        (b,) = _scalars(gen, 1, device)
        total = xs[0] * ws[0] + b
        for x, w in zip(xs[1:], ws[1:]):
            total = total + (x * w + b)
        return total
    raise ValueError(f"unknown expression {name!r}")


VISIBLE_EXPRESSIONS = ("running example", "two products", "constant operand", "a leaf")


def graph_walk_cases(thorough: bool = False) -> list[dict]:
    """Four expressions on the CPU; thorough: every expression on every device, random sizes."""
    if not thorough:
        return [{"expression": e, "device": "cpu", "seed": 0} for e in VISIBLE_EXPRESSIONS]
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
        {
            "expression": name,
            "device": str(device),
            "seed": rng.randrange(2**31),
            "n": rng.randint(2, 5),
        }
        for device in available_devices()
        for name in names
    ]


def observe_graph_walk(fn, case: dict) -> list:
    """What ``fn`` returns for the case's tensor: the list of node names."""
    tensor = build_expression(case)
    out = _call(
        "ch01_graph_walk",
        "graph_nodes",
        fn,
        tensor,
        case=case["expression"],
        hints={
            "'NoneType' object has no attribute": "`next_functions` holds `None` for an input that "
            "needs no gradient, and `grad_fn` is `None` for a tensor that recorded nothing "
            "(return `[]` then). Skip `None` wherever it appears.",
            "'Tensor' object has no attribute": "start the walk at `tensor.grad_fn`: the tensor "
            "itself is not a node.",
        },
    )
    if isinstance(out, (list, tuple)) and any(hasattr(n, "next_functions") for n in out):
        raise Mistake(
            "ch01_graph_walk",
            f"`graph_nodes` returned the nodes themselves (case: {case['expression']}).\n"
            "Likely mistake: return their class names, `type(node).__name__`.",
        )
    return list(out) if isinstance(out, tuple) else out


def _walk(
    tensor, *, queue=True, seen_by="node", name=lambda n: type(n).__name__, leaves=True, root=True
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
        for nxt, _ in node.next_functions:
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


def check_graph_walk(graph_nodes, thorough: bool = False) -> None:
    """Compare ``graph_nodes`` with the reference walk on expressions with shared nodes."""
    for case in graph_walk_cases(thorough):
        explain(
            "ch01_graph_walk",
            observe_graph_walk(graph_nodes, case),
            observe_graph_walk(ref.graph_nodes.__wrapped__, case),
            case=f"{case['expression']} on {case['device']}",
            known_mistakes=[
                (msg, lambda wrong=wrong, case=case: _safely(observe_graph_walk, wrong, case))
                for msg, wrong in GRAPH_WALK_MISTAKES
            ],
            hint="walk from `tensor.grad_fn`; for each node, its `next_functions` in order, "
            "skipping `None` and nodes already listed; take nodes first in, first out.",
        )


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


def _logits(case: dict) -> torch.Tensor:
    dtype, device = getattr(torch, case["dtype"]), torch.device(case["device"])
    if "logits" in case:
        return torch.tensor(case["logits"], dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(case["seed"])
    x = torch.randn(case["shape"], generator=gen, dtype=torch.float64) * 3
    # One offset per row of the first dimension (broadcast when there is only one).
    offset = torch.tensor(case["offset"], dtype=torch.float64).reshape(-1, *[1] * (x.dim() - 1))
    return (x + offset).to(dtype=dtype, device=device)


def _lse_label(case: dict) -> str:
    what = f"logits {case['logits']}" if "logits" in case else f"shape {case['shape']}"
    if "offset" in case and any(case["offset"]):
        what += f" around {case['offset']}"
    return f"{what}, dim={case['dim']}, {case['dtype']} on {case['device']}"


_LSE_HINTS = {
    "must match the size of tensor": "`grad_output` has the summed dimension removed. "
    "Put it back with `grad_output.unsqueeze(dim)` before multiplying by the softmax.",
    "incorrect number of gradients": "`backward` returns one gradient per input of `forward`: "
    "`return grad_x, None` (None for `dim`, which is not a tensor).",
    "invalid gradient": "the gradient `backward` returns must have the shape of `x`: the "
    "softmax times `grad_output.unsqueeze(dim)`.",
}


def observe_logsumexp(LogSumExp, case: dict) -> dict:
    """The value, the gradient for a random upstream gradient, and gradcheck in float64."""
    label = _lse_label(case)
    x = _logits(case).requires_grad_()
    apply = getattr(LogSumExp, "apply", None)
    if apply is None:
        raise Mistake(
            "ch01_logsumexp", "`LogSumExp` should be a class derived from torch.autograd.Function."
        )
    out = _call("ch01_logsumexp", "LogSumExp", apply, x, case["dim"], case=label, hints=_LSE_HINTS)
    if not isinstance(out, torch.Tensor):
        raise Mistake(
            "ch01_logsumexp", f"`forward` should return a tensor, but it returned {out!r}."
        )
    expected = [size for i, size in enumerate(x.shape) if i != case["dim"] % x.dim()]
    if list(out.shape) != expected:
        raise Mistake(
            "ch01_logsumexp",
            f"the result should have shape {expected}, but it has shape {list(out.shape)} "
            f"(case: {label}).\nLikely mistake: `torch.logsumexp(x, dim)` removes the summed "
            "dimension: squeeze it, or sum without `keepdim=True`.",
        )
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    upstream = (
        (torch.rand(out.shape, generator=gen, dtype=torch.float64) + 0.5)
        .to(out.dtype)
        .to(out.device)
    )
    _call("ch01_logsumexp", "LogSumExp", out.backward, upstream, case=label, hints=_LSE_HINTS)
    seen = {"value": out.detach(), "gradient": x.grad}
    if case["dtype"] == "float64" and "shape" in case:

        def gradcheck():
            probe = _logits(case).requires_grad_()
            return torch.autograd.gradcheck(
                lambda t: apply(t, case["dim"]), (probe,), raise_exception=False
            )

        seen["passes gradcheck"] = _call(
            "ch01_logsumexp", "LogSumExp", gradcheck, case=label, hints=_LSE_HINTS
        )
    return seen


def _lse_function(forward, backward):
    """A Function class from two plain functions: how the known mistakes are written."""
    return type("LogSumExp", (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward),
    })  # fmt: skip


def _saving(ctx, x, dim, out):
    ctx.save_for_backward(x, torch.softmax(x, dim))
    ctx.dim = dim
    return out


def _forward_stable(ctx, x, dim):
    return _saving(ctx, x, dim, torch.logsumexp(x, dim))


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


LOGSUMEXP_MISTAKES = [
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
    x = _logits(case)
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


def check_logsumexp(LogSumExp, thorough: bool = False) -> None:
    """Compare ``LogSumExp`` with the reference: value, gradient, finiteness, gradcheck."""
    for case in logsumexp_cases(thorough):
        rtol = _rounding_rtol(case)
        want = observe_logsumexp(_ReferenceLogSumExp, case)
        got = _snap(observe_logsumexp(LogSumExp, case), want, rtol)
        explain(
            "ch01_logsumexp",
            got,
            want,
            case=_lse_label(case),
            known_mistakes=[
                (
                    msg,
                    lambda w=wrong, c=case, g=got, r=rtol: _snap(
                        _safely(observe_logsumexp, w, c), g, r
                    ),
                )
                for msg, wrong in LOGSUMEXP_MISTAKES
            ],
            hint="forward: m = x.amax(dim, keepdim=True), then m + log Σ exp(x − m), squeezed; "
            "backward: exp(x − lse) * grad_output, both with the summed dim put back, and None "
            "for `dim`.",
        )


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


def _ste_label(case: dict) -> str:
    what = f"x = {case['values']}" if "values" in case else f"x of shape {case['shape']}"
    if case["scale"] != 1.0:
        what += f" made as {case['scale']} · leaf"
    return f"{what}, {case['dtype']} on {case['device']}"


def observe_straight_through(fn, case: dict) -> dict:
    """The value, whether it is in the graph, and the gradient reaching the leaf."""
    dtype, device = getattr(torch, case["dtype"]), torch.device(case["device"])
    gen = torch.Generator().manual_seed(case["seed"])
    if "values" in case:
        leaf = torch.tensor(case["values"], dtype=dtype)
    else:
        leaf = (torch.randn(case["shape"], generator=gen, dtype=torch.float64) * 3).to(dtype)
    leaf = leaf.to(device).requires_grad_()
    x = leaf * case["scale"] if case["scale"] != 1.0 else leaf
    label = _ste_label(case)
    out = _call("ch01_straight_through", "round_ste", fn, x, case=label, hints={})
    if not isinstance(out, torch.Tensor):
        raise Mistake(
            "ch01_straight_through", f"`round_ste` should return a tensor, but it returned {out!r}."
        )
    seen = {"value": out.detach(), "records a graph": out.requires_grad}
    if out.requires_grad:
        # 1, 2, 3, ...: an upstream gradient that is not all ones, to see that it is passed on.
        upstream = (
            torch.arange(1, out.numel() + 1, dtype=out.dtype).reshape(out.shape).to(out.device)
        )
        _call("ch01_straight_through", "round_ste", out.backward, upstream, case=label, hints={})
    seen["gradient"] = leaf.grad
    return seen


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
]


def check_straight_through(round_ste, thorough: bool = False) -> None:
    """Compare ``round_ste`` with the reference: rounded value, gradient passed straight through."""
    for case in straight_through_cases(thorough):
        explain(
            "ch01_straight_through",
            observe_straight_through(round_ste, case),
            observe_straight_through(_ReferenceRoundSTE.apply, case),
            case=_ste_label(case),
            known_mistakes=[
                (msg, lambda wrong=wrong, case=case: _safely(observe_straight_through, wrong, case))
                for msg, wrong in STRAIGHT_THROUGH_MISTAKES
            ],
            hint="the value is torch.round(x); the gradient reaching x is the upstream gradient, "
            "unchanged.",
        )


# The records the isolated grader runs; the checks above are what the notebook calls.
EXERCISES = [
    Exercise(
        grade_id="ch01_graph_walk",
        function="graph_nodes",
        reference=ref.graph_nodes.__wrapped__,
        cases=graph_walk_cases,
        observe=observe_graph_walk,
        label=lambda case: f"{case['expression']} on {case['device']}",
        mistakes=GRAPH_WALK_MISTAKES,
    ),
    Exercise(
        grade_id="ch01_logsumexp",
        function="LogSumExp",
        reference=_ReferenceLogSumExp,
        cases=logsumexp_cases,
        observe=observe_logsumexp,
        label=_lse_label,
        mistakes=LOGSUMEXP_MISTAKES,
        prepare=lambda seen, target, case: _snap(seen, target, _rounding_rtol(case)),
    ),
    Exercise(
        grade_id="ch01_straight_through",
        function="round_ste",
        reference=_ReferenceRoundSTE.apply,
        cases=straight_through_cases,
        observe=observe_straight_through,
        label=_ste_label,
        mistakes=STRAIGHT_THROUGH_MISTAKES,
    ),
]
