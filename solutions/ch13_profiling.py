# %% [markdown]
# # Chapter 13 · Profiling: where the time and the memory go
#
# A training loop that is slower than it should be rarely says why. The GPU (or the CPU's
# arithmetic) may be waiting for the next batch, for Python, or for a number the loop prints
# every step; the memory may peak in the backward pass or in the optimizer. Guessing which is
# how weeks get lost. This chapter measures instead: it runs the spiral classifier of chapter
# 08 under `torch.profiler`, reads the table and a trace, finds a slow input pipeline in the
# profile, fixes it and measures the gain, and looks at the costs that hide in `.item()` and in
# memory. Every number below is measured on the machine running this notebook.
#
# **By the end of this chapter you can:**
#
# 1. profile a loop with `torch.profiler`, mark its phases with `record_function`, read
#    `key_averages()` (self time against total time) and open the trace in Perfetto;
# 2. find the bottleneck phase from a profile, and tell an input pipeline that starves the
#    model from a model that is slow;
# 3. fix a pipeline that decodes every example in every epoch, and measure the gain;
# 4. say what `.item()` costs on your device and why it costs more on a GPU;
# 5. read memory by phase: the profiler's allocator view on a CPU, and the CUDA memory
#    snapshot on a GPU.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
THREADS = 1  # CPU threads for torch: on a shared 2-core machine, more threads time the neighbours
N_PER_ARM = 256  # spiral points per arm: 512 examples in all
BATCH = 64  # examples per batch: 8 batches per epoch
READ_LATENCY_S = 0.0003  # each example waits this long when it is read, as from a disk
HIDDEN = 64  # width of the classifier's two hidden layers
PROFILED_STEPS = 4  # steps the profiler records, after one it skips and one it warms up on

import json

import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader

from forge_course import pick_device
from forge_course.data import make_spiral
from forge_course.data.decoding import DecodingDataset
from forge_course.device import describe
from forge_course.sims.display import PALETTE

device = pick_device()
torch.set_num_threads(THREADS)
torch.manual_seed(SEED)
print("Running on", describe(device))

# %% [markdown]
# ## 1 · A profile of the running example
#
# The running example is chapter 08's classifier on two spiral arms, with one change that
# real projects have: its examples are stored as text and decoded when they are read
# (`forge_course.data.decoding.DecodingDataset`: each `dataset[i]` waits `READ_LATENCY_S`, as a
# read from a disk does, then parses a line of numbers into a tensor).
#
# The loop marks its four phases with `torch.profiler.record_function`: a named range that
# shows up as a row in the profiler's table and as a bar in its trace. Everything the step
# does is inside one of them, so the four phases add up to the step.

# %%
from forge_course.reference.profiling import PHASES, phase_ms, quiet_profiler, timed_ms

points, labels = make_spiral(n_per_class=N_PER_ARM, classes=2, seed=SEED)
dataset = DecodingDataset(points, labels, latency_s=READ_LATENCY_S)


def make_model():
    torch.manual_seed(SEED)
    return nn.Sequential(
        nn.Linear(2, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2)
    ).to(device)


def train(loader, steps, model, optimizer, on_step=lambda: None, log_every_step=False):
    """`steps` training steps over `loader` (epochs restart as needed), phases marked."""
    losses, batches = [], iter(loader)
    for _ in range(steps):
        with record_function("data"):
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            x, y = x.to(device), y.to(device)
        with record_function("forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        with record_function("backward"):
            optimizer.zero_grad()
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
        losses.append(loss.item() if log_every_step else loss.detach())
        on_step()
    return losses


activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


def profiled(loader, log_every_step=False, profile_memory=False):
    """Profile 1 + 1 + PROFILED_STEPS steps: skip one, warm up on one, record the rest."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    plan = schedule(wait=1, warmup=1, active=PROFILED_STEPS, repeat=1)
    with quiet_profiler(), profile(activities=activities, schedule=plan,
                                   profile_memory=profile_memory) as prof:  # fmt: skip
        train(loader, 2 + PROFILED_STEPS, model, optimizer, prof.step, log_every_step)
    return prof


def shuffled(data):
    return DataLoader(data, batch_size=BATCH, shuffle=True,
                      generator=torch.Generator().manual_seed(SEED))  # fmt: skip


slow_prof = profiled(shuffled(dataset))
print(
    slow_prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=48)
)

# %% [markdown]
# How to read it. Each row is one name: a phase you marked, an operator (`aten::addmm` is the
# matrix multiply inside `nn.Linear`), or a range PyTorch marks itself (`enumerate(DataLoader)…`
# is fetching a batch; `Optimizer.step#SGD.step` is the update; `ProfilerStep*` is a whole
# step, from one `prof.step()` to the next). Rows **nest**: `forward`
# contains `aten::linear`, which contains `aten::addmm`. So there are two times per row:
#
# * **CPU total**: from the range's start to its end, everything inside included;
# * **Self CPU**: the total minus the time of the rows recorded inside it.
#
# A phase's cost is its **total**. Its self time is only the Python and bookkeeping between
# the operators it calls, as the next cell shows for the forward pass. The percentages of the
# "CPU total %" column add up to far more than 100% for the same reason: nested rows count
# the same time again.

# %%
forward_row = next(r for r in slow_prof.key_averages() if r.key == "forward")
print(f"forward over {forward_row.count} steps: CPU total {forward_row.cpu_time_total / 1e3:.2f} ms, "
      f"self {forward_row.self_cpu_time_total / 1e3:.2f} ms, "
      f"{forward_row.cpu_time / 1e3:.2f} ms per call")  # fmt: skip
assert forward_row.count == PROFILED_STEPS
assert forward_row.self_cpu_time_total < forward_row.cpu_time_total

# %% [markdown]
# ### The trace
#
# The table sums; the trace shows each event where it happened in time. The next cell writes
# it to `ch13_trace.json`, next to this notebook. Download it and drop it on
# [ui.perfetto.dev](https://ui.perfetto.dev) (or `chrome://tracing` in Chrome): each thread is a
# lane, each range a bar, and you can zoom into one step and click any bar for its duration. It
# is the view to use when the question is *when* (what waited for what), not *how much*.
#
# The cell also reads the file back and draws the four phases of each recorded step, the way
# the trace viewer shows the top of the main thread's lane.

# %%
slow_prof.export_chrome_trace("ch13_trace.json")
with open("ch13_trace.json") as f:
    events = json.load(f)["traceEvents"]
marked = [e for e in events if e.get("ph") == "X" and e.get("name") in PHASES]
origin = min(e["ts"] for e in marked)
print(f"ch13_trace.json: {len(events)} events, {len(marked)} of them the loop's phases")

colours = dict(zip(PHASES, [PALETTE["orange"], PALETTE["blue"], PALETTE["sky"], PALETTE["green"]]))
fig, ax = plt.subplots(figsize=(10, 2.2))
for phase in PHASES:
    bars = [((e["ts"] - origin) / 1e3, e["dur"] / 1e3) for e in marked if e["name"] == phase]
    ax.broken_barh(bars, (0, 1), color=colours[phase], label=phase)
ax.set(xlabel="time since the first recorded step began (ms)", yticks=[],
       title=f"{PROFILED_STEPS} steps of the running example, read back from ch13_trace.json")  # fmt: skip
ax.legend(ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45), frameon=False)
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: a single lane of coloured bars over time, one group per step. In each step a long
# orange bar (data) comes first, followed by three short bars: forward (blue), backward (light
# blue) and the optimizer's update (green). The orange bars take most of the lane.*
#
# ## Exercise 1 · `ch13_bottleneck`: find the bottleneck in a profile
#
# Write `bottleneck(averages, phases)`:
#
# * `averages` is what `prof.key_averages()` returns: rows with `.key` (the name),
#   `.count`, `.cpu_time_total` and `.self_cpu_time_total` (microseconds, summed over every
#   call), and `.cpu_time` (the average per call);
# * `phases` is the list of `record_function` labels that together cover the step;
# * a phase may have more than one row: a table grouped by call site
#   (`key_averages(group_by_stack_n=1)`) or by input shape lists it once per group, and its
#   time is the sum of its rows;
# * return `(name, share)`: the phase with the largest total CPU time (the first in `phases`
#   on a tie), and its time divided by the sum of all the phases' times.
#
# The visible check gives four tables: the loop above (with its `ProfilerStep*` row, larger than
# any phase), a loop that accumulates four micro-batches per update (so data, forward and
# backward run four times as often as the optimizer), one whose `forward` comes in two rows, and
# one where two phases tie. The hidden check adds a loop whose pipeline has been fixed, rows in
# other orders and other time scales.


# %% nbgrader={"grade_id": "ch13_bottleneck", "solution": true}
def bottleneck(averages, phases):
    ### BEGIN SOLUTION
    totals = dict.fromkeys(phases, 0.0)
    for row in averages:
        if row.key in totals:
            totals[row.key] += row.cpu_time_total
    name = max(phases, key=lambda phase: totals[phase])
    return name, totals[name] / sum(totals.values())
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch13_bottleneck_tests", "grade": true, "points": 2}
# Visible tests: a plain loop, 4 micro-batches per update, a phase in two rows, and a tie.
from forge_course.grading import ch13

ch13.check_bottleneck(bottleneck)
print("bottleneck: the phase with the most inclusive time, and its share of the step.")
### BEGIN HIDDEN TESTS
ch13.check_bottleneck(bottleneck, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# Now the real profile of section 1, read by the course's own `bottleneck`
# (`forge_course.reference.profiling`; yours gives the same once its check passes, and the
# cells below use the course's so that they run before you have written yours):

# %%
from forge_course.reference import profiling as ref_profiling

slow_phase, slow_share = ref_profiling.bottleneck(slow_prof.key_averages(), PHASES)
slow_ms = phase_ms(slow_prof.key_averages())
print("each phase over the recorded steps (ms):", {k: round(v, 2) for k, v in slow_ms.items()})
print(f"bottleneck: {slow_phase}, {slow_share:.0%} of the step")
assert slow_phase == "data"

# %% [markdown]
# ## 2 · The input pipeline as the bottleneck
#
# The profile says the model waits for its data most of the time. Inside the `data` phase the
# table has one large row, `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`: the
# DataLoader fetching a batch in the main process (`num_workers=0`), which means calling
# `dataset[i]` 64 times, each with its read and its parse. It does so again in every epoch,
# for examples it has decoded before.
#
# There are two standard fixes:
#
# * **Decode once and keep the tensors**, when the data set fits in memory (this one is 512 ×
#   2 floats). Every later epoch reads from memory.
# * **Workers**: `DataLoader(..., num_workers=W)` decodes in W other processes while the model
#   trains, `prefetch_factor` batches ahead per worker. This hides the decoding behind the
#   model's work, if there are cores for it, at the price of starting the workers (chapter 02
#   measured that) and of memory per worker. With a GPU, `pin_memory=True` and
#   `.to(device, non_blocking=True)` let the copy to the GPU overlap as well.
#
# ## Exercise 2 · `ch13_preload`: decode every example once
#
# Write `preload(dataset)` returning a dataset that a DataLoader reads as it would `dataset`,
# with the same batches for the same shuffling generator, but that never calls `dataset[i]`
# again after `preload` returns:
#
# * `dataset[i]` returns `(x, y)`: `x` a float tensor of features, `y` a 0-d long tensor;
# * read each example **once** (each `dataset[i]` call decodes, and counts as one decode);
# * keep the order: index `i` of the result is example `i`.
#
# The check does not time anything: its data set counts its decodes, and it compares the
# batches of three shuffled epochs with the reference's. The hidden check adds a single
# partial batch and other sizes.


# %% nbgrader={"grade_id": "ch13_preload", "solution": true}
def preload(dataset):
    ### BEGIN SOLUTION
    pairs = [dataset[i] for i in range(len(dataset))]
    inputs = torch.stack([x for x, _ in pairs])
    targets = torch.stack([y for _, y in pairs])
    return torch.utils.data.TensorDataset(inputs, targets)
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch13_preload_tests", "grade": true, "points": 2}
# Visible tests: 20 examples of 3 features, batches of 6, three shuffled epochs.
from forge_course.grading import ch13

ch13.check_preload(preload)
print("preload: every example decoded once, the same batches in every epoch.")
### BEGIN HIDDEN TESTS
ch13.check_preload(preload, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ### The gain, measured
#
# The next cell times three epochs of training with the decoding data set and with its
# preloaded copy (preloading included in the time), then profiles the preloaded loop again.
# Like the cell after exercise 1, it uses the course's `preload`, so that it runs whatever
# state your answer is in. A
# timing on a shared machine moves from run to run; the ratio between two loops timed side by
# side moves much less.

# %%
EPOCHS = 3
steps = EPOCHS * len(shuffled(dataset))


def run_epochs(make_data):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(shuffled(make_data()), steps, model, optimizer)


dataset.decoded = 0
slow_epochs_ms = timed_ms(lambda: run_epochs(lambda: dataset), device)
slow_decodes = dataset.decoded
dataset.decoded = 0
fast_epochs_ms = timed_ms(lambda: run_epochs(lambda: ref_profiling.preload(dataset)), device)
fast_decodes = dataset.decoded
print(f"{EPOCHS} epochs decoding every read:   {slow_epochs_ms:7.1f} ms, {slow_decodes} decodes")
print(f"{EPOCHS} epochs after preload(dataset): {fast_epochs_ms:7.1f} ms, {fast_decodes} decodes")
print(f"gain: {slow_epochs_ms / fast_epochs_ms:.1f}× faster")
assert slow_decodes == EPOCHS * len(dataset) and fast_decodes == len(dataset)

fast_prof = profiled(shuffled(ref_profiling.preload(dataset)))
fast_ms = phase_ms(fast_prof.key_averages())
fast_phase, fast_share = ref_profiling.bottleneck(fast_prof.key_averages(), PHASES)
print("each phase after the fix (ms):", {k: round(v, 2) for k, v in fast_ms.items()})
print(f"data was {slow_share:.0%} of the step; now the bottleneck is {fast_phase} "
      f"({fast_share:.0%}) and data is {fast_ms['data'] / sum(fast_ms.values()):.0%}")  # fmt: skip
assert fast_ms["data"] < slow_ms["data"]

fig, ax = plt.subplots(figsize=(8, 2.4))
for row, times in enumerate((slow_ms, fast_ms)):
    left = 0.0
    for phase in PHASES:
        ax.barh(row, times[phase], left=left, color=colours[phase],
                label=phase if row == 0 else None)  # fmt: skip
        left += times[phase]
ax.set(yticks=[0, 1], yticklabels=["decoding every read", "after preload"],
       xlabel=f"time of {PROFILED_STEPS} profiled steps (ms), by phase",
       title="The same loop before and after the fix")  # fmt: skip
ax.legend(ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.4), frameon=False)
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: two stacked horizontal bars, each split into data (orange), forward (blue),
# backward (light blue) and optimizer (green). The upper bar, decoding on every read, is long
# and mostly orange; the lower bar, after preload, is much shorter, and its orange part is
# small beside the model's phases.*
#
# The decodes are exact (one per example per epoch before, one per example after); the times
# are this machine's, printed above. Two things bound the gain. Preloading pays one epoch of
# decoding up front, so over 3 epochs it saves at most 2 of them, and more epochs save more.
# And a fix can never remove more than its phase's share of the step: the model's phases
# are unchanged. Look at what is left of the data phase after the fix: the DataLoader still
# builds each batch from 64 single-example reads and a `torch.stack`, which the profile shows
# as `aten::stack` and many small `aten::select` rows under `enumerate(DataLoader)…`. Whether
# that is now the largest phase depends on how fast this device runs the model; the line
# printed above says which it is here.
#
# ## 3 · Simulation: workers, batch size and the idle model
#
# When decoding cannot be done once (the data set is too big, or every epoch augments
# differently), workers are the fix. The simulation below replays a DataLoader with W workers:
# worker `j % W` loads batch `j`, each worker may run `prefetch_factor` batches ahead, and the
# model takes the batches in order, waiting (grey) when the next one is not ready. Its costs
# come from this machine: the loading time per example and the compute time of a batch, both
# measured in the next cells.
#
# ### By hand: the steady state
#
# Say a batch takes $L = 8$ ms to load and $C = 3$ ms to compute.
#
# * Without workers the main process does both in turn: a step takes $L + C = 11$ ms, and the
#   model is idle $8 / 11 \approx 73\%$ of the time.
# * With $W = 2$ workers, a batch is ready every $L / W = 4$ ms, while the model could take
#   one every 3 ms: the workers set the pace, a step takes $\max(C, L / W) = 4$ ms, and the
#   model waits $1$ ms in $4$, $25\%$ of the time.
# * With $W = 3$: $L / W \approx 2.67 < 3$, so the model sets the pace, a step takes 3 ms and
#   the model never waits. A fourth worker gains nothing.
#
# The next cell checks these numbers with the simulator.

# %%
from forge_course.sims.profile_explorer import costs, profile_explorer_view, simulate

expected = {0: (11.0, 8 / 11), 1: (8.0, 5 / 8), 2: (4.0, 0.25), 3: (3.0, 0.0), 4: (3.0, 0.0)}
for workers, (step_ms, idle) in expected.items():
    timeline = simulate(load_ms=8, compute_ms=3, workers=workers, prefetch=2, steps=40)
    assert abs(timeline.steady_step_ms - step_ms) < 1e-9, (workers, timeline.steady_step_ms)
    assert abs(timeline.idle_share - idle) < 1e-9
    print(f"W = {workers}: step {timeline.steady_step_ms:.2f} ms, idle {timeline.idle_share:.0%}")

# %% [markdown]
# The costs of this machine: loading, from the profile of the decoding loop (its data phase
# over the examples it read); compute, timed on batches of two sizes so that the fixed part
# (launching operators, the update) and the part per example can be told apart.

# %%
load_per_example_ms = slow_ms["data"] / (PROFILED_STEPS * BATCH)
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def compute_ms(batch, repeats=7):
    x, y = points[:batch].to(device), labels[:batch].to(device)

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()
    return min(timed_ms(step, device) for _ in range(repeats))


small, large = compute_ms(16), compute_ms(256)
per_example_ms = max(large - small, 0.0) / (256 - 16)
fixed_ms = max(small - 16 * per_example_ms, 0.0)
print(f"loading: {load_per_example_ms * 1e3:.0f} µs per example (READ_LATENCY_S is "
      f"{READ_LATENCY_S * 1e6:.0f} µs of it)")  # fmt: skip
print(f"compute: {small:.3f} ms for 16 examples, {large:.3f} ms for 256 → about "
      f"{fixed_ms:.3f} ms per step plus {per_example_ms * 1e3:.2f} µs per example")  # fmt: skip
load, compute = costs(BATCH, load_per_example_ms, fixed_ms, per_example_ms)
print(f"a batch of {BATCH}: load {load:.2f} ms, compute {compute:.2f} ms")

# %% [markdown]
# ### The explorer
#
# Slide the number of workers, the batch size and `prefetch_factor`. The title gives the
# steady step time, the time per example and the share of it the model spends waiting. The
# time axis spans the same steps run without workers, so the bars end earlier as workers join.
#
# Things to try: workers from 0 upwards, until the grey gaps close (that is where
# $L / W \le C$); then a bigger batch (compute's fixed part is paid once per step, so the
# time per example falls); then `prefetch_factor` 1 against 4 (in the steady state it changes
# nothing: it only absorbs uneven loading times, which this model does not have). The
# simulation assumes the workers' loading *waits* (reads, as here): CPU-bound decoding in more
# workers than the machine has cores does not overlap this well.
#
# *Without a widget front end this cell shows the figure for 2 workers.*

# %%
profile_explorer_view(load_per_example_ms, fixed_ms, per_example_ms, workers=2, batch=BATCH)

# %% [markdown]
# *Alt text: a timeline. The top lane, the model, alternates blue compute bars and grey
# waiting gaps; below it, one lane per worker shows orange loading bars. The title states the
# step time, the time per example and the share of time the model is idle.*
#
# ## 4 · `.item()` and other synchronisations
#
# On a GPU, PyTorch calls return as soon as the work is *queued*: the CPU runs ahead and
# queues the next operators while the GPU computes. `.item()` (and `print(tensor)`,
# `.tolist()`, `.cpu()`, `if tensor > 0:`) needs the value, so the CPU stops and waits until
# the GPU has finished everything queued before it. One `.item()` per step makes every step
# wait for the GPU to drain, and the CPU can no longer prepare the next step meanwhile. On a
# CPU there is no queue: the value exists when the operator returns, so `.item()` only
# converts a number.
#
# The next cell trains the preloaded loop twice, logging the loss with `.item()` every step or
# keeping the tensor (`loss.detach()`) and reading all of them once at the end, and counts the
# rows the profiler records for the reads.

# %%
fast_data = ref_profiling.preload(dataset)
steps = 4 * len(shuffled(fast_data))


def logged_run(every_step):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = train(shuffled(fast_data), steps, model, optimizer, log_every_step=every_step)
    return losses if every_step else torch.stack(losses).tolist()


times = {True: [], False: []}
for _ in range(3):  # alternating, so that a busy moment of the machine hits both alike
    for every_step in (True, False):
        times[every_step].append(timed_ms(lambda e=every_step: logged_run(e), device))
for every_step, label in ((True, ".item() every step"), (False, "one read at the end")):
    runs = ", ".join(f"{t:.1f}" for t in times[every_step])
    print(f"{label:20}: fastest {min(times[every_step]):6.1f} ms for {steps} steps (runs: {runs})")
# the same numbers, read at another time
torch.testing.assert_close(torch.tensor(logged_run(True)), torch.tensor(logged_run(False)))

item_prof = profiled(shuffled(fast_data), log_every_step=True)
reads = {r.key: r.count for r in item_prof.key_averages()
         if r.key in ("aten::item", "aten::_local_scalar_dense") or "Synchronize" in r.key}  # fmt: skip
print(f"rows for reading values in {PROFILED_STEPS} profiled steps:", reads)
assert reads.get("aten::item") == PROFILED_STEPS

# %% [markdown]
# Each `.item()` shows up as an `aten::item` row calling `aten::_local_scalar_dense` (the copy
# of one number to Python), once per step. On a GPU the wait appears as well: as
# `cudaStreamSynchronize` or `cudaMemcpyAsync` rows with a long CPU time in the table, and in
# the trace as a CPU bar that lasts until the GPU lane goes quiet. Whether the two timings
# above differ beyond their noise depends on the device: compare the fastest of each kind
# with the spread of its three runs. On a CPU, where nothing is queued, a difference that
# stays within the spread is noise. On a GPU the cost is the time the CPU could have spent
# queueing the next step, so it grows as steps get shorter. The rule holds everywhere: keep
# values on the device inside the loop, and read them when you log (every 50 steps, say),
# not every step.
#
# ## 5 · Where the memory goes
#
# Time is one half of a profile; memory is the other. What a step holds at its peak decides
# the batch size that fits.
#
# **On a CPU**, `profile(profile_memory=True)` records every allocation and free by the
# operator that made it. In the table, "CPU Mem" is what a row allocated minus what it freed,
# everything inside it included; "Self CPU Mem" leaves out the rows inside it. For the phases,
# a positive number is memory the phase leaves behind for a later one: the forward pass keeps
# activations for backward, and backward frees them.

# %%
memory_prof = profiled(shuffled(fast_data), profile_memory=True)
on_gpu = device.type == "cuda"  # tensors on a GPU are counted in the device's column
own_memory = "self_device_memory_usage" if on_gpu else "self_cpu_memory_usage"
print(memory_prof.key_averages().table(sort_by=own_memory, row_limit=6,
                                       max_name_column_width=40))  # fmt: skip
phase_kib = {
    r.key: (r.device_memory_usage if on_gpu else r.cpu_memory_usage) / 1024 / r.count
    for r in memory_prof.key_averages()
    if r.key in PHASES
}
for phase in PHASES:
    print(f"{phase:9}: {phase_kib.get(phase, 0.0):+8.1f} KiB per step, net")
relu_kib = BATCH * HIDDEN * 4 / 1024
logits_kib = BATCH * 2 * 4 / 1024
kept_kib = 2 * relu_kib + logits_kib
print(f"by hand: 2 ReLU outputs of {relu_kib:.0f} KiB + {logits_kib} KiB of log-probabilities "
      f"= {kept_kib} KiB kept for backward")  # fmt: skip
if not on_gpu:
    assert abs(phase_kib["forward"] - kept_kib) < 0.1 * kept_kib

# %% [markdown]
# The forward pass leaves behind what backward needs, and the hand count finds it: each ReLU's
# output ($64 \times 64$ float32, $64 \cdot 64 \cdot 4 = 16384$ bytes $= 16$ KiB) is saved
# once, and serves both the ReLU's backward and the next layer's weight gradient; the input
# batch already existed, the outputs of the first two `Linear` layers are not kept (the ReLU
# after each needs only its own output), and the loss keeps its log-probabilities
# ($64 \times 2 \times 4$ bytes $= 0.5$ KiB). In all $2 \times 16 + 0.5 = 32.5$ KiB, next to
# the forward row's measured number above. Backward frees most of it (and leaves the
# gradients, which stay until `zero_grad`). The table above ranks the operators by what they
# allocated themselves ("Self ... Mem"): its top rows are where to look first when a step
# runs out of memory.
#
# **On a GPU**, the CUDA caching allocator keeps its own books, and they say more:
#
# * `torch.cuda.max_memory_allocated()` is the peak since `torch.cuda.reset_peak_memory_stats()`:
#   reset it before a phase, read it after, and you have the peak **by phase**;
# * `torch.cuda.memory._record_memory_history()` records every allocation with its Python
#   stack, and `torch.cuda.memory._dump_snapshot("snapshot.pickle")` writes them to a file that
#   [pytorch.org/memory_viz](https://pytorch.org/memory_viz) draws as a timeline of every live
#   tensor: the place to see *which* line holds the peak.
#
# The next cell runs both on a GPU. On a CPU the allocator keeps no such books (the memory
# comes from the system's `malloc`), so it prints what it would do and the profiler's numbers
# above stand in for it.

# %%
if device.type == "cuda":
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = fast_data.tensors[0][:BATCH].to(device), fast_data.tensors[1][:BATCH].to(device)
    torch.cuda.memory._record_memory_history(max_entries=100_000)

    def peak_kib(work):
        """What work() returns, and the most memory it held above what was allocated before."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = work()
        torch.cuda.synchronize()
        return result, (torch.cuda.max_memory_allocated() - before) / 1024

    peaks = {}
    for _ in range(2):  # the second step also has the optimizer's momentum buffers
        loss, peaks["forward"] = peak_kib(lambda: nn.functional.cross_entropy(model(x), y))
        _, peaks["backward"] = peak_kib(loss.backward)
        _, peaks["optimizer"] = peak_kib(optimizer.step)
        optimizer.zero_grad()
    torch.cuda.memory._dump_snapshot("ch13_memory_snapshot.pickle")
    torch.cuda.memory._record_memory_history(enabled=None)
    for phase, kib in peaks.items():
        print(f"{phase:9}: peak {kib:8.1f} KiB above what the step held when the phase began")
    print("wrote ch13_memory_snapshot.pickle: drop it on https://pytorch.org/memory_viz")
else:
    print(
        f"{describe(device)}: no CUDA allocator here. On a GPU this cell records the peak "
        "of each phase with torch.cuda.max_memory_allocated() and writes a memory snapshot."
    )

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch13_q_step_ms`).** Loading a batch takes 12 ms and computing on it 5 ms. The
# DataLoader has 2 workers and `prefetch_factor=2`. In the steady state, how many milliseconds
# does a training step take? Set `step_ms`.
#
# **Question 2 (`ch13_q_phase_time`).** In `prof.key_averages().table()`, the row `forward`
# (a `record_function` range) shows Self CPU 1.1 ms and CPU total 2.9 ms, over 5 calls. How
# long did the forward passes take? Set `phase_answer` to one letter.
#
# * **a**: 1.1 ms, the self time: that is the time of the forward pass alone.
# * **b**: 2.9 ms, the total: the operators called inside the range are part of the forward
#   pass.
# * **c**: 4.0 ms, the self time plus the total.
# * **d**: 0.58 ms, the total divided by the 5 calls.
#
# **Question 3 (`ch13_q_sync`).** On a GPU, a loop calls `loss.item()` after every step to log
# the loss. What does that cost? Set `sync_answer` to one letter.
#
# * **a**: copying one float from the GPU, a few microseconds, and nothing else.
# * **b**: the CPU waits until the GPU has finished all the work queued before it, so it
#   cannot queue the next step's work while the GPU computes.
# * **c**: nothing: the GPU computes `.item()` asynchronously like every other operator.
# * **d**: the GPU stops until Python has printed the number.

# %% nbgrader={"grade_id": "ch13_questions", "solution": true}
step_ms = None
phase_answer = None
sync_answer = None
### BEGIN SOLUTION
step_ms = 6
phase_answer = "b"
sync_answer = "b"
### END SOLUTION

# %% nbgrader={"grade_id": "ch13_q_step_ms", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(step_ms, "ch13_q_step_ms")
### BEGIN HIDDEN TESTS
check_number(
    step_ms,
    "ch13_q_step_ms",
    expected=6,
    hints={
        17: "that is loading and computing one after the other, as without workers. Two "
        "workers load side by side: a batch is ready every 12 / 2 ms.",
        5: "that is the compute alone; the model waits for data, which arrives every 12 / 2 "
        "= 6 ms.",
        12: "that is one worker's pace; two workers make a batch ready every 6 ms.",
        11: "the workers load while the model computes: the step is max(5, 12 / 2), not a sum.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch13_q_phase_time", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(phase_answer, "ch13_q_phase_time", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    phase_answer,
    "ch13_q_phase_time",
    choices="abcd",
    correct="b",
    why_not={
        "a": "self time leaves out the operators recorded inside the range, and a forward pass "
        "is mostly those operators.",
        "c": "the total already includes the self time: adding them counts it twice.",
        "d": "that is the time of one call; the question asks for the 5 forward passes.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch13_q_sync", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(sync_answer, "ch13_q_sync", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    sync_answer,
    "ch13_q_sync",
    choices="abcd",
    correct="b",
    why_not={
        "a": "the copy is small, but it cannot start until the GPU has finished everything "
        "queued before it: the CPU waits for that.",
        "c": "`.item()` returns a Python number, so the CPU must have the value: it waits.",
        "d": "it is the other way round: the CPU waits for the GPU.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],   # CUDA only on a GPU
#              schedule=schedule(wait=1, warmup=1, active=4)) as prof:
#     for step in range(6):
#         with record_function("data"): ...        # name each phase, or the table has no phases
#         prof.step()                              # without it the schedule never advances
# prof.key_averages().table(sort_by="cpu_time_total")  # a phase's cost is its total, not self
# prof.export_chrome_trace("trace.json")           # open in ui.perfetto.dev: when, not how much
# TensorDataset(*decoded)                          # decode once when it fits in memory
# DataLoader(ds, num_workers=W, pin_memory=True)   # or decode beside the model: step = max(C, L/W)
# losses.append(loss.detach())                     # .item() every step makes a GPU's CPU wait
# profile(..., profile_memory=True)                # CPU: memory by operator and phase
# torch.cuda.reset_peak_memory_stats(); torch.cuda.max_memory_allocated()  # GPU: peak by phase
# torch.cuda.memory._record_memory_history(); torch.cuda.memory._dump_snapshot("s.pickle")
# ```
#
# * A profile's table sums and its trace shows order. Rows nest: rank phases by their total
#   time (summed over calls, so a phase that runs more often is not undercounted), never by
#   self time or time per call.
# * In this notebook's decoding loop the data phase was the bottleneck; preloading cut its
#   decodes from one per example per epoch to one per example, and the measured gain is
#   printed in section 2. A fix can gain at most the share of the step its phase held.
# * With workers, the step takes $\max(C, L / W)$ in the steady state (8 ms to load, 3 to
#   compute: 11 ms without workers, 4 ms with 2, 3 ms with 3 or more).
# * `.item()`, `print(tensor)`, `.cpu()` and `if tensor:` read a value: on a GPU each one waits
#   for the queue to drain.
#
# This is the last chapter: chapter 12's capstone is the loop to profile next.
