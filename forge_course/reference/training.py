"""A complete training loop on the course's spiral: the optimizer, the schedule, and `fit`.

Everything about a run is in one plain ``config`` dict (see `DEFAULT_CONFIG`), so a run can be
repeated, compared, stored on a scoreboard and graded. Three choices decide most of what a run
does, and each has a trap:

**The optimizer**, and what it keeps for every parameter between steps:

- ``"sgd"``: ``p -= lr * grad``. Keeps nothing.
- ``"momentum"``: SGD with a velocity ``buf = momentum * buf + grad``, ``p -= lr * buf``.
  Keeps one tensor per parameter.
- ``"adam"``: running means of the gradient (``exp_avg``) and of its square (``exp_avg_sq``), both
  bias-corrected, and the step ``lr * m̂ / (√v̂ + eps)``. Keeps two tensors per parameter and a step
  count. Its ``weight_decay`` is L2: ``weight_decay * p`` is added to the gradient *before* the
  normalisation, so weights with large gradients barely feel it.
- ``"adamw"``: Adam with *decoupled* weight decay: ``p -= lr * weight_decay * p`` is applied
  directly, at the same strength for every weight. Note ``torch.optim.AdamW`` defaults to
  ``weight_decay=0.01``, so the config's value is always passed.

**The schedule**, and how often ``scheduler.step()`` is called:

- ``"constant"``: no scheduler at all. (``ConstantLR()`` is not constant: by default it scales
  the rate by 1/3 for 5 steps.)
- ``"step"``: ``StepLR(step_size, gamma)`` with ``step_size`` in epochs: stepped once per epoch.
- ``"cosine"``: ``CosineAnnealingLR(T_max=epochs)``: stepped once per epoch.
- ``"onecycle"``: ``OneCycleLR(max_lr=lr, total_steps=epochs * steps_per_epoch)``: it plans every
  optimizer update, so it is stepped after every ``optimizer.step()``. It would also cycle the
  momentum (and switch momentum *on* for plain SGD) unless ``cycle_momentum=False``, which keeps
  each optimizer what its name says.

**The bookkeeping**: batches come from a new permutation every epoch, drawn from a generator
seeded by ``config["seed"]``; the epoch's training loss weighs each batch by its size (the last
batch is short); validation runs in eval mode (dropout off) without recording a graph, and the
model goes back to train mode for the next epoch.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from forge_course.data import make_spiral, train_val_split
from forge_course.reference.guard import reference

__all__ = [
    "OPTIMIZERS",
    "SCHEDULERS",
    "PER_BATCH_SCHEDULERS",
    "DEFAULT_CONFIG",
    "HIDDEN",
    "complete_config",
    "spiral_data",
    "make_model",
    "steps_per_epoch",
    "make_optimizer",
    "make_scheduler",
    "fit",
]

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULERS = ("constant", "step", "cosine", "onecycle")
PER_BATCH_SCHEDULERS = frozenset({"onecycle"})  # the others count epochs

DEFAULT_CONFIG: dict = {
    "optimizer": "adam",  # one of OPTIMIZERS
    "lr": 0.01,  # learning rate; for "onecycle", the peak rate
    "momentum": 0.9,  # velocity kept by "momentum" (ignored by the others)
    "weight_decay": 0.0,  # L2 for sgd, momentum and adam; decoupled for adamw
    "scheduler": "constant",  # one of SCHEDULERS
    "step_size": 5,  # "step": epochs between two decays
    "gamma": 0.5,  # "step": factor of each decay
    "epochs": 20,  # passes over the 300 training points
    "batch_size": 32,  # examples per optimizer step (the last batch of an epoch may be short)
    "dropout": 0.0,  # probability of zeroing a hidden unit, in train mode only
    "seed": 0,  # initial weights, dropout masks and batch order
}

HIDDEN = 32  # units in each of the two hidden layers


def complete_config(config: dict | None = None) -> dict:
    """``DEFAULT_CONFIG`` updated with ``config``, after checking every key and name.

    Raises:
        ValueError: for an unknown key (a typo such as ``"learning_rate"``), an unknown optimizer
            or scheduler name, or a size that is not a positive whole number.
    """
    config = dict(config or {})
    unknown = sorted(set(config) - set(DEFAULT_CONFIG))
    if unknown:
        raise ValueError(f"Unknown config key(s) {unknown}; the keys are {list(DEFAULT_CONFIG)}.")
    full = {**DEFAULT_CONFIG, **config}
    if full["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {full['optimizer']!r}.")
    if full["scheduler"] not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {full['scheduler']!r}.")
    checks = [
        ("epochs", lambda v: isinstance(v, int) and v >= 1, "a whole number of at least 1"),
        ("batch_size", lambda v: isinstance(v, int) and v >= 1, "a whole number of at least 1"),
        ("step_size", lambda v: isinstance(v, int) and v >= 1, "a whole number of at least 1"),
        ("seed", lambda v: isinstance(v, int) and v >= 0, "a whole number of at least 0"),
        ("lr", lambda v: 0 < v < math.inf, "a positive number"),
        ("momentum", lambda v: 0 <= v < 1, "a number in [0, 1)"),
        ("weight_decay", lambda v: 0 <= v < math.inf, "a number of at least 0"),
        ("gamma", lambda v: 0 < v < math.inf, "a positive number"),
        ("dropout", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ]
    for key, ok, what in checks:
        value = full[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise ValueError(f"{key} must be {what}, got {value!r}.")
    return full


def spiral_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The track every run trains on: 2 spiral arms of 200 points, split 300 / 100.

    Returns:
        ``(X_train [300, 2], y_train [300], X_val [100, 2], y_val [100])`` on the CPU; the same
        tensors on every call (``make_spiral`` and ``train_val_split`` with seed 0).
    """
    X, y = make_spiral(n_per_class=200, classes=2, noise=0.2, seed=0)
    return train_val_split(X, y, val_fraction=0.25, seed=0)


def make_model(config: dict) -> nn.Sequential:
    """Seed torch with ``config["seed"]``, then build the MLP 2 → 32 → 32 → 2 (on the CPU).

    Seeding here fixes the initial weights, and, because dropout draws from the same global
    generator, the dropout masks that follow. Each hidden layer is Linear → ReLU → Dropout.
    """
    torch.manual_seed(config["seed"])
    p = config["dropout"]
    return nn.Sequential(
        nn.Linear(2, HIDDEN),
        nn.ReLU(),
        nn.Dropout(p),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Dropout(p),
        nn.Linear(HIDDEN, 2),
    )


def steps_per_epoch(n_examples: int, batch_size: int) -> int:
    """Optimizer steps in one epoch: every full batch, plus one for a short last batch."""
    return math.ceil(n_examples / batch_size)


@reference
def make_optimizer(params, config: dict) -> torch.optim.Optimizer:
    """The optimizer ``config["optimizer"]`` names, with the config's lr and weight decay."""
    name, lr, decay = config["optimizer"], config["lr"], config["weight_decay"]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=decay)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=config["momentum"], weight_decay=decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=decay)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}.")


@reference
def make_scheduler(
    optimizer: torch.optim.Optimizer, config: dict, batches_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The schedule ``config["scheduler"]`` names; None for "constant".

    Step the result once per epoch, except a scheduler named in `PER_BATCH_SCHEDULERS`
    ("onecycle"), which is stepped after every optimizer step.
    """
    name = config["scheduler"]
    if name == "constant":
        return None
    if name == "step":
        return torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=config["step_size"], gamma=config["gamma"]
        )
    if name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config["epochs"])
    if name == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=config["lr"],
            total_steps=config["epochs"] * batches_per_epoch,
            cycle_momentum=False,
        )
    raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {name!r}.")


@reference
def fit(config: dict, device: torch.device | str = "cpu") -> dict[str, list[float]]:
    """Train the spiral MLP as ``config`` says; return what happened, epoch by epoch.

    Args:
        config: every key of `DEFAULT_CONFIG`.
        device: where the model and the data live.

    Returns:
        ``{"train_loss": [...], "val_accuracy": [...], "lr": [...]}``, Python floats:
        ``train_loss`` and ``val_accuracy`` have one entry per epoch (the mean loss over the
        epoch's training examples, and the accuracy on the 100 validation points after it);
        ``lr`` has one entry per optimizer step, the rate that step used.
    """
    X_train, y_train, X_val, y_val = (t.to(device) for t in spiral_data())
    model = make_model(config).to(device)
    optimizer = make_optimizer(model.parameters(), config)
    batch_size, n_train = config["batch_size"], len(X_train)
    scheduler = make_scheduler(optimizer, config, steps_per_epoch(n_train, batch_size))
    per_batch = config["scheduler"] in PER_BATCH_SCHEDULERS
    loss_fn = nn.CrossEntropyLoss()
    order_generator = torch.Generator().manual_seed(config["seed"])
    history: dict[str, list[float]] = {"train_loss": [], "val_accuracy": [], "lr": []}

    for _ in range(config["epochs"]):
        model.train()
        order = torch.randperm(n_train, generator=order_generator).to(device)
        total_loss = 0.0
        for start in range(0, n_train, batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(X_train[batch]), y_train[batch])
            loss.backward()
            history["lr"].append(optimizer.param_groups[0]["lr"])  # the rate this step uses
            optimizer.step()
            if scheduler is not None and per_batch:
                scheduler.step()
            total_loss += loss.item() * len(batch)  # a batch's mean, weighed by its size
        if scheduler is not None and not per_batch:
            scheduler.step()
        history["train_loss"].append(total_loss / n_train)

        model.eval()
        with torch.no_grad():
            predictions = model(X_val).argmax(dim=1)
        history["val_accuracy"].append((predictions == y_val).float().mean().item())
    return history
