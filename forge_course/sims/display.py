"""What every simulation view shares: the palette, a display that degrades to a picture, and
one live figure per view.

`show(widget, figure)` sends one output holding both the live widget and a PNG of its default
state. JupyterLab, Notebook 7 and Colab render the widget; a viewer without a widget front end
(nbconvert HTML, GitHub, a plain kernel) falls back to the picture instead of ``VBox(...)``.

The output is built from public pieces only, so it works with ipywidgets 7.6+ (Colab) and 8:
the widget's ``model_id`` and the widget-view MIME type that every widget front end reads.

`LiveFigure` is the figure a view keeps for its whole life. A slider event updates its artists
and `refresh` renders it once into an ``ipywidgets.Image``. Building a new figure per event and
letting the inline backend crop it (``bbox_inches="tight"`` draws the figure twice) cost most
of a redraw (benchmarks/RESULTS.md, "Simulations").
"""

from __future__ import annotations

import base64
import io
import struct
import zlib

import matplotlib.figure
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display
from matplotlib.backends.backend_agg import FigureCanvasAgg

# The MIME type through which a front end draws a widget from its model, and the version of its
# schema that ipywidgets 7 and 8 both write (@jupyter-widgets/schema, "widget view" v2.0).
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# The inline backend's resolution (matplotlib's default figure.dpi), so a live view is as large
# as the picture it replaces; zlib's fastest level, as the PNG travels only to this browser.
LIVE_DPI = 100
LIVE_COMPRESSION = 1

# Okabe–Ito: distinguishable with every common form of colour blindness.
PALETTE = {
    "blue": "#0072B2",
    "orange": "#E69F00",
    "green": "#009E73",
    "vermillion": "#D55E00",
    "sky": "#56B4E9",
    "purple": "#CC79A7",
    "yellow": "#F0E442",
    "grey": "#999999",
    "black": "#000000",
}


def figure_png(fig: matplotlib.figure.Figure) -> bytes:
    """The figure as PNG bytes (closed afterwards, so notebooks do not also draw it inline)."""
    animated = [artist for artist in fig.findobj() if artist.get_animated()]
    for artist in animated:  # a live figure's moving artists belong in the picture too
        artist.set_animated(False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    for artist in animated:
        artist.set_animated(True)
    return buffer.getvalue()


def show(widget, fig: matplotlib.figure.Figure) -> None:
    """Display ``widget``, with ``fig`` (its default state) for viewers without widgets."""
    bundle = {
        "text/plain": type(widget).__name__,
        "image/png": base64.b64encode(figure_png(fig)).decode("ascii"),
        WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": widget.model_id},
    }
    display(bundle, raw=True)


def figure_pixels(fig: matplotlib.figure.Figure) -> np.ndarray:
    """``fig`` drawn once by Agg, as an RGBA array (height × width × 4)."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())


def encode_png(pixels: np.ndarray) -> bytes:
    """An RGBA array as PNG, fast: what a view sends per event.

    Written here rather than by Pillow, which tries a filter per row: without filters, and as
    RGB when every pixel is opaque (a figure's background is), it takes half the time for a
    file a few percent larger (1000 × 550 pixels: 7 ms against 15).
    """
    height, width, _ = pixels.shape
    opaque = bool((pixels[..., 3] == 255).all())
    channels = 3 if opaque else 4
    rows = np.zeros((height, 1 + width * channels), np.uint8)  # each row: filter 0, pixels
    rows[:, 1:] = pixels[..., :channels].reshape(height, -1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2 if opaque else 6, 0, 0, 0)
    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            _png_chunk(b"IHDR", header),
            _png_chunk(b"IDAT", zlib.compress(rows.tobytes(), LIVE_COMPRESSION)),
            _png_chunk(b"IEND", b""),
        ]
    )


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def tight_layout_afresh(fig: matplotlib.figure.Figure, **kwargs) -> None:
    """``fig.tight_layout(**kwargs)`` from a new figure's margins: tight_layout starts from the
    current layout, and its result depends a little on it (tick locators depend on axes sizes),
    so a live figure would drift from the one a fresh draw gives."""
    fig.subplots_adjust(**{k: plt.rcParams[f"figure.subplot.{k}"] for k in SUBPLOT_PARAMS})
    fig.tight_layout(**kwargs)


SUBPLOT_PARAMS = ("left", "right", "bottom", "top", "wspace", "hspace")


class LiveFigure:
    """One figure for a view's life, outside pyplot, drawn by Agg once per `refresh`.

    A view whose events change only a few artists names them with `moving`: the rest is drawn
    once and kept as a background, and an event draws only those artists over it, until the
    axes move or rescale (then everything is drawn again).
    """

    def __init__(self, figsize: tuple[float, float], **kwargs) -> None:
        self.fig = matplotlib.figure.Figure(figsize=figsize, dpi=LIVE_DPI, **kwargs)
        FigureCanvasAgg(self.fig)
        self._image = None
        self._moving = None  # returns the artists an event may change, in drawing order
        self._background, self._drawn_for = None, None

    def moving(self, artists) -> None:
        """Draw only ``artists()`` per event, over a background of everything else.

        Only for a figure laid out before it is drawn (`tight_layout_afresh` in the update): a
        layout engine lays the figure out while drawing it, which the background would skip.
        """
        if self.fig.get_layout_engine() is not None:
            raise ValueError("a figure with a layout engine is laid out as it is drawn")
        self._moving = artists

    def _axes_state(self) -> tuple:
        """What the background depends on besides the static artists: where each axes is, and
        what it shows."""
        return tuple(self.fig.get_size_inches()) + tuple(
            (ax.get_position().bounds, ax.get_xlim(), ax.get_ylim(), ax.get_xscale(),
             ax.get_yscale())
            for ax in self.fig.axes
        )  # fmt: skip

    def pixels(self) -> np.ndarray:
        """The figure drawn once, as an RGBA array (height × width × 4)."""
        if self._moving is None:
            return figure_pixels(self.fig)
        canvas, artists = self.fig.canvas, [a for a in self._moving() if a is not None]
        for artist in artists:
            artist.set_animated(True)  # left out of the background
        state = self._axes_state()
        if self._background is None or state != self._drawn_for:
            canvas.draw()
            self._background, self._drawn_for = canvas.copy_from_bbox(self.fig.bbox), state
        else:
            canvas.restore_region(self._background)
        for artist in artists:
            if artist.get_visible():
                self.fig.draw_artist(artist)
        return np.asarray(canvas.buffer_rgba())

    def png(self) -> bytes:
        """The figure drawn once and encoded as PNG, without a second draw to crop it."""
        return encode_png(self.pixels())

    @property
    def image(self):
        """The ``ipywidgets.Image`` that shows the figure (made on first use)."""
        if self._image is None:
            import ipywidgets as widgets

            self._image = widgets.Image(format="png")
        return self._image

    def refresh(self) -> None:
        """Send the figure as it is now to the browser: one draw, one PNG, one widget message."""
        self.image.value = self.png()
