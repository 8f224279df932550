"""What every simulation view shares: the palette, and a display that degrades to a picture.

`show(widget, figure)` sends one output holding both the live widget and a PNG of its default
state. JupyterLab, Notebook 7 and Colab render the widget; a viewer without a widget front end
(nbconvert HTML, GitHub, a plain kernel) falls back to the picture instead of ``VBox(...)``.

The output is built from public pieces only, so it works with ipywidgets 7.6+ (Colab) and 8:
the widget's ``model_id`` and the widget-view MIME type that every widget front end reads.
"""

from __future__ import annotations

import base64
import io

import matplotlib.figure
import matplotlib.pyplot as plt
from IPython.display import display

# The MIME type through which a front end draws a widget from its model, and the version of its
# schema that ipywidgets 7 and 8 both write (@jupyter-widgets/schema, "widget view" v2.0).
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

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
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def show(widget, fig: matplotlib.figure.Figure) -> None:
    """Display ``widget``, with ``fig`` (its default state) for viewers without widgets."""
    bundle = {
        "text/plain": type(widget).__name__,
        "image/png": base64.b64encode(figure_png(fig)).decode("ascii"),
        WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": widget.model_id},
    }
    display(bundle, raw=True)
