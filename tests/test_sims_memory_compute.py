"""The memory-vs-compute engine, driven headless: exact bytes, cached answers, a drawable figure."""

import matplotlib

matplotlib.use("Agg")

from forge_course.sims import memory_compute as mc  # noqa: E402

SMALL = {"n_layers": 6, "width": 8, "batch": 4, "repeats": 2}


def test_bytes_match_the_hand_count():
    plain, *rest = mc.measure_all(**SMALL)
    boundary = 4 * 8 * 4  # one block's input: batch 4 × width 8 × 4 bytes
    assert plain.segments == 0 and plain.saved_bytes == 6 * 9 * boundary
    for m in rest:
        assert m.saved_bytes == m.segments * boundary
        longest = -(-6 // m.segments)
        assert m.peak_bytes == m.saved_bytes + longest * 9 * boundary - boundary
        assert m.ms_per_step > 0


def test_one_segment_saves_nothing_at_the_peak_and_more_segments_do():
    plain, *rest = mc.measure_all(**SMALL)
    assert rest[0].peak_bytes == plain.saved_bytes
    assert min(m.peak_bytes for m in rest) < plain.saved_bytes / 2


def test_measurements_are_cached():
    first = mc.measure_all(**SMALL)
    assert all(a is b for a, b in zip(first, mc.measure_all(**SMALL), strict=True))


def test_draw_marks_the_chosen_segment_count():
    fig = mc.draw(mc.measure_all(**SMALL), current=3)
    mem, speed = fig.axes
    assert "k = 3" in mem.get_title() and mem.get_xlabel() and mem.get_ylabel()
    assert speed.get_xlabel() and speed.get_ylabel()
    assert "×" in speed.get_title()
    matplotlib.pyplot.close(fig)


def test_a_picture_moved_along_the_slider_equals_one_drawn_fresh():
    """Timings vary, so the rings land anywhere: on the top spine, under a legend. Whatever the
    numbers, the picture the slider moved is the one a fresh draw gives."""
    import dataclasses
    import random

    import numpy as np

    from forge_course.sims.display import LiveFigure
    from forge_course.sims.memory_compute import FIGSIZE, SegmentsPicture

    measured = mc.measure_all(n_layers=4, width=8, batch=4, device="cpu", repeats=1)
    rng = random.Random(0)
    for _ in range(12):  # 12 draws of timings: a third of them put a ring on the edge
        timed = [dataclasses.replace(m, ms_per_step=rng.uniform(0.05, 0.5)) for m in measured]
        live = LiveFigure(FIGSIZE)
        picture = SegmentsPicture(live.fig, timed)
        live.moving(picture.moving_artists)  # as the view does: only what an update changes
        for k in (4, 1, 3, 2):
            picture.update(k)
            live.pixels()
        fresh = LiveFigure(FIGSIZE)
        SegmentsPicture(fresh.fig, timed).update(2)
        assert np.array_equal(live.pixels(), fresh.pixels()), [m.ms_per_step for m in timed]
