"""Training arithmetic: how many batches, steps and updates a run takes, worked out before it runs.

Every training loop is two nested counts. The inner one walks a ``DataLoader``: ``N`` examples in
batches of ``B`` give ``ceil(N / B)`` iterations, and the last batch holds whatever is left over
(``N - (iterations - 1)·B`` examples), unless ``drop_last=True`` throws that partial batch away.
The outer one repeats the walk once per epoch.

Gradient accumulation adds a third count. The loop runs ``backward`` on ``K`` micro-batches,
then makes one optimizer update, so one update sees ``B·K`` examples (the *effective* batch).
An epoch of ``I`` micro-batches then gives ``ceil(I / K)`` updates, but only if the loop also
updates on the last, shorter group of micro-batches. The common loop
``if (i + 1) % K == 0: optimizer.step()`` makes ``I // K`` updates and leaves the tail's
gradients in ``.grad``, where they leak into the first update of the next epoch. The numbers
here are those of the correct loop.

A handy check: ``ceil(ceil(N / B) / K) == ceil(N / (B·K))`` for positive integers, so without
``drop_last`` the updates per epoch are simply ``ceil(N / (B·K))``.
"""

from __future__ import annotations

from forge_course.reference.guard import reference

__all__ = ["training_arithmetic"]


def _positive_int(name: str, value: object) -> int:
    # bool is a subclass of int, but `batch_size=True` is a mistake, not a batch of one.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{name}` must be a whole number, got {value!r}.")
    if value < 1:
        raise ValueError(f"`{name}` must be at least 1, got {value}.")
    return value


def _ceil_div(a: int, b: int) -> int:
    # Integer ceiling: `math.ceil(a / b)` goes through a float and can be off for huge counts.
    return -(-a // b)


@reference
def training_arithmetic(
    dataset_size: int,
    batch_size: int,
    epochs: int,
    accum_steps: int = 1,
    drop_last: bool = False,
) -> dict[str, int]:
    """Count the iterations, updates and examples of a training run, as a ``DataLoader`` would.

    Args:
        dataset_size: ``N``, the number of examples in the data set.
        batch_size: ``B``, examples per micro-batch (the ``DataLoader``'s ``batch_size``).
        epochs: passes over the data set.
        accum_steps: ``K``, micro-batches whose gradients add up before one optimizer update.
        drop_last: as in ``DataLoader``: drop the last batch if it holds fewer than ``B`` examples.

    Returns:
        A dict of whole numbers:

        - ``iters_per_epoch``: micro-batches per epoch (``len(loader)``).
        - ``last_batch_size``: examples in the last batch of an epoch (0 if there is no batch).
        - ``micro_steps``: micro-batches (forward and backward passes) over all epochs.
        - ``updates_per_epoch``: optimizer updates per epoch, counting the update on the last,
          possibly partial group of micro-batches.
        - ``total_updates``: optimizer updates over all epochs.
        - ``effective_batch_size``: ``B·K``, the examples behind one full update (the last update
          of an epoch may see fewer).
        - ``examples_seen``: example passes over all epochs; with ``drop_last`` the dropped
          examples are not seen.

    Raises:
        ValueError: if a count is not a whole number of at least 1, or ``drop_last`` is not a bool.

    Example:
        >>> training_arithmetic(10_000, 32, 3)["iters_per_epoch"]
        313
    """
    n = _positive_int("dataset_size", dataset_size)
    b = _positive_int("batch_size", batch_size)
    epochs = _positive_int("epochs", epochs)
    k = _positive_int("accum_steps", accum_steps)
    if not isinstance(drop_last, bool):
        raise ValueError(f"`drop_last` must be True or False, got {drop_last!r}.")

    if drop_last:
        # Only full batches survive; if N < B there is none at all.
        iters = n // b
        last = b if iters > 0 else 0
        seen_per_epoch = iters * b
    else:
        iters = _ceil_div(n, b)
        last = n - (iters - 1) * b
        seen_per_epoch = n
    # One update per group of K micro-batches, the last group possibly shorter.
    updates_per_epoch = _ceil_div(iters, k)

    return {
        "iters_per_epoch": iters,
        "last_batch_size": last,
        "micro_steps": iters * epochs,
        "updates_per_epoch": updates_per_epoch,
        "total_updates": updates_per_epoch * epochs,
        "effective_batch_size": b * k,
        "examples_seen": seen_per_epoch * epochs,
    }
