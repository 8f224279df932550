"""Answers that chapter 11's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

RING_PLAIN_SUM = """
def ring_allreduce(buffers):
    total = [sum(column) for column in zip(*buffers)]
    return [list(total) for _ in buffers], []
"""

RING_NO_ALL_GATHER = """
def ring_allreduce(buffers):
    n, length = len(buffers), len(buffers[0])
    bounds = [k * (length // n) + min(k, length % n) for k in range(n + 1)]
    chunks = [[list(b[bounds[k]:bounds[k + 1]]) for k in range(n)] for b in buffers]
    sends = []
    for s in range(n - 1):
        step = [(r, (r + 1) % n, (r - s) % n) for r in range(n)]
        moving = [list(chunks[src][k]) for src, _, k in step]
        for (_, dst, k), values in zip(step, moving):
            chunks[dst][k] = [a + b for a, b in zip(chunks[dst][k], values)]
        sends.append(step)
    return [[x for c in w for x in c] for w in chunks], sends
"""

RING_GATHER_OFF_BY_ONE = """
def ring_allreduce(buffers):
    n, length = len(buffers), len(buffers[0])
    bounds = [k * (length // n) + min(k, length % n) for k in range(n + 1)]
    chunks = [[list(b[bounds[k]:bounds[k + 1]]) for k in range(n)] for b in buffers]
    sends = []
    for phase in ("reduce", "gather"):
        for s in range(n - 1):
            step = [(r, (r + 1) % n, (r - s) % n) for r in range(n)]
            moving = [list(chunks[src][k]) for src, _, k in step]
            for (_, dst, k), values in zip(step, moving):
                if phase == "reduce":
                    chunks[dst][k] = [a + b for a, b in zip(chunks[dst][k], values)]
                else:
                    chunks[dst][k] = values
            sends.append(step)
    return [[x for c in w for x in c] for w in chunks], sends
"""

RING_NUMPY = """
import numpy as np

def ring_allreduce(buffers):
    n = len(buffers)
    parts = [np.array_split(np.array(b, dtype=np.float64), n) for b in buffers]
    sends = []
    for step in range(2 * n - 2):
        gather = step >= n - 1
        s = step - (n - 1) if gather else step
        triples = [(r, (r + 1) % n, (r + gather - s) % n) for r in range(n)]
        snapshot = [parts[src][k].copy() for src, _, k in triples]
        for (src, dst, k), data in zip(triples, snapshot):
            parts[dst][k] = data if gather else parts[dst][k] + data
        sends.append(triples)
    return [np.concatenate(p) for p in parts], sends
"""

DDP_NOT_WRAPPED = """
def worker(rank, world_size, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        dataset = make_dataset()
        sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED_DDP)
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
        model = make_model()
        train(model, loader, torch.device("cpu"))
        torch.save(model.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
"""

DDP_NO_SAMPLER = """
def worker(rank, world_size, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        loader = DataLoader(make_dataset(), batch_size=GLOBAL_BATCH // world_size)
        model = DistributedDataParallel(make_model())
        train(model, loader, torch.device("cpu"))
        torch.save(model.module.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
"""

DDP_SAVES_WRAPPER = """
def worker(rank, world_size, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        dataset = make_dataset()
        sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED_DDP)
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
        model = DistributedDataParallel(make_model())
        train(model, loader, torch.device("cpu"))
        torch.save(model.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
"""

DDP_OWN_LOOP = """
from pathlib import Path

import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank, world_size, port, out_dir):
    dist.init_process_group(backend="gloo", init_method="tcp://127.0.0.1:%d" % port,
                            world_size=world_size, rank=rank)
    try:
        data = make_dataset()
        sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=SEED_DDP)
        sampler.set_epoch(0)
        batches = DataLoader(data, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
        net = DDP(make_model())
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        for inputs, targets in batches:
            opt.zero_grad()
            F.mse_loss(net(inputs), targets).backward()
            opt.step()
        weights = {name: value.clone() for name, value in net.module.state_dict().items()}
        torch.save(weights, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
"""

# The chapter's worker with one line changed, `{}` marking the line.
_DDP_WORKER = """
def worker(rank, world_size, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                            world_size=world_size)
    try:
        dataset = make_dataset()
        sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed={seed})
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
        model = DistributedDataParallel(make_model())
        train(model, loader, torch.device("cpu"))
        {save}torch.save(model.module.state_dict(), os.path.join(out_dir, f"rank{{rank}}.pt"))
    finally:
        {destroy}
"""
_RIGHT = {"seed": "SEED_DDP", "save": "", "destroy": "dist.destroy_process_group()"}

DDP_NO_DESTROY = _DDP_WORKER.format(**{**_RIGHT, "destroy": "pass"})
DDP_SAMPLER_SEEDED_BY_RANK = _DDP_WORKER.format(**{**_RIGHT, "seed": "rank"})
DDP_SAVES_ON_RANK_ZERO = _DDP_WORKER.format(**{**_RIGHT, "save": "if rank == 0:\n            "})

# No `try`: the group is destroyed when all goes well, and left behind when saving fails.
DDP_DESTROY_NOT_IN_FINALLY = """
def worker(rank, world_size, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED_DDP)
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
    model = DistributedDataParallel(make_model())
    train(model, loader, torch.device("cpu"))
    torch.save(model.module.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
"""

# A hand-written loop, `{}` marking what it does between backward() and step().
_HAND_WRITTEN_LOOP = """
def worker(rank, world_size, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                            world_size=world_size)
    try:
        dataset = make_dataset()
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                     seed=SEED_DDP)
        sampler.set_epoch(0)
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
        {model}
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            {reduce}
            opt.step()
        torch.save({inner}.state_dict(), os.path.join(out_dir, f"rank{{rank}}.pt"))
    finally:
        dist.destroy_process_group()
"""
_EACH_GRADIENT = "for p in model.parameters():\n                "

# DDP averaged the gradients already: dividing again makes every step world_size times smaller.
DDP_DIVIDES_AGAIN = _HAND_WRITTEN_LOOP.format(
    model="model = DistributedDataParallel(make_model())",
    reduce=_EACH_GRADIENT + "p.grad /= world_size",
    inner="model.module",
)
# all_reduce sums: without a division every step is world_size times bigger.
DDP_SUMS_GRADIENTS = _HAND_WRITTEN_LOOP.format(
    model="model = make_model()",
    reduce=_EACH_GRADIENT + "dist.all_reduce(p.grad)",
    inner="model",
)
# Averages the loss (a number for printing), while each rank steps with its own gradients.
DDP_AVERAGES_THE_LOSS = _HAND_WRITTEN_LOOP.format(
    model="model = make_model()", reduce="dist.all_reduce(loss.detach())", inner="model"
)
# Right averaging, but every rank starts from weights of its own: nothing ever copies rank 0's.
DDP_SEEDED_BY_RANK = _HAND_WRITTEN_LOOP.format(
    model="torch.manual_seed(rank)\n        "
    "model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))",
    reduce=_EACH_GRADIENT + "dist.all_reduce(p.grad)\n                p.grad /= world_size",
    inner="model",
)

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch11_ring_allreduce": [
        (RING_PLAIN_SUM, {"ch11_ring_allreduce_tests": "nothing was sent"}),
        (RING_NO_ALL_GATHER, {"ch11_ring_allreduce_tests": "the all-gather half is missing"}),
        (RING_GATHER_OFF_BY_ONE, {"ch11_ring_allreduce_tests": "the chunk it completed"}),
    ],
    "ch11_ddp_worker": [
        (DDP_NOT_WRAPPED, {"ch11_ddp_worker_tests": "nothing averages the gradients"}),
        (DDP_NO_SAMPLER, {"ch11_ddp_worker_tests": "every rank trained on the whole dataset"}),
        (DDP_SAVES_WRAPPER, {"ch11_ddp_worker_tests": "save model.module.state_dict()"}),
        (DDP_NO_DESTROY, {"ch11_ddp_worker_tests": "the process group was never destroyed"}),
        (DDP_DESTROY_NOT_IN_FINALLY, {"ch11_ddp_worker_tests": "only when everything goes well"}),
        (DDP_DIVIDES_AGAIN, {"ch11_ddp_worker_tests": "divided by world_size twice"}),
        (DDP_SUMS_GRADIENTS, {"ch11_ddp_worker_tests": "summed over the ranks, not averaged"}),
        (DDP_SAMPLER_SEEDED_BY_RANK, {"ch11_ddp_worker_tests": "was seeded with its rank"}),
        (DDP_SEEDED_BY_RANK, {"ch11_ddp_worker_tests": "started from different weights"}),
        (DDP_SAVES_ON_RANK_ZERO, {"ch11_ddp_worker_tests": "only rank 0 saved its weights"}),
        (DDP_AVERAGES_THE_LOSS, {"ch11_ddp_worker_tests": "averaged their losses"}),
    ],
    "ch11_questions": [
        (
            "ring_steps = 3\nring_megabytes = 75\ndataparallel_answer = 'a'\n",
            {
                "ch11_q_ring_steps": "reduce-scatter alone",
                "ch11_q_ring_megabytes": "the all-gather sends as much again",
                "ch11_q_dataparallel": "uses every visible GPU",
            },
        ),
        (
            "ring_steps = 8\nring_megabytes = 300\ndataparallel_answer = 'c'\n",
            {
                "ch11_q_ring_steps": "not 2N",
                "ch11_q_ring_megabytes": "naive all-reduce",
                "ch11_q_dataparallel": "the difference is overhead",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch11_ring_allreduce": RING_NUMPY,
    "ch11_ddp_worker": DDP_OWN_LOOP,
    "ch11_questions": "ring_steps = 6.0\nring_megabytes = 150.0\ndataparallel_answer = ' B '\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch11_ring_allreduce": "from forge_course.reference.collectives import ring_allreduce\n",
    "ch11_ddp_worker": (
        "from forge_course.reference import collectives\n\n"
        "def worker(rank, world_size, port, out_dir):\n"
        "    collectives.ddp_rank_worker(rank, world_size, port, out_dir)\n"
    ),
}
