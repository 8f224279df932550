"""Training-arithmetic calculator: a run's counts, and its epochs drawn micro-batch by micro-batch.

The engine, `timeline`, is a pure function from ``N, B, K, epochs, drop_last`` to a `Timeline`:
the counts of `forge_course.reference.arithmetic.training_arithmetic`, the same counts for the
common loop that steps only when ``(i + 1) % K == 0``, and the micro-batches worth drawing. A
long epoch is shown by its first `HEAD` and last `TAIL` micro-batches, because its end is where
the partial batch and the short last group of accumulation sit. `draw_timeline` draws the
correct loop above the common one. `TimelinePicture` is that picture kept by a view: built once,
updated in place per event (a few collections and short texts), so that a slider's redraw draws
only what moved; `arithmetic_timeline_view` wires it to sliders.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.lines import TICKDOWN, Line2D
from matplotlib.patches import Patch

from forge_course.reference.arithmetic import training_arithmetic
from forge_course.reference.schedule import update_schedule
from forge_course.sims.display import PALETTE, LiveFigure, show

# Micro-batches shown from the start of a long epoch: at least K, to show an update, and as many
# as the K slider allows, so that a long epoch is drawn as wide whatever K.
HEAD = 16
TAIL = 16  # ... and from its end, which holds the partial batch and the last group
GAP = 3.0  # width of the "⋯ n more ⋯" gap, in micro-batch slots
MAX_ROWS = 4  # epochs drawn: all of them up to 4; otherwise 1, 2, 3 and the last

#: Runs from FACTS.md the view offers as presets: (N, B, epochs, K, drop_last).
PRESETS = {
    "running example: N=10,000, B=32, 3 epochs": (10_000, 32, 3, 1, False),
    "... with accumulation, K=4": (10_000, 32, 3, 4, False),
    "small hand case: N=1,000, B=64, 5 epochs": (1_000, 64, 5, 1, False),
    "batch assembly: N=100, B=16": (100, 16, 1, 1, False),
    "... with drop_last": (100, 16, 1, 1, True),
    "the leak: N=100, B=16, K=4, 3 epochs": (100, 16, 3, 4, False),
}


@dataclass(frozen=True)
class Block:
    """One micro-batch of an epoch, as drawn (every epoch has the same ones)."""

    index: int  # position in the epoch, from 0
    x: float  # left edge in the drawing, in micro-batch slots (the gap included)
    size: int  # examples in it
    group: int  # accumulation group, from 0
    steps: bool  # the correct loop updates right after it
    naive_steps: bool  # the loop `if (i + 1) % K == 0` updates right after it
    tail: bool  # in a last group of fewer than K: the naive loop leaves it in .grad


@dataclass(frozen=True)
class Timeline:
    """Everything the calculator shows for one setting of the controls."""

    dataset_size: int
    batch_size: int
    epochs: int
    accum_steps: int
    drop_last: bool
    numbers: dict[str, int]  # `training_arithmetic`: the correct loop
    naive: dict[str, int]  # the loop that steps only when (i + 1) % K == 0
    blocks: tuple[Block, ...]  # the micro-batches drawn, left to right
    hidden: int  # micro-batches left out between HEAD and TAIL
    gap_x: float | None  # left edge of the gap, if there is one
    dropped: int  # examples drop_last throws away at the end of every epoch
    rows: tuple[int, ...]  # the epochs drawn, from 1
    width: float  # slots the drawing needs


def timeline(
    dataset_size: int, batch_size: int, epochs: int, accum_steps: int = 1, drop_last: bool = False
) -> Timeline:
    """Count a run and lay out its epochs for drawing.

    Args:
        dataset_size, batch_size, epochs, accum_steps, drop_last: as in `training_arithmetic`.

    Returns:
        A `Timeline`. ``naive`` holds, for the loop that steps only when ``(i + 1) % K == 0``:
        ``updates_per_epoch`` (``I // K``), ``total_updates``, ``stale_micro_batches`` and
        ``stale_examples`` (what that loop leaves in ``.grad`` at the end of every epoch: it
        leaks into the next epoch's first update, and after the last epoch it is never used).
    """
    numbers = training_arithmetic(dataset_size, batch_size, epochs, accum_steps, drop_last)
    schedule = update_schedule(dataset_size, batch_size, accum_steps, drop_last)
    iters, k = len(schedule), accum_steps
    stale = iters % k
    naive = {
        "updates_per_epoch": iters // k,
        "total_updates": iters // k * epochs,
        "stale_micro_batches": stale,
        "stale_examples": sum(size for size, _ in schedule[iters - stale :]),
    }
    head = max(HEAD, k)
    if iters > head + TAIL:
        shown = [*range(head), *range(iters - TAIL, iters)]
        hidden, gap_x = iters - head - TAIL, float(head)
    else:
        shown, hidden, gap_x = list(range(iters)), 0, None
    blocks = tuple(
        Block(
            index=i,
            x=float(i) if i < head or gap_x is None else head + GAP + (i - (iters - TAIL)),
            size=schedule[i][0],
            group=i // k,
            steps=schedule[i][1],
            naive_steps=(i + 1) % k == 0,
            tail=stale > 0 and i >= iters - stale,
        )
        for i in shown
    )
    rows = tuple(range(1, epochs + 1))
    if epochs > MAX_ROWS:
        rows = (*range(1, MAX_ROWS), epochs)
    dropped = dataset_size - numbers["examples_seen"] // epochs
    width = (blocks[-1].x + 1 if blocks else 1.0) + (1.5 if dropped else 0.0)
    return Timeline(
        dataset_size, batch_size, epochs, accum_steps, drop_last,
        numbers, naive, blocks, hidden, gap_x, dropped, rows, width,
    )  # fmt: skip


def _count(n: int, word: str) -> str:
    """``1 update``, ``2 updates``, ``3 micro-batches``."""
    plural = word + ("es" if word.endswith("batch") else "s")
    return f"{n:,} {word if n == 1 else plural}"


def summary(tl: Timeline) -> list[str]:
    """The calculator's numbers as three short lines of text."""
    n, nv = tl.numbers, tl.naive
    run = (
        f"N = {tl.dataset_size:,}, B = {tl.batch_size}, K = {tl.accum_steps}, "
        f"{_count(tl.epochs, 'epoch')}, drop_last={tl.drop_last}: "
        f"{_count(n['iters_per_epoch'], 'micro-batch')} per epoch "
        f"(last of {n['last_batch_size']}), {n['micro_steps']:,} in all; "
        f"{_count(n['examples_seen'], 'example')} seen"
    )
    if tl.dropped:
        run += f" ({tl.dropped:,} dropped per epoch)"
    correct = (
        f"Correct loop: effective batch {n['effective_batch_size']:,}, "
        f"{_count(n['updates_per_epoch'], 'update')} per epoch, {n['total_updates']:,} in all."
    )
    stale = nv["stale_micro_batches"]
    if n["iters_per_epoch"] == 0:
        naive = "No micro-batch at all: drop_last drops the only, partial batch (N < B)."
    elif stale == 0:
        naive = (
            f"Naive loop: the same, because K = {tl.accum_steps} divides the "
            f"{_count(n['iters_per_epoch'], 'micro-batch')} of an epoch."
        )
    elif nv["updates_per_epoch"] == 0:
        naive = (
            "Naive loop: never steps, as an epoch has fewer than K micro-batches; "
            f".grad keeps adding up all {n['micro_steps']:,} of them."
        )
    else:
        naive = (
            f"Naive loop: {_count(nv['updates_per_epoch'], 'update')} per epoch, "
            f"{nv['total_updates']:,} in all; {_count(stale, 'micro-batch')} "
            f"({_count(nv['stale_examples'], 'example')}) per epoch left in .grad."
        )
    return [run, correct, naive]


# The figure's layout, in inches, fixed for each number of rows (no layout engine per event).
WIDTH_IN, LEFT_IN, RIGHT_IN = 10.0, 1.0, 0.15
ROW_IN = 0.5  # one epoch's row
SUMMARY_IN = 0.55  # the summary's three lines, above the lanes (`draw_timeline` only)
TITLE_IN = 0.3  # a lane's title, above it
BELOW_IN = 0.95  # under the lower lane: its ticks, the axis label and the legend
# Slots from the first block to the end of a long epoch's last: the x axis keeps this width
# (and room for a dropped batch and "never used") whatever the controls, up to K = HEAD.
LONG_WIDTH = HEAD + GAP + TAIL
TICK_PAD = 7.0  # points from an axis to its tick labels: matplotlib's tick length and pad


def layout(rows: int, with_summary: bool) -> tuple[float, tuple, tuple]:
    """The figure's height in inches and the two lanes' positions (figure fractions) for
    ``rows`` epochs drawn, with or without the summary on top."""
    lane = ROW_IN * (rows + 0.15)  # the y axis spans rows + 0.15 (see `_Lane.update`)
    height = (SUMMARY_IN if with_summary else 0.0) + 2 * (TITLE_IN + lane) + BELOW_IN
    left, width = LEFT_IN / WIDTH_IN, 1 - (LEFT_IN + RIGHT_IN) / WIDTH_IN
    lower = (left, BELOW_IN / height, width, lane / height)
    upper = (left, (BELOW_IN + lane + TITLE_IN) / height, width, lane / height)
    return height, upper, lower


class _Lane:
    """One loop's epochs as rows of blocks, a bar after each micro-batch the optimizer follows:
    a few collections and texts, updated in place."""

    def __init__(self, ax, naive: bool) -> None:
        self.ax, self.naive, self.rows = ax, naive, 0
        self.blocks = PolyCollection([], edgecolors=PALETTE["black"], linewidths=0.5)
        # The naive loop's last, short group: in .grad at the epoch's end, no update after it.
        self.stale = PolyCollection([], facecolors=PALETTE["orange"], linewidths=1.2,
                                    edgecolors=PALETTE["vermillion"], hatch="////")  # fmt: skip
        self.dropped = PolyCollection([], facecolors="none", edgecolors=PALETTE["grey"],
                                      linestyles="--")  # fmt: skip
        self.updates = LineCollection([], linewidths=2.2, capstyle="projecting")
        for collection in (self.blocks, self.stale, self.dropped, self.updates):
            ax.add_collection(collection, autolim=False)
        self.sizes = [ax.text(0, 0, "", ha="center", va="bottom", fontsize=7)
                      for _ in range(MAX_ROWS)]  # fmt: skip
        # One count for the gap of every row: each epoch has the same micro-batches.
        self.gap = ax.text(0, 0, "", ha="center", va="center", fontsize=7)
        self.never = ax.text(0, 0, "never\nused", color=PALETTE["vermillion"], va="center",
                             fontsize=7)  # fmt: skip
        self.count = ax.set_title("", fontsize=9, loc="right")
        # With MAX_ROWS rows, the last row's label changes with the epochs ("⋮ epoch 10") where
        # the layout does not: a text drawn per event where its tick label would be.
        transform, va, ha = ax.get_yaxis_text1_transform(TICK_PAD)
        self.last_epoch = ax.text(0, 0, "", transform=transform, va=va, ha=ha, fontsize=8)
        ax.set_ylabel("epoch", fontsize=8)
        ax.yaxis.set_label_coords(-0.085, 0.5)  # clear of the widest label, "⋮ epoch 10"
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)

    def moving_artists(self) -> list:
        return [self.blocks, self.stale, self.dropped, self.updates, *self.sizes, self.gap,
                self.never, self.last_epoch, self.count]  # fmt: skip

    def update(self, tl: Timeline) -> None:
        b, k = tl.batch_size, tl.accum_steps
        naive = self.naive
        leaks = naive and tl.naive["stale_micro_batches"] > 0
        boxes, colours, stale, dropped, bars, bar_colours = [], [], [], [], [], []
        for row, epoch in enumerate(tl.rows):
            y = -row  # epoch 1 on top
            for block in tl.blocks:
                box = (block.x + 0.07, y - 0.35, 0.86, 0.7 * block.size / b)
                if naive and block.tail:
                    stale.append(box)
                else:
                    boxes.append(box)
                    group = PALETTE["blue"] if block.group % 2 == 0 else PALETTE["sky"]
                    colours.append(PALETTE["orange"] if block.tail else group)
                if block.naive_steps if naive else block.steps:
                    # The first update of a later epoch also applies the last epoch's leftover.
                    carries = leaks and epoch > 1 and block.index == k - 1
                    bars.append([(block.x + 1, y - 0.42), (block.x + 1, y + 0.42)])
                    bar_colours.append(PALETTE["vermillion"] if carries else PALETTE["black"])
            if tl.dropped:
                x = tl.blocks[-1].x + 1.2 if tl.blocks else 0.1
                dropped.append((x, y - 0.35, 0.86, 0.7 * min(tl.dropped / b, 1.0)))
        self.blocks.set_verts(_corners(boxes))
        self.blocks.set_facecolors(colours)
        self.stale.set_verts(_corners(stale))
        self.dropped.set_verts(_corners(dropped))
        self.updates.set_segments(bars)
        self.updates.set_colors(bar_colours)
        last = tl.blocks[-1] if tl.blocks else None
        rows = len(tl.rows)
        for row, size in enumerate(self.sizes):
            size.set_visible(row < rows and last is not None)
            if last is not None:
                size.set_text(str(last.size))
                size.set_position((last.x + 0.5, -row - 0.33 + 0.7 * last.size / b))
        self.gap.set_visible(tl.gap_x is not None)
        if tl.gap_x is not None:
            self.gap.set_text(f"⋯ {tl.hidden:,} ⋯")
            self.gap.set_position((tl.gap_x + GAP / 2, (1 - rows) / 2))
        self.never.set_visible(leaks)
        self.never.set_position((tl.width + 0.1, 1 - rows))
        labels = [f"epoch {e}" for e in tl.rows]
        if tl.epochs > rows:
            labels[-1] = f"⋮ epoch {tl.epochs}"
        self.last_epoch.set_visible(rows == MAX_ROWS)
        self.last_epoch.set_text(labels[-1])
        self.last_epoch.set_y(1 - rows)
        if rows != self.rows:  # the other labels are those of the rows: set with them
            self.rows = rows
            self.ax.set_yticks([-r for r in range(rows)],
                               labels[:-1] + ["" if rows == MAX_ROWS else labels[-1]],
                               fontsize=8)  # fmt: skip
            self.ax.set_ylim(-rows + 0.45, 0.6)
        updates = tl.naive["updates_per_epoch"] if naive else tl.numbers["updates_per_epoch"]
        self.count.set_text(f"{_count(updates, 'update')} per epoch")


def _corners(boxes: list[tuple[float, float, float, float]]) -> np.ndarray:
    """Rectangles ``(x, y, width, height)`` as their corners, ``n × 4 × 2``: an array, which
    a collection turns into paths faster than a list."""
    x, y, w, h = np.array(boxes, dtype=float).reshape(-1, 4).T
    return np.stack([np.stack(corner, axis=-1) for corner in
                     ((x, y), (x + w, y), (x + w, y + h), (x, y + h))], axis=1)  # fmt: skip


class TimelinePicture:
    """`draw_timeline`'s picture, built once for a figure: an update changes the lanes'
    collections, texts and ticks in place, and the figure's height only with the rows drawn.

    Args:
        fig: an empty figure; the picture sets its size.
        with_summary: draw `summary`'s lines on top (a view prints them beside the figure).
    """

    def __init__(self, fig, with_summary: bool = True) -> None:
        self.fig, self.with_summary = fig, with_summary
        upper = fig.add_axes(layout(1, with_summary)[1])
        lower = fig.add_axes(layout(1, with_summary)[2], sharex=upper)
        upper.tick_params(axis="x", bottom=False, labelbottom=False)  # the lower lane's ticks
        upper.set_title("Correct loop: step if (i + 1) % K == 0 or i + 1 == len(loader)",
                        fontsize=9, loc="left")  # fmt: skip
        lower.set_title("Naive loop: step if (i + 1) % K == 0", fontsize=9, loc="left")
        # The x ticks move with the controls: marks and texts drawn per event, as a tick's are.
        lower.set_xticks([])
        lower.set_xlabel("micro-batch of the epoch (block height ∝ its size)", fontsize=8,
                         labelpad=TICK_PAD + 12)  # below the ticks' labels  # fmt: skip
        self.tick_marks = lower.plot([], [], ls="none", marker=TICKDOWN, ms=3.5, mew=0.8,
                                     color="black", transform=lower.get_xaxis_transform(),
                                     clip_on=False)[0]  # fmt: skip
        transform, va, ha = lower.get_xaxis_text1_transform(TICK_PAD)
        self.tick_labels = [lower.text(0, 0, "", transform=transform, va=va, ha=ha)
                            for _ in range(4)]  # fmt: skip
        self.lanes = [_Lane(upper, naive=False), _Lane(lower, naive=True)]
        self.summary = None
        if with_summary:
            self.summary = fig.suptitle("", fontsize=8.5, x=0.01, ha="left")
        legend = [
            Patch(facecolor=PALETTE["blue"], edgecolor="black", label="group of K micro-batches"),
            Patch(facecolor=PALETTE["sky"], edgecolor="black", label="next group"),
            Patch(facecolor=PALETTE["orange"], edgecolor="black", label="last group, < K"),
            Patch(facecolor="white", edgecolor=PALETTE["vermillion"], hatch="////",
                  label="left in .grad at epoch end"),
            Patch(fill=False, edgecolor=PALETTE["grey"], linestyle="--",
                  label="dropped (drop_last)"),
            Line2D([], [], color="black", linewidth=2.2, label="optimizer update"),
            Line2D([], [], color=PALETTE["vermillion"], linewidth=2.2,
                   label="update with last epoch's leftover"),
        ]  # fmt: skip
        fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=7.5, frameon=False)

    def moving_artists(self) -> list:
        """What `update` changes; the rest (titles' loops, legend, axis label) stays as drawn."""
        return [*self.lanes[0].moving_artists(), *self.lanes[1].moving_artists(),
                self.tick_marks, *self.tick_labels, self.summary]  # fmt: skip

    def update(self, tl: Timeline) -> None:
        height, *positions = layout(len(tl.rows), self.with_summary)
        self.fig.set_size_inches(WIDTH_IN, height)
        for lane, position in zip(self.lanes, positions):
            lane.ax.set_position(position)
            lane.update(tl)
        lower = self.lanes[1].ax
        iters = tl.numbers["iters_per_epoch"]
        ticks = [blk for blk in tl.blocks if blk.index in {0, iters - TAIL, iters - 1}]
        if tl.gap_x is not None:
            ticks.append(max((blk for blk in tl.blocks if blk.x < tl.gap_x), key=lambda blk: blk.x))
        self.tick_marks.set_data([blk.x + 0.5 for blk in ticks], [0] * len(ticks))
        for i, label in enumerate(self.tick_labels):
            label.set_visible(i < len(ticks))
            if i < len(ticks):
                label.set_text(str(ticks[i].index + 1))
                label.set_x(ticks[i].x + 0.5)
        # The same for both loops, with room for a dropped batch and "never used". A short
        # epoch's width goes in steps of 8 slots: most moves of a slider keep the axis, and
        # the picture is redrawn whole only when it steps.
        end = tl.blocks[-1].x + 1 if tl.blocks else 0.0
        span = end if end >= LONG_WIDTH else max(8, 8 * math.ceil(end / 8))
        lower.set_xlim(-0.3, span + 3.3)
        if self.summary is not None:
            self.summary.set_text("\n".join(summary(tl)))


def draw_timeline(tl: Timeline, fig=None):
    """The correct loop above the naive one, with the numbers on top. Returns the figure."""
    if fig is None:
        fig = plt.figure(figsize=(WIDTH_IN, layout(len(tl.rows), True)[0]))
    fig.clear()
    TimelinePicture(fig).update(tl)
    return fig


def arithmetic_timeline_view(
    dataset_size: int = 10_000,
    batch_size: int = 32,
    epochs: int = 3,
    accum_steps: int = 4,
    drop_last: bool = False,
) -> None:
    """Sliders for N, B, K and epochs, a drop_last box and presets, over a `TimelinePicture`;
    the summary is printed above the figure, and drawn in the picture for viewers without widgets.
    """
    import ipywidgets as widgets

    style = {"description_width": "90px"}
    slider_layout = widgets.Layout(width="330px")
    controls = {
        "dataset_size": widgets.IntSlider(dataset_size, 1, 20_000, description="N (examples)"),
        "batch_size": widgets.IntSlider(batch_size, 1, 512, description="B (batch)"),
        "epochs": widgets.IntSlider(epochs, 1, 10, description="epochs"),
        "accum_steps": widgets.IntSlider(accum_steps, 1, 16, description="K (accum.)"),
        "drop_last": widgets.Checkbox(drop_last, description="drop_last"),
    }
    for control in controls.values():
        control.style, control.layout, control.continuous_update = style, slider_layout, False
    preset = widgets.Dropdown(
        options=["(choose a preset)", *PRESETS], description="preset", style=style,
        layout=widgets.Layout(width="420px"),
    )  # fmt: skip
    live = LiveFigure((WIDTH_IN, WIDTH_IN / 2))  # the picture sets its height
    picture = TimelinePicture(live.fig, with_summary=False)
    live.moving(picture.moving_artists)
    numbers = widgets.HTML()  # the summary, printed beside the figure rather than drawn in it
    busy = {"setting": False}

    def redraw(*_):
        if busy["setting"]:
            return
        tl = timeline(**{name: control.value for name, control in controls.items()})
        numbers.value = "<br>".join(html.escape(line) for line in summary(tl))
        picture.update(tl)
        live.refresh()

    def apply_preset(change):
        if change["new"] not in PRESETS:
            return
        busy["setting"] = True  # one redraw for the whole preset, not one per slider
        values = dict(zip(["dataset_size", "batch_size", "epochs", "accum_steps", "drop_last"],
                          PRESETS[change["new"]]))  # fmt: skip
        for name, value in values.items():
            controls[name].value = value
        busy["setting"] = False
        redraw()

    for control in controls.values():
        control.observe(redraw, "value")
    preset.observe(apply_preset, "value")
    redraw()
    sliders = list(controls.values())
    box = widgets.VBox([
        preset,
        widgets.HBox([widgets.VBox(sliders[:3]), widgets.VBox(sliders[3:])]),
        numbers,
        live.image,
    ])  # fmt: skip
    show(box, draw_timeline(timeline(dataset_size, batch_size, epochs, accum_steps, drop_last)))
