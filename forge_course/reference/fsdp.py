"""FSDP2 on gloo ranks: every rank keeps a shard of each parameter, and saves only that shard.

``fully_shard(module, mesh=mesh)`` (torch.distributed.fsdp, "FSDP2") replaces each parameter of
``module`` by a DTensor that is sharded on its first dimension: rank ``r`` keeps rows
``r·⌈d/W⌉ … (r + 1)·⌈d/W⌉`` (as `torch.chunk` cuts) and nothing else. Before a module's
forward and again before its backward the ranks all-gather its full weights, and throw them away
after; after backward they reduce-scatter the gradients, so each rank ends with the gradient of
its own rows, averaged over the ranks, and its optimizer updates only those rows. That is ZeRO
stage 3: weights, gradients and optimizer state all divided by the world size
(`forge_course.reference.collectives.memory_per_rank(…, stage=3)`).

A sharded checkpoint (torch.distributed.checkpoint, "DCP") keeps the sharding on disk: every
rank writes its own rows to its own file, plus one ``.metadata`` file that says where each
piece of each tensor lives, so a save never gathers the whole model on one rank, and the load
can even use another number of ranks.

`fsdp_demo` runs on the CPU with the gloo backend (torch 2.13): the run of
`forge_course.reference.ddp`, sharded, compared with DDP on the same ranks.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from forge_course.reference.ddp import GLOBAL_BATCH, LR, SEED, make_dataset, make_model

__all__ = ["fsdp_demo", "shard_model", "train_with"]


def shard_model(model: nn.Module, mesh) -> nn.Module:
    """``fully_shard`` each linear layer, then the whole model, as FSDP2's examples do.

    Each call makes one unit whose weights are all-gathered together: per layer here, so only
    one layer's full weights exist at a time; the outer call takes whatever is left (nothing in
    this model) and lets the model be used as usual.
    """
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train_with(model: nn.Module, optimizer, loader: DataLoader) -> None:
    """The loop of `forge_course.reference.ddp.train`, with the optimizer passed in."""
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a plain tensor is all local)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)


def _run(rank: int, world_size: int, model: nn.Module):
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED)
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    train_with(model, optimizer, loader)
    return optimizer


def fsdp_demo(rank: int, world_size: int, folder: str | os.PathLike) -> dict[str, Any]:
    """Train the DDP demo's run sharded with FSDP2; measure, save with DCP, load, compare.

    Returns (rank 0's view, with every rank's measurements gathered):
        ``shapes``: each parameter's full and local shape on rank 0; ``bytes``: per rank, the
        bytes of weights, gradients and momentum it holds after training; ``n_params``;
        ``max_abs_diff_ddp``: the full weights against DDP's on the same ranks;
        ``files``: the checkpoint's files and sizes, ``entries``: the names of what each file
        holds, ``chunks_of_0.weight``: the rows of each piece; ``loaded_equal``: a fresh
        sharded model and optimizer loaded from it hold every rank's shards bit for bit.
    """
    folder = Path(folder)
    mesh = init_device_mesh("cpu", (world_size,))
    model = shard_model(make_model(), mesh)
    shapes = {name: [list(p.shape), list(_local(p).shape)] for name, p in model.named_parameters()}
    inside_forward = []  # the first layer's weight shape while its forward runs
    hook = model[0].register_forward_hook(
        lambda layer, args, output: inside_forward.append(list(layer.weight.shape))
    )
    optimizer = _run(rank, world_size, model)
    hook.remove()
    momentum = [state["momentum_buffer"] for state in optimizer.state.values()]
    held = {
        "weights": _bytes(model.parameters()),
        "grads": _bytes(p.grad for p in model.parameters()),
        "momentum": _bytes(momentum),
    }
    every_rank = [None] * world_size
    dist.all_gather_object(every_rank, held)
    full = {name: p.full_tensor() for name, p in model.named_parameters()}  # an all-gather

    ddp = DistributedDataParallel(make_model())
    _run(rank, world_size, ddp)
    diff = max((full[name] - p).abs().max().item() for name, p in ddp.module.named_parameters())
    del ddp
    gc.collect()

    model_state, optim_state = get_state_dict(model, optimizer)  # sharded: DTensors
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
    dist.barrier()
    files = {path.name: path.stat().st_size for path in sorted(folder.iterdir())}
    # The metadata file says which rows of each tensor are where: one chunk per rank.
    metadata = dcp.FileSystemReader(folder).read_metadata()
    chunks = [
        {"offsets": list(chunk.offsets), "sizes": list(chunk.sizes)}
        for chunk in metadata.state_dict_metadata["model.0.weight"].chunks
    ]
    # Which file holds what: each rank's rows, and every replicated value once, in one file.
    entries: dict[str, list[str]] = {}
    for index, where in metadata.storage_data.items():
        entries.setdefault(where.relative_path, []).append(index.fqn)

    fresh = shard_model(make_model(seed=100 + rank), mesh)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=LR, momentum=0.9)
    fresh_model_state, fresh_optim_state = get_state_dict(fresh, fresh_optimizer)
    loaded = {"model": fresh_model_state, "optim": fresh_optim_state}
    dcp.load(loaded, checkpoint_id=folder)  # in place, each rank reading its own rows
    set_state_dict(
        fresh, fresh_optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"]
    )
    same = all(
        torch.equal(_local(a), _local(b)) for a, b in zip(model.parameters(), fresh.parameters())
    )
    same_momentum = all(
        torch.equal(_local(fresh_optimizer.state[q]["momentum_buffer"]), _local(m))
        for q, m in zip(fresh.parameters(), momentum)
    )
    flags = torch.tensor([float(same and same_momentum)])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    return {
        "shapes": shapes,
        "inside_forward": inside_forward[0],
        "after_forward": list(_local(model[0].weight).shape),
        "bytes": every_rank,
        "n_params": sum(p.numel() for p in model.parameters()),
        "max_abs_diff_ddp": diff,
        "files": files,
        "chunks_of_0.weight": chunks,
        "entries": {name: sorted(fqns) for name, fqns in sorted(entries.items())},
        "loaded_equal": bool(flags.item()),
    }
