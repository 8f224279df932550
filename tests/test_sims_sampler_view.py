"""The sampler and padding engines, without widgets: what each epoch holds, counted exactly."""

import time

import matplotlib
import matplotlib.figure
import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from forge_course.data import make_imbalanced
from forge_course.reference.sampling import padding_tokens
from forge_course.sims import sampler_view as sv

matplotlib.use("Agg")

_, LABELS = make_imbalanced()  # 900 dogs (0) then 100 cats (1)


def test_sequential_batches_hold_only_dogs_until_batch_28():
    comp = sv.composition(LABELS, "sequential", 32)
    assert comp.indices == list(range(1000))
    assert comp.sizes == [32] * 31 + [8]
    assert comp.shares[:28] == [0.0] * 28
    assert comp.shares[28:] == [28 / 32, 1.0, 1.0, 1.0]
    assert comp.batches_without_minority == 28
    assert comp.minority_share == pytest.approx(0.1)


def test_random_sampler_is_a_permutation_with_a_tenth_cats():
    comp = sv.composition(LABELS, "random", 32, seed=3)
    assert sorted(comp.indices) == list(range(1000))
    assert comp.minority_share == pytest.approx(0.1)
    assert comp.distinct_seen == {0: 900, 1: 100}
    assert comp.indices != sv.composition(LABELS, "random", 32, seed=3, epoch=1).indices


def test_weighted_sampler_draws_about_half_cats_and_leaves_dogs_out():
    shares, dogs_seen = [], []
    for seed in range(10):
        comp = sv.composition(LABELS, "weighted", 32, seed=seed)
        shares.append(comp.minority_share)
        dogs_seen.append(comp.distinct_seen[0])
    # 10,000 draws at one half: the mean is 0.5 within 4 standard deviations (0.005 each).
    assert np.mean(shares) == pytest.approx(0.5, abs=0.02)
    # By hand: 900 · (1 − (1 − 1/1800)^1000) ≈ 383.7 dogs seen per epoch.
    assert np.mean(dogs_seen) == pytest.approx(383.7, abs=10)


def test_weighted_without_replacement_keeps_the_ten_percent():
    comp = sv.composition(LABELS, "weighted, no replacement", 32, seed=0)
    assert sorted(comp.indices) == list(range(1000))
    assert comp.minority_share == pytest.approx(0.1)
    assert np.mean(comp.shares[:5]) > 0.3 > np.mean(comp.shares[-10:])


def test_distributed_view_is_the_real_sampler_and_set_epoch_matters():
    for epoch in range(3):
        sampler = DistributedSampler(range(1000), num_replicas=4, rank=2, seed=5)
        sampler.set_epoch(epoch)
        shown = sv.epoch_indices(LABELS, "distributed", seed=5, epoch=epoch, world_size=4, rank=2)
        assert shown == list(sampler)
    forgot = [
        sv.epoch_indices(LABELS, "distributed", epoch=e, world_size=3, set_epoch=False)
        for e in range(3)
    ]
    assert forgot[0] == forgot[1] == forgot[2]
    assert len(sv.composition(LABELS, "distributed", 32, world_size=3).indices) == 334


def test_unknown_sampler_is_refused():
    with pytest.raises(ValueError, match="sequential"):
        sv.epoch_indices(LABELS, "bogus")


def test_engine_answers_a_view_update_quickly():
    sv.composition(LABELS, "weighted", 32, seed=1, epoch=5)  # warm-up
    samples = []
    for _ in range(9):
        start = time.perf_counter()
        sv.composition(LABELS, "weighted", 32, seed=1, epoch=5)
        lengths = [int(n) for n in torch.randint(2, 30, (164,), generator=torch.Generator())]
        sv.token_grid(lengths, sv.epoch_batches(lengths, 8, True, epoch=5))
        samples.append(time.perf_counter() - start)
    assert sorted(samples)[4] < 0.05


# --- padding ------------------------------------------------------------------------------------

LENGTHS = [5, 1, 4, 1, 3, 9, 2, 6]


def test_token_grid_by_hand():
    grid = sv.token_grid(LENGTHS, [[0, 1], [5, 3]])
    t, p = sv.TOKEN, sv.PAD
    assert grid.shape == (4, 9)
    assert grid[0].tolist() == [t] * 5 + [0] * 4
    assert grid[1].tolist() == [t] + [p] * 4 + [0] * 4
    assert grid[2].tolist() == [t] * 9
    assert grid[3].tolist() == [t] + [p] * 8
    stats = sv.padding_stats(LENGTHS, [[0, 1], [5, 3]])
    assert stats == {"tokens": 16, "padding": 12, "pad_fraction": 12 / 28}


@pytest.mark.parametrize("bucketed", [False, True])
def test_epoch_batches_cover_every_example_once_and_grid_counts_agree(bucketed):
    lengths = torch.randint(0, 30, (101,), generator=torch.Generator().manual_seed(1)).tolist()
    batches = sv.epoch_batches(lengths, 8, bucketed, seed=2, epoch=1, multiplier=3)
    assert sorted(i for b in batches for i in b) == list(range(101))
    grid = sv.token_grid(lengths, batches)
    assert int((grid == sv.PAD).sum()) == padding_tokens(lengths, batches)
    assert int((grid == sv.TOKEN).sum()) == sum(lengths)


def test_bucketing_pads_less_than_random_batches():
    lengths = torch.randint(1, 30, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    random_pad = sv.padding_stats(lengths, sv.epoch_batches(lengths, 8, False))["pad_fraction"]
    bucket_pad = sv.padding_stats(lengths, sv.epoch_batches(lengths, 8, True))["pad_fraction"]
    assert bucket_pad < random_pad / 2


def test_static_figures_draw_without_widgets():
    fig = sv.composition_figure(LABELS)
    assert len(fig.axes) == len(sv.SAMPLERS)
    assert "28 of 32 batches without one" in fig.axes[0].get_title(loc="left")
    fig = sv.padding_figure(LENGTHS * 5, batch_size=4)
    assert len(fig.axes) == 2
    fig = sv.draw_shards(10, 3)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels[::2] == ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "0", "1"]


def test_figures_redrawn_along_the_sliders_equal_ones_drawn_fresh():
    from forge_course.sims.display import LiveFigure

    labels = make_imbalanced(900, 100, seed=0)[1]
    lengths = [3, 17, 5, 40, 12, 8, 25, 9, 31, 2, 14, 22] * 4

    def composition_live():  # as sampler_view builds its figure
        live = LiveFigure((10, 3))
        picture = sv.composition_picture(live.fig, labels)
        live.moving(picture.moving_artists)
        return live, picture

    def composition_drawn(live_and_picture, sampler, batch_size, world_size):
        live, picture = live_and_picture
        comp = sv.composition(labels, sampler, batch_size, seed=0, world_size=world_size)
        picture.update(comp, sampler)
        return live.pixels()

    def padding_live():  # as padding_view builds its figure
        live = LiveFigure((10, 6))
        picture = sv.PaddingPicture(live.fig, lengths)
        live.moving(picture.moving_artists)
        return live, picture

    def padding_drawn(live_and_picture, batch_size, multiplier):
        live, picture = live_and_picture
        picture.update(sv.epoch_batches(lengths, batch_size, False),
                       sv.epoch_batches(lengths, batch_size, True, multiplier=multiplier),
                       batch_size, multiplier)  # fmt: skip
        return live.pixels()

    composition, padding = composition_live(), padding_live()
    sweep = [("random", 32, 3), ("weighted", 8, 3), ("sequential", 128, 3), ("distributed", 24, 1)]
    for sampler, batch_size, world_size in sweep:
        composition_drawn(composition, sampler, batch_size, world_size)
    for batch_size, multiplier in ((8, 5), (2, 25), (32, 1), (4, 3)):
        padding_drawn(padding, batch_size, multiplier)
    redrawn = composition_drawn(composition, "distributed", 128, 3)
    assert np.array_equal(redrawn, composition_drawn(composition_live(), "distributed", 128, 3))
    redrawn = padding_drawn(padding, 4, 3)
    assert np.array_equal(redrawn, padding_drawn(padding_live(), 4, 3))


def test_composition_bars_span_their_batches_examples_on_a_fixed_axis():
    picture = sv.CompositionPicture(matplotlib.figure.Figure().subplots(), {0: 900, 1: 100})
    picture.update(sv.composition(LABELS, "distributed", 32), "distributed")
    corners = picture.bars.get_paths()
    assert len(corners) == 11  # rank 0 of 3: 334 examples, the last batch 14
    assert corners[0].vertices[:, 0].min() == pytest.approx(0.075 * 32)
    assert corners[-1].vertices[:, 0].max() == pytest.approx(320 + 0.925 * 14)
    assert picture.ax.get_xlim() == (0, 1000)  # the data set, whatever the sampler
