"""The pipeline engine against real DataLoaders: batches, workers, request order, worker seeds."""

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from forge_course.reference.datasets import TracedDataset
from forge_course.sims.pipeline import (
    MAIN_PROCESS,
    PlanPicture,
    draw_plan,
    pipeline_view,
    plan_epoch,
    summary,
)

matplotlib.use("Agg")


class _Logged:
    """A batch sampler that records when the DataLoader asks it for each batch."""

    def __init__(self, inner, log):
        self.inner, self.log = inner, log

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        for k, batch in enumerate(self.inner):
            self.log.append(("request", k))
            yield batch


class _Seeds(TracedDataset):
    def __getitem__(self, index):
        info = torch.utils.data.get_worker_info()
        return index, info.id if info else MAIN_PROCESS, info.seed if info else -1


def run_loader(n, batch_size, shuffle, drop_last, workers, seed, epoch, prefetch_factor=2):
    """What a real DataLoader does in its ``epoch``-th epoch, in the engine's terms."""
    generator = torch.Generator().manual_seed(seed)
    dataset, log = _Seeds(n), []
    sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
    extra = {"prefetch_factor": prefetch_factor} if workers else {}
    loader = DataLoader(dataset, batch_sampler=_Logged(BatchSampler(sampler, batch_size, drop_last),
                        log), num_workers=workers, generator=generator, **extra)  # fmt: skip
    for _ in range(epoch + 1):
        log.clear()
        batches, owners, seeds = [], [], set()
        iterator = iter(loader)
        log.append(("started",))
        for k, (indices, who, seed_of_worker) in enumerate(iterator):
            batches.append(indices.tolist())
            assert len(set(who.tolist())) == 1, "one worker builds a whole batch"
            owners.append(who[0].item())
            seeds |= {(w, s) for w, s in zip(who.tolist(), seed_of_worker.tolist())}
            log.append(("handed over", k))
    requested_with, started, handed = [], False, -1
    for event in log:
        if event[0] == "started":
            started = True
        elif event[0] == "handed over":
            handed = event[1]
        else:
            requested_with.append(handed + 1 if started else None)
    return batches, owners, requested_with, seeds


CONFIGS = [
    # n, batch size, shuffle, drop_last, workers, seed, epoch
    (100, 16, True, False, 2, 0, 0),
    (100, 16, True, True, 2, 0, 1),
    (
        30,
        4,
        False,
        False,
        3,
        5,
        0,
    ),  # three workers on two cores: torch warns, the test does not care
    (17, 5, True, True, 2, 3, 2),
    (20, 20, True, False, 2, 1, 0),
    (20, 3, True, False, 0, 1, 2),
]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("config", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_the_engine_matches_a_real_dataloader(config):
    n, size, shuffle, drop_last, workers, seed, epoch = config
    plan = plan_epoch(n, size, shuffle, drop_last, workers, seed, epoch)
    batches, owners, requested_with, seeds = run_loader(*config)
    assert plan.batches == batches
    assert plan.workers == owners
    assert plan.requested_with == requested_with
    if workers:
        assert seeds == {(w, plan.base_seed + w) for w in range(min(workers, len(batches)))}


@pytest.mark.parametrize("factor", [1, 3])
def test_prefetch_factor_sets_how_far_ahead_batches_are_requested(factor):
    plan = plan_epoch(40, 4, num_workers=2, prefetch_factor=factor)
    assert plan.requested_with == run_loader(40, 4, False, False, 2, 0, 0, factor)[2]
    assert plan.requested_with[: 2 * factor] == [None] * (2 * factor)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 200),
    size=st.integers(1, 40),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 2),
)
def test_without_workers_the_engine_matches_a_dataloader_on_any_config(
    n, size, shuffle, drop_last, seed, epoch
):
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(range(n), batch_size=size, shuffle=shuffle, drop_last=drop_last,
                        generator=generator)  # fmt: skip
    for _ in range(epoch + 1):
        batches = [b.tolist() for b in loader]
    plan = plan_epoch(n, size, shuffle, drop_last, seed=seed, epoch=epoch)
    assert plan.batches == batches
    assert sorted(plan.unseen + [i for b in batches for i in b]) == list(range(n))


def test_the_facts_hand_calculation():
    plan = plan_epoch(100, 16)
    assert [len(b) for b in plan.batches] == [16] * 6 + [4] and plan.unseen == []
    dropped = plan_epoch(100, 16, drop_last=True)
    assert len(dropped.batches) == 6 and dropped.unseen == [96, 97, 98, 99]
    assert summary(plan) == "7 batches (6 of 16, last of 4), 0 examples unseen"
    assert summary(dropped) == "6 batches of 16, 4 examples unseen"
    assert plan_epoch(100, 16, num_workers=2).workers == [0, 1, 0, 1, 0, 1, 0]


@pytest.mark.parametrize("bad", [{"n": 0}, {"batch_size": 0}, {"num_workers": -1},
                                 {"batch_size": 2.0}, {"prefetch_factor": 0}])  # fmt: skip
def test_bad_settings_are_named(bad):
    settings_ = {"n": 10, "batch_size": 3, **bad}
    with pytest.raises(ValueError, match=f"`{next(iter(bad))}`"):
        plan_epoch(**settings_)


def test_drawing_shows_every_batch_and_the_unseen_tail():
    plan = plan_epoch(100, 16, shuffle=True, drop_last=True, num_workers=2)
    fig = plt.figure()
    picture = PlanPicture(fig)
    picture.update(plan)
    texts = picture.texts()  # the batches' texts are drawn as outlines, not Text artists
    assert "unseen this epoch" in texts
    assert sum(t.startswith("batch ") for t in texts) == 6
    assert fig.get_suptitle().startswith("Epoch 0: 6 batches of 16, 4 examples unseen")
    shown = sorted(int(t) for t in texts if t.isdigit())
    assert shown == list(range(100)), "every index is drawn exactly once"
    plt.close(fig)


def test_the_view_builds_its_widgets_and_fallback(capsys):
    pipeline_view(n=20, batch_size=4, num_workers=0)
    shown = capsys.readouterr().out
    assert "application/vnd.jupyter.widget-view+json" in shown and "image/png" in shown


def test_a_figure_redrawn_along_the_sliders_equals_one_drawn_fresh():
    import numpy as np

    from forge_course.sims.display import LiveFigure

    live = LiveFigure((11, 1.5))
    picture = PlanPicture(live.fig)  # as the view keeps it
    live.moving(picture.moving_artists)
    # Figures of new sizes and cells, and (the last three) of one size, drawn over a background.
    for n, batch_size, workers in ((100, 16, 2), (30, 4, 0), (100, 32, 4), (50, 8, 3),
                                   (50, 8, 0), (50, 8, 1)):  # fmt: skip
        picture.update(plan_epoch(n, batch_size, shuffle=True, num_workers=workers))
        live.pixels()
    fresh = LiveFigure((11, 1.5))
    draw_plan(plan_epoch(50, 8, shuffle=True, num_workers=1), fresh.fig)
    assert np.array_equal(live.pixels(), fresh.pixels())
