"""The bug detector: train a real small model with any mix of silent bugs, and record the curves.

The engine, `run`, trains a small classifier on a three-arm spiral with the bugs you switch on
and returns plain lists: the training loss, the norm of the gradient each update applies, the
autograd graphs and activation bytes still alive after each step, and, every few steps, the
validation loss measured twice in a row (their gap is zero exactly when evaluation is
deterministic). `draw` plots them; `bug_detector_view` puts checkboxes over both and re-runs on
every change. Runs are cached, so going back to a combination already seen only redraws.

Every bug is one line of the loop, switched on in `_train` by its code:

========================  ======================================================================
``no_zero_grad``          ``optimizer.zero_grad()`` is left out
``no_eval_mode``          validation runs without ``model.eval()`` (Dropout stays on)
``eval_records_graph``    validation runs without ``torch.no_grad()``
``kept_graph``            the loop logs ``history.append(loss)`` instead of ``loss.item()``
``retain_graph``          ``loss.backward(retain_graph=True)``
``softmax_before_ce``     the scores go through ``softmax`` before ``CrossEntropyLoss``
``stale_head``            a new head is put on the model after the optimizer was built
========================  ======================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import PathCollection
from matplotlib.font_manager import FontProperties
from matplotlib.markers import TICKLEFT
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
from torch import nn

from forge_course.data import make_spiral, train_val_split
from forge_course.reference.detectors import ActivationWatch, grad_norm
from forge_course.sims.display import PALETTE, LiveFigure, show
from forge_course.sims.outlines import outline, points

#: Each bug's code and the line it changes, in the order the checkboxes show them.
BUGS: dict[str, str] = {
    "no_zero_grad": "no optimizer.zero_grad()",
    "no_eval_mode": "validate without model.eval()",
    "eval_records_graph": "validate without torch.no_grad()",
    "kept_graph": "history.append(loss), not loss.item()",
    "retain_graph": "loss.backward(retain_graph=True)",
    "softmax_before_ce": "softmax before CrossEntropyLoss",
    "stale_head": "new head after the optimizer",
}

HIDDEN = 64  # units in each hidden layer
DROPOUT = 0.2  # probability of zeroing a hidden unit in train mode
BATCH_SIZE = 40  # 240 training points: 6 batches per epoch
LEARNING_RATE = 0.2  # SGD with momentum 0.9
EVAL_EVERY = 5  # validate every this many steps (and after the last one)

#: The curves `run` returns. Per step: ``loss``, ``grad_norm``, ``live_graphs``, ``live_kib``.
#: Per validation (at the steps in ``eval_step``): ``val_loss``, ``val_gap``, ``val_accuracy``.
CURVES = (
    "loss",
    "grad_norm",
    "live_graphs",
    "live_kib",
    "eval_step",
    "val_loss",
    "val_gap",
    "val_accuracy",
)


class SpiralNet(nn.Module):
    """2 → 64 → 64 → 3 with ReLU and Dropout; the last layer is kept apart as ``head``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(2, HIDDEN),
            nn.ReLU(),
            nn.Dropout(DROPOUT),
            nn.Linear(HIDDEN, HIDDEN),
            nn.ReLU(),
        )
        self.head = nn.Linear(HIDDEN, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores (logits), ``[batch, 3]``, for points ``[batch, 2]``."""
        return self.head(self.body(x))


Batch = tuple[torch.Tensor, torch.Tensor]


def make_data(seed: int) -> tuple[list[Batch], torch.Tensor, torch.Tensor]:
    """300 spiral points split 240 / 60: training batches in a fixed order, the validation set."""
    X, y = make_spiral(n_per_class=100, classes=3, noise=0.2, seed=seed)
    X_train, y_train, X_val, y_val = train_val_split(X, y, val_fraction=0.2, seed=seed)
    batches = list(zip(X_train.split(BATCH_SIZE), y_train.split(BATCH_SIZE)))
    return batches, X_val, y_val


def _validate(model, loss_fn, X_val, y_val, bugs) -> tuple[torch.Tensor, float]:
    modes = {module: module.training for module in model.modules()}  # put back below (ch06)
    if "no_eval_mode" not in bugs:
        model.eval()
    with torch.enable_grad() if "eval_records_graph" in bugs else torch.no_grad():
        scores = model(X_val)
        loss = loss_fn(scores, y_val)
    accuracy = (scores.argmax(dim=1) == y_val).float().mean().item()
    for module, training in modes.items():
        module.train(training)
    return loss, accuracy


def _train(bugs: frozenset[str], steps: int, seed: int, progress: Callable[[int], None] | None):
    torch.manual_seed(seed)
    batches, X_val, y_val = make_data(seed)
    model = SpiralNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9)
    if "stale_head" in bugs:
        model.head = nn.Linear(HIDDEN, 3)  # BUG: the optimizer holds the old head's parameters
    loss_fn = nn.CrossEntropyLoss()
    stepped = nn.ParameterList(p for group in optimizer.param_groups for p in group["params"])
    history: list = []
    curves: dict[str, list] = {key: [] for key in CURVES}
    with ActivationWatch(model) as watch:
        for step in range(1, steps + 1):
            x, y = batches[(step - 1) % len(batches)]
            if "no_zero_grad" not in bugs:
                optimizer.zero_grad()
            scores = model(x)
            if "softmax_before_ce" in bugs:
                scores = scores.softmax(dim=1)  # BUG: CrossEntropyLoss applies log-softmax itself
            loss = loss_fn(scores, y)
            loss.backward(retain_graph="retain_graph" in bugs)
            curves["grad_norm"].append(grad_norm(stepped))
            optimizer.step()
            history.append(loss if "kept_graph" in bugs else loss.item())
            curves["loss"].append(loss.item())
            if step % EVAL_EVERY == 0 or step == steps:
                # Validation's own Dropout draws must not change the training that follows, so
                # that a validation bug shows in validation only.
                with torch.random.fork_rng(devices=[]):
                    first, accuracy = _validate(model, loss_fn, X_val, y_val, bugs)
                    second, _ = _validate(model, loss_fn, X_val, y_val, bugs)
                history.append(first if "kept_graph" in bugs else first.item())
                curves["eval_step"].append(step)
                curves["val_loss"].append(first.item())
                curves["val_gap"].append(abs(first.item() - second.item()))
                curves["val_accuracy"].append(accuracy)
                del first, second
            curves["live_graphs"].append(watch.live_graphs())
            curves["live_kib"].append(watch.live_bytes() / 1024)
            if progress is not None:
                progress(step)
    return curves


# Finished runs by (bugs, steps, seed): ticking a box back returns at once. A run is a few
# kilobytes of floats, so even a long session of clicking stays small.
_CACHE: dict[tuple[frozenset[str], int, int], dict[str, list]] = {}


def run(
    bugs: Iterable[str] = (),
    steps: int = 150,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> dict[str, list]:
    """Train the spiral classifier for ``steps`` updates with ``bugs`` switched on.

    Args:
        bugs: codes from `BUGS`, in any combination.
        steps: optimizer updates (6 per epoch).
        seed: seeds the data, the initial weights, the Dropout masks.
        progress: called with the step number after every step; runs that are already cached
            return at once without calling it.

    Returns:
        A dict of plain lists, see `CURVES`. The same arguments give the same numbers.
    """
    bugs = frozenset(bugs)
    unknown = bugs - BUGS.keys()
    if unknown:
        raise ValueError(f"Unknown bug(s) {sorted(unknown)}; choose from {list(BUGS)}.")
    if steps < 1:
        raise ValueError(f"`steps` must be at least 1, got {steps}.")
    key = (bugs, steps, seed)
    if key not in _CACHE:
        threads = torch.get_num_threads()
        # The model is tiny: one thread avoids hand-offs that cost more than the arithmetic.
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
                _CACHE[key] = _train(bugs, steps, seed, progress)
        finally:
            torch.set_num_threads(threads)
    return {name: list(values) for name, values in _CACHE[key].items()}


# ---------------------------------------------------------------- the view


def log_axis(ax) -> None:
    """A log-scale y axis labelled 0.2, 0.5, 1, 2, 5, … rather than 10⁰ and a few bare ticks."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


FIGSIZE = (12, 5.6)

#: The panels of `draw`: curve, y label, title, log scale.
PANELS = (
    ("loss", "cross-entropy", "Training loss", True),
    ("grad_norm", "‖gradient‖ applied", "Gradient norm", True),
    ("val_accuracy", "accuracy", "Validation accuracy", False),
    ("live_graphs", "graphs alive", "Graphs alive after the step", False),
    ("live_kib", "activations held (KiB)", "Activations still held", False),
    ("val_gap", "|loss₁ − loss₂|", "Same model evaluated twice", False),
)

_MARGIN = 0.05  # of the data's span (in decades on a log axis), as matplotlib's autoscale


class _YAxis:
    """A panel's y axis drawn by hand over fixed axes limits (0 to 1), so that a run with
    another range moves a few artists instead of changing the axes: `LiveFigure.moving` then
    redraws only those, where new limits would redraw the whole figure (six panels, ~100 ms).

    Ticks, labels and margins are as matplotlib's would be: 1-2-5 labels on a log axis (minor
    ticks between), a few round ones on a linear axis, 5 % margins around the data.
    """

    def __init__(self, ax, log: bool) -> None:
        self.ax, self.log = ax, log
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.yaxis.set_label_coords(-0.17, 0.5)  # beside the widest label
        major, minor = (plt.rcParams[f"ytick.{size}.size"] for size in ("major", "minor"))
        along = ax.get_yaxis_transform()  # x in axes fractions, y in data (0 to 1)
        self.major = ax.plot([], [], ls="", marker=TICKLEFT, ms=major, mew=0.8, color="black",
                             transform=along, clip_on=False)[0]  # fmt: skip
        self.minor = ax.plot([], [], ls="", marker=TICKLEFT, ms=minor, mew=0.6, color="black",
                             transform=along, clip_on=False)[0]  # fmt: skip
        # The labels, one outline each (a dozen texts per run would cost more than the rest).
        self.pad = major + plt.rcParams["ytick.major.pad"]  # points left of the axis
        self.size = FontProperties(size=plt.rcParams["ytick.labelsize"]).get_size_in_points()
        self.labels = ax.add_collection(
            PathCollection([], offsets=np.empty((0, 2)), offset_transform=along,
                           transform=points(ax.figure), facecolor=plt.rcParams["ytick.color"],
                           edgecolor="none", clip_on=False),
            autolim=False,
        )  # fmt: skip
        self.scale = None  # data to axes fraction

    def marks(self) -> list:
        """The tick marks: drawn among the curves (matplotlib's order), the labels after."""
        return [self.major, self.minor]

    def fit(self, values: list[float]) -> None:
        """Set the range to show ``values`` (non-finite ones, and on a log axis non-positive
        ones, left out), and draw its ticks."""
        shown = [v for v in values if math.isfinite(v) and (v > 0 or not self.log)]
        if not shown:
            shown = [1.0]
        forward = math.log10 if self.log else float
        low, high = forward(min(shown)), forward(max(shown))
        if high - low < 1e-12 * max(abs(low), abs(high), 1.0):  # one value: widen as matplotlib
            low, high = (low - abs(low) * 0.05, high + abs(high) * 0.05) if low else (-0.05, 0.05)
        span = high - low
        low, high = low - _MARGIN * span, high + _MARGIN * span
        self.scale = (forward, low, high)
        if self.log:
            major = LogLocator(base=10, subs=(1.0, 2.0, 5.0)).tick_values(10**low, 10**high)
            minor = LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)).tick_values(
                10**low, 10**high
            )
            text = [f"{value:g}" for value in major]
        else:
            major = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
            minor = []
            # As few decimals as every tick needs, the same for all (ScalarFormatter's way).
            decimals = next(
                d for d in range(10) if all(abs(v * 10**d - round(v * 10**d)) < 1e-6 for v in major)
            )
            text = [f"{value + 0.0:.{decimals}f}".replace("-", "−") for value in major]
        inside = [(v, t) for v, t in zip(major, text) if low <= forward(v) <= high]
        self.major.set_data([0] * len(inside), self.to_axes([v for v, _ in inside]))
        minor = [v for v in minor if low <= forward(v) <= high]
        self.minor.set_data([0] * len(minor), self.to_axes(minor))
        left = {"x": -self.pad, "ha": "right", "va": "center"}
        self.labels.set_paths([outline(words, self.size, **left) for _, words in inside])
        self.labels.set_offsets([(0, y) for y in self.to_axes([v for v, _ in inside])])

    def to_axes(self, values) -> list[float]:
        """Data values as fractions of the axes' height (nan where they cannot be shown)."""
        forward, low, high = self.scale
        return [
            (forward(v) - low) / (high - low)
            if math.isfinite(v) and (v > 0 or not self.log)
            else float("nan")
            for v in values
        ]


class CurvesPicture:
    """`draw`'s six panels, made and laid out once. A new run moves the lines' data and the
    hand-drawn y axes (`_YAxis`), over a background that stays (see `moving_artists`)."""

    def __init__(self, fig, with_baseline: bool = True) -> None:
        self.fig = fig
        fig.subplots_adjust(left=0.06, right=0.99, bottom=0.09, top=0.86, wspace=0.28,
                            hspace=0.42)  # fmt: skip
        self.axes = list(fig.subplots(2, 3).flat)
        self.lines = []  # per panel: (this run's line, the baseline's line or None)
        self.y_axes = []
        for ax, (_, ylabel, name, log) in zip(self.axes, PANELS):
            # The baseline is drawn last, dashed: where a bug changes nothing, dashes lie on the
            # line.
            line = ax.plot([], [], "-", color=PALETTE["vermillion"], label="this run")[0]
            base = None
            if with_baseline:
                base = ax.plot([], [], "--", color=PALETTE["grey"], label="no bug")[0]
            self.lines.append((line, base))
            ax.set(title=name, xlabel="step", ylabel=ylabel)
            self.y_axes.append(_YAxis(ax, log))
        # In the top margin rather than on a panel, where the curves would be drawn over it.
        handles = [line for line in self.lines[0] if line is not None]
        fig.legend(handles=handles, loc="upper right", fontsize=8, ncols=2)
        self.title = fig.suptitle(" ", fontsize=11)

    def moving_artists(self) -> list:
        """What `update` changes, in drawing order: each panel's frame over its curves."""
        moving = []
        for ax, lines, y_axis in zip(self.axes, self.lines, self.y_axes):
            moving += [*lines, *y_axis.marks(), *ax.spines.values(), y_axis.labels]
        return [*moving, self.title]

    def update(self, curves: dict[str, list], baseline: dict[str, list] | None, title: str):
        steps = len(curves["loss"])
        for ax, (key, *_), lines, y_axis in zip(self.axes, PANELS, self.lines, self.y_axes):
            runs = [(run, line) for run, line in zip((curves, baseline), lines) if line is not None]
            y_axis.fit([v for run, _ in runs for v in run[key]])
            for run, line in runs:
                x = run["eval_step"] if key.startswith("val") else range(1, len(run[key]) + 1)
                line.set_data(list(x), y_axis.to_axes(run[key]))
            # Steps 1 … steps with autoscale's margins: the x axis changes only with `steps`.
            margin = _MARGIN * max(steps - 1, 1)
            ax.set_xlim(1 - margin, steps + margin)
        self.title.set_text(title or "Bug detector")


def draw(curves: dict[str, list], baseline: dict[str, list] | None = None, title: str = ""):
    """Six panels of a run's curves, over a dashed grey ``baseline`` (the bug-free run)."""
    fig = plt.figure(figsize=FIGSIZE)
    CurvesPicture(fig, with_baseline=baseline is not None).update(curves, baseline, title)
    return fig


def describe_bugs(bugs: Iterable[str]) -> str:
    """The switched-on bugs as one line, for a figure title."""
    bugs = [BUGS[b] for b in BUGS if b in set(bugs)]
    return "Bugs on: " + ("; ".join(bugs) if bugs else "none")


def bug_detector_view(initial: Iterable[str] = (), steps: int = 150, seed: int = 0) -> None:
    """Checkboxes for every bug, a steps slider, a progress bar and the six panels of `draw`."""
    import ipywidgets as widgets

    initial = set(initial)
    boxes = {
        code: widgets.Checkbox(
            value=code in initial, description=label, indent=False, layout={"width": "auto"}
        )
        for code, label in BUGS.items()
    }
    steps_slider = widgets.IntSlider(steps, 30, 300, step=30, description="steps")
    bar = widgets.IntProgress(0, 0, steps, description="training", layout={"visibility": "hidden"})
    live = LiveFigure(FIGSIZE)
    picture = CurvesPicture(live.fig)
    live.moving(picture.moving_artists)

    def chosen() -> set[str]:
        return {code for code, box in boxes.items() if box.value}

    def tick(step: int) -> None:
        if step % 10 == 0:
            bar.value = step

    def redraw(*_) -> None:
        n = steps_slider.value
        bar.max, bar.value = n, 0
        bar.layout.visibility = "visible"
        curves = run(chosen(), n, seed, progress=tick)
        baseline = run((), n, seed, progress=tick)
        bar.layout.visibility = "hidden"
        picture.update(curves, baseline, describe_bugs(chosen()))
        live.refresh()

    for box in boxes.values():
        box.observe(redraw, "value")
    steps_slider.observe(redraw, "value")
    redraw()
    columns = {"grid_template_columns": "repeat(3, max-content)", "grid_gap": "0 24px"}
    grid = widgets.GridBox(list(boxes.values()), layout=columns)
    show(widgets.VBox([grid, widgets.HBox([steps_slider, bar]), live.image]), live.fig)
