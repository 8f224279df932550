"""Memory vs compute: how many checkpoint segments, measured on this device.

The engine, `measure`, runs one training step (forward, backward) of an ``N``-block MLP with
``k`` checkpoint segments and returns what it cost: the bytes kept for backward at the end of
the forward pass (counted exactly by `saved_activation_bytes`), the bytes held at worst during
backward (those, plus the largest segment's activations while it is recomputed), and the
fastest of a few timed steps (on a shared machine, the slower ones measure the neighbours).
Results are cached, so a slider that revisits a choice answers at once.
`draw` plots bytes and time against ``k``; `memory_compute_view` wires both to a slider.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
from matplotlib.layout_engine import TightLayoutEngine

from forge_course.reference.checkpointing import checkpointed_forward, segment_sizes
from forge_course.reference.memory import saved_activation_bytes
from forge_course.sims.display import PALETTE, LiveFigure, show

__all__ = ["Measurement", "make_blocks", "measure", "measure_all", "draw", "memory_compute_view"]


@dataclass(frozen=True)
class Measurement:
    """One segment count's cost. ``segments == 0`` stands for the plain, uncheckpointed forward."""

    segments: int
    saved_bytes: int  # kept for backward when the forward pass ends
    peak_bytes: int  # saved_bytes plus one recomputed segment: the most held during backward
    ms_per_step: float  # fastest wall time of forward + backward, in milliseconds


def make_blocks(n_layers: int, width: int, seed: int = 0) -> torch.nn.ModuleList:
    """``n_layers`` blocks ``Linear(width, 4·width) → GELU → Linear(4·width, width)``."""
    torch.manual_seed(seed)
    return torch.nn.ModuleList(
        torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width),
            torch.nn.GELU(),
            torch.nn.Linear(4 * width, width),
        )
        for _ in range(n_layers)
    )


def _plain(layers, x):
    for layer in layers:
        x = layer(x)
    return x


@functools.cache
def _setup(n_layers: int, width: int, batch: int, device: str):
    layers = make_blocks(n_layers, width).to(device)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1)).to(device)
    return layers, x


def measure(
    segments: int,
    n_layers: int = 16,
    width: int = 64,
    batch: int = 64,
    device: str = "cpu",
    repeats: int = 7,
) -> Measurement:
    """Measure one training step of the block stack with ``segments`` checkpoint segments.

    Args:
        segments: 0 for the plain forward, else 1 … ``n_layers``.
        n_layers, width, batch: the stack (`make_blocks`) and the input batch.
        device: where to run, as a string (it is part of the cache key).
        repeats: the time is the fastest of this many steps, after one warm-up step.

    Returns:
        A `Measurement`. Bytes are exact and the same on every device; times are this machine's.
    """
    # One cache key per configuration, however the arguments were spelled.
    return _measure(segments, n_layers, width, batch, device, repeats)


@functools.cache
def _measure(
    segments: int, n_layers: int, width: int, batch: int, device: str, repeats: int
) -> Measurement:
    layers, x = _setup(n_layers, width, batch, device)
    if segments == 0:
        forward = _plain
        saved = saved_activation_bytes(_plain, layers, x)
        peak = saved
    else:
        forward = functools.partial(checkpointed_forward.__wrapped__, segments=segments)
        saved = saved_activation_bytes(forward, layers, x)
        longest = max(segment_sizes(n_layers, segments))
        # While the longest segment is recomputed, its activations join the kept inputs; its
        # own input is one of those already, so it is not counted twice.
        recomputed = saved_activation_bytes(_plain, layers[:longest], x)
        peak = saved + recomputed - x.untyped_storage().nbytes()
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        forward(layers, x).square().mean().backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        layers.zero_grad()
    return Measurement(segments, saved, peak, min(times[1:]) * 1e3)


def measure_all(n_layers: int = 16, **kwargs) -> list[Measurement]:
    """`measure` for the plain forward (first) and for every segment count 1 … ``n_layers``."""
    return [measure(k, n_layers=n_layers, **kwargs) for k in range(n_layers + 1)]


FIGSIZE = (11, 3.8)


class SegmentsPicture:
    """`draw`'s two panels, made once from every measurement: the slider moves only the rings
    that mark ``k``, the legend's ``k`` and the titles."""

    def __init__(self, fig, measurements: list[Measurement]) -> None:
        self.fig, self.plain, self.rest = fig, measurements[0], measurements[1:]
        ax_mem, ax_time = self.ax_mem, self.ax_time = fig.subplots(1, 2)
        plain, rest, kib = self.plain, self.rest, 1024
        ks = [m.segments for m in rest]
        ax_mem.axhline(
            plain.saved_bytes / kib, color=PALETTE["grey"], ls="--", label="no checkpointing"
        )
        ax_mem.plot(ks, [m.saved_bytes / kib for m in rest], "o-", color=PALETTE["blue"],
                    label="kept after forward (measured)")  # fmt: skip
        ax_mem.plot(ks, [m.peak_bytes / kib for m in rest], "s-", color=PALETTE["orange"],
                    label="held during backward, at worst")  # fmt: skip
        # The rings start on a measured point, so the axes' limits are those of the data.
        first = rest[0]
        # The current k, circled on both panels.
        ring = {"ms": 12, "color": PALETTE["vermillion"], "mfc": "none", "mew": 2.5}
        self.mem_ring = ax_mem.plot(
            [first.segments] * 2, [first.saved_bytes / kib, first.peak_bytes / kib], "o", **ring
        )[0]
        ax_mem.set(xlabel="checkpoint segments k", ylabel="activation memory (KiB)")
        ax_time.axhline(plain.ms_per_step, color=PALETTE["grey"], ls="--", label="no checkpointing")
        ax_time.plot(ks, [m.ms_per_step for m in rest], "o-", color=PALETTE["green"],
                     label="with k segments")  # fmt: skip
        self.time_ring = ax_time.plot([first.segments], [first.ms_per_step], "o", **ring)[0]
        ax_time.set(xlabel="checkpoint segments k", ylabel="forward + backward (ms, fastest)")
        ax_time.set_ylim(bottom=0)
        ax_time.legend(fontsize=8)
        self.mem_ring.set_label(f"k = {first.segments}")
        self.legend = ax_mem.legend(fontsize=8)  # its last entry names k: `update` renames it
        # Laid out once, with titles as long as `update`'s: nothing an update changes moves the
        # axes, so a live figure redraws only `moving_artists` over the rest. The engine is run
        # once rather than set on the figure, which would lay it out at every draw.
        self._titles(first)
        TightLayoutEngine().execute(fig)

    def moving_artists(self) -> list:
        """What `update` changes, and what a full draw puts over it (a ring on a data point at
        the edge crosses the spine; a legend may cover a ring), in a full draw's order: the
        rest stays as first drawn."""
        rings = ((self.ax_mem, self.mem_ring), (self.ax_time, self.time_ring))
        return [artist for ax, ring in rings
                for artist in (ring, *ax.spines.values(), ax.title, ax.get_legend())]  # fmt: skip

    def _titles(self, chosen: Measurement) -> None:
        plain, k = self.plain, chosen.segments
        share = chosen.peak_bytes / plain.saved_bytes
        self.ax_mem.set_title(f"k = {k}: at worst {share:.0%} of the plain forward's memory")
        self.ax_time.set_title(f"k = {k}: {chosen.ms_per_step / plain.ms_per_step:.2f}× the "
                               "plain step's time")  # fmt: skip

    def update(self, current: int) -> None:
        kib = 1024
        chosen = next(m for m in self.rest if m.segments == current)
        self.mem_ring.set_data([current] * 2, [chosen.saved_bytes / kib, chosen.peak_bytes / kib])
        self.mem_ring.set_label(f"k = {current}")
        self.legend.get_texts()[-1].set_text(f"k = {current}")
        self.time_ring.set_data([current], [chosen.ms_per_step])
        self._titles(chosen)


def draw(measurements: list[Measurement], current: int):
    """Bytes (left) and time per step (right) against the segment count; ``current`` marked."""
    fig = plt.figure(figsize=FIGSIZE)
    SegmentsPicture(fig, measurements).update(current)
    return fig


def memory_compute_view(n_layers: int = 16, segments: int = 4, **kwargs) -> None:
    """A slider for the segment count over `draw`; every choice is measured once, up front."""
    import ipywidgets as widgets

    measurements = measure_all(n_layers, **kwargs)
    slider = widgets.IntSlider(segments, 1, n_layers, description="segments k")
    live = LiveFigure(FIGSIZE)
    picture = SegmentsPicture(live.fig, measurements)
    live.moving(picture.moving_artists)

    def redraw(*_):
        picture.update(slider.value)
        live.refresh()

    slider.observe(redraw, "value")
    redraw()
    show(widgets.VBox([slider, live.image]), live.fig)
