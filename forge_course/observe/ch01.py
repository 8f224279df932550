"""Chapter 01's learner half: build each case's tensors, call the answer, report plain data.

When the learner's code raises, the observation says so (``{"raised": "..."}``, with whatever
was observed before) rather than failing here: what an error usually means is the grader
half's knowledge, and it adds that to the message.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.overrides import (
    TorchFunctionMode,
    _get_current_function_mode,
    _get_current_function_mode_stack,
    _pop_mode,
)
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from forge_course.observe.common import Mistake, alone, call_answer

GRAPH_WALK_ID = "ch01_graph_walk"
LOGSUMEXP_ID = "ch01_logsumexp"
STRAIGHT_THROUGH_ID = "ch01_straight_through"


def _attempt(grade_id: str, name: str, fn, *args, case: str):
    """``(result, None)``, or ``(None, what it raised)`` when the learner's call fails.

    Only ordinary exceptions become text. An unwritten answer, one out of memory or processes,
    and the notebook's tripwire are `Mistake` s of their own, and stay so.
    """
    try:
        return call_answer(grade_id, name, fn, *args, case=case), None
    except Mistake as err:
        cause = err.__cause__
        if cause is None or isinstance(cause, (MemoryError, OSError)):
            raise
        return None, str(err).removeprefix(f"[{grade_id}] ")


WRITES = "writes into x's memory while it runs"


class _WatchWrites(TorchDispatchMode):
    """Notes every operation that writes into the memory of the watched tensors, whatever
    tensor it goes through: ``x.sub_``, ``x.data.sub_``, ``x.detach().copy_``, ``out=x``."""

    def __init__(self, tensors):
        super().__init__()
        self.memory = {t.untyped_storage().data_ptr() for t in tensors}
        self.wrote = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            if isinstance(value, torch.Tensor) and self._ours(value):
                self.wrote = True
        return func(*args, **kwargs)

    def _ours(self, tensor: torch.Tensor) -> bool:
        try:
            return tensor.untyped_storage().data_ptr() in self.memory
        except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, sparse)
            return False


@contextmanager
def _watching_writes(*tensors):
    """The body runs under a `_WatchWrites`; the verdict says "yes", "no" or that the learner's
    code removed the watch (a dispatch mode it popped is not on the stack at the end)."""
    watch = _WatchWrites(tensors)
    memory = [t.untyped_storage().data_ptr() for t in tensors]
    verdict = {}
    with watch:
        yield verdict
        intact = any(mode is watch for mode in _get_current_dispatch_mode_stack())
    # ``x.data = ...`` writes nothing: it gives x other memory, which is as much a change.
    swapped = memory != [t.untyped_storage().data_ptr() for t in tensors]
    wrote = "yes" if watch.wrote or swapped else "no"
    verdict[WRITES] = wrote if intact else "not known: watch removed"


# ---------------------------------------------------------------- ch01_graph_walk


class Cube(torch.autograd.Function):
    """x³ with a hand-written backward: a custom node in a graph to walk."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return 3 * x**2 * grad_output


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
    if name == "custom Function":  # a node of a class written in Python: CubeBackward
        x = torch.randn(2, 3, generator=gen).to(device).requires_grad_()
        (w,) = _scalars(gen, 1, device)
        return (Cube.apply(x) * w).sum()
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


#: How a graph that only tells walks apart is named in messages (``case["also"]``).
SHOWN = {"shared subexpression": "h * h + h (h = x.sigmoid())"}


def label_graph_walk(case: dict) -> str:
    also = f", and {SHOWN[case['also']]}," if "also" in case else ""
    return f"{case['expression']}{also} on {case['device']}"


def _plain_item(item):
    """A list item as plain data: a string as it is, anything else described."""
    if isinstance(item, str):
        return str(item)
    if item is None or type(item) in (bool, int, float):
        return item
    if hasattr(item, "next_functions"):
        return {"autograd node": type(item).__name__}
    return {"object of type": type(item).__name__}


def _walked(fn, case: dict):
    """The list ``fn`` returns for the case's tensor, each item plain; or what it raised."""
    out, raised = _attempt(
        GRAPH_WALK_ID, "graph_nodes", fn, build_expression(case), case=case["expression"]
    )
    if raised is not None:
        return {"raised": raised}
    if not isinstance(out, (list, tuple)):
        raise Mistake(
            GRAPH_WALK_ID,
            f"`graph_nodes` should return a list of node names, but it returned {out!r:.80} "
            f"(case: {label_graph_walk(case)}).",
        )
    return [_plain_item(item) for item in out]


def observe_graph_walk(fn, case: dict):
    """What ``fn`` returns for the case's tensor: the list it returned, each item plain.

    A case with ``also`` names a second expression, walked too: on the running example a walk
    from the end of a stack and a queue that takes each node's inputs in reverse list the same
    names, and the second graph tells them apart, so that each gets its own message.
    """
    out = _walked(fn, case)
    if "also" not in case or isinstance(out, dict):
        return out
    second = {key: value for key, value in case.items() if key != "also"}
    also = _walked(fn, {**second, "expression": case["also"]})
    if isinstance(also, dict):
        return also
    return {"the result": out, f"for {SHOWN[case['also']]}, the result": also}


# ---------------------------------------------------------------- ch01_logsumexp


class _WatchLogSumExp(TorchFunctionMode):
    """Counts the calls of torch.logsumexp, whichever of its names was used (`torch.`,
    `Tensor.`, `torch.special.`, `torch.ops.aten.`), and lets every call through."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.intact = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if "logsumexp" in getattr(func, "__name__", ""):
            self.calls += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def _watching_logsumexp():
    """The body runs under a `_WatchLogSumExp`; ``intact`` says whether it was still on top of
    this thread's function modes at the end (learner code can pop it, or cover it with its own).
    """
    watch = _WatchLogSumExp()
    watch.__enter__()
    try:
        yield watch
    finally:
        stack = _get_current_function_mode_stack()
        watch.intact = bool(stack) and stack[-1] is watch
        if any(mode is watch for mode in stack):
            while _get_current_function_mode() is not watch:
                _pop_mode()  # a mode the learner's code left on top of the watch
            watch.__exit__(None, None, None)


def _backward(out: torch.Tensor, upstream: torch.Tensor) -> None:
    """``out.backward(upstream)``, straight to autograd's engine: a call that goes through
    ``__torch_function__`` runs with the watch off (a mode is off inside its own handler)."""
    torch.autograd.Variable._execution_engine.run_backward(
        (out,), (upstream,), False, False, (), True, True
    )


def logits(case: dict) -> torch.Tensor:
    """The case's logits: given values, or seeded normals around one offset per row."""
    dtype, device = getattr(torch, case["dtype"]), torch.device(case["device"])
    if "logits" in case:
        return torch.tensor(case["logits"], dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(case["seed"])
    x = torch.randn(case["shape"], generator=gen, dtype=torch.float64) * 3
    # One offset per row of the first dimension (broadcast when there is only one).
    offset = torch.tensor(case["offset"], dtype=torch.float64).reshape(-1, *[1] * (x.dim() - 1))
    return (x + offset).to(dtype=dtype, device=device)


def label_logsumexp(case: dict) -> str:
    what = f"logits {case['logits']}" if "logits" in case else f"shape {case['shape']}"
    if "offset" in case and any(case["offset"]):
        what += f" around {case['offset']}"
    return f"{what}, dim={case['dim']}, {case['dtype']} on {case['device']}"


IS_FUNCTION = "LogSumExp is a torch.autograd.Function"
OWN_NODE = "the result's grad_fn is LogSumExp's own node"
CALLS_LOGSUMEXP = "LogSumExp calls torch.logsumexp"
WATCH_INTACT = "the check's watch on torch.logsumexp stayed in place"
#: Which call raised: "forward" (``apply``), "backward", or "gradcheck" (both, in float64).
RAISED_IN = "raised in"


def observe_logsumexp(LogSumExp, case: dict) -> dict:
    """What the class is; the value, the gradient for a random upstream gradient and the logits
    after the call; whether torch.logsumexp ran; gradcheck in float64."""
    apply = getattr(LogSumExp, "apply", None)
    if not callable(apply):
        raise Mistake(
            LOGSUMEXP_ID,
            "`LogSumExp` should be a class derived from torch.autograd.Function, used as "
            f"`LogSumExp.apply(x, dim)`; it is {type(LogSumExp).__name__}.",
        )
    seen = {
        IS_FUNCTION: isinstance(LogSumExp, type) and issubclass(LogSumExp, torch.autograd.Function)
    }
    with alone(LOGSUMEXP_ID), _watching_logsumexp() as watch:
        seen.update(_run_logsumexp(LogSumExp, apply, case))
    seen[CALLS_LOGSUMEXP] = watch.calls > 0
    seen[WATCH_INTACT] = watch.intact
    return seen


def _run_logsumexp(LogSumExp, apply, case: dict) -> dict:
    label = label_logsumexp(case)
    seen: dict = {}
    x = logits(case).requires_grad_()
    with _watching_writes(x) as writes:
        out, raised = _attempt(LOGSUMEXP_ID, "LogSumExp", apply, x, case["dim"], case=label)
    if raised is not None:
        return {"raised": raised, RAISED_IN: "forward"}
    if not isinstance(out, torch.Tensor):
        raise Mistake(
            LOGSUMEXP_ID, f"`forward` should return a tensor, but it returned {out!r:.80}."
        )
    seen["value"] = out.detach().clone()
    seen[OWN_NODE] = getattr(out.grad_fn, "_forward_cls", None) is LogSumExp
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    upstream = (
        (torch.rand(out.shape, generator=gen, dtype=torch.float64) + 0.5)
        .to(out.dtype)
        .to(out.device)
    )
    with _watching_writes(x) as in_backward:
        _, raised = _attempt(LOGSUMEXP_ID, "LogSumExp", _backward, out, upstream, case=label)
    if raised is not None:
        return {**seen, "raised": raised, RAISED_IN: "backward"}
    seen["gradient"] = None if x.grad is None else x.grad.clone()
    seen["the logits after the call"] = x.detach().clone()
    # Last, so that a difference in what the caller sees is named first.
    verdicts = (writes[WRITES], in_backward[WRITES])
    seen[WRITES] = "yes" if "yes" in verdicts else min(verdicts, key=len)
    if case["dtype"] == "float64" and "shape" in case:

        def gradcheck():
            probe = logits(case).requires_grad_()
            return torch.autograd.gradcheck(
                lambda t: apply(t, case["dim"]), (probe,), raise_exception=False
            )

        passes, raised = _attempt(LOGSUMEXP_ID, "LogSumExp", gradcheck, case=label)
        if raised is not None:
            return {**seen, "raised": raised, RAISED_IN: "gradcheck"}
        seen["passes gradcheck"] = passes
    return seen


# ---------------------------------------------------------------- ch01_straight_through


def label_straight_through(case: dict) -> str:
    what = f"x = {case['values']}" if "values" in case else f"x of shape {case['shape']}"
    if case["scale"] != 1.0:
        what += f" made as {case['scale']} · leaf"
    return f"{what}, {case['dtype']} on {case['device']}"


def observe_straight_through(fn, case: dict) -> dict:
    """The value, whether it is in the graph, the gradient reaching the leaf, and ``x`` after
    the call."""
    dtype, device = getattr(torch, case["dtype"]), torch.device(case["device"])
    gen = torch.Generator().manual_seed(case["seed"])
    if "values" in case:
        leaf = torch.tensor(case["values"], dtype=dtype)
    else:
        leaf = (torch.randn(case["shape"], generator=gen, dtype=torch.float64) * 3).to(dtype)
    leaf = leaf.to(device).requires_grad_()
    x = leaf * case["scale"] if case["scale"] != 1.0 else leaf
    label = label_straight_through(case)
    with alone(STRAIGHT_THROUGH_ID), _watching_writes(x) as writes:
        out, raised = _attempt(STRAIGHT_THROUGH_ID, "round_ste", fn, x, case=label)
    if raised is not None:
        return {"raised": raised}
    if not isinstance(out, torch.Tensor):
        raise Mistake(
            STRAIGHT_THROUGH_ID,
            f"`round_ste` should return a tensor, but it returned {out!r:.80}.",
        )
    seen = {"value": out.detach().clone(), "records a graph": out.requires_grad}
    if out.requires_grad:
        # 1, 2, 3, ...: an upstream gradient that is not all ones, to see that it is passed on.
        upstream = (
            torch.arange(1, out.numel() + 1, dtype=out.dtype).reshape(out.shape).to(out.device)
        )
        _, raised = _attempt(STRAIGHT_THROUGH_ID, "round_ste", out.backward, upstream, case=label)
        if raised is not None:
            return {**seen, "raised": raised}
    seen["gradient"] = None if leaf.grad is None else leaf.grad.clone()
    seen["x after the call"] = x.detach().clone()
    seen.update(writes)  # last, so that a difference in what the caller sees is named first
    return seen
