"""Tests for forge_course.reference.evaluation, on every available device."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from forge_course.device import available_devices, tolerance
from forge_course.reference.evaluation import evaluate, predict
from forge_course.reference.guard import ReferenceCalled, learner_code

DEVICES = pytest.mark.parametrize("device", available_devices(), ids=str)


def _classifier(device: torch.device, dropout: float = 0.5) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(3, 16),
            torch.nn.ReLU(),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(16, 4),
        )
    return model.to(device)


def _data(n: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=generator), torch.randint(0, 4, (n,), generator=generator)


def _loader(batch_size: int, n: int = 10) -> DataLoader:
    return DataLoader(TensorDataset(*_data(n)), batch_size=batch_size)


def _by_hand(model: torch.nn.Module, device: torch.device) -> tuple[float, float]:
    """The whole data set in one batch: no weighting can go wrong."""
    X, y = _data()
    model.eval()
    with torch.no_grad():
        outputs = model(X.to(device))
        loss = torch.nn.functional.cross_entropy(outputs, y.to(device)).item()
        accuracy = (outputs.argmax(dim=1).cpu() == y).double().mean().item()
    model.train()
    return loss, accuracy


@DEVICES
def test_uneven_batches_match_one_batch_over_the_whole_data_set(device):
    model = _classifier(device)
    expected = _by_hand(model, device)
    got = evaluate(model, _loader(batch_size=4), torch.nn.CrossEntropyLoss(), device)
    assert all(isinstance(value, float) for value in got)
    torch.testing.assert_close(got, expected, **tolerance(torch.float32, device))


@DEVICES
def test_the_mean_of_batch_means_would_be_wrong_here(device):
    # Guards the previous test: for these batches (4, 4, 2) the naive average differs.
    model = _classifier(device)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.eval()
    with torch.no_grad():
        means = [loss_fn(model(x.to(device)), y.to(device)).item() for x, y in _loader(4)]
    naive = sum(means) / len(means)
    loss, _ = evaluate(model, _loader(4), loss_fn, device)
    assert abs(naive - loss) > 1e-3


@pytest.mark.parametrize(
    "options",
    [{"weight": torch.tensor([1.0, 3.0, 0.5, 2.0])}, {"ignore_index": 2}],
    ids=["class_weights", "ignore_index"],
)
def test_a_loss_that_weighs_examples_is_averaged_over_the_total_weight(options):
    # With class weights or an ignored class the batch mean divides by the weight of the
    # counted targets: weighing batch means by the batch size is wrong, the sums are right.
    model, (X, y) = _classifier(torch.device("cpu")).eval(), _data()
    loss_fn = torch.nn.CrossEntropyLoss(**options)
    counted = y != options.get("ignore_index", -100)
    with torch.no_grad():
        whole = torch.nn.functional.cross_entropy(model(X), y, **options).item()
        by_size = sum(loss_fn(model(x), t).item() * len(t) for x, t in _loader(4)) / len(y)
        loss, accuracy = evaluate(model, _loader(4), loss_fn, "cpu")
        hits = (model(X).argmax(dim=1) == y)[counted].double().mean().item()
    assert abs(by_size - whole) > 1e-3
    torch.testing.assert_close(loss, whole)
    torch.testing.assert_close(accuracy, hits)
    assert loss_fn.reduction == "mean"


def test_a_batch_whose_targets_are_all_ignored_adds_nothing():
    model, (X, y) = _classifier(torch.device("cpu")).eval(), _data(12)
    y[:4] = -100  # the first batch of 4 is all padding: its mean is nan, its sum 0
    loader = DataLoader(TensorDataset(X, y), batch_size=4)
    with torch.no_grad():
        whole = torch.nn.functional.cross_entropy(model(X), y).item()
    loss, _ = evaluate(model, loader, torch.nn.CrossEntropyLoss(), "cpu")
    torch.testing.assert_close(loss, whole)


@DEVICES
@pytest.mark.parametrize("training", [True, False], ids=["from_train", "from_eval"])
def test_evaluate_uses_eval_mode_and_restores_the_previous_mode(device, training):
    model = _classifier(device)
    model.train(training)
    seen = []

    class SpyLoss(torch.nn.CrossEntropyLoss):
        def forward(self, outputs, targets):
            seen.append(all(not module.training for module in model.modules()))
            return super().forward(outputs, targets)

    evaluate(model, _loader(4), SpyLoss(), device)
    assert seen == [True, True, True]
    assert all(module.training == training for module in model.modules())


@DEVICES
def test_mixed_modes_are_restored_module_by_module(device):
    model = _classifier(device)
    model.train()
    model[2].eval()  # a submodule deliberately kept in eval mode
    evaluate(model, _loader(4), torch.nn.CrossEntropyLoss(), device)
    predict(model, _data()[0])
    assert [module.training for module in model.modules()] == [True, True, True, False, True]


@DEVICES
def test_mode_is_restored_when_the_loop_raises(device):
    model = _classifier(device).train()

    def broken_loss(outputs, targets):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        evaluate(model, _loader(4), broken_loss, device)
    assert model.training and model[2].training


@DEVICES
def test_evaluate_records_no_graph_and_leaves_grads_alone(device):
    model = _classifier(device)
    X, y = _data()
    torch.nn.functional.cross_entropy(model(X.to(device)), y.to(device)).backward()
    model[3].bias.grad = None  # one parameter without a gradient must stay without one
    before = {
        name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()
    }
    graphs = []

    def spy_loss(outputs, targets):
        loss = torch.nn.functional.cross_entropy(outputs, targets)
        graphs.append((outputs.grad_fn, loss.grad_fn, loss.requires_grad))
        return loss

    evaluate(model, _loader(4), spy_loss, device)
    assert graphs == [(None, None, False)] * 3
    for name, p in model.named_parameters():
        if before[name] is None:
            assert p.grad is None, name
        else:
            assert torch.equal(p.grad, before[name]), name


@DEVICES
def test_dropout_model_evaluates_deterministically(device):
    model = _classifier(device, dropout=0.9).train()
    loss_fn = torch.nn.CrossEntropyLoss()
    first = evaluate(model, _loader(4), loss_fn, device)
    second = evaluate(model, _loader(4), loss_fn, device)
    assert first == second
    # In train mode dropout changes the outputs call after call: the check above means something.
    X = _data()[0].to(device)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        assert not torch.equal(model(X), model(X))


def test_evaluate_rejects_an_empty_loader():
    with pytest.raises(ValueError, match="no counted target"):
        evaluate(_classifier("cpu"), [], torch.nn.CrossEntropyLoss(), "cpu")


@DEVICES
def test_predict_returns_argmax_classes_on_the_models_device(device):
    model = _classifier(device).train()
    X = _data()[0]
    classes = predict(model, X)
    model.eval()
    with torch.no_grad():
        expected = model(X.to(device)).argmax(dim=1)
    assert classes.device.type == torch.device(device).type
    assert classes.dtype == torch.int64 and classes.shape == (10,)
    assert torch.equal(classes, expected)


@DEVICES
def test_predict_runs_in_inference_mode_and_restores_the_mode(device):
    model = _classifier(device, dropout=0.9).train()
    X = _data()[0]
    first, second = predict(model, X), predict(model, X)
    assert first.grad_fn is None and not first.requires_grad and first.is_inference()
    assert torch.equal(first, second)
    assert all(module.training for module in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_learner_code_may_not_call_the_references():
    with learner_code():
        with pytest.raises(ReferenceCalled):
            evaluate(_classifier("cpu"), _loader(4), torch.nn.CrossEntropyLoss(), "cpu")
        with pytest.raises(ReferenceCalled):
            predict(_classifier("cpu"), _data()[0])
