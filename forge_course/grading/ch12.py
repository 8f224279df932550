"""Checks for chapter 12, "Cheat sheet and capstone".

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
``step()`` does nothing), or it rises (a learning rate far too large).

The capstone is judged by facts, not by comparing numbers with the reference: the loop doctor's
finding codes on its own small problem, and whether the model ``fit`` trained reaches
`TARGET_ACCURACY` on the spiral's validation set within `EPOCHS` epochs.
"""

from __future__ import annotations

import random

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from forge_course.data import make_spiral, train_val_split
from forge_course.device import available_devices, pick_device
from forge_course.doctor import diagnose
from forge_course.grading.core import Exercise, Mistake, call_answer, grading_seed
from forge_course.reference import capstone as ref
from forge_course.reference.guard import is_reference, learner_code

SMOKE, FIT = "ch12_smoke_test", "ch12_capstone"

# ---------------------------------------------------------------- the smoke test's setups

#: Setups a smoke test must pass (the loss falls) and must fail (it cannot, or it rises).
WORKING = ("sgd_regression", "adam_classifier", "momentum_classifier")
BROKEN = ("lr_zero", "detached_loss", "missing_step", "lr_too_high")


class _NoStep(torch.optim.SGD):
    """An optimizer whose `step` does nothing: the loop behaves as if `step()` were missing."""

    def step(self, closure=None):
        return None


def _rebuilt_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The right value in a new leaf tensor: backward reaches no parameter (the detached loss)."""
    value = nn.functional.mse_loss(outputs, targets).item()
    return torch.tensor(value, device=outputs.device, requires_grad=True)


def _setup(case: dict):
    """``(make_model, make_optimizer, loss_fn, batch)`` for a case; the batch is fixed."""
    device, seed = torch.device(case["device"]), case["seed"]
    gen = torch.Generator().manual_seed(seed)
    classify = case["setup"] in ("adam_classifier", "momentum_classifier")
    x = torch.randn(16, 4, generator=gen)
    if classify:
        y = torch.randint(0, 3, (16,), generator=gen)
        loss_fn = nn.CrossEntropyLoss()
    else:
        y = x @ torch.randn(4, 1, generator=gen) + 0.1 * torch.randn(16, 1, generator=gen)
        loss_fn = _rebuilt_loss if case["setup"] == "detached_loss" else nn.MSELoss()

    def make_model():
        torch.manual_seed(seed)
        if case["setup"] == "lr_too_high":
            return nn.Linear(4, 1).to(device)
        out = 3 if classify else 1
        return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, out)).to(device)

    def make_optimizer(params):
        setup = case["setup"]
        if setup == "adam_classifier":
            return torch.optim.Adam(params, lr=0.01)
        if setup == "momentum_classifier":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9)
        if setup == "missing_step":
            return _NoStep(params, lr=0.1)
        lr = {"lr_zero": 0.0, "lr_too_high": 5.0}.get(setup, 0.1)
        return torch.optim.SGD(params, lr=lr)

    return make_model, make_optimizer, loss_fn, (x.to(device), y.to(device))


def smoke_cases(thorough: bool = False) -> list[dict]:
    """Visible: one working and three broken setups on the default device. Hidden: every setup
    on every device, other seeds, and other step counts."""
    device = str(pick_device())
    if not thorough:
        return [
            {"setup": setup, "device": device, "seed": 0, "steps": 10}
            for setup in ("sgd_regression", "lr_zero", "detached_loss", "missing_step")
        ]
    rng = random.Random(grading_seed())
    return [
        {"setup": setup, "device": str(d), "seed": rng.randrange(10_000), "steps": steps}
        for d in available_devices()
        for setup in WORKING + BROKEN
        for steps in (10, rng.choice((3, 25)))
    ]


def _smoke_label(case: dict) -> str:
    return f"setup {case['setup']!r}, {case['steps']} steps, on {case['device']}"


def observe_smoke(fn, case: dict) -> dict:
    """Run ``fn`` on the case's setup; return its losses and its verdict."""
    make_model, make_optimizer, loss_fn, batch = _setup(case)
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        result = call_answer(
            SMOKE, "smoke_test", fn, make_model, make_optimizer, loss_fn, batch,
            steps=case["steps"], case=_smoke_label(case),
        )  # fmt: skip
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise Mistake(
            SMOKE,
            f"`smoke_test` should return two things, `(losses, passed)`; it returned {result!r}.",
        )
    losses, passed = result
    return {"losses": list(losses) if isinstance(losses, tuple) else losses, "passed": passed}


def _smoke_or_equal(make_model, make_optimizer, loss_fn, batch, steps=10):
    losses, _ = ref.smoke_test.__wrapped__(make_model, make_optimizer, loss_fn, batch, steps)
    return losses, losses[-1] <= losses[0]


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
        "`optimizer.zero_grad()` is missing from the smoke test's own loop, so from step 2 on "
        "each update uses the sum of all gradients so far. Clear them at the start of each step.",
        _smoke_no_zero_grad,
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
    label=_smoke_label,
    mistakes=SMOKE_MISTAKES,
    hint="build the model and optimizer once; then `steps` times: zero_grad, forward, loss, "
    "backward, step, and append `loss.item()`; passed is `losses[-1] < losses[0]`.",
)
check_smoke_test = SMOKE_EXERCISE.check

# ---------------------------------------------------------------- the capstone

EPOCHS = 30  # epochs `fit` is given on the spiral
TARGET_ACCURACY = 0.85  # validation accuracy the trained model must reach
REACHED = f"validation accuracy ≥ {TARGET_ACCURACY:.0%} after {EPOCHS} epochs"


def spiral_problem(seed: int):
    """The capstone's spiral: ``(model, optimizer, loss_fn, train_loader, val_loader, X_val,
    y_val)``, everything built from ``seed``; the model is on the CPU, as the doctor hands it."""
    X, y = make_spiral(n_per_class=200, classes=2, noise=0.2, seed=seed)
    X_train, y_train, X_val, y_val = train_val_split(X, y, val_fraction=0.25, seed=seed)
    train_loader = DataLoader(
        TensorDataset(X_train, y_train),
        batch_size=32,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    val_loader = DataLoader(TensorDataset(X_val, y_val), batch_size=50)
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(2, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 2),
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, optimizer, nn.CrossEntropyLoss(), train_loader, val_loader, X_val, y_val


def validation_accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy of ``model`` on ``(X, y)``, in eval mode, wherever the model's weights are."""
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        return (model(X.to(device)).argmax(dim=1) == y.to(device)).double().mean().item()


def fit_cases(thorough: bool = False) -> list[dict]:
    """Visible: the default device, seed 0. Hidden: every device, a seed from the grading run."""
    if not thorough:
        return [{"device": str(pick_device()), "seed": 0}]
    rng = random.Random(grading_seed())
    return [{"device": str(d), "seed": rng.randrange(10_000)} for d in available_devices()]


def _fit_label(case: dict) -> str:
    return f"spiral seed {case['seed']}, and the loop doctor, on {case['device']}"


def _as_learner(fn):
    """``fn`` for the doctor: the reference tripwire armed, errors left for the doctor to report."""
    if is_reference(fn):
        return fn

    def guarded(*args):
        with learner_code():
            return fn(*args)

    return guarded


def observe_fit(fn, case: dict) -> dict:
    """Train on the spiral and measure; then let the loop doctor examine the same `fn`."""
    device = torch.device(case["device"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only add hand-offs
    try:
        with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
            model, optimizer, loss_fn, train_loader, val_loader, X_val, y_val = spiral_problem(
                case["seed"]
            )
            call_answer(
                FIT, "fit", fn, model, optimizer, loss_fn, train_loader, val_loader, EPOCHS,
                device, case=_fit_label(case),
            )  # fmt: skip
            reached = validation_accuracy(model, X_val, y_val) >= TARGET_ACCURACY
        report = diagnose(_as_learner(fn), device=device)
    finally:
        torch.set_num_threads(threads)
    findings = [
        f"{f.code} ({f.evidence})" if f.code == "fit_raised" else f.code for f in report.findings
    ]
    # One string, so that a failed check prints the codes themselves.
    return {"loop doctor's findings": ", ".join(findings) or "none", REACHED: reached}


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
    model.to(device)
    for _ in range(epochs):
        model.train()
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
]

FIT_EXERCISE = Exercise(
    grade_id=FIT,
    function="fit",
    reference=ref.fit.__wrapped__,
    cases=fit_cases,
    observe=observe_fit,
    label=_fit_label,
    mistakes=FIT_MISTAKES,
    hint="each code is explained in `forge_course.doctor.CODES`; run `diagnose(fit)` and read "
    "its report. If only the accuracy is short, check that every batch is used once per epoch "
    "and that `optimizer.step()` runs after each `loss.backward()`.",
)
check_capstone = FIT_EXERCISE.check

EXERCISES = [SMOKE_EXERCISE, FIT_EXERCISE]
