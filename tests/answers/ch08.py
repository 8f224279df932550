"""Answers that chapter 08's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook. Answers run
after the notebook's first cell, which imports torch and nn and defines spiral_data, make_model
and steps_per_epoch.
"""

# A correct fit, with one flaw switched in by each wrong answer below.
_FIT = """
def fit(config, device="cpu"):
    X_train, y_train, X_val, y_val = (t.to(device) for t in spiral_data())
    model = make_model(config).to(device)
    params, lr, wd = model.parameters(), config["lr"], config["weight_decay"]
    name = config["optimizer"]
    if name == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, weight_decay=wd)
    elif name == "momentum":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=config["momentum"], weight_decay=wd)
    elif name == "adam":
        optimizer = torch.optim.Adam(params, lr=lr, weight_decay=wd)
    else:
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    n, size = len(X_train), config["batch_size"]
    scheduler = None
    if config["scheduler"] == "step":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, config["step_size"], config["gamma"])
    elif config["scheduler"] == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config["epochs"])
    elif config["scheduler"] == "onecycle":
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=lr, total_steps=config["epochs"] * steps_per_epoch(n, size),
            cycle_momentum=False)
    gen = torch.Generator().manual_seed(config["seed"])
    history = {"train_loss": [], "val_accuracy": [], "lr": []}
    for epoch in range(config["epochs"]):
        model.train()
        order = torch.randperm(n, generator=gen).to(device)
        total, batches = 0.0, 0
        for i in range(0, n, size):
            batch = order[i : i + size]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(X_train[batch]), y_train[batch])
            loss.backward()
            history["lr"].append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if scheduler is not None and config["scheduler"] == "onecycle":
                scheduler.step()
            total += loss.item() * len(batch)
            batches += 1
        if scheduler is not None and config["scheduler"] != "onecycle":
            scheduler.step()
        history["train_loss"].append(total / n)
        model.eval()
        with torch.no_grad():
            accuracy = (model(X_val).argmax(dim=1) == y_val).float().mean().item()
        history["val_accuracy"].append(accuracy)
    return history
"""


def _fit_with(old: str, new: str) -> str:
    assert old in _FIT, old
    return _FIT.replace(old, new)


FIT_ONECYCLE_PER_EPOCH = _fit_with(
    """            if scheduler is not None and config["scheduler"] == "onecycle":
                scheduler.step()
""",
    "",
).replace(
    """        if scheduler is not None and config["scheduler"] != "onecycle":""",
    """        if scheduler is not None:""",
)

FIT_NO_EVAL = _fit_with("        model.eval()\n", "")

FIT_UNWEIGHTED = _fit_with(
    "            total += loss.item() * len(batch)\n", "            total += loss.item()\n"
).replace(
    'history["train_loss"].append(total / n)', 'history["train_loss"].append(total / batches)'
)

FIT_ADAMW_DEFAULT = _fit_with(
    "optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=wd)",
    "optimizer = torch.optim.AdamW(params, lr=lr)",
)

FIT_VALIDATION_WITH_GRAD = _fit_with(
    """        with torch.no_grad():
            accuracy = (model(X_val).argmax(dim=1) == y_val).float().mean().item()
""",
    """        accuracy = (model(X_val).argmax(dim=1) == y_val).float().mean().item()
""",
)

FIT_SCHEDULER_FIRST = _fit_with(
    """            optimizer.step()
            if scheduler is not None and config["scheduler"] == "onecycle":
                scheduler.step()
""",
    """            if scheduler is not None and config["scheduler"] == "onecycle":
                scheduler.step()
            optimizer.step()
""",
)

# Correct, and written differently: OneCycleLR from epochs and steps_per_epoch, the lr from
# get_last_lr(), batches from split(), validation under inference_mode, a loss module.
FIT_OTHER_STYLE = """
def fit(config, device="cpu"):
    device = torch.device(device)
    data = [t.to(device) for t in spiral_data()]
    X_train, y_train, X_val, y_val = data
    model = make_model(config).to(device)
    kind = config["optimizer"]
    common = dict(lr=config["lr"], weight_decay=config["weight_decay"])
    if kind in ("sgd", "momentum"):
        momentum = config["momentum"] if kind == "momentum" else 0.0
        optimizer = torch.optim.SGD(model.parameters(), momentum=momentum, **common)
    else:
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        optimizer = cls(model.parameters(), **common)
    per_epoch = steps_per_epoch(len(X_train), config["batch_size"])
    schedules = {
        "constant": lambda: None,
        "step": lambda: torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=config["step_size"], gamma=config["gamma"]),
        "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, config["epochs"]),
        "onecycle": lambda: torch.optim.lr_scheduler.OneCycleLR(
            optimizer, config["lr"], epochs=config["epochs"], steps_per_epoch=per_epoch,
            cycle_momentum=False),
    }
    scheduler = schedules[config["scheduler"]]()
    every_batch = config["scheduler"] == "onecycle"
    criterion = nn.CrossEntropyLoss()
    generator = torch.Generator()
    generator.manual_seed(config["seed"])
    losses, accuracies, rates = [], [], []
    for _ in range(config["epochs"]):
        model.train()
        permutation = torch.randperm(len(X_train), generator=generator)
        seen = 0.0
        for batch in permutation.split(config["batch_size"]):
            batch = batch.to(device)
            inputs, targets = X_train[batch], y_train[batch]
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(inputs), targets)
            loss.backward()
            group = optimizer.param_groups[0]
            rates.append(scheduler.get_last_lr()[0] if scheduler else group["lr"])
            optimizer.step()
            if every_batch:
                scheduler.step()
            seen += float(loss.detach()) * inputs.shape[0]
        if scheduler is not None and not every_batch:
            scheduler.step()
        losses.append(seen / len(X_train))
        model.eval()
        with torch.inference_mode():
            right = (model(X_val).argmax(-1) == y_val).sum().item()
        accuracies.append(right / len(y_val))
    return {"train_loss": losses, "val_accuracy": accuracies, "lr": rates}
"""

ARENA_OVER_BUDGET = """
def make_arena_config():
    return {"optimizer": "adam", "lr": 0.01, "batch_size": 32, "epochs": 20}
"""

ARENA_SGD = """
def make_arena_config():
    return {"optimizer": "sgd", "lr": 0.5, "batch_size": 300, "epochs": 50}
"""

ARENA_UNKNOWN_OPTIMIZER = """
def make_arena_config():
    return {"optimizer": "rmsprop", "lr": 0.01, "batch_size": 300, "epochs": 50}
"""

ARENA_ADAMW = """
def make_arena_config():
    config = dict(optimizer="adamw", weight_decay=0.01, lr=5e-2)
    config.update(batch_size=300, epochs=50)
    return config
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch08_fit": [
        (FIT_ONECYCLE_PER_EPOCH, {"ch08_fit_tests": "never leaves its warm-up"}),
        (FIT_NO_EVAL, {"ch08_fit_tests": "call `model.eval()`"}),
        (FIT_UNWEIGHTED, {"ch08_fit_tests": "the mean of the batch means"}),
        (FIT_ADAMW_DEFAULT, {"ch08_fit_tests": "its default of 0.01"}),
        (FIT_VALIDATION_WITH_GRAD, {"ch08_fit_tests": "ran with autograd on"}),
        (FIT_SCHEDULER_FIRST, {"ch08_fit_tests": "runs before `optimizer.step()`"}),
    ],
    "ch08_arena_config": [
        (ARENA_OVER_BUDGET, {"ch08_arena_config_tests": "over the budget of 50"}),
        (ARENA_SGD, {"ch08_arena_config_tests": "SGD needs far more than 50 steps"}),
        (ARENA_UNKNOWN_OPTIMIZER, {"ch08_arena_config_tests": "optimizer must be one of"}),
    ],
    "ch08_questions": [
        (
            "steplr_changes = 4\nonecycle_where = 'a'\nadam_first_step = 2.5\n",
            {
                "ch08_q_steplr_changes": "no batch trains with it",
                "ch08_q_onecycle_where": "never leaves its warm-up",
                "ch08_q_adam_first_step": "that is SGD's step",
            },
        ),
        (
            "steplr_changes = 39\nonecycle_where = 'd'\nadam_first_step = 0.0316\n",
            {
                "ch08_q_steplr_changes": "stepped every batch",
                "ch08_q_onecycle_where": "not micro-batches",
                "ch08_q_adam_first_step": "skips the bias correction",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch08_fit": FIT_OTHER_STYLE,
    "ch08_arena_config": ARENA_ADAMW,
    "ch08_questions": (
        "steplr_changes = 3.0\nonecycle_where = ' B '\nadam_first_step = 0.0099999999996\n"
    ),
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch08_fit": "from forge_course.reference.training import fit\n",
    "ch08_arena_config": (
        "from forge_course.sims import arena\n\n"
        "def make_arena_config():\n"
        "    tries = [{'optimizer': 'adam', 'lr': lr, 'batch_size': 300, 'epochs': 50}\n"
        "             for lr in (0.02, 0.05)]\n"
        "    return min(tries, key=lambda c: arena.run_arena(c).steps_to_target or 99)\n"
    ),
}
