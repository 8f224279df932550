"""`outline`: a short text as one path, anchored as asked, the same path for the same text."""

import pytest

from forge_course.sims.outlines import outline


def _ink(path, axis=0):
    return path.vertices[:, axis].min(), path.vertices[:, axis].max()


def test_a_text_is_anchored_left_centred_or_right():
    # Ink starts and ends within a side bearing (about a point at 10 points) of its anchor.
    left, right = _ink(outline("+0.162", 10, x=5))
    assert 5 <= left < 6.5
    low, high = _ink(outline("+0.162", 10, x=5, ha="right"))
    assert 3.5 < high <= 5 and high - low == pytest.approx(right - left)
    low, high = _ink(outline("0.50", 10, ha="center", va="center"))
    assert low == pytest.approx(-high, abs=1)
    bottom, top = _ink(outline("0", 10, va="center"), axis=1)
    assert bottom == pytest.approx(-top, abs=0.3), "a digit's middle on y"


def test_spaces_advance_and_texts_are_cached():
    assert _ink(outline("1 1", 10))[1] > _ink(outline("11", 10))[1]
    assert outline("15 of 32", 8.5, 3.0, 6.5) is outline("15 of 32", 8.5, 3.0, 6.5)
