"""Which examples land in each batch, and how much of a padded batch is padding.

Two engines, both pure functions over torch's real samplers (nothing is re-implemented here, so
the pictures show what a ``DataLoader`` would do):

- `composition`: one epoch of a sampler on a labelled data set (sequential, random, weighted
  with or without replacement, or one rank of a distributed run) and the share of the minority
  class in every batch.
- `epoch_batches` and `token_grid`: one epoch of batches of variable-length sequences, random
  or bucketed by length, and each batch as a grid of real tokens and padding.

`draw_composition`, `draw_padding` and `draw_shards` draw them; `sampler_view` and
`padding_view` wire them to widgets, each keeping one picture (`CompositionPicture`,
`PaddingPicture`) whose axes are drawn once and whose data an event updates. Tests drive the
engines; the browser test checks the views.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import LineCollection, PolyCollection
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    WeightedRandomSampler,
)

from forge_course.reference.sampling import (
    LengthBucketSampler,
    inverse_frequency_weights,
    padding_tokens,
)
from forge_course.sims.display import PALETTE, LiveFigure, show

SAMPLERS = ("sequential", "random", "weighted", "weighted, no replacement", "distributed")

# ------------------------------------------------------------------------- batch composition


def epoch_indices(
    labels: Sequence[int] | torch.Tensor,
    sampler: str,
    *,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 3,
    rank: int = 0,
    set_epoch: bool = True,
) -> list[int]:
    """The indices one epoch of ``sampler`` yields, in order.

    Args:
        labels: ``[N]`` class labels; the weighted samplers use inverse-frequency weights.
        sampler: one of `SAMPLERS`.
        seed: seed of the sampler's generator (or ``DistributedSampler(seed=...)``).
        epoch: which epoch, counting from 0. Random and weighted samplers own one generator
            that advances every epoch, as in a ``DataLoader(..., generator=g)``;
            ``DistributedSampler`` reseeds with ``seed + epoch`` and learns the epoch from
            ``set_epoch``.
        world_size, rank: the distributed run, for ``"distributed"``.
        set_epoch: whether the loop calls ``sampler.set_epoch(epoch)`` (``"distributed"``).
    """
    n = len(labels)
    if sampler == "sequential":
        return list(SequentialSampler(range(n)))
    if sampler == "distributed":
        shards = DistributedSampler(range(n), num_replicas=world_size, rank=rank, seed=seed)
        if set_epoch:
            shards.set_epoch(epoch)
        return list(shards)
    generator = torch.Generator().manual_seed(seed)
    if sampler == "random":
        chosen = RandomSampler(range(n), generator=generator)
    elif sampler in ("weighted", "weighted, no replacement"):
        weights = inverse_frequency_weights(labels)
        replacement = sampler == "weighted"
        chosen = WeightedRandomSampler(weights, n, replacement=replacement, generator=generator)
    else:
        raise ValueError(f"Unknown sampler {sampler!r}; choose one of {SAMPLERS}.")
    for _ in range(epoch):  # earlier epochs advance the shared generator
        list(chosen)
    return list(chosen)


@dataclass(frozen=True)
class Composition:
    """One epoch of a sampler, seen through the labels of the examples it picked."""

    indices: list[int]
    shares: list[float]  # share of the minority class in each batch, in order
    sizes: list[int]  # examples in each batch (the last one may be short)
    minority_share: float  # over the whole epoch
    batches_without_minority: int
    distinct_seen: dict[int, int]  # class -> distinct examples of it drawn this epoch
    class_sizes: dict[int, int]  # class -> examples of it in the data set


def composition(
    labels: Sequence[int] | torch.Tensor, sampler: str, batch_size: int = 32, **options
) -> Composition:
    """Batch by batch, how much of the minority class an epoch of ``sampler`` holds.

    ``options`` go to `epoch_indices`. The minority class is the least frequent label.
    """
    labels = torch.as_tensor(labels)
    classes, counts = torch.unique(labels, return_counts=True)
    minority = int(classes[counts.argmin()])
    indices = epoch_indices(labels, sampler, **options)
    drawn = torch.tensor(indices, dtype=torch.long)
    picked = labels[drawn]
    batches = torch.split(picked, batch_size)
    shares = [float((b == minority).double().mean()) for b in batches]
    seen = labels[torch.unique(drawn)]  # each drawn example once, however often it was drawn
    return Composition(
        indices=indices,
        shares=shares,
        sizes=[len(b) for b in batches],
        minority_share=float((picked == minority).double().mean()) if len(picked) else 0.0,
        batches_without_minority=sum(1 for b in batches if not bool((b == minority).any())),
        distinct_seen={int(c): int((seen == c).sum()) for c in classes},
        class_sizes={int(c): int(k) for c, k in zip(classes, counts)},
    )


def _rectangles(left, right, bottom, top) -> np.ndarray:
    """Rectangles as ``[n, 4, 2]`` corners, for a ``PolyCollection``: each argument an array
    of n, or one number for all."""
    left, right, bottom, top = np.broadcast_arrays(left, right, bottom, top)
    xs = np.stack([left, left, right, right], axis=1)
    return np.stack([xs, np.stack([bottom, top, top, bottom], axis=1)], axis=-1)


class CompositionPicture:
    """`draw_composition`'s axes, made once for a data set: an epoch changes only the bars and
    the title.

    The x axis counts examples, one bar per batch as wide as the batch, so its range (the data
    set) holds for every sampler, batch size and rank: a live view draws the axes once and a
    rank's shorter epoch looks shorter.
    """

    def __init__(self, ax, class_sizes: dict[int, int], names=("dogs", "cats")) -> None:
        self.ax, self.names = ax, names
        total = sum(class_sizes.values())
        self.bars = PolyCollection([], facecolors=PALETTE["orange"], edgecolors="none")
        ax.add_collection(self.bars, autolim=False)
        data_share = min(class_sizes.values()) / total
        self.lines = [
            ax.axhline(data_share, color=PALETTE["black"], ls="--", lw=1,
                       label="share in the data"),
            ax.axhline(0.5, color=PALETTE["blue"], ls=":", lw=1.2, label="one half"),
        ]  # fmt: skip
        ax.set(ylim=(0, 1), xlim=(0, total))
        ax.set_ylabel(f"share of {names[1]} in the batch")
        self.title = ax.set_title(" ", fontsize=9, loc="left")

    def moving_artists(self) -> list:
        """What `update` changes, then what a full draw puts over the bars; everything else
        stays as first drawn."""
        return [self.bars, *self.lines, *self.ax.spines.values(), self.title]

    def update(self, comp: Composition, title: str) -> None:
        """Bars of ``comp``'s epoch: each batch's minority share, over the examples it holds."""
        sizes = np.asarray(comp.sizes, dtype=float)
        starts = np.cumsum(sizes) - sizes
        self.bars.set_verts(
            _rectangles(starts + 0.075 * sizes, starts + 0.925 * sizes, 0.0, comp.shares)
        )
        minority = min(comp.class_sizes, key=comp.class_sizes.get)
        majority = max(comp.class_sizes, key=comp.class_sizes.get)
        names = self.names
        self.title.set_text(
            f"{title}: {comp.minority_share:.0%} {names[1]} over the epoch, "
            f"{comp.batches_without_minority} of {len(comp.shares)} batches without one, "
            f"{comp.distinct_seen[minority]}/{comp.class_sizes[minority]} {names[1]} and "
            f"{comp.distinct_seen[majority]}/{comp.class_sizes[majority]} {names[0]} seen"
        )


def draw_composition(comp: Composition, ax, title: str, names=("dogs", "cats")) -> None:
    """Bars: the minority share of each batch; lines: the data set's share and one half."""
    ax.clear()
    CompositionPicture(ax, comp.class_sizes, names).update(comp, title)


def composition_figure(labels, batch_size: int = 32, seed: int = 0, names=("dogs", "cats")):
    """Every sampler's first epoch, one row each (the view's picture without widgets)."""
    comps = [composition(labels, sampler, batch_size, seed=seed) for sampler in SAMPLERS]
    fig, axes = plt.subplots(len(SAMPLERS), 1, figsize=(10, 9), sharex=True, sharey=True)
    for ax, sampler, comp in zip(axes, SAMPLERS, comps):
        label = "distributed (rank 0 of 3)" if sampler == "distributed" else sampler
        draw_composition(comp, ax, label, names)
        if ax is not axes[len(axes) // 2]:
            ax.set_ylabel("")  # one label for the shared y axis: a row is shorter than it
    axes[0].legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel(f"examples into the epoch, one bar per batch of {batch_size}")
    fig.suptitle("Share of the rare class in each batch of one epoch, per sampler", y=1.0)
    fig.tight_layout()
    return fig


def composition_picture(fig, labels, names=("dogs", "cats")) -> CompositionPicture:
    """`sampler_view`'s picture of ``labels`` on a 10 × 3 inch ``fig``, laid out once, by
    margins that fit its labels (a layout engine would measure the figure at every draw)."""
    class_sizes = composition(labels, "sequential").class_sizes  # the data set's, as any sampler
    width, height = fig.get_size_inches()
    ax = fig.subplots()
    fig.subplots_adjust(left=0.7 / width, right=1 - 0.3 / width, bottom=0.6 / height,
                        top=1 - 0.35 / height)  # fmt: skip
    ax.set_xlabel("examples into the epoch, one bar per batch")
    return CompositionPicture(ax, class_sizes, names)


def sampler_view(labels, batch_size: int = 32, seed: int = 0, names=("dogs", "cats")) -> None:
    """Pick a sampler, a batch size, a seed and an epoch; see every batch's minority share."""
    import ipywidgets as widgets

    sampler = widgets.Dropdown(options=SAMPLERS, value="random", description="sampler")
    size = widgets.IntSlider(batch_size, 8, 128, 8, description="batch size")
    seed_box = widgets.BoundedIntText(seed, 0, 10_000, description="seed")
    epoch = widgets.IntSlider(0, 0, 5, description="epoch")
    world = widgets.IntSlider(3, 1, 8, description="world size")
    rank = widgets.IntSlider(0, 0, 2, description="rank")
    call_set_epoch = widgets.Checkbox(True, description="call set_epoch(epoch)")
    live = LiveFigure((10, 3))
    picture = composition_picture(live.fig, labels, names)
    live.moving(picture.moving_artists)

    def redraw(*_):
        rank.max = world.value - 1
        for w in (world, rank, call_set_epoch):
            w.disabled = sampler.value != "distributed"
        comp = composition(
            labels, sampler.value, size.value, seed=seed_box.value, epoch=epoch.value,
            world_size=world.value, rank=rank.value, set_epoch=call_set_epoch.value,
        )  # fmt: skip
        title = f"{sampler.value}, epoch {epoch.value}"
        if sampler.value == "distributed":
            title += f", rank {rank.value} of {world.value}"
        picture.update(comp, title)
        live.refresh()

    for w in (sampler, size, seed_box, epoch, world, rank, call_set_epoch):
        w.observe(redraw, "value")
    redraw()
    controls = widgets.VBox(
        [widgets.HBox([sampler, size, seed_box]), widgets.HBox([epoch, world, rank]),
         call_set_epoch]
    )  # fmt: skip
    show(widgets.VBox([controls, live.image]), composition_figure(labels, batch_size, seed, names))


# ------------------------------------------------------------------------- distributed shards


def draw_shards(dataset_size: int, world_size: int, ax=None):
    """The padded order of ``DistributedSampler(shuffle=False)``, each slot coloured by its rank.

    Hatched slots are the padding: indices from the start of the order, read a second time.
    """
    if ax is None:
        fig, ax = plt.subplots(figsize=(0.8 * dataset_size + 1.5, 1.6))
    else:
        fig = ax.figure
    per_rank = -(-dataset_size // world_size)
    colours = [PALETTE[c] for c in ("blue", "orange", "green", "purple", "sky", "yellow")]
    for position in range(per_rank * world_size):
        rank = position % world_size
        padding = position >= dataset_size
        ax.add_patch(
            plt.Rectangle(
                (position, 0), 0.92, 1, color=colours[rank % len(colours)],
                hatch="///" if padding else None, ec=PALETTE["black"], alpha=0.85,
            )
        )  # fmt: skip
        ax.text(position + 0.46, 0.5, str(position % dataset_size), ha="center", va="center")
        ax.text(position + 0.46, -0.35, f"r{rank}", ha="center", va="center", fontsize=8)
    ax.set(xlim=(-0.2, per_rank * world_size + 0.2), ylim=(-0.7, 1.2))
    ax.axis("off")
    ax.set_title(
        f"DistributedSampler, N={dataset_size}, {world_size} ranks, no shuffle: the order "
        f"padded to {per_rank * world_size}; slot i goes to rank i mod {world_size} "
        "(hatched: read twice)",
        fontsize=9,
    )
    return fig


# ------------------------------------------------------------------------- padding


def epoch_batches(
    lengths: Sequence[int],
    batch_size: int,
    bucketed: bool,
    *,
    seed: int = 0,
    epoch: int = 0,
    multiplier: int = 5,
) -> list[list[int]]:
    """One epoch of batches of indices: random (``BatchSampler(RandomSampler)``) or bucketed.

    Bucketed batches come from `LengthBucketSampler` with ``bucket_size_multiplier=multiplier``.
    """
    if bucketed:
        buckets = LengthBucketSampler(
            lengths, batch_size, seed=seed, bucket_size_multiplier=multiplier
        )
        buckets.set_epoch(epoch)
        return list(buckets)
    generator = torch.Generator().manual_seed(seed)
    shuffled = RandomSampler(range(len(lengths)), generator=generator)
    batches = BatchSampler(shuffled, batch_size, drop_last=False)
    for _ in range(epoch):
        list(batches)
    return list(batches)


TOKEN, PAD = 1, 2  # codes in `token_grid`; 0 is outside the batch's width


def token_grid(lengths: Sequence[int], batches: list[list[int]]) -> np.ndarray:
    """Every example of the epoch as a row: ``TOKEN`` on its tokens, ``PAD`` where padded.

    Rows follow the batches' order; columns are positions up to the longest sequence. Each
    batch is padded to its own longest sequence, so positions past it stay 0.
    """
    rows = sum(len(b) for b in batches)
    grid = np.zeros((rows, max(lengths, default=0)), dtype=np.int8)
    row = 0
    for batch in batches:
        width = max((lengths[i] for i in batch), default=0)
        for i in batch:
            grid[row, :width] = PAD
            grid[row, : lengths[i]] = TOKEN
            row += 1
    return grid


def padding_stats(lengths: Sequence[int], batches: list[list[int]]) -> dict[str, float]:
    """Real tokens, padding positions, and the share of all positions that is padding."""
    tokens = sum(lengths[i] for batch in batches for i in batch)
    pad = padding_tokens(lengths, batches)
    return {
        "tokens": tokens,
        "padding": pad,
        "pad_fraction": pad / (tokens + pad) if tokens + pad else 0.0,
    }


def _staircase(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The outline of rows ``i`` (from ``i - 0.5`` to ``i + 0.5`` in y), each filled from
    ``left[i]`` to ``right[i]`` in x: down the right ends, back up the left ones."""
    top = np.arange(len(left)) - 0.5
    down = np.stack([right.repeat(2), np.stack([top, top + 1], axis=1).ravel()], axis=1)
    up = np.stack([left.repeat(2), np.stack([top, top + 1], axis=1).ravel()], axis=1)[::-1]
    return np.concatenate([down, up])


class PaddingPanel:
    """`draw_padding`'s axes, made once for the reviews' ``lengths``: an epoch changes the fill
    of the rows, the lines between batches and the title, never the axes (a row per example, a
    column per position up to the longest)."""

    def __init__(self, ax, lengths: Sequence[int]) -> None:
        self.ax, self.lengths = ax, lengths
        # The grid's tokens and its padding as one polygon each, a staircase whose steps are
        # the rows: a millisecond to draw, where an image of the grid takes fifteen to resample
        # and a bar per row as long to build. Aliased, so that they meet without a seam, as the
        # grid's cells do.
        self.rows = PolyCollection([], facecolors=[PALETTE["blue"], PALETTE["orange"]],
                                   edgecolors="none", antialiaseds=False)  # fmt: skip
        ax.add_collection(self.rows, autolim=False)
        # Across the axes whatever its x range, at a y in rows, as axhline draws.
        self.edges = LineCollection([], colors=PALETTE["black"], lw=0.6,
                                    transform=ax.get_yaxis_transform())  # fmt: skip
        ax.add_collection(self.edges, autolim=False)
        ax.set(xlim=(-0.5, max(lengths, default=0) - 0.5), ylim=(len(lengths) - 0.5, -0.5))
        ax.set_xlabel("position in the padded batch (tokens)")
        self.title = ax.set_title(" \n ", fontsize=10)

    def moving_artists(self) -> list:
        """What `update` changes, then the spines, which a full draw puts over the rows;
        everything else stays as first drawn."""
        return [self.rows, self.edges, *self.ax.spines.values(), self.title]

    def update(self, batches: list[list[int]], title: str) -> None:
        stats = padding_stats(self.lengths, batches)
        grid = token_grid(self.lengths, batches)
        tokens, widths = (grid == TOKEN).sum(axis=1) - 0.5, (grid != 0).sum(axis=1) - 0.5
        self.rows.set_verts([_staircase(np.full(len(grid), -0.5), tokens),
                             _staircase(tokens, widths)])  # fmt: skip
        edges = np.cumsum([len(batch) for batch in batches[:-1]]) - 0.5
        self.edges.set_segments([[(0, edge), (1, edge)] for edge in edges])
        self.title.set_text(
            f"{title}\n{stats['padding']:,} padding positions = {stats['pad_fraction']:.0%} of "
            f"{stats['tokens'] + stats['padding']:,}"
        )


def draw_padding(lengths, batches, ax, title: str) -> None:
    """The epoch's batches as grids: blue tokens, orange padding, a line between batches."""
    ax.clear()
    PaddingPanel(ax, lengths).update(batches, title)
    ax.set_ylabel("example, batch after batch")


class PaddingPicture:
    """`padding_view`'s two panels on a 10 × 6 inch ``fig``, random batches (left) and bucketed
    ones (right), laid out once by margins that fit their labels."""

    def __init__(self, fig, lengths: Sequence[int]) -> None:
        width, height = fig.get_size_inches()
        left_ax, right_ax = fig.subplots(1, 2, sharey=True)
        fig.subplots_adjust(left=0.75 / width, right=1 - 0.15 / width, bottom=0.6 / height,
                            top=1 - 0.9 / height, wspace=0.05)  # fmt: skip
        self.panels = (PaddingPanel(left_ax, lengths), PaddingPanel(right_ax, lengths))
        left_ax.set_ylabel("example, batch after batch")
        fig.suptitle("One epoch of the reviews: real tokens (blue) and padding (orange)")

    def moving_artists(self) -> list:
        return [artist for panel in self.panels for artist in panel.moving_artists()]

    def update(self, random_batches, bucketed, batch_size: int, multiplier: int) -> None:
        """Both epochs, titled with the batch size and the multiplier they were drawn with."""
        self.panels[0].update(random_batches, f"random batches of {batch_size}")
        self.panels[1].update(bucketed, f"bucketed by length (multiplier {multiplier})")


def padding_figure(lengths, batch_size: int = 8, multiplier: int = 5, seed: int = 0):
    """Random and bucketed batches of one epoch, side by side (the view without widgets)."""
    fig = plt.figure(figsize=(10, 6))
    PaddingPicture(fig, lengths).update(
        epoch_batches(lengths, batch_size, False, seed=seed),
        epoch_batches(lengths, batch_size, True, seed=seed, multiplier=multiplier),
        batch_size,
        multiplier,
    )
    return fig


def padding_view(lengths, batch_size: int = 8, multiplier: int = 5, seed: int = 0) -> None:
    """Sliders for the batch size, the bucket multiplier, the seed and the epoch."""
    import ipywidgets as widgets

    size = widgets.IntSlider(batch_size, 2, 32, description="batch size")
    mult = widgets.IntSlider(multiplier, 1, 25, description="multiplier")
    seed_box = widgets.BoundedIntText(seed, 0, 10_000, description="seed")
    epoch = widgets.IntSlider(0, 0, 5, description="epoch")
    live = LiveFigure((10, 6))
    picture = PaddingPicture(live.fig, lengths)
    live.moving(picture.moving_artists)

    def redraw(*_):
        options = {"seed": seed_box.value, "epoch": epoch.value}
        random_batches = epoch_batches(lengths, size.value, False, **options)
        bucketed = epoch_batches(lengths, size.value, True, multiplier=mult.value, **options)
        picture.update(random_batches, bucketed, size.value, mult.value)
        live.refresh()

    for w in (size, mult, seed_box, epoch):
        w.observe(redraw, "value")
    redraw()
    controls = widgets.HBox([size, mult, seed_box, epoch])
    show(
        widgets.VBox([controls, live.image]), padding_figure(lengths, batch_size, multiplier, seed)
    )
