"""Step through one training iteration of ``y = W·x + b``: every tensor, in the order it appears.

The engine, `step_through`, is a pure function from the example's numbers to a list of stages;
`draw_stage` draws one stage as a row of labelled "tensor cards" (a `StagesPicture`, which a
view keeps and updates); `step_through_view` wires both to sliders. Tests drive the engine; the
browser test checks that the view renders.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PolyCollection

from forge_course.reference.step import evaluate_linear, hand_step
from forge_course.sims.display import PALETTE, LiveFigure, show

#: The tensors shown, left to right, and the stage at which each one is computed.
CARDS = ("x", "W", "b", "y", "t", "loss", "dL_dy", "dL_dW", "dL_db", "W_new", "b_new", "loss_new")


@dataclass(frozen=True)
class Stage:
    """One moment of the iteration: a name, a sentence with numbers, the tensors known so far."""

    name: str
    caption: str
    values: dict[str, object] = field(default_factory=dict)
    new: tuple[str, ...] = ()


FIGSIZE = (11, 2.6)  # inches: the six cards of one stage


def _fmt(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return f"{value:.4g}"


def _numbers(value, name: str, dims: int) -> list:
    """``value`` as nested lists of floats with ``dims`` levels, or one sentence saying why not."""
    what = "a list of lists of numbers" if dims == 2 else "a list of numbers"
    try:
        array = np.asarray(value.tolist() if hasattr(value, "tolist") else value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} should be {what}, not {value!r}.") from None
    if array.ndim != dims or array.size == 0:
        raise ValueError(f"{name} should be {what}, but it has shape {list(array.shape)}.")
    return array.tolist()


def _checked(W, b, x, t) -> tuple[list, list, list, list]:
    """The example as plain lists, each shape fitting ``y = W·x + b`` with target ``t``."""
    W, b, x, t = (_numbers(v, n, d) for v, n, d in ((W, "W", 2), (b, "b", 1), (x, "x", 1),
                                                    (t, "t", 1)))  # fmt: skip
    outputs, inputs = len(W), len(W[0])
    if len(x) != inputs:
        raise ValueError(f"W has {inputs} columns but x has {len(x)} numbers: W·x needs one "
                         "column of W per input.")  # fmt: skip
    for name, vector in (("b", b), ("t", t)):
        if len(vector) != outputs:
            raise ValueError(f"W has {outputs} rows but {name} has {len(vector)} numbers: y, b "
                             "and t have one number per row of W.")  # fmt: skip
    return W, b, x, t


def step_through(W, b, x, t, lr: float = 0.01) -> list[Stage]:
    """The stages of one SGD iteration on ``y = W·x + b`` with MSE loss.

    Args:
        W, b, x, t: the layer, one input and its target, as nested lists of floats.
        lr: the learning rate.

    Returns:
        Six stages: inputs, forward, loss, backward, update, and the forward after the update.
        Each stage's ``values`` holds every tensor known at that point, ``new`` the ones it added.
    """
    W, b, x, t = _checked(W, b, x, t)
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0:
        raise ValueError(f"lr should be a positive number, not {lr!r}.")
    s = hand_step(W, b, x, t, lr)
    y_new, loss_new = evaluate_linear(s["W_new"], s["b_new"], x, t)
    known = {"x": x, "W": W, "b": b, "t": t}
    plan = [
        ("inputs", f"The batch x = {_fmt(x)} and target t = {_fmt(t)} meet the layer.", {}),
        ("forward", f"Forward: y = W·x + b = {_fmt(s['y'])}.", {"y": s["y"]}),
        ("loss", f"Loss: mean((y − t)²) = {_fmt(s['loss'])}.", {"loss": s["loss"]}),
        (
            "backward",
            f"Backward: dL/dy = 2(y − t)/{len(t)} = {_fmt(s['dL_dy'])}; "
            f"dL/dW = dL/dy ⊗ x; dL/db = dL/dy.",
            {"dL_dy": s["dL_dy"], "dL_dW": s["dL_dW"], "dL_db": s["dL_db"]},
        ),
        (
            "update",
            f"Step: W ← W − {lr:g}·dL/dW, b ← b − {lr:g}·dL/db.",
            {"W_new": s["W_new"], "b_new": s["b_new"]},
        ),
        (
            "check",
            f"Forward again: loss {_fmt(s['loss'])} → {_fmt(loss_new)} "
            f"({'lower' if loss_new < s['loss'] else 'not lower: lr too large?'}).",
            {"loss_new": loss_new},
        ),
    ]
    stages = []
    for name, caption, added in plan:
        known = {**known, **added}
        stages.append(Stage(name, caption, dict(known), tuple(added)))
    return stages


class StagesPicture:
    """`draw_stage`'s cards on one axes, made once: a stage changes the cards' colours, their
    values and the title, which a live figure redraws over the rest (`moving_artists`)."""

    def __init__(self, ax) -> None:
        self.ax = ax
        ax.set_xlim(0, len(CARDS))
        ax.set_ylim(0, 1)
        ax.axis("off")
        self.cards = ax.add_collection(
            PolyCollection(
                [[(i + 0.05, 0.1), (i + 0.95, 0.1), (i + 0.95, 0.8), (i + 0.05, 0.8)]
                 for i in range(len(CARDS))],
                edgecolor=PALETTE["black"],
            ),
            autolim=False,
        )  # fmt: skip
        self.values = []
        for i, name in enumerate(CARDS):
            ax.text(i + 0.5, 0.88, name, ha="center", va="bottom", fontsize=9, fontweight="bold")
            small = 6 if name.startswith(("W", "dL_dW")) else 7
            self.values.append(ax.text(i + 0.5, 0.45, "", ha="center", va="center", fontsize=small))
        self.title = ax.set_title(" ", fontsize=10)

    def moving_artists(self) -> list:
        """What `update` changes, in drawing order."""
        return [self.cards, *self.values, self.title]

    def update(self, stages: list[Stage], index: int) -> None:
        """Show stage ``index``: new tensors orange, known ones blue, future ones grey."""
        stage, colours = stages[index], []
        for name, value in zip(CARDS, self.values):
            if name in stage.new:
                colour, text = PALETTE["orange"], _fmt(stage.values[name])
            elif name in stage.values:
                colour, text = PALETTE["sky"], _fmt(stage.values[name])
            else:
                colour, text = "#eeeeee", "?"
            colours.append(colour)
            value.set_text(text.replace("], [", "],\n["))
        self.cards.set_facecolor(colours)
        self.title.set_text(f"Stage {index + 1}/{len(stages)}. {stage.caption}")


def draw_stage(stages: list[Stage], index: int, ax=None):
    """Draw stage ``index``: new tensors orange, known ones blue, future ones grey."""
    if ax is None:
        fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.clear()
    StagesPicture(ax).update(stages, index)
    return ax.figure


def step_through_view(W, b, x, t, lr: float = 0.01) -> None:
    """Sliders for the stage and the learning rate over the cards of `draw_stage`."""
    import ipywidgets as widgets

    stage_slider = widgets.IntSlider(0, 0, 5, description="stage", continuous_update=True)
    lr_slider = widgets.FloatLogSlider(lr, base=10, min=-3, max=0, description="lr")
    live = LiveFigure(FIGSIZE)
    picture = StagesPicture(live.fig.subplots())
    live.moving(picture.moving_artists)

    def redraw(*_):
        picture.update(step_through(W, b, x, t, lr_slider.value), stage_slider.value)
        live.refresh()

    stage_slider.observe(redraw, "value")
    lr_slider.observe(redraw, "value")
    redraw()
    box = widgets.VBox([widgets.HBox([stage_slider, lr_slider]), live.image])
    static = plt.figure(figsize=(11, 2.6 * 3))
    stages = step_through(W, b, x, t, lr)
    for row, index in enumerate((1, 3, 5)):
        draw_stage(stages, index, static.add_subplot(3, 1, row + 1))
    show(box, static)
