"""Checks for chapter 11, "Distributed training".

Exercises:
    ch11_ring_allreduce: ``ring_allreduce(buffers) -> (results, sends)``, a ring all-reduce
        simulated in plain Python, step by step (see `forge_course.reference.collectives`).
    ch11_ddp_worker: ``worker(rank, world_size, port, out_dir)``, one DDP rank. The check starts
        real processes (forked, so a function defined in a notebook cell works), each rank in its
        own process group, killed after `DDP_TIMEOUT_S` seconds if it hangs; the observation is
        plain data: which files were saved, whether the ranks agree, and the weights.
Questions:
    ch11_q_ring_steps, ch11_q_ring_megabytes, ch11_q_dataparallel.
"""

from __future__ import annotations

import copy
import importlib
import random
import tempfile
from pathlib import Path

import torch

from forge_course.grading.core import Exercise, Mistake, call_answer, grading_seed
from forge_course.reference import collectives as ref
from forge_course.reference.ddp import free_port, single_process_reference

# ---------------------------------------------------------------- ch11_ring_allreduce

# The chapter's running example: three workers, three gradients each.
RUNNING_EXAMPLE = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [100.0, 200.0, 300.0]]


def _random_buffers(rng: random.Random, n: int, length: int) -> list[list[float]]:
    return [[rng.uniform(-10, 10) for _ in range(length)] for _ in range(n)]


def ring_cases(thorough: bool = False) -> list[dict]:
    """Visible: the running example and 4 workers × 8 values. Thorough: N = 2 … 7, lengths not
    divisible by N (one shorter than N, so a chunk is empty), negative values, and values of
    very different sizes, where only the ring's own order of additions gives the right bits."""
    if not thorough:
        rng = random.Random(11)
        return [
            {"buffers": RUNNING_EXAMPLE},
            {"buffers": [[float(rng.randint(-9, 9)) for _ in range(8)] for _ in range(4)]},
        ]
    rng = random.Random(grading_seed())
    cases = [{"buffers": _random_buffers(rng, n, length)} for n, length in
             [(2, 5), (3, 7), (4, 10), (5, 4), (6, 13), (7, 9)]]  # fmt: skip
    # Sums to [0, 1, 1] in the ring's order; adding in the other orders loses a 1 somewhere.
    cases.append({"buffers": [[1.0, 1.0, 1e16], [1e16, 1e16, 1.0], [-1e16, -1e16, -1e16]]})
    return cases


def _plain_numbers(value):
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain_numbers(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return value


def observe_ring(fn, case: dict) -> dict:
    """What every worker ends with, how many steps there were, and who sent which chunk when."""
    out = call_answer(
        "ch11_ring_allreduce", "ring_allreduce", fn, copy.deepcopy(case["buffers"]),
        case=_ring_label(case),
    )  # fmt: skip
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise Mistake(
            "ch11_ring_allreduce",
            f"`ring_allreduce` should return a pair `(results, sends)`, but it returned "
            f"{type(out).__name__}.",
        )
    results, sends = _plain_numbers(out[0]), _plain_numbers(out[1])
    results = [[float(x) for x in worker] for worker in results]
    sends = [[[int(v) for v in send] for send in step] for step in sends]
    return {
        "results": results,
        "every worker holds the same bits": all(worker == results[0] for worker in results),
        "number of steps": len(sends),
        "sends": sends,
    }


def _ring_label(case: dict) -> str:
    buffers = case["buffers"]
    return f"{len(buffers)} workers, {len(buffers[0])} values each"


def _ring(buffers, *, gather=True, gather_offset=1):
    """A ring all-reduce with switches for the usual slips (the reference when all are off)."""
    n = len(buffers)
    bounds = ref.chunk_bounds(len(buffers[0]), n)
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
    return [[x for c in worker for x in c] for worker in chunks], sends


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
        lambda buffers: _ring(buffers, gather=False),
    ),
    (
        "in the all-gather, worker r starts by sending the chunk it completed, (r + 1) mod N, "
        "not chunk r: it sent a chunk that was still a partial sum.",
        lambda buffers: _ring(buffers, gather_offset=0),
    ),
]

RING_ALLREDUCE = Exercise(
    grade_id="ch11_ring_allreduce",
    function="ring_allreduce",
    reference=ref.ring_allreduce.__wrapped__,
    cases=ring_cases,
    observe=lambda fn, case: observe_ring(fn, case),
    label=_ring_label,
    mistakes=RING_MISTAKES,
    hint="trace the running example by hand: at reduce-scatter step s worker r sends chunk "
    "(r − s) mod N to (r + 1) mod N, which adds it to its own; at all-gather step s it sends "
    "chunk (r + 1 − s) mod N, which the receiver copies.",
)
check_ring_allreduce = RING_ALLREDUCE.check


# ---------------------------------------------------------------- ch11_ddp_worker

DDP_TIMEOUT_S = 60  # seconds all ranks together may take before they are killed
DDP_TOLERANCE = 1e-6  # largest difference from one process allowed (float32 reduction order)


def ddp_cases(thorough: bool = False) -> list[dict]:
    """Visible: 2 ranks. Thorough: 4 ranks and 1 rank, so a hard-coded 2 or batch of 8 shows."""
    return [{"world_size": 4}, {"world_size": 1}] if thorough else [{"world_size": 2}]


def _as_answer(fn, *args) -> None:
    """Run one rank of ``fn`` as the learner's answer: calling the reference inside is refused."""
    call_answer("ch11_ddp_worker", "worker", fn, *args)


def _last_line(trace: str) -> str:
    lines = [line for line in trace.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else trace


def observe_ddp_worker(fn, case: dict) -> dict:
    """Run ``fn`` as ``world_size`` real ranks; the files they saved and the weights in them."""
    world_size = case["world_size"]
    label = f"{world_size} rank{'s' if world_size > 1 else ''}"
    if not callable(fn):
        raise Mistake("ch11_ddp_worker", f"`worker` should be a function, not {type(fn).__name__}.")
    # DDP imports torch._dynamo (seconds): once here, the forked ranks inherit it for free.
    importlib.import_module("torch._dynamo")
    with tempfile.TemporaryDirectory(prefix="forge-ch11-") as out_dir:
        args = (world_size, free_port(), out_dir)
        run = ref.run_ranks(fn, world_size, args, timeout_s=DDP_TIMEOUT_S, call=_as_answer)
        if run["errors"]:
            rank, trace = min(run["errors"].items())
            raise Mistake(
                "ch11_ddp_worker",
                f"rank {rank} raised ({label}): {_last_line(trace)}",
            )
        if run["timed_out"]:
            raise Mistake(
                "ch11_ddp_worker",
                f"the ranks did not finish within {DDP_TIMEOUT_S} s ({label}) and were stopped. "
                "A rank waits forever when the others never join or skip a collective: check "
                "that every rank calls init_process_group with the same world_size and port, and "
                "runs the same number of steps.",
            )
        if any(code != 0 for code in run["exitcodes"]):
            raise Mistake(
                "ch11_ddp_worker", f"a rank crashed ({label}): exit codes {run['exitcodes']}."
            )
        saved = sorted(path.name for path in Path(out_dir).iterdir())
        missing = [f"rank{r}.pt" for r in range(world_size) if f"rank{r}.pt" not in saved]
        if missing:
            raise Mistake(
                "ch11_ddp_worker",
                f"the ranks finished ({label}), but {missing} are missing from out_dir (it holds "
                f"{saved}): save model.module.state_dict() to os.path.join(out_dir, "
                'f"rank{rank}.pt").',
            )
        weights = [torch.load(Path(out_dir, name), weights_only=True) for name in saved]
    if not all(isinstance(w, dict) for w in weights):
        raise Mistake("ch11_ddp_worker", "save a state_dict (a dict of tensors) in each file.")
    weights = [{k: v.detach().cpu() for k, v in w.items()} for w in weights]
    single = single_process_reference()
    same_keys = all(w.keys() == single.keys() for w in weights)
    gap = (
        max((w[k].double() - single[k].double()).abs().max().item() for w in weights for k in w)
        if same_keys
        else float("inf")
    )
    return {
        "saved files": saved,
        "every rank holds the same weights": all(
            w.keys() == weights[0].keys() and all(torch.equal(w[k], weights[0][k]) for k in w)
            for w in weights
        ),
        "weights of rank 0": weights[0],
        f"weights within {DDP_TOLERANCE:g} of one process on the whole batch": gap <= DDP_TOLERANCE,
    }


def _wrong_worker(*, sampler=True, wrap=True, divide=True, unwrap=True):
    """The reference DDP rank with one of the usual slips switched on."""

    def worker(rank, world_size, port, out_dir):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, DistributedSampler

        from forge_course.reference.ddp import GLOBAL_BATCH, SEED, make_dataset, make_model, train

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
            torch.save(inner.state_dict(), Path(out_dir, f"rank{rank}.pt"))
        finally:
            dist.destroy_process_group()

    return worker


DDP_MISTAKES = [
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
]


DDP_WORKER = Exercise(
    grade_id="ch11_ddp_worker",
    function="worker",
    reference=ref.ddp_rank_worker.__wrapped__,
    cases=ddp_cases,
    observe=observe_ddp_worker,
    label=lambda case: f"{case['world_size']} ranks",
    mistakes=DDP_MISTAKES,
    hint="each rank: init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, "
    "world_size=world_size); DistributedSampler(dataset, world_size, rank, shuffle=True, "
    "seed=SEED); batch_size=GLOBAL_BATCH // world_size; DDP(make_model()); train(...); save "
    "model.module.state_dict() to out_dir/rank{rank}.pt; destroy_process_group() in a finally.",
)
check_ddp_worker = DDP_WORKER.check

EXERCISES = [RING_ALLREDUCE, DDP_WORKER]
