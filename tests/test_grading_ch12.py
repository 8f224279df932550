"""Chapter 12's checks: correct answers in any style pass; each typical mistake is named."""

import pytest
import torch

from forge_course.grader.assignment import INSTALL_TAG
from forge_course.grading import Mistake, ch12
from forge_course.reference import capstone
from forge_course.reference.guard import trusted_code
from forge_course.release import source_notebook
from tests.answers import ch12 as answers
from tests.conftest import REPO
from tests.helpers.copied import copied

CHAPTER = REPO / "solutions" / "ch12_capstone.py"


def _define(source: str, name: str):
    namespace = {"torch": torch}
    exec(source, namespace)  # noqa: S102  (the answers are this repository's own test data)
    return namespace[name]


# ---------------------------------------------------------------- ch12_smoke_test


@pytest.mark.parametrize(
    "answer",
    [
        copied(capstone.smoke_test),
        _define(answers.SMOKE_ALTERNATIVE, "smoke_test"),
        _define(answers.SMOKE_CLOSURE, "smoke_test"),
    ],
    ids=["reference", "alternative", "closure"],
)
def test_smoke_test_accepts_correct_answers_in_any_style(answer):
    ch12.check_smoke_test(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch12.SMOKE_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_smoke_test_names_each_known_mistake(message, wrong):
    # Two of these mistakes are built on the reference: they run as the check's own code.
    with trusted_code(), pytest.raises(Mistake) as caught:
        ch12.check_smoke_test(wrong)
    assert message in str(caught.value)
    assert str(caught.value).startswith("[ch12_smoke_test]")


def test_reference_smoke_test_passes_working_setups_and_fails_broken_ones():
    for case in ch12.smoke_cases(thorough=True):
        observed = ch12.observe_smoke(copied(capstone.smoke_test), case)
        assert observed["passed"] is (case["setup"] in ch12.WORKING), case
        assert len(observed["losses"]) == case["steps"]


def test_a_smoke_test_that_returns_only_a_verdict_is_told_the_shape():
    with pytest.raises(Mistake, match=r"should return two things, `\(losses, passed\)`"):
        ch12.check_smoke_test(lambda *args, **kwargs: True)


def test_a_smoke_test_that_passes_a_loss_lower_at_some_point_fails():
    def lower_at_some_point(make_model, make_optimizer, loss_fn, batch, steps=10):
        losses, _ = copied(capstone.smoke_test)(make_model, make_optimizer, loss_fn, batch,
                                                    steps)  # fmt: skip
        return losses, any(loss < losses[0] for loss in losses)

    case = {"setup": "dip_then_diverge", "device": "cpu", "seed": 3, "steps": 3}
    observed = ch12.observe_smoke(copied(capstone.smoke_test), case)
    first, low, last = observed["losses"]
    assert low < first < last and observed["passed"] is False  # 5.125 → 1.125 → 10.125
    with pytest.raises(Mistake, match="lower at some point and then exploded"):
        ch12.check_smoke_test(lower_at_some_point)


def test_smoke_test_hints_name_only_the_mistake_that_was_made():
    def zero_grad_before_step(make_model, make_optimizer, loss_fn, batch, steps=10):
        model, losses = make_model(), []
        optimizer = make_optimizer(model.parameters())
        for _ in range(steps):
            loss = loss_fn(model(batch[0]), batch[1])
            loss.backward()
            optimizer.zero_grad(set_to_none=False)
            optimizer.step()
            losses.append(loss.item())
        return losses, losses[-1] < losses[0]

    def no_backward(make_model, make_optimizer, loss_fn, batch, steps=10):
        model, losses = make_model(), []
        optimizer = make_optimizer(model.parameters())
        for _ in range(steps):
            optimizer.zero_grad()
            losses.append(loss_fn(model(batch[0]), batch[1]).item())
            optimizer.step()
        return losses, losses[-1] < losses[0]

    with pytest.raises(Mistake, match="sits between `loss.backward\\(\\)` and") as caught:
        ch12.check_smoke_test(zero_grad_before_step)
    assert "built again inside the loop" not in str(caught.value)
    with pytest.raises(Mistake) as caught:
        ch12.check_smoke_test(no_backward)
    message = str(caught.value)
    assert "backward passes that reached the weights should be 10, but it is 0" in message
    assert "built again" not in message and "sits between" not in message


# ---------------------------------------------------------------- ch12_capstone


COPIED_FIT = copied(capstone.fit)


def reference_fit_without_early_stopping(*args):
    """The reference's loop, copied, with every epoch run (as the check's own reference)."""
    return COPIED_FIT(*args, patience=args[5] + 1)


def plain_validated_fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    """The solution's loop: chapter 04's steps, and validation done right after every epoch."""
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(device))
    model.train()


def cached_batches_fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    """Moves every batch to the device once and reuses them (one shuffle for the whole run)."""
    model.to(device)
    train = [(x.to(device), y.to(device)) for x, y in train_loader]
    val = [x.to(device) for x, _ in val_loader]
    for _ in range(epochs):
        model.train()
        for x, y in train:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.inference_mode():
            for x in val:
                model(x)


@pytest.mark.parametrize(
    "answer",
    [reference_fit_without_early_stopping, plain_validated_fit, cached_batches_fit,
     _define(answers.FIT_ALTERNATIVE, "fit"), _define(answers.FIT_VALIDATES_A_COPY, "fit"),
     _define(answers.FIT_FREEZES_TO_VALIDATE, "fit")],
    ids=["reference", "plain", "cached", "alternative", "validates a copy", "frozen to validate"],
)  # fmt: skip
def test_capstone_accepts_correct_loops(answer):
    ch12.check_capstone(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch12.FIT_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_capstone_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch12.check_capstone(wrong)
    assert message in str(caught.value)


@pytest.mark.parametrize("answer,says", [
    (capstone.plain_fit, "epochs followed by a complete validation pass should be 30, but it is 0"),
    (copied(capstone.fit), "`fit` was given should be 300, but it is"),
], ids=["never validates", "stops early"])  # fmt: skip
def test_capstone_refuses_a_loop_that_skips_validation_or_epochs(answer, says):
    with pytest.raises(Mistake, match=says):
        ch12.check_capstone(answer)


def test_capstone_refuses_a_loop_with_an_optimizer_of_its_own():
    def own_sgd(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
        plain_validated_fit(model, torch.optim.Adam(model.parameters(), lr=0.01), loss_fn,
                            train_loader, val_loader, epochs, device)  # fmt: skip

    with pytest.raises(Mistake, match="`fit` was given should be 300, but it is 0") as caught:
        ch12.check_capstone(own_sgd)
    assert "built an optimizer of its own" in str(caught.value)


def zero_grad_between_backward_and_step(model, optimizer, loss_fn, train_loader, val_loader,
                                        epochs, device):  # fmt: skip
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
            for x, _ in val_loader:
                model(x.to(device))


def return_inside_the_epoch_loop(model, optimizer, loss_fn, train_loader, val_loader, epochs,
                                 device):  # fmt: skip
    model.to(device)
    history = []
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            correct = sum(
                (model(x.to(device)).argmax(1) == y.to(device)).sum().item() for x, y in val_loader
            )
        history.append(correct)
        return history


@pytest.mark.parametrize(
    "wrong,named,not_named",
    [
        (zero_grad_between_backward_and_step, r"sits between `loss\.backward\(\)`", "built again"),
        (return_inside_the_epoch_loop, "returned after its first epoch", "missing_zero_grad"),
        (_define(answers.FIT_STEP_TWICE, "fit"), "ran twice after one", "missing_zero_grad"),
    ],
)
def test_capstone_names_the_order_and_indentation_slips(wrong, named, not_named):
    with pytest.raises(Mistake, match=named) as caught:
        ch12.check_capstone(wrong)
    assert not_named not in str(caught.value)


@pytest.mark.parametrize("old,new,says", [
    ("copy.deepcopy(model).eval()", "copy.deepcopy(model)", "`no_eval_mode`"),
    ("torch.no_grad()", "torch.enable_grad()", "`grad_enabled_in_eval`"),
], ids=["copy in train mode", "copy recording a graph"])  # fmt: skip
def test_a_validated_copy_is_judged_like_the_model(old, new, says):
    wrong = answers.FIT_VALIDATES_A_COPY.replace(old, new)
    with pytest.raises(Mistake, match=says):
        ch12.check_capstone(_define(wrong, "fit"))


def test_capstone_hints_name_only_the_mistake_that_was_made():
    def returns_after_one_epoch(model, optimizer, loss_fn, train_loader, val_loader, epochs,
                                device):  # fmt: skip
        plain_validated_fit(model, optimizer, loss_fn, train_loader, val_loader, 1, device)
        return

    def wrong_labels(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
        model.to(device)
        for _ in range(epochs):
            model.train()
            for x, y in train_loader:
                optimizer.zero_grad()
                loss_fn(model(x.to(device)), y.roll(1).to(device)).backward()  # another's label
                optimizer.step()
            model.eval()
            with torch.no_grad():
                for v, _ in val_loader:
                    model(v.to(device))

    with pytest.raises(Mistake, match="should be 300, but it is 10") as caught:
        ch12.check_capstone(returns_after_one_epoch)
    assert "missing_zero_grad`:" not in str(caught.value)
    with pytest.raises(
        Mistake, match="validation accuracy ≥ 85% after 30 epochs should be True"
    ) as caught:
        ch12.check_capstone(wrong_labels)
    assert "Likely mistake: compare the line above" in str(caught.value)


def test_a_fit_that_raises_on_the_doctors_problem_shows_the_error():
    def fit_needs_spiral(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
        if len(train_loader.dataset) != 300:
            raise ValueError("only the spiral, please")
        plain_validated_fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)

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
            assert plain(exercise.expected(case))


def test_checks_leave_the_callers_random_state_alone():
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    ch12.check_smoke_test(copied(capstone.smoke_test))
    ch12.check_capstone(plain_validated_fit)
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
    case = {**ch12.fit_cases()[0], "device": "cpu", "seed": 1000 + seed}
    assert ch12.observe_fit(plain_validated_fit, case) == {
        "the check's hooks on the model were left in place": True,
        "updates with no backward pass since the update before": 0,
        "loop doctor's findings": "none",
        "validation forwards with Dropout on": 0,
        "validation forwards that recorded a graph": 0,
        "updates by the optimizer `fit` was given": 300,
        "epochs followed by a complete validation pass": 30,
        ch12.REACHED: True,
    }


def test_two_findings_at_once_are_both_named():
    def two_bugs(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
        model.to(device)
        model.train()
        for _ in range(epochs):
            for x, y in train_loader:
                loss_fn(model(x.to(device)), y.to(device)).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                for x, _ in val_loader:
                    model(x.to(device))

    with pytest.raises(Mistake, match="it is 'missing_zero_grad, train_mode_not_restored'"):
        ch12.check_capstone(two_bugs)


def test_the_settings_cell_imports_no_reference_no_check_and_no_doctor():
    """The grading worker runs it before every answer: it holds what answers need, no more."""
    code = [c for c in source_notebook(CHAPTER).cells if c.cell_type == "code"]
    plain = [c for c in code if "nbgrader" not in c.metadata]
    settings = next(c.source for c in plain if INSTALL_TAG not in c.metadata.get("tags", []))
    assert "SEED = " in settings
    for module in ("forge_course.reference", "forge_course.grading", "forge_course.doctor"):
        assert module not in settings
