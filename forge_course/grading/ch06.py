"""Checks for chapter 06, "The evaluation loop".

Exercises:
    ch06_evaluate: ``evaluate(model, loader, loss_fn, device) -> (mean_loss, accuracy)``.
    ch06_predict: ``predict(model, x) -> class indices``.
Questions (checked in the notebook with `check_number` / `check_choice`):
    ch06_q_dropout_value, ch06_q_switch, ch06_q_bn_no_grad.

Both exercises are observed the same way. A forward pre-hook on the model's first layer records,
at every forward pass, whether autograd was recording (``torch.is_grad_enabled()``), whether
inference mode was on, and whether any module was in train mode. Afterwards the observation
notes every module's mode and every parameter's ``.grad``, so "no graph", "eval mode" and "the
previous mode restored" are checked as facts, not guessed from the numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils.data import DataLoader, TensorDataset

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, Mistake, call_answer, grading_seed
from forge_course.reference import evaluation as ref

EVALUATE, PREDICT = "ch06_evaluate", "ch06_predict"
FEATURES, HIDDEN, CLASSES = 3, 16, 4

# ---------------------------------------------------------------- models, data, instruments


@contextmanager
def _seeded(case: dict) -> Iterator[None]:
    """Seed torch for the case, and leave the caller's random state as it was."""
    device = torch.device(case["device"])
    accelerator = device.type in ("cuda", "mps")
    devices = [device.index or 0] if accelerator else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if accelerator else "cuda"):
        torch.manual_seed(case["seed"])
        yield


def _model(case: dict) -> torch.nn.Sequential:
    """A small classifier with dropout (and batch norm), in the case's starting mode, with grads.

    Batch norm's running statistics have seen shifted data, so they differ from any batch's own
    statistics; every parameter has a ``.grad`` from one backward, except the last bias, whose
    ``.grad`` is None. Evaluation must change none of it.
    """
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    layers = [torch.nn.Linear(FEATURES, HIDDEN)]
    if case["model"] == "bn_dropout":
        layers.append(torch.nn.BatchNorm1d(HIDDEN))
    layers += [torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(HIDDEN, CLASSES)]
    model = torch.nn.Sequential(*layers).to(device=device, dtype=dtype).train()
    with torch.no_grad():
        for _ in range(3):
            model(2 * torch.randn(16, FEATURES, device=device, dtype=dtype) + 1)
    inputs = torch.randn(8, FEATURES, device=device, dtype=dtype)
    targets = torch.randint(0, CLASSES, (8,), device=device)
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    model[-1].bias.grad = None
    model.train(case["start"] != "eval")
    if case["start"] == "frozen_bn":
        model[1].eval()  # a batch norm kept frozen while the rest trains, as in fine-tuning
    return model


class _Spy:
    """Records the switches that matter at every forward pass through the model."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.calls = model, []
        first = next(m for m in model.modules() if not list(m.children()))
        self.handle = first.register_forward_pre_hook(self._record)

    def _record(self, module, args) -> None:
        self.calls.append(
            {
                "training": any(m.training for m in self.model.modules()),
                "grad": torch.is_grad_enabled(),
                "outside inference mode": not torch.is_inference_mode_enabled(),
            }
        )

    def count(self, key: str) -> int:
        return sum(call[key] for call in self.calls)

    def remove(self) -> None:
        self.handle.remove()


def _modes(model: torch.nn.Module) -> dict[str, str]:
    return {
        f"model[{name}] ({type(m).__name__})" if name else "the model": (
            "train" if m.training else "eval"
        )
        for name, m in model.named_modules()
    }


def _grads(model: torch.nn.Module) -> dict:
    """Which parameters have no ``.grad``, and the values of the others."""
    named = list(model.named_parameters())
    return {
        "the parameters whose .grad is None": ", ".join(name for name, p in named if p.grad is None)
        or "(none)",
        "the .grad of each other parameter": {
            name: p.grad.detach().clone() for name, p in named if p.grad is not None
        },
    }


def _plain(value):
    """A learner's number as the grader compares it: tensors stay tensors (a type to correct)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        return value.item()  # a NumPy scalar
    return float(value) if isinstance(value, float) else value


@contextmanager
def _each_module_restored(model: torch.nn.Module) -> Iterator[None]:
    """What a correct answer does around its forward passes (used by the known mistakes)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


# ---------------------------------------------------------------- ch06_evaluate


def _evaluate_case(i: int, device: str, seed: int, **overrides) -> dict:
    case = {"device": device, "model": "bn_dropout", "start": "train", "n": 10, "batch": 4}
    case |= {"loss": "ce", "dtype": "float32", "seed": seed + 100 * i}
    return case | overrides


def evaluate_cases(thorough: bool = False) -> list[dict]:
    """From train mode, from eval mode, with a frozen batch norm; uneven last batches.

    Thorough: on every device, with new seeds, a label-smoothed loss (so the loss must come
    from ``loss_fn``), float64, a one-example last batch and a single full batch.
    """
    if not thorough:
        return [
            _evaluate_case(0, "cpu", 0),
            _evaluate_case(1, "cpu", 0, start="eval", n=23, batch=8),
            _evaluate_case(2, "cpu", 0, start="frozen_bn"),
        ]
    seed, cases = grading_seed(), []
    for d, device in enumerate(available_devices()):
        wide = "float32" if device.type == "mps" else "float64"  # MPS has no float64
        variants = [
            {"n": 30, "batch": 7},
            {"start": "eval", "n": 23, "batch": 8, "loss": "ce_smooth"},
            {"start": "frozen_bn", "n": 20, "batch": 6},
            {"model": "dropout", "n": 9, "batch": 4, "loss": "ce_smooth", "dtype": wide},
            {"model": "dropout", "start": "eval", "n": 12, "batch": 12},
        ]
        cases += [
            _evaluate_case(10 * d + i, str(device), seed, **variant)
            for i, variant in enumerate(variants)
        ]
    return cases


def _evaluate_label(case: dict) -> str:
    sizes = [case["batch"]] * (case["n"] // case["batch"])
    sizes += [case["n"] % case["batch"]] if case["n"] % case["batch"] else []
    layers = "Linear–BatchNorm–ReLU–Dropout–Linear" if case["model"] == "bn_dropout" else (
        "Linear–ReLU–Dropout–Linear"
    )  # fmt: skip
    start = "train mode, batch norm frozen in eval" if case["start"] == "frozen_bn" else (
        f"{case['start']} mode"
    )  # fmt: skip
    smooth = ", label smoothing 0.1" if case["loss"] == "ce_smooth" else ""
    return (
        f"{layers} in {start}; {case['n']} examples in batches of "
        f"{', '.join(map(str, sizes))}{smooth}; {case['device']}, {case['dtype']}"
    )


def _build_evaluate(case: dict):
    model = _model(case)
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    dtype = getattr(torch, case["dtype"])
    inputs = 1.5 * torch.randn(case["n"], FEATURES, generator=gen, dtype=dtype) + 0.3
    targets = torch.randint(0, CLASSES, (case["n"],), generator=gen)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=case["batch"])
    smoothing = 0.1 if case["loss"] == "ce_smooth" else 0.0
    return model, loader, torch.nn.CrossEntropyLoss(label_smoothing=smoothing)


def observe_evaluate(fn, case: dict) -> dict:
    """One call on a fresh model and loader: the switches at each forward, the result, after."""
    with _seeded(case):
        model, loader, loss_fn = _build_evaluate(case)
        # Dropout draws from here: a wrong answer that leaves dropout on is reproducible.
        torch.manual_seed(case["seed"] + 2)
        spy = _Spy(model)
        try:
            result = call_answer(
                EVALUATE, "evaluate", fn, model, loader, loss_fn, torch.device(case["device"]),
                case=_evaluate_label(case),
            )  # fmt: skip
        finally:
            spy.remove()
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        shown = repr(result) if len(repr(result)) < 80 else f"a {type(result).__name__}"
        raise Mistake(
            EVALUATE,
            f"`evaluate` should return two numbers, `(mean_loss, accuracy)`, but it returned "
            f"{shown} (case: {_evaluate_label(case)}).",
        )
    return {
        "forward passes in train mode": spy.count("training"),
        "forward passes that recorded a graph": spy.count("grad"),
        "the mean loss": _plain(result[0]),
        "the accuracy": _plain(result[1]),
        "each module's mode afterwards": _modes(model),
        **_grads(model),
    }


def _weighted(model, loader, loss_fn, device, per_batch=False, item=True):
    """The loop body the known mistakes share: sums weighted by batch size, or batch means."""
    total_loss = correct = count = 0
    batch_losses, batch_accuracies = [], []
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        hits = (outputs.argmax(dim=-1) == targets).sum()
        n = targets.numel()
        batch_losses.append(loss.item())
        batch_accuracies.append(hits.item() / n)
        total_loss = total_loss + (loss.item() if item else loss.detach()) * n
        correct = correct + (hits.item() if item else hits)
        count += n
    if per_batch:
        return sum(batch_losses) / len(batch_losses), sum(batch_accuracies) / len(batch_accuracies)
    return total_loss / count, correct / count


def _evaluate_no_eval(model, loader, loss_fn, device):
    with torch.no_grad():
        return _weighted(model, loader, loss_fn, device)


def _evaluate_no_no_grad(model, loader, loss_fn, device):
    with _each_module_restored(model):
        return _weighted(model, loader, loss_fn, device)


def _evaluate_batch_means(model, loader, loss_fn, device):
    with _each_module_restored(model), torch.no_grad():
        return _weighted(model, loader, loss_fn, device, per_batch=True)


def _evaluate_over_batches(model, loader, loss_fn, device):
    with _each_module_restored(model), torch.no_grad():
        loss, accuracy = _weighted(model, loader, loss_fn, device)
    count, batches = len(loader.dataset), len(loader)
    return loss * count / batches, accuracy * count / batches


def _evaluate_percent(model, loader, loss_fn, device):
    with _each_module_restored(model), torch.no_grad():
        loss, accuracy = _weighted(model, loader, loss_fn, device)
    return loss, 100 * accuracy


def _evaluate_never_restores(model, loader, loss_fn, device):
    model.eval()
    with torch.no_grad():
        return _weighted(model, loader, loss_fn, device)


def _evaluate_top_level_restore(model, loader, loss_fn, device):
    was_training = model.training
    model.eval()
    with torch.no_grad():
        result = _weighted(model, loader, loss_fn, device)
    model.train(was_training)
    return result


def _evaluate_always_train(model, loader, loss_fn, device):
    model.eval()
    with torch.no_grad():
        result = _weighted(model, loader, loss_fn, device)
    model.train()
    return result


def _evaluate_tensors(model, loader, loss_fn, device):
    with _each_module_restored(model), torch.no_grad():
        return _weighted(model, loader, loss_fn, device, item=False)


def _evaluate_zero_grad(model, loader, loss_fn, device):
    model.zero_grad()
    with _each_module_restored(model), torch.no_grad():
        return _weighted(model, loader, loss_fn, device)


# Messages shared by both exercises.
_NO_EVAL = (
    "the model stayed in train mode during the forward passes. Call `model.eval()` first: in "
    "train mode dropout zeroes a random half of the units and batch norm normalises with each "
    "batch's own statistics (and updates its running ones), so every evaluation differs."
)
_TOP_LEVEL = (
    "`model.train(was_training)` gives every module the top-level flag, so a submodule that was "
    "in eval mode before (here a frozen batch norm) comes back in train mode. Remember each "
    "module's own flag, `{m: m.training for m in model.modules()}`, and set each one back."
)
_ALWAYS_TRAIN = (
    "after evaluation the model is put in train mode even though it was in eval mode before. "
    "Calling `model.train()` at the end breaks a model that was being served, or a frozen batch "
    "norm: remember each module's `training` flag before `model.eval()` and restore it."
)
_NEVER_RESTORES = (
    "the model is left in eval mode. A training loop that calls `evaluate` between epochs would "
    "go on training without dropout: restore each module's previous mode before returning."
)
_ZERO_GRAD = (
    "evaluation changed `.grad`. Evaluating must leave gradients alone (they belong to the "
    "training loop, which may be between accumulation steps): remove `zero_grad()`."
)

EVALUATE_MISTAKES = [
    (_NO_EVAL, _evaluate_no_eval),
    (
        "autograd recorded a graph at every forward pass. `model.eval()` does not switch "
        "recording off: wrap the loop in `with torch.no_grad():` (or `torch.inference_mode()`).",
        _evaluate_no_no_grad,
    ),
    (
        "this is the mean of the batch means (or of the batch accuracies). The last batch is "
        "smaller, so weigh each batch's mean by its size: add `loss.item() * n` and the number "
        "correct, then divide both by the number of examples.",
        _evaluate_batch_means,
    ),
    (
        "the sums over examples are divided by the number of batches. Divide the weighted loss "
        "and the number correct by the number of examples.",
        _evaluate_over_batches,
    ),
    (
        "the accuracy should be a fraction between 0 and 1 (correct / count), not a percentage.",
        _evaluate_percent,
    ),
    (_NEVER_RESTORES, _evaluate_never_restores),
    (_TOP_LEVEL, _evaluate_top_level_restore),
    (_ALWAYS_TRAIN, _evaluate_always_train),
    (
        "return Python floats: `.item()` turns a one-element tensor into a number. A tensor "
        "kept in a history list keeps its device memory alive (and its graph, if it has one).",
        _evaluate_tensors,
    ),
    (_ZERO_GRAD, _evaluate_zero_grad),
]

EVALUATE_EXERCISE = Exercise(
    grade_id=EVALUATE,
    function="evaluate",
    reference=ref.evaluate.__wrapped__,
    cases=evaluate_cases,
    observe=observe_evaluate,
    label=_evaluate_label,
    mistakes=EVALUATE_MISTAKES,
    hint="eval mode and no_grad around the loop; add loss.item() * n and the number correct per "
    "batch; divide by the number of examples; put every module's mode back.",
)
check_evaluate = EVALUATE_EXERCISE.check


# ---------------------------------------------------------------- ch06_predict


def _predict_case(i: int, device: str, seed: int, **overrides) -> dict:
    case = {"device": device, "model": "bn_dropout", "start": "train", "shape": [6]}
    case |= {"dtype": "float32", "seed": seed + 100 * i}
    return case | overrides


def predict_cases(thorough: bool = False) -> list[dict]:
    """From train mode, from eval mode and with a frozen batch norm, on the CPU.

    Thorough: on every device, with new seeds, inputs with an extra dimension
    (``[B, T, features]``) and float64.
    """
    if not thorough:
        return [
            _predict_case(0, "cpu", 0),
            _predict_case(1, "cpu", 0, model="dropout", start="eval", shape=[5]),
            _predict_case(2, "cpu", 0, start="frozen_bn", shape=[4]),
        ]
    seed, cases = grading_seed(), []
    for d, device in enumerate(available_devices()):
        wide = "float32" if device.type == "mps" else "float64"
        variants = [
            {"shape": [7]},
            {"model": "dropout", "start": "eval", "shape": [3, 5]},
            {"start": "frozen_bn", "shape": [4]},
            {"model": "dropout", "shape": [2, 3], "dtype": wide},
        ]
        cases += [
            _predict_case(10 * d + i, str(device), seed, **variant)
            for i, variant in enumerate(variants)
        ]
    return cases


def _predict_label(case: dict) -> str:
    start = "train mode, batch norm frozen in eval" if case["start"] == "frozen_bn" else (
        f"{case['start']} mode"
    )  # fmt: skip
    shape = [*case["shape"], FEATURES]
    return f"model in {start}, x of shape {shape} on the CPU, model on {case['device']}"


def observe_predict(fn, case: dict) -> dict:
    """One call: the switches at the forward pass, the classes returned, what it left behind."""
    with _seeded(case):
        model = _model(case)
        gen = torch.Generator().manual_seed(case["seed"] + 1)
        x = torch.randn(
            *case["shape"], FEATURES, generator=gen, dtype=getattr(torch, case["dtype"])
        )
        torch.manual_seed(case["seed"] + 2)
        spy = _Spy(model)
        try:
            result = call_answer(PREDICT, "predict", fn, model, x, case=_predict_label(case))
        finally:
            spy.remove()
    return {
        "forward passes in train mode": spy.count("training"),
        "forward passes that recorded a graph": spy.count("grad"),
        "forward passes outside inference mode": spy.count("outside inference mode"),
        "the predicted classes": _plain(result),
        "each module's mode afterwards": _modes(model),
        **_grads(model),
    }


def _on_device(model, x):
    return x.to(next(model.parameters()).device)


def _predict_no_eval(model, x):
    with torch.inference_mode():
        return model(_on_device(model, x)).argmax(dim=-1)


def _predict_no_context(model, x):
    with _each_module_restored(model):
        return model(_on_device(model, x)).argmax(dim=-1)


def _predict_no_grad(model, x):
    with _each_module_restored(model), torch.no_grad():
        return model(_on_device(model, x)).argmax(dim=-1)


def _predict_scores(model, x):
    with _each_module_restored(model), torch.inference_mode():
        return model(_on_device(model, x))


def _predict_dim_1(model, x):
    with _each_module_restored(model), torch.inference_mode():
        return model(_on_device(model, x)).argmax(dim=1)


def _predict_top_level_restore(model, x):
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        classes = model(_on_device(model, x)).argmax(dim=-1)
    model.train(was_training)
    return classes


def _predict_always_train(model, x):
    model.eval()
    with torch.inference_mode():
        classes = model(_on_device(model, x)).argmax(dim=-1)
    model.train()
    return classes


def _predict_never_restores(model, x):
    model.eval()
    with torch.inference_mode():
        return model(_on_device(model, x)).argmax(dim=-1)


PREDICT_MISTAKES = [
    (_NO_EVAL, _predict_no_eval),
    (
        "autograd recorded a graph: `model.eval()` changes layers, not recording. Run the "
        "forward pass inside `with torch.inference_mode():`.",
        _predict_no_context,
    ),
    (
        "the forward ran under `torch.no_grad()`. That records no graph either, but the "
        "exercise asks for `torch.inference_mode()`: its outputs can never join a graph later, "
        "which is the promise a prediction helper makes, and it skips a little more bookkeeping.",
        _predict_no_grad,
    ),
    (
        "this returns the model's scores, one per class. Return the class indices: "
        "`outputs.argmax(dim=-1)`.",
        _predict_scores,
    ),
    (
        "the classes are the argmax over the *last* dimension (`dim=-1`), where the class "
        "scores are; with an input of shape [B, T, features], `dim=1` picks over T instead.",
        _predict_dim_1,
    ),
    (_NEVER_RESTORES, _predict_never_restores),
    (_TOP_LEVEL, _predict_top_level_restore),
    (_ALWAYS_TRAIN, _predict_always_train),
]

PREDICT_EXERCISE = Exercise(
    grade_id=PREDICT,
    function="predict",
    reference=ref.predict.__wrapped__,
    cases=predict_cases,
    observe=observe_predict,
    label=_predict_label,
    mistakes=PREDICT_MISTAKES,
    hint="move x to the model's device, then eval mode and inference_mode around one forward; "
    "return outputs.argmax(dim=-1); put every module's mode back.",
)
check_predict = PREDICT_EXERCISE.check

EXERCISES = [EVALUATE_EXERCISE, PREDICT_EXERCISE]
