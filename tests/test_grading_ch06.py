"""Chapter 06's checks: correct answers in any style pass; each typical mistake is named."""

import copy

import pytest
import torch

from forge_course.grading import Mistake, ch06
from forge_course.reference import evaluation
from tests.helpers.copied import copied


def evaluate_with_a_dict_of_modes(model, loader, loss_fn, device):
    """The caller's loss switched to sums and back, the divisor from the weights by masking."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    loss_sum, divisor, hits, seen = 0.0, 0.0, 0, 0
    reduction, loss_fn.reduction = loss_fn.reduction, "sum"
    try:
        with torch.inference_mode():
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                scores = model(x)
                kept = y != getattr(loss_fn, "ignore_index", -100)
                weight = getattr(loss_fn, "weight", None)
                per_target = weight[y.clamp(min=0)] if weight is not None else torch.ones(len(y))
                loss_sum += float(loss_fn(scores, y))
                divisor += float((per_target.to(kept.device) * kept).sum())
                hits += int((scores.argmax(-1) == y)[kept].sum())
                seen += int(kept.sum())
    finally:
        loss_fn.reduction = reduction
    # modules() lists parents before children, so each module's own train(flag) comes last.
    for module, training in modes.items():
        module.train(training)
    return loss_sum / divisor, hits / seen


def evaluate_all_at_once(model, loader, loss_fn, device):
    """Collect every output, then one loss over all of them: the definition itself."""
    before = [m.training for m in model.modules()]
    model.eval()
    with torch.no_grad():
        pairs = [(model(x.to(device)), y.to(device)) for x, y in loader]
        outputs = torch.cat([out for out, _ in pairs])
        targets = torch.cat([y for _, y in pairs])
        loss = loss_fn(outputs, targets).item()
        kept = targets != getattr(loss_fn, "ignore_index", -100)
        accuracy = (outputs.argmax(dim=-1) == targets)[kept].double().mean().item()
    for m, training in zip(model.modules(), before):
        m.training = training
    return loss, accuracy


def evaluate_ignoring_loss_fn(model, loader, loss_fn, device):
    return copied(evaluation.evaluate)(model, loader, torch.nn.CrossEntropyLoss(), device)


@pytest.mark.parametrize(
    "answer", [copied(evaluation.evaluate), evaluate_with_a_dict_of_modes, evaluate_all_at_once]
)
def test_evaluate_accepts_correct_answers_in_any_style(answer):
    ch06.check_evaluate(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch06.EVALUATE_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_evaluate_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch06.check_evaluate(wrong)
    assert message in str(caught.value)
    assert str(caught.value).startswith("[ch06_evaluate]")


def test_evaluate_cases_catch_an_answer_that_ignores_loss_fn():
    with pytest.raises(Mistake, match="mean loss should be .*class weights"):
        ch06.check_evaluate(evaluate_ignoring_loss_fn)
    with pytest.raises(Mistake, match="mean loss should be .*(label smoothing|MultiMarginLoss)"):
        ch06.check_evaluate(evaluate_ignoring_loss_fn, thorough=True)


def by_batch_size(model, loader, loss_fn, device):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    total = correct = count = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            outputs = model(x)
            total += loss_fn(outputs, y).item() * y.numel()
            correct += (outputs.argmax(dim=-1) == y).sum().item()
            count += y.numel()
    for m, training in modes.items():
        m.training = training
    return total / count, correct / count


def divisor_from_sum_over_mean(model, loader, loss_fn, device):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    s = copy.copy(loss_fn)
    s.reduction = "sum"
    tot = div = c = n = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            o = model(x)
            total = s(o, y).item()
            mean = loss_fn(o, y).item()
            tot += total
            div += total / mean
            c += (o.argmax(-1) == y).sum().item()
            n += (y != -100).sum().item()
    for m, t in modes.items():
        m.training = t
    return tot / div, c / n


def weight_indexed_by_every_target(model, loader, loss_fn, device):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    s = copy.copy(loss_fn)
    s.reduction = "sum"
    tot = div = c = n = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            o = model(x)
            tot += s(o, y).item()
            div += (
                loss_fn.weight[y].sum().item()
                if getattr(loss_fn, "weight", None) is not None
                else len(y)
            )
            c += (o.argmax(-1) == y).sum().item()
            n += len(y)
    for m, t in modes.items():
        m.training = t
    return tot / div, c / n


@pytest.mark.parametrize(
    "wrong,named",
    [
        (by_batch_size, "weighted by its number of targets"),
        (divisor_from_sum_over_mean, "worked out as its sum over its mean"),
        (weight_indexed_by_every_target, "cannot index `loss_fn.weight`"),
    ],
)
def test_evaluate_averages_over_what_a_weighted_or_ignoring_loss_counts(wrong, named):
    with pytest.raises(Mistake, match=named):
        ch06.check_evaluate(wrong)


def test_evaluate_that_returns_something_else_is_told_the_shape_of_the_answer():
    with pytest.raises(Mistake, match=r"should return two numbers, `\(mean_loss, accuracy\)`"):
        ch06.check_evaluate(lambda model, loader, loss_fn, device: {"loss": 0.0})


def test_unanswered_exercises_say_so():
    def blank(*args):
        raise NotImplementedError()

    for check in (ch06.check_evaluate, ch06.check_predict):
        with pytest.raises(Mistake, match="not written yet"):
            check(blank)


def predict_as_a_decorated_function(model, x):
    saved = [(m, m.training) for m in model.modules()]
    model.eval()

    @torch.inference_mode()
    def classes(inputs):
        return torch.argmax(model(inputs), dim=inputs.dim() - 1)

    try:
        return classes(x.to(next(model.parameters()).device))
    finally:
        for m, training in saved:
            m.training = training


@pytest.mark.parametrize("answer", [copied(evaluation.predict), predict_as_a_decorated_function])
def test_predict_accepts_correct_answers_in_any_style(answer):
    ch06.check_predict(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch06.PREDICT_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_predict_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch06.check_predict(wrong, thorough=True)
    assert message in str(caught.value)


def predict_that_rewrites_the_checks_notes(model, x):
    """`no_grad` where the exercise asks for inference mode, then the check's notes of each
    linear layer's call rewritten through the closure of its layer class's forward."""
    was = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            out = model(x.to(next(model.parameters()).device)).argmax(dim=-1)
    finally:
        for m, training in was.items():
            m.training = training
    for m in model.modules():
        for cell in getattr(type(m).__dict__.get("forward"), "__closure__", None) or ():
            notes = cell.cell_contents
            if type(notes) is list:
                notes[:] = [("linear", False, True) if n[0] == "linear" else n for n in notes]
    return out


@pytest.mark.xfail(strict=True, reason="open (stop 34): notes reachable from the model it is given")
def test_predict_cannot_rewrite_the_checks_notes():
    with pytest.raises(Mistake):
        ch06.check_predict(predict_that_rewrites_the_checks_notes, thorough=True)


def test_calling_the_reference_does_not_score():
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch06.check_evaluate(lambda *args: evaluation.evaluate(*args))
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch06.check_predict(evaluation.predict)


def test_observations_are_plain_data():
    def plain(value):
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or type(value) in (bool, int, float, str, torch.Tensor)

    for exercise in ch06.EXERCISES:
        for case in exercise.cases(False):
            assert plain(exercise.observe(exercise.reference, case))


def test_checks_leave_the_callers_random_state_alone():
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    ch06.check_evaluate(copied(evaluation.evaluate))
    ch06.check_predict(copied(evaluation.predict))
    assert torch.equal(torch.rand(4), expected)


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    for cases in (ch06.evaluate_cases, ch06.predict_cases):
        monkeypatch.setenv("FORGE_GRADING_SEED", "1")
        first = cases(thorough=True)
        monkeypatch.setenv("FORGE_GRADING_SEED", "2")
        assert cases(thorough=True) != first
        assert cases(thorough=False) == cases(thorough=False)


def test_visible_cases_start_from_train_mode_eval_mode_and_a_frozen_batch_norm():
    for cases in (ch06.evaluate_cases(), ch06.predict_cases()):
        assert {case["start"] for case in cases} == {"train", "eval", "frozen_bn"}
    # At least one visible evaluate case has a short last batch, so weighting matters.
    assert any(case["n"] % case["batch"] for case in ch06.evaluate_cases())


# ---------------------------------------------------------------- holes: the check judges outcomes


def _evaluate_loop(model, loader, loss_fn, device, run=None):
    """The loop of a correct answer, without the mode and autograd bookkeeping around it (self-
    contained: the grader tests send its source as a submission)."""
    summed = copy.copy(loss_fn)
    summed.reduction = "sum"
    weight = getattr(loss_fn, "weight", None)
    total, divisor, correct, count = 0.0, 0.0, 0, 0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        outputs = (run or model)(inputs)
        kept = targets != getattr(loss_fn, "ignore_index", -100)
        per_target = weight[targets.clamp(min=0)] if weight is not None else kept.double()
        total += summed(outputs, targets).item()
        divisor += (per_target.double() * kept).sum().item()
        correct += (outputs.argmax(dim=-1) == targets)[kept].sum().item()
        count += int(kept.sum())
    return total / divisor, correct / count


def evaluate_clearing_the_hooks(model, loader, loss_fn, device):
    """Records a graph in every forward, after clearing every hook a check might have put there."""
    for module in model.modules():
        module._forward_pre_hooks.clear()
        module._forward_hooks.clear()
    modes = {m: m.training for m in model.modules()}
    model.eval()
    result = _evaluate_loop(model, loader, loss_fn, device)
    for m, training in modes.items():
        m.training = training
    return result


def evaluate_calling_forward_directly(model, loader, loss_fn, device):
    """Records a graph in every forward, calling each layer's forward so that no hook runs."""

    def run(x):
        for layer in model:
            x = layer.forward(x)
        return x

    modes = {m: m.training for m in model.modules()}
    model.eval()
    result = _evaluate_loop(model, loader, loss_fn, device, run=run)
    for m, training in modes.items():
        m.training = training
    return result


def evaluate_shadowing_named_modules(model, loader, loss_fn, device):
    """Leaves the model in eval mode, and makes it report copies that hold the old modes."""
    import copy

    reported = [(name, copy.copy(module)) for name, module in model.named_modules()]
    model.eval()
    with torch.no_grad():
        result = _evaluate_loop(model, loader, loss_fn, device)
    model.named_modules = lambda *args, **kwargs: iter(reported)
    return result


def evaluate_unhooking_its_layer_class(model, loader, loss_fn, device):
    """Records a graph, after putting torch's own forward back on the check's layer class."""
    type(model[0]).forward = torch.nn.Linear.forward
    modes = {m: m.training for m in model.modules()}
    model.eval()
    result = _evaluate_loop(model, loader, loss_fn, device)
    for m, training in modes.items():
        m.training = training
    return result


@pytest.mark.parametrize(
    "answer,message",
    [
        (evaluate_clearing_the_hooks, "does not switch recording off"),
        (evaluate_calling_forward_directly, "does not switch recording off"),
        (evaluate_shadowing_named_modules, "tampered with the check's instruments: .*named_mod"),
        (evaluate_unhooking_its_layer_class, "tampered with the check's instruments: .*forward"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_evaluate_cannot_hide_from_the_check(answer, message):
    with pytest.raises(Mistake, match=message):
        ch06.check_evaluate(answer)


def test_evaluate_that_leaves_grad_mode_off_gets_feedback_not_a_crash():
    def leaves_grad_off(model, loader, loss_fn, device):
        modes = {m: m.training for m in model.modules()}
        model.eval()
        torch.set_grad_enabled(False)
        result = _evaluate_loop(model, loader, loss_fn, device)
        for m, training in modes.items():
            m.training = training
        return result

    assert torch.is_grad_enabled()
    with pytest.raises(Mistake, match="(?s)autograd afterwards should be 'recording'.*grad_enab"):
        ch06.check_evaluate(leaves_grad_off, thorough=True)
    assert torch.is_grad_enabled()  # the check put it back for the learner's next cell


def evaluate_on_a_copy(model, loader, loss_fn, device):
    """Evaluates a deep copy in eval mode: the caller's model is never switched at all."""
    import copy

    twin = copy.deepcopy(model).eval()
    with torch.no_grad():
        return _evaluate_loop(twin, loader, loss_fn, device)


def evaluate_summing_with_a_copy_of_the_loss(model, loader, loss_fn, device):
    """`reduction="sum"` on a copy of the loss, divided by the total weight of the counted
    targets, worked out from the class weights as a lookup table."""
    import copy

    summing = copy.copy(loss_fn)
    summing.reduction = "sum"
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    total, divisor, correct, count = 0.0, 0.0, 0, 0
    with torch.inference_mode():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            total += summing(outputs, targets).item()
            ignored = getattr(loss_fn, "ignore_index", None)
            weights = getattr(loss_fn, "weight", None)
            for target, hit in zip(targets.tolist(), (outputs.argmax(-1) == targets).tolist()):
                if target != ignored:
                    divisor += weights[target].item() if weights is not None else 1
                    correct += hit
                    count += 1
    for m, training in modes:
        m.training = training
    return total / divisor, correct / count


def evaluate_in_one_forward(model, loader, loss_fn, device):
    """One forward over every example at once (eval mode makes batches independent)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    batches = [(x.to(device), y.to(device)) for x, y in loader]
    inputs, targets = torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
    with torch.no_grad():
        outputs = model(inputs)
        result = _evaluate_loop(model, [(inputs, targets)], loss_fn, device)
    for m, training in modes:
        m.training = training
    assert outputs.shape[0] == targets.shape[0]
    return result


@pytest.mark.parametrize(
    "answer",
    [evaluate_on_a_copy, evaluate_summing_with_a_copy_of_the_loss, evaluate_in_one_forward],
)
def test_evaluate_accepts_other_correct_answers(answer):
    ch06.check_evaluate(answer, thorough=True)


def test_evaluate_must_use_loss_fn_whatever_loss_it_is():
    def assumes_cross_entropy(model, loader, loss_fn, device):
        cross_entropy = torch.nn.CrossEntropyLoss(
            weight=getattr(loss_fn, "weight", None),
            ignore_index=getattr(loss_fn, "ignore_index", -100),
            label_smoothing=getattr(loss_fn, "label_smoothing", 0.0),
        )
        return copied(evaluation.evaluate)(model, loader, cross_entropy, device)

    ch06.check_evaluate(assumes_cross_entropy)
    with pytest.raises(Mistake, match="the mean loss should be .*MultiMarginLoss"):
        ch06.check_evaluate(assumes_cross_entropy, thorough=True)


def test_predict_must_return_the_classes_on_the_models_device():
    def classes_on_the_cpu(model, x):
        return copied(evaluation.predict)(model, x).cpu()

    with pytest.raises(Mistake, match="read values off the model's device.*without `.cpu\\(\\)`"):
        ch06.check_predict(classes_on_the_cpu)


def test_predict_cannot_hide_from_the_check():
    def swaps_the_layer_class(model, x):
        model[0].__class__ = torch.nn.Linear
        with torch.no_grad():
            return model.eval()(x).argmax(dim=-1)

    with pytest.raises(Mistake, match="tampered.*model\\[0\\] was given another class"):
        ch06.check_predict(swaps_the_layer_class)


def test_observers_import_nothing_that_holds_an_answer():
    import subprocess
    import sys

    code = (
        "import sys, forge_course.observe.ch06 as o\n"
        "bad = [m for m in sys.modules if m.startswith(('forge_course.reference', "
        "'forge_course.grading', 'forge_course.sims', 'forge_course.doctor'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
