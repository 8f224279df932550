"""The tripwire that keeps answers from scoring by calling the reference."""

import pytest
import torch

from forge_course.grading import Mistake
from forge_course.grading.core import call_answer
from forge_course.reference import accumulation
from forge_course.reference.guard import ReferenceCalled, is_reference, learner_code


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.MSELoss()


def test_learner_code_may_not_call_a_reference():
    model, opt, loss_fn = _setup()
    with learner_code(), pytest.raises(ReferenceCalled, match="accumulate_step"):
        accumulation.accumulate_step(model, opt, loss_fn, [(torch.ones(1, 2), torch.ones(1, 1))])


def test_outside_a_check_references_work():
    model, opt, loss_fn = _setup()
    loss = accumulation.accumulate_step(model, opt, loss_fn, [(torch.ones(1, 2), torch.ones(1, 1))])
    assert isinstance(loss, float)


def test_a_reference_observed_by_a_check_may_call_other_references():
    model, opt, loss_fn = _setup()
    loader = [(torch.randn(3, 2), torch.randn(3, 1))] * 3
    epoch = accumulation.train_epoch_accumulated.__wrapped__
    assert is_reference(epoch)
    result = call_answer("x", "epoch", epoch, model, opt, loss_fn, loader, 2)
    assert result["updates"] == 2


def test_an_answer_wrapping_the_reference_is_named():
    model, opt, loss_fn = _setup()
    loader = [(torch.randn(3, 2), torch.randn(3, 1))] * 3
    wrapper = lambda *args: accumulation.train_epoch_accumulated(*args)
    assert not is_reference(wrapper)
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        call_answer("x", "epoch", wrapper, model, opt, loss_fn, loader, 2)
