"""Chapter 12's checks: correct answers in any style pass; each typical mistake is named."""

import pytest
import torch

from forge_course.grading import Mistake, ch12
from forge_course.reference import capstone
from tests.answers import ch12 as answers


def _define(source: str, name: str):
    namespace = {"torch": torch}
    exec(source, namespace)  # noqa: S102  (the answers are this repository's own test data)
    return namespace[name]


# ---------------------------------------------------------------- ch12_smoke_test


@pytest.mark.parametrize(
    "answer", [capstone.smoke_test.__wrapped__, _define(answers.SMOKE_ALTERNATIVE, "smoke_test")]
)
def test_smoke_test_accepts_correct_answers_in_any_style(answer):
    ch12.check_smoke_test(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch12.SMOKE_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_smoke_test_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch12.check_smoke_test(wrong)
    assert message in str(caught.value)
    assert str(caught.value).startswith("[ch12_smoke_test]")


def test_reference_smoke_test_passes_working_setups_and_fails_broken_ones():
    for case in ch12.smoke_cases(thorough=True):
        observed = ch12.observe_smoke(capstone.smoke_test.__wrapped__, case)
        assert observed["passed"] is (case["setup"] in ch12.WORKING), case
        assert len(observed["losses"]) == case["steps"]


def test_a_smoke_test_that_returns_only_a_verdict_is_told_the_shape():
    with pytest.raises(Mistake, match=r"should return two things, `\(losses, passed\)`"):
        ch12.check_smoke_test(lambda *args, **kwargs: True)


# ---------------------------------------------------------------- ch12_capstone


@pytest.mark.parametrize(
    "answer",
    [capstone.fit.__wrapped__, capstone.plain_fit, _define(answers.FIT_ALTERNATIVE, "fit")],
    ids=["reference", "plain", "alternative"],
)
def test_capstone_accepts_correct_loops(answer):
    ch12.check_capstone(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch12.FIT_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_capstone_names_each_doctor_finding(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch12.check_capstone(wrong)
    code = message.split("`")[1]
    assert message in str(caught.value)
    assert f"findings should be 'none', but it is '{code}" in str(caught.value)


def test_capstone_catches_a_loop_that_does_not_learn_enough():
    def one_batch_per_epoch(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
        model.to(device)
        for _ in range(epochs):
            model.train()
            x, y = next(iter(train_loader))
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()

    with pytest.raises(Mistake, match="validation accuracy ≥ 85% after 30 epochs should be True"):
        ch12.check_capstone(one_batch_per_epoch)


def test_a_fit_that_raises_on_the_doctors_problem_shows_the_error():
    def fit_needs_spiral(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
        if len(train_loader.dataset) != 300:
            raise ValueError("only the spiral, please")
        capstone.plain_fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)

    with pytest.raises(Mistake, match=r"it is 'fit_raised \(ValueError: only the spiral"):
        ch12.check_capstone(fit_needs_spiral)


# ---------------------------------------------------------------- both


def test_unanswered_exercises_say_so():
    def blank(*args, **kwargs):
        raise NotImplementedError()

    for check in (ch12.check_smoke_test, ch12.check_capstone):
        with pytest.raises(Mistake, match="not written yet"):
            check(blank)


def test_calling_the_reference_does_not_score():
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch12.check_smoke_test(capstone.smoke_test)
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch12.check_capstone(lambda *args: capstone.fit(*args))


def test_observations_are_plain_data():
    def plain(value):
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or isinstance(value, (bool, int, float, str))

    for exercise in ch12.EXERCISES:
        for case in exercise.cases(False):
            assert plain(exercise.observe(exercise.reference, case))


def test_checks_leave_the_callers_random_state_alone():
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    ch12.check_smoke_test(capstone.smoke_test.__wrapped__)
    ch12.check_capstone(capstone.plain_fit)
    assert torch.equal(torch.rand(4), expected)


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    for cases in (ch12.smoke_cases, ch12.fit_cases):
        monkeypatch.setenv("FORGE_GRADING_SEED", "1")
        first = cases(thorough=True)
        monkeypatch.setenv("FORGE_GRADING_SEED", "2")
        assert cases(thorough=True) != first
        assert cases(thorough=False) == cases(thorough=False)


@pytest.mark.parametrize("seed", range(8))
def test_the_target_accuracy_is_reachable_by_a_plain_loop_for_any_seed(seed):
    case = {"device": "cpu", "seed": 1000 + seed}
    assert ch12.observe_fit(capstone.plain_fit, case) == {
        "loop doctor's findings": "none",
        ch12.REACHED: True,
    }


def test_two_findings_at_once_are_both_named():
    def two_bugs(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
        model.to(device)
        for _ in range(epochs):
            model.train()
            for x, y in train_loader:
                loss_fn(model(x.to(device)), y.to(device)).backward()
                optimizer.step()
            for x, _ in val_loader:
                model(x.to(device))

    with pytest.raises(Mistake, match="it is 'missing_zero_grad, no_eval_mode, grad_enabled"):
        ch12.check_capstone(two_bugs)
