"""Checks for chapter 08, "Training simulator and arena".

Exercises:
    ch08_fit: ``fit(config, device) -> history``, compared with
        `forge_course.reference.training.fit` run by run.
    ch08_arena_config: ``make_arena_config() -> dict``, a configuration that reaches 90%
        validation accuracy within the 50-step budget, checked by running it in the arena.
Questions:
    ch08_q_steplr_changes, ch08_q_onecycle_where, ch08_q_adam_first_step.
"""

from __future__ import annotations

import itertools
import random
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, TensorDataset

from forge_course.device import available_devices, tolerance
from forge_course.grading.core import (
    Exercise,
    Mistake,
    first_difference,
    grading_seed,
    thorough_requested,
)
from forge_course.observe.ch08 import (
    HISTORY_KEYS,
    STEP_LR,
    VALIDATION_GRAD,
    observe_arena_config,
    observe_fit,
)
from forge_course.observe.common import INSTRUMENT_TAMPERED, Tampered
from forge_course.reference import training as ref
from forge_course.sims import arena
from forge_course.sims.trainer import torch_threads

# ---------------------------------------------------------------- ch08_fit

N_TRAIN = 300  # training points of the spiral track


def _case(device: str, **settings) -> dict:
    return {**ref.DEFAULT_CONFIG, "epochs": 3, **settings, "device": device}


def fit_cases(thorough: bool = False) -> list[dict]:
    """Three short runs on the CPU; thorough: every optimizer with every schedule, every device.

    Every case has a short last batch (so the loss must be weighted), and dropout where eval
    mode has to be seen.
    """
    if not thorough:
        return [
            _case("cpu", optimizer="momentum", lr=0.05, scheduler="step", step_size=1,
                  batch_size=64, dropout=0.2, seed=0),
            _case("cpu", optimizer="adam", lr=0.02, scheduler="onecycle", batch_size=32, seed=1),
            _case("cpu", optimizer="adamw", lr=0.01, weight_decay=0.05, scheduler="cosine",
                  batch_size=128, seed=2),
        ]  # fmt: skip
    seed = grading_seed()
    rng = random.Random(seed)
    lrs = {"sgd": 0.2, "momentum": 0.05, "adam": 0.01, "adamw": 0.02}
    cases = []
    for d, device in enumerate(available_devices()):
        combos = itertools.product(ref.OPTIMIZERS, ref.SCHEDULERS)
        for i, (optimizer, scheduler) in enumerate(combos):
            # AdamW with no decay is Adam: it always decays, or no case tells them apart
            decays = [0.02, 0.05] if optimizer == "adamw" else [0.0, 0.02, 0.05]
            cases.append(
                _case(
                    str(device),
                    optimizer=optimizer,
                    lr=lrs[optimizer] * rng.choice([0.5, 1.0, 2.0]),
                    momentum=rng.choice([0.8, 0.9]),
                    weight_decay=rng.choice(decays),
                    scheduler=scheduler,
                    step_size=rng.choice([1, 2]),
                    gamma=rng.choice([0.3, 0.5]),
                    batch_size=rng.choice([32, 64, 128, 200]),
                    dropout=0.2 if i % 2 == 0 else 0.0,
                    seed=seed + 100 * d + i,
                )
            )
    return cases


def _label(case: dict) -> str:
    batches = ref.steps_per_epoch(N_TRAIN, case["batch_size"])
    last = N_TRAIN - (batches - 1) * case["batch_size"]
    return (
        f"{case['optimizer']}, lr {case['lr']:g}, weight_decay {case['weight_decay']:g}, "
        f"{case['scheduler']} schedule, {case['epochs']} epochs of {batches} batches "
        f"(the last of {last}), dropout {case['dropout']:g}, seed {case['seed']}, {case['device']}"
    )


def _format_problem(history: dict, case: dict) -> str | None:
    """What is wrong with the shape of the history itself, before any number is compared.

    ``history`` is what `observe_fit` made of it: a 1-D tensor per key, or a description.
    """
    wanted = "a dict with the keys 'train_loss', 'val_accuracy' and 'lr'"
    if not isinstance(history, dict) or "returned" in history:
        kind = history.get("returned") if isinstance(history, dict) else type(history).__name__
        return f"`fit` should return {wanted}, but it returned a {kind}."
    missing = [key for key in HISTORY_KEYS if key not in history]
    if missing:
        return f"the history is missing the key(s) {missing}; `fit` should return {wanted}."
    batches = ref.steps_per_epoch(N_TRAIN, case["batch_size"])
    lengths = {
        "train_loss": (case["epochs"], "one per epoch: the mean loss over its examples"),
        "val_accuracy": (case["epochs"], "one per epoch, measured after the epoch"),
        "lr": (
            case["epochs"] * batches,
            f"one per optimizer step ({case['epochs']} epochs × {batches} batches), "
            "the rate each step used",
        ),
    }
    for key, (length, meaning) in lengths.items():
        values = history[key]
        if isinstance(values, dict) and values.get("type") == "tensor" and "entry" in values:
            return (
                f"history[{key!r}][{values['entry']}] is a tensor, not a float: store `.item()`. "
                "A kept loss tensor keeps its autograd nodes alive."
            )
        if isinstance(values, dict) and "entry" in values:
            return (
                f"history[{key!r}][{values['entry']}] should be a float, but it is "
                f"{values.get('value')}."
            )
        if not isinstance(values, torch.Tensor) or values.dim() != 1:
            kind = values.get("type") if isinstance(values, dict) else type(values).__name__
            return f"history[{key!r}] should be a list of floats, but it is a {kind}."
        if len(values) != length:
            return (
                f"history[{key!r}] has {len(values)} entries but should have {length}: {meaning}."
            )
    return None


def _first_disagreement(got: torch.Tensor, want: torch.Tensor) -> int | None:
    """The index of the first entry of ``got`` that differs from ``want``; None if none does."""
    tol = tolerance(want.dtype, want.device)
    close = torch.isclose(got.to(want.device, want.dtype), want, equal_nan=True, **tol).cpu()
    return None if bool(close.all()) else int((~close).int().argmax())


def _scheduler_first(used: torch.Tensor, want_lr: torch.Tensor) -> bool:
    """Whether each step used the rate the reference's next step uses: the schedule moved on
    before its optimizer step, which only a per-batch schedule (one-cycle) shows this way."""
    if len(used) != len(want_lr) or len(used) < 2:
        return False
    return (
        _first_disagreement(used, want_lr) is not None
        and _first_disagreement(used[:-1], want_lr[1:]) is None
    )


def _what_differs(got: dict, want: dict, case: dict) -> str:
    """Which numbers of the history differ, from which step or epoch, and where to look."""
    batches = ref.steps_per_epoch(N_TRAIN, case["batch_size"])
    at = {key: _first_disagreement(got[key], want[key]) for key in HISTORY_KEYS}
    lines = ["What differs from the reference's run:"]
    for key in HISTORY_KEYS:
        i = at[key]
        if i is None:
            lines.append(f"  {key}: the same at every {'step' if key == 'lr' else 'epoch'}.")
            continue
        where = (
            f"step {i + 1} (epoch {i // batches + 1}, batch {i % batches + 1})"
            if key == "lr"
            else f"epoch {i + 1}"
        )
        same = "" if i == 0 else f"the same before {where}; "
        lines.append(
            f"  {key}: {same}at {where} it should be {want[key][i].item():.8g}, "
            f"but it is {got[key][i].item():.8g}."
        )
    graphs = got[VALIDATION_GRAD]
    if graphs:
        lines.append(
            f"  validation: {graphs} forward pass(es) over X_val ran with autograd on, recording "
            "a graph (rule 7: without one; use `torch.no_grad()`)."
        )
    if _scheduler_first(got[STEP_LR], want["lr"]):
        lines.append(
            "Where to look: each `optimizer.step()` used the rate the reference's next step "
            "uses: `scheduler.step()` runs before `optimizer.step()`. Call `optimizer.step()` "
            "first, then `scheduler.step()`."
        )
    else:
        lines.append("Where to look: " + _where_to_look(at))
    return "\n".join(lines)


def _where_to_look(at: dict) -> str:
    """Where the pattern of first differences points, from the rate to the validation."""
    if at["lr"] is not None:
        return (
            "the learning rates differ, so start with the rate: the optimizer's `lr`, the "
            "schedule's arguments, how often `scheduler.step()` runs (once per epoch for step "
            "and cosine, after every `optimizer.step()` for onecycle), and that each rate is read "
            "just before `optimizer.step()`."
        )
    if at["train_loss"] is None:
        return (
            "training matches the reference; only the validation differs: the accuracy on all "
            "of `X_val`, in eval mode, without a graph, as the fraction classified right."
        )
    if at["train_loss"] == 0:
        where = (
            "the rates agree, but epoch 1's training loss already differs: the data, "
            "`make_model(config)`, the batch order (`randperm` from `gen`), the optimizer's other "
            "settings (momentum, weight decay), the loss, and the epoch's mean (over examples)."
        )
    else:
        where = (
            "epoch 1's training loss agrees and a later one does not: look at what changes "
            "between epochs: the mode the model is in when an epoch starts, random numbers drawn "
            "outside the batches (dropout during validation), a new batch order every epoch, "
            "settings whose effect builds up step by step (momentum, weight decay), and how the "
            "epoch's mean weighs its short last batch (early on every batch's loss is about the "
            "same, so a wrong weighting shows only later)."
        )
    if at["val_accuracy"] is None:
        where += (
            " Every validation accuracy agrees: that points at how the epoch's loss is added up "
            "(each batch's mean weighed by its size, divided by the number of examples), or at a "
            "change too small to flip a prediction."
        )
    return where


def flawed_fit(*flaws: str):
    """A `fit` with the named mistakes (keys of `FIT_MISTAKES`); with none, it is the reference."""
    flaws = frozenset(flaws)

    def fit(config, device="cpu"):
        X_train, y_train, X_val, y_val = (t.to(device) for t in ref.spiral_data())
        model = ref.make_model(config).to(device)
        params, name, lr = model.parameters(), config["optimizer"], config["lr"]
        decay = {"weight_decay": config["weight_decay"]}
        if name == "sgd":
            momentum = config["momentum"] if "sgd_with_momentum" in flaws else 0.0
            optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum, **decay)
        elif name == "momentum":
            optimizer = torch.optim.SGD(params, lr=lr, momentum=config["momentum"], **decay)
        elif name == "adam" or "adamw_is_adam" in flaws:
            optimizer = torch.optim.Adam(params, lr=lr, **decay)
        else:
            optimizer = torch.optim.AdamW(
                params, lr=lr, **({} if "adamw_default" in flaws else decay)
            )
        batches = ref.steps_per_epoch(len(X_train), config["batch_size"])
        schedule, sched = config["scheduler"], None
        if schedule == "constant" and "constantlr" in flaws:
            sched = torch.optim.lr_scheduler.ConstantLR(optimizer)
        elif schedule == "step":
            sched = torch.optim.lr_scheduler.StepLR(optimizer, config["step_size"], config["gamma"])
        elif schedule == "cosine":
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config["epochs"])
        elif schedule == "onecycle":
            sched = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=lr, total_steps=config["epochs"] * batches,
                cycle_momentum="cycle_momentum" in flaws,
            )  # fmt: skip
        per_batch = schedule == "onecycle"
        if "onecycle_per_epoch" in flaws or "epoch_schedules_per_batch" in flaws:
            per_batch = "epoch_schedules_per_batch" in flaws
        generator = torch.Generator().manual_seed(config["seed"])
        dataset = TensorDataset(X_train, y_train)
        loader = DataLoader(dataset, config["batch_size"], shuffle=True, generator=generator)
        history, first_order = {"train_loss": [], "val_accuracy": [], "lr": []}, None
        for epoch in range(config["epochs"]):
            if epoch == 0 or "train_mode_once" not in flaws:
                model.train()
            if "dataloader" in flaws:
                pairs = list(loader)
            else:
                if "global_randperm" in flaws:
                    order = torch.randperm(len(X_train))
                elif "same_order" in flaws and first_order is not None:
                    order = first_order
                else:
                    order = torch.randperm(len(X_train), generator=generator)
                first_order = order
                cuts = order.to(device).split(config["batch_size"])
                pairs = [(X_train[cut], y_train[cut]) for cut in cuts]
            total = 0.0
            for x, y in pairs:
                if "no_zero_grad" not in flaws:
                    optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                if "lr_after_step" not in flaws:
                    history["lr"].append(optimizer.param_groups[0]["lr"])
                early = "scheduler_first" in flaws
                if sched is not None and per_batch and early:
                    sched.step()
                optimizer.step()
                if sched is not None and per_batch and not early:
                    sched.step()
                if "lr_after_step" in flaws:
                    history["lr"].append(optimizer.param_groups[0]["lr"])
                total += loss.item() * (1 if "unweighted_loss" in flaws else len(x))
            if sched is not None and not per_batch:
                sched.step()
            history["train_loss"].append(
                total / (len(pairs) if "unweighted_loss" in flaws else len(X_train))
            )
            if "no_eval" not in flaws:
                model.eval()
            with nullcontext() if "validation_graph" in flaws else torch.no_grad():
                predictions = model(X_val).argmax(dim=1)
            history["val_accuracy"].append((predictions == y_val).float().mean().item())
        return history

    return fit


FIT_MISTAKES = {
    "onecycle_per_epoch": (
        "OneCycleLR plans `total_steps` = epochs × batches optimizer updates, so it steps after "
        "every `optimizer.step()`. Stepped once per epoch it never leaves its warm-up."
    ),
    "epoch_schedules_per_batch": (
        "StepLR and CosineAnnealingLR count epochs here (`step_size` and `T_max` are in epochs): "
        "call their `scheduler.step()` once per epoch, after the batch loop, not every batch."
    ),
    "scheduler_first": (
        "`scheduler.step()` runs before `optimizer.step()`, so every step used the rate meant "
        "for the next one (torch warns about this order): the rates you recorded are not the "
        "rates the steps used. Call `optimizer.step()` first, then `scheduler.step()`."
    ),
    "cycle_momentum": (
        "OneCycleLR also cycles the momentum (Adam's beta1) unless you pass "
        "`cycle_momentum=False`; the spec keeps each optimizer's own momentum."
    ),
    "constantlr": (
        "`ConstantLR()` is not a constant learning rate: by default it multiplies the lr by 1/3 "
        "for 5 steps. For 'constant', create no scheduler at all."
    ),
    "lr_after_step": (
        "the lr is recorded after `scheduler.step()`: record `optimizer.param_groups[0]['lr']` "
        "just before `optimizer.step()`, the rate that step used."
    ),
    "adamw_default": (
        "`torch.optim.AdamW` was created without `weight_decay=config['weight_decay']`, so it used "
        "its default of 0.01."
    ),
    "adamw_is_adam": (
        "'adamw' needs `torch.optim.AdamW`: `Adam(weight_decay=...)` adds the decay to the "
        "gradient (L2, then normalised away), AdamW shrinks the weights directly (decoupled)."
    ),
    "sgd_with_momentum": "'sgd' is plain SGD: only 'momentum' uses `config['momentum']`.",
    "no_eval": (
        "validation ran in train mode, so dropout was still dropping units: call `model.eval()` "
        "before the validation forward pass."
    ),
    "validation_graph": (
        "the validation forward pass ran with autograd on, so it recorded a graph that no "
        "backward ever uses (rule 7: without a graph). Run it under `with torch.no_grad():`."
    ),
    "train_mode_once": (
        "after the first validation the model stayed in eval mode, so dropout was off for the "
        "rest of training: call `model.train()` at the start of every epoch."
    ),
    "unweighted_loss": (
        "train_loss is the mean of the batch means, so the short last batch counts as much as a "
        "full one: add `loss.item() * len(batch)` and divide by the number of training examples."
    ),
    "no_zero_grad": (
        "`optimizer.zero_grad()` is missing: `.grad` is the sum of every earlier gradient."
    ),
    "dataloader": (
        "a DataLoader with `shuffle=True` draws an extra number from its generator every epoch, "
        "so its order differs from the spec's: take `torch.randperm(len(X_train), generator=gen)` "
        "each epoch and cut it into batches."
    ),
    "global_randperm": (
        "the order was drawn from torch's global generator: draw it from "
        "`gen = torch.Generator().manual_seed(config['seed'])` (the global one also gives dropout "
        "its masks)."
    ),
    "same_order": "the batches came in the same order every epoch: draw a new order per epoch.",
}


@dataclass(frozen=True)
class FitExercise(Exercise):
    """``fit``'s check: a known mistake is named only when it reproduces the whole history.

    A run is many numbers that depend on each other, so one differing key says little about
    why: an answer with two slips shares its learning rates with one of them and nothing else.
    When no known mistake reproduces the answer's history exactly, the message says which
    numbers differ, from which step or epoch, and where that points.
    """

    def judge(self, case: dict, got) -> None:
        """Raise a `Mistake` unless the history ``got``, observed on ``case``, is the reference's
        (up to rounding)."""
        __tracebackhide__ = True  # IPython and pytest show the learner's frames, not ours
        if isinstance(got, dict) and got.get(VALIDATION_GRAD) == INSTRUMENT_TAMPERED:
            raise Tampered(
                self.grade_id, f"Not graded: the check's hooks were {INSTRUMENT_TAMPERED}."
            )
        want = self.expected(case)
        where = f" (case: {self.label(case)})"
        problem = _format_problem(got, case)
        if problem:
            raise Mistake(self.grade_id, f"{problem}{where}")
        # The rates the steps used only explain a difference: the history and the validation's
        # graph are what is judged.
        diff = first_difference(
            {key: got[key] for key in got if key != STEP_LR},
            {key: want[key] for key in want if key != STEP_LR},
        )
        if diff is None:
            return
        for i, (message, wrong) in enumerate(self.mistakes):
            try:
                theirs = self._observed(f"mistake {i}", wrong, case)
            except Exception:  # noqa: BLE001  (a wrong implementation that fails explains nothing)
                continue
            if first_difference(got, theirs) is None:
                raise Mistake(self.grade_id, f"{diff}{where}.\nLikely mistake: {message}")
        raise Mistake(self.grade_id, f"{diff}{where}.\n{_what_differs(got, want, case)}")


FIT = FitExercise(
    grade_id="ch08_fit",
    function="fit",
    reference=ref.fit.__wrapped__,
    cases=fit_cases,
    observe=observe_fit,
    label=_label,
    mistakes=[(message, flawed_fit(flaw)) for flaw, message in FIT_MISTAKES.items()],
)
check_fit = FIT.check


# ---------------------------------------------------------------- ch08_arena_config


def arena_cases(thorough: bool = False) -> list[dict]:
    """Seed 0; thorough adds two more seeds that change with every grading run."""
    if not thorough:
        return [{"seed": 0}]
    rng = random.Random(grading_seed())
    return [{"seed": 0}, *({"seed": s} for s in rng.sample(range(1, 100_000), 2))]


def _why_not_reached(config: dict, result: arena.ArenaResult) -> str:
    """The likeliest reason a config in the search space missed the target, for the message."""
    full = ref.complete_config(config)
    lr, planned, budget = full["lr"], result.total_steps, arena.BUDGET_STEPS
    if result.seed != 0 and arena.run_arena(config, seed=0).steps_to_target is not None:
        return (
            f"it reaches 90% with seed 0 but not with seed {result.seed}: the config is on the "
            "edge. Pick one that reaches 90% well before its last step on several seeds (try "
            "them with arena.run_arena)."
        )
    if planned < budget // 2:
        return f"the run plans only {planned} steps; the budget allows {budget}."
    if full["optimizer"] in ("sgd", "momentum"):
        return (
            "on this track SGD needs far more than 50 steps at any lr (see the sweep): "
            "try Adam or AdamW."
        )
    if lr > 0.3:
        return f"lr = {lr:g} is too large: Adam's steps overshoot (the right side of the sweep)."
    if lr < 0.005:
        return (
            f"lr = {lr:g} is too small: each Adam step moves a weight by about lr, so {planned} "
            f"steps move it by about {planned * lr:.2g} at most."
        )
    if full["batch_size"] < 100:
        return (
            f"with batch_size {full['batch_size']} each step sees a small, noisy sample: a larger "
            "batch (even all 300 points) makes each of the 50 steps count for more."
        )
    if full["scheduler"] != "constant":
        return (
            f"the {full['scheduler']} schedule keeps the lr low for part of a short run: try "
            "'constant', or a higher lr."
        )
    return "look at the sweep and try a few configs in the arena widget before choosing one."


@dataclass(frozen=True)
class ArenaExercise(Exercise):
    """An exercise judged by running the answer, not by comparing it with a reference."""

    def judge(self, case: dict, got) -> arena.ArenaResult:
        """Raise a `Mistake` unless the config ``got`` is allowed and reaches 90% with the seed."""
        problems = arena.config_problems(got, budget=arena.BUDGET_STEPS)
        if problems:
            raise Mistake(
                self.grade_id,
                "This configuration cannot enter the arena: " + "; ".join(problems) + ".",
            )
        with torch_threads(1):
            result = arena.run_arena(got, seed=case["seed"])
            if result.steps_to_target is None:
                raise Mistake(
                    self.grade_id,
                    f"With seed {case['seed']}, validation accuracy should reach 90% within the "
                    f"run's {result.total_steps} steps, but it reached at most "
                    f"{result.best_accuracy:.0%} (final {result.final_accuracy:.0%}).\n"
                    f"Likely mistake: {_why_not_reached(got, result)}",
                )
        return result

    def check(self, fn, thorough: bool = False) -> list[arena.ArenaResult]:
        """Judge the config on every case's seed; the arena results, one per seed."""
        thorough = thorough or thorough_requested()
        return [self.judged(case, self.observe(fn, case)) for case in self.cases(thorough)]


ARENA_CONFIG = ArenaExercise(
    grade_id="ch08_arena_config",
    function="make_arena_config",
    reference=None,
    cases=arena_cases,
    observe=observe_arena_config,
    label=lambda case: f"seed {case['seed']}",
)
check_arena_config = ARENA_CONFIG.check

EXERCISES = [FIT, ARENA_CONFIG]
