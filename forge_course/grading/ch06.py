"""Checks for chapter 06, "The evaluation loop": the grader half.

Exercises:
    ch06_evaluate: ``evaluate(model, loader, loss_fn, device) -> (mean_loss, accuracy)``.
    ch06_predict: ``predict(model, x) -> class indices``.
Questions (checked in the notebook with `check_number` / `check_choice`):
    ch06_q_dropout_value, ch06_q_switch, ch06_q_bn_no_grad.

The learner half, `forge_course.observe.ch06`, builds the model from layers that note how they
ran (dropout and batch norm in train mode or not, a graph recorded or not), hands the answer a
loader whose tensors note whether they were moved, and reads after the call what the answer
left behind: every module's mode, the parameters and buffers, ``requires_grad``, ``.grad``,
grad mode, the loss function's settings, and whether those instruments are intact.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, grading_seed
from forge_course.observe.ch06 import (
    EVALUATE,
    INSTRUMENTS,
    META,
    PREDICT,
    label_evaluate,
    label_predict,
    observe_evaluate,
    observe_predict,
)
from forge_course.observe.common import Tampered
from forge_course.reference import evaluation as ref

# ---------------------------------------------------------------- what the known mistakes share


def _refuse_tampering(grade_id: str, function: str, label):
    """A `prepare` that stops the comparison when the answer changed the check's instruments."""

    def prepare(observation, target, case: dict):
        if (
            isinstance(observation, dict)
            and isinstance(target, dict)
            and observation.get(INSTRUMENTS) != target.get(INSTRUMENTS)
        ):
            what = observation.get(INSTRUMENTS)
            raise Tampered(
                grade_id,
                f"`{function}` tampered with the check's instruments: {what} (case: "
                f"{label(case)}). The check's model is built from layers that note how they "
                "ran, and an answer that rewrites or hides them scores nothing. Leave the "
                "model's classes, methods and submodules as they are.",
            )
        return observation

    return prepare


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

    Visible and thorough: a class-weighted cross-entropy whose first batch is all ignored
    targets, so the mean must be the sums over the total weight of the counted targets.
    Thorough: on every device, with new seeds, a label-smoothed loss and a multi-class margin
    loss (so the loss must come from ``loss_fn``), class weights and ignored targets apart,
    float64, a one-example last batch and a single full batch.
    """
    if not thorough:
        return [
            _evaluate_case(0, "cpu", 0),
            _evaluate_case(1, "cpu", 0, start="eval", n=23, batch=8),
            _evaluate_case(2, "cpu", 0, start="frozen_bn"),
            _evaluate_case(3, "cpu", 0, n=18, batch=5, loss="ce_weighted_ignore"),
        ]
    seed, cases = grading_seed(), []
    for d, device in enumerate(available_devices()):
        wide = "float32" if device.type == "mps" else "float64"  # MPS has no float64
        variants = [
            {"n": 30, "batch": 7, "loss": "margin"},
            {"start": "eval", "n": 23, "batch": 8, "loss": "ce_smooth"},
            {"start": "frozen_bn", "n": 20, "batch": 6},
            {"model": "dropout", "n": 9, "batch": 4, "loss": "ce_smooth", "dtype": wide},
            {"model": "dropout", "start": "eval", "n": 12, "batch": 12},
            {"n": 17, "batch": 4, "loss": "ce_weighted"},
            {"start": "eval", "n": 21, "batch": 6, "loss": "ce_ignore", "dtype": wide},
            {"n": 26, "batch": 8, "loss": "ce_weighted_ignore"},
        ]
        cases += [
            _evaluate_case(10 * d + i, str(device), seed, **variant)
            for i, variant in enumerate(variants)
        ]
    return cases


def _weighted(model, loader, loss_fn, device, per_batch=False, item=True, by_size=False):
    """The loop body the known mistakes share: the whole set's mean (sums over what the loss
    divides by), or the mean of the batch means (``per_batch``), or the batch means weighted by
    the batch size (``by_size``); ``item=False`` keeps tensors."""
    summed = copy.copy(loss_fn)
    summed.reduction = "sum"
    total_loss = total_weight = correct = count = 0
    batch_losses, batch_accuracies = [], []
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        outputs = model(inputs)
        mask, weight = ref.counted(loss_fn, targets)
        if by_size:
            mask, weight = torch.ones_like(mask), torch.tensor(targets.numel())
            loss = loss_fn(outputs, targets) * targets.numel()
        else:
            loss = summed(outputs, targets)
        hits = (outputs.argmax(dim=-1) == targets)[mask].sum()
        batch_losses.append(loss_fn(outputs, targets).item())
        batch_accuracies.append(hits.item() / max(int(mask.sum()), 1))
        total_loss = total_loss + (loss.item() if item else loss.detach())
        total_weight = total_weight + (weight.item() if item else weight)
        correct = correct + (hits.item() if item else hits)
        count += int(mask.sum())
    if per_batch:
        return sum(batch_losses) / len(batch_losses), sum(batch_accuracies) / len(batch_accuracies)
    return total_loss / total_weight, correct / count


def _evaluate_by_batch_size(model, loader, loss_fn, device):
    """Batch means weighted by the batch size, accuracy over every target: right only when
    every example counts once."""
    with _each_module_restored(model), torch.no_grad():
        return _weighted(model, loader, loss_fn, device, by_size=True)


def _evaluate_sums_over_examples(model, loader, loss_fn, device):
    """The sums of reduction="sum", divided by the number of counted targets, unweighted."""
    summed = copy.copy(loss_fn)
    summed.reduction = "sum"
    total = correct = count = 0
    with _each_module_restored(model), torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            mask, _ = ref.counted(loss_fn, targets)
            total += summed(outputs, targets).item()
            correct += (outputs.argmax(dim=-1) == targets)[mask].sum().item()
            count += int(mask.sum())
    return total / count, correct / count


def _evaluate_divisor_from_the_mean(model, loader, loss_fn, device):
    """What each batch's mean divides by, worked out as its sum over its mean."""
    summed = copy.copy(loss_fn)
    summed.reduction = "sum"
    total = divisor = correct = count = 0
    with _each_module_restored(model), torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            mask, _ = ref.counted(loss_fn, targets)
            batch_sum = summed(outputs, targets).item()
            total += batch_sum
            divisor += batch_sum / loss_fn(outputs, targets).item()
            correct += (outputs.argmax(dim=-1) == targets)[mask].sum().item()
            count += int(mask.sum())
    return total / divisor, correct / count


def _evaluate_accuracy_counts_ignored(model, loader, loss_fn, device):
    """The loss right; the accuracy divided by every target, ignored ones included."""
    correct = count = 0
    with _each_module_restored(model), torch.no_grad():
        loss, _ = _weighted(model, loader, loss_fn, device)
        for inputs, targets in loader:
            outputs = model(inputs.to(device))
            correct += (outputs.argmax(dim=-1) == targets.to(device)).sum().item()
            count += targets.numel()
    return loss, correct / count


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
        loss, accuracy = _weighted(model, loader, loss_fn, device, by_size=True)
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


def _evaluate_freezes_parameters(model, loader, loss_fn, device):
    model.requires_grad_(False)
    with _each_module_restored(model), torch.no_grad():
        return _weighted(model, loader, loss_fn, device)


def _evaluate_leaves_grad_off(model, loader, loss_fn, device):
    torch.set_grad_enabled(False)
    with _each_module_restored(model):
        return _weighted(model, loader, loss_fn, device)


def _evaluate_leaves_sum_reduction(model, loader, loss_fn, device):
    loss_fn.reduction = "sum"
    with _each_module_restored(model), torch.no_grad():
        return _weighted(model, loader, loss_fn, device)


def _evaluate_targets_stay(model, loader, loss_fn, device):
    total_loss = correct = count = 0
    with _each_module_restored(model), torch.no_grad():
        for inputs, targets in loader:
            outputs = model(inputs.to(device))
            total_loss += loss_fn(outputs, targets).item() * targets.numel()
            correct += (outputs.argmax(dim=-1) == targets).sum().item()
            count += targets.numel()
    return total_loss / count, correct / count


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

_FROZEN = (
    "the parameters are left with `requires_grad=False`, so the training that follows gets no "
    "gradients and learns nothing (or its `backward()` fails). `with torch.no_grad():` alone "
    "is enough: it records nothing inside the block and changes no parameter."
)
_GRAD_LEFT_OFF = (
    "autograd is still switched off after your function returns. `torch.set_grad_enabled(False)` "
    "lasts until someone switches it back, so the training that follows records no graph and "
    "`loss.backward()` fails. Use `with torch.no_grad():`, which switches recording back on at "
    "the end of the block."
)

EVALUATE_MISTAKES = [
    (_NO_EVAL, _evaluate_no_eval),
    (
        "each batch's mean was weighted by its number of targets. That is right only when "
        "every target counts once in the mean; with class weights a batch's mean divides its "
        "sum by the total `weight[t]` of its targets, and with `ignore_index` it leaves the "
        "ignored ones out (a batch of nothing but ignored targets has a mean of nan). Add the "
        '`reduction="sum"` losses (from a copy of `loss_fn`) and what each batch divides by, '
        "and divide once at the end.",
        _evaluate_by_batch_size,
    ),
    (
        "what each batch's mean divides by was worked out as its sum over its mean. A batch "
        "whose targets are all ignored has a sum of 0 and a mean of nan (0 / 0), so the "
        "result is nan. Work it out from the targets instead: the total `loss_fn.weight[t]` "
        "of the targets `t` that are not `loss_fn.ignore_index`.",
        _evaluate_divisor_from_the_mean,
    ),
    (
        "the sums are divided by the number of targets, but a class-weighted cross-entropy "
        "divides by their total class weight: add `loss_fn.weight[t]` over the counted targets "
        "`t` of every batch and divide the summed loss by that.",
        _evaluate_sums_over_examples,
    ),
    (
        "the accuracy counts the ignored targets (`ignore_index`): they are padding, not "
        "predictions. Count only the targets that are not `loss_fn.ignore_index`, in the "
        "number correct and in the number of targets.",
        _evaluate_accuracy_counts_ignored,
    ),
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
    (_FROZEN, _evaluate_freezes_parameters),
    (_GRAD_LEFT_OFF, _evaluate_leaves_grad_off),
    (
        "`loss_fn.reduction` is left at 'sum': the loss function belongs to the caller, and a "
        "training loop that shares it would now sum its losses instead of averaging them (a "
        "learning rate as many times too big as the batch). Leave it as it is and multiply "
        "each batch's mean by the batch's size (or change a copy: `copy.copy(loss_fn)`).",
        _evaluate_leaves_sum_reduction,
    ),
    (
        "the targets stay where the loader left them: only the inputs are moved. On a GPU, "
        '`loss_fn(outputs, targets)` would raise "Expected all tensors to be on the same '
        'device". Move both: `inputs, targets = inputs.to(device), targets.to(device)`.',
        _evaluate_targets_stay,
    ),
]


def _evaluate_raised(message: str, case: dict) -> str:
    if "index -100 is out of bounds" not in message:
        return ""
    return (
        "a target equal to `ignore_index` (-100) cannot index `loss_fn.weight`: leave the "
        "ignored targets out first, `weight[targets[targets != loss_fn.ignore_index]]`."
    )


EVALUATE_EXERCISE = Exercise(
    grade_id=EVALUATE,
    function="evaluate",
    reference=ref.evaluate.__wrapped__,
    cases=evaluate_cases,
    observe=observe_evaluate,
    label=label_evaluate,
    mistakes=EVALUATE_MISTAKES,
    prepare=_refuse_tampering(EVALUATE, "evaluate", label_evaluate),
    raised_hint=_evaluate_raised,
    hint="eval mode and no_grad around the loop; move the inputs and the targets to device; add "
    'the reduction="sum" loss (of a copy of loss_fn) and what the batch mean divides by (the '
    "class weight of the counted targets), and the number correct of the counted targets; "
    "divide at the end; put each module's mode back as it was.",
)
check_evaluate = EVALUATE_EXERCISE.check


# ---------------------------------------------------------------- ch06_predict


def _predict_case(i: int, device: str, seed: int, **overrides) -> dict:
    case = {"device": device, "model": "bn_dropout", "start": "train", "shape": [6]}
    case |= {"dtype": "float32", "seed": seed + 100 * i}
    return case | overrides


def predict_cases(thorough: bool = False) -> list[dict]:
    """From train mode, from eval mode (inputs ``[B, T, features]``) and with a frozen batch
    norm, on the CPU; and a model on ``meta``, which shows on any machine whether the classes
    come back on the model's device.

    Thorough: on every device, with new seeds, inputs with an extra dimension
    (``[B, T, features]``) and float64.
    """
    on_meta = _predict_case(3, META, 0, shape=[5])
    if not thorough:
        return [
            _predict_case(0, "cpu", 0),
            # inputs with a leading dimension more ([B, T, features]), as the exercise says
            _predict_case(1, "cpu", 0, model="dropout", start="eval", shape=[3, 5]),
            _predict_case(2, "cpu", 0, start="frozen_bn", shape=[4]),
            on_meta,
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
    return [*cases, on_meta]


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


def _predict_freezes_parameters(model, x):
    model.requires_grad_(False)
    with _each_module_restored(model), torch.inference_mode():
        return model(_on_device(model, x)).argmax(dim=-1)


def _predict_x_stays(model, x):
    with _each_module_restored(model), torch.inference_mode():
        return model(x).argmax(dim=-1)


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
    (
        "x is used where it arrived (on the CPU): move it to the model's device first, "
        "`x.to(next(model.parameters()).device)`. On a GPU the forward pass would raise "
        '"Expected all tensors to be on the same device".',
        _predict_x_stays,
    ),
    (_NEVER_RESTORES, _predict_never_restores),
    (_TOP_LEVEL, _predict_top_level_restore),
    (_ALWAYS_TRAIN, _predict_always_train),
    (_FROZEN, _predict_freezes_parameters),
]

PREDICT_EXERCISE = Exercise(
    grade_id=PREDICT,
    function="predict",
    reference=ref.predict.__wrapped__,
    cases=predict_cases,
    observe=observe_predict,
    label=label_predict,
    mistakes=PREDICT_MISTAKES,
    prepare=_refuse_tampering(PREDICT, "predict", label_predict),
    hint="move x to the model's device, then eval mode and inference_mode around one forward; "
    "return outputs.argmax(dim=-1); put every module's mode back.",
)
check_predict = PREDICT_EXERCISE.check

EXERCISES = [EVALUATE_EXERCISE, PREDICT_EXERCISE]
