"""The autograd tape: walking the recorded graph, and two gradients written by hand.

While a forward pass runs, autograd records one *node* per operation on a tensor that requires
grad. ``tensor.grad_fn`` is the node that made ``tensor``; ``node.next_functions`` holds one
``(node, output_number)`` pair per input of that operation, in the order of the inputs: the
node that made the input (``None`` for an input that needs no gradient) and which of that
node's outputs the input is (0 unless the operation has several, as ``unbind`` does). A leaf
tensor that requires grad appears as an ``AccumulateGrad`` node, which adds the gradient that
reaches it into the leaf's ``.grad``. Every tensor that does not require grad is a leaf too,
results of operations included, and has no node. The nodes form a DAG, not a tree: a tensor
used twice is reached twice.

`recorded_graph` and `graph_nodes` walk that DAG breadth-first. `LogSumExp` and `RoundSTE` are
``torch.autograd.Function`` s whose backward is ours instead of autograd's:

- log-sum-exp computed as ``m + log(sum(exp(x - m)))`` with ``m`` the maximum, so that no
  ``exp`` overflows; its gradient is the softmax, times the gradient arriving from above;
- rounding with a *straight-through* gradient: the forward rounds, the backward passes the
  incoming gradient through unchanged, as if the forward had been the identity.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from forge_course.reference.guard import reference

__all__ = ["RecordedGraph", "recorded_graph", "graph_nodes", "LogSumExp", "RoundSTE", "round_ste"]


@dataclass(frozen=True)
class RecordedGraph:
    """The nodes reachable from a tensor's ``grad_fn``, breadth-first, and who feeds whom.

    Attributes:
        nodes: the autograd nodes, each once, in breadth-first order from ``grad_fn``.
        inputs: for each node, the positions in ``nodes`` of its ``next_functions`` entries that
            are not ``None``, in order. Backward passes gradient from a node to these.
    """

    nodes: list
    inputs: list[list[int]]


def _breadth_first(tensor: torch.Tensor) -> RecordedGraph:
    if tensor.grad_fn is None:  # a leaf (made by hand, or needing no gradient): nothing recorded
        return RecordedGraph([], [])
    position = {tensor.grad_fn: 0}  # node -> where it stands in the order; also "seen"
    nodes, inputs = [tensor.grad_fn], []
    queue = deque([tensor.grad_fn])
    while queue:
        node = queue.popleft()
        feeds = []
        for next_node, _ in node.next_functions:
            if next_node is None:  # this input needs no gradient
                continue
            if next_node not in position:
                position[next_node] = len(nodes)
                nodes.append(next_node)
                queue.append(next_node)
            feeds.append(position[next_node])
        inputs.append(feeds)
    return RecordedGraph(nodes, inputs)


@reference
def recorded_graph(tensor: torch.Tensor) -> RecordedGraph:
    """The graph autograd recorded for ``tensor``: nodes breadth-first and their inputs."""
    return _breadth_first(tensor)


@reference
def graph_nodes(tensor: torch.Tensor) -> list[str]:
    """The class name of every node reachable from ``tensor.grad_fn``, each node once.

    The order is breadth-first: ``tensor.grad_fn`` first, then its ``next_functions`` in order
    (skipping ``None``), then theirs, and so on; a node already listed is not listed again.

    Example:
        >>> x = torch.tensor(2.0, requires_grad=True)
        >>> w = torch.tensor(3.0, requires_grad=True)
        >>> graph_nodes((w * x + x) ** 2)
        ['PowBackward0', 'AddBackward0', 'MulBackward0', 'AccumulateGrad', 'AccumulateGrad']

    Returns ``[]`` for a tensor that recorded nothing: a leaf, which is a tensor made by hand
    or any result that needs no gradient (one made under ``torch.no_grad()``, say).
    """
    return [type(node).__name__ for node in _breadth_first(tensor).nodes]


class LogSumExp(torch.autograd.Function):
    """``log(sum(exp(x), dim))`` that stays finite for large logits, with its own backward.

    Call it as ``LogSumExp.apply(x, dim)``; the result equals ``torch.logsumexp(x, dim)``
    (``dim`` removed from the shape).
    """

    @staticmethod
    @reference
    def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
        # Subtracting the maximum m makes every exponent <= 0, so each exp() lies in (0, 1] and
        # the largest is exactly 1: the sum neither overflows nor is 0, and its log is finite.
        # Adding m back afterwards gives the same number mathematically.
        m = x.amax(dim=dim, keepdim=True)
        exps = (x - m).exp()
        total = exps.sum(dim=dim, keepdim=True)
        # d lse / d x_i = exp(x_i) / sum_j exp(x_j): the softmax. The forward has both parts at
        # hand, already shifted by m, so it saves the softmax itself for the backward.
        ctx.save_for_backward(exps / total)
        ctx.dim = dim
        return (m + total.log()).squeeze(dim)

    @staticmethod
    @reference
    def backward(ctx, grad_output: torch.Tensor):
        (softmax,) = ctx.saved_tensors
        # grad_output has the summed dimension removed; put it back to broadcast along it.
        return softmax * grad_output.unsqueeze(ctx.dim), None  # no gradient for `dim`


class RoundSTE(torch.autograd.Function):
    """Round to the nearest integer in the forward; pass the gradient straight through."""

    @staticmethod
    @reference
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x)

    @staticmethod
    @reference
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        # round() is flat between integers, so its true derivative is 0 almost everywhere and
        # nothing before it would ever learn. Pretending it was the identity lets gradient pass.
        return grad_output


@reference
def round_ste(x: torch.Tensor) -> torch.Tensor:
    """``torch.round(x)`` in value, with the gradient of the identity (straight-through)."""
    return RoundSTE.apply(x)
