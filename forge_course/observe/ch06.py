"""Chapter 06's learner half: a model and a loader that show what `evaluate` or `predict` did.

Nothing here watches the answer through a hook it could clear, a method it could shadow or a
report it could bend. Each observation builds its model from subclasses of its own layers, made
afresh for that observation, whose ``forward`` notes at every call the facts that decide the
outcome: whether dropout and batch norm ran in train mode (their own ``training`` flag, the one
their arithmetic reads) and whether a linear layer's output joined a graph or is an inference
tensor. ``layer.forward(x)`` runs the same notes as ``layer(x)``, and a copy of the model
shares them. The loader's tensors note whether they met the model's tensors before a
``.to(device)``.

Everything else is read after the call, by this module, from the objects it built: every
module's ``training`` flag, which parameters and buffers changed, ``requires_grad``, ``.grad``,
autograd's grad mode, the loss function's settings, and whether the instruments are intact (the
same classes, methods, submodules, parameters and buffers, and no instance attribute that hides
a method).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.data import DataLoader, TensorDataset, default_collate

from forge_course.observe.common import Mistake, call_answer

EVALUATE, PREDICT = "ch06_evaluate", "ch06_predict"
FEATURES, HIDDEN, CLASSES = 3, 16, 4
META = "meta"
INSTRUMENTS = "the check's instruments afterwards"
_MOVES = (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu)
# The class attributes whose replacement would change what a layer does or what it reports.
_WATCHED_ENTRIES = (
    "forward", "__call__", "_call_impl", "_wrapped_call_impl", "train", "eval", "training",
    "__torch_function__",
)  # fmt: skip

# ---------------------------------------------------------------- instruments


def _instrumented_layers(calls: list) -> dict[str, type]:
    """Linear, BatchNorm1d and Dropout subclasses whose ``forward`` notes each call in ``calls``.

    Linear notes whether its output joined a graph and whether it is an inference tensor;
    dropout and batch norm note their own ``training`` flag.
    """

    def linear_forward(self, x):
        out = nn.Linear.forward(self, x)
        calls.append(("linear", out.requires_grad, out.is_inference()))
        return out

    def mode_forward(base: type):
        def forward(self, x):
            calls.append(("mode", self.training))
            return base.forward(self, x)

        return forward

    layers = {}
    for base, forward in [
        (nn.Linear, linear_forward),
        (nn.BatchNorm1d, mode_forward(nn.BatchNorm1d)),
        (nn.Dropout, mode_forward(nn.Dropout)),
    ]:
        # Named as torch's own, so that printing the model or an error message reads as usual.
        layers[base.__name__] = type(base.__name__, (base,), {"forward": forward})
    return layers


def _arriving(role: str, used: set) -> type:
    """A tensor class for what the loader yields: meeting the model's tensors before a
    ``.to()`` (or ``.cuda()``, ``.cpu()``, a ``device=``) adds ``role`` to ``used``."""

    class Arrived(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            leaves = pytree.tree_leaves((args, kwargs))
            others = any(isinstance(t, torch.Tensor) and not isinstance(t, cls) for t in leaves)
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            moved = func in _MOVES or "device" in kwargs
            if others and not moved:
                used.add(role)
            keep = cls if not (moved or others) else torch.Tensor
            return pytree.tree_map_only(torch.Tensor, lambda t: t.as_subclass(keep), out)

    Arrived.__name__ = Arrived.__qualname__ = "Tensor"
    return Arrived


def _arrival_collate(used: set, roles: tuple[str, ...]):
    """A ``collate_fn`` whose batches note their use (and the tensor classes it uses)."""
    classes = [_arriving(role, used) for role in roles]

    def collate(items):
        return [t.as_subclass(cls) for t, cls in zip(default_collate(items), classes)]

    return collate, classes


def _used_text(used: set, roles: tuple[str, ...]) -> str:
    names = [f"the {role}" for role in roles if role in used]
    return " and ".join(names) or "none"


def _walk(model: nn.Module) -> Iterator[tuple[str, str, object]]:
    """Every submodule, parameter and buffer, read from the module dicts (no method of theirs
    runs, so none can be shadowed): ``(kind, qualified name, object)``."""
    stack = [("", model)]
    while stack:
        prefix, module = stack.pop()
        state = vars(module)
        yield "module", prefix.rstrip(".") or "model", module
        for kind in ("parameter", "buffer"):
            for key, value in state.get(f"_{kind}s", {}).items():
                yield kind, f"{prefix}{key}", value
        stack += [(f"{prefix}{k}.", m) for k, m in reversed(state.get("_modules", {}).items())]


def _inventory(model: nn.Module) -> list[tuple]:
    """The model's submodules and parameters (the objects themselves), and its buffers' names.

    ``model.to()`` and ``model.double()`` keep every module and parameter object, but give a
    buffer a new tensor: what that changes is told by the values, not as tampering.
    """
    return [(kind, name, id(v) if kind != "buffer" else None) for kind, name, v in _walk(model)]


def _tensors(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Every parameter and buffer the model holds now, by qualified name."""
    return {name: v for kind, name, v in _walk(model) if kind != "module"}


def _class_entries(classes) -> dict[tuple, tuple]:
    """For each class and its Module bases: which watched entries it defines, and which objects."""
    entries = {}
    for cls in classes:
        for base in cls.__mro__:
            if issubclass(base, nn.Module) or base is cls:
                for name in _WATCHED_ENTRIES:
                    value = vars(base).get(name)
                    entries[(id(base), name)] = (f"{base.__qualname__}.{name}", id(value))
    return entries


class _Watch:
    """What the observer knows about the objects it built, taken before the learner's call."""

    def __init__(self, model: nn.Module, loss_fn: nn.Module | None, extra_classes=()):
        self.model, self.loss_fn = model, loss_fn
        self.modules = list(model.named_modules())
        self.params = list(model.named_parameters())
        self.classes = {id(m): type(m) for _, m in self.modules}
        self.keys = {id(m): set(vars(m)) for _, m in self.modules}
        self.tree = _inventory(model)
        self.watched_classes = {type(m) for _, m in self.modules} | set(extra_classes)
        self.entries = _class_entries(self.watched_classes)
        self.values = {name: _copy(t) for name, t in _tensors(model).items() if t is not None}

    def instruments(self) -> str:
        """``"intact"``, or what the call changed in the instruments, in words."""
        problems = []
        for name, module in self.modules:
            where = f"model[{name}]" if name else "the model"
            if type(module) is not self.classes[id(module)]:
                problems.append(f"{where} was given another class")
            for key in sorted(set(vars(module)) - self.keys[id(module)]):
                if hasattr(type(module), key):
                    problems.append(f"{where} has an instance attribute `{key}` that hides its "
                                    "class's own")  # fmt: skip
        if _inventory(self.model) != self.tree:
            problems.append("the model holds other submodules, parameters or buffers")
        now = _class_entries(self.watched_classes)
        problems += [f"`{shown}` was replaced" for key, (shown, value) in self.entries.items()
                     if now[key][1] != value]  # fmt: skip
        return "; ".join(problems[:3]) or "intact"

    def modes(self) -> dict[str, str]:
        return {
            f"model[{name}] ({type(m).__name__})" if name else "the model": (
                "train" if m.training else "eval"
            )
            for name, m in self.modules
        }

    def frozen(self) -> str:
        return ", ".join(name for name, p in self.params if not p.requires_grad) or "(none)"

    def changed(self) -> str:
        """The parameters and buffers whose values (or device, dtype, shape) are not as before."""
        now = _tensors(self.model)
        names = [name for name, v in self.values.items() if _differs(now.get(name), v)]
        return ", ".join(names) or "nothing"

    def grads(self) -> dict:
        """Which parameters have no ``.grad``, and the values of the others."""
        return {
            "the parameters whose .grad is None": ", ".join(
                name for name, p in self.params if p.grad is None
            )
            or "(none)",
            "the .grad of each other parameter": {
                name: _plain(p.grad) for name, p in self.params if p.grad is not None
            },
        }

    def loss_settings(self) -> dict:
        if self.loss_fn is None:
            return {}
        settings = {
            key: value
            for key, value in sorted(vars(self.loss_fn).items())
            if type(value) in (str, int, float, bool) and key != "training"
        }
        for key, value in self.loss_fn.named_buffers():  # a class weight
            settings[key] = _plain(value)
        return settings


def _copy(t: torch.Tensor) -> torch.Tensor | None:
    return None if t.device.type == META else t.detach().clone()


def _differs(now: torch.Tensor | None, before: torch.Tensor | None) -> bool:
    if not isinstance(now, torch.Tensor):
        return True
    if before is None:  # on meta there are no values to compare
        return now.device.type != META
    same_kind = (now.device, now.dtype, now.shape) == (before.device, before.dtype, before.shape)
    return not (same_kind and torch.equal(now.detach(), before))


def _plain(value):
    """A learner's value as the grader compares it: tensors stay tensors (a type to correct);
    a tensor on ``meta`` holds no values, so it is described by where it is and its shape."""
    if isinstance(value, torch.Tensor):
        if value.device.type == META:
            dtype = str(value.dtype).removeprefix("torch.")
            return f"a tensor on meta, {dtype}, shape {list(value.shape)}"
        with torch._C.DisableTorchFunctionSubclass():  # a loader's tensor becomes a plain one
            return value.detach().clone().as_subclass(torch.Tensor)
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        return value.item()  # a NumPy scalar
    return float(value) if isinstance(value, float) else value


def _counts(calls: list) -> dict:
    linear = [call for call in calls if call[0] == "linear"]
    return {
        "the forward passes through the model": "some" if linear else "none: its layers never ran",
        "dropout and batch norm calls in train mode": sum(
            1 for call in calls if call[0] == "mode" and call[1]
        ),
        "linear layer calls that recorded a graph": sum(1 for call in linear if call[1]),
    }


@contextmanager
def _seeded(case: dict) -> Iterator[None]:
    """Seed torch for the case, and leave the caller's random state as it was."""
    device = torch.device(case["device"])
    accelerator = device.type in ("cuda", "mps")
    devices = [device.index or 0] if accelerator else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if accelerator else "cuda"):
        torch.manual_seed(case["seed"])
        yield


def _model(case: dict, layers: dict[str, type]) -> nn.Sequential:
    """A small classifier with dropout (and batch norm), in the case's starting mode, with grads.

    Batch norm's running statistics have seen shifted data, so they differ from any batch's own
    statistics; every parameter has a ``.grad`` from one backward, except the last bias, whose
    ``.grad`` is None. Evaluation must change none of it. A ``meta`` model is built on the CPU
    and then moved: it keeps shapes, devices and modes, but no values.
    """
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    build = torch.device("cpu") if device.type == META else device
    linear, norm, dropout = layers["Linear"], layers["BatchNorm1d"], layers["Dropout"]
    parts = [linear(FEATURES, HIDDEN)]
    if case["model"] == "bn_dropout":
        parts.append(norm(HIDDEN))
    parts += [nn.ReLU(), dropout(0.5), linear(HIDDEN, CLASSES)]
    model = nn.Sequential(*parts).to(device=build, dtype=dtype).train()
    with torch.no_grad():
        for _ in range(3):
            model(2 * torch.randn(16, FEATURES, device=build, dtype=dtype) + 1)
    inputs = torch.randn(8, FEATURES, device=build, dtype=dtype)
    targets = torch.randint(0, CLASSES, (8,), device=build)
    nn.functional.cross_entropy(model(inputs), targets).backward()
    model[-1].bias.grad = None
    model.train(case["start"] != "eval")
    if case["start"] == "frozen_bn":
        model[1].eval()  # a batch norm kept frozen while the rest trains, as in fine-tuning
    return model.to(device)


def _start_label(case: dict) -> str:
    if case["start"] == "frozen_bn":
        return "train mode, batch norm frozen in eval"
    return f"{case['start']} mode"


# ---------------------------------------------------------------- ch06_evaluate

IGNORED = -100  # CrossEntropyLoss's default ignore_index, as padding would be
CLASS_WEIGHT = [1.0, 3.0, 0.5, 2.0]

# name -> (how a label shows it, make(class weight tensor) -> the loss)
_LOSSES = {
    "ce": ("", lambda weight: nn.CrossEntropyLoss()),
    "ce_smooth": (", label smoothing 0.1", lambda weight: nn.CrossEntropyLoss(label_smoothing=0.1)),
    "margin": (", MultiMarginLoss", lambda weight: nn.MultiMarginLoss()),
    "ce_weighted": (
        f", CrossEntropyLoss with class weights {CLASS_WEIGHT}",
        lambda weight: nn.CrossEntropyLoss(weight=weight),
    ),
    "ce_ignore": (
        f", targets {IGNORED} (ignored) in the whole first batch and here and there",
        lambda weight: nn.CrossEntropyLoss(),
    ),
    "ce_weighted_ignore": (
        f", class weights {CLASS_WEIGHT}, targets {IGNORED} (ignored) in the whole first batch "
        "and here and there",
        lambda weight: nn.CrossEntropyLoss(weight=weight),
    ),
}


def _ignore_some(targets: torch.Tensor, case: dict, gen: torch.Generator) -> torch.Tensor:
    """Padding, as a sequence model's loader yields it: the first batch is all padding (its
    mean is nan, its sum 0) and about one target in four of the others."""
    if "ignore" not in case["loss"]:
        return targets
    targets = targets.clone()
    targets[torch.rand(targets.shape, generator=gen) < 0.25] = IGNORED
    targets[: case["batch"]] = IGNORED
    return targets


def label_evaluate(case: dict) -> str:
    sizes = [case["batch"]] * (case["n"] // case["batch"])
    sizes += [case["n"] % case["batch"]] if case["n"] % case["batch"] else []
    layers = "Linear–BatchNorm–ReLU–Dropout–Linear" if case["model"] == "bn_dropout" else (
        "Linear–ReLU–Dropout–Linear"
    )  # fmt: skip
    return (
        f"{layers} in {_start_label(case)}; {case['n']} examples in batches of "
        f"{', '.join(map(str, sizes))}{_LOSSES[case['loss']][0]}; {case['device']}, "
        f"{case['dtype']}"
    )


def observe_evaluate(fn, case: dict) -> dict:
    """One call on a fresh model and loader: how the layers ran, the result, what it left."""
    label, calls, used, roles = label_evaluate(case), [], set(), ("inputs", "targets")
    # Grad mode is on while the learner's code runs, and back as it was afterwards, whatever
    # the answer leaves behind (what it left is part of the observation).
    with _seeded(case), torch.enable_grad():
        layers = _instrumented_layers(calls)
        model = _model(case, layers)
        gen = torch.Generator().manual_seed(case["seed"] + 1)
        dtype = getattr(torch, case["dtype"])
        inputs = 1.5 * torch.randn(case["n"], FEATURES, generator=gen, dtype=dtype) + 0.3
        targets = _ignore_some(torch.randint(0, CLASSES, (case["n"],), generator=gen), case, gen)
        collate, arriving = _arrival_collate(used, roles)
        loader = DataLoader(
            TensorDataset(inputs, targets), batch_size=case["batch"], collate_fn=collate
        )
        weight = torch.tensor(CLASS_WEIGHT, dtype=dtype, device=torch.device(case["device"]))
        loss_fn = _LOSSES[case["loss"]][1](weight)
        watch = _Watch(model, loss_fn, [*layers.values(), *arriving])
        calls.clear()
        # Dropout draws from here: a wrong answer that leaves dropout on is reproducible.
        torch.manual_seed(case["seed"] + 2)
        result = call_answer(
            EVALUATE, "evaluate", fn, model, loader, loss_fn, torch.device(case["device"]),
            case=label,
        )  # fmt: skip
        grad_after = torch.is_grad_enabled()
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        shown = repr(result) if len(repr(result)) < 80 else f"a {type(result).__name__}"
        raise Mistake(
            EVALUATE,
            f"`evaluate` should return two numbers, `(mean_loss, accuracy)`, but it returned "
            f"{shown} (case: {label}).",
        )
    return {
        INSTRUMENTS: watch.instruments(),
        **_counts(calls),
        "the batch tensors used before .to(device)": _used_text(used, roles),
        "the mean loss": _plain(result[0]),
        "the accuracy": _plain(result[1]),
        "each module's mode afterwards": watch.modes(),
        "autograd afterwards": "recording" if grad_after else "switched off",
        "the parameters that no longer require grad": watch.frozen(),
        "the loss function's settings afterwards": watch.loss_settings(),
        "what evaluate changed in the model": watch.changed(),
        **watch.grads(),
    }


# ---------------------------------------------------------------- ch06_predict


def label_predict(case: dict) -> str:
    shape = [*case["shape"], FEATURES]
    where = case["device"]
    if where == META:
        where = "meta (a device with shapes but no values: it shows where the result lands)"
    return f"model in {_start_label(case)}, x of shape {shape} on the CPU, model on {where}"


def observe_predict(fn, case: dict) -> dict:
    """One call: how the layers ran, the classes returned, what it left behind."""
    label, calls, used = label_predict(case), [], set()
    with _seeded(case), torch.enable_grad():
        layers = _instrumented_layers(calls)
        model = _model(case, layers)
        gen = torch.Generator().manual_seed(case["seed"] + 1)
        dtype = getattr(torch, case["dtype"])
        x = torch.randn(*case["shape"], FEATURES, generator=gen, dtype=dtype)
        x = x.as_subclass(_arriving("x", used))
        watch = _Watch(model, None, [*layers.values(), type(x)])
        calls.clear()
        torch.manual_seed(case["seed"] + 2)
        try:
            result = call_answer(PREDICT, "predict", fn, model, x, case=label)
        except Mistake as err:
            inner = err.__cause__ or err.__context__
            if case["device"] == META and "meta tensor" in str(inner):
                raise Mistake(
                    PREDICT,
                    f"`predict` read values off the model's device (case: {label}). This case "
                    "runs the model on `meta`, which keeps shapes but no values, to see where "
                    "the classes land: return them on the model's device, where they were "
                    "computed, without `.cpu()`, `.tolist()`, `.numpy()` or `.item()`.",
                ) from err
            raise
        grad_after = torch.is_grad_enabled()
    linear = [call for call in calls if call[0] == "linear"]
    return {
        INSTRUMENTS: watch.instruments(),
        **_counts(calls),
        "linear layer calls outside inference mode": sum(1 for call in linear if not call[2]),
        "the input x used before it was moved to the model's device": (
            "yes" if used else "no"
        ),  # fmt: skip
        "the predicted classes": _plain(result),
        "each module's mode afterwards": watch.modes(),
        "autograd afterwards": "recording" if grad_after else "switched off",
        "the parameters that no longer require grad": watch.frozen(),
        "what predict changed in the model": watch.changed(),
        **watch.grads(),
    }
