"""Two views for chapter 11: a ring all-reduce step by step, and memory per rank under ZeRO.

The engines are pure: `ring_allreduce_steps` returns every state of the ring (from
`forge_course.reference.collectives`), `memory_rows` the bytes per rank for stages 0–3. The draw
functions turn one state into a matplotlib figure through `RingPicture` and `MemoryPicture`,
which the views keep, update per event and redraw only where the event changed something.
"""

from __future__ import annotations

import itertools
import math

import matplotlib.pyplot as plt
from matplotlib.collections import PolyCollection
from matplotlib.patches import FancyArrowPatch, Patch

from forge_course.reference.collectives import STAGES, memory_per_rank, ring_allreduce_trace
from forge_course.sims.display import PALETTE, LiveFigure, show
from forge_course.sims.pasted_text import PastedText

# Colour of a chunk by how many ranks it sums so far: 1 (own value only) … N (complete).
_PARTIAL = [PALETTE[c] for c in ("grey", "sky", "blue", "orange", "purple", "vermillion")]


def ring_allreduce_steps(values: list[list[float]]) -> list[dict]:
    """Every state of a ring all-reduce of ``values`` (N workers × L floats): 2N − 1 states.

    Each state has ``step``, ``phase``, ``sends`` ((src, dst, chunk) triples), ``chunks``
    (worker → chunk → floats) and ``ranks`` (worker → chunk → ranks summed in it so far).
    """
    return ring_allreduce_trace(values)


def chunk_colour(summed: int, n: int) -> str:
    """Green when a chunk sums all n ranks, otherwise a colour per count of ranks summed."""
    return PALETTE["green"] if summed == n else _PARTIAL[(summed - 1) % len(_PARTIAL)]


def _fmt(values: list[float]) -> str:
    return ",".join(f"{v:g}" for v in values) if values else "–"


def _pasted(ax, x: float, y: float, **style) -> PastedText:
    """A text that a step changes among a few strings, so pasted, not drawn glyph by glyph."""
    return ax.add_artist(PastedText(x, y, "", **style))


class RingPicture:
    """`draw_ring`'s axes, made once for a run: a step changes the chunks' colours and texts,
    the arrows and the title; the ring, its labels and the key stay as first drawn."""

    def __init__(self, ax, states: list[dict]) -> None:
        self.ax, self.states = ax, states
        n = self.n = len(states[0]["chunks"])
        radius, width, height = 1.0, 0.24, 0.16
        self.centres = [
            (radius * math.cos(math.pi / 2 - 2 * math.pi * r / n),
             radius * math.sin(math.pi / 2 - 2 * math.pi * r / n))
            for r in range(n)
        ]  # fmt: skip
        boxes, self.summed_texts, self.value_texts = [], [], []
        for r, (cx, cy) in enumerate(self.centres):
            ax.text(cx, cy + height * 1.6, f"worker {r}", ha="center", fontsize=9, weight="bold")
            left = cx - width * n / 2
            for k in range(n):
                x0, y0 = left + k * width, cy - height / 2
                boxes.append([(x0, y0), (x0, y0 + height), (x0 + width * 0.95, y0 + height),
                              (x0 + width * 0.95, y0)])  # fmt: skip
                x = left + (k + 0.47) * width
                self.summed_texts.append(
                    _pasted(ax, x, cy, ha="center", va="center", fontsize=7 if n <= 4 else 5)
                )
                self.value_texts.append(
                    _pasted(ax, x, cy - height, ha="center", va="center", fontsize=6)
                )
        self.boxes = PolyCollection(boxes, edgecolors="none")
        ax.add_collection(self.boxes, autolim=False)
        most_sends = max(len(state["sends"]) for state in states)
        self.arrows = [
            FancyArrowPatch((0, 0), (0, 0), arrowstyle="->", color=PALETTE["black"], lw=1.5,
                            mutation_scale=10)
            for _ in range(most_sends)
        ]  # fmt: skip
        for arrow in self.arrows:
            ax.add_patch(arrow)
        self.send_texts = [_pasted(ax, 0, 0, fontsize=8, ha="center", va="center")
                           for _ in range(most_sends)]  # fmt: skip
        ax.set(xlim=(-1.9, 1.9), ylim=(-1.6, 1.6), aspect="equal",
               xlabel="box text: ranks summed in the chunk; below it, the chunk's values",
               ylabel="workers in ring order (clockwise)")  # fmt: skip
        key = [Patch(color=chunk_colour(k, n), label=f"{k} rank{'s' if k > 1 else ''}")
               for k in range(1, n + 1)]  # fmt: skip
        ax.legend(handles=key, title="chunk sums", loc="lower center", ncol=n, fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])
        self.title = ax.set_title(" ")

    def moving_artists(self) -> list:
        """What `update` changes; everything else stays as first drawn."""
        return [self.boxes, *self.arrows, *self.send_texts, *self.summed_texts,
                *self.value_texts, self.title]  # fmt: skip

    def update(self, index: int) -> None:
        """Show state ``index``: its chunks, and the sends of the step that led to it."""
        state, n = self.states[index], self.n
        for arrow, text, send in itertools.zip_longest(self.arrows, self.send_texts,
                                                       state["sends"]):  # fmt: skip
            arrow.set_visible(send is not None)
            text.set_visible(send is not None)
            if send is None:
                continue
            src, dst, chunk = send
            (x0, y0), (x1, y1) = self.centres[src], self.centres[dst]
            arrow.set_positions((0.8 * x0 + 0.2 * x1, 0.8 * y0 + 0.2 * y1),
                                (0.8 * x1 + 0.2 * x0, 0.8 * y1 + 0.2 * y0))  # fmt: skip
            text.set_position(((x0 + x1) / 2 * 0.78, (y0 + y1) / 2 * 0.78))
            text.set_text(f"chunk {chunk}")
        summed = [state["ranks"][r][k] for r in range(n) for k in range(n)]
        self.boxes.set_facecolors([chunk_colour(len(ranks), n) for ranks in summed])
        for text, ranks in zip(self.summed_texts, summed):
            text.set_text("+".join(map(str, ranks)))
        values = [state["chunks"][r][k] for r in range(n) for k in range(n)]
        for text, chunk in zip(self.value_texts, values):
            text.set_text(_fmt(chunk))
        self.title.set_text(f"Ring all-reduce, {n} workers: step {state['step']} of "
                            f"{len(self.states) - 1} ({state['phase']})")  # fmt: skip


def draw_ring(states: list[dict], index: int, ax=None):
    """Draw state ``index``: workers round a circle, their chunks, and this step's sends."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 6.2))
    ax.clear()
    RingPicture(ax, states).update(index)
    return ax.figure


def memory_rows(params: float, ranks: int) -> list[dict]:
    """Bytes per rank for stages 0–3 (fp32 + Adam): one dict per stage, `memory_per_rank`'s."""
    return [{"stage": s, **memory_per_rank(params, ranks, s)} for s in STAGES]


_PARTS = (("params", "blue", "parameters (4 B)"), ("grads", "orange", "gradients (4 B)"),
          ("optimizer", "green", "Adam moments (8 B)"))  # fmt: skip


class MemoryPicture:
    """`draw_memory`'s axes, made once: ranks and stage change the bars' heights, the outline,
    the totals, the title and the x label; the axes change only with the parameter count
    (stage 0 shards nothing, so its bar, the tallest, sets the y range)."""

    def __init__(self, ax) -> None:
        self.ax = ax
        labels = [f"stage {s}" for s in STAGES]
        self.stacks = [ax.bar(labels, [0.0] * len(STAGES), color=PALETTE[colour], label=label)
                       for _, colour, label in _PARTS]  # fmt: skip
        self.outline = ax.bar(labels[0], 0.0, fill=False, edgecolor=PALETTE["black"], lw=2.5)[0]
        self.totals = [_pasted(ax, i, 0, ha="center", va="bottom", fontsize=8)
                       for i in range(len(STAGES))]  # fmt: skip
        ax.set_ylabel("GB per rank (10⁹ bytes)")
        ax.legend(fontsize=8)
        self.title = ax.set_title(" ")

    def moving_artists(self) -> list:
        """What `update` changes, then the spines, which a full draw puts over the bars;
        everything else stays as first drawn."""
        bars = [bar for stack in self.stacks for bar in stack]
        # The x axis whole: its label names the stage outlined, and an axis draws its label.
        return [*bars, self.outline, *self.ax.spines.values(), *self.totals, self.title,
                self.ax.xaxis]  # fmt: skip

    def update(self, params: float, ranks: int, stage: int) -> None:
        rows = memory_rows(params, ranks)
        bottom = [0.0] * len(rows)
        for stack, (key, _, _) in zip(self.stacks, _PARTS):
            for i, (bar, row) in enumerate(zip(stack, rows)):
                bar.set_y(bottom[i])
                bar.set_height(row[key] / 1e9)
                bottom[i] += row[key] / 1e9
        self.outline.set_x(stage - self.outline.get_width() / 2)
        self.outline.set_height(bottom[stage])
        for text, total in zip(self.totals, bottom):
            text.set_y(total)
            text.set_text(f"{total:.3g} GB")
        self.title.set_text(
            f"{params:.3g} parameters on {ranks} ranks: memory per rank, no activations"
        )
        self.ax.set(ylim=(0, max(bottom) * 1.18), xlabel=f"ZeRO stage (outlined: {STAGES[stage]})")


def memory_picture(fig) -> MemoryPicture:
    """`memory_view`'s picture on a 7.5 × 3.6 inch ``fig``, with margins in inches that fit its
    labels (a layout engine would measure the figure at every draw)."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=0.75 / width, right=1 - 0.15 / width, bottom=0.6 / height,
                        top=1 - 0.35 / height)  # fmt: skip
    return MemoryPicture(fig.subplots())


def draw_memory(params: float, ranks: int, stage: int, ax=None):
    """Stacked bars of parameters, gradients and Adam state per rank, stage ``stage`` outlined."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.6))
    ax.clear()
    MemoryPicture(ax).update(params, ranks, stage)
    return ax.figure


def ring_view(values: list[list[float]]) -> None:
    """A step slider over the ring all-reduce of ``values``; a still picture without widgets."""
    import ipywidgets as widgets

    states = ring_allreduce_steps(values)
    slider = widgets.IntSlider(0, 0, len(states) - 1, description="step")
    live = LiveFigure((7.5, 6.2))
    picture = RingPicture(live.fig.subplots(), states)
    live.moving(picture.moving_artists)

    def redraw(*_):
        picture.update(slider.value)
        live.refresh()

    slider.observe(redraw, names="value")
    redraw()
    still, still_ax = plt.subplots(figsize=(7.5, 6.2))
    draw_ring(states, len(values) - 1, still_ax)  # the end of reduce-scatter
    show(widgets.VBox([slider, live.image]), still)


def memory_view(params: float = 1e9, ranks: int = 8, stage: int = 0) -> None:
    """Sliders for parameters (log scale), ranks and ZeRO stage; a still picture without widgets."""
    import ipywidgets as widgets

    p = widgets.FloatLogSlider(params, base=10, min=6, max=12, description="parameters")
    r = widgets.IntSlider(ranks, 1, 64, description="ranks")
    s = widgets.IntSlider(stage, 0, 3, description="stage")
    live = LiveFigure((7.5, 3.6))
    picture = memory_picture(live.fig)
    live.moving(picture.moving_artists)

    def redraw(*_):
        picture.update(p.value, r.value, s.value)
        live.refresh()

    for widget in (p, r, s):
        widget.observe(redraw, names="value")
    redraw()
    still, still_ax = plt.subplots(figsize=(7.5, 3.6))
    draw_memory(params, ranks, stage, still_ax)
    show(widgets.VBox([widgets.HBox([p, r, s]), live.image]), still)
