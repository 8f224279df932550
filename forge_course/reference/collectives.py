"""Collectives by hand: ring all-reduce in plain Python, its cost, and ZeRO memory per rank.

Ring all-reduce (what NCCL and gloo use for large buffers): N workers stand in a ring and each
cuts its buffer into N chunks, chunk k holding elements ``bounds[k]:bounds[k + 1]`` (the first
``L % N`` chunks one element longer, as `numpy.array_split` cuts).

* **Reduce-scatter**, steps 0 … N−2: at step s, worker r sends chunk ``(r − s) mod N`` to worker
  ``(r + 1) mod N``, which adds it to its own copy of that chunk. After N−1 steps worker r holds
  the complete sum of chunk ``(r + 1) mod N``.
* **All-gather**, steps N−1 … 2N−3: at all-gather step s (counted from 0), worker r sends chunk
  ``(r + 1 − s) mod N`` (complete) to worker ``(r + 1) mod N``, which overwrites its copy.

Every step, every worker sends one chunk (about S/N bytes) and receives one: 2(N−1) steps and
2(N−1)/N·S bytes sent per worker, almost independent of N. That is why the ring scales.

`run_ranks` starts real processes (one per rank) in bounded time, so the ring can be checked
against `torch.distributed.all_reduce` without ever hanging the notebook. (Chapter 11's check
starts a learner's DDP worker differently, in fresh processes: see `forge_course.observe.ch11`.)
"""

from __future__ import annotations

import dis
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from forge_course.ports import free_port
from forge_course.reference.guard import reference

__all__ = [
    "STAGES",
    "chunk_bounds",
    "ddp_rank_worker",
    "gloo_all_reduce",
    "memory_per_rank",
    "ring_allreduce",
    "ring_allreduce_trace",
    "ring_traffic",
    "run_ranks",
]


def chunk_bounds(length: int, n: int) -> list[int]:
    """The n + 1 cut points of a buffer of ``length`` elements into n chunks, as array_split."""
    base, extra = divmod(length, n)
    bounds = [0]
    for k in range(n):
        bounds.append(bounds[-1] + base + (1 if k < extra else 0))
    return bounds


@reference
def ring_allreduce_trace(buffers: list[list[float]]) -> list[dict]:
    """Every state of a ring all-reduce: the start, then one state after each of the 2(N−1) steps.

    Args:
        buffers: N lists of L floats, worker r's gradient buffer at ``buffers[r]``.

    Returns:
        A list of 2N − 1 states, each a dict with ``step`` (0 = before any), ``phase``
        (``"start"``, ``"reduce-scatter"`` or ``"all-gather"``), ``sends`` (the step's
        ``(src, dst, chunk)`` triples, by src), ``chunks`` (worker → chunk → list of floats)
        and ``ranks`` (worker → chunk → sorted ranks whose values that chunk now sums).
    """
    n = len(buffers)
    bounds = chunk_bounds(len(buffers[0]), n)
    chunks = [[list(buf[bounds[k] : bounds[k + 1]]) for k in range(n)] for buf in buffers]
    ranks = [[[r] for _ in range(n)] for r in range(n)]

    def snapshot(step, phase, sends):
        return {
            "step": step,
            "phase": phase,
            "sends": sends,
            "chunks": [[list(c) for c in worker] for worker in chunks],
            "ranks": [[list(c) for c in worker] for worker in ranks],
        }

    states = [snapshot(0, "start", [])]
    for step in range(2 * (n - 1)):
        reducing = step < n - 1
        s = step if reducing else step - (n - 1)
        offset = 0 if reducing else 1
        sends = [(r, (r + 1) % n, (r + offset - s) % n) for r in range(n)]
        # All sends of a step happen at once: read every outgoing chunk before any is written.
        outgoing = [(list(chunks[src][k]), list(ranks[src][k])) for src, _, k in sends]
        for (_, dst, k), (values, who) in zip(sends, outgoing):
            if reducing:
                chunks[dst][k] = [mine + theirs for mine, theirs in zip(chunks[dst][k], values)]
                ranks[dst][k] = sorted(ranks[dst][k] + who)
            else:
                chunks[dst][k], ranks[dst][k] = values, who
        states.append(snapshot(step + 1, "reduce-scatter" if reducing else "all-gather", sends))
    return states


@reference
def ring_allreduce(buffers: list[list[float]]) -> tuple[list[list[float]], list[list[tuple]]]:
    """All-reduce (sum) ``buffers`` around a ring, as the module docstring describes.

    Returns:
        ``(results, sends)``: ``results[r]`` is worker r's buffer afterwards (the elementwise sum
        over all workers, L floats); ``sends[step]`` lists that step's ``(src, dst, chunk)``
        triples ordered by src, 2(N−1) steps in all.
    """
    states = ring_allreduce_trace(buffers)
    results = [[x for chunk in worker for x in chunk] for worker in states[-1]["chunks"]]
    return results, [state["sends"] for state in states[1:]]


def ring_traffic(n: int, size: float) -> tuple[int, float]:
    """Steps and amount sent per worker for a ring all-reduce of ``size`` (any unit) over n."""
    return 2 * (n - 1), 2 * (n - 1) / n * size


# What each stage shards across ranks (the rest every rank keeps whole).
STAGES = {
    0: "DDP: nothing sharded",
    1: "ZeRO-1: optimizer state sharded",
    2: "ZeRO-2: + gradients sharded",
    3: "ZeRO-3 / FSDP: + parameters sharded",
}


def memory_per_rank(
    params: float,
    ranks: int,
    stage: int,
    bytes_param: float = 4,
    bytes_grad: float = 4,
    bytes_optimizer: float = 8,
) -> dict[str, float]:
    """Bytes each rank holds for parameters, gradients and optimizer state (no activations).

    Defaults are fp32 training with Adam: 4 bytes per weight, 4 per gradient, 8 for Adam's two
    moments. Stage 1 divides the optimizer state by ``ranks``, stage 2 the gradients too, and
    stage 3 (FSDP's full sharding) the parameters as well.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {list(STAGES)}, not {stage}")
    share = {
        "params": params * bytes_param / (ranks if stage >= 3 else 1),
        "grads": params * bytes_grad / (ranks if stage >= 2 else 1),
        "optimizer": params * bytes_optimizer / (ranks if stage >= 1 else 1),
    }
    return {**share, "total": share["params"] + share["grads"] + share["optimizer"]}


# ---------------------------------------------------------------- real processes, bounded


_RETURNS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}


def _rank_main(fn: Callable, rank: int, args: tuple, out_dir: str, done) -> None:
    # Own process group: the parent can kill this rank and anything it started in one call.
    if hasattr(os, "setpgrp"):  # not on Windows, where the rank alone is killed
        os.setpgrp()
    # A forked child must not enter the parent's OpenMP pool; one thread per rank is plenty.
    torch.set_num_threads(1)

    def finish(code: int, error: tuple | None = None) -> None:
        if error is not None:
            trace = "".join(traceback.format_exception(*error))
            Path(out_dir, f"error{rank}.txt").write_text(trace)
        if code == 0:  # stay until every rank is through, so no peer vanishes mid-collective
            with suppress(threading.BrokenBarrierError):
                done.wait(timeout=10)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no interpreter teardown: nothing left to wait for

    # When fn is done, leave before its locals are freed: a DDP model freed after its process
    # group was destroyed can block forever in its destructor (about 1 run in 20 here).
    code_object, raised = getattr(fn, "__code__", None), []

    def in_fn(frame, event, arg):
        if event == "exception":
            raised.append(arg)
        elif event == "return":
            if frame.f_code.co_code[frame.f_lasti] in _RETURNS:
                finish(0)
            finish(1, raised[-1] if raised else None)
        return in_fn

    sys.settrace(lambda frame, event, arg: in_fn if frame.f_code is code_object else None)
    try:
        fn(rank, *args)
    except BaseException:  # noqa: BLE001  (anything, SystemExit included, is this rank failing)
        finish(1, sys.exc_info())
    finish(0)


# Fork where it is safe (Linux); elsewhere spawn, which imports ``fn`` by name in each rank.
FORK_RANKS = sys.platform.startswith("linux")


def run_ranks(
    fn: Callable,
    world_size: int,
    args: tuple = (),
    timeout_s: float = 60.0,
) -> dict:
    """Run ``fn(rank, *args)`` in ``world_size`` processes; never longer than ``timeout_s``.

    On Linux the ranks are forked, so nothing is pickled; elsewhere they are spawned, so ``fn``
    must be importable (a module's function, as every caller in the course passes). Forking
    means that if the calling process has run autograd or CUDA, ``fn`` must use neither:
    a child forked after either has started in the parent cannot use it (`gloo_all_reduce` needs
    neither; `forge_course.reference.ddp.gradient_scaling` forks its DDP ranks from a fresh
    interpreter that has run neither). Every rank is killed, with
    whatever it started, when the time is up or when one rank fails and the others outlive it by
    a few seconds.

    Returns:
        ``{"ok", "seconds", "exitcodes", "errors", "timed_out"}``: ``errors`` maps a failed rank
        to its traceback; ``timed_out`` is True when the ranks had to be killed.
    """
    context = mp.get_context("fork" if FORK_RANKS else "spawn")
    start = time.monotonic()
    done = context.Barrier(world_size)
    with tempfile.TemporaryDirectory(prefix="forge-ranks-") as out_dir:
        procs = [
            context.Process(
                target=_rank_main,
                args=(fn, rank, args, out_dir, done),
                daemon=False,
            )
            for rank in range(world_size)
        ]
        for proc in procs:
            proc.start()
        deadline, timed_out = start + timeout_s, False
        try:
            while any(p.is_alive() for p in procs):
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                failed = any(p.exitcode not in (None, 0) for p in procs)
                if failed:  # the peers get a moment to fail on their own, then they go
                    deadline = min(deadline, time.monotonic() + 5)
                time.sleep(0.02)
        finally:
            for proc in procs:
                if proc.is_alive() and hasattr(os, "killpg"):
                    with suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.kill()  # in case it was stopped before it made its own group
                proc.join()
        errors = {
            rank: Path(out_dir, f"error{rank}.txt").read_text()
            for rank in range(world_size)
            if Path(out_dir, f"error{rank}.txt").exists()
        }
    exitcodes = [proc.exitcode for proc in procs]
    return {
        "ok": not timed_out and not errors and all(code == 0 for code in exitcodes),
        "seconds": time.monotonic() - start,
        "exitcodes": exitcodes,
        "errors": errors,
        "timed_out": timed_out,
    }


def _all_reduce_rank(rank: int, buffers: list, port: int, out_dir: str, timeout_s: float) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=len(buffers),
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        tensor = torch.tensor(buffers[rank], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        torch.save(tensor, Path(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def gloo_all_reduce(buffers: list[list[float]], timeout_s: float = 60.0) -> list[list[float]]:
    """Each rank's buffer after a real ``torch.distributed.all_reduce`` (sum, gloo, float64)."""
    with tempfile.TemporaryDirectory(prefix="forge-allreduce-") as out_dir:
        args = (buffers, free_port(), out_dir, timeout_s)
        run = run_ranks(_all_reduce_rank, len(buffers), args, timeout_s)
        if not run["ok"]:
            why = next(iter(run["errors"].values()), "the ranks timed out")
            raise RuntimeError(f"all_reduce over {len(buffers)} gloo processes failed:\n{why}")
        return [
            torch.load(Path(out_dir, f"rank{rank}.pt"), weights_only=True).tolist()
            for rank in range(len(buffers))
        ]


@reference
def ddp_rank_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """One DDP rank of `forge_course.reference.ddp`'s run, saving its final weights to a file.

    Joins a gloo group at ``tcp://127.0.0.1:{port}``, trains ``DDP(make_model())`` with `train`
    on its `DistributedSampler` shard (``GLOBAL_BATCH // world_size`` examples per step) of
    ``make_dataset()``, saves ``model.module.state_dict()`` to ``out_dir/rank{rank}.pt`` and
    destroys the group, even when training fails.
    """
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from forge_course.reference.ddp import GLOBAL_BATCH, SEED, make_dataset, make_model, train

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        dataset = make_dataset()
        sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED)
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
        model = DistributedDataParallel(make_model())
        train(model, loader, torch.device("cpu"))
        torch.save(model.module.state_dict(), Path(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
