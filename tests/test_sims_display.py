"""`show`: one output with the live widget and its picture, built from public APIs only.

The Colab-like test (`tests/test_colab_runtime.py`) runs it under ipywidgets 7.7.1; here it runs
under the ipywidgets 8 of this environment, where the widget part must be what ipywidgets itself
would send, so JupyterLab draws the same widget as before.
"""

import base64

import ipywidgets as widgets
import matplotlib.pyplot as plt

from forge_course.sims import display as display_module
from forge_course.sims.display import WIDGET_VIEW, show


def test_show_sends_the_widget_and_its_picture(monkeypatch):
    sent = []
    monkeypatch.setattr(display_module, "display", lambda bundle, raw: sent.append((bundle, raw)))
    box = widgets.VBox([widgets.IntSlider(3, 0, 10, description="k")])
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])

    show(box, fig)

    [(bundle, raw)] = sent
    assert raw, "the bundle is sent as MIME data, not as an object to format"
    assert bundle[WIDGET_VIEW]["model_id"] == box.model_id
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    assert fig.number not in plt.get_fignums(), "the picture's figure is closed, not drawn twice"
    # ipywidgets 8's own bundle for the widget (7 has none): the same view, so Lab draws the same.
    own = box._repr_mimebundle_()
    assert own[WIDGET_VIEW] == bundle[WIDGET_VIEW]


def test_a_live_figure_redraws_its_moving_artists_and_its_still_picture_keeps_them():
    import io

    import numpy as np
    from PIL import Image

    from forge_course.sims.display import LiveFigure, figure_png

    live = LiveFigure((3, 2))
    ax = live.fig.subplots()
    ax.plot([0, 1], [0, 1], color="black")
    marker = ax.plot([0.5], [0.5], "o", color="red", ms=12)[0]
    live.moving(lambda: [marker])
    first = live.pixels().copy()
    marker.set_data([0.2], [0.8])
    moved = live.pixels().copy()  # drawn over the kept background
    marker.set_data([0.5], [0.5])
    assert np.array_equal(live.pixels(), first), "the background was kept clean of the marker"
    assert not np.array_equal(moved, first)

    def red_pixels(png):
        rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
        return int(((rgb[..., 0] > 200) & (rgb[..., 1] < 80)).sum())

    assert red_pixels(figure_png(live.fig)) > 0, "the still picture has the moving marker"
    assert marker.get_animated(), "and the live figure keeps drawing it apart"


def test_the_live_png_decodes_to_the_very_pixels_drawn():
    import io

    import numpy as np
    from PIL import Image

    from forge_course.sims.display import LiveFigure, encode_png

    live = LiveFigure((3, 2))
    live.fig.subplots().plot([0, 1], [1, 0])
    opaque = live.pixels().copy()
    see_through = opaque.copy()
    see_through[:5, :7, 3] = 40
    for pixels, mode in ((opaque, "RGB"), (see_through, "RGBA")):
        decoded = Image.open(io.BytesIO(encode_png(pixels)))
        assert decoded.mode == mode, "RGB only where every pixel is opaque"
        assert np.array_equal(np.asarray(decoded.convert("RGBA")), pixels)
