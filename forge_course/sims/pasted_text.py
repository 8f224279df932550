"""Text that Agg draws once per look and then pastes as an image, for views that redraw it.

Agg renders every glyph anew at every draw, about 0.1 ms a glyph (matplotlib 3.11: a FreeType
render and a Python loop per glyph), so a table or a diagram full of labels spends most of a
redraw on text that a slider moved back to a state it has shown before. `PastedText` is a
`matplotlib.text.Text` (its string, font and colour read as usual, and other renderers draw it
as usual) that Agg draws once per look (string, font, colour, alignment, resolution) on a
canvas of its own, keeps, and afterwards pastes where the text belongs, at the nearest whole
pixel: half a pixel from where Agg would draw it, at most. It is never clipped, so it is meant
for texts inside their axes, and never rotated (a rotated one is drawn as usual).
"""

from __future__ import annotations

import math
from typing import ClassVar

import matplotlib.figure
import numpy as np
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.colors import to_rgba
from matplotlib.text import Text
from matplotlib.transforms import IdentityTransform

MARGIN = 2  # pixels around a text's box, for glyphs that reach past it
MOST_LOOKS = 4096  # then the kept pictures are dropped: a view shows a few hundred at most


class PastedText(Text):
    """A `Text` whose Agg drawing is kept and pasted (see the module's docstring).

    Add it with ``ax.add_artist(PastedText(x, y, text, **text_properties))``.
    """

    # look -> (pixels, bottom row first as `draw_image` takes them; where the text's anchor
    # lies in them, in pixels from their bottom-left corner)
    _pictures: ClassVar[dict[tuple, tuple[np.ndarray, tuple[float, float]]]] = {}

    def _look(self, dpi: float) -> tuple:
        # `_linespacing`: matplotlib has a getter only from 3.11 (Colab has 3.10).
        return (self.get_text(), self.get_fontproperties(), to_rgba(self.get_color()),
                self.get_horizontalalignment(), self.get_verticalalignment(),
                self._linespacing, self.get_alpha(), self.get_antialiased(),
                self.get_usetex(), dpi)  # fmt: skip

    def picture(self, dpi: float) -> tuple[np.ndarray, tuple[float, float]]:
        """The text drawn alone at ``dpi``, and where its anchor lies in the picture: drawn
        the first time, kept afterwards."""
        look = self._look(dpi)
        if look not in self._pictures:
            if len(self._pictures) >= MOST_LOOKS:
                self._pictures.clear()
            alone = Text(0, 0, self.get_text(), color=self.get_color(),
                         fontproperties=self.get_fontproperties(), ha=look[3], va=look[4],
                         linespacing=look[5], alpha=look[6], antialiased=look[7],
                         usetex=look[8])  # fmt: skip
            kept = (look[0], look[1].copy(), *look[2:])  # a font is mutable: keep a copy
            self._pictures[kept] = _drawn_alone(alone, dpi)
        return self._pictures[look]

    def draw(self, renderer) -> None:
        if (not self.get_visible() or not self.get_text() or self.get_rotation() != 0
                or not isinstance(renderer, RendererAgg)):  # fmt: skip
            super().draw(renderer)
            return
        pixels, (anchor_x, anchor_y) = self.picture(renderer.dpi)
        x, y = self.get_transform().transform(self.get_unitless_position())
        gc = renderer.new_gc()
        renderer.draw_image(gc, round(x - anchor_x), round(y - anchor_y), pixels)
        gc.restore()
        self.stale = False


_SCRATCH: dict[float, tuple] = {}  # dpi -> a figure and a canvas to draw texts alone on


def _drawn_alone(text: Text, dpi: float) -> tuple[np.ndarray, tuple[float, float]]:
    """``text`` drawn by Agg on a transparent canvas, cut to its box and `MARGIN`; and where its
    anchor lies in that. One canvas per resolution, so that Agg measures each string once."""
    figure, canvas = _SCRATCH.get(dpi) or (matplotlib.figure.Figure(dpi=dpi), None)
    text.set(transform=IdentityTransform(), figure=figure)
    box = text.get_window_extent(canvas or RendererAgg(1, 1, dpi))  # anchored at (0, 0)
    anchor = (MARGIN - box.x0, MARGIN - box.y0)  # so that the box starts at the margin
    right, top = math.ceil(box.width) + 2 * MARGIN, math.ceil(box.height) + 2 * MARGIN
    if canvas is None or right > canvas.width or top > canvas.height:
        canvas = RendererAgg(max(right, 2000), max(top, 200), dpi)
        _SCRATCH[dpi] = figure, canvas
    canvas.clear()
    text.set_position(anchor)
    text.draw(canvas)
    pixels = np.asarray(canvas.buffer_rgba())[canvas.height - top :, :right]  # top row first
    return pixels[::-1].copy(), anchor
