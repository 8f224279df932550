"""Chapter 10's checks: correct answers in any style pass; each typical mistake is named."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from forge_course.grading import Mistake, ch10
from forge_course.reference import accumulation, amp, checkpointing


def one_backward_accumulate(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    """Correct, written differently: zero_grad last, a weighted sum, the weights as n_i / N."""
    total = sum(x.shape[0] for x, _ in micro_batches)
    mean = 0.0
    for x, y in micro_batches:
        share = x.shape[0] / total
        loss = loss_fn(model.forward(x), y)
        (share * loss).backward()
        mean += share * float(loss)
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return mean


@pytest.mark.parametrize(
    "answer", [accumulation.accumulate_step.__wrapped__, one_backward_accumulate]
)
def test_accumulate_accepts_correct_answers(answer):
    ch10.check_accumulate_step(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch10.ACCUMULATE_MISTAKES, ids=range(4))
def test_accumulate_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch10.check_accumulate_step(wrong)
    assert message in str(caught.value)


def amp_with_defaults(model, optimizer, loss_fn, x, y, scaler=None):
    """Correct, written differently: autocast's own default dtype per device, set_to_none."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type):
        out = model(x)
        loss = loss_fn(out, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return float(loss.detach())


@pytest.mark.parametrize("answer", [amp.amp_train_step.__wrapped__, amp_with_defaults])
def test_amp_accepts_correct_answers(answer):
    ch10.check_amp_step(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch10.AMP_MISTAKES, ids=range(3))
def test_amp_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch10.check_amp_step(wrong, thorough=True)
    assert message in str(caught.value)


def test_amp_without_scaler_update_fails_with_torchs_own_words():
    def no_update(model, optimizer, loss_fn, x, y, scaler=None):
        optimizer.zero_grad()
        with torch.autocast(x.device.type, dtype=amp.autocast_dtype.__wrapped__(x.device)):
            loss = loss_fn(model(x), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
        return loss.item()

    ch10.check_amp_step(no_update)  # the visible case has no scaler on the CPU
    with pytest.raises(Mistake, match=r"step\(\) has already been called since the last update"):
        ch10.check_amp_step(no_update, thorough=True)


def generic_checkpointed(layers, x, segments):
    """Correct, written differently: index arithmetic and nn.Sequential segments."""
    layers = list(layers)
    n = len(layers)
    bounds = [round(i * n / segments) for i in range(segments + 1)]
    for a, b in zip(bounds, bounds[1:]):
        x = checkpoint(torch.nn.Sequential(*layers[a:b]), x, use_reentrant=False)
    return x


@pytest.mark.parametrize(
    "answer", [checkpointing.checkpointed_forward.__wrapped__, generic_checkpointed]
)
def test_checkpointed_forward_accepts_correct_answers(answer):
    ch10.check_checkpointed_forward(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch10.CHECKPOINT_MISTAKES, ids=range(3))
def test_checkpointed_forward_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch10.check_checkpointed_forward(wrong)
    assert message in str(caught.value)


def test_checkpointed_forward_must_return_a_tensor():
    with pytest.raises(Mistake, match="the output should be a tensor"):
        ch10.check_checkpointed_forward(lambda layers, x, segments: None)


def test_calling_the_reference_does_not_score():
    cases = [
        (ch10.check_accumulate_step, lambda *a: accumulation.accumulate_step(*a)),
        (ch10.check_amp_step, lambda *a: amp.amp_train_step(*a)),
        (ch10.check_checkpointed_forward, lambda *a: checkpointing.checkpointed_forward(*a)),
    ]
    for check, answer in cases:
        with pytest.raises(Mistake, match="calls forge_course's reference"):
            check(answer)


def test_exercises_are_listed_for_the_isolated_grader():
    assert [e.grade_id for e in ch10.EXERCISES] == [
        "ch10_accumulate_step",
        "ch10_amp_step",
        "ch10_checkpointed_forward",
    ]


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    monkeypatch.setenv("FORGE_GRADING_SEED", "1")
    first = ch10.accumulate_cases(thorough=True)
    monkeypatch.setenv("FORGE_GRADING_SEED", "2")
    assert ch10.accumulate_cases(thorough=True) != first
    assert ch10.accumulate_cases(thorough=False) == ch10.accumulate_cases(thorough=False)
