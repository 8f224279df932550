"""How much memory the graph keeps for backward: counted exactly, on any device.

During the forward pass autograd saves some tensors for the backward pass: a linear layer keeps
its input (the weight's gradient needs it), a ReLU keeps its output (to know where it let
gradient through). These saved tensors are the *activation memory* of training. They stay alive
until ``backward`` frees the graph, and they are what ``torch.no_grad()`` avoids and what
gradient checkpointing trades for recomputation.

`saved_activation_bytes` counts them with ``torch.autograd.graph.saved_tensors_hooks``: autograd
hands every tensor it saves to a *pack* hook, whatever the device, so the count is exact and
does not depend on an allocator's rounding or on what else the process holds. Three choices
make it a count of memory rather than of save events:

- Each storage (the block of memory under a tensor) counts once. The same tensor is often saved
  by two nodes: a ReLU's output is saved by the ReLU and again, as its input, by the next linear
  layer. That is one allocation, so it is one entry.
- A storage counts in full (``untyped_storage().nbytes()``), not ``numel × element_size``: a
  saved view of a large tensor keeps the whole allocation alive, and an expanded view has more
  elements than memory.
- Parameters (and views of them, such as the transposed weight a linear layer saves) are left
  out: the model holds them anyway, so saving them costs no extra memory. Everything else counts,
  including the input batch, which the graph keeps alive until backward.

`peak_rss_bytes` is the blunt instrument for everything else: the most physical memory the
process has ever used. It never goes down, so compare measurements in fresh processes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["saved_activation_bytes", "peak_rss_bytes"]


def _is_parameter(tensor: torch.Tensor) -> bool:
    # A view (weight.t(), weight[0]) points at the tensor that owns the memory through `_base`.
    owner = tensor._base if tensor._base is not None else tensor
    return isinstance(owner, torch.nn.Parameter)


def saved_activation_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Bytes of the tensors autograd saves for backward while running ``fn(*args, **kwargs)``.

    Args:
        fn: any callable, for example a model: ``saved_activation_bytes(model, x)``.
        *args: positional arguments for ``fn``.
        **kwargs: keyword arguments for ``fn``.

    Returns:
        The total size in bytes of the distinct storages saved for backward, parameters left
        out (see the module docstring). 0 when nothing is recorded, as under ``torch.no_grad()``
        or ``torch.inference_mode()``. ``fn``'s result is discarded.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> saved_activation_bytes(model, torch.zeros(5, 4))  # input 5×4 + output 5×3, float32
        140
    """
    saved: dict[tuple[str, int], torch.UntypedStorage] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not _is_parameter(tensor):
            storage = tensor.untyped_storage()
            # Holding the storage until we have counted keeps its address from being reused by
            # a later tensor, which would then be mistaken for this one.
            saved[(str(tensor.device), storage.data_ptr())] = storage
        # A detached alias, not the tensor itself: an op that saves its own output would
        # otherwise hold that output through its grad_fn, a cycle that keeps the graph alive.
        return tensor.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(*args, **kwargs)
    return sum(storage.nbytes() for storage in saved.values())


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far, in bytes (Linux and macOS).

    It includes everything the process ever held (the Python interpreter, torch's libraries,
    every tensor) and never decreases, so it answers "did this fit?" rather than "what did this
    one step cost?".
    """
    import resource  # Unix only: importing it at the top would break `import` on Windows.

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports ru_maxrss in kibibytes, macOS in bytes.
    return peak if sys.platform == "darwin" else peak * 1024
