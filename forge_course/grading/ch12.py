"""Checks for chapter 12, "Cheat sheet and capstone": the grader half.

Exercises:
    ch12_smoke_test: ``smoke_test(make_model, make_optimizer, loss_fn, batch, steps=10)
        -> (losses, passed)``, run on working setups and on deliberately broken ones.
    ch12_capstone: ``fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)``,
        examined by the loop doctor and trained on a spiral to a target validation accuracy.
Questions (checked in the notebook with `check_number` / `check_choice`):
    ch12_q_checkpoints, ch12_q_smoke.

The smoke test is compared with the reference loss by loss, so a learner's smoke test must do
one plain update per step. The broken setups are broken *silently*: nothing raises, the loss
just cannot fall (a learning rate of 0, a loss rebuilt from ``loss.item()``, an optimizer whose
``step()`` does nothing), or it rises (a learning rate far too large), or it falls for one step
and then diverges, so that only the last loss against the first tells.

The capstone is judged by facts, not by comparing numbers with the reference: the loop doctor's
finding codes on its own small problem; and on the spiral, how many updates the given optimizer
made (and whether any came with no backward pass since the one before), whether a complete
validation pass (in eval mode, without a graph; of the model or a copy of it) followed every epoch,
and whether the model reaches `TARGET_ACCURACY` within `EPOCHS` epochs. The learner half is
`forge_course.observe.ch12`.
"""

from __future__ import annotations

import random

import torch

from forge_course.device import available_devices, pick_device
from forge_course.grading.core import Exercise, explain, first_difference, grading_seed
from forge_course.observe.ch12 import FIT, SMOKE, label_fit, label_smoke, observe_fit, observe_smoke
from forge_course.observe.common import INSTRUMENT_TAMPERED, Tampered
from forge_course.reference import capstone as ref

# ---------------------------------------------------------------- the smoke test's setups

#: Setups a smoke test must pass (the loss falls) and must fail (it cannot, or it rises).
WORKING = ("sgd_regression", "adam_classifier", "momentum_classifier", "overshoot")
BROKEN = ("lr_zero", "detached_loss", "missing_step", "lr_too_high", "dip_then_diverge")


def smoke_cases(thorough: bool = False) -> list[dict]:
    """Visible: two working setups (one whose loss swings) and four broken ones on the default
    device. Hidden: every setup on every device, other seeds, and other step counts."""
    device = str(pick_device())
    # Three steps of the dip: lower after one, higher than the start at the last: only the
    # last loss against the first tells it failed.
    dip = {"setup": "dip_then_diverge", "device": device, "seed": 0, "steps": 3}
    if not thorough:
        return [
            {"setup": setup, "device": device, "seed": 0, "steps": 10}
            for setup in ("sgd_regression", "overshoot", "lr_zero", "detached_loss",
                          "missing_step")
        ] + [dip]  # fmt: skip
    rng = random.Random(grading_seed())
    return [
        {"setup": setup, "device": str(d), "seed": rng.randrange(10_000), "steps": steps}
        for d in available_devices()
        for setup in WORKING + BROKEN
        for steps in (10, rng.choice((3, 25)))
    ] + [dip]


def _smoke_or_equal(make_model, make_optimizer, loss_fn, batch, steps=10):
    losses, _ = ref.smoke_test.__wrapped__(make_model, make_optimizer, loss_fn, batch, steps)
    return losses, losses[-1] <= losses[0]


def _smoke_ever_lower(make_model, make_optimizer, loss_fn, batch, steps=10):
    losses, _ = ref.smoke_test.__wrapped__(make_model, make_optimizer, loss_fn, batch, steps)
    return losses, min(losses) < losses[0]


def _smoke_against_the_second_loss(make_model, make_optimizer, loss_fn, batch, steps=10):
    losses, _ = ref.smoke_test.__wrapped__(make_model, make_optimizer, loss_fn, batch, steps)
    return losses, losses[-1] < losses[1]


def _smoke_no_zero_grad(make_model, make_optimizer, loss_fn, batch, steps=10):
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, losses[-1] < losses[0]


def _smoke_zero_grad_before_step(make_model, make_optimizer, loss_fn, batch, steps=10):
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        optimizer.zero_grad()
        optimizer.step()
        losses.append(loss.item())
    return losses, losses[-1] < losses[0]


def _smoke_model_per_step(make_model, make_optimizer, loss_fn, batch, steps=10):
    losses = []
    for _ in range(steps):
        model = make_model()
        optimizer = make_optimizer(model.parameters())
        optimizer.zero_grad()
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, losses[-1] < losses[0]


def _smoke_tensors(make_model, make_optimizer, loss_fn, batch, steps=10):
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses, bool(losses[-1] < losses[0])


def _smoke_after_update(make_model, make_optimizer, loss_fn, batch, steps=10):
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss_fn(model(batch[0]), batch[1]).backward()
        optimizer.step()
        with torch.no_grad():
            losses.append(loss_fn(model(batch[0]), batch[1]).item())
    return losses, losses[-1] < losses[0]


SMOKE_MISTAKES = [
    (
        "a loss that stays exactly where it was has not fallen: the verdict must be "
        "`losses[-1] < losses[0]`, strictly lower. With `<=`, a learning rate of 0 or a missing "
        "`step()` passes the smoke test, which is the very bug it is there to catch.",
        _smoke_or_equal,
    ),
    (
        "the verdict must compare the last loss with the first, `losses[-1] < losses[0]`: a "
        "loss that was lower at some point and then exploded (here it fell for one step, then "
        "diverged) has not passed.",
        _smoke_ever_lower,
    ),
    (
        "the verdict must compare the last loss with the first, `losses[-1] < losses[0]`: a "
        "run whose loss falls to 0 in one step and then swings back and forth, each swing "
        "lower, has worked (here momentum carried one weight past its minimum), but compared "
        "with a later loss it seems not to.",
        _smoke_against_the_second_loss,
    ),
    (
        "`optimizer.zero_grad()` is missing from the smoke test's own loop, so from step 2 on "
        "each update uses the sum of all gradients so far. Clear them at the start of each step.",
        _smoke_no_zero_grad,
    ),
    (
        "`optimizer.zero_grad()` sits between `loss.backward()` and `optimizer.step()`, so every "
        "step finds `.grad` empty and the weights never move. Clear the gradients at the start "
        "of each step, before the forward pass.",
        _smoke_zero_grad_before_step,
    ),
    (
        "the model (or the optimizer) is built again inside the loop, so every step starts "
        "from the same fresh weights and the loss can never fall. Build both once, before the "
        "loop.",
        _smoke_model_per_step,
    ),
    (
        "the losses are tensors. Record `loss.item()`: a plain float, which also lets the "
        "graph of each step be freed.",
        _smoke_tensors,
    ),
    (
        "`losses[i]` should be the loss of step i's forward pass, computed *before* its update "
        "(the value `loss.backward()` ran on), not a second forward after `optimizer.step()`.",
        _smoke_after_update,
    ),
]

SMOKE_EXERCISE = Exercise(
    grade_id=SMOKE,
    function="smoke_test",
    reference=ref.smoke_test.__wrapped__,
    cases=smoke_cases,
    observe=observe_smoke,
    label=label_smoke,
    mistakes=SMOKE_MISTAKES,
    hint="build the model and optimizer once; then `steps` times: zero_grad, forward, loss, "
    "backward, step, and append `loss.item()`; passed is `losses[-1] < losses[0]`.",
)
check_smoke_test = SMOKE_EXERCISE.check

# ---------------------------------------------------------------- the capstone

EPOCHS = 30  # epochs `fit` is given on the spiral
TARGET_ACCURACY = 0.85  # validation accuracy the trained model must reach
REACHED = f"validation accuracy ≥ {TARGET_ACCURACY:.0%} after {EPOCHS} epochs"
# The doctor tells validation from training by the loader that yielded the latest batch, so a
# loop that moves its batches to the device once and reuses them looks to it as if it validated
# all the time. The spiral run tells them apart by the examples that go in, and judges these two.
BY_THE_SPIRAL = ("no_eval_mode", "grad_enabled_in_eval")


def fit_cases(thorough: bool = False) -> list[dict]:
    """Visible: the default device, seed 0. Hidden: every device, a seed from the grading run."""
    run = {"epochs": EPOCHS, "target": TARGET_ACCURACY}
    if not thorough:
        return [{"device": str(pick_device()), "seed": 0, **run}]
    rng = random.Random(grading_seed())
    return [{"device": str(d), "seed": rng.randrange(10_000), **run} for d in available_devices()]


def _doctor_judges_the_rest(observed: dict, target: dict, case: dict) -> dict:
    """Leave out the doctor's codes for validation: the spiral run judges those (see above)."""
    findings = observed.get("loop doctor's findings")
    if not isinstance(findings, str) or findings == "none":
        return observed
    kept = [code for code in findings.split(", ") if code not in BY_THE_SPIRAL]
    return {**observed, "loop doctor's findings": ", ".join(kept) or "none"}


def _reference_fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    """The production loop, without early stopping: every epoch runs and is validated."""
    return ref.fit.__wrapped__(model, optimizer, loss_fn, train_loader, val_loader, epochs,
                               device, patience=epochs + 1)  # fmt: skip


def _evaluate(model, loader, loss_fn, device):
    model.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(dim=1) == y).sum().item()
            seen += len(y)
    model.train()
    return correct / seen


def _fit_no_zero_grad(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    # Cleared once per epoch, not per update: it still learns, so only the doctor's code differs.
    model.to(device)
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss_fn(model(x), y).backward()
            optimizer.step()
        _evaluate(model, val_loader, loss_fn, device)
    return model


def _fit_no_eval(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(device))
    return model


def _fit_no_no_grad(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
        for x, _ in val_loader:
            model(x.to(device)).argmax(dim=1)
    return model


def _fit_mode_not_restored(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    model.train()
    for _ in range(epochs):
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(device))
    return model


def _fit_own_optimizer(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        _evaluate(model, val_loader, loss_fn, device)
    return model


def _fit_no_validation(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
    return model


def _fit_zero_grad_before_step(model, optimizer, loss_fn, train_loader, val_loader, epochs,
                               device):  # fmt: skip
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss_fn(model(x), y).backward()
            optimizer.zero_grad()
            optimizer.step()
        _evaluate(model, val_loader, loss_fn, device)
    return model


def _fit_step_twice(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.step()
        _evaluate(model, val_loader, loss_fn, device)
    return model


def _fit_returns_in_the_loop(model, optimizer, loss_fn, train_loader, val_loader, epochs,
                             device):  # fmt: skip
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        _evaluate(model, val_loader, loss_fn, device)
        return model


FIT_MISTAKES = [
    (
        "`missing_zero_grad`: `.grad` still held gradients an earlier update had applied. Call "
        "`optimizer.zero_grad()` once per update, before `loss.backward()`.",
        _fit_no_zero_grad,
    ),
    (
        "`no_eval_mode`: validation ran in train mode, so Dropout kept dropping units. Call "
        "`model.eval()` before the validation loop.",
        _fit_no_eval,
    ),
    (
        "`grad_enabled_in_eval`: validation recorded a graph nobody will use. Wrap the "
        "validation loop in `with torch.no_grad():` (or `torch.inference_mode()`); `model.eval()` "
        "alone does not stop recording.",
        _fit_no_no_grad,
    ),
    (
        "`train_mode_not_restored`: after the first validation, training ran with Dropout off. "
        "Call `model.train()` at the start of every epoch (or restore the mode after validating).",
        _fit_mode_not_restored,
    ),
    (
        "the optimizer `fit` was given never stepped: `fit` built an optimizer of its own. Use "
        "the `optimizer` argument: the caller chose it, and holds on to its state.",
        _fit_own_optimizer,
    ),
    (
        "`fit` never validated: after each epoch's training, run the model over `val_loader` "
        "(in eval mode, under `torch.no_grad()`), and put train mode back for the next epoch.",
        _fit_no_validation,
    ),
    (
        "`optimizer.zero_grad()` sits between `loss.backward()` and `optimizer.step()`: it "
        "clears the gradients backward has just computed, so every step finds none and the "
        "weights never move. Clear them before the forward pass (or after the step).",
        _fit_zero_grad_before_step,
    ),
    (
        "`optimizer.step()` ran twice after one `loss.backward()`: the second step applied the "
        "same gradients again, so every batch made two updates. Call `optimizer.step()` once "
        "per training batch.",
        _fit_step_twice,
    ),
    (
        "`fit` returned after its first epoch: the `return` is indented inside the epoch loop. "
        "Return after the loop, once all `epochs` have run.",
        _fit_returns_in_the_loop,
    ),
]


def _first_wrong_key(observed, want) -> str | None:
    if not (isinstance(observed, dict) and isinstance(want, dict)):
        return None
    return next((k for k in want if first_difference(observed.get(k), want[k]) is not None), None)


class _FirstDifferenceExercise(Exercise):
    """An exercise whose known mistakes are named only when they go wrong first where the answer
    does: the capstone's observations share keys (several mistakes miss the target accuracy),
    so matching on the answer's first differing key alone would name a mistake that differs
    from the reference earlier, somewhere the answer does not."""

    def judge(self, case: dict, got) -> None:
        __tracebackhide__ = True
        for key, value in got.items() if isinstance(got, dict) else ():
            if isinstance(value, str) and value == INSTRUMENT_TAMPERED:
                raise Tampered(self.grade_id, f"Not graded: {key} was {value}.")
        want = self.expected(case)
        prepare = self.prepare or (lambda observation, target, case: observation)
        got = prepare(got, want, case)
        where = _first_wrong_key(got, want)
        known = []
        for i, (message, wrong) in enumerate(self.mistakes):
            try:
                seen = prepare(self._observed(f"mistake {i}", wrong, case), want, case)
            except Exception:  # noqa: BLE001  (a wrong implementation that fails explains nothing)
                continue
            if first_difference(got, seen) is None or _first_wrong_key(seen, want) == where:
                known.append((message, lambda seen=seen: seen))
        explain(self.grade_id, got, want, case=self.label(case), known_mistakes=known,
                hint=self.hint)  # fmt: skip


FIT_EXERCISE = _FirstDifferenceExercise(
    grade_id=FIT,
    function="fit",
    reference=_reference_fit,
    cases=fit_cases,
    observe=observe_fit,
    label=label_fit,
    mistakes=FIT_MISTAKES,
    hint="compare the line above with what the exercise asks: one `optimizer.step()` of the "
    "given optimizer per training batch, `epochs` times over `train_loader`, a full pass over "
    "`val_loader` after each epoch (eval mode, no graph), train mode back for training. Each "
    "loop doctor code is explained in `forge_course.doctor.CODES`.",
    prepare=_doctor_judges_the_rest,
)
check_capstone = FIT_EXERCISE.check

EXERCISES = [SMOKE_EXERCISE, FIT_EXERCISE]
