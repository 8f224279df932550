"""DDP in practice: accumulation, checkpoints, evaluation and a restart, on real gloo ranks.

Four habits a real data-parallel run needs, each shown on the tiny run of
`forge_course.reference.ddp` and checked against the arithmetic it must reproduce:

* `accumulate`: ``k`` micro-batches per optimizer step under ``model.no_sync()``, so that only
  the last backward all-reduces; a comm hook counts the all-reduces, ``k`` without ``no_sync``
  and 1 with it, and the accumulated gradients of both ways are compared.
* `checkpoint_on_rank0`: rank 0 alone writes the weights of the model *inside* the wrapper,
  ``ddp.module.state_dict()``, then ``dist.barrier()``, then every rank loads that file with
  ``map_location``; ``ddp.state_dict()`` names every key ``module.…``, which a bare model refuses.
* `evaluate_without_duplicates`: `DistributedSampler` pads the data to a multiple of the world
  size by repeating examples; summing per-rank results counts those twice. Masking the padded
  positions, or gathering ``(index, value)`` pairs and keeping each index once, gives the
  single process's accuracy exactly, and its mean loss up to how a float32 example's loss
  depends on the batch it was computed in.
* `resumable_training`: a run that saves a checkpoint after every step (rank 0, barrier) and,
  started again by ``torchrun --max-restarts``, resumes from the newest one. Rank 1 crashes after
  a given step on the first attempt only (torchrun counts attempts in
  ``TORCHELASTIC_RESTART_COUNT``); the restarted run ends with the same bits as one that never
  crashed.

Run them all in one launch, with the DDP demo of `forge_course.reference.ddp` and FSDP2 from
`forge_course.reference.fsdp` on the first attempt (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``:
without it a restarted gloo group of torch 2.13 failed to connect, or hung, in every try)::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc_per_node=2 \\
        --max-restarts=1 -m forge_course.reference.ddp_practice --out-dir /tmp/practice

Rank 0 writes ``practice.json`` (first attempt) and ``resume.json`` (the attempt that finishes).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from forge_course.reference.checkpoint import (
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from forge_course.reference.ddp import (
    GLOBAL_BATCH,
    LR,
    SEED,
    ddp_worker,
    make_dataset,
    make_model,
    train,
)

__all__ = [
    "accumulate",
    "checkpoint_on_rank0",
    "evaluate_without_duplicates",
    "padded_positions",
    "resumable_training",
]

TIMEOUT_S = 30  # seconds a collective waits for a peer before failing instead of hanging
EVAL_EXAMPLES = 11  # an odd number: 2 ranks cannot split it without padding
EPOCHS, STEPS_PER_EPOCH = 3, 2  # the resumable run: 6 optimizer steps
CRASH_AFTER_STEPS = 4  # rank 1 crashes once this many steps are done, on the first attempt


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _identical_across_ranks(flat: torch.Tensor) -> bool:
    """True on every rank when every rank holds the same bits (elementwise max == min)."""
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return torch.equal(high, low)


# ------------------------------------------------------------------ 1. accumulation, no_sync


def accumulate(rank: int, world_size: int, micro_batches: int = 4) -> dict[str, Any]:
    """One optimizer step's gradient from ``micro_batches`` micro-batches per rank, two ways.

    Each rank takes its shard of one global batch of `GLOBAL_BATCH` examples and cuts it into
    ``micro_batches`` equal micro-batches; each micro-batch's loss is divided by their number,
    so the accumulated gradient is the gradient of the mean over the shard. "synced" runs every
    backward normally (an all-reduce each time); "no_sync" runs all but the last backward
    inside ``model.no_sync()``, which only adds to ``.grad`` locally, so one all-reduce of the
    accumulated gradient ends the step.

    Returns:
        ``{"all_reduces": {way: count}, "max_abs_diff": between the two ways' gradients,
        "max_abs_diff_whole_batch": of "no_sync" from one process on the whole batch,
        "ranks_identical": of "no_sync"'s gradients}``, the same on every rank.
    """
    x, y = make_dataset(steps=1).tensors
    shard_x, shard_y = x[rank::world_size], y[rank::world_size]
    if len(shard_x) % micro_batches:
        raise ValueError(f"{len(shard_x)} examples per rank do not split in {micro_batches}")
    counts, grads = {}, {}
    for way in ("synced", "no_sync"):
        model = DistributedDataParallel(make_model())
        calls = [0]

        def counting_allreduce(state, bucket, calls=calls):
            calls[0] += 1  # one call per bucket per synced backward; this model fits one bucket
            return default_hooks.allreduce_hook(state, bucket)  # divide by W, then sum

        model.register_comm_hook(None, counting_allreduce)
        parts = zip(shard_x.chunk(micro_batches), shard_y.chunk(micro_batches), strict=True)
        for i, (xb, yb) in enumerate(parts):
            last = i == micro_batches - 1
            skip = way == "no_sync" and not last
            with model.no_sync() if skip else contextlib.nullcontext():
                (nn.functional.mse_loss(model(xb), yb) / micro_batches).backward()
        counts[way], grads[way] = calls[0], _flat(p.grad for p in model.module.parameters())
    whole = make_model()
    nn.functional.mse_loss(whole(x), y).backward()
    return {
        "micro_batches": micro_batches,
        "all_reduces": counts,
        "largest_gradient": grads["no_sync"].abs().max().item(),
        "max_abs_diff": (grads["synced"] - grads["no_sync"]).abs().max().item(),
        "max_abs_diff_whole_batch": (
            (_flat(p.grad for p in whole.parameters()) - grads["no_sync"]).abs().max().item()
        ),
        "ranks_identical": _identical_across_ranks(grads["no_sync"]),
    }


# ------------------------------------------------------------------ 2. checkpoints on rank 0


def checkpoint_on_rank0(rank: int, world_size: int, folder: str | os.PathLike) -> dict[str, Any]:
    """Train, save on rank 0 only, wait at a barrier, load on every rank into a fresh model.

    Every rank's fresh model starts from different weights (seed ``100 + rank``), so identical
    weights after the load can only come from the file.

    Returns:
        ``{"ddp_keys", "module_keys": the first two keys of each state_dict, "bare_load_error":
        the first line of the error a bare model raises on ``ddp.state_dict()``,
        "prefix_stripped_loads": whether that dict loads once ``module.`` is stripped,
        "identical_before_load", "identical_after_load", "equal_to_trained"}``.
    """
    path = Path(folder) / "weights.pt"
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED)
    ddp = DistributedDataParallel(make_model())
    train(ddp, DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler), "cpu")
    if rank == 0:
        torch.save(ddp.module.state_dict(), path)  # the bare model's keys: "0.weight", …
    dist.barrier()  # no rank reads the file before rank 0 has written it

    fresh = make_model(seed=100 + rank)
    before = _identical_across_ranks(_flat(fresh.parameters()))
    wrapped_state = ddp.state_dict()  # "module.0.weight", …: what a bare model cannot load
    try:
        fresh.load_state_dict(wrapped_state)
        bare_load_error = None
    except RuntimeError as error:
        # torch's first line only names the class; the second says which keys went wrong.
        bare_load_error = str(error).splitlines()[1].strip()[:90]
    stripped = dict(wrapped_state)
    consume_prefix_in_state_dict_if_present(stripped, "module.")
    prefix_stripped_loads = set(stripped) == set(fresh.state_dict())
    # map_location: a file saved from cuda:0 would otherwise load onto cuda:0 on every rank.
    fresh.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    after = _flat(fresh.parameters())
    result = {
        "ddp_keys": list(wrapped_state)[:2],
        "module_keys": list(ddp.module.state_dict())[:2],
        "bare_load_error": bare_load_error,
        "prefix_stripped_loads": prefix_stripped_loads,
        "identical_before_load": before,
        "identical_after_load": _identical_across_ranks(after),
        "equal_to_trained": torch.equal(after, _flat(ddp.module.parameters())),
    }
    return result


# ------------------------------------------------------------------ 3. evaluation, exact


def padded_positions(n: int, world_size: int, rank: int) -> torch.Tensor:
    """Which of this rank's `DistributedSampler` positions (``drop_last=False``) are padding.

    Rank ``r``'s ``p``-th example sits at position ``r + p·W`` of the padded order; positions
    ``n`` and beyond repeat the first examples to make the length a multiple of ``W``.
    """
    per_rank = -(-n // world_size)  # ceil: the sampler's len() on every rank
    return rank + world_size * torch.arange(per_rank) >= n


def _eval_data(n: int) -> tuple[TensorDataset, nn.Module]:
    generator = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, 4, generator=generator)
    labels = torch.randint(0, 3, (n,), generator=generator)
    classifier = nn.Linear(4, 3)  # 3 classes, weights drawn from the same generator
    with torch.no_grad():
        classifier.weight.copy_(torch.randn(3, 4, generator=generator))
        classifier.bias.zero_()
    return TensorDataset(x, labels, torch.arange(n)), classifier


def evaluate_without_duplicates(
    rank: int, world_size: int, n: int = EVAL_EXAMPLES, batch_size: int = 4
) -> dict[str, Any]:
    """Accuracy and mean cross-entropy of a fixed classifier on ``n`` examples, four ways.

    "single process" evaluates all ``n`` examples in this process (every rank does the same).
    "naive" all-reduces each rank's sums and counts over the `DistributedSampler`'s padded
    shard: the repeated examples count twice. "masked" drops the padded positions before
    summing (`padded_positions`). "gathered" all-gathers every rank's ``(index, loss,
    correct)`` rows and keeps each index once, in index order, then reduces exactly as the
    single process does.

    Both fixes count every example once, so their accuracy is the single process's exactly.
    Their mean loss can differ in the last bits: a float32 example's loss depends slightly on
    the shape of the batch it was computed in (``per_example_max_diff``).
    """
    dataset, classifier = _eval_data(n)
    x, labels, _ = dataset.tensors
    with torch.no_grad():
        losses = nn.functional.cross_entropy(classifier(x), labels, reduction="none")
        correct = (classifier(x).argmax(1) == labels).double()
    # Metric sums in float64, so that adding them up in another order changes nothing visible.
    single = {
        "examples": n,
        "accuracy": correct.mean().item(),
        "loss": losses.double().mean().item(),
    }

    sampler = DistributedSampler(dataset, world_size, rank, shuffle=False)
    rows = []
    with torch.no_grad():
        for xb, yb, index in DataLoader(dataset, batch_size=batch_size, sampler=sampler):
            logits = classifier(xb)
            loss = nn.functional.cross_entropy(logits, yb, reduction="none")
            rows.append(torch.stack([index.double(), loss.double(), (logits.argmax(1) == yb)]))
    mine = torch.cat(rows, dim=1)  # 3 × (n / W rounded up): index, loss, correct
    keep = ~padded_positions(n, world_size, rank)

    def all_reduced(columns: torch.Tensor) -> dict[str, float]:
        totals = torch.stack([columns[1].sum(), columns[2].sum(), columns[0].new_tensor(0)])
        totals[2] = columns.shape[1]  # examples counted, padding included
        dist.all_reduce(totals)
        loss_sum, right, count = totals.tolist()
        return {"examples": int(count), "accuracy": right / count, "loss": loss_sum / count}

    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    table = torch.cat(everyone, dim=1)
    seen = torch.zeros(n, dtype=torch.bool)
    first = []
    for column, index in enumerate(table[0].long().tolist()):
        if not seen[index]:
            seen[index] = True
            first.append(column)
    table = table[:, first]
    table = table[:, table[0].argsort()]
    return {
        "padded_to": len(sampler) * world_size,
        # The same example's float32 loss from a batch of 4 and from the batch of all n: the
        # matrix product's kernel depends on the batch's shape, and so can the last bit.
        "per_example_max_diff": (table[1] - losses.double()).abs().max().item(),
        "single process": single,
        "naive": all_reduced(mine),
        "masked": all_reduced(mine[:, keep]),
        "gathered": {
            "examples": table.shape[1],
            "accuracy": table[2].mean().item(),
            "loss": table[1].mean().item(),
        },
    }


# ------------------------------------------------------------------ 4. crash and resume


def resumable_training(
    rank: int,
    world_size: int,
    folder: str | os.PathLike,
    crash_after_steps: int | None = None,
    epochs: int = EPOCHS,
    steps_per_epoch: int = STEPS_PER_EPOCH,
) -> dict[str, Any]:
    """Train ``epochs × steps_per_epoch`` DDP steps, checkpointing after each; resume if any.

    A checkpoint (`forge_course.reference.checkpoint.save_checkpoint`: weights of
    ``ddp.module``, the optimizer's momentum, the step) is written by rank 0 after every step,
    followed by a barrier. On start every rank loads the newest one, if there is one, and skips
    the batches its steps covered; the sampler's order depends only on ``seed + epoch``, so the
    remaining batches are the ones the first run would have seen. Rank 1 raises once
    ``crash_after_steps`` steps are done (and saved), if it is given.

    Returns:
        ``{"resumed_from_step", "steps", "weights": bare state_dict on the CPU,
        "ranks_identical"}``.
    """
    folder = Path(folder)
    dataset = make_dataset(steps=steps_per_epoch)
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED)
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    newest = latest_checkpoint(folder) if folder.exists() else None
    step = 0
    if newest is not None:
        step = load_checkpoint(newest, model.module, optimizer, map_location="cpu")["step"]
    resumed_from = step
    model.train()
    for epoch in range(step // steps_per_epoch, epochs):
        sampler.set_epoch(epoch)
        for batch, (x, y) in enumerate(loader):
            if epoch * steps_per_epoch + batch < step:
                continue  # done before the restart
            if step == crash_after_steps and rank == 1:
                raise RuntimeError(f"rank 1 crashes on purpose after step {step}")
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            step += 1
            if rank == 0:
                save_checkpoint(checkpoint_path(folder, step), model.module, optimizer, step=step)
            dist.barrier()  # the file is complete before any rank moves on (or crashes)
    weights = {name: value.detach().clone() for name, value in model.module.state_dict().items()}
    result = {
        "resumed_from_step": resumed_from,
        "steps": step,
        "weights": weights,
        "ranks_identical": _identical_across_ranks(_flat(weights.values())),
    }
    return result


# ------------------------------------------------------------------ the launch


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


@record
def main(argv: list[str] | None = None) -> int:
    """One rank of the whole demonstration, under torchrun (see the module docstring)."""
    parser = argparse.ArgumentParser(description="DDP in practice, on gloo ranks.")
    parser.add_argument("--out-dir", required=True, help="folder for results and checkpoints")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--eval-examples", type=int, default=EVAL_EXAMPLES)
    parser.add_argument("--crash-after-steps", type=int, default=CRASH_AFTER_STEPS)
    parser.add_argument("--no-fsdp", action="store_true", help="skip the FSDP2 part")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)  # tiny tensors: threads would only contend for the CPU
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    try:
        if attempt == 0:
            parts = {
                "ddp": lambda: ddp_worker(rank, world_size, timeout_s=TIMEOUT_S),
                "accumulate": lambda: accumulate(rank, world_size, args.micro_batches),
                "checkpoint": lambda: checkpoint_on_rank0(rank, world_size, out),
                "evaluate": lambda: evaluate_without_duplicates(
                    rank, world_size, args.eval_examples
                ),
            }
            if not args.no_fsdp:
                from forge_course.reference.fsdp import fsdp_demo

                parts["fsdp"] = lambda: fsdp_demo(rank, world_size, out / "dcp")
            practice = {"world_size": world_size, "seconds": {}}
            for name, part in parts.items():
                start = time.perf_counter()
                practice[name] = part()
                practice["seconds"][name] = round(time.perf_counter() - start, 3)
            uncrashed = resumable_training(rank, world_size, out / "uncrashed")["weights"]
            if rank == 0:
                torch.save(uncrashed, out / "uncrashed.pt")
                _write_json(out / "practice.json", practice)
            dist.barrier()
        crash = args.crash_after_steps if attempt == 0 else None
        run = resumable_training(rank, world_size, out / "resumable", crash_after_steps=crash)
        if rank == 0:
            uncrashed = torch.load(out / "uncrashed.pt", weights_only=True)
            equal = all(torch.equal(run["weights"][k], uncrashed[k]) for k in uncrashed)
            summary = {
                "attempt": attempt,
                "resumed_from_step": run["resumed_from_step"],
                "steps": run["steps"],
                "ranks_identical": run["ranks_identical"],
                "equal_to_uncrashed": equal,
                "checkpoints": sorted(p.name for p in (out / "resumable").glob("step-*.pt")),
            }
            _write_json(out / "resume.json", summary)
        dist.barrier()
    finally:
        # A DDP model's reducer holds the process group: every model (cycles included) must be
        # freed before the group is destroyed, or gloo can abort at exit.
        gc.collect()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
