"""The tripwire that keeps answers from scoring by calling the reference."""

import threading
import types

import pytest
import torch

from forge_course.grading import Mistake
from forge_course.grading.core import call_answer
from forge_course.reference import accumulation, datasets, sampling, step
from forge_course.reference.guard import (
    TRIPWIRE,
    ReferenceCalled,
    is_reference,
    learner_code,
    new_check,
    trusted_code,
)


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


# ---------------------------------------------------------------- every way to the reference's code


def test_the_reference_given_as_the_answer_does_not_score():
    from forge_course.grading import ch01, ch02, ch04

    for check, answer in [
        (ch04.check_train_step, step.train_step.__wrapped__),
        (ch04.check_train_step, step.train_step),
        (ch04.check_train_step, ch04.TRAIN_STEP.reference),
        (ch02.check_csv_dataset, datasets.ReviewsDataset),
        (ch02.check_csv_dataset, ch02.CSV_DATASET.reference),
        (ch01.check_logsumexp, ch01.LOGSUMEXP.reference),
    ]:
        with pytest.raises(Mistake, match="calls forge_course's reference"):
            check(answer)


def test_the_undecorated_function_is_guarded_too():
    model, opt, loss_fn = _setup()
    batch = [(torch.ones(1, 2), torch.ones(1, 1))]
    with learner_code(), pytest.raises(ReferenceCalled, match="accumulate_step"):
        accumulation.accumulate_step.__wrapped__(model, opt, loss_fn, batch)
    with learner_code(), pytest.raises(ReferenceCalled, match="accumulate_step"):
        original = accumulation.accumulate_step
        copy = types.FunctionType(
            original.__code__, vars(accumulation), "copy", original.__defaults__
        )
        copy(model, opt, loss_fn, batch)


def _in_a_thread(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(_outcome(fn)))
    thread.start()
    thread.join()
    return out[0]


def _outcome(fn):
    try:
        return fn()
    except ReferenceCalled as err:
        return err


def test_a_thread_the_answer_starts_is_learner_code():
    call = lambda: sampling.shard_indices.__wrapped__(10, 0, 2, shuffle=False, seed=0)  # noqa: E731
    with learner_code():
        assert isinstance(_in_a_thread(call), ReferenceCalled)
    assert _in_a_thread(call) == call()  # outside a check, any thread may run it


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_answer_starting_a_thread_does_not_score():
    from forge_course.grading import ch04

    def threaded(*args):
        out = []
        thread = threading.Thread(target=lambda: out.append(step.train_step.__wrapped__(*args)))
        thread.start()
        thread.join()
        return out[0] if out else None

    with pytest.raises(Mistake):
        ch04.check_train_step(threaded)


class _Borrows(torch.utils.data.Sampler):
    """A sampler of its own making, with the reference's methods borrowed."""

    def __init__(self, lengths, batch_size, shuffle=True, seed=0, bucket_size_multiplier=100):
        self.lengths, self.batch_size, self.shuffle = [int(n) for n in lengths], batch_size, shuffle
        self.seed, self.bucket_size_multiplier, self.epoch = seed, bucket_size_multiplier, 0

    __iter__ = sampling.LengthBucketSampler.__iter__
    __len__ = sampling.LengthBucketSampler.__len__


class _Inherits(sampling.LengthBucketSampler):
    """A subclass that never runs the reference's ``__init__``."""

    __init__ = _Borrows.__init__


def test_a_borrowed_method_never_runs():
    for cls in (_Borrows, _Inherits):
        sampler = cls([3, 1, 2, 5], 2)
        with pytest.raises(ReferenceCalled, match="LengthBucketSampler.__iter__"):
            list(sampler)  # outside a check too
        with learner_code(), pytest.raises(ReferenceCalled, match="LengthBucketSampler.__len__"):
            len(sampler)


def test_a_borrowed_init_never_runs_in_an_answer():
    class BorrowsInit(sampling.LengthBucketSampler):
        __init__ = sampling.LengthBucketSampler.__init__.__wrapped__

    with learner_code(), pytest.raises(ReferenceCalled, match="LengthBucketSampler.__init__"):
        BorrowsInit([3, 1], 2)


def test_reference_instances_serve_the_check_that_built_them_only():
    kept = sampling.LengthBucketSampler([3, 1, 2, 5], 2)  # built in a cell, before the check
    assert len(kept) == 2  # outside a check it works as usual
    new_check()
    built = sampling.LengthBucketSampler([3, 1, 2, 5], 2)  # built by the check, for the answer
    with learner_code():
        assert len(built) == 2
        with pytest.raises(ReferenceCalled, match="LengthBucketSampler.__len__"):
            len(kept)
        with pytest.raises(ReferenceCalled, match="LengthBucketSampler.__init__"):
            sampling.LengthBucketSampler([3, 1], 2)


def test_the_check_observes_the_reference_and_its_mistakes_in_trusted_code():
    with learner_code(), trusted_code():
        assert sampling.shard_indices(4, 0, 2, shuffle=False, seed=0) == [0, 2]


def test_removing_the_tripwire_is_named():
    module = vars(sampling)
    saved = module[TRIPWIRE]
    module[TRIPWIRE] = types.SimpleNamespace(entered=lambda *a: None)
    try:
        with pytest.raises(ReferenceCalled, match="tripwire"), learner_code():
            pass
    finally:
        module[TRIPWIRE] = saved
