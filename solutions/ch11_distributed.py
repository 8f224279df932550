# %% [markdown]
# # Chapter 11 · Distributed training
#
# With one device, a step is limited by what that device can compute and hold. Data
# parallelism runs the same training loop in several processes at once, one per device, each
# on its own slice of the batch, and makes them end every step with the same weights. This
# chapter shows the one collective that makes that work, all-reduce, by hand and in a
# simulation; then launches real processes on this CPU and checks that two of them end where
# one process on the whole batch ends, and that what a real run adds (accumulation,
# checkpoints, evaluation, a restart after a crash, FSDP2's sharding) keeps them right.
#
# **By the end of this chapter you can:**
#
# 1. explain why averaging the gradients of equal shards gives the gradient of the whole batch,
#    and what `DistributedSampler` and `set_epoch` have to do with it;
# 2. count the steps and bytes of a ring all-reduce (2(N − 1) steps, 2(N − 1)/N · S bytes sent
#    per worker) and simulate one, chunk by chunk;
# 3. launch DDP with `torchrun` (gloo on a CPU, NCCL on GPUs), write a DDP worker, and say why
#    its weights match one process to about 1e-7 but not bit for bit;
# 4. accumulate gradients with `no_sync`, checkpoint from rank 0 behind a barrier, evaluate
#    without counting the sampler's padding twice, and resume after a crash under
#    `torchrun --max-restarts`;
# 5. work out the memory per rank of DDP and of ZeRO / FSDP stages 1–3, measure it on an FSDP2
#    (`fully_shard`) run with a sharded checkpoint, and say when `SyncBatchNorm` and
#    learning-rate scaling matter.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
WORLD_SIZE = 2  # processes started by torchrun: 2 small CPU processes, ~360 MB each
LAUNCH_TIMEOUT_S = 120  # a distributed run that takes longer than this is stopped

import json
import os
import signal
import subprocess
import sys
import time

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from forge_course import pick_device
from forge_course.device import describe
from forge_course.sims.display import PALETTE

# The DDP demo's run: the same data, model and loop as torchrun's demo below (a test checks).
SEED_DDP = 0  # seeds the DDP demo's data, initial weights and shuffle
GLOBAL_BATCH = 16  # examples per optimizer step, summed over all ranks
STEPS_DDP = 3  # optimizer steps: one pass over the data


def make_dataset():
    """The DDP demo's regression data: STEPS_DDP global batches, the same on every rank."""
    generator = torch.Generator().manual_seed(SEED_DDP)
    x = torch.randn(STEPS_DDP * GLOBAL_BATCH, 4, generator=generator)
    noise = 0.1 * torch.randn(len(x), 1, generator=generator)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + noise)


def make_model():
    """A tiny MLP whose initial weights depend only on SEED_DDP; the caller's RNG is left alone."""
    state = torch.get_rng_state()
    torch.manual_seed(SEED_DDP)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    torch.set_rng_state(state)
    return model


def train(model, loader, device):
    """One pass of the plain loop (SGD, lr 0.1, momentum 0.9), on a bare or DDP-wrapped model."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()  # under DDP: the ranks meet here
        optimizer.step()


device = pick_device()
torch.manual_seed(SEED)
print("Running on", describe(device))

# %% [markdown]
# ## Data parallelism: shards of one batch, one averaged gradient
#
# Take a global batch of $B$ examples and $N$ processes (*ranks*). Each rank holds a full copy
# of the model and takes $B/N$ of the examples; it runs forward and backward on them alone.
# Then the ranks **average their gradients**, and each applies the same optimizer step to the
# same weights, so they stay identical without ever sending weights.
#
# Why the average is right: the loss is a mean over examples, so its gradient is the mean of
# the per-example gradients. Split the batch into equal shards, take the mean gradient of each,
# and the mean of those means is the mean over all $B$ examples.
#
# **By hand.** A one-weight model $f(x) = w x$ with $w = 0.5$, MSE loss, and a global batch
# $x = [1, 2, 3, 4]$, $y = [2, 4, 6, 8]$ over 2 ranks. `DistributedSampler` (without shuffle)
# gives rank $r$ the examples $r, r + 2, \dots$: rank 0 gets $x = [1, 3]$, rank 1 gets
# $x = [2, 4]$. Each error is $w x - y = 0.5x - 2x = -1.5x$, so one example's gradient is
# $\partial (wx - y)^2 / \partial w = 2(-1.5x)x = -3x^2$.
#
# * rank 0: mean of $-3 \cdot 1$ and $-3 \cdot 9$ is $-15$;
# * rank 1: mean of $-3 \cdot 4$ and $-3 \cdot 16$ is $-30$;
# * averaged: $(-15 - 30)/2 = -22.5$;
# * one process on the whole batch: $(-3 - 12 - 27 - 48)/4 = -90/4 = -22.5$.

# %%
x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
y = 2 * x


def gradient(xs, ys):
    w = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    ((w * xs - ys) ** 2).mean().backward()
    return w.grad.item()


shards = [torch.arange(rank, len(x), 2) for rank in range(2)]  # DistributedSampler's split
per_rank = [gradient(x[idx], y[idx]) for idx in shards]
print("rank shards:", [x[idx].tolist() for idx in shards], "gradients:", per_rank)
print("average of the ranks:", sum(per_rank) / 2, " whole batch:", gradient(x, y))
assert per_rank == [-15.0, -30.0] and sum(per_rank) / 2 == gradient(x, y) == -22.5

# %% [markdown]
# The equality needs **equal shards**. If the batch does not split evenly, the mean of the
# means weights the smaller shard's examples more: that is why `DistributedSampler` pads the
# dataset (by repeating examples) so every rank gets the same count, and why the DDP run below
# uses a global batch that divides by the number of ranks.
#
# ## All-reduce, and why a ring
#
# *All-reduce* takes one buffer per rank and leaves every rank holding their elementwise sum
# (DDP multiplies each rank's gradient by $1/N$ beforehand, so that the sum is the mean). The
# simplest way, every rank sending its $S$ bytes to one root that adds and sends the sum back,
# puts $(N - 1) S$ bytes through the root's link each way: the root becomes the bottleneck as
# $N$ grows.
#
# The **ring** spreads the work. Cut each buffer into $N$ chunks and arrange the ranks in a
# circle; at every step each rank sends one chunk ($S/N$ bytes) to its right-hand neighbour
# and receives one from its left, all links busy at once:
#
# 1. **Reduce-scatter**, $N - 1$ steps: at step $s$, rank $r$ sends chunk $(r - s) \bmod N$;
#    the receiver *adds* it to its own copy. After $N - 1$ steps rank $r$ holds the complete
#    sum of chunk $(r + 1) \bmod N$.
# 2. **All-gather**, $N - 1$ more steps: the complete chunks travel round the ring, and each
#    receiver *copies* them.
#
# So a ring all-reduce takes $2(N - 1)$ steps and each rank sends $2(N - 1) \cdot S/N$ bytes.
#
# **By hand, the facts to remember.** $N = 4$ workers, $S = 100$ MB of gradients: $2(4 - 1) =
# 6$ steps, each sending a chunk of $100/4 = 25$ MB, so every worker sends $6 \times 25 = 150$
# MB (and receives as much). With 8 workers: 14 steps of 12.5 MB, 175 MB. The amount per
# worker approaches $2S$ however many workers join: that is why the ring scales.
#
# **By hand, the running example.** Three workers with the buffers $[1, 2, 3]$, $[10, 20,
# 30]$, $[100, 200, 300]$; chunk $k$ is element $k$.
#
# | step | phase | sends (src → dst: chunk) | after the step |
# | --- | --- | --- | --- |
# | 1 | reduce-scatter | 0→1: 0, 1→2: 1, 2→0: 2 | w0 chunk 2 = 3 + 300 = 303; w1 chunk 0 = 1 + 10 = 11; w2 chunk 1 = 20 + 200 = 220 |
# | 2 | reduce-scatter | 0→1: 2, 1→2: 0, 2→0: 1 | w0 chunk 1 = 2 + 220 = **222**; w1 chunk 2 = 30 + 303 = **333**; w2 chunk 0 = 100 + 11 = **111** |
# | 3 | all-gather | 0→1: 1, 1→2: 2, 2→0: 0 | w1 gets 222, w2 gets 333, w0 gets 111 |
# | 4 | all-gather | 0→1: 0, 1→2: 1, 2→0: 2 | w1 gets 111, w2 gets 222, w0 gets 333: all hold [111, 222, 333] |
#
# The next cell runs the simulation of `forge_course.sims.ring_allreduce` and checks both
# hand calculations.

# %%
from forge_course.reference.collectives import chunk_bounds, ring_traffic
from forge_course.sims.ring_allreduce import ring_allreduce_steps

RUNNING = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [100.0, 200.0, 300.0]]
states = ring_allreduce_steps(RUNNING)
for state in states[1:]:
    print(f"step {state['step']} {state['phase']:14} sends {state['sends']}")
assert states[1]["chunks"][0][2] == [303.0] and states[1]["chunks"][1][0] == [11.0]
assert [states[2]["chunks"][r][(r + 1) % 3] for r in range(3)] == [[222.0], [333.0], [111.0]]
assert all(worker == [[111.0], [222.0], [333.0]] for worker in states[-1]["chunks"])

# The facts: 4 workers, 100 MB, one element standing for 1 MB. Count what each worker sends.
ring4 = ring_allreduce_steps([[1.0] * 100 for _ in range(4)])
bounds = chunk_bounds(100, 4)
sent_by_0 = sum(
    bounds[k + 1] - bounds[k] for st in ring4[1:] for src, _, k in st["sends"] if src == 0
)
print(f"N=4, S=100 MB: {len(ring4) - 1} steps, worker 0 sends {sent_by_0} MB")
assert (len(ring4) - 1, sent_by_0) == ring_traffic(4, 100) == (6, 150.0)
assert ring_traffic(8, 100) == (14, 175.0)

# %% [markdown]
# The figure compares the two ways to all-reduce 100 MB as workers are added: what the busiest
# worker sends (the root, for the naive way: the sum, to each of the $N - 1$ others).

# %%
workers = list(range(2, 33))
fig, ax = plt.subplots(figsize=(6.5, 3.6))
ax.plot(workers, [(n - 1) * 100 for n in workers], color=PALETTE["vermillion"],
        label="naive: the root sends (N − 1)·S")  # fmt: skip
ax.plot(workers, [ring_traffic(n, 100)[1] for n in workers], color=PALETTE["blue"],
        label="ring: each worker sends 2(N − 1)/N·S")  # fmt: skip
ax.axhline(200, ls=":", color=PALETTE["black"], label="2S = 200 MB")
ax.set(xlabel="workers N", ylabel="MB sent by the busiest worker", yscale="log",
       title="All-reduce of S = 100 MB: traffic per worker")  # fmt: skip
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# *Alt text: a log-scale line chart over 2 to 32 workers. The naive line rises from 100 MB to
# 3,100 MB; the ring line starts at 100 MB too, passes 150 MB at 4 workers and flattens just
# under the dotted 200 MB line.*
#
# These are counts of bytes, not timings: a real all-reduce also pays a latency per step
# ($2(N-1)$ of them), which is why NCCL switches to tree algorithms for small buffers and
# very many ranks.
#
# ## Simulation: watch the ring
#
# Move the **step** slider. Each worker shows its three chunks; the text in a box lists the
# ranks whose values that chunk sums so far, and the colour says how many: grey (its own only),
# sky (two), green (all three, complete). Arrows are the sends of the step just taken.
#
# *Without a widget front end this cell shows the state after reduce-scatter (step 2): three
# workers round a triangle, each holding exactly one green, complete chunk (222, 333 and 111),
# its other chunks grey (own value) or sky (two ranks summed), with arrows for step 2's sends.*

# %%
from forge_course.sims.display import LiveFigure
from forge_course.sims.ring_allreduce import RingPicture, ring_view

ring_view(RUNNING)
live = LiveFigure((7.5, 6.2))  # the view's own figure, updated as a slider move updates it
picture = RingPicture(live.fig.subplots(), states)
live.moving(picture.moving_artists)
picture.update(0)
live.png()  # the first draw of a view, before any move
start = time.perf_counter()
for index in range(len(states)):
    picture.update(index)
    live.png()  # render too: a slider move costs drawing and rendering
redraw_ms = (time.perf_counter() - start) / len(states) * 1e3
print(f"one slider move: {redraw_ms:.0f} ms to draw and render the ring (measured, mean of 5)")

# %% [markdown]
# ## Exercise 1 · `ch11_ring_allreduce`: simulate the ring
#
# Write `ring_allreduce(buffers)`. `buffers` is a list of $N \ge 2$ lists (one per worker) of
# the same length $L \ge 1$ of floats. Cut each buffer into $N$ chunks as `numpy.array_split`
# does: chunk $k$ runs from `bounds[k]` to `bounds[k + 1]`, where the first $L \bmod N$ chunks
# have one element more than the others (some chunks are empty when $L < N$). Then run the
# ring exactly as above:
#
# * reduce-scatter steps $s = 0 \dots N - 2$: worker $r$ sends chunk $(r - s) \bmod N$ to
#   worker $(r + 1) \bmod N$, which adds it elementwise to its own copy (`mine + received`);
# * all-gather steps $s = 0 \dots N - 2$: worker $r$ sends chunk $(r + 1 - s) \bmod N$ to
#   worker $(r + 1) \bmod N$, which replaces its copy with it.
#
# All sends of a step happen at the same time: read what every worker sends before any
# receiver changes its chunks. Return a pair `(results, sends)`: `results[r]` is worker $r$'s
# whole buffer at the end (a list of $L$ floats), and `sends` has one list per step,
# $2(N - 1)$ in all, of the `(src, dst, chunk)` tuples of that step ordered by `src`. Do not
# modify `buffers`. The check compares the sends step by step, and the results to the bit on
# values of very different sizes, where only the ring's own order of additions gives them.


# %% nbgrader={"grade_id": "ch11_ring_allreduce", "solution": true}
def ring_allreduce(buffers):
    ### BEGIN SOLUTION
    n, length = len(buffers), len(buffers[0])
    base, extra = divmod(length, n)
    bounds = [0]
    for k in range(n):
        bounds.append(bounds[-1] + base + (k < extra))
    chunks = [[list(buf[bounds[k] : bounds[k + 1]]) for k in range(n)] for buf in buffers]
    sends = []
    for step in range(2 * (n - 1)):
        reducing = step < n - 1
        s = step if reducing else step - (n - 1)
        moves = [(r, (r + 1) % n, (r - s + (0 if reducing else 1)) % n) for r in range(n)]
        outgoing = [list(chunks[src][k]) for src, _, k in moves]
        for (_, dst, k), values in zip(moves, outgoing):
            if reducing:
                chunks[dst][k] = [mine + got for mine, got in zip(chunks[dst][k], values)]
            else:
                chunks[dst][k] = values
        sends.append(moves)
    results = [[value for chunk in worker for value in chunk] for worker in chunks]
    return results, sends
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch11_ring_allreduce_tests", "grade": true, "points": 3}
# Visible tests: the running example and 4 workers × 8 values.
from forge_course.grading import ch11

ch11.check_ring_allreduce(ring_allreduce)
print("ring_allreduce: the sums and every send match, on 3 and 4 workers.")
### BEGIN HIDDEN TESTS
ch11.check_ring_allreduce(ring_allreduce, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## The simulation against the real thing
#
# `torch.distributed.all_reduce` does the same job between real processes. The next cell
# starts 2 processes (forked from this kernel, so they start in well under a second), joins
# them in a gloo group, all-reduces one float64 buffer each, and compares what every process
# ends with against the simulated ring. With two workers every element is one addition, so
# the two must agree to the last bit. `gloo_all_reduce` kills the processes if they are not
# done within the timeout.

# %%
from forge_course.reference.collectives import gloo_all_reduce
from forge_course.reference.collectives import ring_allreduce as ring_reference

buffers = [[0.1, -2.5, 3.25, 1e-3, 7.0], [4.0, 0.2, -1.0, 2e-3, -7.0]]
start = time.perf_counter()
real = gloo_all_reduce(buffers, timeout_s=LAUNCH_TIMEOUT_S)
seconds = time.perf_counter() - start
simulated, _ = ring_reference(buffers)
print("torch.distributed.all_reduce on each process:", real)
print("simulated ring on each worker:               ", simulated)
print(f"bit-for-bit equal: {real == simulated} (2 gloo processes, {seconds:.2f} s measured)")
assert real == simulated

# %% [markdown]
# ## DDP with `torchrun`
#
# `DistributedDataParallel` (DDP) is data parallelism packaged: wrap the model, and during
# `backward()` it copies each gradient into a bucket, multiplied by 1/(number of ranks) on the
# way, and all-reduces the buckets, overlapping communication with the rest of the backward
# pass. At construction it broadcasts rank 0's weights, so all ranks start equal. The loop
# itself does not change.
#
# `torchrun` starts the processes. For each one it sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
# `MASTER_ADDR` and `MASTER_PORT`, and `init_process_group(backend, init_method="env://")`
# reads them. The backend is **gloo** on CPUs and **NCCL** with one GPU per rank; with NCCL each
# process also calls `torch.cuda.set_device(local_rank)`.
#
# `forge_course.reference.ddp` trains a tiny MLP (4 → 8 → 1) for 3 SGD steps on a global batch
# of 16, split 8 + 8 by `DistributedSampler`, and compares each rank's weights with one process
# trained on the whole batch of 16.
#
# From a shell, the demo alone is `torchrun --standalone --nproc_per_node=2 -m
# forge_course.reference.ddp`. Starting processes is what costs seconds here (each one imports
# torch), so the next cell launches, once, everything this chapter runs under torchrun: the
# module `forge_course.reference.ddp_practice` runs the DDP demo on its ranks first, then the
# practice of the section "DDP in practice" below, which includes a worker that crashes on
# purpose; hence `--max-restarts=1` and an environment variable, both explained there. The
# launcher runs in its own process group, so on a timeout it is stopped together with its
# ranks.


# %%
def launch(command, timeout_s, env=None):
    """Run ``command`` with ``env`` added to the environment; return its stdout and stderr.

    The command and every process it started are stopped if it outlives ``timeout_s``.
    """
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{err[-2000:]}")
    return out, err


from pathlib import Path
from tempfile import TemporaryDirectory

practice_dir = TemporaryDirectory(prefix="forge-practice-")  # removed when the kernel stops
torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={WORLD_SIZE}", "--max-restarts=1", "-m",
            "forge_course.reference.ddp_practice", "--out-dir", practice_dir.name]  # fmt: skip
start = time.perf_counter()
restart_fix = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # see part 4 of "DDP in practice"
_, practice_log = launch(torchrun, LAUNCH_TIMEOUT_S, env=restart_fix)
launch_seconds = time.perf_counter() - start
practice = json.loads(Path(practice_dir.name, "practice.json").read_text())
resume = json.loads(Path(practice_dir.name, "resume.json").read_text())
summary = practice["ddp"]
print(json.dumps(summary, indent=1))
print(f"torchrun, {WORLD_SIZE} ranks, 2 attempts: {launch_seconds:.1f} s, start-up included")
print("the work itself, on rank 0 (s):", practice["seconds"])
assert summary["ok"] and summary["ranks_identical"] and summary["max_abs_diff"] <= 1e-6

# %% [markdown]
# Read the summary: the ranks hold **identical** weights (they applied the same averaged
# gradient to the same weights), and those weights differ from one process on the whole batch
# by `max_abs_diff`, around $10^{-7}$ in float32, not 0. The arithmetic is the same sum in a
# different order: one process sums 16 per-example terms in one reduction; DDP sums 8 on each
# rank, halves each rank's result, then adds the two halves. Float addition is not associative,
# so the last bit can differ, and three steps of momentum SGD carry the difference along.
#
# Almost all of those seconds are start-up: torchrun and each rank are fresh Python processes
# that import torch, the ranks twice because of the restart. The DDP demo's three training
# steps take a fraction of a second (`"ddp"` above, most of it DDP's first construction, which
# imports `torch._dynamo`).
#
# ### Divided before the sum, or after?
#
# With 2 ranks the question has no visible answer: halving a binary floating-point number is
# exact, so "halve, then add" and "add, then halve" give the same bits. With 3 ranks they do
# not. `gradient_scaling` starts 3 gloo ranks; each computes one backward pass on its own 4
# examples through DDP and through a plain copy of the model, then all-reduces its plain
# gradient three ways and counts the entries equal to DDP's.

# %%
from forge_course.reference.ddp import gradient_scaling

start = time.perf_counter()
scaling = gradient_scaling(world_size=3)
for order, equal in scaling["equal"].items():
    print(f"{order:26} then compared with DDP: {equal:2} of {scaling['entries']} entries equal")
print(f"3 ranks started, synchronised and stopped in {time.perf_counter() - start:.1f} s")
assert scaling["equal"]["times 1/W, then summed"] == scaling["entries"]
assert scaling["equal"]["summed, then divided by W"] < scaling["entries"]

# %% [markdown]
# Only one order reproduces DDP to the last bit: each rank multiplies its gradient by $1/3$,
# and the all-reduce adds the three scaled gradients. Dividing the sum afterwards, the order
# "average = sum / N" suggests, differs in the last bit of many entries; dividing by 3 first
# (instead of multiplying by the rounded $1/3$) misses some too. DDP scales before it sums, and
# it scales by multiplying with $1/N$. A hand-written all-reduce that should match DDP bit for
# bit has to do the same.
#
# ## Exercise 2 · `ch11_ddp_worker`: one rank of DDP
#
# Write `worker(rank, world_size, port, out_dir)`, the function each process runs. It must:
#
# 1. join the group: `dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
#    rank=rank, world_size=world_size)`;
# 2. build the data and model with `make_dataset()` and `make_model()` (the first cell defines
#    them: the same run as `forge_course.reference.ddp`), and give a `DataLoader` a
#    `DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED_DDP)` and a batch
#    size of `GLOBAL_BATCH // world_size`;
# 3. wrap the model in `DistributedDataParallel` and train it with `train(model, loader,
#    torch.device("cpu"))` (one pass, 3 steps);
# 4. save the weights of the model **inside** the wrapper, `model.module.state_dict()`, with
#    `torch.save` to `os.path.join(out_dir, f"rank{rank}.pt")`, in every rank;
# 5. destroy the group with `dist.destroy_process_group()`, also when something fails.
#
# The check starts `world_size` real processes running your function (2 here; 4 and 1 in the
# hidden test), each with an `out_dir` of its own, and stops them after 60 s if they hang. They
# are forked from one fresh Python process that has only imported torch, so each starts as
# clean as a rank torchrun starts, and none shares anything with this notebook's kernel. It
# checks that every rank joined a group of `world_size` processes as its own `rank` and saved
# its own file, and compares the saved weights across ranks and with one process on the whole
# batch, within 1e-6. It also checks that no rank still has its group when `worker` ends: once
# as above, and once in a run where each `out_dir` is a file, so that saving fails. A rank gets
# your function and the globals it uses from this notebook (functions, numbers, modules and
# what the first cell imports); create anything else inside `worker`.

# The first cell of the notebook imports `dist`, `DistributedDataParallel`, `DataLoader` and
# `DistributedSampler`, and defines `make_dataset`, `make_model`, `train`, `GLOBAL_BATCH` and
# `SEED_DDP`.


# %% nbgrader={"grade_id": "ch11_ddp_worker", "solution": true}
def worker(rank, world_size, port, out_dir):
    ### BEGIN SOLUTION
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        dataset = make_dataset()
        sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED_DDP)
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
        model = DistributedDataParallel(make_model())
        train(model, loader, torch.device("cpu"))
        torch.save(model.module.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch11_ddp_worker_tests", "grade": true, "points": 3}
# Visible tests: 2 real processes run `worker`; their weights must agree with each other and
# with one process on the whole batch.
from forge_course.grading import ch11

ch11.check_ddp_worker(worker)
print("worker: 2 ranks saved identical weights, within 1e-6 of one process.")
### BEGIN HIDDEN TESTS
ch11.check_ddp_worker(worker, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## `DistributedSampler` and `set_epoch`
#
# The sampler does two things: it gives every rank a disjoint slice of one shuffled order,
# padded so all slices have the same length, and it draws that order from `seed + epoch`. The
# epoch only changes when you call `sampler.set_epoch(epoch)` at the start of each epoch;
# forget it and every epoch repeats the first epoch's order. Ten examples over four ranks:

# %%
for rank in range(4):
    sampler = DistributedSampler(range(10), num_replicas=4, rank=rank, shuffle=True, seed=SEED)
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    forgot = DistributedSampler(range(10), num_replicas=4, rank=rank, shuffle=True, seed=SEED)
    print(f"rank {rank}: epoch 0 {orders[0]}, epoch 1 {orders[1]}; "
          f"without set_epoch {list(forgot)}, {list(forgot)}")  # fmt: skip
print(f"{len(sampler)} examples per rank: 10 padded to 12 by repeating 2")

# %% [markdown]
# ## DDP in practice: four habits
#
# The worker above trains and saves. A run that lasts days needs more, and this section checks
# each habit on real gloo ranks:
#
# 1. gradient accumulation with one all-reduce per optimizer step, not one per micro-batch
#    (`no_sync`);
# 2. checkpoints written by rank 0 alone and read by every rank after a barrier;
# 3. evaluation that does not count `DistributedSampler`'s padding twice;
# 4. a worker that crashes, and a run that torchrun starts again and resumes from its last
#    checkpoint.
#
# The launch in the torchrun section above ran all four, and the FSDP2 run of the memory
# section below, on its gloo ranks (`forge_course.reference.ddp_practice`). On its first
# attempt each rank ran the DDP demo, parts 1–3 and FSDP2, then trained 6 steps with a
# checkpoint after each, and rank 1 raised after step 4. `--max-restarts=1` let torchrun start
# the whole group once more; the second attempt found `TORCHELASTIC_RESTART_COUNT=1` in its
# environment, skipped the demonstrations, loaded the newest checkpoint and finished.

# %% [markdown]
# ### 1. Gradient accumulation under DDP: `no_sync()`
#
# Chapter 10 accumulates the gradients of $k$ micro-batches and steps once. Under DDP every
# `backward()` all-reduces, so $k$ micro-batches would cost $k$ all-reduces when only their sum
# is needed at the step. Inside `with model.no_sync():` DDP only adds each gradient to `.grad`
# locally; the first backward outside it all-reduces the accumulated gradient, once:
#
# ```python
# for i, (x, y) in enumerate(micro_batches):
#     last = i == k - 1
#     with contextlib.nullcontext() if last else model.no_sync():  # forward inside it too
#         (loss_fn(model(x), y) / k).backward()  # all-reduces only when last
# optimizer.step()
# optimizer.zero_grad()
# ```
#
# The result is the same because an all-reduce is a sum, and sums can be regrouped: the sum
# over ranks of each rank's sum over micro-batches is the sum over micro-batches of the sums
# over ranks. The launch counted the all-reduces with a **comm hook**, a function DDP calls for
# each bucket of gradients in place of its own all-reduce (`model.register_comm_hook(state,
# hook)`); this one counts, then calls DDP's default `allreduce_hook`. The model fits in one
# bucket, so each call is one all-reduce. Each rank had 8 examples in 4 micro-batches of 2.

# %%
acc = practice["accumulate"]
k = acc["micro_batches"]
print(f"{k} micro-batches per step: all-reduces {acc['all_reduces']}")
print(f"largest gradient entry {acc['largest_gradient']:.3f}; synced every micro-batch vs "
      f"no_sync: max difference {acc['max_abs_diff']:.1e}; "
      f"vs one process on the whole batch: {acc['max_abs_diff_whole_batch']:.1e}")  # fmt: skip
assert acc["all_reduces"] == {"synced": k, "no_sync": 1} and acc["ranks_identical"]
assert acc["max_abs_diff"] <= 1e-6 * acc["largest_gradient"]
assert acc["max_abs_diff_whole_batch"] <= 1e-6 * acc["largest_gradient"]

# %% [markdown]
# The gradients agree to float32 rounding, not bit for bit: the additions happen in another
# order (per rank first, then across ranks). On GPUs that saves $k - 1$ all-reduces of the
# whole gradient per optimizer step. *Not timed here: the time saved depends on the gradient's
# size and the network between the GPUs, which a 49-parameter model on one CPU cannot show.*
#
# *Try it:* run the torchrun cell with `"--micro-batches", "8"` added at the end of its command
# (a rank's 8 examples one at a time), then this cell: the counts become 8 and 1.
#
# ### 2. Checkpoints: rank 0 writes, every rank waits, every rank loads
#
# After a step every rank holds the same weights, so one file is enough, and $N$ ranks writing
# one path at once would race each other. The pattern:
#
# ```python
# if rank == 0:
#     torch.save(model.module.state_dict(), path)  # the bare model's keys
# dist.barrier()  # no rank reads the file before rank 0 has written it all
# state = torch.load(path, map_location=device, weights_only=True)
# model.module.load_state_dict(state)
# ```
#
# * **The barrier.** Without it a rank can open the file before it exists, or while rank 0 is
#   half-way through writing it. (Chapter 09's atomic save keeps a half-written file from ever
#   carrying the checkpoint's name; the barrier makes the others wait for the whole file.)
# * **`map_location`.** `torch.load` puts each tensor back on the device it was saved from:
#   a file written by rank 0 from `cuda:0` would land on GPU 0 in every rank. Load to `"cpu"`,
#   or to `f"cuda:{local_rank}"`.
# * **`module.`** The wrapper holds the model as its attribute `module`, so `ddp.state_dict()`
#   names every key `module.…`, and a bare model refuses it. Save `ddp.module.state_dict()`;
#   for a file already saved with the prefix,
#   `consume_prefix_in_state_dict_if_present(state, "module.")` (in `torch.nn.modules.utils`)
#   strips it in place.
#
# In the launch every rank trained, rank 0 saved, and each rank then built a fresh model from a
# different seed (`100 + rank`) and loaded the file into it.

# %%
ckpt = practice["checkpoint"]
print("ddp.state_dict() keys:       ", ckpt["ddp_keys"], "…")
print("ddp.module.state_dict() keys:", ckpt["module_keys"], "…")
print("a bare model given ddp.state_dict():", ckpt["bare_load_error"])
print(f"ranks identical before the load: {ckpt['identical_before_load']}, "
      f"after: {ckpt['identical_after_load']}")  # fmt: skip
assert ckpt["ddp_keys"] == ["module." + key for key in ckpt["module_keys"]]
assert ckpt["bare_load_error"].startswith("Missing key(s)") and ckpt["prefix_stripped_loads"]
assert not ckpt["identical_before_load"] and ckpt["identical_after_load"]
assert ckpt["equal_to_trained"]

# %% [markdown]
# ### 3. Distributed evaluation without the padded duplicates
#
# To evaluate in parallel, each rank scores its `DistributedSampler` shard and the ranks
# all-reduce their sums (of losses, of correct predictions) and counts. But the sampler pads:
# 11 examples over 2 ranks become 12, and rank 1's last example is example 0 again. The
# all-reduced sums count it twice, and the metric is not the one of the data set. Two fixes
# that count each example once:
#
# * **Mask the padding.** Rank $r$'s $p$-th example sits at position $r + pN$ of the padded
#   order, and positions from 11 on are the repeats. Drop them before summing
#   (`forge_course.reference.ddp_practice.padded_positions`).
# * **Gather and de-duplicate.** Each example carries its index (the dataset returns it);
#   `dist.all_gather` every rank's `(index, loss, correct)` rows and keep each index once.
#   This also gives per-example results, in order, for error analysis.
#
# (A third: give each rank an unpadded slice, `Subset(dataset, range(rank, n, world_size))`,
# and all-reduce sums and counts. The ranks then run different numbers of batches: fine for an
# evaluation with no collective inside its loop, but not for DDP training, where a rank with
# one batch more waits in an all-reduce its peers never join; DDP's `join()` context manager
# exists for that case.)

# %%
ev = practice["evaluate"]
for way in ("single process", "naive", "masked", "gathered"):
    row = ev[way]
    print(f"{way:15} {row['examples']:2} examples  accuracy {row['accuracy']:.4f}  "
          f"mean loss {row['loss']:.9f}")  # fmt: skip
single = ev["single process"]
assert ev["padded_to"] == 12 and ev["naive"]["examples"] == 12
assert ev["naive"]["accuracy"] == 4 / 12 and single["accuracy"] == 4 / 11
for way in ("masked", "gathered"):
    assert ev[way]["examples"] == 11 and ev[way]["accuracy"] == single["accuracy"]
    assert abs(ev[way]["loss"] - single["loss"]) <= ev["per_example_max_diff"]
print(f"one example's float32 loss, from the ranks' batches (4 and 2) or from one batch of 11: "
      f"up to {ev['per_example_max_diff']:.1e} apart")  # fmt: skip

# The mask, checked on the sampler of the set_epoch cell (10 examples, 4 ranks):
from forge_course.reference.ddp_practice import padded_positions

kept = []
for rank in range(4):
    order = list(DistributedSampler(range(10), num_replicas=4, rank=rank, shuffle=True, seed=SEED))
    kept += [i for i, pad in zip(order, padded_positions(10, 4, rank).tolist()) if not pad]
assert sorted(kept) == list(range(10))

# %% [markdown]
# The naive accuracy is wrong by a whole example: 4 right of 11 is 0.3636, but example 0 was
# scored wrong and counted twice, 4 of 12. Both fixes give the single process's accuracy
# exactly. Their mean loss agrees to about $2 \times 10^{-8}$, not to the bit, and not because
# of the fix: a float32 example's loss itself depends in its last bits on the shape of the
# batch it was computed in (the matrix product picks another kernel), and the ranks used
# batches of 4 and 2 where the single process used one batch of 11.
#
# *Try it:* add `"--eval-examples", "12"` to the torchrun cell's command and run it and this
# cell: no padding, so the naive way is right, and the cell's assert that it is wrong fails.
#
# ### 4. A worker crashes: `torchrun --max-restarts`
#
# When a worker exits with an error, torchrun stops the others and, while restarts remain,
# starts the **whole group** again: same ranks, `TORCHELASTIC_RESTART_COUNT` one higher. Nothing
# in memory survives, so the run can only continue from what it saved. The resumable loop
# (chapter 09's `save_checkpoint` and `load_checkpoint`, rank 0 writing, a barrier after):
#
# ```python
# step = 0
# if (newest := latest_checkpoint(folder)) is not None:  # every rank reads the same file
#     step = load_checkpoint(newest, model.module, optimizer, map_location="cpu")["step"]
# for epoch in range(step // steps_per_epoch, epochs):
#     sampler.set_epoch(epoch)  # the order depends on seed + epoch only
#     for batch, (x, y) in enumerate(loader):
#         if epoch * steps_per_epoch + batch < step:
#             continue  # done before the crash
#         ...  # one training step
#         step += 1
#         if rank == 0:
#             save_checkpoint(checkpoint_path(folder, step), model.module, optimizer, step=step)
#         dist.barrier()
# ```
#
# The optimizer's state (momentum here) is in the checkpoint: without it the resumed run takes
# different steps. On its first attempt the launch also trained the same 6 steps without a
# crash, in a folder of its own, to compare.
#
# The launch sets `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` for torch 2.13 itself: by default the
# restarted ranks form their group through torchrun's own key-value store, which lives on from
# the first attempt, and on this machine every restarted gloo group we tried (3 runs, one of
# them a 10-line worker that only all-reduces) failed to connect ("Gloo connectFullMesh failed
# … Connection refused") or hung. With the variable set, rank 0 of each attempt hosts a fresh
# store, and the restart works.

# %%
crash = [line for line in practice_log.splitlines() if "crashes on purpose" in line][-1]
print("attempt 0:", crash.strip())
print(json.dumps(resume))
assert resume["attempt"] == 1 and resume["resumed_from_step"] == 4 and resume["steps"] == 6
assert resume["equal_to_uncrashed"] and resume["ranks_identical"]

# %% [markdown]
# The restarted attempt loaded the checkpoint of step 4, ran steps 5 and 6, and ended with the
# uncrashed run's weights **bit for bit**: same weights, same momentum, same batches, the same
# arithmetic. How often to save is a trade: every save costs time, and every crash loses the
# steps since the last save, plus, on many GPUs, the start-up of every process.
#
# *Try it:* change `"--max-restarts=1"` to `"--max-restarts=0"` in the torchrun cell and run it:
# torchrun gives up after the first crash, `launch` raises, and torchrun's report at the end
# of the message names the root cause, rank 1's `RuntimeError`.


# %% [markdown]
# ## Why not `nn.DataParallel`
#
# `nn.DataParallel` is one line (`model = nn.DataParallel(model)`) and runs in **one
# process**. Every step it scatters the batch from GPU 0 to the others, copies the model's
# weights to every GPU again, runs the replicas in Python threads that contend for one GIL,
# and gathers every output back to GPU 0, where the loss and the optimizer run. GPU 0 does
# more work and holds more memory than the rest, and the threads spend time waiting for each
# other. DDP runs one process per GPU: no GIL shared between replicas, weights copied once at
# the start, and only gradients travel, all-reduced in buckets while backward is still
# running. PyTorch's documentation recommends DDP even on a single machine.
#
# *Not measured here: this comparison needs several GPUs, and this chapter runs on a CPU.
# On a multi-GPU machine, time 20 steps of each wrapper on the same model to see it.*
#
# ## Batch size and learning rate
#
# With $N$ ranks and $b$ examples per rank, one step sees a global batch $B = N b$ (times the
# accumulation steps of chapter 10). Adding ranks at fixed $b$ therefore changes the training
# recipe: fewer steps per epoch, each averaging more examples. The **linear scaling rule** is
# a heuristic for that: multiply the learning rate by the same factor as the batch
# ($0.1$ at $B = 256$ becomes $0.1 \times 2048/256 = 0.8$ at $B = 2048$), and ramp it up over
# the first steps (*warm-up*), because the large rate is unstable while the weights are still
# random. It holds well up to some batch size that depends on the problem and then fails;
# for Adam a square-root rule is often suggested instead. Check with a short learning-rate sweep
# rather than trusting either. The cell prints the warm-up from the example.

# %%
base_lr, base_batch, per_rank_batch, ranks, warmup_steps = 0.1, 256, 256, 8, 5
scaled_lr = base_lr * per_rank_batch * ranks / base_batch
param = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([param], lr=scaled_lr)
warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup_steps))
lrs = []
for _ in range(7):
    lrs.append(round(opt.param_groups[0]["lr"], 6))
    opt.step()
    warmup.step()
print(f"global batch {per_rank_batch * ranks}: linear scaling gives lr {scaled_lr}")
print("lr at steps 0-6 with a 5-step warm-up:", lrs)
assert scaled_lr == 0.8 and lrs == [0.16, 0.32, 0.48, 0.64, 0.8, 0.8, 0.8]

# %% [markdown]
# ## Memory per rank: DDP, ZeRO and FSDP
#
# DDP copies everything to every rank. In fp32 with Adam, each parameter costs 4 bytes for the
# weight, 4 for its gradient and 8 for Adam's two moments: 16 bytes, on **every** rank. ZeRO
# (DeepSpeed) and FSDP (PyTorch's `FullyShardedDataParallel`, and its successor `fully_shard`,
# "FSDP2") cut that by *sharding*: each rank keeps only $1/N$ of some of these, and the
# collectives fetch the rest when needed:
#
# | stage | sharded over the $N$ ranks | bytes per parameter per rank |
# | --- | --- | --- |
# | 0 (DDP) | nothing | $4 + 4 + 8 = 16$ |
# | 1 (ZeRO-1) | optimizer state | $4 + 4 + 8/N$ |
# | 2 (ZeRO-2, `SHARD_GRAD_OP`) | + gradients | $4 + 4/N + 8/N$ |
# | 3 (ZeRO-3, FSDP `FULL_SHARD`, FSDP2 `fully_shard`) | + parameters | $(4 + 4 + 8)/N$ |
#
# **By hand**, 1 billion parameters on 8 GPUs (GB = $10^9$ bytes):
#
# * stage 0: $16 \times 10^9$ B $= 16$ GB per GPU;
# * stage 1: $4 + 4 + 8/8 = 9$ GB;
# * stage 2: $4 + 0.5 + 1 = 5.5$ GB;
# * stage 3: $0.5 + 0.5 + 1 = 2$ GB.
#
# Stage 3 pays for it in traffic: the parameters of each layer are all-gathered before its
# forward and again before its backward, about 1.5 times DDP's communication, and while a
# layer runs its full weights are there too. None of these numbers include activations, which
# are often the largest part (chapter 10). The 8 bytes of Adam state are measured in the next
# cell on a small model, and stage 3's sharding on a real FSDP2 run after the calculator.

# %%
from forge_course.reference.collectives import memory_per_rank

by_hand = {0: 16.0, 1: 9.0, 2: 5.5, 3: 2.0}
for stage, gigabytes in by_hand.items():
    computed = memory_per_rank(1e9, 8, stage)["total"] / 1e9
    print(f"stage {stage}: {computed:g} GB per GPU (by hand {gigabytes:g})")
    assert computed == gigabytes

probe = torch.nn.Linear(1000, 1000)  # 1,001,000 parameters
adam = torch.optim.Adam(probe.parameters())
probe(torch.randn(4, 1000)).sum().backward()
adam.step()
n_params = sum(p.numel() for p in probe.parameters())
state_bytes = sum(
    t.numel() * t.element_size()
    for state in adam.state.values()
    for key, t in state.items()
    if key != "step"  # one scalar per tensor, not per parameter
)
print(f"measured: Adam keeps {state_bytes:,} bytes for {n_params:,} parameters = "
      f"{state_bytes / n_params:g} bytes per parameter")  # fmt: skip
assert state_bytes == 8 * n_params

# %% [markdown]
# ## Simulation: the memory calculator
#
# Move **parameters**, **ranks** and **stage**: the bars are the bytes per rank of each stage,
# stacked as weights, gradients and Adam state, and the outlined bar is the stage you chose.
# Try 7e9 parameters on 8 ranks: 112 GB per GPU under DDP does not fit an 80 GB GPU; stage 3
# needs 14 GB.
#
# *Without a widget front end this cell shows 1e9 parameters on 8 ranks: bars of 16, 9, 5.5
# and 2 GB for stages 0 to 3, stage 3 outlined.*

# %%
from forge_course.sims.ring_allreduce import memory_view

memory_view(params=1e9, ranks=8, stage=3)

# %% [markdown]
# ### FSDP2 on this CPU: sharded weights, a sharded checkpoint
#
# PyTorch's current FSDP is a function, `torch.distributed.fsdp.fully_shard` ("FSDP2"). It
# turns each parameter of a module into a *DTensor* split by rows over the ranks: rank $r$
# keeps its rows only. Before the module's forward, and again before its backward, the ranks
# all-gather the full weights and drop them after; after backward they reduce-scatter the
# gradients, so each rank holds the averaged gradient of its own rows, and its optimizer updates
# only those. That is stage 3 of the table. (`fully_shard(module, reshard_after_forward=False)`
# keeps the gathered weights from forward to backward: fewer all-gathers, more memory, close to
# stage 2.)
#
# ```python
# mesh = init_device_mesh("cpu", (world_size,))  # "cuda" with NCCL on GPUs
# for layer in model:
#     if isinstance(layer, nn.Linear):
#         fully_shard(layer, mesh=mesh)  # one all-gather unit per layer
# fully_shard(model, mesh=mesh)
# optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # after sharding
# ...  # the same training loop as DDP
# model_state, optim_state = get_state_dict(model, optimizer)  # DTensors: each rank its rows
# dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
# ```
#
# `dcp` is `torch.distributed.checkpoint`, the **sharded checkpoint**: every rank writes its
# own rows to its own file, and one `.metadata` file records which rows of which tensor are
# where, so a save never gathers the model on one rank, and a load can even use another number
# of ranks. `fsdp_demo` (`forge_course.reference.fsdp`) ran all of this in the launch above, on
# gloo and the CPU with torch 2.13: the DDP demo's model and data, sharded over 2 ranks,
# compared with DDP on the same ranks, then saved, and loaded into a fresh sharded model and
# optimizer. With SGD and momentum the optimizer keeps 4 bytes per parameter, so the calculator
# runs with `bytes_optimizer=4`.

# %%
fsdp = practice["fsdp"]
for name, (full, local) in fsdp["shapes"].items():
    print(f"{name:9} full {str(full):7} rank 0 keeps {local}")
calc = memory_per_rank(fsdp["n_params"], WORLD_SIZE, stage=3, bytes_optimizer=4)
print(f"{fsdp['n_params']} parameters, calculator: {calc['params']:g} bytes each of weights, "
      f"gradients and momentum per rank")  # fmt: skip
for rank, held in enumerate(fsdp["bytes"]):
    print(f"rank {rank} measured: {held}")
for kind, key in (("weights", "params"), ("grads", "grads"), ("momentum", "optimizer")):
    assert sum(held[kind] for held in fsdp["bytes"]) == WORLD_SIZE * calc[key]
print("layer 0's weight inside its forward:", fsdp["inside_forward"],
      "after:", fsdp["after_forward"])  # fmt: skip
print(f"FSDP2 vs DDP, largest weight difference: {fsdp['max_abs_diff_ddp']}")
print("checkpoint files (bytes):", fsdp["files"])
for file, names in fsdp["entries"].items():
    shards = [name for name in names if "param_groups" not in name]
    print(f"  {file}: {len(shards)} shards (weights, momentum), "
          f"{len(names) - len(shards)} optimizer settings")  # fmt: skip
print("where the rows of 0.weight live:", fsdp["chunks_of_0.weight"])
assert fsdp["inside_forward"] == [8, 4] and fsdp["after_forward"] == [8 // WORLD_SIZE, 4]
assert [held["weights"] for held in fsdp["bytes"]] == [29 * 4, 20 * 4]
assert fsdp["max_abs_diff_ddp"] == 0.0 and fsdp["loaded_equal"]
assert sorted(fsdp["files"]) == [".metadata"] + [f"__{r}_0.distcp" for r in range(WORLD_SIZE)]

# %% [markdown]
# Read the numbers:
#
# * Together the ranks hold each byte once: 196 bytes of weights over 2 ranks, 98 each on
#   average, as the calculator says. But not 98 on each: FSDP2 cuts every tensor by rows, and
#   the last layer's weight and bias have **one** row, which rank 0 keeps whole. Rank 0 holds
#   29 parameters, rank 1 20. With real layers (thousands of rows) the split is even to a
#   fraction of a percent.
# * Inside layer 0's forward its weight is whole (8 × 4, all-gathered); after it, each rank is
#   back to its 4 rows. So the peak holds one unit's full weights on top of the shards: wrap
#   layer by layer, not the model alone, or the all-gather is the whole model.
# * The sharded run ends with DDP's weights exactly: with 2 ranks the same gradients are summed
#   and halved (exact in binary) and the same update is applied, just by row.
# * The checkpoint is one file per rank plus `.metadata`, which records 0.weight as two chunks,
#   rows 0–3 and rows 4–7. Each file holds its rank's 8 shards (4 of weights, 4 of momentum);
#   values every rank has alike, the optimizer's settings (`lr`, `momentum`, …), are written
#   once, into one of the files, which is why rank 1's is the larger. At this size the bytes
#   are mostly the format's overhead per entry (about 1.5 KB). Loading the checkpoint into a
#   fresh sharded model and optimizer restored every rank's rows and momentum bit for bit.
#
# To read such a checkpoint in one process (for inference, say),
# `torch.distributed.checkpoint.format_utils.dcp_to_torch_save(folder, "model.pt")` writes an
# ordinary `torch.save` file. On GPUs the same code runs with NCCL: `init_device_mesh("cuda",
# (world_size,))`, `torch.cuda.set_device(local_rank)` first, and the model moved to the GPU
# before `fully_shard`. *Not run here: this machine has no GPU.*

# %% [markdown]
# ## SyncBatchNorm
#
# Under DDP, a `BatchNorm` layer normalises with the mean and variance of **its rank's**
# shard, not of the global batch, and each rank keeps its own running statistics (DDP
# broadcasts rank 0's buffers at the start of every forward). The fewer examples per rank, the
# noisier those statistics: with 2 per rank (common in detection and segmentation, where
# images are large) they can be far from the batch's, and training suffers. `nn.SyncBatchNorm.convert_sync_batchnorm(model)` replaces
# every BatchNorm with one that exchanges each rank's mean, variance and count in the forward
# (and the matching gradient sums in the backward), so all ranks normalise with the global
# batch's statistics, at the cost of extra collectives in every such layer. The cell compares the statistics
# one rank sees with the global ones, at 8 and at 2 examples per rank.

# %%
gen = torch.Generator().manual_seed(SEED)
features = 3.0 + 2.0 * torch.randn(16, generator=gen)  # one channel of a global batch of 16
print(f"global batch of 16: mean {features.mean():.3f}, var {features.var(unbiased=False):.3f}")
for per_rank in (8, 2):
    shard = features[:per_rank]  # rank 0's shard
    print(f"{per_rank} per rank: rank 0 normalises with mean {shard.mean():.3f}, "
          f"var {shard.var(unbiased=False):.3f}")  # fmt: skip

# %% [markdown]
# The mean of $b$ samples with standard deviation 2 is itself off by about $2/\sqrt{b}$:
# $0.71$ for 8 per rank, $1.41$ for 2 per rank, and the variance of 2 samples can be almost 0,
# so dividing by its square root blows the normalised values up. With many examples per rank
# (say 32 or more) plain BatchNorm under DDP is usually fine and SyncBatchNorm only costs time.

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch11_q_ring_steps`).** A ring all-reduce over 4 workers: how many steps? Set
# `ring_steps` to a number.
#
# **Question 2 (`ch11_q_ring_megabytes`).** Each of the 4 workers holds 100 MB of gradients.
# How many MB does each worker send during the ring all-reduce? Set `ring_megabytes`.
#
# **Question 3 (`ch11_q_dataparallel`).** Why does DDP usually train faster than
# `nn.DataParallel` on the same GPUs? Set `dataparallel_answer` to one letter.
#
# * **a**: DataParallel cannot use more than two GPUs.
# * **b**: DDP runs one process per GPU, so replicas share no GIL, weights are copied once,
#   and only gradients travel, all-reduced while backward runs; DataParallel scatters the
#   inputs, copies the weights and gathers the outputs through GPU 0 in one process, every
#   step.
# * **c**: DDP does fewer floating-point operations per example.
# * **d**: DataParallel computes different gradients from one process on the whole batch.

# %% nbgrader={"grade_id": "ch11_questions", "solution": true}
ring_steps = None
ring_megabytes = None
dataparallel_answer = None
### BEGIN SOLUTION
ring_steps = 6
ring_megabytes = 150
dataparallel_answer = "b"
### END SOLUTION

# %% nbgrader={"grade_id": "ch11_q_ring_steps", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(ring_steps, "ch11_q_ring_steps")
### BEGIN HIDDEN TESTS
check_number(
    ring_steps,
    "ch11_q_ring_steps",
    expected=6,
    hints={
        3: "that is reduce-scatter alone: the all-gather takes N − 1 more steps.",
        8: "there are 2(N − 1) steps, not 2N: a ring of N passes a chunk N − 1 times per phase.",
        4: "one step per worker is not enough: count both phases, N − 1 steps each.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch11_q_ring_megabytes", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(ring_megabytes, "ch11_q_ring_megabytes")
### BEGIN HIDDEN TESTS
check_number(
    ring_megabytes,
    "ch11_q_ring_megabytes",
    expected=150,
    hints={
        75: "that is reduce-scatter alone: the all-gather sends as much again.",
        600: "each step sends one chunk of S/N = 25 MB, not the whole 100 MB.",
        300: "(N − 1)·S is what the root of a naive all-reduce receives; the ring sends "
        "2(N − 1) chunks of 25 MB.",
        200: "2S is the limit for very many workers; with 4 it is 2(N − 1)/N·S.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch11_q_dataparallel", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(dataparallel_answer, "ch11_q_dataparallel", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    dataparallel_answer,
    "ch11_q_dataparallel",
    choices="abcd",
    correct="b",
    why_not={
        "a": "DataParallel uses every visible GPU; the trouble is how, not how many.",
        "c": "both run the same forward and backward per example; the difference is overhead.",
        "d": "DataParallel's gradients are the whole batch's too; it is slower, not wrong.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# dist.init_process_group("gloo" if cpu else "nccl", ...)  # without it: no group, no all-reduce
# sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED)
#                                              # without it: every rank trains on the same data
# loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
#                                              # whole GLOBAL_BATCH per rank: the steps change
# model = DistributedDataParallel(model)       # without it: ranks drift apart, no averaging
# sampler.set_epoch(epoch)                     # without it: every epoch repeats epoch 0's order
# torch.save(model.module.state_dict(), path)  # model.state_dict(): every key gets "module."
# dist.destroy_process_group()                 # in a finally: or a failed run can hang
#
# with model.no_sync():                        # all micro-batches but the last:
#     (loss / k).backward()                    #   without it, k all-reduces instead of 1
# if rank == 0:
#     torch.save(model.module.state_dict(), path)
# dist.barrier()                               # without it: a rank reads a missing/partial file
# torch.load(path, map_location=device, weights_only=True)  # without it: all onto cuda:0
# keep = ~padded_positions(n, world_size, rank)  # without it: padded repeats counted twice
# # torchrun --max-restarts=1 …                # + resume from the newest checkpoint on start
# fully_shard(layer, mesh=mesh)                # FSDP2: each rank keeps its rows (ZeRO-3)
# dcp.save(state, checkpoint_id=folder)        # sharded checkpoint: one file per rank
# ```
#
# * Averaging the gradients of equal shards gives the whole batch's gradient ($-22.5$ both
#   ways); DDP matches one process to about $10^{-7}$, not bit for bit, because the sums run
#   in another order.
# * DDP multiplies each rank's gradient by $1/N$ before the all-reduce sums them, not after:
#   with 3 ranks only that order reproduces its gradients bit for bit.
# * A ring all-reduce takes $2(N - 1)$ steps and sends $2(N - 1)/N \cdot S$ per worker:
#   6 steps and 150 MB for 4 workers and 100 MB.
# * Start processes with `torchrun` (gloo on CPU, NCCL on GPU), not `nn.DataParallel`.
# * Scale the learning rate with the global batch as a heuristic, with warm-up, and check it.
# * Per rank, fp32 + Adam costs 16 bytes per parameter under DDP; ZeRO-1/2/3 (FSDP) shard the
#   optimizer state, the gradients and the parameters: 16, 9, 5.5 and 2 GB for 1B parameters
#   on 8 GPUs.
# * `no_sync()` accumulates $k$ micro-batches with 1 all-reduce instead of $k$; the gradients
#   agree to float32 rounding.
# * Rank 0 saves `model.module.state_dict()`, a barrier, every rank loads with `map_location`:
#   all ranks end with identical weights.
# * `DistributedSampler` pads 11 examples to 12 on 2 ranks; the naive all-reduced accuracy is
#   4/12 instead of 4/11. Masking the padded positions or de-duplicating gathered indices gives
#   the single process's accuracy exactly.
# * `torchrun --max-restarts=1` restarts the whole group after a crash; resumed from its step-4
#   checkpoint, the run ends with the uncrashed run's weights bit for bit. In torch 2.13 a gloo
#   restart needed `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` here.
# * FSDP2 runs on the CPU with gloo: each rank holds its rows (29 and 20 of 49 parameters: the
#   calculator's average, split by rows), the weights equal DDP's, and DCP saves one file per
#   rank.
# * `SyncBatchNorm` shares BatchNorm's statistics between ranks; it matters with small
#   per-rank batches.
#
# Next, chapter 12 puts the whole loop on one page.
