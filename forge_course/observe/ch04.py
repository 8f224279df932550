"""Chapter 04's learner half: build each case's inputs, call the answer, report plain data.

A training step is judged by what it returns and by the parameters it leaves, and also by what
else it leaves changed behind it: `Settings` notes the process-wide settings a step could leave
switched (grad mode, autocast, the default dtype, torch's global generator...) and the modes,
``requires_grad`` flags and hooks of the model, before and after the call. Later chapters'
observers use it for their own steps.
"""

from __future__ import annotations

import copy
import types

import torch

from forge_course.observe.common import Mistake, alone, call_answer
from forge_course.observe.generator import generator_change, generator_state

GENERATOR = "torch's global generator"


#: The hooks `torch.nn.modules.module.register_module_*_hook` add for every module at once.
_GLOBAL_MODULE_HOOKS = tuple(
    vars(torch.nn.modules.module)[name]
    for name in ("_global_forward_pre_hooks", "_global_forward_hooks",
                 "_global_backward_pre_hooks", "_global_backward_hooks")
    if name in vars(torch.nn.modules.module)
)  # fmt: skip


def _pair(hooks) -> str:
    """The saved-tensor hooks in force, in words (each pair told apart by where it lives)."""
    if hooks is None:
        return "none"
    # Only a plain function's name is read: reading anything of another object could run the
    # answer's code (a property, a metaclass's).
    names = [h.__qualname__ if type(h) is types.FunctionType else "an object" for h in hooks]
    return " and ".join(f"{name} at {id(h):#x}" for name, h in zip(names, hooks, strict=True))


def _modules_of(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``model.named_modules()``, walked through each module's own ``_modules`` dict."""
    found, seen, todo = [], set(), [("", model)]
    while todo:
        name, module = todo.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        found.append((name, module))
        children = vars(module).get("_modules", {}).items()
        todo += reversed([(f"{name}.{k}" if name else k, m) for k, m in children if m is not None])
    return found


class Settings:
    """What a call could leave changed beyond its result, noted before it, compared after it.

    Args:
        model: the module the call receives (its modes, ``requires_grad`` flags and hooks are
            noted), or None.
        generator: whether advancing torch's global generator counts as a change (a step of a
            model whose dropout draws from its own generator draws nothing from it; a load
            that restores it does).
        loss_fn: the loss function the call receives (its attributes, such as ``reduction``,
            ``weight`` or ``ignore_index``, are noted), or None.
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        generator: bool = True,
        loss_fn: object = None,
    ):
        self.model, self.generator, self.loss_fn = model, generator, loss_fn
        self.before = self._now()

    def _now(self) -> dict[str, object]:
        # Process-wide first, by C calls only: a torch function mode the call left on the stack
        # is handed every tensor operation that follows, and could tidy up before it is counted.
        now: dict[str, object] = {
            "torch function modes": torch._C._len_torch_function_stack(),
            "dispatch modes": torch._C._len_torch_dispatch_stack(),
            "grad mode": "on" if torch.is_grad_enabled() else "off",
            "inference mode": torch.is_inference_mode_enabled(),
            "default dtype": str(torch.get_default_dtype()),
            "autocast": [d for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)],
            "anomaly detection": torch.is_anomaly_enabled(),
            "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
            "warnings always shown": torch.is_warn_always_enabled(),
            "hooks on every module": sum(map(len, _GLOBAL_MODULE_HOOKS)),
            "saved-tensor hooks": _pair(torch._C._autograd._top_saved_tensors_default_hooks(False)),
        }
        if self.generator:
            now[GENERATOR] = generator_state(torch.get_rng_state())
        # The model and the loss function are read from their own dicts: no method runs, which
        # the call may have replaced on the object itself.
        for name, module in _modules_of(self.model) if self.model is not None else ():
            where, state = f"model[{name}]" if name else "the model", vars(module)
            now[f"{where}'s mode"] = "train" if state.get("training") else "eval"
            hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")
            now[f"hooks on {where}"] = sum(len(state.get(h, ())) for h in hooks)
            for key, p in state.get("_parameters", {}).items():
                if p is not None:
                    now[f"{where}.{key}.requires_grad"] = p.requires_grad
        loss_fn = self.loss_fn
        for key, value in vars(loss_fn).items() if loss_fn is not None else ():
            if isinstance(value, (str, int, float, bool, type(None))) and key != "training":
                now[f"loss_fn.{key}"] = value
        if isinstance(loss_fn, torch.nn.Module):
            for key, value in vars(loss_fn).get("_buffers", {}).items():
                if value is not None:
                    now[f"loss_fn.{key}"] = value.detach().cpu().tolist()  # a class weight, say
        return now

    def changed(self) -> list[str]:
        """Each setting the call left otherwise than it found it, in words."""
        after, found = self._now(), []
        for name, was in self.before.items():
            now = after.get(name)
            if now != was:
                found.append(
                    f"{name}: {generator_change(was, now)}"
                    if name == GENERATOR
                    else f"{name}: {was} → {now}"
                )
        return found

    def check(self, grade_id: str, what: str, case: str) -> None:
        """Raise a `Mistake` naming what the call left changed, if anything."""
        found = self.changed()
        if found:
            raise Mistake(
                grade_id,
                f"`{what}` left something changed behind it: {'; '.join(found)} ({case}). "
                "Whatever a function switches for its own work (grad mode, autocast, a module's "
                "mode, requires_grad, hooks, the loss function's settings, the default dtype, "
                "the global generator) it must put back as it found it: every later cell would "
                "run changed.",
            )


def _as_floats(value):
    """Nested lists of floats from lists, tuples, NumPy arrays, NumPy scalars or CPU tensors."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_as_floats(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


class GraphRecorder:
    """Counts the tensors autograd saves for a backward while it is entered: any at all means
    the call recorded a graph, whatever turned grad mode back on inside it."""

    def __init__(self):
        self.saved = 0

    def _pack(self, tensor):
        self.saved += 1
        return tensor

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def observe_hand_step(fn, case: dict) -> dict:
    """Call ``fn`` on a fresh copy of the case, with autograd off, and normalise the numbers."""
    args = copy.deepcopy(case)
    # Autograd is switched off: the exercise is to find the gradients by hand. An answer that
    # switches it back on (`torch.enable_grad()`) is caught by what autograd recorded.
    with alone("ch04_hand_step"), torch.no_grad(), GraphRecorder() as graph:
        out = call_answer(
            "ch04_hand_step", "hand_step", fn, args["W"], args["b"], args["x"], args["t"],
            args["lr"],
        )  # fmt: skip
    if graph.saved:
        raise Mistake(
            "ch04_hand_step",
            "`hand_step` used autograd: it switched grad mode back on and recorded a graph "
            f"({graph.saved} tensors saved for a backward). Work the gradients out by hand, in "
            "plain Python or NumPy: dL/dy = 2(y − t)/m, dL/dW = dL/dy ⊗ x, dL/db = dL/dy.",
        )
    if not isinstance(out, dict):
        return {"returned": out}
    return {key: _as_floats(value) for key, value in out.items()}


class OwnDropout(torch.nn.Module):
    """Dropout whose masks come from its own generator, so that a step draws nothing from
    torch's global one: the same masks whatever else the process drew, on every device."""

    def __init__(self, p: float, seed: int):
        super().__init__()
        self.p, self.generator = p, torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        keep = torch.rand(x.shape, generator=self.generator) >= self.p
        return x * keep.to(x) / (1 - self.p)  # x's device and dtype


def halve_output(module, inputs, output):
    """The model's forward hook: it changes the output, so a forward that skips hooks shows."""
    return output * 0.5


def step_model(seed: int, device, dtype) -> torch.nn.Module:
    """A small network that behaves differently in train and eval mode (dropout, batch norm)
    and whose output a forward hook changes, in train mode, on ``device``."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8),
        torch.nn.BatchNorm1d(8),
        torch.nn.Tanh(),
        OwnDropout(0.25, seed),
        torch.nn.Linear(8, 3),
    )
    model.register_forward_hook(halve_output)
    return model.to(device=device, dtype=dtype).train()


def _build(case: dict):
    """A fresh seeded model, optimizer, loss and two batches for a train_step case."""
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    gen = torch.Generator().manual_seed(case["seed"])
    model = step_model(case["seed"], device, dtype)
    params = model.parameters()
    optimizer = {
        "sgd": lambda: torch.optim.SGD(params, lr=0.1),
        "momentum": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        "adam": lambda: torch.optim.Adam(params, lr=0.05),
    }[case["optimizer"]]()
    batches = []
    for size in (5, 3):
        x = torch.randn(size, 4, generator=gen, dtype=dtype)
        if case["loss"] == "mse":
            y = torch.randn(size, 3, generator=gen, dtype=dtype)
        else:
            y = torch.randint(0, 3, (size,), generator=gen)
        batches.append((x.to(device), y.to(device)))
    loss_fn = torch.nn.MSELoss() if case["loss"] == "mse" else torch.nn.CrossEntropyLoss()
    return model, optimizer, loss_fn, batches


def _plain(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def label_train_step(case: dict) -> str:
    return f"{case['device']}, {case['dtype']}, {case['optimizer']}, {case['loss']} loss"


def observe_train_step(fn, case: dict) -> dict:
    """Two calls on two batches; what each returned, every parameter and buffer after each."""
    model, optimizer, loss_fn, batches = _build(case)
    seen = {}
    for call, (x, y) in enumerate(batches, start=1):
        settings = Settings(model, loss_fn=loss_fn)
        returned = call_answer(
            "ch04_train_step", "train_step", fn, model, optimizer, loss_fn, x, y,
            case=label_train_step(case),
        )  # fmt: skip
        # What the call left changed is noted first, before anything here runs torch code.
        settings.check("ch04_train_step", "train_step", label_train_step(case))
        seen[f"the value returned by call {call}"] = _plain(returned)
        seen[f"the parameters after call {call}"] = {
            name: p.detach().clone() for name, p in model.named_parameters()
        }
        # Batch norm's running statistics: a step updates them once, in train mode.
        seen[f"the buffers after call {call}"] = {
            name: b.detach().clone() for name, b in model.named_buffers()
        }
    return seen
