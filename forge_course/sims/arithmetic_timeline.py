"""Training-arithmetic calculator: a run's counts, and its epochs drawn micro-batch by micro-batch.

The engine, `timeline`, is a pure function from ``N, B, K, epochs, drop_last`` to a `Timeline`:
the counts of `forge_course.reference.arithmetic.training_arithmetic`, the same counts for the
common loop that steps only when ``(i + 1) % K == 0``, and the micro-batches worth drawing. A
long epoch is shown by its first `HEAD` and last `TAIL` micro-batches, because its end is where
the partial batch and the short last group of accumulation sit. `draw_timeline` draws the
correct loop above the common one; `arithmetic_timeline_view` wires both to sliders.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from forge_course.reference.arithmetic import training_arithmetic
from forge_course.reference.schedule import update_schedule
from forge_course.sims.display import PALETTE, LiveFigure, show, tight_layout_afresh

HEAD = 8  # micro-batches shown from the start of a long epoch (at least K, to show an update)
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


def _draw_lane(ax, tl: Timeline, naive: bool) -> None:
    """One loop's epochs as rows of blocks; a bar after each micro-batch the optimizer follows."""
    b, k = tl.batch_size, tl.accum_steps
    leaks = naive and tl.naive["stale_micro_batches"] > 0
    for row, epoch in enumerate(tl.rows):
        y = -row  # epoch 1 on top
        for block in tl.blocks:
            if block.tail:
                colour = PALETTE["orange"]
            else:
                colour = PALETTE["blue"] if block.group % 2 == 0 else PALETTE["sky"]
            stale = naive and block.tail
            ax.add_patch(
                Rectangle(
                    (block.x + 0.07, y - 0.35), 0.86, 0.7 * block.size / b, facecolor=colour,
                    edgecolor=PALETTE["vermillion"] if stale else PALETTE["black"],
                    hatch="////" if stale else None, linewidth=1.2 if stale else 0.5,
                )
            )  # fmt: skip
            if block.naive_steps if naive else block.steps:
                # The first update of a later epoch also applies the previous epoch's leftover.
                carries = leaks and epoch > 1 and block.index == k - 1
                colour = PALETTE["vermillion"] if carries else PALETTE["black"]
                ax.plot([block.x + 1] * 2, [y - 0.42, y + 0.42], color=colour, linewidth=2.2)
        if tl.blocks:
            last = tl.blocks[-1]
            ax.text(last.x + 0.5, y - 0.33 + 0.7 * last.size / b, str(last.size),
                    ha="center", va="bottom", fontsize=7)  # fmt: skip
        if tl.gap_x is not None:
            ax.text(tl.gap_x + GAP / 2, y, f"⋯ {tl.hidden:,} ⋯", ha="center", va="center",
                    fontsize=7)  # fmt: skip
        if tl.dropped:
            x = tl.blocks[-1].x + 1.2 if tl.blocks else 0.1
            ax.add_patch(
                Rectangle((x, y - 0.35), 0.86, 0.7 * min(tl.dropped / b, 1.0), fill=False,
                          edgecolor=PALETTE["grey"], linestyle="--")
            )  # fmt: skip
        if leaks and epoch == tl.epochs:
            ax.text(tl.width + 0.1, y, "never\nused", color=PALETTE["vermillion"], va="center",
                    fontsize=7)  # fmt: skip
    labels = [
        f"epoch {e}" if i == 0 or e == tl.rows[i - 1] + 1 else f"⋮ epoch {e}"
        for i, e in enumerate(tl.rows)
    ]
    ax.set_yticks([-r for r in range(len(tl.rows))], labels, fontsize=8)
    iters = tl.numbers["iters_per_epoch"]
    ticks = [blk for blk in tl.blocks if blk.index in {0, iters - TAIL, iters - 1}]
    if tl.gap_x is not None:
        ticks.append(max((blk for blk in tl.blocks if blk.x < tl.gap_x), key=lambda blk: blk.x))
    ax.set_xticks([blk.x + 0.5 for blk in ticks], [str(blk.index + 1) for blk in ticks])
    ax.set_xlim(-0.3, tl.width + 1.8)  # the same for both loops, with room for "never used"
    ax.set_ylim(-len(tl.rows) + 0.45, 0.6)
    ax.set_xlabel("micro-batch of the epoch (block height ∝ its size)", fontsize=8)
    ax.set_ylabel("epoch", fontsize=8)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def draw_timeline(tl: Timeline, fig=None):
    """The correct loop above the naive one, with the numbers on top. Returns the figure."""
    rows = len(tl.rows)
    if fig is None:
        fig = plt.figure(figsize=(10, 2.2 + 1.1 * rows))
    fig.set_size_inches(10, 2.2 + 1.1 * rows)  # a figure kept by the view takes these rows
    fig.clear()
    top, bottom = fig.subplots(2, 1)
    k = tl.accum_steps
    _draw_lane(top, tl, naive=False)
    _draw_lane(bottom, tl, naive=True)
    top.set_title(
        f"Correct loop: step if (i + 1) % {k} == 0 or i + 1 == len(loader): "
        f"{_count(tl.numbers['updates_per_epoch'], 'update')} per epoch",
        fontsize=9, loc="left",
    )  # fmt: skip
    bottom.set_title(
        f"Naive loop: step if (i + 1) % {k} == 0: "
        f"{_count(tl.naive['updates_per_epoch'], 'update')} per epoch",
        fontsize=9, loc="left",
    )  # fmt: skip
    fig.suptitle("\n".join(summary(tl)), fontsize=8.5, x=0.01, ha="left")
    legend = [
        Patch(facecolor=PALETTE["blue"], edgecolor="black", label="group of K micro-batches"),
        Patch(facecolor=PALETTE["sky"], edgecolor="black", label="next group"),
        Patch(facecolor=PALETTE["orange"], edgecolor="black", label="last group, < K"),
        Patch(facecolor="white", edgecolor=PALETTE["vermillion"], hatch="////",
              label="left in .grad at epoch end"),
        Patch(fill=False, edgecolor=PALETTE["grey"], linestyle="--", label="dropped (drop_last)"),
        plt.Line2D([], [], color="black", linewidth=2.2, label="optimizer update"),
        plt.Line2D([], [], color=PALETTE["vermillion"], linewidth=2.2,
                   label="update with last epoch's leftover"),
    ]  # fmt: skip
    fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=7.5, frameon=False)
    tight_layout_afresh(fig, rect=(0, 0.09, 1, 1))
    return fig


def arithmetic_timeline_view(
    dataset_size: int = 10_000,
    batch_size: int = 32,
    epochs: int = 3,
    accum_steps: int = 4,
    drop_last: bool = False,
) -> None:
    """Sliders for N, B, K and epochs, a drop_last box and presets, over `draw_timeline`."""
    import ipywidgets as widgets

    style = {"description_width": "90px"}
    layout = widgets.Layout(width="330px")
    controls = {
        "dataset_size": widgets.IntSlider(dataset_size, 1, 20_000, description="N (examples)"),
        "batch_size": widgets.IntSlider(batch_size, 1, 512, description="B (batch)"),
        "epochs": widgets.IntSlider(epochs, 1, 10, description="epochs"),
        "accum_steps": widgets.IntSlider(accum_steps, 1, 16, description="K (accum.)"),
        "drop_last": widgets.Checkbox(drop_last, description="drop_last"),
    }
    for control in controls.values():
        control.style, control.layout, control.continuous_update = style, layout, False
    preset = widgets.Dropdown(
        options=["(choose a preset)", *PRESETS], description="preset", style=style,
        layout=widgets.Layout(width="420px"),
    )  # fmt: skip
    live = LiveFigure((10, 2.2))
    busy = {"setting": False}

    def redraw(*_):
        if busy["setting"]:
            return
        draw_timeline(timeline(**{name: control.value for name, control in controls.items()}),
                      live.fig)  # fmt: skip
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
    box = widgets.VBox(
        [preset, widgets.HBox([widgets.VBox(sliders[:3]), widgets.VBox(sliders[3:])]), live.image]
    )
    show(box, live.fig)
