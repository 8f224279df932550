"""Module explorer: what a model tree registers, and where each piece lives.

The engine builds one of a few small models (`build`), walks it (`explore`) and returns one
`Row` per submodule: its parameters, buffers, hooks and devices. The walk also looks inside plain
Python lists, tuples and dicts held as attributes, where ``nn.Module`` never looks, and marks the
modules it finds there as unregistered: they are part of the forward pass, but not of
``parameters()``, ``state_dict()`` or ``.to()``. `draw` turns an `Exploration` into a table
figure (a `TablePicture`, which the view keeps and refills per choice), and
`module_explorer_view` wires the engine to a dropdown and two toggles.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
from matplotlib.collections import PolyCollection
from torch import nn

from forge_course.sims.display import PALETTE, LiveFigure, show
from forge_course.sims.pasted_text import PastedText

SIZES = (4, 8, 8, 3)  # the chapter's running example: 4 inputs, two hidden layers of 8, 3 outputs
CONTAINERS = ("plain list", "nn.ModuleList")


class ExplorerMLP(nn.Module):
    """The running example, with its hidden blocks in a plain list or in an ``nn.ModuleList``."""

    def __init__(self, blocks: list[nn.Module], head: nn.Module, container: str) -> None:
        super().__init__()
        if container not in CONTAINERS:
            raise ValueError(f"container must be one of {CONTAINERS}, got {container!r}")
        self.hidden = blocks if container == "plain list" else nn.ModuleList(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.hidden:
            x = torch.relu(block(x))
        return self.head(x)


def _linear_blocks(sizes):
    return [nn.Linear(a, b) for a, b in zip(sizes[:-2], sizes[1:-1])]


def _batchnorm_blocks(sizes):
    return [
        nn.Sequential(nn.Linear(a, b), nn.BatchNorm1d(b)) for a, b in zip(sizes[:-2], sizes[1:-1])
    ]


def _hooked(model: ExplorerMLP) -> ExplorerMLP:
    # The kind of hook an activation recorder adds: it lives on the layer object itself.
    model.hidden[-1].register_forward_hook(lambda module, inputs, output: None)
    return model


#: Preset name -> (blocks builder, finishing touch applied to the built model).
MODELS: dict[str, tuple[Callable, Callable[[ExplorerMLP], ExplorerMLP]]] = {
    "MLP": (_linear_blocks, lambda model: model),
    "MLP with BatchNorm": (_batchnorm_blocks, lambda model: model),
    "MLP with a forward hook": (_linear_blocks, _hooked),
}


def build(model: str, container: str, seed: int = 0) -> ExplorerMLP:
    """A fresh preset model on the CPU: ``model`` from `MODELS`, ``container`` from `CONTAINERS`."""
    make_blocks, finish = MODELS[model]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = make_blocks(SIZES)
        head = nn.Linear(SIZES[-2], SIZES[-1])
    return finish(ExplorerMLP(blocks, head, container))


@dataclass(frozen=True)
class Row:
    """One submodule: where it sits, what it owns, and where its tensors are."""

    path: str  # "hidden.0" when registered, "hidden[0]" when found in a plain container
    depth: int
    kind: str
    registered: bool  # reachable through model.named_modules()
    parameters: tuple[str, ...]  # "weight [8, 4]", its own only (not its children's)
    buffers: tuple[str, ...]  # "running_mean [8]"; "(not saved)" marks persistent=False
    hooks: int  # forward hooks and forward pre-hooks
    devices: tuple[str, ...]  # devices of its own parameters and buffers
    values: int  # number of values in its own parameters


@dataclass(frozen=True)
class Exploration:
    """A whole model tree and the totals that matter to the optimizer and to ``.to()``."""

    title: str
    rows: tuple[Row, ...]
    optimizer_sees: int  # values in model.parameters(): what an optimizer built from it updates
    total: int  # values in every parameter the forward pass uses, registered or not
    state_dict_entries: int
    devices: tuple[str, ...]


def _resolved(device: str) -> str:
    """``device`` as tensors report it: ``"cuda"`` becomes ``"cuda:0"``."""
    return str(torch.empty(0, device=device).device)


def _shape(tensor: torch.Tensor) -> str:
    return str(list(tensor.shape))


def _row(module: nn.Module, path: str, depth: int, registered: bool) -> Row:
    params = {k: p for k, p in module._parameters.items() if p is not None}
    buffers = {k: b for k, b in module._buffers.items() if b is not None}
    hidden = module._non_persistent_buffers_set
    return Row(
        path=path,
        depth=depth,
        kind=type(module).__name__,
        registered=registered,
        parameters=tuple(f"{k} {_shape(p)}" for k, p in params.items()),
        buffers=tuple(
            f"{k} {_shape(b)}" + (" (not saved)" if k in hidden else "") for k, b in buffers.items()
        ),
        hooks=len(module._forward_hooks) + len(module._forward_pre_hooks),
        devices=tuple(sorted({str(t.device) for t in [*params.values(), *buffers.values()]})),
        values=sum(p.numel() for p in params.values()),
    )


def _unregistered(module: nn.Module):
    """Modules held in plain lists, tuples or dicts among ``module``'s ordinary attributes."""
    for attr, value in vars(module).items():
        if attr.startswith("_"):  # _parameters, _modules, _forward_hooks, …: the registries
            continue
        if isinstance(value, (list, tuple)):
            items = [(f"{attr}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, dict):
            items = [(f"{attr}[{k!r}]", v) for k, v in value.items()]
        else:
            continue
        yield from ((name, v) for name, v in items if isinstance(v, nn.Module))


def explore(model: nn.Module) -> list[Row]:
    """Every submodule of ``model``, depth first, registered or found in a plain container."""
    rows: list[Row] = []

    def walk(module: nn.Module, path: str, depth: int, registered: bool) -> None:
        rows.append(_row(module, path, depth, registered))
        prefix = f"{path}." if path else ""
        for name, child in module._modules.items():
            if child is not None:
                walk(child, prefix + name, depth + 1, registered)
        for name, child in _unregistered(module):
            walk(child, prefix + name, depth + 1, False)

    walk(model, "", 0, True)
    return rows


def explore_preset(model: str, container: str, moved_to: str | None = None) -> Exploration:
    """Build a preset, optionally call ``.to(moved_to)`` on it, and explore the result."""
    net = build(model, container)
    if moved_to is not None:
        net.to(moved_to)
    rows = tuple(explore(net))
    where = f", after .to('{moved_to}')" if moved_to else ", as built"
    article = "an" if container.startswith("nn.") else "a"
    return Exploration(
        title=f"{model}, hidden layers in {article} {container}{where}",
        rows=rows,
        optimizer_sees=sum(p.numel() for p in net.parameters()),
        total=sum(row.values for row in rows),
        state_dict_entries=len(net.state_dict()),
        devices=tuple(sorted({d for row in rows for d in row.devices})),
    )


#: (left edge, heading) of the table's columns, in axes fractions; the device column comes last.
_COLUMNS = ((0.0, "module"), (0.27, "parameters"), (0.49, "buffers"), (0.83, "hooks"))
_DEVICE_COLUMN = 0.89


def figsize(exploration: Exploration) -> tuple[float, float]:
    """Inches for `draw` of ``exploration`` alone: a third of an inch per row."""
    return (11, 0.34 * len(exploration.rows) + 1.4)


def fit_figure(fig, exploration: Exploration) -> None:
    """Size a one-table ``fig`` for ``exploration`` (`figsize`), with margins in inches that fit
    the two-line title (a layout engine would measure the figure at every draw)."""
    width, height = figsize(exploration)
    fig.set_size_inches(width, height)
    fig.subplots_adjust(left=0.1 / width, right=1 - 0.1 / width, bottom=0.05 / height,
                        top=1 - 0.55 / height)  # fmt: skip


_SMALL = {"fontsize": 7.5, "color": PALETTE["black"]}  # the parameters, buffers and hooks


def _row_texts(exploration: Exploration, target: str | None) -> list[tuple]:
    """The texts of the table's rows as ``(x, y, text, style)``, row ``i`` (from 1) centred at
    ``y = i + 0.5``; ``target`` as in `draw`."""
    target = _resolved(target) if target is not None else None
    texts = []
    for i, row in enumerate(exploration.rows, start=1):
        mark = "" if row.registered else "✗ "
        label = "    " * row.depth + mark + (row.path or "(the model)") + f"  {row.kind}"
        colour = PALETTE["black"] if row.registered else PALETTE["vermillion"]
        texts.append((0.005, i + 0.5, label, {"fontsize": 8, "color": colour}))
        cells = (", ".join(row.parameters), ", ".join(row.buffers), str(row.hooks or ""))
        for (x, _), text in zip(_COLUMNS[1:], cells):
            texts.append((x + 0.005, i + 0.5, text or "–", _SMALL))
        left_behind = target is not None and any(d != target for d in row.devices)
        device = {
            "fontsize": 8,
            "color": PALETTE["vermillion"] if left_behind else PALETTE["blue"],
            "fontweight": "bold" if left_behind else "normal",
        }
        texts.append((_DEVICE_COLUMN + 0.005, i + 0.5, ", ".join(row.devices) or "–", device))
    return texts


def _cell(x: float, y: float, text: str, **style) -> PastedText:
    """A table cell's text, left-aligned, centred on its row: the cells repeat from one choice
    to the next, so they are pasted, not drawn glyph by glyph (50 ms for a model with
    BatchNorm)."""
    return PastedText(x, y, text, ha="left", va="center", **style)


def render_every_cell(target: str, dpi: float) -> None:
    """Draw, once, every cell `module_explorer_view` can show for ``target`` (moved there or
    not), so that no first choice of a model waits for its texts (30 ms for a model with
    BatchNorm, at Agg's 0.1 ms a glyph)."""
    for model in MODELS:
        for container in CONTAINERS:
            for moved_to in (target, None):
                exploration = explore_preset(model, container, moved_to=moved_to)
                for x, y, text, style in _row_texts(exploration, moved_to):
                    _cell(x, y, text, **style).picture(dpi)


class TablePicture:
    """`draw`'s table on one axes: a choice moves, rewrites, shows or hides the texts it holds
    and reshapes the rows' shading, and the title says what the table shows.

    Nothing is cleared or made anew per choice: clearing an axes rebuilds its ticks, even off,
    and every new artist is garbage to collect later.
    """

    def __init__(self, ax) -> None:
        self.ax = ax
        ax.axis("off")
        ax.set_xlim(0, 1)
        for x, name in (*_COLUMNS, (_DEVICE_COLUMN, "device")):
            ax.add_artist(_cell(x + 0.005, 0.5, name, fontsize=9, fontweight="bold"))
        # One collection for the rows' shading: a patch each would cost 0.7 ms to add.
        self.shading = ax.add_collection(
            PolyCollection([], edgecolors=PALETTE["grey"], linewidths=0.5), autolim=False
        )
        self.cells: list[PastedText] = []  # as many as the longest table shown so far
        self.footer = ax.add_artist(
            _cell(
                0.005,
                0,
                "✗ shaded rows: modules in a plain Python container, outside the tree that "
                "parameters(), state_dict() and .to() walk. Bold vermillion device: left behind "
                "by .to().",
                fontsize=7.5,
                color=PALETTE["grey"],
            )
        )
        # Placed (y given), not measured against the axes' ticks at every draw: they are off.
        self.title = ax.set_title(" \n ", fontsize=10, loc="left", y=1.0)

    def update(self, exploration: Exploration, target: str | None = None) -> None:
        """Show ``exploration``; ``target`` as in `draw`."""
        ax, rows = self.ax, exploration.rows
        n = len(rows) + 1
        ax.set_ylim(n + 0.8, 0)
        self.shading.set_verts(
            [[(0, i + 0.05), (0, i + 0.95), (1, i + 0.95), (1, i + 0.05)] for i in range(1, n)]
        )
        self.shading.set_facecolor(["#ffffff" if row.registered else "#f6d9c7" for row in rows])
        texts = _row_texts(exploration, target)
        while len(self.cells) < len(texts):
            self.cells.append(ax.add_artist(_cell(0, 0, "")))
        for cell, shown in itertools.zip_longest(self.cells, texts):
            cell.set_visible(shown is not None)
            if shown is not None:
                x, y, text, style = shown
                cell.set(x=x, y=y, text=text, **{"fontweight": "normal", **style})
        self.footer.set_y(n + 0.4)
        self.title.set_text(
            f"{exploration.title}\nmodel.parameters(): {exploration.optimizer_sees} of "
            f"{exploration.total} values · state_dict(): {exploration.state_dict_entries} "
            f"entries · devices: {', '.join(exploration.devices)}"
        )


def draw(exploration: Exploration, ax=None, target: str | None = None):
    """Draw the tree as a table: one line per submodule, unregistered ones in vermillion.

    ``target`` is the device the model was asked to move to; a tensor left elsewhere is
    highlighted.
    """
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize(exploration))
    else:
        fig = ax.figure
    ax.clear()
    TablePicture(ax).update(exploration, target)
    return fig


def _static_figure(target: str):
    """Plain list and ModuleList side by side, both after ``.to(target)``: the default story."""
    explorations = [explore_preset("MLP", c, moved_to=target) for c in CONTAINERS]
    heights = [len(e.rows) + 1.8 for e in explorations]
    fig, axes = plt.subplots(
        2, 1, figsize=(11, 0.34 * sum(heights) + 2.6), gridspec_kw={"height_ratios": heights}
    )
    for ax, exploration in zip(axes, explorations):
        draw(exploration, ax, target=target)
    fig.tight_layout()
    return fig


def module_explorer_view(target: str = "meta") -> None:
    """A dropdown for the model and toggles for its container and for ``.to(target)``."""
    import ipywidgets as widgets

    model = widgets.Dropdown(options=list(MODELS), value="MLP", description="model")
    container = widgets.ToggleButtons(options=list(CONTAINERS), description="layers in")
    moved = widgets.ToggleButtons(
        options=["as built", f"after .to('{target}')"],
        value=f"after .to('{target}')",
        description="device",
    )
    live = LiveFigure((11, 1.4))
    table = TablePicture(live.fig.subplots())
    render_every_cell(target, live.fig.dpi)

    def redraw(*_):
        where = target if moved.value != "as built" else None
        exploration = explore_preset(model.value, container.value, moved_to=where)
        fit_figure(live.fig, exploration)  # the rows of this model
        table.update(exploration, target=where)
        live.refresh()

    for control in (model, container, moved):
        control.observe(redraw, "value")
    redraw()
    show(widgets.VBox([model, container, moved, live.image]), _static_figure(target))
