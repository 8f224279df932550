"""Train mode and eval mode side by side: the same batch, two copies of one model, one button.

Each press of "forward" sends the same batch through two copies of a small trained network,
``Linear → BatchNorm1d → Tanh → Dropout → Linear``: one in train mode, one in eval mode. The
engine records what a learner should see: which hidden units dropout zeroed, which mean batch
norm subtracted, the outputs, and the memory autograd saved for backward.

Two copies, not one: a train-mode forward moves batch norm's running statistics, and in a single
model that would move the eval-mode outputs too (chapter 06 shows that separately).

`LiveGraphMemory` measures "memory held by graphs" exactly and on any device: it sees every
tensor autograd saves for backward and counts it for as long as some graph still holds it.
`TrainVsEval` is the engine (no drawing), `draw_presses` draws presses, and
`train_vs_eval_view` wires both to buttons.
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import PathCollection, PolyCollection

from forge_course.sims.display import PALETTE, LiveFigure, show
from forge_course.sims.outlines import outline, points

__all__ = [
    "LiveGraphMemory",
    "Side",
    "Press",
    "TrainVsEval",
    "draw_presses",
    "PressesPicture",
    "train_vs_eval_view",
]


class _Held:
    """What a graph stores instead of a saved tensor while `LiveGraphMemory` records."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        # A detached alias shares the memory but not the graph: holding the tensor itself could
        # make a cycle (a saved output refers to the node that saved it).
        self.tensor = tensor.detach()


def _is_parameter(tensor: torch.Tensor) -> bool:
    owner = tensor._base if tensor._base is not None else tensor
    return isinstance(owner, torch.nn.Parameter)


def _storage_bytes(held: Iterable[_Held | None]) -> int:
    storages = {}
    for item in held:
        if item is not None:
            storage = item.tensor.untyped_storage()
            storages[(str(item.tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


class LiveGraphMemory:
    """Bytes that autograd saved for backward, and how many of them a live graph still holds.

    Use it as a context manager around forward passes, as often as you like. After each block,
    `recorded_bytes` is what autograd saved inside that block; `live_bytes()` is what is still
    held, from every block so far. A graph dies, and its saved tensors with it, when nothing
    refers to its outputs any more, so `live_bytes()` falls back as soon as the last reference
    (an output, a loss, a running total) goes. Counting follows
    `forge_course.reference.memory.saved_activation_bytes`: each storage once, in full,
    parameters left out.

    Example:
        >>> memory = LiveGraphMemory()
        >>> layer = torch.nn.Linear(4, 3)
        >>> with memory:
        ...     out = layer(torch.zeros(5, 4))  # the linear layer saves its 5×4 input
        >>> memory.recorded_bytes, memory.live_bytes()
        (80, 80)
        >>> del out
        >>> memory.live_bytes()
        0
    """

    def __init__(self) -> None:
        self._held: weakref.WeakSet[_Held] = weakref.WeakSet()
        self._block: list[weakref.ref] = []
        self._hooks = None
        self.recorded_bytes = 0

    def _pack(self, tensor: torch.Tensor):
        if _is_parameter(tensor):
            return tensor
        held = _Held(tensor)
        self._held.add(held)
        self._block.append(weakref.ref(held))
        return held

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Held) else packed

    def __enter__(self) -> LiveGraphMemory:
        if self._hooks is not None:
            raise RuntimeError("LiveGraphMemory is already recording: its blocks cannot nest.")
        self._block = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None
        self.recorded_bytes = _storage_bytes(ref() for ref in self._block)
        self._block = []

    def live_bytes(self) -> int:
        """Bytes of the distinct storages still held by graphs recorded under this object."""
        return _storage_bytes(list(self._held))


@dataclass(frozen=True)
class Side:
    """One copy's forward on the batch, as plain lists (rows are examples).

    Attributes:
        hidden: ``[batch][hidden]`` activations after dropout.
        dropped: ``[batch][hidden]`` True where dropout zeroed the unit.
        outputs: ``[batch][classes]`` the model's outputs.
        mean_used: per hidden unit, the mean batch norm subtracted (the batch's mean in train
            mode, the running mean in eval mode).
        running_mean: per hidden unit, batch norm's running mean after this forward.
    """

    hidden: list[list[float]]
    dropped: list[list[bool]]
    outputs: list[list[float]]
    mean_used: list[float]
    running_mean: list[float]


@dataclass(frozen=True)
class Press:
    """One press of "forward": both sides, and the memory autograd saved.

    Attributes:
        number: 1 for the first press.
        train, eval: the train-mode and the eval-mode copy's forward.
        no_grad: whether both forwards ran under ``torch.no_grad()``.
        saved_train_bytes, saved_eval_bytes: bytes saved for backward by the train-mode and
            the eval-mode forward of this press (0 under no_grad).
        held_bytes: bytes still held by graphs after the press: those of the kept outputs.
        kept: how many outputs are kept so far (with ``keep=True``).
    """

    number: int
    train: Side
    eval: Side
    no_grad: bool
    saved_train_bytes: int
    saved_eval_bytes: int
    held_bytes: int
    kept: int


_VMAX = 2.0  # colour scale of activations and outputs: values beyond ±2 saturate


def _rows(tensor: torch.Tensor) -> list:
    return tensor.detach().cpu().double().tolist()


class TrainVsEval:
    """The engine: two copies of one small trained model, and a fixed batch to push through.

    Args:
        seed: seed of the weights, the batch and every dropout mask (press ``k`` draws its mask
            from ``seed`` and ``k``, so a replay gives the same presses).
        p: dropout probability.
        batch: examples in the batch (at least 2: batch norm needs two to take a variance).
        features, hidden, classes: the network's sizes.
    """

    def __init__(
        self,
        seed: int = 0,
        p: float = 0.5,
        batch: int = 4,
        features: int = 3,
        hidden: int = 8,
        classes: int = 3,
    ):
        if batch < 2:
            raise ValueError("Batch norm in train mode needs at least 2 examples per batch.")
        self.seed = seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = torch.nn.Sequential(
                torch.nn.Linear(features, hidden),
                torch.nn.BatchNorm1d(hidden),
                torch.nn.Tanh(),
                torch.nn.Dropout(p),
                torch.nn.Linear(hidden, classes),
            )
            # Give batch norm running statistics that have seen data, as after training.
            with torch.no_grad():
                for _ in range(20):
                    model(torch.randn(16, features) + 0.5)
            self.x = torch.randn(batch, features) + 0.5
        self.train_model = model.train()
        self.eval_model = copy.deepcopy(model).eval()
        self.memory = LiveGraphMemory()
        self.kept: list[torch.Tensor] = []
        self.presses = 0
        self.p = p

    @property
    def p(self) -> float:
        """The dropout probability of both copies (eval mode ignores it)."""
        return self.train_model[3].p

    @p.setter
    def p(self, value: float) -> None:
        if not 0 <= value < 1:
            raise ValueError(f"The dropout probability must be in [0, 1), got {value}.")
        self.train_model[3].p = self.eval_model[3].p = value

    @staticmethod
    def _forward(model: torch.nn.Sequential, x: torch.Tensor) -> tuple[torch.Tensor, Side]:
        linear, norm, tanh, dropout, head = model
        pre = linear(x)
        # Train mode normalises with this batch's statistics, eval mode with the running ones.
        mean_used = pre.mean(dim=0) if norm.training else norm.running_mean.clone()
        active = tanh(norm(pre))
        hidden = dropout(active)
        out = head(hidden)
        side = Side(
            hidden=_rows(hidden),
            dropped=((hidden == 0) & (active != 0)).tolist(),
            outputs=_rows(out),
            mean_used=_rows(mean_used),
            running_mean=_rows(norm.running_mean),
        )
        return out, side

    def press(self, no_grad: bool = False, keep: bool = False) -> Press:
        """Send the batch through both copies once.

        Args:
            no_grad: run both forwards under ``torch.no_grad()``.
            keep: keep both outputs in a list afterwards (as a loop that stores its losses
                would), so their graphs, if any, stay alive.
        """
        self.presses += 1
        grad_mode = torch.no_grad() if no_grad else nullcontext()
        with torch.random.fork_rng(devices=[]), grad_mode:
            torch.manual_seed(self.seed * 1_000_003 + self.presses)
            # A fresh batch tensor for each forward, as a DataLoader gives.
            with self.memory:
                train_out, train_side = self._forward(self.train_model, self.x.clone())
            saved_train = self.memory.recorded_bytes
            with self.memory:
                eval_out, eval_side = self._forward(self.eval_model, self.x.clone())
            saved_eval = self.memory.recorded_bytes
        if keep:
            self.kept += [train_out, eval_out]
        del train_out, eval_out
        return Press(
            number=self.presses,
            train=train_side,
            eval=eval_side,
            no_grad=no_grad,
            saved_train_bytes=saved_train,
            saved_eval_bytes=saved_eval,
            held_bytes=self.memory.live_bytes(),
            kept=len(self.kept),
        )


def _figsize(rows: int) -> tuple[float, float]:
    return (12, 2.6 * rows + 2.0)


# The picture's layout, in inches: laid out once rather than by a layout engine per press, so
# that a press redraws only what it changes. Each row of heatmaps is 1.6 inches high.
_TOP, _ROW_GAP, _MEMORY_GAP, _MEMORY, _BOTTOM = 0.95, 1.0, 0.8, 0.8, 0.5
_LEFT, _RIGHT, _COLUMN_GAP, _MEMORY_LEFT = 0.85, 0.3, 0.6, 2.9
_TEXT_SIZE, _NUMBER_SIZE, _LINE = 8.5, 7.5, 10.5  # points; _LINE: baseline to baseline


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 × 10ⁿ at least ``value``: the memory axis changes only in steps."""
    decade = 10 ** math.floor(math.log10(value))
    return next(step * decade for step in (1, 2, 5, 10) if step * decade >= value)


class _SidePanels:
    """One copy's two panels (activations after dropout, outputs), updated in place.

    What a press changes is drawn cheaply: heatmaps as meshes, the output values as one
    collection of outlines, and beside three fixed lines of text only their three numbers.
    """

    def __init__(self, ax_hidden, ax_out, batch: int, hidden: int, classes: int, mode: str):
        self.ax_hidden, self.ax_out = ax_hidden, ax_out
        colours = {"cmap": "PuOr", "vmin": -_VMAX, "vmax": _VMAX}
        self.hidden = ax_hidden.pcolormesh(
            np.arange(hidden + 1) - 0.5, np.arange(batch + 1) - 0.5, np.zeros((batch, hidden)),
            **colours,
        )  # fmt: skip
        # A grey square and a cross over every unit that dropout zeroed.
        self.squares = ax_hidden.add_collection(
            PolyCollection([], facecolor=PALETTE["grey"], edgecolor="none", alpha=0.9),
            autolim=False,
        )
        self.crosses = ax_hidden.scatter([], [], marker="x", s=20, color="black", lw=1)
        ax_hidden.set(xlabel="hidden unit (after dropout)", ylabel="example")
        ax_hidden.set(xticks=range(hidden), yticks=range(batch), ylim=(batch - 0.5, -0.5))
        self.outputs = ax_out.pcolormesh(
            np.arange(classes + 1) - 0.5, np.arange(batch + 1) - 0.5, np.zeros((batch, classes)),
            **colours,
        )  # fmt: skip
        cells = [(j, i) for i in range(batch) for j in range(classes)]
        self.values = ax_out.add_collection(
            PathCollection([], offsets=cells, offset_transform=ax_out.transData,
                           transform=points(ax_out.figure), edgecolor="none"),
            autolim=False,
        )  # fmt: skip
        ax_out.set_title("outputs", fontsize=_TEXT_SIZE)
        ax_out.set(xlabel="class", ylabel="example", xticks=range(classes), yticks=[])
        ax_out.set_ylim(batch - 0.5, -0.5)
        lines = (
            ["TRAIN mode · units dropped:", "BN subtracts this batch's mean, unit 0:",
             "its running mean moves, unit 0 now:"]
            if mode == "TRAIN"
            else ["EVAL mode · units dropped:", "BN subtracts its running mean, unit 0:",
                  "the running mean stays, unit 0 still:"]
        )  # fmt: skip
        # Three fixed lines above the heatmap, drawn once; beside them, the numbers a press
        # changes, as outlines on the same baselines (what text costs is per line and glyph).
        baselines = [_LINE * (len(lines) - row) - 4 for row in range(len(lines))]
        texts = [
            ax_hidden.annotate(words, (0, 1), xycoords="axes fraction", xytext=(0, baseline),
                               textcoords="offset points", va="baseline", fontsize=_TEXT_SIZE,
                               annotation_clip=False)
            for words, baseline in zip(lines, baselines)
        ]  # fmt: skip
        fig = ax_hidden.figure
        renderer = fig.canvas.get_renderer()  # the widths as Agg draws them, hinted
        width = max(text.get_window_extent(renderer).width for text in texts) * 72 / fig.dpi
        self.number_places = [(width + 4, baseline) for baseline in baselines]
        self.numbers = ax_hidden.add_collection(
            PathCollection([], offsets=[(0, 1)], offset_transform=ax_hidden.transAxes,
                           transform=points(fig), facecolor="black", edgecolor="none",
                           clip_on=False),
            autolim=False,
        )  # fmt: skip

    def moving_artists(self) -> list:
        """What `update` changes, in drawing order: each axes' frame is drawn over its data."""
        spines = [list(ax.spines.values()) for ax in (self.ax_hidden, self.ax_out)]
        return [self.hidden, self.squares, self.crosses, *spines[0], self.outputs, self.values,
                *spines[1], self.numbers]  # fmt: skip

    def update(self, side: Side) -> None:
        self.hidden.set_array(np.asarray(side.hidden))
        dropped = [(j, i) for i, row in enumerate(side.dropped) for j, d in enumerate(row) if d]
        self.squares.set_verts(
            [[(j - 0.5, i - 0.5), (j + 0.5, i - 0.5), (j + 0.5, i + 0.5), (j - 0.5, i + 0.5)]
             for j, i in dropped]
        )  # fmt: skip
        self.crosses.set_offsets(dropped if dropped else np.empty((0, 2)))
        self.outputs.set_array(np.asarray(side.outputs))
        values = [value for row in side.outputs for value in row]
        self.values.set_paths(
            [outline(f"{value:.2f}", _NUMBER_SIZE, ha="center", va="center") for value in values]
        )
        self.values.set_facecolor(
            ["white" if abs(value) > 0.6 * _VMAX else "black" for value in values]
        )
        units = len(side.dropped) * len(side.dropped[0])
        numbers = [f"{sum(map(sum, side.dropped))} of {units}", f"{side.mean_used[0]:+.3f}",
                   f"{side.running_mean[0]:+.3f}"]  # fmt: skip
        self.numbers.set_paths(
            [outline(text, _TEXT_SIZE, *at) for text, at in zip(numbers, self.number_places)]
        )


class PressesPicture:
    """`draw_presses`'s picture for ``rows`` presses, its artists made once and then updated:
    a press changes data and a few short texts, not the figure. It is laid out once, without a
    layout engine, so a live figure can redraw only `moving_artists`."""

    def __init__(self, fig, rows: int, batch: int, hidden: int, classes: int) -> None:
        self.fig, self.rows = fig, rows
        width, height = fig.get_size_inches()
        row = (height - _TOP - _ROW_GAP * (rows - 1) - _MEMORY_GAP - _MEMORY - _BOTTOM) / rows
        column = (width - _LEFT - _RIGHT - 3 * _COLUMN_GAP) / 4  # the mean width
        grid = fig.add_gridspec(
            rows, 4, width_ratios=[8, 3, 8, 3], left=_LEFT / width, right=1 - _RIGHT / width,
            top=1 - _TOP / height, bottom=(_BOTTOM + _MEMORY + _MEMORY_GAP) / height,
            wspace=_COLUMN_GAP / column, hspace=_ROW_GAP / row,
        )  # fmt: skip
        self.sides, self.row_labels = [], []
        for r in range(rows):
            axes = [fig.add_subplot(grid[r, col]) for col in range(4)]
            self.sides.append(
                (_SidePanels(*axes[:2], batch, hidden, classes, "TRAIN"),
                 _SidePanels(*axes[2:], batch, hidden, classes, "EVAL"))
            )  # fmt: skip
            # Which press a row shows, and whether it recorded graphs, once for both copies.
            self.row_labels.append(
                axes[0].annotate("", (0, 0.5), xycoords="axes fraction", xytext=(-42, 0),
                                 textcoords="offset points", rotation=90, ha="center",
                                 va="center", fontsize=9, fontweight="bold")
            )  # fmt: skip
        memory = fig.add_gridspec(
            1, 1, left=_MEMORY_LEFT / width, right=1 - _RIGHT / width,
            bottom=_BOTTOM / height, top=(_BOTTOM + _MEMORY) / height,
        )  # fmt: skip
        ax = self.memory_ax = fig.add_subplot(memory[0, 0])
        colours = [PALETTE["orange"], PALETTE["blue"], PALETTE["vermillion"]]
        self.bars = ax.barh(range(3), [0] * 3, color=colours)
        self.bar_texts = [ax.text(0, i, "", va="center", fontsize=8) for i in range(3)]
        ax.invert_yaxis()
        ax.set_yticks(range(3), ["saved by the train-mode forward",
                                 "saved by the eval-mode forward",
                                 "still held by graphs of kept outputs"])  # fmt: skip
        ax.set_xlabel("bytes saved for backward, measured with saved-tensor hooks")
        ax.set_ylabel("measurement")
        ax.set_xlim(0, 1)
        ax.set_title("Memory after the last press", fontsize=9, loc="left")
        fig.suptitle(
            "One batch through two copies of one model: train mode (left), eval mode (right)"
        )

    @classmethod
    def for_presses(cls, fig, presses: list[Press]) -> PressesPicture:
        side = presses[-1].train
        return cls(fig, len(presses[-2:]), len(side.hidden), len(side.hidden[0]),
                   len(side.outputs[0]))  # fmt: skip

    def moving_artists(self) -> list:
        """What `update` changes, in drawing order (for `LiveFigure.moving`)."""
        panels = [a for sides in self.sides for side in sides for a in side.moving_artists()]
        return [*panels, *self.row_labels, *self.bars, *self.memory_ax.spines.values(),
                *self.bar_texts]  # fmt: skip

    def update(self, presses: list[Press]) -> None:
        """Show the last ``rows`` presses and the memory of the last one."""
        shown = presses[-self.rows :]
        for (train_panels, eval_panels), label, press in zip(self.sides, self.row_labels, shown):
            train_panels.update(press.train)
            eval_panels.update(press.eval)
            label.set_text(f"press {press.number} · {'no_grad' if press.no_grad else 'grad on'}")
        last = presses[-1]
        values = [last.saved_train_bytes, last.saved_eval_bytes, last.held_bytes]
        texts = [f" {value:,} bytes" for value in values]
        texts[2] += f" · {last.kept} outputs kept"
        for bar, label, value, text in zip(self.bars, self.bar_texts, values, texts):
            bar.set_width(value)
            label.set_x(value)
            label.set_text(text)
        self.memory_ax.set_xlim(0, _nice_ceiling(max(values + [1]) * 1.3))


def draw_presses(presses: list[Press]):
    """Draw the last two presses (one row each) and the memory bars of the last one.

    Dropped units are grey with a cross; colour is the value (purple negative, orange
    positive). Beside each row: the press, and whether it recorded graphs; above each heatmap,
    how many units dropout zeroed and which mean batch norm subtracted.
    """
    fig = plt.figure(figsize=_figsize(len(presses[-2:])))
    PressesPicture.for_presses(fig, presses).update(presses)
    return fig


def train_vs_eval_view(seed: int = 0, p: float = 0.5) -> None:
    """A "forward" button over `TrainVsEval`, with dropout, no_grad and keep-outputs controls.

    It opens on two presses, the same picture a viewer without widgets gets.
    """
    import ipywidgets as widgets

    forward = widgets.Button(description="forward", tooltip="send the batch through both copies")
    reset = widgets.Button(description="reset", tooltip="start again from the trained model")
    p_slider = widgets.FloatSlider(p, min=0.0, max=0.9, step=0.1, description="dropout p")
    no_grad = widgets.Checkbox(False, description="torch.no_grad()")
    keep = widgets.Checkbox(False, description="keep outputs in a list")
    sim = TrainVsEval(seed=seed, p=p)
    state = {"sim": sim, "presses": [sim.press(), sim.press()], "picture": None, "live": None}
    image = widgets.Box()  # holds the live figure's image; a new one only if the rows change

    def render():
        presses, picture = state["presses"], state["picture"]
        if picture is None or picture.rows != len(presses[-2:]):
            live = state["live"] = LiveFigure(_figsize(len(presses[-2:])))
            picture = state["picture"] = PressesPicture.for_presses(live.fig, presses)
            live.moving(picture.moving_artists)
            image.children = [live.image]
        picture.update(presses)
        state["live"].refresh()
        return picture.fig

    def on_forward(*_):
        state["sim"].p = p_slider.value
        state["presses"].append(state["sim"].press(no_grad=no_grad.value, keep=keep.value))
        render()

    def on_reset(*_):
        state["sim"], state["presses"] = TrainVsEval(seed=seed, p=p_slider.value), []
        on_forward()

    forward.on_click(on_forward)
    reset.on_click(on_reset)
    controls = [widgets.HBox([forward, reset, p_slider]), widgets.HBox([no_grad, keep])]
    static = render()
    show(widgets.VBox([*controls, image]), static)
