"""Data parallelism with DDP: every rank trains on its shard, and all end where one process would.

The same training loop (`train`) runs three ways, as in pytorch/examples:

1. in one process on whole global batches: `single_process_reference`;
2. in ``world_size`` processes started by `torch.multiprocessing.spawn`: `run_demo`, or
   ``python -m forge_course.reference.ddp --world-size 2``;
3. in processes started by torchrun, one per GPU or, on a CPU, as many as you ask for:
   ``torchrun --standalone --nproc_per_node=2 -m forge_course.reference.ddp``.

Why the weights agree: `DistributedSampler` gives rank ``r`` the examples ``r, r + W, r + 2W, …``
of one shuffled order shared by all ``W`` ranks, so step ``s`` of the ranks together covers
exactly the ``s``-th global batch of that order. Each rank's loss is the mean over its
``B / W`` examples; during ``backward()`` DDP multiplies each gradient by ``1 / W`` as it copies
it into a bucket, then all-reduces (sums) the buckets, so every rank holds the gradient of the
mean over all ``B`` examples, which is what one process computes on the whole batch. The scaling
comes *before* the sum: `gradient_scaling` shows it on 3 ranks, where scaling first reproduces
DDP's gradients bit for bit and dividing the sum afterwards does not. Only the order of the
float operations differs from one process, so the weights match to about 1e-7, not bit for bit.
They are bit-for-bit equal *across ranks*: every rank applies the same averaged gradient to the
same starting weights.

A distributed run must never hang a course machine: the process group gets a timeout, a free
port, and is always destroyed; a rank that raises ends the run (spawn's join raises
`ProcessRaisedException`, torchrun exits non-zero). ``fail_rank`` makes one rank fail on purpose
to show it.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from forge_course.device import pick_device, tolerance
from forge_course.ports import free_port
from forge_course.reference.guard import reference

__all__ = [
    "ddp_worker",
    "free_port",
    "gradient_scaling",
    "make_dataset",
    "make_model",
    "run_demo",
    "single_process_reference",
    "train",
]

STEPS = 3  # optimizer steps, one pass over the data
GLOBAL_BATCH = 16  # examples per step, summed over all ranks; must divide by the world size
SEED = 0  # the data, the initial weights and the shuffle all come from it
LR = 0.1  # SGD learning rate (momentum 0.9)
TIMEOUT_S = 60  # seconds a rank waits for the others before giving up with an error


def make_dataset(steps: int = STEPS, global_batch: int = GLOBAL_BATCH, seed: int = SEED):
    """A small regression problem with exactly ``steps`` global batches, the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * global_batch, 4, generator=generator)
    true_weights = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    y = x @ true_weights + 0.1 * torch.randn(len(x), 1, generator=generator)
    return TensorDataset(x, y)


def make_model(seed: int = SEED) -> nn.Module:
    """A tiny MLP whose initial weights depend only on `seed`."""
    generator_state = torch.get_rng_state()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    # Leave the caller's random stream as it was.
    torch.set_rng_state(generator_state)
    return model


def train(model: nn.Module, loader: DataLoader, device: torch.device, lr: float = LR) -> None:
    """One pass of the plain loop. The same code serves a bare model and a DDP-wrapped one."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        # Under DDP this is where the ranks meet: gradients are averaged over all of them.
        loss.backward()
        optimizer.step()


def single_process_reference(
    steps: int = STEPS,
    global_batch: int = GLOBAL_BATCH,
    seed: int = SEED,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Final weights of one process training on whole global batches: what DDP must reproduce.

    The order comes from a `DistributedSampler` with a single replica: the same shuffled order
    the ranks split between them, here taken whole.
    """
    device = torch.device(device)
    dataset = make_dataset(steps, global_batch, seed)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)
    loader = DataLoader(dataset, batch_size=global_batch, sampler=sampler)
    model = make_model(seed).to(device)
    train(model, loader, device)
    return {name: value.detach().cpu() for name, value in model.state_dict().items()}


def _backend_and_device(local_rank: int, local_world_size: int) -> tuple[str, torch.device]:
    # NCCL needs one GPU per rank; with fewer GPUs than ranks every rank uses gloo on the CPU,
    # so all ranks make the same choice.
    if pick_device().type == "cuda" and torch.cuda.device_count() >= local_world_size:
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def _train_rank(
    rank: int,
    world_size: int,
    steps: int,
    global_batch: int,
    seed: int,
    init_method: str,
    timeout_s: float,
    fail_rank: int | None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    if global_batch % world_size:
        raise ValueError(f"global_batch={global_batch} must be divisible by {world_size} ranks")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    own_group = not dist.is_initialized()  # else a caller's group: use it, and leave it be
    if own_group:
        backend, device = _backend_and_device(local_rank, local_world_size)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    else:
        backend = dist.get_backend()
        device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    model = None
    try:
        dataset = make_dataset(steps, global_batch, seed)
        sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
        )
        loader = DataLoader(dataset, batch_size=global_batch // world_size, sampler=sampler)
        device_ids = [device.index] if device.type == "cuda" else None
        # DDP broadcasts rank 0's weights here, so the ranks start equal even without a seed.
        model = DistributedDataParallel(make_model(seed).to(device), device_ids=device_ids)
        if rank == fail_rank:
            raise RuntimeError(f"rank {rank} fails on purpose (fail_rank={fail_rank})")
        train(model, loader, device)

        weights = {name: v.detach().cpu() for name, v in model.module.state_dict().items()}
        reference = single_process_reference(steps, global_batch, seed, device)
        diff = max((weights[name] - reference[name]).abs().max() for name in weights)
        worst = torch.tensor([float(diff)], device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        # All ranks are identical exactly when the elementwise max and min over ranks agree.
        flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
        high, low = flat.clone(), flat.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        close = all(
            torch.allclose(weights[name], reference[name], **tolerance(torch.float32, device))
            for name in weights
        )
        dist.barrier()  # no rank tears down its group while a peer still talks to it
    finally:
        # DDP's reducer holds the process group: free it (cycles included) before the group,
        # or gloo can abort at interpreter exit.
        model = None
        gc.collect()
        if own_group:
            dist.destroy_process_group()
    summary = {
        "rank": rank,
        "world_size": world_size,
        "backend": backend,
        "steps": steps,
        "global_batch": global_batch,
        "max_abs_diff": worst.item(),
        "ranks_identical": torch.equal(high, low),
    }
    summary["ok"] = summary["ranks_identical"] and close and worst.item() <= 1e-6
    return summary, weights


@reference
def ddp_worker(
    rank: int,
    world_size: int,
    steps: int = STEPS,
    global_batch: int = GLOBAL_BATCH,
    seed: int = SEED,
    init_method: str = "env://",
    timeout_s: float = TIMEOUT_S,
    fail_rank: int | None = None,
    out_dir: str | None = None,
) -> dict[str, Any]:
    """Train on this rank's shard of each global batch with DDP, then compare with the reference.

    Args:
        rank, world_size: this process's place in the group, 0 <= rank < world_size.
        steps, global_batch, seed: the run, as in `single_process_reference`.
        init_method: how the ranks find each other: ``"env://"`` under torchrun (it sets
            MASTER_ADDR, MASTER_PORT), ``"tcp://127.0.0.1:PORT"`` under spawn. If this process
            has joined a group already (`forge_course.reference.ddp_practice`), that group is
            used, and left for the caller to destroy.
        timeout_s: seconds any collective may wait before it fails instead of hanging.
        fail_rank: this rank raises after joining the group, to show how a run ends when one
            rank dies while the others wait for it.
        out_dir: if given, write ``{"summary", "weights"}`` to ``out_dir/rank-<rank>.pt``, or,
            if this rank fails, when and why to ``out_dir/rank-<rank>.error``.

    Returns:
        A summary, the same on every rank: the largest difference from the single-process
        weights over all ranks, whether all ranks hold identical weights, and ``ok``.
    """
    args = (rank, world_size, steps, global_batch, seed, init_method, timeout_s, fail_rank)
    try:
        summary, weights = _train_rank(*args)
    except BaseException:
        if out_dir is not None:
            failure = {"rank": rank, "pid": os.getpid(), "time": time.time()}
            failure["trace"] = traceback.format_exc()
            (Path(out_dir) / f"rank-{rank}.error").write_text(json.dumps(failure))
        raise
    if out_dir is not None:
        torch.save({"summary": summary, "weights": weights}, Path(out_dir) / f"rank-{rank}.pt")
    return summary


def _first_failure(out_dir: Path, reported: mp.ProcessRaisedException) -> Exception:
    """The error of the rank that failed first.

    When one rank dies, its peers fail a moment later in their next collective ("connection
    closed by peer"). spawn reports whichever failed process it notices first, which under load
    can be a peer; the times the ranks wrote down name the real cause, as torchrun does.
    """
    failures = [json.loads(path.read_text()) for path in out_dir.glob("rank-*.error")]
    if not failures:
        return reported
    first = min(failures, key=lambda failure: failure["time"])
    if first["rank"] == reported.error_index:
        return reported
    message = (
        f"\n\n-- Process {first['rank']} terminated with the following error "
        f"(the first rank to fail; the others failed after it):\n{first['trace']}"
    )
    return mp.ProcessRaisedException(message, first["rank"], first["pid"])


def run_demo(
    world_size: int = 2,
    steps: int = STEPS,
    global_batch: int = GLOBAL_BATCH,
    seed: int = SEED,
    timeout_s: float = TIMEOUT_S,
    fail_rank: int | None = None,
) -> dict[str, Any]:
    """Start `world_size` ranks with `torch.multiprocessing.spawn` and collect what they trained.

    Returns:
        Rank 0's summary (see `ddp_worker`) without its ``rank``, plus ``weights``: each
        rank's final state dict, on the CPU, in rank order.

    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank raised; the others were stopped.
    """
    with tempfile.TemporaryDirectory(prefix="forge-ddp-") as out_dir:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        args = (world_size, steps, global_batch, seed, init_method, timeout_s, fail_rank, out_dir)
        try:
            mp.spawn(ddp_worker, args=args, nprocs=world_size, join=True)
        except mp.ProcessRaisedException as reported:
            raise _first_failure(Path(out_dir), reported) from None
        ranks = [
            torch.load(Path(out_dir) / f"rank-{rank}.pt", weights_only=True)
            for rank in range(world_size)
        ]
    summary = {key: value for key, value in ranks[0]["summary"].items() if key != "rank"}
    return {**summary, "weights": [result["weights"] for result in ranks]}


def _scaling_rank(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    wrapped = None
    try:
        x, y = make_dataset(steps=1, global_batch=4 * world_size).tensors
        x, y = x[rank::world_size], y[rank::world_size]  # this rank's 4 examples
        plain, wrapped = make_model(), DistributedDataParallel(make_model())
        for model in (plain, wrapped):
            nn.functional.mse_loss(model(x), y).backward()
        local = torch.cat([p.grad.reshape(-1) for p in plain.parameters()])
        ddp = torch.cat([p.grad.reshape(-1) for p in wrapped.module.parameters()])
        # The same all-reduce DDP uses (a sum), with the division by W in three places.
        orders = {
            "times 1/W, then summed": local * (1.0 / world_size),
            "divided by W, then summed": local / world_size,
            "summed, then divided by W": local.clone(),
        }
        for buffer in orders.values():
            dist.all_reduce(buffer)
        orders["summed, then divided by W"] /= world_size
        if rank == 0:
            equal = {name: int((buffer == ddp).sum()) for name, buffer in orders.items()}
            torch.save({"entries": ddp.numel(), "equal": equal}, Path(out_dir) / "scaling.pt")
        dist.barrier()
    finally:
        wrapped = None  # free DDP's reducer before its process group, as in _train_rank
        gc.collect()
        dist.destroy_process_group()


def _gradient_scaling_here(world_size: int) -> dict[str, Any]:
    """`gradient_scaling`'s ranks, forked from this process, which must not have run autograd."""
    from forge_course.reference.collectives import run_ranks

    # DDP's first construction imports torch._dynamo (hundreds of modules): import it once here,
    # before the fork, rather than once in every rank.
    importlib.import_module("torch._dynamo")
    with tempfile.TemporaryDirectory(prefix="forge-scaling-") as out_dir:
        args = (world_size, f"tcp://127.0.0.1:{free_port()}", out_dir)
        run = run_ranks(_scaling_rank, world_size, args, timeout_s=TIMEOUT_S)
        if not run["ok"]:
            why = next(iter(run["errors"].values()), "the ranks timed out")
            raise RuntimeError(f"gradient_scaling over {world_size} gloo ranks failed:\n{why}")
        return torch.load(Path(out_dir) / "scaling.pt", weights_only=True)


def gradient_scaling(world_size: int = 3) -> dict[str, Any]:
    """Where DDP divides by the world size: before the all-reduce, or after it?

    Each of ``world_size`` gloo ranks computes one backward pass on its own 4 examples twice,
    through DDP and through a plain copy of the model, then all-reduces the plain gradient three
    ways. With 2 ranks all three agree (halving is exact in binary floating point); with 3 only
    one of them matches DDP in every entry.

    The ranks are forked from a fresh interpreter (``python -m forge_course.reference.ddp
    --gradient-scaling N``), which imports torch once for all of them: a process that has run
    autograd or CUDA, such as a notebook's kernel, must not fork them itself.

    Returns:
        ``{"entries": n, "equal": {order: entries equal to DDP's gradient}}`` from rank 0.
    """
    command = [sys.executable, "-m", __name__, "--gradient-scaling", str(world_size)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S + 30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# Under torchrun, @record puts a failing rank's traceback into the launcher's error report.
@record
def main(argv: list[str] | None = None) -> int:
    """Under torchrun, be one rank; otherwise spawn the ranks. Print rank 0's summary as JSON."""
    parser = argparse.ArgumentParser(description="DDP on a tiny model, checked against 1 process.")
    parser.add_argument("--world-size", type=int, default=2, help="ranks to spawn (no torchrun)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--global-batch", type=int, default=GLOBAL_BATCH)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds")
    parser.add_argument("--fail-rank", type=int, default=None, help="make this rank raise")
    parser.add_argument(
        "--gradient-scaling", type=int, metavar="N", help="only run `gradient_scaling` on N ranks"
    )
    args = parser.parse_args(argv)
    if args.gradient_scaling:
        print(json.dumps(_gradient_scaling_here(args.gradient_scaling)))
        return 0
    run = (args.steps, args.global_batch, args.seed)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        summary = ddp_worker(rank, world_size, *run, "env://", args.timeout, args.fail_rank)
        if rank == 0:
            print(json.dumps(summary))
    else:
        result = run_demo(args.world_size, *run, args.timeout, args.fail_rank)
        summary = {key: value for key, value in result.items() if key != "weights"}
        print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
