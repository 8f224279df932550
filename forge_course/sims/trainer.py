"""The training simulator: a real model on the spiral, one optimizer step at a time, bugs optional.

`Trainer(config)` runs the loop of `forge_course.reference.training.fit` one step per call, and
validates after every step, so a plot can follow the loss, the validation accuracy, the norm of
the gradient the optimizer used, and the learning rate as they happen. With no bug switched on,
a whole run gives exactly `fit`'s numbers (the tests check this). Bugs from the bug museum can be
switched on and off between steps (see `BUGS`). `lr_schedule` lists the learning rate of every
step of a config without training. `trainer_view` wires a `Trainer` to ipywidgets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import LinearSegmentedColormap
from matplotlib.ticker import FuncFormatter
from torch import nn

from forge_course.reference.training import (
    PER_BATCH_SCHEDULERS,
    complete_config,
    make_model,
    make_optimizer,
    make_scheduler,
    spiral_data,
    steps_per_epoch,
)
from forge_course.sims.display import PALETTE, LiveFigure, show

#: Loop bugs the simulator can inject, and what each one does to the loop.
BUGS = {
    "skip_zero_grad": "never call optimizer.zero_grad(): .grad is the sum of every gradient so far",
    "no_eval_mode": "validate without model.eval(): dropout keeps dropping units",
    "softmax_before_loss": "give CrossEntropyLoss probabilities (softmax) instead of logits",
    "wrong_scheduler_frequency": "step per-epoch schedules every batch, one-cycle once an epoch",
}

#: The simulator's default run: Adam with a cosine schedule, and dropout so eval mode matters.
SIM_CONFIG = {"optimizer": "adam", "lr": 0.01, "scheduler": "cosine", "dropout": 0.1}


def _generator_state(device: torch.device) -> torch.Tensor:
    """The state of the generator that dropout draws from on ``device``."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    if device.type == "mps":
        return torch.mps.get_rng_state()
    return torch.get_rng_state()


def _set_generator_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    elif device.type == "mps":
        torch.mps.set_rng_state(state)
    else:
        torch.set_rng_state(state)


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the body with ``count`` intra-op threads (None: leave torch's setting alone)."""
    previous = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class Trainer:
    """One training run on the spiral that advances one optimizer step per `step()` call.

    Args:
        config: a partial or complete training config (missing keys come from
            `DEFAULT_CONFIG`). Its ``epochs`` fix the run's length and the schedule.
        device: where the model and data live.
        bugs: names from `BUGS` to inject; `bugs` is a set that can change between steps.
        threads: intra-op threads for each step (None: torch's setting). A model this small
            gains little from more, and on a busy machine they cost time waiting for each
            other (chapter 08 measures both).

    Attributes:
        history: lists of the per-step metrics (the keys of `step`'s result but "step").
        steps_done, total_steps, batches_per_epoch: progress through the run, in steps.
    """

    def __init__(self, config: dict | None = None, device="cpu", bugs=(), threads: int | None = 1):
        self.threads = threads
        self.config = complete_config(config)
        self.bugs = set(bugs)
        unknown = self.bugs - set(BUGS)
        if unknown:
            raise ValueError(f"Unknown bug(s) {sorted(unknown)}; the bugs are {list(BUGS)}.")
        self.device = torch.device(device)
        self.X_train, self.y_train, self.X_val, self.y_val = (
            t.to(self.device) for t in spiral_data()
        )
        self.model = make_model(self.config).to(self.device)
        # make_model seeded torch; from here on this run's dropout masks come from its own copy
        # of the generator, so two trainers stepped in turn do not disturb each other.
        self._dropout_state = _generator_state(self.device)
        self.optimizer = make_optimizer(self.model.parameters(), self.config)
        self.batches_per_epoch = steps_per_epoch(len(self.X_train), self.config["batch_size"])
        self.total_steps = self.config["epochs"] * self.batches_per_epoch
        self.scheduler = make_scheduler(self.optimizer, self.config, self.batches_per_epoch)
        self.loss_fn = nn.CrossEntropyLoss()
        self._order_generator = torch.Generator().manual_seed(self.config["seed"])
        self._order = torch.empty(0, dtype=torch.int64)
        self.steps_done = 0
        self.history: dict[str, list[float]] = {
            key: [] for key in ("epoch", "loss", "val_accuracy", "grad_norm", "lr", "seconds")
        }

    @property
    def finished(self) -> bool:
        return self.steps_done >= self.total_steps

    def step(self) -> dict[str, float]:
        """One optimizer step on the next batch, then validation.

        Returns:
            ``step`` (steps done, from 1), ``epoch`` (fractional: 0.5 is half-way through the
            first), ``loss`` (this batch's training loss), ``val_accuracy`` (after the step),
            ``grad_norm`` (norm of all of ``.grad`` as the optimizer used it), ``lr`` (the rate
            this step used) and ``seconds`` (wall time of this call).

        Raises:
            RuntimeError: when the run's ``epochs`` are done (its schedule has ended).
        """
        if self.finished:
            raise RuntimeError(
                f"The run is over: its {self.total_steps} steps are done. Start a new Trainer."
            )
        start = time.perf_counter()
        outside = _generator_state(self.device)
        _set_generator_state(self.device, self._dropout_state)
        try:
            with torch_threads(self.threads):
                metrics = self._step()
        finally:
            self._dropout_state = _generator_state(self.device)
            _set_generator_state(self.device, outside)
        metrics["seconds"] = time.perf_counter() - start
        for key, value in metrics.items():
            if key != "step":
                self.history[key].append(value)
        return metrics

    def _step(self) -> dict[str, float]:
        position = self.steps_done % self.batches_per_epoch
        if position == 0:
            self._order = torch.randperm(len(self.X_train), generator=self._order_generator)
            self._order = self._order.to(self.device)
        size = self.config["batch_size"]
        batch = self._order[position * size : (position + 1) * size]

        self.model.train()
        if "skip_zero_grad" not in self.bugs:
            self.optimizer.zero_grad()
        output = self.model(self.X_train[batch])
        if "softmax_before_loss" in self.bugs:
            output = output.softmax(dim=1)
        loss = self.loss_fn(output, self.y_train[batch])
        loss.backward()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self._step_scheduler(end_of_epoch=position == self.batches_per_epoch - 1)
        self.steps_done += 1

        return {
            "step": self.steps_done,
            "epoch": self.steps_done / self.batches_per_epoch,
            "loss": loss.item(),
            "val_accuracy": self.validate(),
            "grad_norm": grad_norm.item(),
            "lr": lr,
        }

    def _step_scheduler(self, end_of_epoch: bool) -> None:
        if self.scheduler is None:
            return
        per_batch = self.config["scheduler"] in PER_BATCH_SCHEDULERS
        if "wrong_scheduler_frequency" in self.bugs:
            per_batch = not per_batch
        if per_batch or end_of_epoch:
            self.scheduler.step()

    def validate(self) -> float:
        """Accuracy on the 100 validation points, without a graph (in eval mode unless bugged)."""
        # Chapter 06's rule: give each module its own mode back, not model.train().
        modes = {module: module.training for module in self.model.modules()}
        if "no_eval_mode" not in self.bugs:
            self.model.eval()
        with torch.no_grad():
            predictions = self.model(self.X_val).argmax(dim=1)
        for module, training in modes.items():
            module.training = training
        return (predictions == self.y_val).float().mean().item()

    def run(self, steps: int | None = None, progress=None) -> list[dict[str, float]]:
        """Up to ``steps`` more steps (None: the rest); ``progress(done, total)`` after each."""
        remaining = self.total_steps - self.steps_done
        count = remaining if steps is None else min(steps, remaining)
        results = []
        for done in range(1, count + 1):
            results.append(self.step())
            if progress is not None:
                progress(done, count)
        return results

    def run_epoch(self, progress=None) -> list[dict[str, float]]:
        """The steps up to the end of the current epoch."""
        return self.run(self.batches_per_epoch - self.steps_done % self.batches_per_epoch, progress)

    def probabilities(self, resolution: int = 60, extent: float = 1.2) -> torch.Tensor:
        """``[resolution, resolution]`` probability of class 1 on a grid over the plane (eval mode).

        Row ``i`` is ``y = linspace(-extent, extent)[i]``, column ``j`` the same for ``x``.
        """
        axis = torch.linspace(-extent, extent, resolution)
        grid_y, grid_x = torch.meshgrid(axis, axis, indexing="ij")
        points = torch.stack([grid_x.flatten(), grid_y.flatten()], dim=1).to(self.device)
        # Chapter 06's rule: give each module its own mode back, not model.train().
        modes = {module: module.training for module in self.model.modules()}
        self.model.eval()
        with torch.no_grad():
            probs = self.model(points).softmax(dim=1)[:, 1]
        for module, training in modes.items():
            module.training = training
        return probs.reshape(resolution, resolution).cpu()


def lr_schedule(config: dict | None = None, per_batch: bool | None = None) -> list[float]:
    """The learning rate of every optimizer step of a run, without training.

    Args:
        config: a partial or complete training config.
        per_batch: step the scheduler after every batch (True) or once per epoch (False); None
            uses the right frequency for the schedule.
    """
    config = complete_config(config)
    optimizer = make_optimizer([nn.Parameter(torch.zeros(1))], config)
    batches = steps_per_epoch(len(spiral_data()[0]), config["batch_size"])
    scheduler = make_scheduler(optimizer, config, batches)
    if per_batch is None:
        per_batch = config["scheduler"] in PER_BATCH_SCHEDULERS
    rates = []
    for _ in range(config["epochs"]):
        for batch in range(batches):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()  # no gradient: nothing moves, but the scheduler sees a step first
            if scheduler is not None and (per_batch or batch == batches - 1):
                scheduler.step()
    return rates


# ---------------------------------------------------------------- the view


# Probability of class 1: class 0's blue through white to class 1's vermillion.
_REGIONS = LinearSegmentedColormap.from_list(
    "regions", [PALETTE["blue"], "#ffffff", PALETTE["vermillion"]]
)
_PLAIN = FuncFormatter(lambda value, _: f"{value:g}")
# Minor ticks of a log axis: label 2 and 5 of each decade only, so the labels do not collide.
_SPARSE = FuncFormatter(lambda value, _: f"{value:g}" if f"{value:.0e}"[0] in "25" else "")


FIGSIZE = (12, 5.2)
_RESOLUTION, _EXTENT = 60, 1.2  # the map's grid: points per side, and where it ends

#: The metric panels of `draw_trainer`: history key, y label, colour, y scale.
METRIC_PANELS = (
    ("loss", "training loss (batch)", PALETTE["blue"], "log"),
    ("val_accuracy", "validation accuracy", PALETTE["green"], "linear"),
    ("grad_norm", "gradient norm", PALETTE["orange"], "log"),
    ("lr", "learning rate", PALETTE["purple"], "linear"),
)

# Steps of a y limit: a limit moves only when the data cross one, so most steps redraw only
# the curves (a new limit redraws the whole figure). Log axes step by 1, 2, 5 per decade.
_LOG_STEPS, _LINEAR_STEPS = (1, 2, 5), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)


def _stepped(value: float, steps: tuple, *, up: bool) -> float:
    """The nearest ``step × 10ⁿ`` above ``value`` (``up``) or below it, for positive values."""
    decade = 10.0 ** math.floor(math.log10(value))
    candidates = [s * decade for s in (*steps, 10)] + [steps[-1] * decade / 10]
    if up:
        return min(c for c in candidates if c >= value * (1 - 1e-12))
    return max(c for c in candidates if c <= value * (1 + 1e-12))


def _y_limits(values: list[float], scale: str) -> tuple[str, tuple[float, float]]:
    """The scale and the stepped limits of a metric panel (0 to 1 when nothing is finite)."""
    finite = [v for v in values if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if scale == "log" and positive:
        low = _stepped(min(positive), _LOG_STEPS, up=False)
        return "log", (low, _stepped(max(max(positive), low * 1.01), _LOG_STEPS, up=True))
    if not finite:
        return "linear", (0.0, 1.0)
    low, high = min(finite), max(finite)
    top = _stepped(high * 1.05, _LINEAR_STEPS, up=True) if high > 0 else 0.0
    bottom = -_stepped(-low * 1.05, _LINEAR_STEPS, up=True) if low < 0 else 0.0
    return "linear", (bottom, top if top > bottom else 1.0)


class TrainerPicture:
    """`draw_trainer`'s figure, made once and laid out once (fixed margins): a step moves the
    map's pixels, the curves' data and the titles, redrawn over a kept background
    (`moving_artists`); y limits move in steps (see `_stepped`)."""

    def __init__(self, fig) -> None:
        self.fig = fig
        grid = fig.add_gridspec(
            2, 3, width_ratios=[1.25, 1, 1], left=0.06, right=0.985, bottom=0.1, top=0.88,
            wspace=0.32, hspace=0.42,
        )  # fmt: skip
        ax_map = self.ax_map = fig.add_subplot(grid[:, 0], aspect="equal")
        # A mesh of the probabilities' grid (as `Trainer.probabilities` samples it): cheaper to
        # draw per step than an image, which is resampled to the screen.
        edges = np.linspace(-_EXTENT, _EXTENT, _RESOLUTION + 1)
        self.regions = ax_map.pcolormesh(
            edges, edges, np.zeros((_RESOLUTION, _RESOLUTION)), cmap=_REGIONS, vmin=0, vmax=1,
            alpha=0.45,
        )  # fmt: skip
        self.points = [
            ax_map.scatter([], [], s=12, color=colour, label=f"class {label}")
            for label, colour in ((0, PALETTE["blue"]), (1, PALETTE["vermillion"]))
        ]
        ax_map.set(xlabel="x₁", ylabel="x₂", xlim=(-_EXTENT, _EXTENT), ylim=(-_EXTENT, _EXTENT))
        # Below the map, beside x₁, not on it: drawn once rather than over every new map.
        ax_map.legend(loc="upper left", bbox_to_anchor=(-0.03, -0.055), ncols=2, fontsize=8,
                      columnspacing=0.8, handletextpad=0.1, frameon=False)  # fmt: skip
        title = ax_map.set_title("Predicted regions after step", loc="left")
        self.step = ax_map.annotate(
            "",
            (1, 0),
            xycoords=title,
            xytext=(4, 0),
            va="bottom",
            textcoords="offset points",
            fontsize=title.get_fontsize(),
        )
        self.curves = []
        for index, (key, label, colour, _) in enumerate(METRIC_PANELS):
            ax = fig.add_subplot(grid[index // 2, 1 + index % 2])
            if key == "val_accuracy":  # made first, so the curve is drawn over it
                ax.axhline(0.9, color=PALETTE["grey"], ls="--", lw=1)
            self.curves.append(ax.plot([], [], color=colour, lw=1.2)[0])
            ax.set(xlabel="step", ylabel=label)
        self.title = fig.suptitle(" ", fontsize=11)

    def moving_artists(self) -> list:
        """What `update` changes, in drawing order: each axes' frame over its data."""
        ax_map = self.ax_map
        curves = [a for line in self.curves for a in (line, *line.axes.spines.values())]
        return [self.regions, *self.points, *ax_map.spines.values(), self.step, *curves,
                self.title]  # fmt: skip

    def update(self, trainer: Trainer) -> None:
        self.regions.set_array(trainer.probabilities(_RESOLUTION, _EXTENT).numpy())
        for label, points in enumerate(self.points):
            points.set_offsets(trainer.X_val[trainer.y_val == label].cpu().numpy())
        self.step.set_text(str(trainer.steps_done))
        history = trainer.history
        steps = range(1, len(history["loss"]) + 1)
        for line, (key, _, _, scale) in zip(self.curves, METRIC_PANELS):
            ax = line.axes
            values = [v if math.isfinite(v) else float("nan") for v in history[key]]
            line.set_data(steps, values)
            scale, limits = _y_limits(values, scale)
            if ax.get_yscale() != scale:  # a change of scale redraws the figure anyway
                ax.set_yscale(scale)
                if scale == "log":
                    ax.yaxis.set_major_formatter(_PLAIN)
                    ax.yaxis.set_minor_formatter(_SPARSE)
            ax.set_ylim((0.3, 1.02) if key == "val_accuracy" else limits)
            ax.set_xlim(0, max(trainer.total_steps, 1))
        bugs = ", ".join(sorted(trainer.bugs)) or "none"
        cfg = trainer.config
        self.title.set_text(
            f"{cfg['optimizer']}, lr {cfg['lr']:.3g}, {cfg['scheduler']} schedule, "
            f"batch {cfg['batch_size']}; bugs: {bugs}"
        )


def draw_trainer(trainer: Trainer, fig=None):
    """Decision regions on the spiral (left) and the four live metrics per step (right)."""
    if fig is None:
        fig = plt.figure(figsize=FIGSIZE)
    fig.clear()
    TrainerPicture(fig).update(trainer)
    return fig


def status_line(trainer: Trainer) -> str:
    """One line of text: where the run is and its latest metrics."""
    h = trainer.history
    text = (
        f"epoch {trainer.steps_done // trainer.batches_per_epoch}/{trainer.config['epochs']}, "
        f"step {trainer.steps_done}/{trainer.total_steps}"
    )
    if h["loss"]:
        text += (
            f" · lr {h['lr'][-1]:.4g} · loss {h['loss'][-1]:.4f} · "
            f"val acc {h['val_accuracy'][-1]:.0%} · grad norm {h['grad_norm'][-1]:.3g} · "
            f"last step {h['seconds'][-1] * 1e3:.2f} ms"
        )
    return text + (" · finished: press Reset" if trainer.finished else "")


def trainer_view(config: dict | None = None, device="cpu", warm_up_epochs: int = 5) -> None:
    """The simulator: controls for the optimizer, lr, schedule and bugs over a live `Trainer`.

    Changing the optimizer, lr or schedule starts a new run; bug boxes act on the next step.
    The run starts ``warm_up_epochs`` epochs in, so the still picture shows curves.
    """
    import ipywidgets as widgets

    base = complete_config({**SIM_CONFIG, **(config or {})})
    optimizer = widgets.Dropdown(
        options=["sgd", "momentum", "adam", "adamw"],
        value=base["optimizer"],
        description="optimizer",
    )
    lr = widgets.FloatLogSlider(
        base["lr"], base=10, min=-4, max=0.5, description="lr", continuous_update=False
    )
    scheduler = widgets.Dropdown(
        options=["constant", "step", "cosine", "onecycle"], value=base["scheduler"],
        description="schedule",
    )  # fmt: skip
    bug_boxes = {
        name: widgets.Checkbox(False, description=name, indent=False, tooltip=BUGS[name])
        for name in BUGS
    }
    step_button = widgets.Button(description="Step", tooltip="one optimizer step")
    epoch_button = widgets.Button(description="Train epoch", tooltip="to the end of this epoch")
    end_button = widgets.Button(description="Train to end", tooltip="every remaining epoch")
    reset_button = widgets.Button(description="Reset", tooltip="a new run with these settings")
    bar = widgets.IntProgress(0, 0, 1, description="progress")
    status = widgets.HTML()
    live = LiveFigure(FIGSIZE)
    picture = TrainerPicture(live.fig)
    live.moving(picture.moving_artists)
    state = {}

    def new_run(*_):
        cfg = {**base, "optimizer": optimizer.value, "lr": lr.value, "scheduler": scheduler.value}
        bugs = {name for name, box in bug_boxes.items() if box.value}
        state["trainer"] = Trainer(cfg, device=device, bugs=bugs)
        redraw()

    def redraw():
        trainer = state["trainer"]
        status.value = status_line(trainer)
        picture.update(trainer)
        live.refresh()

    def advance(run):
        trainer = state["trainer"]
        trainer.bugs = {name for name, box in bug_boxes.items() if box.value}
        bar.value, bar.max = 0, 1

        def progress(done, total):
            bar.max, bar.value = total, done

        run(trainer, progress)
        redraw()

    step_button.on_click(lambda _: advance(lambda t, p: t.run(1, p)))
    epoch_button.on_click(lambda _: advance(lambda t, p: t.run_epoch(p)))
    end_button.on_click(lambda _: advance(lambda t, p: t.run(None, p)))
    reset_button.on_click(new_run)
    for control in (optimizer, lr, scheduler):
        control.observe(new_run, "value")

    first = Trainer(base, device=device)
    first.run(warm_up_epochs * first.batches_per_epoch)
    state["trainer"] = first
    redraw()
    controls = widgets.VBox(
        [
            widgets.HBox([optimizer, lr, scheduler]),
            widgets.HBox(list(bug_boxes.values())),
            widgets.HBox([step_button, epoch_button, end_button, reset_button, bar]),
            status,
        ]
    )
    show(widgets.VBox([controls, live.image]), live.fig)
