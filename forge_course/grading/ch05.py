"""Checks for chapter 05, "nn.Module and devices": the grader half.

Exercises:
    ch05_repair_model: ``class MLP(nn.Module)`` with its hidden layers registered.
    ch05_activation_recorder: ``record_activations(model, x, layer_names) -> dict``.
    ch05_to_device: ``to_device(batch, device)`` for nested batches.
    ch05_decay_groups: ``decay_groups(model, weight_decay) -> [decay group, no-decay group]``.
Questions:
    ch05_q_param_count, ch05_q_to_semantics, ch05_q_strict_false, ch05_q_tied_count.

The learner half (what builds the inputs and calls the answer) is `forge_course.observe.ch05`.
Every check can move things to the ``meta`` device: it holds shapes and dtypes but no data, so
on a machine with only a CPU it still shows whether something moved.
"""

from __future__ import annotations

import torch
from torch import nn

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, grading_seed
from forge_course.observe.ch05 import (
    DECAY,
    META,
    RECORDER,
    REPAIR,
    TO_DEVICE,
    label_activation_recorder,
    label_decay_groups,
    label_repair_model,
    label_to_device,
    observe_activation_recorder,
    observe_decay_groups,
    observe_repair_model,
    observe_to_device,
)
from forge_course.reference import modules as ref

# ---------------------------------------------------------------- ch05_repair_model


def repair_model_cases(thorough: bool = False) -> list[dict]:
    """The running example on the CPU; thorough: other depths, fresh seeds, every device."""
    if not thorough:
        return [{"sizes": [4, 8, 8, 3], "seed": 0, "device": "cpu"}]
    seed = grading_seed()
    shapes = [[4, 8, 8, 3], [3, 5], [6, 16, 16, 16, 2], [2, 7, 1]]
    return [
        {"sizes": sizes, "seed": seed + 10 * i + j, "device": str(device)}
        for i, device in enumerate(available_devices())
        for j, sizes in enumerate(shapes)
    ]


def _reference_mlp(sizes):
    """The reference model, built without the guard that refuses it to learners' code."""
    model = ref.MLP.__new__(ref.MLP)
    ref.MLP.__init__.__wrapped__(model, sizes)
    return model


def _pairs(sizes):
    return list(zip(sizes[:-1], sizes[1:]))


class _PlainList(nn.Module):
    """The broken original: hidden layers in a plain Python list."""

    def __init__(self, sizes):
        super().__init__()
        self.hidden = [nn.Linear(a, b) for a, b in _pairs(sizes)[:-1]]
        self.head = nn.Linear(*_pairs(sizes)[-1])

    def forward(self, x):
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


class _SequentialWithReLU(nn.Module):
    """Linear and ReLU modules together in one Sequential: the Linear layers are 0, 2, 4."""

    def __init__(self, sizes):
        super().__init__()
        layers = []
        for a, b in _pairs(sizes)[:-1]:
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.hidden = nn.Sequential(*layers)
        self.head = nn.Linear(*_pairs(sizes)[-1])

    def forward(self, x):
        return self.head(self.hidden(x))


class _SequentialNoReLU(nn.Module):
    """A Sequential of the Linear layers, called as one: no ReLU between them."""

    def __init__(self, sizes):
        super().__init__()
        self.hidden = nn.Sequential(*(nn.Linear(a, b) for a, b in _pairs(sizes)[:-1]))
        self.head = nn.Linear(*_pairs(sizes)[-1])

    def forward(self, x):
        return self.head(torch.relu(self.hidden(x)))


class _ReLUOnOutput(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in _pairs(sizes)[:-1])
        self.head = nn.Linear(*_pairs(sizes)[-1])

    def forward(self, x):
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return torch.relu(self.head(x))


class _ParameterListPatch(_PlainList):
    """Keeps the plain list and registers the layers' tensors in a ParameterList instead."""

    def __init__(self, sizes):
        super().__init__(sizes)
        self.extra = nn.ParameterList(p for layer in self.hidden for p in layer.parameters())


class _SetattrNames(nn.Module):
    """Registers each hidden layer under its own attribute: hidden0, hidden1, …"""

    def __init__(self, sizes):
        super().__init__()
        self.depth = len(sizes) - 2
        for i, (a, b) in enumerate(_pairs(sizes)[:-1]):
            setattr(self, f"hidden{i}", nn.Linear(a, b))
        self.head = nn.Linear(*_pairs(sizes)[-1])

    def forward(self, x):
        for i in range(self.depth):
            x = torch.relu(getattr(self, f"hidden{i}")(x))
        return self.head(x)


REPAIR_MISTAKES = [
    (
        "the hidden layers are still in a plain Python list (or dict). `nn.Module` registers "
        "only Modules, Parameters and buffers assigned to it directly, so `model.parameters()` "
        "sees the head alone: the optimizer never updates the hidden layers and `.to()` never "
        "moves them. Wrap them in `nn.ModuleList`.",
        _PlainList,
    ),
    (
        "with the ReLUs as modules inside the container, the Linear layers are numbered 0, 2, "
        "4 … instead of 0, 1, 2 …, so a checkpoint of the intended model would not load. Keep "
        "only the Linear layers in `self.hidden` and apply `torch.relu` in `forward`.",
        _SequentialWithReLU,
    ),
    (
        "calling an `nn.Sequential` of Linear layers runs them back to back, with no ReLU "
        "between them. Loop over `self.hidden` and apply ReLU after each layer, as "
        "`PlainListMLP.forward` does.",
        _SequentialNoReLU,
    ),
    (
        "there is a ReLU after the head. The intended model returns the head's output as it "
        "is: scores that may be negative.",
        _ReLUOnOutput,
    ),
    (
        "an `nn.ParameterList` of the layers' tensors lets the optimizer see them, but under "
        "other names (a checkpoint of the intended model would not load), and the layers "
        "themselves stay unregistered. Put the layers in an `nn.ModuleList`.",
        _ParameterListPatch,
    ),
    (
        "the layers are registered, but as `hidden0`, `hidden1` …: a checkpoint of the "
        "intended model names them `hidden.0`, `hidden.1` …, the names an `nn.ModuleList` "
        "called `hidden` gives.",
        _SetattrNames,
    ),
]

REPAIR_MODEL = Exercise(
    grade_id=REPAIR,
    function="MLP",
    reference=_reference_mlp,
    cases=repair_model_cases,
    observe=observe_repair_model,
    label=label_repair_model,
    mistakes=REPAIR_MISTAKES,
    hint="compare `model.state_dict().keys()` with hidden.0.weight, hidden.0.bias, …, "
    "head.weight, head.bias, and the forward pass with `PlainListMLP.forward`.",
)
check_repair_model = REPAIR_MODEL.check


# ---------------------------------------------------------------- ch05_activation_recorder


def activation_recorder_cases(thorough: bool = False) -> list[dict]:
    """A small Sequential on the CPU; thorough: nested and shared layers, every device."""
    if not thorough:
        return [{"model": "sequential", "names": ["0", "1", ""], "seed": 0, "device": "cpu"}]
    seed = grading_seed()
    plans = [
        ("sequential", ["2", "0", ""]),
        ("nested", ["encoder.0", "encoder.2.0", "encoder.2", "head", ""]),
        ("shared", ["embed", "shared", "head"]),
        ("shared", ["shared"]),
    ]
    return [
        {"model": model, "names": names, "seed": seed + 10 * i + j, "device": str(device)}
        for i, device in enumerate(available_devices())
        for j, (model, names) in enumerate(plans)
    ]


def _no_remove(model, x, layer_names):
    recorded = {}
    for name in layer_names:
        model.get_submodule(name).register_forward_hook(
            lambda m, i, out, name=name: recorded.__setitem__(name, out.detach().clone())
        )
    with torch.no_grad():
        model(x)
    return recorded


def _late_binding(model, x, layer_names):
    recorded, handles = {}, []
    try:
        for name in layer_names:
            handles.append(
                model.get_submodule(name).register_forward_hook(
                    # The mistake itself: `name` is looked up when the hook runs.
                    lambda m, i, out: recorded.__setitem__(name, out.detach().clone())  # noqa: B023
                )
            )
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return recorded


def _recorder(store=lambda out: out.detach().clone(), run=None, clear_all=False, finally_=True):
    """A recorder with one thing changed: how outputs are kept, how the model runs, cleanup."""

    def record(model, x, layer_names):
        recorded, handles = {}, []

        def cleanup():
            if clear_all:
                for module in model.modules():
                    module._forward_hooks.clear()
            else:
                for handle in handles:
                    handle.remove()

        def body():
            for name in layer_names:
                handles.append(
                    model.get_submodule(name).register_forward_hook(
                        lambda m, i, out, name=name: recorded.__setitem__(name, store(out))
                    )
                )
            (run or (lambda: model(x)))()

        if finally_:
            try:
                body()
            finally:
                cleanup()
        else:
            body()
            cleanup()
        return recorded

    return record


def _hook_returns_copy(model, x, layer_names):
    recorded, handles = {}, []

    def recorder(name):
        def hook(module, inputs, output):
            recorded[name] = output.detach().clone()
            return recorded[name]  # the mistake: torch passes this on instead of the output

        return hook

    try:
        for name in layer_names:
            handles.append(model.get_submodule(name).register_forward_hook(recorder(name)))
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return recorded


def _one_pass_per_layer(model, x, layer_names):
    recorded = {}
    for name in layer_names:
        handle = model.get_submodule(name).register_forward_hook(
            lambda m, i, out, name=name: recorded.__setitem__(name, out.detach().clone())
        )
        try:
            with torch.no_grad():
                model(x)
        finally:
            handle.remove()
    return recorded


def _walk_children(model, x, layer_names):
    """No hooks: pass x through the top-level children in order, as if forward were a line."""
    recorded = {}
    with torch.no_grad():
        for name, child in model.named_children():
            x = child(x)
            recorded[name] = x.detach().clone()
        recorded[""] = x.detach().clone()
    return {name: recorded[name] for name in layer_names if name in recorded}


def _calls_forward(model, x, layer_names):
    recorded, handles = {}, []
    try:
        for name in layer_names:
            handles.append(
                model.get_submodule(name).register_forward_hook(
                    lambda m, i, out, name=name: recorded.__setitem__(name, out.detach().clone())
                )
            )
        with torch.no_grad():
            model.forward(x)
    finally:
        for handle in handles:
            handle.remove()
    return recorded


RECORDER_MISTAKES = [
    (
        "every hook writes under the same name. A lambda (or def) created in a loop looks up "
        "`name` when it runs, after the loop has ended, so all of them see the last name. Bind "
        "it when the hook is made: `lambda m, i, out, name=name: ...`, or a factory function.",
        _late_binding,
    ),
    (
        "`model.forward(x)` runs the forward method but skips the model's own hooks, so the "
        'model itself (`""`) is never recorded, and hooks others put on it do not fire. Call '
        "`model(x)`.",
        _calls_forward,
    ),
    (
        "your hook returns a value. A forward hook that returns anything but None replaces "
        "the module's output with it, so the rest of the model runs on your copy: a later "
        "in-place operation (here `nn.ReLU(inplace=True)`) overwrites what you recorded, and "
        "with autograd on the model's output is cut off from the graph. Store the copy and "
        "return nothing (in a lambda, `recorded.__setitem__(name, ...)` returns None; "
        "`recorded.setdefault(name, ...)` returns the copy).",
        _hook_returns_copy,
    ),
    (
        "`.detach()` alone shares memory with the output, so a later in-place operation "
        "(here `nn.ReLU(inplace=True)`) overwrites what you recorded. Keep "
        "`output.detach().clone()`.",
        _recorder(store=lambda out: out.detach()),
    ),
    (
        "you kept the modules' outputs themselves: they are still attached to the graph, and "
        "a later in-place operation (here `nn.ReLU(inplace=True)`) overwrites them. Store "
        "`output.detach().clone()`.",
        _recorder(store=lambda out: out),
    ),
    (
        "the recorded outputs are copies but still attached to the graph (and keep it alive). "
        "Store `output.detach().clone()`, or run the model under `torch.no_grad()`.",
        _recorder(store=lambda out: out.clone()),
    ),
    (
        "the hooks stay on the model after the function returns, so they fire on every later "
        "forward pass and keep each output alive. Keep the handle that `register_forward_hook` "
        "returns and call `handle.remove()` on each.",
        _no_remove,
    ),
    (
        "your function also removed a hook it had not registered (one the caller had put on "
        "the model). Remove only your own hooks, with the handles `register_forward_hook` "
        "returned.",
        _recorder(clear_all=True),
    ),
    (
        "when the forward pass raises, your hooks stay on the model. Remove them in a "
        "`finally:` block, so that an error cannot leave them behind.",
        _recorder(finally_=False),
    ),
    (
        "the model ran once per layer name. Register every hook first, then run the model "
        "once: with dropout, or any randomness, separate passes would not even agree.",
        _one_pass_per_layer,
    ),
    (
        "the model never ran as a whole. Passing x through its children one by one is not "
        "`model(x)`: a forward may reuse a layer, add a residual or skip a child, and the "
        "model's own hooks never fire. Register forward hooks, then call `model(x)` once.",
        _walk_children,
    ),
]

ACTIVATION_RECORDER = Exercise(
    grade_id=RECORDER,
    function="record_activations",
    reference=ref.record_activations.__wrapped__,
    cases=activation_recorder_cases,
    observe=observe_activation_recorder,
    label=label_activation_recorder,
    mistakes=RECORDER_MISTAKES,
    hint="register one forward hook per name on `model.get_submodule(name)`, call `model(x)` "
    "once, keep `output.detach().clone()` (and return nothing from the hook), and remove every "
    "handle in a `finally:` block.",
)
check_activation_recorder = ACTIVATION_RECORDER.check


# ---------------------------------------------------------------- ch05_to_device


def to_device_cases(thorough: bool = False) -> list[dict]:
    """A loader-style batch moved to meta; thorough: every shape of batch, every device."""
    if not thorough:
        return [{"batch": "loader", "device": META, "seed": 0}]
    seed = grading_seed()
    devices = [META] + [str(d) for d in available_devices()]
    kinds = ["loader", "deep", "leaves", "tensor", "sequences"]
    return [
        {"batch": kind, "device": device, "seed": seed + 10 * i + j}
        for i, device in enumerate(devices)
        for j, kind in enumerate(kinds)
    ]


def _no_assignment(batch, device):
    if isinstance(batch, torch.Tensor):
        batch.to(device)
        return batch
    if isinstance(batch, dict):
        return {k: _no_assignment(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_no_assignment(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_no_assignment(v, device) for v in batch)
    return batch


def _plain_tuples(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _plain_tuples(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_plain_tuples(v, device) for v in batch)
    if isinstance(batch, list):
        return [_plain_tuples(v, device) for v in batch]
    return batch


def _lists_for_tuples(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _lists_for_tuples(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_lists_for_tuples(v, device) for v in batch]
    return batch


def _in_place(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        for k, v in batch.items():
            batch[k] = _in_place(v, device)
        return batch
    if isinstance(batch, list):
        for i, v in enumerate(batch):
            batch[i] = _in_place(v, device)
        return batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_in_place(v, device) for v in batch))
    if isinstance(batch, tuple):
        return tuple(_in_place(v, device) for v in batch)
    return batch


def _detached(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.detach().to(device)
    if isinstance(batch, dict):
        return {k: _detached(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_detached(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_detached(v, device) for v in batch)
    return batch


def _one_level(batch, device):
    move = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v
    if isinstance(batch, dict):
        return {k: move(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move(v) for v in batch)
    return move(batch)


TO_DEVICE_MISTAKES = [
    (
        "`tensor.to(device)` returns a new tensor and leaves the original where it was, so a "
        "bare `batch.to(device)` throws the moved copy away. Return (or assign) its result.",
        _no_assignment,
    ),
    (
        "a named tuple came back as a plain tuple, so the caller can no longer write "
        "`batch.inputs`. Rebuild it with `type(batch)(*items)`: a named tuple takes its "
        "fields as separate arguments.",
        _plain_tuples,
    ),
    (
        "a tuple came back as a list. Rebuild each sequence as its own type: "
        "`type(batch)(...)` (and `type(batch)(*...)` for a named tuple).",
        _lists_for_tuples,
    ),
    (
        "your function changed the caller's batch in place. Build a new dict (or list) "
        "instead of assigning into the one you were given: the caller may still need it where "
        "it was.",
        _in_place,
    ),
    (
        "a tensor that requires grad came back detached from the graph: `.detach()` (or "
        "moving under `torch.no_grad()`) cuts it off, so no gradient would flow back through "
        "the move. Return `tensor.to(device)` as it is: it keeps `requires_grad` and the "
        "graph, as moving a tensor by hand would.",
        _detached,
    ),
    (
        "tensors inside nested containers stayed where they were. Call `to_device` "
        "recursively on every value of a dict, list or tuple, so any depth works.",
        _one_level,
    ),
]

TO_DEVICE_EXERCISE = Exercise(
    grade_id=TO_DEVICE,
    function="to_device",
    reference=ref.to_device.__wrapped__,
    cases=to_device_cases,
    observe=observe_to_device,
    label=label_to_device,
    mistakes=TO_DEVICE_MISTAKES,
    hint="tensors → `tensor.to(device)`; dicts, lists and tuples → the same type with each "
    "item passed through `to_device`; anything else as it is.",
)
check_to_device = TO_DEVICE_EXERCISE.check


# ---------------------------------------------------------------- ch05_decay_groups


def decay_groups_cases(thorough: bool = False) -> list[dict]:
    """The chapter's Sequential; thorough: tied weights, a frozen body, other decays."""
    if not thorough:
        return [{"model": "chapter", "weight_decay": 0.1, "seed": 0}]
    seed = grading_seed()
    return [
        {"model": model, "weight_decay": round(0.01 * (1 + (seed + j) % 9), 2), "seed": seed + j}
        for j, model in enumerate(["chapter", "tied", "frozen"])
    ]


def _split(model, weight_decay, no_decay, params=None, no_decay_group=None):
    """Two groups, with ``no_decay(module, leaf_name)`` deciding; the reference's shape."""
    decay, rest = [], []
    for name, param in params if params is not None else model.named_parameters():
        if not param.requires_grad and params is None:
            continue
        owner, _, leaf = name.rpartition(".")
        (rest if no_decay(model.get_submodule(owner), leaf) else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        no_decay_group if no_decay_group is not None else {"params": rest, "weight_decay": 0.0},
    ]


def _is_norm(module, leaf):
    return leaf == "bias" or isinstance(module, ref.NORM_TYPES)


def _one_group(model, weight_decay):
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": trainable, "weight_decay": weight_decay}]


def _biases_only(model, weight_decay):
    return _split(model, weight_decay, lambda module, leaf: leaf == "bias")


def _frozen_included(model, weight_decay):
    return _split(model, weight_decay, _is_norm, params=list(model.named_parameters()))


def _tied_twice(model, weight_decay):
    named = [(n, p) for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad]
    return _split(model, weight_decay, _is_norm, params=named)


def _no_decay_unset(model, weight_decay):
    groups = _split(model, weight_decay, _is_norm)
    return [groups[0], {"params": groups[1]["params"]}]


DECAY_MISTAKES = [
    (
        "every parameter is in one group with weight decay. Biases and the parameters of "
        "normalisation layers go in a second group with `weight_decay` 0.0.",
        _one_group,
    ),
    (
        "the normalisation layers' weights decay. Decide by the type of the module that holds "
        "each parameter: every parameter of a module that is an instance of `NORM_TYPES` "
        "(BatchNorm, LayerNorm, GroupNorm, …) goes without decay, its weight too.",
        _biases_only,
    ),
    (
        "the no-decay group has no `weight_decay` of its own, so it takes the optimizer's "
        'default, and AdamW\'s default is 0.01, not 0. Set `"weight_decay": 0.0` in that group.',
        _no_decay_unset,
    ),
    (
        "frozen parameters (`requires_grad=False`) are in the groups. Leave them out: the "
        "optimizer has nothing to do with them, and a stale zero `.grad` would let weight "
        "decay move them.",
        _frozen_included,
    ),
    (
        "a tied parameter is listed twice: `named_parameters(remove_duplicate=False)` names "
        "every place it sits, and AdamW warns about a group with duplicate parameters. Use "
        "`model.named_parameters()`, which gives each parameter once.",
        _tied_twice,
    ),
]

DECAY_GROUPS = Exercise(
    grade_id=DECAY,
    function="decay_groups",
    reference=ref.decay_groups.__wrapped__,
    cases=decay_groups_cases,
    observe=observe_decay_groups,
    label=label_decay_groups,
    mistakes=DECAY_MISTAKES,
    hint="walk `model.named_parameters()`, skip frozen ones, put each bias and every "
    "parameter of a `NORM_TYPES` module in the second group, and return "
    '`[{"params": decay, "weight_decay": weight_decay}, '
    '{"params": no_decay, "weight_decay": 0.0}]`.',
)
check_decay_groups = DECAY_GROUPS.check

EXERCISES = [REPAIR_MODEL, ACTIVATION_RECORDER, TO_DEVICE_EXERCISE, DECAY_GROUPS]
