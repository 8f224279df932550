"""Chapter 05's learner half: build each case's model or batch, call the answer, report.

Every observer can move things to the ``meta`` device: it holds shapes and dtypes but no data,
so on a machine with only a CPU it still shows whether something moved.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict, namedtuple

import numpy as np
import torch
import torch.nn.modules.module as module_internals
from torch import nn

from forge_course.observe import common
from forge_course.observe.ch04 import Settings
from forge_course.observe.common import Mistake, call_answer

META = "meta"
REPAIR, RECORDER, TO_DEVICE = "ch05_repair_model", "ch05_activation_recorder", "ch05_to_device"
DECAY = "ch05_decay_groups"


def _attempt(grade_id: str, name: str, fn, *args, case: str = ""):
    """``(result, None)``, or ``(None, "raises …")`` when the learner's code raised an error.

    An unwritten answer, or one the notebook's tripwire stopped (it called a reference), still
    fails the check at once: those are not facts about the model to compare.
    """
    try:
        return call_answer(grade_id, name, fn, *args, case=case), None
    except Mistake as err:
        cause = err.__cause__
        # `common._translate` is the tripwire's own wording (None in a grading worker).
        if cause is None or common._translate(cause) is not None:
            raise
        return None, f"raises {type(cause).__name__}: {cause}"


# ---------------------------------------------------------------- ch05_repair_model


def label_repair_model(case: dict) -> str:
    return f"MLP({case['sizes']}) on {case['device']}"


def _build_model(fn, case: dict):
    """The learner's model, built under the case's seed (the global generator is left alone)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case["seed"])
        return call_answer(REPAIR, "MLP", fn, list(case["sizes"]), case=label_repair_model(case))


def _fill(model: nn.Module, seed: int) -> None:
    """Give every registered parameter known values, by name, so outputs can be compared."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.copy_(0.5 * torch.randn(param.shape, generator=gen, dtype=param.dtype))


def _output(model: nn.Module, x: torch.Tensor, label: str):
    out, error = _attempt(REPAIR, "model", model, x, case=label)
    if error:
        return error
    return out.detach().clone() if isinstance(out, torch.Tensor) else out


def _gradients(model: nn.Module, x: torch.Tensor, label: str):
    """The gradient of ``mean(model(x)²)`` that reaches each parameter ``parameters()`` lists:
    what an optimizer built from ``model.parameters()`` would use."""
    params = list(model.named_parameters())
    if not params:
        return "none: model.parameters() is empty"
    for _, param in params:
        param.grad = None
    out, error = _attempt(REPAIR, "model", model, x, case=label)
    if error or not isinstance(out, torch.Tensor):
        return error or f"returns a {type(out).__name__}"
    if not out.requires_grad:
        return "none: the output is not computed from the registered parameters"
    out.pow(2).mean().backward()
    return {
        name: p.grad.detach().clone() if p.grad is not None else "None: no gradient reaches it"
        for name, p in params
    }


def observe_repair_model(fn, case: dict) -> dict:
    """Parameters, names, outputs, a move to the case's device and to meta, the gradients."""
    label = label_repair_model(case)
    model = _build_model(fn, case)
    if not isinstance(model, nn.Module):
        return {"what MLP(sizes) builds": f"a {type(model).__name__}, not an nn.Module"}
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    x = torch.randn(5, case["sizes"][0], generator=gen)
    seen = {
        "the number of values in model.parameters()": sum(p.numel() for p in model.parameters()),
        "the names and shapes in model.state_dict()": sorted(
            f"{name} {list(value.shape)}" for name, value in model.state_dict().items()
        ),
    }
    _fill(model, case["seed"])
    seen["the output for a fixed input"] = _output(model, x, label)

    device = torch.device(case["device"])
    _, error = _attempt(REPAIR, "model.to", model.to, device, case=label)
    x = x.to(device)
    seen[f"the output after model.to('{device}')"] = error or _output(model, x, label)
    seen["the gradient of mean(output²) on each parameter"] = _gradients(model, x, label)

    # A second copy goes to the meta device: on any machine, whatever .to() misses stays behind.
    meta_model = _build_model(fn, case)
    _, error = _attempt(REPAIR, "model.to", meta_model.to, META, case=label)
    if error is None:
        out, error = _attempt(
            REPAIR, "model", meta_model, torch.empty(5, case["sizes"][0], device=META), case=label
        )
    seen["the forward pass after model.to('meta')"] = error or (
        f"an output on {out.device}, shape {list(out.shape)}"
        if isinstance(out, torch.Tensor)
        else f"returns a {type(out).__name__}"
    )
    return seen


# ---------------------------------------------------------------- ch05_activation_recorder


class _Nested(nn.Module):
    """A Sequential inside a Sequential inside a model, with an in-place ReLU."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        )
        self.head = nn.Linear(8, 3)
        # The caller keeps one block in eval mode (a frozen block, say): a recorder that ends
        # with `model.train()`, or `model.train(was_training)`, changes it.
        self.encoder[2].eval()

    def forward(self, x):
        return self.head(self.encoder(x))


class _Shared(nn.Module):
    """A residual connection, and one layer that runs twice per forward pass."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.shared = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = torch.relu(self.embed(x))
        h = h + torch.relu(self.shared(h))
        return self.head(self.shared(h))


_RECORDER_MODELS = {
    "sequential": (
        "an nn.Sequential with an in-place ReLU",
        lambda: nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Linear(6, 3)),
    ),
    "nested": ("nested modules", _Nested),
    "shared": ("a residual model that reuses a layer", _Shared),
}


def label_activation_recorder(case: dict) -> str:
    return f"{_RECORDER_MODELS[case['model']][0]}, names {case['names']}, {case['device']}"


def _hooks_left(model: nn.Module) -> str:
    """The forward hooks (and pre-hooks) on each submodule that has any, in words."""
    counts = []
    for name, module in model.named_modules():
        count = len(module._forward_hooks) + len(module._forward_pre_hooks)
        if count:
            counts.append(f"{count} on {repr(name) if name else 'the model itself'}")
    return ", ".join(counts) or "none"


@contextlib.contextmanager
def _global_hooks_taken_away(left: list[int]):
    """Count the global forward hooks the body leaves behind (into ``left``), then remove them.

    A leftover global hook would fire in every later forward pass of every model.
    """
    before = set(module_internals._global_forward_hooks)
    try:
        yield
    finally:
        added = set(module_internals._global_forward_hooks) - before
        for key in added:
            del module_internals._global_forward_hooks[key]
        left.append(len(added))


class _WatchedHooks(OrderedDict):
    """A module's forward hooks, each wrapped to note when it returns a value that replaces the
    module's output (torch passes on whatever a forward hook returns, if it is not None)."""

    def __init__(self, name: str, replaced: set[str]):
        super().__init__()
        self.name, self.replaced = name, replaced

    def __setitem__(self, key, hook):
        def watched(*args):
            result = hook(*args)
            if result is not None and result is not args[-1]:  # the last argument: the output
                self.replaced.add(self.name)
            return result

        super().__setitem__(key, watched)


def _watch_hooks(model: nn.Module) -> set[str]:
    """Watch every submodule's forward hooks; the set fills with the names of those modules
    whose output a hook replaced."""
    replaced: set[str] = set()
    for name, module in model.named_modules():
        module._forward_hooks = _WatchedHooks(name, replaced)
    return replaced


def _left_changed(settings: Settings, label: str, when: str = "") -> None:
    """Raise a `Mistake` naming what the call left changed (the hooks are observed one by one
    below, so they are left out here); grad mode is put back, or every later cell would run
    without autograd."""
    found = [change for change in settings.changed() if not change.startswith("hooks on ")]
    if not found:
        return
    torch.set_grad_enabled(settings.before["grad mode"] == "on")
    shown = "; ".join(found[:4]) + (f"; and {len(found) - 4} more" if len(found) > 4 else "")
    raise Mistake(
        RECORDER,
        f"`record_activations` left something changed behind it{when}: {shown} ({label}).\n"
        "Likely mistake: a recorder only looks. Run the model in the mode the caller left it in "
        "(no `model.eval()` or `model.train()`), and switch autograd off with "
        "`with torch.no_grad():`, which puts grad mode back by itself, even when the forward "
        "pass raises. Whatever else your function switches it must put back as it found it, or "
        "every later cell runs changed (grad mode is put back now).",
    )


def observe_activation_recorder(fn, case: dict) -> dict:
    """What comes back, whether it is detached, how often the model ran, which hooks are left,
    whether a hook replaced a module's output, and what else the call left changed."""
    label = label_activation_recorder(case)
    device = torch.device(case["device"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case["seed"])
        model = _RECORDER_MODELS[case["model"]][1]().to(device)
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    x = torch.randn(5, 4, generator=gen).to(device)
    replaced = _watch_hooks(model)
    runs = []
    # The caller's own hook: it must still be there afterwards, and fire once per call.
    model.register_forward_hook(lambda module, inputs, output: runs.append(1))

    global_left: list[int] = []
    settings = Settings(model, generator=False)
    with _global_hooks_taken_away(global_left):
        names = list(case["names"])
        result = call_answer(RECORDER, "record_activations", fn, model, x, names, case=label)
    _left_changed(settings, label)
    seen = {}
    if not isinstance(result, dict):
        seen["what record_activations returns"] = f"a {type(result).__name__}, not a dict"
        return seen
    seen["the names recorded"] = str(sorted(result))
    seen["the recorded outputs"] = {
        name: value.detach().clone() if isinstance(value, torch.Tensor) else value
        for name, value in result.items()
    }
    attached = [name for name, value in result.items() if getattr(value, "requires_grad", False)]
    seen["the outputs still attached to the autograd graph"] = str(sorted(attached))
    seen["the modules whose output a hook replaced with its return value"] = str(sorted(replaced))
    seen["the number of times the model ran"] = len(runs)
    seen["the forward hooks on the model afterwards"] = _hooks_left(model)
    seen["the global forward hooks left afterwards"] = global_left[0]

    # The same call with an input of the wrong width: the forward pass raises inside the call.
    bad = torch.randn(5, 7, generator=gen).to(device)
    settings = Settings(model, generator=False)
    with _global_hooks_taken_away([]):
        _attempt(RECORDER, "record_activations", fn, model, bad, names, case=label)
    _left_changed(settings, label, " when the forward pass raised")
    seen["the forward hooks left after a forward pass that raised"] = _hooks_left(model)
    return seen


# ---------------------------------------------------------------- ch05_to_device

Pair = namedtuple("Pair", ["inputs", "targets"])


def _batch(kind: str, seed: int):
    """A fresh batch of one of the shapes the cases use, on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    t = lambda *shape: torch.randn(*shape, generator=gen)
    if kind == "loader":
        return {
            "x": t(4, 3),
            "y": torch.randint(0, 2, (4,), generator=gen),
            "pair": Pair(t(2), t(2)),
            "info": {"ids": ["a", "b", "c", "d"], "lengths": (3, 1, 2, 2), "mask": t(4) > 0},
            "step": 7,
            # A tensor in a graph (a learned embedding, say): `.to()` keeps it there.
            "embedding": t(4, 2).requires_grad_(),
        }
    if kind == "deep":
        return [{"a": (t(2), [{"b": (t(1), "leaf", Pair([t(3)], {"c": t(2, 2)}))}])}, None]
    if kind == "leaves":
        return {
            "none": None,
            "empty": [[], (), {}],
            "number": 3.5,
            "text": "hello",
            "array": np.arange(3),
            "half": t(2).half(),
        }
    if kind == "tensor":
        return t(3, 2)
    if kind == "sequences":
        return ([Pair(t(1), 0), Pair(t(1), 1)], (t(2), (t(2),)))
    raise ValueError(kind)


def label_to_device(case: dict) -> str:
    return f"a {case['batch']} batch to {case['device']}"


def _graph_leaves(value) -> list[torch.Tensor]:
    """The tensors in ``value`` (any nesting) that require grad: those a move must keep."""
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _graph_leaves(item)]
    return []


def _reaches(tensor: torch.Tensor, sources: list[torch.Tensor]) -> bool:
    """Whether a backward from ``tensor`` would reach one of ``sources``: it is one, or its
    graph leads to one (walked node by node, so it works on meta tensors too)."""
    if any(tensor is source for source in sources):
        return True
    nodes, seen = [tensor.grad_fn], set()
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if any(getattr(node, "variable", None) is source for source in sources):
            return True
        nodes.extend(next_node for next_node, _ in node.next_functions)
    return False


def _describe(value, path: str, suffix: str, out: dict, sources: list[torch.Tensor]) -> None:
    """One line per container and leaf of ``value``, keyed by where it sits; ``sources`` are
    the tensors passed in that require grad."""
    key = f"{path} {suffix}"
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        text = f"a tensor on {value.device}, {dtype}, shape {list(value.shape)}"
        if value.device.type != META:
            values = torch.round(value.detach().cpu().double(), decimals=4).tolist()
            text += f", values {values}"
        if value.requires_grad:
            text += ", requires grad, " + (
                "in the graph of the tensor passed in"
                if _reaches(value, sources)
                else "cut off from the tensor passed in"
            )
        out[key] = text
    elif isinstance(value, dict):
        out[key] = f"a {type(value).__name__} with keys {list(value)}"
        for k, v in value.items():
            _describe(v, f"{path}[{k!r}]", suffix, out, sources)
    elif isinstance(value, (list, tuple)):
        kind = type(value).__name__
        if hasattr(value, "_fields"):
            kind += " (a named tuple)"
        out[key] = f"a {kind} of {len(value)} items"
        for i, v in enumerate(value):
            _describe(v, f"{path}[{i}]", suffix, out, sources)
    else:
        out[key] = f"the {type(value).__name__} {value!r}"


def observe_to_device(fn, case: dict) -> dict:
    """Every container and leaf of the result, then of the batch passed in (unchanged?)."""
    batch = _batch(case["batch"], case["seed"])
    sources = _graph_leaves(batch)
    label = label_to_device(case)
    try:
        device = torch.device(case["device"])
        result = call_answer(TO_DEVICE, "to_device", fn, batch, device, case=label)
    except Mistake as err:
        if isinstance(err.__cause__, RecursionError):
            raise Mistake(
                TO_DEVICE,
                f"`to_device` never stopped recursing ({label}).\nLikely mistake: a str is a "
                "sequence whose items are strs again, so recursing into every Sequence never "
                "ends. Recurse into dicts, lists and tuples only; keep everything else as is.",
            ) from err
        raise
    seen: dict = {}
    _describe(result, "batch", "in the result", seen, sources)
    _describe(batch, "batch", "as passed in, afterwards", seen, sources)
    return seen


# ---------------------------------------------------------------- ch05_decay_groups


class _TinyLM(nn.Module):
    """An embedding tied to the output layer, a block with a LayerNorm, a final LayerNorm."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(12, 6)
        self.block = nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6), nn.ReLU())
        self.norm = nn.LayerNorm(6)
        self.out = nn.Linear(6, 12, bias=False)
        self.out.weight = self.embed.weight


class _FineTune(nn.Module):
    """A frozen convolutional body (with a GroupNorm), a trainable head with a BatchNorm."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(2, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Conv1d(4, 4, 3, bias=False)
        ).requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))


_DECAY_MODELS = {
    "chapter": (
        "Sequential(Linear, BatchNorm1d, ReLU, Linear)",
        lambda: nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)),
    ),
    "tied": ("a small language model with tied embedding and output weights", _TinyLM),
    "frozen": ("a frozen convolutional body and a trainable head", _FineTune),
}


def label_decay_groups(case: dict) -> str:
    return f"{_DECAY_MODELS[case['model']][0]}, weight_decay={case['weight_decay']}"


def _as_list(params) -> list:
    """A group's ``params`` as torch reads them: one tensor, or any iterable of them."""
    return [params] if isinstance(params, torch.Tensor) else list(params)


def _accepted_by_adamw(groups: list[dict]) -> str:
    """What ``torch.optim.AdamW(groups)`` says: "yes", or its error or warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.optim.AdamW(groups, lr=1e-3)
        except Exception as err:  # noqa: BLE001  (what it raises is the observation)
            return f"no: {type(err).__name__}: {err}"
    if caught:
        return f"it warns: {caught[0].message}"
    return "yes"


def observe_decay_groups(fn, case: dict) -> dict:
    """Each group's parameters (by name, in any order) and decay; whether AdamW takes them."""
    label = label_decay_groups(case)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case["seed"])
        model = _DECAY_MODELS[case["model"]][1]()
    places: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        places.setdefault(id(param), []).append(name)

    groups = call_answer(DECAY, "decay_groups", fn, model, case["weight_decay"], case=label)
    keys = [
        f"group {i}: its {what}" for i in range(2) for what in ("parameters", "weight_decay")
    ] + ["torch.optim.AdamW(groups) accepts them"]
    frozen = "the parameters with requires_grad=False afterwards"
    seen: dict = dict.fromkeys(keys, "not compared: there is no list of groups to look at")
    seen[frozen] = sorted(name for name, p in model.named_parameters() if not p.requires_grad)
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
        return {
            "what decay_groups returns": f"a {type(groups).__name__}, not a list of dicts"
        } | seen
    if not all("params" in g for g in groups):
        return {"what decay_groups returns": "a group without a 'params' key"} | seen
    groups = [{**g, "params": _as_list(g["params"])} for g in groups]
    count = f"{len(groups)} group" + ("" if len(groups) == 1 else "s")
    seen = {"what decay_groups returns": f"a list of {count}"} | {
        **dict.fromkeys(keys, "no such group"),
        frozen: seen[frozen],
    }
    for i, group in enumerate(groups[:2]):
        names = []
        for param in group["params"]:
            where = places.get(id(param))
            names.append(" = ".join(where) if where else "a tensor that is not one of the model's")
        seen[f"group {i}: its parameters"] = sorted(names)  # in any order
        decay = group.get("weight_decay")
        if "weight_decay" not in group:
            decay = "not set: the optimizer's own default applies (AdamW's is 0.01)"
        elif isinstance(decay, (int, float)) and not isinstance(decay, bool):
            decay = float(decay)
        else:
            decay = f"the {type(decay).__name__} {decay!r}"
        seen[f"group {i}: its weight_decay"] = decay
    seen["torch.optim.AdamW(groups) accepts them"] = _accepted_by_adamw(groups)
    return seen
