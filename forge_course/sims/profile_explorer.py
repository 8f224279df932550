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
import numpy as np
from matplotlib.collections import PolyCollection

from forge_course.sims.display import PALETTE, LiveFigure, show


@dataclass(frozen=True)
class Timeline:
    """What happened in each lane, as ``(start_ms, duration_ms)`` bars."""

    waits: list[tuple[float, float]]  # the model waiting for its next batch
    computes: list[tuple[float, float]]  # forward, backward and update of each step
    loads: list[list[tuple[float, float]]]  # per loader lane (the main process when workers=0)
    end_ms: float  # when the last step finished
    in_main: bool = False  # whether the main process loaded the batches (no workers)

    @property
    def steady_window(self) -> int:
        """The last steps of the run that make whole rounds of the loaders (a round: one batch
        from each), the first step left out: workers that start together deliver their batches
        in bursts, and a window that cut a burst would get the pace wrong (12 steps of 4
        workers, timed over their second half, gave 4.7 ms a step where the pace is 6.9)."""
        lanes = len(self.loads)
        return (len(self.computes) - 1) // lanes * lanes

    @property
    def steady_step_ms(self) -> float:
        """Mean step time over `steady_window`, past the start-up."""
        finishes = [start + length for start, length in self.computes]
        return (finishes[-1] - finishes[-1 - self.steady_window]) / self.steady_window

    @property
    def idle_share(self) -> float:
        """The share of `steady_window`'s time the model spent waiting for data."""
        waited = sum(length for _, length in self.waits[-self.steady_window :])
        return waited / (self.steady_step_ms * self.steady_window)


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
# The figure's layout in inches, fixed whatever the lanes (no layout engine per event): the
# lanes' labels on the left, the title on top, the time axis and the legend below. The lanes
# share the axes' height, so that a change of workers redraws only the bars and labels.
WIDTH_IN, LEFT_IN, RIGHT_IN, TOP_IN, LANES_IN = 10.0, 1.15, 0.25, 0.4, 2.2
BELOW_IN = LEGEND_IN + 0.6
TICK_PAD = 7.0  # points from the axis to a lane's label: matplotlib's tick length and pad


class ProfilePicture:
    """`draw`'s picture, built once for a figure of fixed size: an update moves the bars (three
    collections), the lanes' labels and the title, and the time axis only when its span changes.
    """

    def __init__(self, fig) -> None:
        self.fig = fig
        height = TOP_IN + LANES_IN + BELOW_IN
        fig.set_size_inches(WIDTH_IN, height)
        left, width = LEFT_IN / WIDTH_IN, 1 - (LEFT_IN + RIGHT_IN) / WIDTH_IN
        self.ax = ax = fig.add_axes((left, BELOW_IN / height, width, LANES_IN / height))
        self.computes = PolyCollection([], color=PALETTE["blue"], label="compute")
        self.waits = PolyCollection([], color=PALETTE["grey"], label="waiting for data")
        self.loads = PolyCollection([], color=PALETTE["orange"], edgecolor="white",
                                    label="loading")  # fmt: skip
        for bars in (self.computes, self.waits, self.loads):
            ax.add_collection(bars, autolim=False)
        ax.set_ylim(0, 1)  # the lanes divide it among themselves
        ax.set_yticks([])
        self.labels: list = []  # one per lane, where tick labels would be; made as needed
        ax.set_xlabel("time (ms)")
        self.title = ax.set_title("", fontsize=10, y=1.0)  # y given: not placed per draw
        # The legend gets a strip of its own at the bottom, below the axis label.
        fig.legend(handles=[self.computes, self.waits, self.loads], loc="lower center", ncol=3,
                   frameon=False)  # fmt: skip

    def moving_artists(self) -> list:
        """What `update` changes; the axes, the legend and the axis label stay as drawn. The
        spines are drawn again over the bars, which start on the left one."""
        return [self.computes, self.waits, self.loads, *self.ax.spines.values(), *self.labels,
                self.title]  # fmt: skip

    def update(self, timeline: Timeline, title: str = "", span_ms: float | None = None) -> None:
        """Draw ``timeline`` over a time axis of ``span_ms`` (default: to its end)."""
        lanes = len(timeline.loads)
        rows = lanes + 1  # the model on top
        pitch = 1 / rows
        self.computes.set_verts(_bars(timeline.computes, 1 - pitch, pitch))
        self.waits.set_verts(_bars([w for w in timeline.waits if w[1] > 0], 1 - pitch, pitch))
        self.loads.set_verts(np.concatenate(
            [_bars(bars, 1 - (i + 2) * pitch, pitch) for i, bars in enumerate(timeline.loads)]
        ))  # fmt: skip
        names = ["main process"] if timeline.in_main else [f"worker {i}" for i in range(lanes)]
        transform, va, ha = self.ax.get_yaxis_text1_transform(TICK_PAD)
        while len(self.labels) < rows:
            self.labels.append(self.ax.text(0, 0, "", transform=transform, va=va, ha=ha))
        for row, label in enumerate(self.labels):
            label.set_visible(row < rows)
            if row < rows:
                label.set_text((["model"] + names)[row])
                label.set_y(1 - (row + 0.5) * pitch)
        self.ax.set_xlim(0, (span_ms or timeline.end_ms) * 1.01)
        self.title.set_text(title or f"step {timeline.steady_step_ms:.1f} ms, model idle "
                            f"{timeline.idle_share:.0%} of the time")  # fmt: skip


def _bars(spans: list[tuple[float, float]], bottom: float, pitch: float) -> np.ndarray:
    """``(start, length)`` spans as bars on the lane from ``bottom`` up to ``bottom + pitch``,
    8/10 of its height: corners, ``n × 4 × 2``."""
    start, length = np.array(spans, dtype=float).reshape(-1, 2).T
    x0, x1 = start, start + length
    y0 = np.full_like(start, bottom + 0.1 * pitch)
    y1 = y0 + 0.8 * pitch
    return np.stack([np.stack(corner, axis=-1) for corner in
                     ((x0, y0), (x1, y0), (x1, y1), (x0, y1))], axis=1)  # fmt: skip


def draw(timeline: Timeline, title: str = "", fig=None, span_ms: float | None = None):
    """Lanes of bars: the model (compute in blue, waiting in grey) above each loader lane, over
    a time axis of ``span_ms`` (default: to the timeline's end)."""
    if fig is None:
        fig = plt.figure(figsize=(WIDTH_IN, TOP_IN + LANES_IN + BELOW_IN))
    fig.clear()
    ProfilePicture(fig).update(timeline, title, span_ms)
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
    live = LiveFigure((WIDTH_IN, 1.4))  # the picture sets its size
    picture = ProfilePicture(live.fig)
    live.moving(picture.moving_artists)

    def explained(workers, batch, prefetch) -> tuple[Timeline, str, float]:
        load, compute = costs(batch, load_per_example_ms, compute_fixed_ms, compute_per_example_ms)
        timeline = simulate(load, compute, workers, prefetch)
        per_example = timeline.steady_step_ms / batch
        title = (f"load {load:.1f} ms, compute {compute:.1f} ms per batch → step "
                 f"{timeline.steady_step_ms:.1f} ms ({per_example * 1e3:.0f} µs per example), "
                 f"model idle {timeline.idle_share:.0%}")  # fmt: skip
        # The time axis spans the run without workers, the slowest: it stays as the workers
        # change, and shows the time they save.
        return timeline, title, simulate(load, compute, 0).end_ms

    def redraw(*_):
        picture.update(*explained(**{name: w.value for name, w in controls.items()}))
        live.refresh()

    for widget in controls.values():
        widget.observe(redraw, "value")
    redraw()
    timeline, title, span_ms = explained(workers, batch, prefetch)
    show(widgets.VBox([widgets.HBox(list(controls.values())), live.image]),
         draw(timeline, title, span_ms=span_ms))  # fmt: skip
