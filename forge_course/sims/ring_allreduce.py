"""Two views for chapter 11: a ring all-reduce step by step, and memory per rank under ZeRO.

The engines are pure: `ring_allreduce_steps` returns every state of the ring (from
`forge_course.reference.collectives`), `memory_rows` the bytes per rank for stages 0–3. The draw
functions turn one state into a matplotlib figure; the views add sliders.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from forge_course.reference.collectives import STAGES, memory_per_rank, ring_allreduce_trace
from forge_course.sims.display import PALETTE, LiveFigure, show

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


def draw_ring(states: list[dict], index: int, ax=None):
    """Draw state ``index``: workers round a circle, their chunks, and this step's sends."""
    state = states[index]
    n = len(state["chunks"])
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 6.2))
    ax.clear()
    radius, width, height = 1.0, 0.24, 0.16
    centres = [
        (radius * math.cos(math.pi / 2 - 2 * math.pi * r / n),
         radius * math.sin(math.pi / 2 - 2 * math.pi * r / n))
        for r in range(n)
    ]  # fmt: skip
    for src, dst, chunk in state["sends"]:
        (x0, y0), (x1, y1) = centres[src], centres[dst]
        ax.annotate(
            "", xy=(0.8 * x1 + 0.2 * x0, 0.8 * y1 + 0.2 * y0),
            xytext=(0.8 * x0 + 0.2 * x1, 0.8 * y0 + 0.2 * y1),
            arrowprops={"arrowstyle": "->", "color": PALETTE["black"], "lw": 1.5},
        )  # fmt: skip
        ax.text((x0 + x1) / 2 * 0.78, (y0 + y1) / 2 * 0.78, f"chunk {chunk}", fontsize=8,
                ha="center", va="center")  # fmt: skip
    for r, (cx, cy) in enumerate(centres):
        ax.text(cx, cy + height * 1.6, f"worker {r}", ha="center", fontsize=9, weight="bold")
        left = cx - width * n / 2
        for k in range(n):
            summed = state["ranks"][r][k]
            ax.add_patch(
                plt.Rectangle((left + k * width, cy - height / 2), width * 0.95, height,
                              color=chunk_colour(len(summed), n))
            )  # fmt: skip
            ax.text(left + (k + 0.47) * width, cy, "+".join(map(str, summed)), ha="center",
                    va="center", fontsize=7 if n <= 4 else 5)  # fmt: skip
            ax.text(left + (k + 0.47) * width, cy - height, _fmt(state["chunks"][r][k]),
                    ha="center", va="center", fontsize=6)  # fmt: skip
    title = f"Ring all-reduce, {n} workers: step {state['step']} of {len(states) - 1}"
    title += f" ({state['phase']})"
    ax.set(xlim=(-1.9, 1.9), ylim=(-1.6, 1.6), aspect="equal",
           xlabel="box text: ranks summed in the chunk; below it, the chunk's values",
           ylabel="workers in ring order (clockwise)", title=title)  # fmt: skip
    key = [Patch(color=chunk_colour(k, n), label=f"{k} rank{'s' if k > 1 else ''}")
           for k in range(1, n + 1)]  # fmt: skip
    ax.legend(handles=key, title="chunk sums", loc="lower center", ncol=n, fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])
    return ax.figure


def memory_rows(params: float, ranks: int) -> list[dict]:
    """Bytes per rank for stages 0–3 (fp32 + Adam): one dict per stage, `memory_per_rank`'s."""
    return [{"stage": s, **memory_per_rank(params, ranks, s)} for s in STAGES]


def draw_memory(params: float, ranks: int, stage: int, ax=None):
    """Stacked bars of parameters, gradients and Adam state per rank, stage ``stage`` outlined."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.6))
    ax.clear()
    rows = memory_rows(params, ranks)
    labels = [f"stage {row['stage']}" for row in rows]
    bottom = [0.0] * len(rows)
    parts = [("params", "blue", "parameters (4 B)"), ("grads", "orange", "gradients (4 B)"),
             ("optimizer", "green", "Adam moments (8 B)")]  # fmt: skip
    for key, colour, label in parts:
        heights = [row[key] / 1e9 for row in rows]
        ax.bar(labels, heights, bottom=bottom, color=PALETTE[colour], label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.bar(labels[stage], bottom[stage], fill=False, edgecolor=PALETTE["black"], lw=2.5)
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.3g} GB", ha="center", va="bottom", fontsize=8)
    title = f"{params:.3g} parameters on {ranks} ranks: memory per rank, no activations"
    ax.set(ylabel="GB per rank (10⁹ bytes)", xlabel=f"ZeRO stage (outlined: {STAGES[stage]})",
           ylim=(0, max(bottom) * 1.18), title=title)  # fmt: skip
    ax.legend(fontsize=8)
    return ax.figure


def ring_view(values: list[list[float]]) -> None:
    """A step slider over the ring all-reduce of ``values``; a still picture without widgets."""
    import ipywidgets as widgets

    states = ring_allreduce_steps(values)
    slider = widgets.IntSlider(0, 0, len(states) - 1, description="step")
    live = LiveFigure((7.5, 6.2))
    ax = live.fig.subplots()

    def redraw(*_):
        draw_ring(states, slider.value, ax)
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
    ax = live.fig.subplots()

    def redraw(*_):
        draw_memory(p.value, r.value, s.value, ax)
        live.refresh()

    for widget in (p, r, s):
        widget.observe(redraw, names="value")
    redraw()
    still, still_ax = plt.subplots(figsize=(7.5, 3.6))
    draw_memory(params, ranks, stage, still_ax)
    show(widgets.VBox([widgets.HBox([p, r, s]), live.image]), still)
