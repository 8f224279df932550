"""Checks for chapter 11, "Distributed training": the grader half.

Exercises:
    ch11_ring_allreduce: ``ring_allreduce(buffers) -> (results, sends)``, a ring all-reduce
        simulated in plain Python, step by step (see `forge_course.reference.collectives`).
        Results are compared to the bit, and the caller's buffers must come back unchanged.
    ch11_ddp_worker: ``worker(rank, world_size, port, out_dir)``, one DDP rank. The learner half
        (`forge_course.observe.ch11`) starts ``world_size`` fresh processes, each with its own
        ``out_dir``; the verdict compares the groups they joined, the files they saved and the
        weights with the reference's, and the weights with one process, within `DDP_TOLERANCE`,
        and requires every rank to have destroyed its group when ``worker`` ends, also in a
        case where saving fails.
Questions:
    ch11_q_ring_steps, ch11_q_ring_megabytes, ch11_q_dataparallel.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import torch

from forge_course.grading.core import Exercise, clean_room, grading_seed
from forge_course.observe.ch11 import label_ddp, label_ring, observe_ddp_worker, observe_ring
from forge_course.reference import collectives as ref
from forge_course.reference.ddp import single_process_reference

# ---------------------------------------------------------------- ch11_ring_allreduce

# The chapter's running example: three workers, three gradients each.
RUNNING_EXAMPLE = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [100.0, 200.0, 300.0]]


def _random_buffers(rng: random.Random, n: int, length: int) -> list[list[float]]:
    return [[rng.uniform(-10, 10) for _ in range(length)] for _ in range(n)]


def ring_cases(thorough: bool = False) -> list[dict]:
    """Visible: the running example, 4 workers × 8 values, and 3 × 4 values of very different
    sizes (a length not divisible by N, where only array_split's chunks give the right bits).
    Thorough: N = 2 … 7, lengths not divisible by N (one shorter than N, so a chunk is empty),
    negative values, and values of very different sizes, where only the ring's own order of
    additions gives the right bits."""
    # Cut as array_split, elements 1 and 2 are in chunks 0 and 1 and sum to [1, 0] in the ring's
    # order; with the extra element in the last chunk they are in chunks 1 and 2 and sum to
    # [0, 1]; summed in one worker, front to back or back to front, to [1, 0] or [0, 0].
    uneven = {"buffers": [[0.5, 1e16, 1e16, 3.0], [1.5, -1e16, 1.0, 1.0],
                          [2.5, 1.0, -1e16, 5.0]]}  # fmt: skip
    if not thorough:
        rng = random.Random(11)
        return [
            {"buffers": RUNNING_EXAMPLE},
            {"buffers": [[float(rng.randint(-9, 9)) for _ in range(8)] for _ in range(4)]},
            uneven,
        ]
    rng = random.Random(grading_seed())
    cases = [{"buffers": _random_buffers(rng, n, length)} for n, length in
             [(2, 5), (3, 7), (4, 10), (5, 4), (6, 13), (7, 9)]]  # fmt: skip
    # Sums to [0, 1, 1] in the ring's order; adding in the other orders loses a 1 somewhere.
    cases.append({"buffers": [[1.0, 1.0, 1e16], [1e16, 1e16, 1.0], [-1e16, -1e16, -1e16]]})
    return [*cases, uneven]


def _ring(buffers, *, gather=True, gather_offset=1, remainder_last=False, in_place=False):
    """A ring all-reduce with switches for the usual slips (the reference when all are off)."""
    n, length = len(buffers), len(buffers[0])
    if remainder_last:
        bounds = [k * (length // n) for k in range(n)] + [length]
    else:
        bounds = ref.chunk_bounds(length, n)
    chunks = [[list(b[bounds[k] : bounds[k + 1]]) for k in range(n)] for b in buffers]
    sends = []
    for s in range(n - 1):
        step = [(r, (r + 1) % n, (r - s) % n) for r in range(n)]
        moving = [list(chunks[src][k]) for src, _, k in step]
        for (_, dst, k), values in zip(step, moving):
            chunks[dst][k] = [a + b for a, b in zip(chunks[dst][k], values)]
        sends.append(step)
    for s in range(n - 1 if gather else 0):
        step = [(r, (r + 1) % n, (r + gather_offset - s) % n) for r in range(n)]
        moving = [list(chunks[src][k]) for src, _, k in step]
        for (_, dst, k), values in zip(step, moving):
            chunks[dst][k] = values
        sends.append(step)
    results = [[x for c in worker for x in c] for worker in chunks]
    if in_place:
        for buffer, result in zip(buffers, results):
            buffer[:] = result
    return results, sends


def _plain_sum(buffers):
    total = [sum(column) for column in zip(*buffers)]
    return [list(total) for _ in buffers], []


RING_MISTAKES = [
    (
        "every worker has the sum, but nothing was sent: the exercise is to *simulate the ring*, "
        "chunk by chunk, and return each step's (src, dst, chunk) sends: 2(N − 1) steps in all.",
        _plain_sum,
    ),
    (
        "the all-gather half is missing: after reduce-scatter each worker holds the complete "
        "sum of one chunk only. Pass the complete chunks round the ring for N − 1 more steps.",
        functools.partial(_ring, gather=False),
    ),
    (
        "in the all-gather, worker r starts by sending the chunk it completed, (r + 1) mod N, "
        "not chunk r: it sent a chunk that was still a partial sum.",
        functools.partial(_ring, gather_offset=0),
    ),
    (
        "the chunks are cut with the extra elements in the last chunk. Cut as "
        "`numpy.array_split` does: the first L mod N chunks get one element more. Which chunk an "
        "element is in decides the order its values are added in, so the bits differ.",
        functools.partial(_ring, remainder_last=True),
    ),
    (
        "`ring_allreduce` changed the caller's `buffers`: they now hold the results, and the "
        "gradients they held are gone. Work on copies (`[list(b) for b in buffers]`).",
        functools.partial(_ring, in_place=True),
    ),
]

RING_ALLREDUCE = Exercise(
    grade_id="ch11_ring_allreduce",
    function="ring_allreduce",
    reference=ref.ring_allreduce.__wrapped__,
    cases=ring_cases,
    observe=observe_ring,
    label=label_ring,
    mistakes=RING_MISTAKES,
    hint="trace the running example by hand: at reduce-scatter step s worker r sends chunk "
    "(r − s) mod N to (r + 1) mod N, which adds it to its own (`mine + received`); at all-gather "
    "step s it sends chunk (r + 1 − s) mod N, which the receiver copies. Results are compared to "
    "the bit, and `buffers` must come back unchanged.",
)
check_ring_allreduce = RING_ALLREDUCE.check


# ---------------------------------------------------------------- ch11_ddp_worker

DDP_TOLERANCE = 1e-6  # largest difference from one process allowed (float32 reduction order)
WEIGHTS = "the weights rank 0 saved"


def ddp_cases(thorough: bool = False) -> list[dict]:
    """Visible: 2 ranks. Thorough: 4 ranks and 1 rank, so a hard-coded 2 or batch of 8 shows.
    Both end with 2 ranks whose out_dir is a file: the worker fails as it saves, and each rank
    must have destroyed its group all the same."""
    failing = {"world_size": 2, "saving fails": True}
    return (
        [{"world_size": 4}, {"world_size": 1}, failing]
        if thorough
        else [{"world_size": 2}, failing]
    )


@functools.cache
def _one_process() -> dict[str, torch.Tensor]:
    """The weights of one process on the whole batch, in float64 (computed once, in a clean
    room: a DataLoader draws from the global generator)."""
    with clean_room():
        return {k: v.double() for k, v in single_process_reference().items()}


def _close(weights, other) -> bool:
    return (
        isinstance(weights, dict) and isinstance(other, dict) and weights.keys() == other.keys()
        and all(isinstance(w, torch.Tensor) and w.shape == other[k].shape
                and bool((w - other[k]).abs().max() <= DDP_TOLERANCE) for k, w in weights.items())
    )  # fmt: skip


def _within_tolerance(observed: dict, target: dict, case: dict) -> dict:
    """Accept weights within `DDP_TOLERANCE` of one process when the target's are too (DDP sums
    in another order), and weights within it of the target's (a known mistake's weights are
    prepared against the answer's, and a hand-written all-reduce sums in another order again)."""
    weights, wanted = observed.get(WEIGHTS), target.get(WEIGHTS)
    one = _one_process()
    if _close(weights, wanted) or (_close(weights, one) and _close(wanted, one)):
        return {**observed, WEIGHTS: wanted}
    return observed


def _wrong_worker(
    *, sampler=True, shuffle=True, seed_by_rank=False, wrap=True, divide=True, unwrap=True,
    join=True, save="each rank", destroy="finally", averaging="DDP",
):  # fmt: skip
    """The reference DDP rank with one of the usual slips switched on.

    ``averaging`` names what should make the ranks agree: "DDP"; "DDP, divided again" (each
    gradient divided by world_size after DDP averaged it); or, without DDP, a hand-written
    all-reduce: "summed gradients" (not divided), "mean gradients, seeded by rank" (each rank's
    model built from the seed `rank`), or "the loss" (the gradients are never reduced).
    ``destroy`` is "finally", "after" (not when something fails) or "never".
    """

    def worker(rank, world_size, port, out_dir):
        import torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, DistributedSampler

        from forge_course.reference.ddp import (
            GLOBAL_BATCH,
            LR,
            SEED,
            make_dataset,
            make_model,
            train,
        )

        def after_backward(model, loss):
            if averaging == "the loss":
                dist.all_reduce(loss.detach())
            for p in model.parameters():
                if averaging in ("summed gradients", "mean gradients, seeded by rank"):
                    dist.all_reduce(p.grad)
                if averaging in ("DDP, divided again", "mean gradients, seeded by rank"):
                    p.grad /= world_size

        def hand_written_train(model, loader):  # `train`, with `after_backward` before each step
            optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
            for x, y in loader:
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                after_backward(model, loss)
                optimizer.step()

        if not join:  # no group and no DDP: each rank trains alone on whole batches
            whole = DistributedSampler(make_dataset(), 1, 0, shuffle=True, seed=SEED)
            model = make_model()
            loader = DataLoader(make_dataset(), batch_size=GLOBAL_BATCH, sampler=whole)
            train(model, loader, torch.device("cpu"))
            torch.save(model.state_dict(), Path(out_dir, f"rank{rank}.pt"))
            return
        init = f"tcp://127.0.0.1:{port}"
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
        try:
            dataset = make_dataset()
            batch = GLOBAL_BATCH // world_size if divide else GLOBAL_BATCH
            if sampler:
                seed = rank if seed_by_rank else SEED
                shard = DistributedSampler(dataset, world_size, rank, shuffle=shuffle, seed=seed)
                loader = DataLoader(dataset, batch_size=batch, sampler=shard)
            else:
                loader = DataLoader(dataset, batch_size=batch)
            seeded = make_model(rank if averaging.endswith("by rank") else SEED)
            wrapped = wrap and averaging.startswith("DDP")
            model = DistributedDataParallel(seeded) if wrapped else seeded
            if averaging == "DDP":
                train(model, loader, torch.device("cpu"))
            else:
                hand_written_train(model, loader)
            inner = model.module if wrapped and unwrap else model
            if save == "each rank" or (save == "rank 0" and rank == 0):
                torch.save(inner.state_dict(), Path(out_dir, f"rank{rank}.pt"))
        except BaseException:
            if destroy == "finally":
                dist.destroy_process_group()
            raise
        if destroy != "never":
            dist.destroy_process_group()

    return worker


DESTROY = (
    "Call dist.destroy_process_group() in a `finally:` right after init_process_group, so that "
    "it runs whether the work returns or raises."
)

DDP_MISTAKES = [
    (
        "no rank joined a process group: without `dist.init_process_group(...)` the ranks are "
        "separate processes that cannot average anything. Every rank must join the group as "
        "its `rank`, train its shard of each batch under DDP, and save its own file.",
        _wrong_worker(join=False),
    ),
    (
        "the ranks averaged their losses with dist.all_reduce, not their gradients: the "
        "gradients `backward()` had already computed came from each rank's own loss, so each "
        "rank trained on its own shard alone and the ranks drifted apart. Wrap the model in "
        "DistributedDataParallel, which averages the gradients during backward() (averaging "
        "the loss as well is fine, for printing it).",
        _wrong_worker(averaging="the loss"),
    ),
    (
        "the model is not wrapped in DistributedDataParallel, so nothing averages the gradients: "
        "each rank trained on its own shard alone and the ranks drifted apart.",
        _wrong_worker(wrap=False),
    ),
    (
        "every rank trained on the whole dataset, in the same order: give the DataLoader a "
        "DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED), so that each "
        "rank gets its own shard.",
        _wrong_worker(sampler=False),
    ),
    (
        "each rank's DistributedSampler was seeded with its rank: each shuffled the dataset "
        "into another order and took its share of that, so some examples were trained on "
        "twice and others never. Give every rank the same seed=SEED_DDP: the shared order is "
        "what makes the shards fit together into the global batches.",
        _wrong_worker(seed_by_rank=True),
    ),
    (
        "the DistributedSampler does not shuffle (shuffle=False): the ranks took the examples "
        "in the dataset's order, not in the shuffled order one process trains on. Pass "
        "shuffle=True and seed=SEED_DDP.",
        _wrong_worker(shuffle=False),
    ),
    (
        "each rank's batch must be GLOBAL_BATCH // world_size: the ranks together make one "
        "global batch per step, so with the whole GLOBAL_BATCH per rank the steps are too big.",
        _wrong_worker(divide=False),
    ),
    (
        "the gradients were divided by world_size twice, so every step was world_size times "
        "too small: DistributedDataParallel already averages them during backward() (each "
        "rank's gradient times 1/world_size, then summed). Do not divide them again; with a "
        "hand-written all_reduce, divide once, the loss or the sum, not both.",
        _wrong_worker(averaging="DDP, divided again"),
    ),
    (
        "the gradients were summed over the ranks, not averaged, so every step was world_size "
        "times too big: dist.all_reduce sums. Divide each gradient by world_size after it, or "
        "leave the averaging to DistributedDataParallel (then do not all-reduce them again).",
        _wrong_worker(averaging="summed gradients"),
    ),
    (
        "the ranks started from different weights (a seed that depends on the rank, such as "
        "`torch.manual_seed(rank)`), and averaging the gradients never makes them equal: every "
        "rank applied the same step to its own weights. Build the model the same way on every "
        "rank, with make_model(), and wrap it in DistributedDataParallel, which also copies "
        "rank 0's weights to every rank when it is built.",
        _wrong_worker(averaging="mean gradients, seeded by rank"),
    ),
    (
        "the saved weights are the DDP wrapper's, with every key starting 'module.': save "
        "model.module.state_dict(), the weights of the model inside.",
        _wrong_worker(unwrap=False),
    ),
    (
        "only rank 0 saved its weights. Saving on rank 0 alone is the habit where the ranks "
        "share a disk, but here each rank has an out_dir of its own, and each must save into "
        'it: `torch.save(model.module.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))`, '
        "in every rank.",
        _wrong_worker(save="rank 0"),
    ),
    (
        "each rank must save its own weights: `torch.save(model.module.state_dict(), "
        'os.path.join(out_dir, f"rank{rank}.pt"))`, in every rank, into the out_dir it was given.',
        _wrong_worker(save="none"),
    ),
    (
        "the process group is destroyed only when everything goes well: when saving failed, "
        "`worker` raised before it reached dist.destroy_process_group(), and each rank kept "
        "its group (its sockets, threads and port) for as long as the process lives. " + DESTROY,
        _wrong_worker(destroy="after"),
    ),
    # Before the next: the failing case is reached only by a worker that destroyed its group
    # when it returned, and there the two look alike.
    (
        "the process group was never destroyed: after `worker` returned, each rank still had "
        "it. A group left behind keeps its sockets and threads open, and the next "
        'init_process_group in the same process fails ("trying to initialize the default '
        'process group twice"). ' + DESTROY,
        _wrong_worker(destroy="never"),
    ),
]


DDP_WORKER = Exercise(
    grade_id="ch11_ddp_worker",
    function="worker",
    reference=ref.ddp_rank_worker.__wrapped__,
    cases=ddp_cases,
    observe=observe_ddp_worker,
    label=label_ddp,
    mistakes=DDP_MISTAKES,
    hint="each rank: init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, "
    "world_size=world_size); DistributedSampler(dataset, world_size, rank, shuffle=True, "
    "seed=SEED); batch_size=GLOBAL_BATCH // world_size; DDP(make_model()); train(...); save "
    "model.module.state_dict() to out_dir/rank{rank}.pt; destroy_process_group() in a finally.",
    prepare=_within_tolerance,
)
check_ddp_worker = DDP_WORKER.check

EXERCISES = [RING_ALLREDUCE, DDP_WORKER]
