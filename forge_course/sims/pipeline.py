"""The DataLoader pipeline for one epoch: which indices form each batch, and who builds it.

    Dataset → sampler → batch sampler → workers → collate → model

The engine, `plan_epoch`, is a pure function that reproduces what a map-style ``DataLoader``
does with ``generator=torch.Generator().manual_seed(seed)`` (and ``persistent_workers=False``):

- the **sampler** gives the epoch's order of indices: ``0 .. N-1``, or with ``shuffle`` a
  permutation drawn from the loader's generator, after the one number the loader draws first as
  the workers' base seed;
- the **batch sampler** cuts that order into lists of ``batch_size`` indices; the last list is
  shorter, or dropped with ``drop_last``;
- the main process hands batch ``k`` to worker ``k mod num_workers`` (round robin) and keeps
  ``num_workers × prefetch_factor`` batches requested ahead of the model: those are requested
  as the epoch starts, and batch ``k`` after them while batch ``k − num_workers ×
  prefetch_factor`` is handed to the model (without workers, batch ``k`` is loaded while it is
  handed over: nothing is prepared ahead);
- the worker calls ``dataset[i]`` for each index and **collates** the items into one batch.

`draw_plan` draws a plan; `pipeline_view` wires both to widgets. Tests check the engine against a
real DataLoader, worker ids and request order included.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.patches import FancyBboxPatch

from forge_course.sims.display import PALETTE, LiveFigure, show
from forge_course.sims.outlines import outline, points, text_width

MAIN_PROCESS = -1  # the "worker" id of batches built by the main process (num_workers=0)
WORKER_COLOURS = [PALETTE[c] for c in ("blue", "orange", "green", "purple", "sky", "yellow")]
_DARK = {PALETTE["blue"], PALETTE["green"]}  # fills that need white digits


@dataclass(frozen=True)
class EpochPlan:
    """One epoch of a DataLoader, as plain lists.

    Attributes:
        order: the sampler's order of all ``N`` indices.
        batches: the index lists the batch sampler yields, in order.
        workers: for each batch, the worker that builds it (`MAIN_PROCESS` without workers).
        requested_with: for each batch, the batch being handed to the model when the main
            process requested it, or None for the batches requested as the epoch starts.
        unseen: indices in no batch this epoch (the tail that ``drop_last`` cuts).
        base_seed: the loader's draw for the workers' seeds: worker ``w`` seeds torch and
            `random` with ``base_seed + w``, and NumPy with a state mixed from both.
        settings: the arguments the plan was made from.
    """

    order: list[int]
    batches: list[list[int]]
    workers: list[int]
    requested_with: list[int | None]
    unseen: list[int]
    base_seed: int
    settings: dict


def plan_epoch(
    n: int,
    batch_size: int,
    shuffle: bool = False,
    drop_last: bool = False,
    num_workers: int = 0,
    seed: int = 0,
    epoch: int = 0,
    prefetch_factor: int = 2,
) -> EpochPlan:
    """What ``DataLoader(range(n), batch_size, shuffle, drop_last=..., num_workers=...,
    generator=torch.Generator().manual_seed(seed))`` does in its ``epoch``-th epoch (from 0).

    Args:
        n: examples in the dataset.
        batch_size: examples per batch.
        shuffle: draw a new permutation each epoch (``RandomSampler``) instead of ``0 .. n-1``.
        drop_last: drop the last batch if it is short.
        num_workers: worker processes; 0 builds every batch in the main process.
        seed: seed of the loader's generator.
        epoch: which epoch; every earlier epoch is assumed to have run to its end, advancing
            the generator by its draws.
        prefetch_factor: batches each worker is asked for ahead of the model (ignored with 0
            workers, where nothing is prepared ahead).

    Returns:
        An `EpochPlan`.
    """
    for name, value, least in [("n", n, 1), ("batch_size", batch_size, 1),
                               ("num_workers", num_workers, 0), ("epoch", epoch, 0),
                               ("prefetch_factor", prefetch_factor, 1)]:  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"`{name}` must be a whole number of at least {least}, got {value!r}.")
    generator = torch.Generator().manual_seed(seed)
    for past in range(epoch + 1):
        # Each epoch's iterator draws the workers' base seed first, then the sampler its order.
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
        order = torch.randperm(n, generator=generator).tolist() if shuffle else list(range(n))
        if shuffle and past < epoch:
            # RandomSampler draws one more permutation (and uses none of it) when an epoch
            # runs to its end: the generator moves on by that draw too.
            torch.randperm(n, generator=generator)
    batches = [order[start : start + batch_size] for start in range(0, n, batch_size)]
    if drop_last and len(batches[-1]) < batch_size:
        batches.pop()
    seen = sum(len(b) for b in batches)
    ahead = num_workers * prefetch_factor
    return EpochPlan(
        order=order,
        batches=batches,
        workers=[k % num_workers if num_workers else MAIN_PROCESS for k in range(len(batches))],
        requested_with=[k - ahead if k >= ahead else None for k in range(len(batches))],
        unseen=order[seen:],
        base_seed=base_seed,
        settings={
            "n": n, "batch_size": batch_size, "shuffle": shuffle, "drop_last": drop_last,
            "num_workers": num_workers, "seed": seed, "epoch": epoch,
            "prefetch_factor": prefetch_factor,
        },
    )  # fmt: skip


def summary(plan: EpochPlan) -> str:
    """One line of counts: batches, the last batch's size, examples left unseen."""
    sizes = [len(b) for b in plan.batches]
    line = f"{len(sizes)} batches"
    if sizes and sizes[-1] != sizes[0]:
        line += f" ({len(sizes) - 1} of {sizes[0]}, last of {sizes[-1]})"
    elif sizes:
        line += f" of {sizes[0]}"
    return line + f", {len(plan.unseen)} examples unseen"


def _worker_label(worker: int) -> str:
    return "main process" if worker == MAIN_PROCESS else f"worker {worker}"


def _colour(worker: int) -> str:
    return PALETTE["grey"] if worker == MAIN_PROCESS else WORKER_COLOURS[worker % 6]


def _request_note(plan: EpochPlan, k: int) -> str:
    with_batch = plan.requested_with[k]
    if plan.settings["num_workers"] == 0:
        return "loaded when the model asks for it"
    if with_batch is None:
        return "requested as the epoch starts"
    return f"requested as batch {with_batch} goes to the model"


STAGES = ["Dataset", "Sampler", "Batch sampler", "Workers", "collate_fn", "Model"]


def _stage_details(plan: EpochPlan) -> list[str]:
    s = plan.settings
    workers = s["num_workers"]
    return [
        f"N = {s['n']}\n__getitem__(i)",
        "shuffled order" if s["shuffle"] else "0, 1, 2, ...",
        f"B = {s['batch_size']}\ndrop_last={s['drop_last']}",
        f"{workers} processes" if workers else "none: main\nprocess loads",
        "items → one\nbatch tensor",
        f"{len(plan.batches)} steps",
    ]


class _Words:
    """Many short texts drawn as one collection of glyph outlines (`outlines`): a Text artist
    costs about a millisecond to draw, and a plan shows a hundred indices and a label and a
    note per batch."""

    def __init__(self, ax, fontsize: float, ha: str, bold: bool = False) -> None:
        self.ax, self.fontsize, self.ha, self.bold, self.words = ax, fontsize, ha, bold, []
        self.collection = PathCollection([], offset_transform=ax.transData, linewidths=0,
                                         zorder=3, clip_on=False)  # fmt: skip
        ax.add_collection(self.collection, autolim=False)

    def set(self, words: list[str], where: list[tuple[float, float]], colours: list[str],
            fontsize: float | None = None) -> None:  # fmt: skip
        """``words[i]`` at ``where[i]`` (data coordinates), aligned by ``ha``, centred on y."""
        size = fontsize or self.fontsize
        self.collection.set_transform(points(self.ax.figure))
        self.words = list(words)
        self.collection.set_paths(
            [outline(w, size, ha=self.ha, va="center", bold=self.bold) for w in words]
        )
        self.collection.set_offsets(np.array(where, dtype=float).reshape(-1, 2))
        self.collection.set_facecolors(colours)


class PlanPicture:
    """`draw_plan`'s picture, built once for a figure: the stages' boxes, names and arrows stay;
    an update sets the figure's height (by the batches) and the stages' details, and draws the
    batches as collections: cells, their indices, the rows' labels and notes."""

    def __init__(self, fig) -> None:
        self.fig = fig
        self.top, self.bottom = top, bottom = fig.add_axes((0, 0, 1, 1)), fig.add_axes((0, 0, 1, 1))
        width = 1 / len(STAGES)
        self.centres = [i * width + 0.012 + (width - 0.05) / 2 for i in range(len(STAGES))]
        arrows = []
        for i in range(len(STAGES)):
            x = i * width + 0.012
            top.add_patch(FancyBboxPatch((x, 0.08), width - 0.05, 0.84, boxstyle="round,pad=0.01",
                                         fc="#f2f2f2", ec=PALETTE["black"], lw=0.8))  # fmt: skip
            if i < len(STAGES) - 1:  # "->" from this box to the next: shaft and head
                tail, tip = x + width - 0.04, (i + 1) * width + 0.01
                arrows += [(tail, 0.5), (tip, 0.5), (np.nan, np.nan), (tip - 0.008, 0.56),
                           (tip, 0.5), (tip - 0.008, 0.44), (np.nan, np.nan)]  # fmt: skip
        top.plot(*zip(*arrows), color=PALETTE["black"], lw=1.2)
        names = _Words(top, 9, "center", bold=True)
        names.set(STAGES, [(x, 0.68) for x in self.centres], ["black"] * len(STAGES))
        self.details = _Words(top, 7.5, "center")
        # One swatch per worker, in its batches' colour, inside the Workers box.
        self.swatches = PolyCollection([], linewidths=0)
        self.workers_x = STAGES.index("Workers") * width + 0.012
        top.add_collection(self.swatches, autolim=False)
        top.set_xlim(0, 1)
        top.set_ylim(0, 1)
        top.axis("off")
        self.cells = PolyCollection([], edgecolors="white", alpha=0.85)
        self.unseen = PolyCollection([], facecolors="#dddddd", edgecolors="white", alpha=0.85,
                                     hatch="///")  # fmt: skip
        for cells in (self.cells, self.unseen):
            bottom.add_collection(cells, autolim=False)
        self.indices = _Words(bottom, 7.5, "center")
        self.labels = _Words(bottom, 8, "right")
        self.notes = _Words(bottom, 7.5, "left")
        bottom.axis("off")
        self.title = fig.suptitle("", fontsize=10)

    def moving_artists(self) -> list:
        """What `update` changes; the stages' boxes, names and arrows stay as drawn."""
        return [self.details.collection, self.swatches, self.cells, self.unseen,
                self.indices.collection, self.labels.collection, self.notes.collection,
                self.title]  # fmt: skip

    def texts(self) -> list[str]:
        """Every text of the batches: labels, indices and notes."""
        return self.labels.words + self.indices.words + self.notes.words

    def update(self, plan: EpochPlan) -> None:
        s = plan.settings
        rows = [(f"batch {k} · {_worker_label(w)}", batch, _colour(w), _request_note(plan, k))
                for k, (batch, w) in enumerate(zip(plan.batches, plan.workers))]  # fmt: skip
        if plan.unseen:
            rows.append(("unseen this epoch", plan.unseen, "#dddddd", None))
        height = 1.5 + 0.3 * min(len(rows), 26)  # inches: the stages take 1.2, a row 0.3
        self.fig.set_size_inches(11, height)
        self.top.set_position((0.02, 1 - 1.25 / height, 0.96, 0.95 / height))
        self.bottom.set_position((0.2, 0.1 / height, 0.78, 1 - 1.45 / height))
        lines, where = [], []
        for x, detail in zip(self.centres, _stage_details(plan)):
            parts = detail.split("\n")
            for k, line in enumerate(parts):  # 9 points apart, centred on the box's lower half
                lines.append(line)
                where.append((x, 0.32 + (len(parts) - 1 - 2 * k) * 4.5 / 72 / 0.95))
        self.details.set(lines, where, ["black"] * len(lines))
        x = self.workers_x
        self.swatches.set_verts([_corners(x + 0.01 + 0.022 * w, 0.12, 0.018, 0.12)
                                 for w in range(s["num_workers"])])  # fmt: skip
        self.swatches.set_facecolors([_colour(w) for w in range(s["num_workers"])])
        columns = max([s["batch_size"], len(plan.unseen), 1])
        size = 7.5 if columns <= 16 else max(4.5, 7.5 * 16 / columns)
        cells, colours, unseen, digits, digit_at, ink = [], [], [], [], [], []
        for r, (_, indices, colour, note) in enumerate(rows):
            y = len(rows) - 1 - r
            for c, index in enumerate(indices):
                (cells if note else unseen).append(_corners(c, y + 0.05, 0.92, 0.8))
                if note:
                    colours.append(colour)
                digits.append(str(index))
                digit_at.append((c + 0.46, y + 0.45))
                ink.append("white" if colour in _DARK else "black")
        self.cells.set_verts(cells)
        self.cells.set_facecolors(colours)
        self.unseen.set_verts(unseen)
        self.indices.set(digits, digit_at, ink, fontsize=size)
        ys = [len(rows) - 1 - r + 0.45 for r in range(len(rows))]
        self.labels.set([row[0] for row in rows], [(-0.3, y) for y in ys], ["black"] * len(rows))
        noted = [(f"→ [{len(row[1])}]  {row[3]}", y) for row, y in zip(rows, ys) if row[3]]
        self.notes.set([n for n, _ in noted], [(columns + 0.3, y) for _, y in noted],
                       ["black"] * len(noted))  # fmt: skip
        # Room on the right for the widest note (a share of the axes' width, in points).
        widths = [text_width(n, self.notes.fontsize) for n, _ in noted] or [0.0]
        share = max(widths) / (0.78 * 11 * 72)
        self.bottom.set_xlim(-0.2, max(columns + 6.5, (columns + 0.4 + 0.2 * share) / (1 - share)))
        self.bottom.set_ylim(-0.1, len(rows))
        ahead = s["num_workers"] * s["prefetch_factor"]
        extra = f"; up to {ahead} batches requested ahead of the model" if ahead else ""
        self.title.set_text(f"Epoch {s['epoch']}: {summary(plan)}{extra}")
        self.title.set_y(1 - 0.08 / height)


def _corners(x: float, y: float, width: float, height: float) -> list[tuple[float, float]]:
    return [(x, y), (x + width, y), (x + width, y + height), (x, y + height)]


def draw_plan(plan: EpochPlan, fig=None):
    """Draw the pipeline's stages and, below, every batch as a row of its indices.

    Rows are coloured by the worker that builds the batch; the unseen tail is hatched grey.
    """
    if fig is None:
        fig = plt.figure(figsize=(11, 1.5))
    fig.clear()
    PlanPicture(fig).update(plan)
    return fig


def pipeline_view(
    n: int = 100,
    batch_size: int = 16,
    shuffle: bool = True,
    drop_last: bool = False,
    num_workers: int = 2,
    seed: int = 0,
) -> None:
    """Widgets for the loader's settings over `draw_plan`; shows the default state as a PNG too."""
    import ipywidgets as widgets

    style = {"description_width": "initial"}
    controls = {
        "n": widgets.IntSlider(n, 10, 100, description="dataset size N", style=style),
        "batch_size": widgets.IntSlider(batch_size, 4, 32, description="batch_size", style=style),
        "shuffle": widgets.Checkbox(shuffle, description="shuffle"),
        "drop_last": widgets.Checkbox(drop_last, description="drop_last"),
        "num_workers": widgets.IntSlider(
            num_workers, 0, 4, description="num_workers", style=style
        ),  # fmt: skip
        "prefetch_factor": widgets.IntSlider(2, 1, 4, description="prefetch_factor", style=style),
        "epoch": widgets.IntSlider(0, 0, 3, description="epoch", style=style),
    }
    live = LiveFigure((11, 1.5))
    picture = PlanPicture(live.fig)
    live.moving(picture.moving_artists)  # the whole figure when it grows or its cells change

    def redraw(*_):
        picture.update(plan_epoch(seed=seed, **{name: w.value for name, w in controls.items()}))
        live.refresh()

    for widget in controls.values():
        widget.observe(redraw, "value")
    redraw()
    names = list(controls)
    box = widgets.VBox([
        widgets.HBox([controls[k] for k in names[:4]]),
        widgets.HBox([controls[k] for k in names[4:]]),
        live.image,
    ])  # fmt: skip
    show(box, live.fig)
