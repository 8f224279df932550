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
import weakref
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch

from forge_course.sims.display import PALETTE, LiveFigure, show

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


class _SidePanels:
    """One copy's two panels (activations after dropout, outputs), updated in place."""

    def __init__(self, ax_hidden, ax_out, batch: int, hidden: int, classes: int) -> None:
        self.ax_hidden, self.ax_out = ax_hidden, ax_out
        blank = [[0.0] * hidden for _ in range(batch)]
        self.hidden = ax_hidden.imshow(blank, cmap="PuOr", vmin=-_VMAX, vmax=_VMAX, aspect="auto")
        # A grey square and a cross over every unit, shown where dropout zeroed it.
        self.masks = [
            [
                (
                    ax_hidden.add_patch(
                        plt.Rectangle((j - 0.5, i - 0.5), 1, 1, color=PALETTE["grey"], alpha=0.9)
                    ),
                    ax_hidden.text(j, i, "×", ha="center", va="center", fontsize=9),
                )
                for j in range(hidden)
            ]
            for i in range(batch)
        ]
        ax_hidden.set(xlabel="hidden unit (after dropout)", ylabel="example")
        ax_hidden.set(xticks=range(hidden), yticks=range(batch))
        blank = [[0.0] * classes for _ in range(batch)]
        self.outputs = ax_out.imshow(blank, cmap="PuOr", vmin=-_VMAX, vmax=_VMAX, aspect="auto")
        self.values = [
            [ax_out.text(j, i, "", ha="center", va="center", fontsize=7.5) for j in range(classes)]
            for i in range(batch)
        ]
        ax_out.set_title("outputs", fontsize=8.5)
        ax_out.set(xlabel="class", ylabel="example", xticks=range(classes), yticks=[])

    def update(self, side: Side, title: str) -> None:
        self.hidden.set_data(side.hidden)
        for row, masks in zip(side.dropped, self.masks):
            for dropped, (square, cross) in zip(row, masks):
                square.set_visible(dropped)
                cross.set_visible(dropped)
        self.ax_hidden.set_title(title, fontsize=8.5, loc="left")
        self.outputs.set_data(side.outputs)
        for row, texts in zip(side.outputs, self.values):
            for value, text in zip(row, texts):
                text.set_text(f"{value:.2f}")
                text.set_color("white" if abs(value) > 0.6 * _VMAX else "black")


class PressesPicture:
    """`draw_presses`'s picture for ``rows`` presses, its artists made once and then updated:
    a press changes data, visibility and text, not the figure."""

    def __init__(self, fig, rows: int, batch: int, hidden: int, classes: int) -> None:
        self.fig, self.rows = fig, rows
        grid = fig.add_gridspec(
            rows + 1, 4, width_ratios=[8, 3, 8, 3], height_ratios=[3] * rows + [1.6]
        )
        self.sides = []
        for row in range(rows):
            axes = [fig.add_subplot(grid[row, col]) for col in range(4)]
            self.sides.append(
                (_SidePanels(*axes[:2], batch, hidden, classes),
                 _SidePanels(*axes[2:], batch, hidden, classes))
            )  # fmt: skip
        ax = self.memory_ax = fig.add_subplot(grid[-1, :])
        colours = [PALETTE["orange"], PALETTE["blue"], PALETTE["vermillion"]]
        self.bars = ax.barh(range(3), [0] * 3, color=colours)
        self.bar_texts = [ax.text(0, i, "", va="center", fontsize=8) for i in range(3)]
        ax.invert_yaxis()
        ax.set_xlabel("bytes saved for backward, measured with saved-tensor hooks")
        ax.set_ylabel("measurement")
        fig.suptitle(
            "One batch through two copies of one model: train mode (left), eval mode (right)"
        )

    @classmethod
    def for_presses(cls, fig, presses: list[Press]) -> PressesPicture:
        side = presses[-1].train
        return cls(fig, len(presses[-2:]), len(side.hidden), len(side.hidden[0]),
                   len(side.outputs[0]))  # fmt: skip

    def update(self, presses: list[Press]) -> None:
        """Show the last ``rows`` presses and the memory of the last one."""
        for (train_panels, eval_panels), press in zip(self.sides, presses[-self.rows :]):
            train, evaluation = press.train, press.eval
            grad = "under no_grad" if press.no_grad else "grad on"
            units = len(train.dropped) * len(train.dropped[0])
            train_panels.update(
                train,
                f"press {press.number} · TRAIN mode ({grad}) · "
                f"{sum(map(sum, train.dropped))} of {units} units dropped\n"
                f"BN subtracts this batch's mean (unit 0: {train.mean_used[0]:+.3f});\n"
                f"its running mean moves: unit 0 now {train.running_mean[0]:+.3f}",
            )
            eval_panels.update(
                evaluation,
                f"press {press.number} · EVAL mode ({grad}) · no unit dropped\n"
                f"BN subtracts its running mean (unit 0: {evaluation.mean_used[0]:+.3f});\n"
                f"the running mean stays: unit 0 still {evaluation.running_mean[0]:+.3f}",
            )
        last = presses[-1]
        labels = [
            "saved by the train-mode forward",
            "saved by the eval-mode forward",
            f"still held: graphs of {last.kept} kept outputs",
        ]
        values = [last.saved_train_bytes, last.saved_eval_bytes, last.held_bytes]
        for bar, text, value in zip(self.bars, self.bar_texts, values):
            bar.set_width(value)
            text.set_x(value)
            text.set_text(f" {value:,} bytes")
        ax = self.memory_ax
        ax.set_yticks(range(3), labels)
        ax.set_xlim(0, max(values + [1]) * 1.3)
        ax.set_title(f"Memory after press {last.number}", fontsize=9, loc="left")


def draw_presses(presses: list[Press]):
    """Draw the last two presses (one row each) and the memory bars of the last one.

    Dropped units are grey with a cross; colour is the value (purple negative, orange
    positive). Each panel's title says which mean batch norm subtracted.
    """
    fig = plt.figure(figsize=_figsize(len(presses[-2:])), layout="constrained")
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
            live = state["live"] = LiveFigure(_figsize(len(presses[-2:])), layout="constrained")
            picture = state["picture"] = PressesPicture.for_presses(live.fig, presses)
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
