"""Chapter 06's checks: correct answers in any style pass; each typical mistake is named."""

import pytest
import torch

from forge_course.grading import Mistake, ch06
from forge_course.reference import evaluation


def evaluate_with_a_dict_of_modes(model, loader, loss_fn, device):
    modes = {module: module.training for module in model.modules()}
    model.eval()
    loss_sum, hits, seen = 0.0, 0, 0
    with torch.inference_mode():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            scores = model(x)
            loss_sum += float(loss_fn(scores, y)) * len(y)
            hits += int((scores.argmax(-1) == y).sum())
            seen += len(y)
    # modules() lists parents before children, so each module's own train(flag) comes last.
    for module, training in modes.items():
        module.train(training)
    return loss_sum / seen, hits / seen


def evaluate_all_at_once(model, loader, loss_fn, device):
    """Collect every output, then one loss over all of them: the same mean, other arithmetic."""
    before = [m.training for m in model.modules()]
    model.eval()
    with torch.no_grad():
        pairs = [(model(x.to(device)), y.to(device)) for x, y in loader]
        outputs = torch.cat([out for out, _ in pairs])
        targets = torch.cat([y for _, y in pairs])
        loss = loss_fn(outputs, targets).item()
        accuracy = (outputs.argmax(dim=-1) == targets).double().mean().item()
    for m, training in zip(model.modules(), before):
        m.training = training
    return loss, accuracy


def evaluate_ignoring_loss_fn(model, loader, loss_fn, device):
    return evaluation.evaluate.__wrapped__(model, loader, torch.nn.functional.cross_entropy, device)


@pytest.mark.parametrize(
    "answer", [evaluation.evaluate.__wrapped__, evaluate_with_a_dict_of_modes, evaluate_all_at_once]
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


def test_evaluate_hidden_cases_catch_an_answer_that_ignores_loss_fn():
    ch06.check_evaluate(evaluate_ignoring_loss_fn)  # the visible cases use plain cross-entropy
    with pytest.raises(Mistake, match="the mean loss should be .*label smoothing"):
        ch06.check_evaluate(evaluate_ignoring_loss_fn, thorough=True)


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


@pytest.mark.parametrize(
    "answer", [evaluation.predict.__wrapped__, predict_as_a_decorated_function]
)
def test_predict_accepts_correct_answers_in_any_style(answer):
    ch06.check_predict(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch06.PREDICT_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_predict_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch06.check_predict(wrong, thorough=True)
    assert message in str(caught.value)


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
        return value is None or isinstance(value, (bool, int, float, str, torch.Tensor))

    for exercise in ch06.EXERCISES:
        for case in exercise.cases(False):
            assert plain(exercise.observe(exercise.reference, case))


def test_checks_leave_the_callers_random_state_alone():
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    ch06.check_evaluate(evaluation.evaluate.__wrapped__)
    ch06.check_predict(evaluation.predict.__wrapped__)
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
