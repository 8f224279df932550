"""Checks for chapter 11, "Distributed training": the grader half.

Exercises:
    ch11_ring_allreduce: ``ring_allreduce(buffers) -> (results, sends)``, a ring all-reduce
        simulated in plain Python, step by step (see `forge_course.reference.collectives`).
        Results are compared to the bit, and the caller's buffers must come back unchanged.
    ch11_ddp_worker: ``worker(rank, world_size, port, out_dir)``, one DDP rank. The learner half
        (`forge_course.observe.ch11`) starts ``world_size`` fresh processes, each with its own
        ``out_dir``; the verdict compares the groups they joined, the files they saved and the
        weights with the reference's, and the weights with one process, within `DDP_TOLERANCE`.
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
    """Visible: 2 ranks. Thorough: 4 ranks and 1 rank, so a hard-coded 2 or batch of 8 shows."""
    return [{"world_size": 4}, {"world_size": 1}] if thorough else [{"world_size": 2}]


@functools.cache
def _one_process() -> dict[str, torch.Tensor]:
    """The weights of one process on the whole batch, in float64 (computed once, in a clean
    room: a DataLoader draws from the global generator)."""
    with clean_room():
        return {k: v.double() for k, v in single_process_reference().items()}


def _close_to_one_process(weights) -> bool:
    one = _one_process()
    return (
        isinstance(weights, dict) and weights.keys() == one.keys()
        and all(isinstance(w, torch.Tensor) and w.shape == one[k].shape
                and bool((w - one[k]).abs().max() <= DDP_TOLERANCE) for k, w in weights.items())
    )  # fmt: skip


def _within_tolerance(observed: dict, target: dict, case: dict) -> dict:
    """Accept weights within `DDP_TOLERANCE` of one process: DDP sums in another order. Both
    sides must be: a known mistake's weights are prepared against the answer's."""
    weights, wanted = observed.get(WEIGHTS), target.get(WEIGHTS)
    if _close_to_one_process(weights) and _close_to_one_process(wanted):
        return {**observed, WEIGHTS: wanted}
    return observed


def _wrong_worker(*, sampler=True, wrap=True, divide=True, unwrap=True, join=True, save=True):
    """The reference DDP rank with one of the usual slips switched on."""

    def worker(rank, world_size, port, out_dir):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, DistributedSampler

        from forge_course.reference.ddp import GLOBAL_BATCH, SEED, make_dataset, make_model, train

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
                shard = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED)
                loader = DataLoader(dataset, batch_size=batch, sampler=shard)
            else:
                loader = DataLoader(dataset, batch_size=batch)
            model = DistributedDataParallel(make_model()) if wrap else make_model()
            train(model, loader, torch.device("cpu"))
            inner = model.module if wrap and unwrap else model
            if save:
                torch.save(inner.state_dict(), Path(out_dir, f"rank{rank}.pt"))
        finally:
            dist.destroy_process_group()

    return worker


DDP_MISTAKES = [
    (
        "no rank joined a process group: without `dist.init_process_group(...)` the ranks are "
        "separate processes that cannot average anything. Every rank must join the group as "
        "its `rank`, train its shard of each batch under DDP, and save its own file.",
        _wrong_worker(join=False),
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
        "each rank's batch must be GLOBAL_BATCH // world_size: the ranks together make one "
        "global batch per step, so with the whole GLOBAL_BATCH per rank the steps are too big.",
        _wrong_worker(divide=False),
    ),
    (
        "the saved weights are the DDP wrapper's, with every key starting 'module.': save "
        "model.module.state_dict(), the weights of the model inside.",
        _wrong_worker(unwrap=False),
    ),
    (
        "each rank must save its own weights: `torch.save(model.module.state_dict(), "
        'os.path.join(out_dir, f"rank{rank}.pt"))`, in every rank, into the out_dir it was given.',
        _wrong_worker(save=False),
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
