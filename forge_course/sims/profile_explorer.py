"""Profile explorer: where a step's time goes when batches come from DataLoader workers.

`simulate` replays a loop of ``steps`` steps as a DataLoader runs it. With ``workers = 0`` the
main process loads each batch itself, then computes on it. With ``W`` workers, worker ``j % W``
loads batch ``j``; each worker may hold at most ``prefetch`` batches that the model has not
taken yet (DataLoader's ``prefetch_factor``), and the model takes batches in order, waiting
when the next one is not ready. Loading is assumed to wait (a read, a decode in another
process), so ``W`` workers load ``W`` batches at once; on a machine with fewer cores than
workers, CPU-bound decoding does not overlap that well.

In the steady state a step takes ``max(compute, load / W)``: the model or the workers,
whichever is slower, sets the pace, and the rest is idle time.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from forge_course.sims.display import PALETTE, LiveFigure, show, tight_layout_afresh


@dataclass(frozen=True)
class Timeline:
    """What happened in each lane, as ``(start_ms, duration_ms)`` bars."""

    waits: list[tuple[float, float]]  # the model waiting for its next batch
    computes: list[tuple[float, float]]  # forward, backward and update of each step
    loads: list[list[tuple[float, float]]]  # per loader lane (the main process when workers=0)
    end_ms: float  # when the last step finished
    in_main: bool = False  # whether the main process loaded the batches (no workers)

    @property
    def steady_step_ms(self) -> float:
        """Mean step time over the second half of the run, past the start-up."""
        half = len(self.computes) // 2
        finishes = [start + length for start, length in self.computes]
        return (finishes[-1] - finishes[half - 1]) / (len(finishes) - half)

    @property
    def idle_share(self) -> float:
        """The share of the second half's time the model spent waiting for data."""
        half = len(self.computes) // 2
        waited = sum(length for _, length in self.waits[half:])
        finishes = [start + length for start, length in self.computes]
        return waited / (finishes[-1] - finishes[half - 1])


def simulate(
    load_ms: float, compute_ms: float, workers: int = 0, prefetch: int = 2, steps: int = 12
) -> Timeline:
    """The timeline of ``steps`` steps; see the module's docstring for the rules."""
    for name, value in (("load_ms", load_ms), ("compute_ms", compute_ms)):
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise ValueError(f"`{name}` must be a number of milliseconds ≥ 0, got {value!r}.")
    for name, value, least in (("workers", workers, 0), ("prefetch", prefetch, 1),
                               ("steps", steps, 2)):  # fmt: skip
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"`{name}` must be a whole number ≥ {least}, got {value!r}.")
    waits, computes = [], []
    if workers == 0:
        loads, now = [[]], 0.0
        for _ in range(steps):
            loads[0].append((now, load_ms))
            waits.append((now, load_ms))
            computes.append((now + load_ms, compute_ms))
            now += load_ms + compute_ms
        return Timeline(waits, computes, loads, now, in_main=True)
    loads = [[] for _ in range(workers)]
    free = [0.0] * workers  # when each worker finishes its current batch
    taken: list[float] = []  # when the model took each batch
    now = 0.0
    for j in range(steps):
        w = j % workers
        start = free[w]
        if j >= workers * prefetch:  # its slot frees when an earlier batch is taken
            start = max(start, taken[j - workers * prefetch])
        ready = start + load_ms
        free[w] = ready
        loads[w].append((start, load_ms))
        take = max(now, ready)
        waits.append((now, take - now))
        taken.append(take)
        computes.append((take, compute_ms))
        now = take + compute_ms
    return Timeline(waits, computes, loads, now)


LEGEND_IN = 0.35  # inches at the figure's bottom for the legend


def draw(timeline: Timeline, title: str = "", fig=None):
    """Lanes of bars: the model (compute in blue, waiting in grey) above each loader lane."""
    lanes = len(timeline.loads)
    size = (10, 1.4 + LEGEND_IN + 0.45 * lanes)
    if fig is None:
        fig = plt.figure(figsize=size)
    fig.set_size_inches(*size)  # a kept figure grows and shrinks with the lanes
    fig.clear()
    ax = fig.add_subplot()
    ax.broken_barh(timeline.computes, (lanes, 0.8), color=PALETTE["blue"], label="compute")
    ax.broken_barh([w for w in timeline.waits if w[1] > 0], (lanes, 0.8),
                   color=PALETTE["grey"], label="waiting for data")  # fmt: skip
    for i, bars in enumerate(timeline.loads):
        ax.broken_barh(bars, (lanes - 1 - i, 0.8), color=PALETTE["orange"],
                       edgecolor="white", label="loading" if i == 0 else None)  # fmt: skip
    names = ["main process"] if timeline.in_main else [f"worker {i}" for i in range(lanes)]
    ax.set_yticks([lanes - 1 - i + 0.4 for i in range(lanes)] + [lanes + 0.4],
                  names + ["model"])  # fmt: skip
    ax.set_xlim(0, timeline.end_ms * 1.01)
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"step {timeline.steady_step_ms:.1f} ms, model idle "
                 f"{timeline.idle_share:.0%} of the time", fontsize=10)  # fmt: skip
    # The legend gets a strip of its own at the bottom, below the axis label, whatever the lanes.
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=3, frameon=False)
    tight_layout_afresh(fig, rect=(0, LEGEND_IN / fig.get_figheight(), 1, 1))
    return fig


def costs(batch: int, load_per_example_ms: float, compute_fixed_ms: float,
          compute_per_example_ms: float) -> tuple[float, float]:  # fmt: skip
    """``(load_ms, compute_ms)`` of one batch: loading grows with the batch, compute has a fixed
    part (launching operators, the optimizer's update) and a part per example."""
    return batch * load_per_example_ms, compute_fixed_ms + batch * compute_per_example_ms


def profile_explorer_view(
    load_per_example_ms: float,
    compute_fixed_ms: float,
    compute_per_example_ms: float,
    workers: int = 0,
    batch: int = 64,
    prefetch: int = 2,
) -> None:
    """Sliders for workers, batch size and prefetch over `draw`; the default state as a PNG."""
    import ipywidgets as widgets

    style = {"description_width": "initial"}
    controls = {
        "workers": widgets.IntSlider(workers, 0, 8, description="num_workers", style=style),
        "batch": widgets.IntSlider(batch, 8, 256, step=8, description="batch size", style=style),
        "prefetch": widgets.IntSlider(prefetch, 1, 4, description="prefetch_factor", style=style),
    }
    live = LiveFigure((10, 1.4))

    def figure(workers, batch, prefetch, fig=None):
        load, compute = costs(batch, load_per_example_ms, compute_fixed_ms, compute_per_example_ms)
        timeline = simulate(load, compute, workers, prefetch)
        per_example = timeline.steady_step_ms / batch
        title = (f"load {load:.1f} ms, compute {compute:.1f} ms per batch → step "
                 f"{timeline.steady_step_ms:.1f} ms ({per_example * 1e3:.0f} µs per example), "
                 f"model idle {timeline.idle_share:.0%}")  # fmt: skip
        return draw(timeline, title, fig)

    def redraw(*_):
        figure(**{name: w.value for name, w in controls.items()}, fig=live.fig)
        live.refresh()

    for widget in controls.values():
        widget.observe(redraw, "value")
    redraw()
    show(widgets.VBox([widgets.HBox(list(controls.values())), live.image]),
         figure(workers, batch, prefetch))  # fmt: skip
