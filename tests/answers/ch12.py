"""Answers that chapter 12's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

SMOKE_OR_EQUAL = """
def smoke_test(make_model, make_optimizer, loss_fn, batch, steps=10):
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, losses[-1] <= losses[0]
"""

SMOKE_MODEL_PER_STEP = """
def smoke_test(make_model, make_optimizer, loss_fn, batch, steps=10):
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
"""

SMOKE_TENSORS = """
def smoke_test(make_model, make_optimizer, loss_fn, batch, steps=10):
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
"""

# Correct, but unlike the solution: zeroing in place after each step, a tuple of losses.
SMOKE_ALTERNATIVE = """
def smoke_test(make_model, make_optimizer, loss_fn, batch, steps=10):
    net = make_model()
    opt = make_optimizer(net.parameters())
    inputs, targets = batch
    opt.zero_grad(set_to_none=False)
    history = ()
    for _ in range(steps):
        value = loss_fn(net(inputs), targets)
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        history += (value.item(),)
    first, last = history[0], history[-1]
    return list(history), bool(last < first)
"""

# Correct, with `step(closure)`: the closure clears, runs forward and backward, returns the loss.
SMOKE_CLOSURE = """
def smoke_test(make_model, make_optimizer, loss_fn, batch, steps=10):
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    x, y = batch

    def closure():
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    losses = [optimizer.step(closure).item() for _ in range(steps)]
    return losses, losses[-1] < losses[0]
"""

FIT_NO_ZERO_GRAD = """
def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
"""

FIT_ZERO_GRAD_BEFORE_STEP = """
def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.zero_grad()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
"""

FIT_RETURNS_IN_THE_LOOP = """
def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
        return model
"""

FIT_NO_EVAL = """
def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
"""

FIT_NO_NO_GRAD = """
def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    accuracies = []
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
        model.eval()
        hits = sum((model(x.to(device)).argmax(1) == y.to(device)).sum().item()
                   for x, y in val_loader)
        accuracies.append(hits)
    return accuracies
"""

FIT_MODE_NOT_RESTORED = """
def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    model.train()
    for _ in range(epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
"""

FIT_STEP_TWICE = """
def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
    return model
"""

# Correct: validates a snapshot, `copy.deepcopy(model)` in eval mode, as for an averaged copy.
FIT_VALIDATES_A_COPY = """
import copy


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        snapshot = copy.deepcopy(model).eval()
        with torch.no_grad():
            for x, y in val_loader:
                snapshot(x.to(device))
    return model
"""

# Correct: no `no_grad`, but nothing requires gradients while validating, so no graph is made.
FIT_FREEZES_TO_VALIDATE = """
def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        model.requires_grad_(False)
        for x, y in val_loader:
            model(x.to(device))
        model.requires_grad_(True)
    return model
"""

# Correct, but unlike the solution: inference_mode, clipping, a per-batch OneCycleLR stepped
# after the optimizer, validation in a helper that restores each module's own mode.
FIT_ALTERNATIVE = """
def _validate(net, loader, device):
    modes = [(m, m.training) for m in net.modules()]
    net.eval()
    with torch.inference_mode():
        right = sum(int((net(a.to(device)).argmax(-1) == b.to(device)).sum()) for a, b in loader)
    for m, mode in modes:
        m.train(mode)
    return right


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model = model.to(device)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=0.01, total_steps=epochs * len(train_loader)
    )
    log = []
    for _ in range(epochs):
        model.train()
        for batch in train_loader:
            inputs, targets = (t.to(device) for t in batch)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(inputs), targets).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            schedule.step()
        log.append(_validate(model, val_loader, device))
    return log
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch12_smoke_test": [
        (SMOKE_OR_EQUAL, {"ch12_smoke_test_tests": "strictly lower"}),
        (SMOKE_MODEL_PER_STEP, {"ch12_smoke_test_tests": "Build both once, before the loop"}),
        (SMOKE_TENSORS, {"ch12_smoke_test_tests": "Record `loss.item()`"}),
    ],
    "ch12_capstone": [
        (FIT_NO_ZERO_GRAD, {"ch12_capstone_tests": "`missing_zero_grad`"}),
        (FIT_NO_EVAL, {"ch12_capstone_tests": "`no_eval_mode`"}),
        (FIT_NO_NO_GRAD, {"ch12_capstone_tests": "`grad_enabled_in_eval`"}),
        (FIT_MODE_NOT_RESTORED, {"ch12_capstone_tests": "`train_mode_not_restored`"}),
        (FIT_ZERO_GRAD_BEFORE_STEP, {"ch12_capstone_tests": "sits between `loss.backward()`"}),
        (FIT_RETURNS_IN_THE_LOOP, {"ch12_capstone_tests": "returned after its first epoch"}),
        (FIT_STEP_TWICE, {"ch12_capstone_tests": "ran twice after one `loss.backward()`"}),
    ],
    "ch12_questions": [
        (
            "checkpoints = 4\nsmoke_answer = 'a'\n",
            {
                "ch12_q_checkpoints": "80 is not a multiple of 25",
                "ch12_q_smoke": "without step() the weights never change",
            },
        ),
        (
            "checkpoints = 200\nsmoke_answer = 'd'\n",
            {
                "ch12_q_checkpoints": "count optimizer updates",
                "ch12_q_smoke": "no gradient reaching the weights",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch12_smoke_test": SMOKE_ALTERNATIVE,
    "ch12_capstone": FIT_ALTERNATIVE,
    "ch12_questions": "checkpoints = 80 // 25\nsmoke_answer = ' C '\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch12_smoke_test": "from forge_course.reference.capstone import smoke_test\n",
    "ch12_capstone": (
        "import forge_course.reference.capstone as ref\n\n"
        "def fit(*args):\n    return ref.fit(*args)\n"
    ),
}
