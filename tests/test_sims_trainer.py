"""The simulator engine, headless: fast, faithful to `fit`, and each bug does what it says."""

import statistics
import time

import matplotlib
import pytest
import torch

from forge_course.reference import training
from forge_course.sims.trainer import (
    BUGS,
    SIM_CONFIG,
    Trainer,
    draw_trainer,
    lr_schedule,
    status_line,
    torch_threads,
)

matplotlib.use("Agg")


@pytest.mark.parametrize("config", [{}, SIM_CONFIG], ids=["default", "simulator"])
def test_one_step_takes_under_20_ms(config):
    trainer = Trainer(config)
    trainer.run(3)  # the first steps allocate
    seconds = []
    for _ in range(30):
        start = time.perf_counter()
        trainer.step()
        seconds.append(time.perf_counter() - start)
    assert statistics.median(seconds) < 0.020


@pytest.mark.parametrize("scheduler", training.SCHEDULERS)
def test_a_clean_run_gives_exactly_fits_numbers(scheduler):
    config = training.complete_config(
        {"scheduler": scheduler, "epochs": 3, "batch_size": 64, "dropout": 0.2, "seed": 2}
    )
    trainer = Trainer(config)
    trainer.run()
    history = training.fit(config)
    per_epoch = trainer.batches_per_epoch
    assert trainer.history["lr"] == history["lr"] == lr_schedule(config)
    ends = [trainer.history["val_accuracy"][per_epoch * (e + 1) - 1] for e in range(3)]
    assert ends == history["val_accuracy"]
    # fit's epoch loss is the size-weighted mean of the batch losses the trainer reports.
    sizes = [64] * 4 + [44]
    for epoch in range(3):
        losses = trainer.history["loss"][per_epoch * epoch : per_epoch * (epoch + 1)]
        mean = sum(loss * n for loss, n in zip(losses, sizes)) / 300
        assert mean == pytest.approx(history["train_loss"][epoch], rel=1e-9)


def test_step_reports_plain_numbers_and_the_run_ends_with_its_schedule():
    trainer = Trainer({"epochs": 1, "batch_size": 100})
    metrics = trainer.step()
    assert set(metrics) == {"step", "epoch", "loss", "val_accuracy", "grad_norm", "lr", "seconds"}
    assert metrics["step"] == 1 and metrics["epoch"] == pytest.approx(1 / 3)
    assert all(isinstance(v, (int, float)) for v in metrics.values())
    assert len(trainer.run()) == 2 and trainer.finished
    with pytest.raises(RuntimeError, match="run is over"):
        trainer.step()
    assert trainer.run() == []
    assert "finished" in status_line(trainer)


def test_run_epoch_stops_at_the_epoch_boundary_and_reports_progress():
    trainer = Trainer({"batch_size": 32})
    trainer.run(3)
    seen = []
    trainer.run_epoch(progress=lambda done, total: seen.append((done, total)))
    assert trainer.steps_done == 10 and seen[-1] == (7, 7)


def test_skip_zero_grad_sums_gradients_so_their_norm_climbs():
    clean, bugged = Trainer(SIM_CONFIG), Trainer(SIM_CONFIG, bugs=["skip_zero_grad"])
    first_clean, first_bugged = clean.step(), bugged.step()
    assert first_bugged["grad_norm"] == first_clean["grad_norm"]  # nothing to sum yet
    clean.run(99)
    bugged.run(99)
    assert bugged.history["grad_norm"][-1] > 10 * clean.history["grad_norm"][-1]


def test_no_eval_mode_changes_validation_only_when_there_is_dropout():
    for dropout, should_differ in ((0.0, False), (0.5, True)):
        config = {**SIM_CONFIG, "dropout": dropout}
        clean, bugged = Trainer(config), Trainer(config, bugs=["no_eval_mode"])
        clean.run(10)
        bugged.run(10)
        assert clean.history["loss"][0] == bugged.history["loss"][0]
        differs = clean.history["val_accuracy"] != bugged.history["val_accuracy"]
        assert differs == should_differ


def test_softmax_before_loss_feeds_probabilities_to_cross_entropy():
    config = {**SIM_CONFIG, "dropout": 0.0}  # no dropout: the first forward is deterministic
    trainer = Trainer(config, bugs=["softmax_before_loss"])
    model = training.make_model(trainer.config)
    first = torch.randperm(300, generator=torch.Generator().manual_seed(0))[:32]
    probabilities = model(trainer.X_train[first]).softmax(dim=1)
    expected = torch.nn.functional.cross_entropy(probabilities, trainer.y_train[first])
    assert trainer.step()["loss"] == pytest.approx(expected.item(), rel=1e-6)


def test_softmax_before_loss_learns_slower():
    clean, bugged = Trainer(SIM_CONFIG), Trainer(SIM_CONFIG, bugs=["softmax_before_loss"])
    clean.run(100)
    bugged.run(100)
    assert statistics.mean(bugged.history["loss"][-20:]) > statistics.mean(
        clean.history["loss"][-20:]
    )


@pytest.mark.parametrize("scheduler", ["step", "cosine", "onecycle"])
def test_wrong_scheduler_frequency_flips_per_batch_and_per_epoch(scheduler):
    config = {"scheduler": scheduler, "epochs": 4}
    trainer = Trainer(config, bugs=["wrong_scheduler_frequency"])
    trainer.run()
    right = lr_schedule(config)
    assert trainer.history["lr"] == lr_schedule(config, per_batch=scheduler != "onecycle")
    assert trainer.history["lr"] != right


def test_bugs_can_change_between_steps_and_must_exist():
    trainer = Trainer(SIM_CONFIG)
    trainer.run(5)
    trainer.bugs.add("skip_zero_grad")
    trainer.run(5)
    assert trainer.history["grad_norm"][-1] > trainer.history["grad_norm"][4]
    with pytest.raises(ValueError, match="Unknown bug"):
        Trainer(bugs=["no_zero_grad_typo"])
    assert set(BUGS) == {
        "skip_zero_grad", "no_eval_mode", "softmax_before_loss", "wrong_scheduler_frequency"
    }  # fmt: skip


def test_constant_schedule_ignores_the_frequency_bug():
    config = {"epochs": 2}
    trainer = Trainer(config, bugs=["wrong_scheduler_frequency"])
    trainer.run()
    assert set(trainer.history["lr"]) == {0.01}


def test_trainers_stepped_in_turn_do_not_disturb_each_other():
    alone = Trainer(SIM_CONFIG)
    alone.run(30)
    first, second = Trainer(SIM_CONFIG), Trainer({**SIM_CONFIG, "seed": 1})
    for _ in range(30):
        first.step()
        second.step()
        torch.rand(3)  # other code drawing from the global generator between steps
    assert first.history["loss"] == alone.history["loss"]


def test_threads_are_restored_after_each_step():
    before = torch.get_num_threads()
    Trainer(threads=1).step()
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


def test_probabilities_cover_a_grid_and_leave_train_mode_on():
    trainer = Trainer(SIM_CONFIG)
    trainer.run(20)
    probs = trainer.probabilities(resolution=25)
    assert probs.shape == (25, 25) and probs.min() >= 0 and probs.max() <= 1
    assert trainer.model.training


def test_validation_and_the_map_give_each_module_its_mode_back():
    # Chapter 06's rule: an evaluation helper restores each module's own mode, not model.train().
    trainer = Trainer(SIM_CONFIG)
    trainer.run(2)
    trainer.model.eval()  # a model being served
    trainer.probabilities(resolution=5)
    trainer.validate()
    assert not any(module.training for module in trainer.model.modules())


def test_the_drawing_has_a_map_and_four_metric_panels():
    trainer = Trainer(SIM_CONFIG)
    trainer.run(12)
    fig = draw_trainer(trainer)
    assert len(fig.axes) == 5
    assert [ax.get_ylabel() for ax in fig.axes[1:]] == [
        "training loss (batch)", "validation accuracy", "gradient norm", "learning rate"
    ]  # fmt: skip
    matplotlib.pyplot.close(fig)


def test_a_picture_updated_step_after_step_equals_one_drawn_fresh():
    import numpy as np

    from forge_course.sims.display import LiveFigure
    from forge_course.sims.trainer import FIGSIZE, TrainerPicture

    live = LiveFigure(FIGSIZE)
    picture = TrainerPicture(live.fig)
    live.moving(picture.moving_artists)  # as the view does: the curves over a kept background
    run = Trainer(SIM_CONFIG)
    for steps in (1, 5, 30, 1, 1):  # the log axes appear once a loss is positive
        run.run(steps)
        picture.update(run)
        live.pixels()
    run = Trainer({**SIM_CONFIG, "lr": 3.0}, bugs={"skip_zero_grad"})  # a new run, other scales
    run.run(12)
    picture.update(run)
    live.pixels()
    fresh = LiveFigure(FIGSIZE)
    TrainerPicture(fresh.fig).update(run)
    assert np.array_equal(live.pixels(), fresh.pixels())


def test_y_limits_move_in_steps_so_most_steps_keep_the_background():
    from forge_course.sims.trainer import _y_limits

    assert _y_limits([0.13, 0.91], "log") == ("log", (0.1, 1))
    assert _y_limits([0.13, 1.43, float("nan")], "log") == ("log", (0.1, 2))
    assert _y_limits([0.0058, 0.01], "linear") == ("linear", (0, 0.012))
    assert _y_limits([-1.0, 0.5], "log") == ("log", (0.5, 1))
    assert _y_limits([-0.3, 0.1], "linear") == ("linear", (-0.4, 0.12))
    assert _y_limits([float("inf")], "log") == ("linear", (0, 1))  # a new run: no data yet
