"""The update schedule of one epoch: each micro-batch's size, and whether an update follows it.

`training_arithmetic` counts a run; this module lists one epoch of it, micro-batch by
micro-batch, as the correct gradient-accumulation loop walks a ``DataLoader``:

    sizes = [size for size, _ in update_schedule(N, B, K, drop_last)]
    for i, (x, y) in enumerate(loader):
        group = sizes[i - i % K : i - i % K + K]  # the micro-batches of this update
        (loss_fn(model(x), y) * len(x) / sum(group)).backward()
        if (i + 1) % K == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()

Each micro-batch's mean loss is weighted by its share of the examples its update uses, chapter
10's ``n_i / N``, so that ``.grad`` ends up holding the gradient of the mean over those examples,
as one big batch would. The familiar ``/ K`` is that weight only when all ``K`` micro-batches of
the group are full; in a group that holds the short last micro-batch it gives each of the short
one's examples more weight than the others.

Micro-batch ``i`` (counted from 0) holds ``B`` examples, except the last one without
``drop_last``, which holds the ``N - (I - 1)·B`` left over. The optimizer steps after every
``K``-th micro-batch **and after the last one of the epoch**. That second condition is what the
common loop ``if (i + 1) % K == 0`` lacks: when ``K`` does not divide ``I``, the last ``I mod K``
micro-batches fill ``.grad`` and no update follows, so their gradients leak into the first
update of the next epoch.

Every epoch has the same schedule: shuffling changes which examples land in a micro-batch, not
how many.
"""

from __future__ import annotations

from forge_course.reference.guard import reference

__all__ = ["update_schedule"]


def _positive_int(name: str, value: object) -> int:
    # bool is a subclass of int, but `accum_steps=True` is a mistake, not one step.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a whole number of at least 1, got {value!r}.")
    return value


@reference
def update_schedule(
    dataset_size: int, batch_size: int, accum_steps: int, drop_last: bool = False
) -> list[tuple[int, bool]]:
    """One epoch of micro-batches, in order: ``(size, steps)`` for each.

    Args:
        dataset_size: ``N``, the number of examples in the data set.
        batch_size: ``B``, the ``DataLoader``'s ``batch_size``.
        accum_steps: ``K``, micro-batches whose gradients add up before one optimizer update.
        drop_last: as in ``DataLoader``: drop the last batch if it holds fewer than ``B`` examples.

    Returns:
        One pair per micro-batch: its number of examples, and ``True`` if the optimizer steps
        right after it. The last pair always steps; the list is empty when ``drop_last`` drops
        the only (partial) batch.

    Raises:
        ValueError: if a count is not a whole number of at least 1, or ``drop_last`` is not a bool.

    Example:
        >>> update_schedule(100, 16, 4)
        [(16, False), (16, False), (16, False), (16, True), (16, False), (16, False), (4, True)]
    """
    n = _positive_int("dataset_size", dataset_size)
    b = _positive_int("batch_size", batch_size)
    k = _positive_int("accum_steps", accum_steps)
    if not isinstance(drop_last, bool):
        raise ValueError(f"`drop_last` must be True or False, got {drop_last!r}.")

    # Start of each batch: every B-th example; drop_last keeps only starts of full batches.
    last_start = n - b if drop_last else n - 1
    starts = range(0, last_start + 1, b)
    iters = len(starts)
    return [
        (min(b, n - start), (i + 1) % k == 0 or i + 1 == iters) for i, start in enumerate(starts)
    ]
