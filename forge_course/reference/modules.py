"""What an ``nn.Module`` keeps track of, and how a batch follows the model to its device.

``nn.Module`` overrides ``__setattr__``. Assigning an ``nn.Parameter`` to ``self.something`` files
it in ``self._parameters``, a Module goes into ``self._modules``, and ``register_buffer`` puts a
tensor into ``self._buffers``. Everything else (a plain tensor, a Python list of layers) stays an
ordinary attribute that no Module method looks at. ``parameters()``, ``state_dict()``, ``.to()``,
``train()``/``eval()`` and the optimizer built from ``parameters()`` only ever walk those three
dictionaries, recursively.

Four answers live here:

- `MLP`: a multi-layer perceptron whose hidden layers sit in an ``nn.ModuleList``, so they are
  registered: the repair of the same model written with a plain Python list.
- `record_activations`: forward hooks that copy what chosen submodules return during one call
  of the model, removed again whatever happens.
- `to_device`: ``.to(device)`` applied to every tensor of a nested batch (dicts, lists, tuples,
  named tuples), leaving everything else as it is.
- `decay_groups`: a model's trainable parameters split into two optimizer parameter groups,
  weight decay for the weights of layers that multiply, none for biases and normalisation
  layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from forge_course.reference.guard import reference

__all__ = ["MLP", "NORM_TYPES", "decay_groups", "record_activations", "to_device"]

# The layers whose parameters scale and shift a normalised signal: decaying them towards 0
# would push the normalised output towards 0, which no one wants.
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm1d/2d/3d, SyncBatchNorm, InstanceNorm1d/2d/3d
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    *([nn.RMSNorm] if hasattr(nn, "RMSNorm") else []),  # torch 2.4 and later
)


@reference
class MLP(nn.Module):
    """Linear layers with a ReLU after each hidden one: ``sizes[0] → … → sizes[-1]``.

    Args:
        sizes: the width of every layer, input first: ``[4, 8, 8, 3]`` makes two hidden layers
            (4→8, 8→8) and a head (8→3). At least two numbers.

    The hidden layers live in ``self.hidden``, an ``nn.ModuleList``; the last layer is
    ``self.head``. So the ``state_dict`` keys are ``hidden.0.weight``, ``hidden.0.bias``, …,
    ``head.weight``, ``head.bias``, the same names the plain-list version would have had if its
    layers had been registered.
    """

    def __init__(self, sizes: Sequence[int]) -> None:
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"An MLP needs an input and an output size, got sizes={sizes!r}.")
        pairs = list(zip(sizes[:-1], sizes[1:]))
        self.hidden = nn.ModuleList(nn.Linear(n_in, n_out) for n_in, n_out in pairs[:-1])
        self.head = nn.Linear(*pairs[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., sizes[0]]`` inputs to ``[..., sizes[-1]]`` outputs (no ReLU on the output)."""
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


@reference
def record_activations(
    model: nn.Module, x: torch.Tensor, layer_names: Sequence[str]
) -> dict[str, torch.Tensor]:
    """What each named submodule returns while ``model(x)`` runs once.

    Args:
        model: any module; ``x`` must already be on its device.
        x: the input batch.
        layer_names: submodule names as ``model.named_modules()`` spells them (``"hidden.0"``,
            ``"head"``); ``""`` is the model itself.

    Returns:
        ``{name: output}`` for every name, each output detached from the graph and copied (a
        later in-place operation such as ``nn.ReLU(inplace=True)`` would otherwise overwrite it),
        on the model's device. A module that runs twice in one forward pass keeps its last output.

    The hooks are removed before returning, also when the forward pass raises, and hooks that
    were on the model before are left alone.
    """
    recorded: dict[str, torch.Tensor] = {}

    def recorder(name: str):
        # A factory gives each hook its own `name`; a lambda in the loop would see the last one.
        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            recorded[name] = output.detach().clone()

        return hook

    handles = []
    try:
        for name in layer_names:
            handles.append(model.get_submodule(name).register_forward_hook(recorder(name)))
        with torch.no_grad():  # the pass only looks: no graph is needed
            model(x)  # model(x), not model.forward(x): forward() alone skips the model's hooks
    finally:
        for handle in handles:
            handle.remove()
    return recorded


@reference
def to_device(batch: Any, device: torch.device | str) -> Any:
    """A copy of ``batch`` with every tensor moved to ``device``.

    Args:
        batch: a tensor, or dicts, lists and tuples (named tuples included) nested to any depth;
            other values (numbers, strings, None, NumPy arrays) are leaves and are kept as they
            are.
        device: where the tensors go, such as ``torch.device("cuda")`` or ``"cpu"``.

    Returns:
        The same structure: dicts as dicts with the same keys, lists as lists, each tuple type
        (a named tuple too) as itself. Tensors are replaced by ``tensor.to(device)``, which
        returns a new tensor (or the same one if it is already there); the batch passed in is
        left unchanged.
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple takes fields
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch  # a str is a sequence too, but of strs: recursing into it would never end


@reference
def decay_groups(
    model: nn.Module, weight_decay: float, norm_types: tuple[type[nn.Module], ...] = NORM_TYPES
) -> list[dict[str, Any]]:
    """Two parameter groups for an optimizer: with weight decay, and without.

    Args:
        model: any module.
        weight_decay: the decay of the first group (the second has ``0.0``).
        norm_types: modules all of whose parameters go without decay.

    Returns:
        ``[{"params": decay, "weight_decay": weight_decay}, {"params": no_decay,
        "weight_decay": 0.0}]``, ready for ``torch.optim.AdamW(groups, lr=...)``. ``no_decay``
        holds every parameter named ``bias`` and every parameter of a ``norm_types`` module;
        ``decay`` holds the rest (the weights of ``Linear``, ``Conv``, ``Embedding``, …). Only
        parameters with ``requires_grad`` are listed: frozen ones stay out of the optimizer.
        Each parameter appears once, even when it is tied into several places (the first place
        ``model.named_parameters()`` finds it decides its group), and in the order of
        ``model.parameters()``, so the optimizer's ``state_dict`` numbers them the same way on
        every run.
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # each parameter once, where it is first found
        if not param.requires_grad:
            continue
        owner_name, _, leaf = name.rpartition(".")
        if leaf == "bias" or isinstance(model.get_submodule(owner_name), norm_types):
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
