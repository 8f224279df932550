"""Pasted text looks like the text Agg draws, where Agg draws it, and is drawn once per look."""

import matplotlib
import matplotlib.figure
import numpy as np
import pytest
from matplotlib.text import Text

from forge_course.sims.display import figure_pixels
from forge_course.sims.pasted_text import PastedText

matplotlib.use("Agg")


def _drawn(kind, text, **style):
    fig = matplotlib.figure.Figure((4, 1.2), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.axis("off")
    ax.add_artist(kind(0.3, 0.5, text, **style))
    return figure_pixels(fig)[..., :3].astype(int)


@pytest.mark.parametrize(
    "text, style",
    [
        ("✗ hidden[0]  Linear", {"ha": "left", "va": "center", "fontweight": "bold"}),
        ("0+1+2", {"ha": "center", "va": "center", "fontsize": 7, "color": "#D55E00"}),
        ("chunk 2\nof 3", {"ha": "right", "va": "top", "fontsize": 9}),
        ("16 GB", {"ha": "center", "va": "bottom", "fontsize": 8}),
    ],
)
def test_pasted_text_is_where_agg_draws_it_with_as_much_ink(text, style):
    drawn, pasted = _drawn(Text, text, **style), _drawn(PastedText, text, **style)
    ink = lambda image: np.argwhere((image < 250).any(axis=-1))  # noqa: E731
    # The same glyphs at most a pixel apart: the paste rounds the text's position.
    assert np.abs(ink(drawn).min(0) - ink(pasted).min(0)).max() <= 1
    assert np.abs(ink(drawn).max(0) - ink(pasted).max(0)).max() <= 1
    assert (255 - pasted).sum() == pytest.approx((255 - drawn).sum(), rel=0.01)


def test_a_look_is_drawn_once_and_its_text_still_reads_as_a_text():
    text = PastedText(0, 0, "weight [8, 4], bias [8]", fontsize=7.5)
    first = text.picture(100)
    assert text.picture(100)[0] is first[0]
    assert text.picture(90)[0] is not first[0]  # another resolution, another picture
    text.set_color("#0072B2")
    assert text.picture(100)[0] is not first[0]
    assert text.get_text() == "weight [8, 4], bias [8]" and isinstance(text, Text)
