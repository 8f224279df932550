"""Short texts drawn as outlines, for numbers a live view redraws on every event.

Matplotlib 3.11's Agg backend draws a text glyph by glyph in Python: about 0.07 ms a glyph and
0.25 ms a line on the machine the benchmarks ran on, so a few dozen changing numbers cost more
than the rest of a redraw. The same characters as one `~matplotlib.path.Path`, each glyph's
outline cached, draw as a single collection in a fraction of that. They are not hinted as
Agg's texts are; at 7 to 10 points the difference is hard to see.

`outline` gives a text's path in points; `points(fig)` is the transform that draws such paths
at the figure's resolution, for a `~matplotlib.collections.PathCollection` whose offsets place
each one.
"""

from __future__ import annotations

import functools

import numpy as np
from matplotlib.font_manager import FontProperties
from matplotlib.path import Path
from matplotlib.textpath import TextPath
from matplotlib.transforms import Affine2D

__all__ = ["outline", "points", "text_width"]


@functools.cache
def _glyph(char: str, size: float, bold: bool = False) -> tuple[Path, float]:
    """``char``'s outline at ``size`` points (baseline at 0), and its advance width."""
    prop = FontProperties(weight="bold" if bold else "normal")
    path = (Path(np.empty((0, 2))) if char.isspace()
            else TextPath((0, 0), char, size=size, prop=prop))  # fmt: skip
    # Two zeros around it, less two zeros alone: the advance, side bearings included.
    inked = [TextPath((0, 0), s, size=size, prop=prop).vertices[:, 0] for s in (f"0{char}0", "00")]
    return path, float(inked[0].max() - inked[0].min() - inked[1].max() + inked[1].min())


@functools.lru_cache(maxsize=8192)
def outline(
    text: str,
    size: float,
    x: float = 0.0,
    y: float = 0.0,
    ha: str = "left",
    va: str = "baseline",
    bold: bool = False,
) -> Path:
    """``text`` at ``size`` points as one path, in points, anchored at (``x``, ``y``).

    Args:
        ha: which end of the text is at ``x``: "left", "center" or "right".
        va: "baseline" (the baseline at ``y``) or "center" (a digit's middle at ``y``).
    """
    width = text_width(text, size, bold)
    left = {"left": x, "center": x - width / 2, "right": x - width}[ha]
    if va == "center":
        y -= _glyph("0", size)[0].vertices[:, 1].max() / 2
    parts = []
    for char in text:
        path, advance = _glyph(char, size, bold)
        parts.append(path.transformed(Affine2D().translate(left, y)))
        left += advance
    return Path.make_compound_path(*parts)


def text_width(text: str, size: float, bold: bool = False) -> float:
    """How far ``text`` at ``size`` points advances, in points."""
    return sum(_glyph(char, size, bold)[1] for char in text)


def points(fig) -> Affine2D:
    """Points to pixels in ``fig``: the transform of the paths `outline` makes."""
    return Affine2D().scale(1 / 72) + fig.dpi_scale_trans
