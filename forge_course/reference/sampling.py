"""Which examples land in a batch, and how a batch of unequal sequences becomes one tensor.

A ``DataLoader`` asks a *sampler* for indices and hands the examples to a *collate function*.
Four small pieces replace the lines people usually copy without reading:

- `inverse_frequency_weights`: weights for ``WeightedRandomSampler`` that give every class the
  same chance per draw, so a 900-to-100 data set yields batches that are about half and half.
- `pad_collate`: a ``collate_fn`` that pads sequences to the longest in the batch and returns an
  attention mask saying which positions are real tokens.
- `shard_indices`: the indices ``DistributedSampler`` gives one rank, written out step by step.
- `LengthBucketSampler` and `padding_tokens`: batches of similar lengths, and a count of the
  padding they save compared with random batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
from torch.utils.data import Sampler

from forge_course.reference.guard import reference

__all__ = [
    "inverse_frequency_weights",
    "pad_collate",
    "shard_indices",
    "LengthBucketSampler",
    "padding_tokens",
]


def _whole(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{name}` must be a whole number, got {value!r}.")
    if value < minimum:
        raise ValueError(f"`{name}` must be at least {minimum}, got {value}.")
    return value


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> tuple[list[int], torch.Generator]:
    # A private generator seeded with seed + epoch: every process and every rerun draws the same
    # order for the same epoch, a new epoch draws a new one, and the global RNG is left alone.
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=generator).tolist() if shuffle else list(range(n))
    return order, generator


# ---------------------------------------------------------------------------------------------
# Class balance


@reference
def inverse_frequency_weights(labels: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """One weight per example, ``1 / (number of examples of its class)``, for weighted sampling.

    The weights of each class add up to 1, so every class has the same total chance on each
    draw of ``WeightedRandomSampler``. With 900 dogs and 100 cats, each cat weighs 1/100 and each
    dog 1/900: a cat is 9 times as likely as a dog, and a batch is about half cats.

    Args:
        labels: ``[N]`` integer class labels (a list, a NumPy array or a tensor).

    Returns:
        ``[N]`` float64 tensor on the CPU, where ``WeightedRandomSampler`` draws its indices.

    Raises:
        ValueError: if the labels are empty, not one-dimensional, or not integers.
    """
    labels = torch.as_tensor(labels)
    if labels.dim() != 1 or labels.numel() == 0:
        shape = list(labels.shape)
        raise ValueError(f"`labels` must be a non-empty 1-D sequence, got shape {shape}.")
    if labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"`labels` must hold integer class labels, got dtype {labels.dtype}.")
    # `inverse` maps every example to its class's position in `counts`; works for any integers.
    _, inverse, counts = torch.unique(labels.cpu(), return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse].to(torch.float64)


# ---------------------------------------------------------------------------------------------
# Padding


def _as_sequences(sequences: list[Sequence | torch.Tensor]) -> list[torch.Tensor]:
    tensors = [
        s if isinstance(s, torch.Tensor) else (torch.as_tensor(s) if len(s) else None)
        for s in sequences
    ]
    known = [t for t in tensors if t is not None]
    dtypes = {t.dtype for t in known}
    if len(dtypes) > 1:
        raise ValueError(
            f"The sequences in a batch have different dtypes {sorted(map(str, dtypes))}; "
            "token ids should share one (convert them with `.long()`)."
        )
    # An empty list has no dtype of its own: it takes the others' (int64 token ids if all empty).
    dtype = dtypes.pop() if dtypes else torch.long
    device = known[0].device if known else torch.device("cpu")
    tensors = [torch.empty(0, dtype=dtype, device=device) if t is None else t for t in tensors]
    for i, t in enumerate(tensors):
        if t.dim() != 1:
            raise ValueError(f"Sequence {i} of the batch has shape {list(t.shape)}, expected 1-D.")
    return tensors


@reference
def pad_collate(
    batch: list[tuple[Sequence[int] | torch.Tensor, int | torch.Tensor]], pad_value: int = 0
) -> dict[str, torch.Tensor]:
    """Pad a batch of variable-length sequences into one tensor, with a mask of the real tokens.

    ``torch.stack`` needs equal shapes, so the default ``collate_fn`` fails on sequences of
    different lengths. Padding every sequence to the longest *in this batch* (not in the data
    set) keeps the wasted positions few; the mask lets the model and the loss ignore them.

    Args:
        batch: ``B`` pairs ``(sequence, label)``; a sequence is a list or a 1-D tensor of token
            ids and may be empty.
        pad_value: the id written into padding positions (0 is ``<pad>`` in
            `forge_course.data.synthetic.build_vocabulary`).

    Returns:
        ``input_ids``: ``[B, L]`` with ``L`` the longest sequence's length (0 if all are empty),
        in the sequences' dtype; ``attention_mask``: ``[B, L]`` ``torch.long``, 1 on real tokens
        and 0 on padding (the convention of Hugging Face models; ``.bool()`` gives a mask for
        ``masked_fill``); ``labels``: ``[B]``.

    Raises:
        ValueError: if the batch is empty, a sequence is not 1-D, or the sequences' dtypes differ.
    """
    if len(batch) == 0:
        raise ValueError("`batch` is empty: a DataLoader never collates an empty batch.")
    sequences = _as_sequences([sequence for sequence, _ in batch])
    longest = max(len(s) for s in sequences)

    input_ids = sequences[0].new_full((len(sequences), longest), pad_value)
    attention_mask = torch.zeros(
        (len(sequences), longest), dtype=torch.long, device=input_ids.device
    )
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = sequence
        attention_mask[row, : len(sequence)] = 1
    labels = torch.stack([torch.as_tensor(label) for _, label in batch])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


# ---------------------------------------------------------------------------------------------
# Sharding across processes


@reference
def shard_indices(
    dataset_size: int,
    rank: int,
    world_size: int,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
) -> list[int]:
    """The indices one rank of a distributed run reads in an epoch, as ``DistributedSampler`` does.

    Every rank draws the same order (same seed and epoch, so no communication is needed), then
    takes every ``world_size``-th index starting at its ``rank``. To give each rank the same
    count, the order is first padded by wrapping around to its start: some examples are read
    twice (10 examples on 3 ranks, no shuffle: rank 1 reads ``[1, 4, 7, 0]``), which slightly
    skews a distributed evaluation. With ``drop_last`` the tail is cut instead.

    Args:
        dataset_size: ``N``, the number of examples.
        rank: this process's number, ``0 <= rank < world_size``.
        world_size: the number of processes sharing the data.
        shuffle: draw a new random order each epoch instead of ``0 .. N-1``.
        seed: base seed, the same on every rank.
        epoch: the epoch, as passed to ``sampler.set_epoch(epoch)``; without it every epoch
            repeats the first epoch's order.
        drop_last: cut the order to a multiple of ``world_size`` instead of padding it.

    Returns:
        ``ceil(N / world_size)`` indices (``N // world_size`` with ``drop_last``).

    Raises:
        ValueError: if a count is not a whole number or ``rank`` is outside ``[0, world_size)``.
    """
    n = _whole("dataset_size", dataset_size, 0)
    world_size = _whole("world_size", world_size, 1)
    rank = _whole("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"`rank` must be in [0, {world_size}) for this world_size, got {rank}.")

    order, _ = _epoch_order(n, shuffle, seed, epoch)
    per_rank = n // world_size if drop_last else _ceil_div(n, world_size)
    # Index i of the padded order is i mod N of the original: the wrap-around. With drop_last
    # the total is at most N, so this just keeps the head.
    total = per_rank * world_size
    padded = [order[i % n] for i in range(total)]
    return padded[rank:total:world_size]


# ---------------------------------------------------------------------------------------------
# Length bucketing


@reference
class LengthBucketSampler(Sampler[list[int]]):
    """Batches of indices of similar sequence lengths, for ``DataLoader(batch_sampler=...)``.

    Random batches mix short and long sequences, and every short one is padded to the long one.
    Sorting the whole data set by length would remove the padding but also the randomness. This
    sampler sits in between: each epoch it shuffles the indices, cuts them into chunks of
    ``batch_size * bucket_size_multiplier``, sorts each chunk by length, cuts the chunk into
    batches, and shuffles the order of all batches. Every index appears exactly once per epoch.

    A larger multiplier saves more padding and makes batches less random; with a multiplier of 1
    the batches hold the same examples as plain random batches.

    Args:
        lengths: ``[N]`` sequence lengths in tokens, one per example.
        batch_size: examples per batch; only the epoch's last chunk can leave a shorter batch.
        shuffle: draw a new order each epoch (seeded by ``seed + epoch``); if False, chunks
            follow the data set's order and batches come in chunk order.
        seed: base seed of the shuffles.
        bucket_size_multiplier: batches per chunk that is sorted by length.
    """

    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        bucket_size_multiplier: int = 100,
    ) -> None:
        super().__init__()
        self.lengths = [int(length) for length in lengths]
        if any(length < 0 for length in self.lengths):
            raise ValueError("`lengths` must be counts of tokens, 0 or more.")
        self.batch_size = _whole("batch_size", batch_size, 1)
        self.bucket_size_multiplier = _whole("bucket_size_multiplier", bucket_size_multiplier, 1)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration draws (call it before each epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        # Chunks are whole multiples of batch_size, so only the last chunk has a short batch.
        return _ceil_div(len(self.lengths), self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        order, generator = _epoch_order(len(self.lengths), self.shuffle, self.seed, self.epoch)
        size = self.batch_size
        chunk = size * self.bucket_size_multiplier
        batches: list[list[int]] = []
        for start in range(0, len(order), chunk):
            by_length = sorted(order[start : start + chunk], key=self.lengths.__getitem__)
            batches += [by_length[i : i + size] for i in range(0, len(by_length), size)]
        if self.shuffle:
            # Without this each chunk's batches would arrive shortest first, every epoch.
            shuffled = torch.randperm(len(batches), generator=generator).tolist()
            batches = [batches[i] for i in shuffled]
        return iter(batches)


@reference
def padding_tokens(lengths: Sequence[int] | torch.Tensor, batches: Iterable[Sequence[int]]) -> int:
    """Count the padding positions that `pad_collate` would add to these batches.

    Each batch is padded to its longest sequence, so it wastes ``len(batch) * longest - sum of
    lengths`` positions. Compare a ``LengthBucketSampler`` with random batches (for example a
    ``BatchSampler(RandomSampler(...))``) to see what bucketing saves.

    Args:
        lengths: ``[N]`` sequence lengths in tokens.
        batches: lists of indices into ``lengths``, such as a batch sampler yields.

    Returns:
        The number of padding positions over all batches.
    """
    lengths = [int(length) for length in lengths]
    total = 0
    for batch in batches:
        sizes = [lengths[int(i)] for i in batch]
        if sizes:
            total += len(sizes) * max(sizes) - sum(sizes)
    return total
