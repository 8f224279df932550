"""Detectors for silent training bugs: numbers a loop can log to see what it is really doing.

Most training bugs raise no error. They show up in numbers nobody looked at: the size of the
gradient, the count of autograd graphs still alive, the bytes of activations still held. This
module computes those numbers.

- `grad_norm(model)`: the global L2 norm of every gradient, the one number to log each step. It
  equals what ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=inf)`` returns: the
  square root of the sum of the squares of every gradient entry, over every parameter whose
  ``.grad`` is not None. A frozen parameter, or one the forward did not use, has no gradient and
  adds nothing. Without ``zero_grad()`` this number grows step after step, because ``.grad`` is
  the running sum of every gradient so far.
- `graph_leaks(obj)`: how many tensors in a (nested) list, tuple or dict still carry an autograd
  graph, that is have a ``grad_fn``. Each one keeps its graph's nodes alive, and if no backward
  ran through it (a validation loss computed without ``torch.no_grad()``) every activation the
  graph saved as well. ``loss.item()`` and ``loss.detach()`` carry none.
- `nonfinite_grads(model)`: the names of parameters whose gradient holds a NaN or an infinity.
- `ActivationWatch(model)`: counts, while a loop runs, how many of the model's output graphs are
  still alive and how many bytes of layer outputs (activations) are still held by anything.

Why `ActivationWatch` uses storage weak references, not ``saved_tensors_hooks``
    A pack hook that returns the tensor it was given (as `forge_course.reference.memory` does for
    one forward) creates a reference cycle for every op that saves its own output (ReLU, tanh,
    log-softmax): the saved tensor then holds its graph, and the graph is never freed. Watching a
    whole loop that way would itself leak. A weak reference to each layer output's storage
    changes no lifetime: the storage expires exactly when nothing (graph, list, variable) holds it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from forge_course.reference.guard import reference

__all__ = ["ActivationWatch", "grad_norm", "graph_leaks", "nonfinite_grads"]


@reference
def grad_norm(model: nn.Module) -> float:
    """The global L2 norm of the gradients of ``model``, as a Python float.

    Args:
        model: any module; parameters whose ``.grad`` is None are skipped.

    Returns:
        ``sqrt(sum over parameters with a grad of sum(grad ** 2))``: the value
        ``clip_grad_norm_(model.parameters(), math.inf)`` returns, without changing any gradient.
        0.0 when no parameter has a gradient. Gradients are left as they are.
    """
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    # The norm of the per-parameter norms is the norm of all entries together: the same
    # two-level sum clip_grad_norm_ computes, so the two agree to the last bit on the CPU.
    device = grads[0].device
    norms = [torch.linalg.vector_norm(g, 2).to(device) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms), 2).item()


def _count_graph_tensors(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return int(obj.grad_fn is not None)
    if isinstance(obj, dict):
        return sum(_count_graph_tensors(value) for value in obj.values())
    # Only lists and tuples are opened: a string is iterable too, and its one-character items
    # contain themselves, so recursing into every iterable would never end.
    if isinstance(obj, (list, tuple)):
        return sum(_count_graph_tensors(item) for item in obj)
    return 0


@reference
def graph_leaks(obj: Any) -> int:
    """How many tensors in ``obj`` still carry an autograd graph (have a ``grad_fn``).

    Args:
        obj: a tensor, a number, a string, ``None``, or lists, tuples and dicts of these nested
            to any depth. Dict values are searched, dict keys are not. Anything else counts 0.

    Returns:
        The number of places in ``obj`` that hold a tensor whose ``grad_fn`` is not None. Leaf
        tensors (parameters, inputs, anything made under ``torch.no_grad()`` or by ``detach()``)
        carry no graph and count 0, even when they require grad. A tensor stored twice counts
        twice.
    """
    return _count_graph_tensors(obj)


def nonfinite_grads(model: nn.Module) -> list[str]:
    """Names of the parameters of ``model`` whose gradient holds a NaN or an infinity, in order."""
    return [
        name
        for name, p in model.named_parameters()
        if p.grad is not None and not bool(torch.isfinite(p.grad).all())
    ]


class _GraphTag:
    """Stored in a graph node's metadata: alive exactly as long as the node is."""

    __slots__ = ("__weakref__",)


class ActivationWatch:
    """Watch a model's forwards: how many of their graphs, and how many activation bytes, live on.

    Forward hooks record, for every layer without children, a weak reference to the storage of
    its output, and for the model itself a tag on its output's graph node. Nothing is kept alive
    by the watch, so it measures the loop as it would run without it::

        with ActivationWatch(model) as watch:
            for x, y in batches:
                ...                   # the loop under test
                print(watch.live_graphs(), watch.live_bytes())

    ``live_graphs()`` counts the forwards whose output graph some tensor still refers to (a
    loss in a list, a running ``total += loss``). ``live_bytes()`` adds up the distinct layer
    outputs still held by anything: by a graph that saved them for a backward that has not run
    (or ran with ``retain_graph=True``), or by a variable or list. Backward frees what it saved,
    so a graph kept *after* backward counts as a live graph but holds few bytes.

    Args:
        model: the module to watch. Hooks are removed by `close()` or at the end of ``with``.
    """

    def __init__(self, model: nn.Module) -> None:
        self._tags: list[weakref.ref] = []
        self._storages: dict[tuple[str, int], tuple[StorageWeakRef, int]] = {}
        leaves = [m for m in model.modules() if next(m.children(), None) is None]
        self._handles = [m.register_forward_hook(self._record_output) for m in leaves]
        self._handles.append(model.register_forward_hook(self._tag_graph))

    def _record_output(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not isinstance(output, torch.Tensor):
            return
        storage = output.untyped_storage()
        key = (str(output.device), storage.data_ptr())
        known = self._storages.get(key)
        if known is None or known[0].expired():  # a freed address can be handed out again
            self._storages[key] = (StorageWeakRef(storage), storage.nbytes())

    def _tag_graph(self, module: nn.Module, args: tuple, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            tag = _GraphTag()
            output.grad_fn.metadata["forge_course_tag"] = tag
            self._tags.append(weakref.ref(tag))

    def live_graphs(self) -> int:
        """How many of the watched forwards' graphs are still alive."""
        self._tags = [ref for ref in self._tags if ref() is not None]
        return len(self._tags)

    def live_bytes(self) -> int:
        """Bytes of distinct layer outputs that something still holds."""
        self._storages = {k: v for k, v in self._storages.items() if not v[0].expired()}
        return sum(nbytes for _, nbytes in self._storages.values())

    def close(self) -> None:
        """Remove the hooks; the counts keep working for what was watched."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> ActivationWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
