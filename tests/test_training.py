"""The training reference against torch's optimizers and schedulers, and a loop written apart."""

import math

import pytest
import torch

from forge_course.device import available_devices, tolerance
from forge_course.reference import training
from forge_course.reference.evaluation import evaluate

CONFIG = training.DEFAULT_CONFIG


def config(**changes):
    return training.complete_config(changes)


def test_complete_config_fills_defaults_and_rejects_mistakes():
    assert training.complete_config({}) == CONFIG
    assert training.complete_config({"lr": 0.1})["lr"] == 0.1
    bad = [
        ({"learning_rate": 0.1}, "learning_rate"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"scheduler": "linear"}, "scheduler"),
        ({"epochs": 0}, "epochs"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"lr": 0}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"dropout": -0.1}, "dropout"),
        ({"seed": -1}, "seed"),
    ]
    for changes, name in bad:
        with pytest.raises(ValueError, match=name):
            training.complete_config(changes)


def test_the_track_is_fixed_and_split_300_100():
    first, second = training.spiral_data(), training.spiral_data()
    assert [len(t) for t in first] == [300, 300, 100, 100]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert set(first[1].tolist()) == {0, 1}


def test_make_model_is_seeded_and_has_1218_parameters():
    a, b = training.make_model(config(seed=3)), training.make_model(config(seed=3))
    c = training.make_model(config(seed=4))
    assert sum(p.numel() for p in a.parameters()) == 1218
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))
    dropouts = [m.p for m in training.make_model(config(dropout=0.3)) if hasattr(m, "p")]
    assert dropouts == [0.3, 0.3]


@pytest.mark.parametrize(
    "name,cls,momentum,decay",
    [
        ("sgd", torch.optim.SGD, 0, 0.02),
        ("momentum", torch.optim.SGD, 0.8, 0.02),
        ("adam", torch.optim.Adam, None, 0.02),
        ("adamw", torch.optim.AdamW, None, 0.0),  # 0.0, not AdamW's default 0.01
    ],
)
def test_make_optimizer_builds_the_named_torch_optimizer(name, cls, momentum, decay):
    params = [torch.nn.Parameter(torch.zeros(2))]
    cfg = config(optimizer=name, lr=0.3, momentum=0.8, weight_decay=decay)
    optimizer = training.make_optimizer(params, cfg)
    group = optimizer.param_groups[0]
    assert type(optimizer) is cls and group["lr"] == 0.3 and group["weight_decay"] == decay
    if momentum is not None:
        assert group["momentum"] == momentum


def test_adam_and_adamw_reproduce_the_chapters_hand_numbers():
    # L(w) = 0.005·w1 + 2·w2², w = (1, 1), lr 0.1: worked out by hand in chapter 08.
    expected = {
        ("adam", 0.0): [0.9000002, 0.9],
        ("adam", 0.1): [0.9, 0.9],
        ("adamw", 0.1): [0.8900002, 0.89],
        ("sgd", 0.0): [0.9995, 0.6],
    }
    for (name, decay), want in expected.items():
        w = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
        optimizer = training.make_optimizer([w], config(optimizer=name, lr=0.1, weight_decay=decay))
        (0.005 * w[0] + 2 * w[1] ** 2).backward()
        optimizer.step()
        torch.testing.assert_close(
            w.detach(), torch.tensor(want, dtype=torch.float64), atol=5e-8, rtol=0
        )


def _rates(cfg, per_batch):
    optimizer = training.make_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
    scheduler = training.make_scheduler(optimizer, cfg, 10)
    rates = []
    for _ in range(cfg["epochs"]):
        for batch in range(10):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if scheduler is not None and (per_batch or batch == 9):
                scheduler.step()
    return rates


def test_schedules_follow_their_closed_forms():
    cfg = config(lr=0.01, epochs=20, step_size=5, gamma=0.5)
    assert (
        training.make_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))]), cfg, 10)
        is None
    )
    step = _rates({**cfg, "scheduler": "step"}, per_batch=False)
    assert step == [0.01 * 0.5 ** (i // 50) for i in range(200)]
    cosine = _rates({**cfg, "scheduler": "cosine"}, per_batch=False)
    for i, rate in enumerate(cosine):
        assert math.isclose(
            rate, 0.01 * (1 + math.cos(math.pi * (i // 10) / 20)) / 2, abs_tol=1e-12
        )
    onecycle = _rates({**cfg, "scheduler": "onecycle"}, per_batch=True)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    # The same schedule built the other documented way: epochs and steps_per_epoch.
    twin = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=0.01, epochs=20, steps_per_epoch=10, cycle_momentum=False
    )
    for rate in onecycle:
        assert math.isclose(rate, optimizer.param_groups[0]["lr"], rel_tol=1e-12)
        optimizer.step()
        twin.step()
    assert math.isclose(onecycle[0], 0.01 / 25) and onecycle[59] == max(onecycle) == 0.01
    assert math.isclose(onecycle[-1], 0.01 / 25 / 1e4)


def test_onecycle_keeps_the_optimizers_momentum():
    for name, key, before in (("sgd", "momentum", 0), ("adam", "betas", (0.9, 0.999))):
        cfg = config(optimizer=name, scheduler="onecycle")
        optimizer = training.make_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
        training.make_scheduler(optimizer, cfg, 10)
        assert optimizer.param_groups[0][key] == before


def test_fit_history_has_one_loss_per_epoch_and_one_lr_per_step():
    for scheduler in training.SCHEDULERS:
        cfg = config(scheduler=scheduler, epochs=3, batch_size=64)
        history = training.fit(cfg)
        assert len(history["train_loss"]) == len(history["val_accuracy"]) == 3
        assert history["lr"] == _rates_for(cfg)
        assert all(type(v) is float for values in history.values() for v in values)


def _rates_for(cfg):
    optimizer = training.make_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
    batches = training.steps_per_epoch(300, cfg["batch_size"])
    scheduler = training.make_scheduler(optimizer, cfg, batches)
    per_batch = cfg["scheduler"] in training.PER_BATCH_SCHEDULERS
    rates = []
    for _ in range(cfg["epochs"]):
        for batch in range(batches):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if scheduler is not None and (per_batch or batch == batches - 1):
                scheduler.step()
    return rates


def test_fit_equals_one_epoch_written_out_by_hand():
    """Two batches (256 and 44) with dropout: weighted loss, then eval-mode accuracy."""
    cfg = config(optimizer="momentum", lr=0.1, epochs=1, batch_size=256, dropout=0.3, seed=5)
    history = training.fit(cfg)

    X_train, y_train, X_val, y_val = training.spiral_data()
    model = training.make_model(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    order = torch.randperm(300, generator=torch.Generator().manual_seed(5))
    weighted = 0.0
    for batch in (order[:256], order[256:]):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(X_train[batch]), y_train[batch])
        loss.backward()
        optimizer.step()
        weighted += loss.item() * len(batch)
    _, accuracy = evaluate(model, [(X_val, y_val)], torch.nn.CrossEntropyLoss(), "cpu")
    assert history["train_loss"] == [pytest.approx(weighted / 300, rel=1e-12)]
    assert history["val_accuracy"] == [pytest.approx(accuracy, rel=1e-6)]


def test_fit_is_deterministic_and_follows_the_seed():
    cfg = config(epochs=2, dropout=0.2)
    assert training.fit(cfg) == training.fit(cfg)
    assert training.fit(cfg) != training.fit({**cfg, "seed": 1})


@pytest.mark.parametrize("device", available_devices(), ids=str)
def test_fit_agrees_across_devices(device):
    cfg = config(epochs=2, scheduler="onecycle")
    cpu, there = training.fit(cfg), training.fit(cfg, device)
    tol = tolerance(torch.float32, device)
    assert cpu["lr"] == there["lr"]
    torch.testing.assert_close(
        torch.tensor(there["train_loss"]), torch.tensor(cpu["train_loss"]), **tol
    )
