"""Answers that chapter 06's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

EVALUATE_NO_EVAL = """
def evaluate(model, loader, loss_fn, device):
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            total += loss_fn(outputs, targets).item() * len(targets)
            correct += (outputs.argmax(dim=1) == targets).sum().item()
            count += len(targets)
    return total / count, correct / count
"""

EVALUATE_BATCH_MEANS = """
def evaluate(model, loader, loss_fn, device):
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    losses, accuracies = [], []
    with torch.no_grad():
        for inputs, targets in loader:
            outputs = model(inputs.to(device))
            targets = targets.to(device)
            losses.append(loss_fn(outputs, targets).item())
            accuracies.append((outputs.argmax(dim=-1) == targets).float().mean().item())
    for m, training in modes:
        m.training = training
    return sum(losses) / len(losses), sum(accuracies) / len(accuracies)
"""

EVALUATE_ALWAYS_TRAIN = """
def evaluate(model, loader, loss_fn, device):
    model.eval()
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            total += loss_fn(outputs, targets).item() * len(targets)
            correct += (outputs.argmax(dim=-1) == targets).sum().item()
            count += len(targets)
    model.train()
    return total / count, correct / count
"""

EVALUATE_NO_NO_GRAD = """
def evaluate(model, loader, loss_fn, device):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    total, correct, count = 0.0, 0, 0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        outputs = model(inputs)
        total += loss_fn(outputs, targets).item() * len(targets)
        correct += (outputs.argmax(dim=-1) == targets).sum().item()
        count += len(targets)
    for m, training in modes.items():
        m.training = training
    return total / count, correct / count
"""

EVALUATE_BY_BATCH_SIZE = """
def evaluate(model, loader, loss_fn, device):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            total += loss_fn(outputs, targets).item() * len(targets)
            correct += (outputs.argmax(dim=-1) == targets).sum().item()
            count += len(targets)
    for m, training in modes.items():
        m.training = training
    return total / count, correct / count
"""

# Correct, but unlike the solution: inference_mode, tensors summed on the device and turned
# into numbers once at the end, the caller's reduction switched to "sum" and back, the weights
# of the counted targets looked up with the ignored ones masked to 0, modes restored by
# train(flag) in parent-before-child order.
EVALUATE_ALTERNATIVE = """
def evaluate(model, loader, loss_fn, device):
    previous = [(module, module.training) for module in model.modules()]
    model.train(False)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    weight_sum = torch.zeros((), dtype=torch.float64, device=device)
    hits = torch.zeros((), dtype=torch.int64, device=device)
    seen = 0
    reduction, loss_fn.reduction = loss_fn.reduction, "sum"
    try:
        with torch.inference_mode():
            for batch in loader:
                inputs, targets = (t.to(device) for t in batch)
                scores = model(inputs)
                loss_sum += loss_fn(scores, targets).double()
                keep = torch.ones_like(targets, dtype=torch.bool)
                weights = keep.double()
                if isinstance(loss_fn, torch.nn.CrossEntropyLoss):
                    keep = targets != loss_fn.ignore_index
                    if loss_fn.weight is not None:
                        weights = loss_fn.weight[targets.clamp(min=0)].double()
                    weights = weights * keep
                weight_sum += weights.sum()
                hits += (torch.eq(scores.argmax(-1), targets) & keep).sum()
                seen += int(keep.sum())
    finally:
        loss_fn.reduction = reduction
    for module, training in previous:  # modules() lists parents first: each keeps its own flag
        module.train(training)
    return float(loss_sum / weight_sum), float(hits) / seen
"""

PREDICT_NO_GRAD = """
def predict(model, x):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    with torch.no_grad():
        classes = model(x.to(next(model.parameters()).device)).argmax(dim=-1)
    for m, training in modes.items():
        m.training = training
    return classes
"""

PREDICT_SCORES = """
def predict(model, x):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    with torch.inference_mode():
        scores = model(x.to(next(model.parameters()).device))
    for m, training in modes.items():
        m.training = training
    return scores
"""

PREDICT_DIM_1 = """
def predict(model, x):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    with torch.inference_mode():
        classes = model(x.to(next(model.parameters()).device)).argmax(dim=1)
    for m, training in modes.items():
        m.training = training
    return classes
"""

PREDICT_ON_THE_CPU = """
def predict(model, x):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    with torch.inference_mode():
        classes = model(x.to(next(model.parameters()).device)).argmax(dim=-1)
    for m, training in modes.items():
        m.training = training
    return classes.cpu()
"""

PREDICT_ALTERNATIVE = """
@torch.inference_mode()
def predict(model, x):
    device = next(iter(model.parameters())).device
    flags = [m.training for m in model.modules()]
    model.eval()
    try:
        return torch.max(model(x.to(device)), dim=x.dim() - 1).indices
    finally:
        for m, flag in zip(model.modules(), flags):
            m.training = flag
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch06_evaluate": [
        (EVALUATE_NO_EVAL, {"ch06_evaluate_tests": "Call `model.eval()` first"}),
        (EVALUATE_BATCH_MEANS, {"ch06_evaluate_tests": "weigh each batch's mean by its size"}),
        (EVALUATE_ALWAYS_TRAIN, {"ch06_evaluate_tests": "Calling `model.train()` at the end"}),
        (EVALUATE_NO_NO_GRAD, {"ch06_evaluate_tests": "does not switch recording off"}),
        (EVALUATE_BY_BATCH_SIZE, {"ch06_evaluate_tests": "weighted by its number of targets"}),
    ],
    "ch06_predict": [
        (PREDICT_NO_GRAD, {"ch06_predict_tests": "asks for `torch.inference_mode()`"}),
        (PREDICT_SCORES, {"ch06_predict_tests": "Return the class indices"}),
        (PREDICT_DIM_1, {"ch06_predict_tests": "the argmax over the *last* dimension"}),
        (PREDICT_ON_THE_CPU, {"ch06_predict_tests": "read values off the model's device"}),
    ],
    "ch06_questions": [
        (
            "dropout_value = 1.2\nswitch_answer = 'a'\nbn_answer = 'a'\n",
            {
                "ch06_q_dropout_value": "that is the eval-mode output",
                "ch06_q_switch": "dropout still drops in train mode",
                "ch06_q_bn_no_grad": "no_grad only stops recording",
            },
        ),
        (
            "dropout_value = 0.96\nswitch_answer = 'd'\nbn_answer = 'c'\n",
            {
                "ch06_q_dropout_value": "not multiplied by it",
                "ch06_q_switch": "only the module's training flag changes dropout",
                "ch06_q_bn_no_grad": "not learnt by gradients",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch06_evaluate": EVALUATE_ALTERNATIVE,
    "ch06_predict": PREDICT_ALTERNATIVE,
    "ch06_questions": "dropout_value = 1.2 / (1 - 0.2)\nswitch_answer = ' B '\nbn_answer = 'B'\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch06_evaluate": "from forge_course.reference.evaluation import evaluate\n",
    "ch06_predict": (
        "import forge_course.reference.evaluation as ref\n\n"
        "def predict(model, x):\n    return ref.predict(model, x)\n"
    ),
}
