"""Chapter 12's learner half: build the smoke test's setups and the capstone's spiral, run the
answer on them, and report what happened.

The capstone's observation also holds the loop doctor's findings: `forge_course.doctor` runs
the answer on its own small problem, under its instruments, here, next to the answer (it holds
no reference and no expected value: it names what it sees).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from forge_course.data import make_spiral, train_val_split
from forge_course.doctor import diagnose
from forge_course.observe import common
from forge_course.observe.common import Mistake, call_answer

SMOKE, FIT = "ch12_smoke_test", "ch12_capstone"

# ---------------------------------------------------------------- ch12_smoke_test


class _NoStep(torch.optim.SGD):
    """An optimizer whose `step` leaves the weights alone: the loop behaves as if `step()` were
    missing. Like any optimizer, it runs a closure it is given and returns its loss."""

    def step(self, closure=None):
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()


def _rebuilt_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The right value in a new leaf tensor: backward reaches no parameter (the detached loss)."""
    value = nn.functional.mse_loss(outputs, targets).item()
    return torch.tensor(value, device=outputs.device, requires_grad=True)


def _dip_then_diverge(gen: torch.Generator, device: torch.device):
    """A least-squares problem on which SGD with lr 0.1 falls for one step, then diverges.

    The two inputs are orthogonal, with curvatures 10 and 40: along the first, one step of lr
    0.1 lands exactly on the minimum; along the second, each step multiplies the error by −3.
    The start is 1 away along the first and 1/√160 along the second, so the loss goes
    5.125 → 1.125 → 10.125 → 91.1 → …: lower after one step, higher than at the start after two.
    """
    signs = torch.randint(0, 2, (16,), generator=gen) * 2.0 - 1
    halves = torch.tensor([1.0, -1.0]).repeat_interleave(8)[torch.randperm(16, generator=gen)]
    x = torch.stack([math.sqrt(5) * signs, math.sqrt(20) * signs * halves], dim=1)
    best = torch.randn(2, generator=gen)
    y = (x @ best).unsqueeze(1)
    start = best + torch.tensor([1.0, 1.0 / math.sqrt(160)])

    def make_model():
        model = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(start)
        return model.to(device)

    return make_model, x, y


def smoke_setup(case: dict):
    """``(make_model, make_optimizer, loss_fn, batch)`` for a case; the batch is fixed."""
    device, seed, setup = torch.device(case["device"]), case["seed"], case["setup"]
    gen = torch.Generator().manual_seed(seed)
    classify = setup in ("adam_classifier", "momentum_classifier")
    if setup == "dip_then_diverge":
        make_model, x, y = _dip_then_diverge(gen, device)
        loss_fn = nn.MSELoss()
    elif setup == "overshoot":
        # One weight, x = 1, MSE: lr 0.5 takes it to the minimum in one step (the second loss
        # is 0), and momentum carries it past, back and forth, each swing lower. It works, not
        # monotonically: a smoke test that compares with any loss but the first fails it.
        x, y = torch.ones(8, 1), torch.zeros(8, 1)
        loss_fn = nn.MSELoss()

        def make_model():
            torch.manual_seed(seed)
            return nn.Linear(1, 1, bias=False).to(device)
    else:
        x = torch.randn(16, 4, generator=gen)
        if classify:
            y = torch.randint(0, 3, (16,), generator=gen)
            loss_fn = nn.CrossEntropyLoss()
        else:
            y = x @ torch.randn(4, 1, generator=gen) + 0.1 * torch.randn(16, 1, generator=gen)
            loss_fn = _rebuilt_loss if setup == "detached_loss" else nn.MSELoss()

        def make_model():
            torch.manual_seed(seed)
            if setup == "lr_too_high":
                return nn.Linear(4, 1).to(device)
            out = 3 if classify else 1
            return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, out)).to(device)

    def make_optimizer(params):
        if setup == "adam_classifier":
            return torch.optim.Adam(params, lr=0.01)
        if setup == "momentum_classifier":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9)
        if setup == "overshoot":
            return torch.optim.SGD(params, lr=0.5, momentum=0.8)
        if setup == "missing_step":
            return _NoStep(params, lr=0.1)
        lr = {"lr_zero": 0.0, "lr_too_high": 5.0}.get(setup, 0.1)
        return torch.optim.SGD(params, lr=lr)

    return make_model, make_optimizer, loss_fn, (x.to(device), y.to(device))


def label_smoke(case: dict) -> str:
    return f"setup {case['setup']!r}, {case['steps']} steps, on {case['device']}"


def observe_smoke(fn, case: dict) -> dict:
    """Run ``fn`` on the case's setup: what it built, how its optimizers stepped, what it said.

    The factories count what they build; the first parameter of every model built gets a
    gradient hook that counts the backward passes reaching it, and every optimizer built a step
    post-hook that counts its steps and whether ``.grad`` held anything at each. A post-hook, so
    that ``step(closure)`` counts the gradients its closure computed. After the call the hooks
    are checked to be still in place.
    """
    make_model, make_optimizer, loss_fn, batch = smoke_setup(case)
    seen = {"models": 0, "backwards": 0, "steps": 0, "with_grad": 0}
    models, optimizers = [], []

    def on_step(optimizer, args, kwargs):
        seen["steps"] += 1
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        seen["with_grad"] += any(g is not None and bool(g.any()) for g in grads)

    def on_backward(grad):
        seen["backwards"] += 1

    def counted_model():
        seen["models"] += 1
        model = make_model()
        first = next(model.parameters())  # one backward pass reaches it once
        models.append((first, first.register_hook(on_backward)))
        return model

    def counted_optimizer(params):
        optimizer = make_optimizer(params)
        optimizers.append((optimizer, optimizer.register_step_post_hook(on_step)))
        return optimizer

    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        result = call_answer(
            SMOKE, "smoke_test", fn, counted_model, counted_optimizer, loss_fn, batch,
            steps=case["steps"], case=label_smoke(case),
        )  # fmt: skip
    intact = all(
        handle.id in optimizer._optimizer_step_post_hooks and "step" not in vars(optimizer)
        for optimizer, handle in optimizers
    ) and all(handle.id in (param._backward_hooks or {}) for param, handle in models)
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise Mistake(
            SMOKE,
            f"`smoke_test` should return two things, `(losses, passed)`; it returned {result!r}.",
        )
    losses, passed = result
    return {
        "the check's counters were left in place": intact,
        "models built": seen["models"],
        "optimizers built": len(optimizers),
        "optimizer steps": seen["steps"],
        "backward passes that reached the weights": seen["backwards"],
        "steps that found a gradient in .grad": seen["with_grad"],
        "losses": list(losses) if isinstance(losses, tuple) else losses,
        "passed": passed,
    }


# ---------------------------------------------------------------- ch12_capstone


def spiral_problem(seed: int):
    """The capstone's spiral: ``(model, optimizer, loss_fn, train_loader, val_loader, X_train,
    X_val, y_val)``, all built from ``seed``; the model is on the CPU, as the doctor hands it."""
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
    loss_fn = nn.CrossEntropyLoss()
    return model, optimizer, loss_fn, train_loader, val_loader, X_train, X_val, y_val


def validation_accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy of ``model`` on ``(X, y)``, in eval mode, wherever the model's weights are."""
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        return (model(X.to(device)).argmax(dim=1) == y.to(device)).double().mean().item()


@dataclass
class _Forward:
    kind: str  # "train", "val" or "other", by the rows that went in
    rows: frozenset
    dropout: bool  # a Dropout module of the model that ran it was in train mode
    graph: bool = False  # its output recorded a graph (set when the last layer has run)


class _Hook:
    """A hook of `_Forwards` on the model, or on a deep copy of it.

    `copy.deepcopy(model)` (a snapshot validated in the model's place) copies the hooks too: the
    copy's hook records into the same `_Forwards`, and reads the copy's own Dropout modules, so a
    validated copy counts as a validation of the weights it was copied from.
    """

    def __init__(self, method, model: nn.Module) -> None:
        self.method = method
        self.model = model

    def __call__(self, module: nn.Module, *args):
        return self.method(self.model, *args)

    def __deepcopy__(self, memo: dict) -> _Hook:
        # When the whole model is copied, `memo` already maps it to its copy.
        return _Hook(self.method, memo.get(id(self.model), self.model))


class _Forwards:
    """Every forward of the spiral's model, told apart by what went in, not by which loader.

    A forward pre-hook on the first layer sees the raw inputs, however the loop reaches the
    model (`model(x)`, `model.forward(x)`) and wherever the batches came from (the loaders, or
    copies moved to the device once). A batch of validation rows is a validation forward. A
    forward hook on the last layer, whose output is the model's, sees whether a graph was
    recorded: only when autograd was on and something required gradients.
    """

    def __init__(self, model: nn.Module, X_train: torch.Tensor, X_val: torch.Tensor) -> None:
        self.train_rows = set(map(tuple, X_train.tolist()))
        self.val_rows = set(map(tuple, X_val.tolist()))
        self.records: list[_Forward] = []
        linear = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.first, self.last = linear[0], linear[-1]
        self.handles = [
            self.first.register_forward_pre_hook(_Hook(self._seen, model)),
            self.last.register_forward_hook(_Hook(self._output, model)),
        ]

    def _seen(self, model: nn.Module, args: tuple) -> None:
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        rows = frozenset(map(tuple, x.detach().cpu().tolist())) if x is not None else frozenset()
        if rows and rows <= self.val_rows:
            kind = "val"
        elif rows and rows <= self.train_rows:
            kind = "train"
        else:
            kind = "other"
        dropout = any(m.training for m in model.modules() if isinstance(m, nn.Dropout))
        self.records.append(_Forward(kind, rows, dropout))

    def _output(self, model: nn.Module, args: tuple, output) -> None:
        if self.records and isinstance(output, torch.Tensor):
            self.records[-1].graph = output.grad_fn is not None

    def intact(self) -> bool:
        """The hooks are still where the check put them."""
        first, last = self.handles
        return first.id in self.first._forward_pre_hooks and last.id in self.last._forward_hooks

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def validated_epochs(self) -> int:
        """Runs of validation forwards that come after training forwards and see every
        validation example: one per epoch validated."""
        count, trained, covered, in_run = 0, False, set(), False
        for record in [*self.records, _Forward("end", frozenset(), False)]:
            if record.kind == "val":
                covered, in_run = (covered | record.rows if in_run else set(record.rows)), True
                continue
            if in_run and trained and covered == self.val_rows:
                count += 1
            in_run = False
            trained = trained or record.kind == "train"
        return count

    def count(self, what: str) -> int:
        val = [r for r in self.records if r.kind == "val"]
        return sum(r.dropout for r in val) if what == "dropout" else sum(r.graph for r in val)


class _RepeatedSteps:
    """Steps of the given optimizer that found gradients in `.grad` but no backward pass since
    its step before: `optimizer.step()` called twice for one `loss.backward()`.

    A post-hook, so that ``step(closure)``, whose closure runs backward inside the step, counts
    as fresh; gradient hooks on the original parameters, which a deep copy does not take along.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.count = 0
        self.fresh = False  # a backward pass reached the weights since the last step
        self.handles = [p.register_hook(self._backward) for p in model.parameters()]
        self.handles.append(optimizer.register_step_post_hook(self._stepped))

    def _backward(self, grad: torch.Tensor) -> None:
        self.fresh = True

    def _stepped(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        if not self.fresh and any(g is not None and bool(g.any()) for g in grads):
            self.count += 1
        self.fresh = False

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def label_fit(case: dict) -> str:
    return f"spiral seed {case['seed']}, and the loop doctor, on {case['device']}"


def _updates(optimizer: torch.optim.Optimizer) -> int:
    """Steps the given Adam took, read from its own state (its per-parameter step counts)."""
    steps = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    return max(steps, default=0)


def observe_fit(fn, case: dict) -> dict:
    """Train on the spiral and measure; then let the loop doctor examine the same `fn`.

    ``case`` holds the device, the seed, the epochs and the validation accuracy to report on.
    """
    device, epochs = torch.device(case["device"]), case["epochs"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only add hand-offs
    try:
        with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
            problem = spiral_problem(case["seed"])
            model, optimizer, loss_fn, train_loader, val_loader, X_train, X_val, y_val = problem
            forwards = _Forwards(model, X_train, X_val)
            repeated = _RepeatedSteps(model, optimizer)
            call_answer(
                FIT, "fit", fn, model, optimizer, loss_fn, train_loader, val_loader, epochs,
                device, case=label_fit(case),
            )  # fmt: skip
            intact = forwards.intact()
            forwards.remove()
            repeated.remove()
            accuracy = validation_accuracy(model, X_val, y_val)
        report = diagnose(_as_learner(fn), device=device)
    finally:
        torch.set_num_threads(threads)
    findings = [
        f"{f.code} ({f.evidence})" if f.code == "fit_raised" else f.code for f in report.findings
    ]
    return {
        "the check's hooks on the model were left in place": intact,
        "updates with no backward pass since the update before": repeated.count,
        # One string, so that a failed check prints the codes themselves.
        "loop doctor's findings": ", ".join(findings) or "none",
        "validation forwards with Dropout on": forwards.count("dropout"),
        "validation forwards that recorded a graph": forwards.count("grad"),
        "updates by the optimizer `fit` was given": _updates(optimizer),
        "epochs followed by a complete validation pass": forwards.validated_epochs(),
        f"validation accuracy ≥ {case['target']:.0%} after {epochs} epochs": (
            accuracy >= case["target"]
        ),
    }


def _as_learner(fn):
    """``fn`` for the doctor, under the same guard as `call_answer`; its errors are left for the
    doctor to report (``fit_raised``)."""

    def guarded(*args):
        with common._guard(fn):
            return fn(*args)

    return guarded
