# %% [markdown]
# # Chapter 10 · Scaling on one device
#
# A model that trains well on a small batch often has to grow: a bigger batch, a deeper
# network, more steps in the same hour. Before reaching for a second device there are four
# tools that change what one device can do, each with a price: **gradient accumulation**
# (a big batch in small pieces, paid for in time), **mixed precision** (16-bit arithmetic,
# paid for in precision), **gradient checkpointing** (less memory, paid for in recomputation),
# and **`torch.compile`** (faster steps, paid for in compile time). This chapter measures each
# one on the machine you are using, because each one's famous number ("2× faster", "60% less
# memory") is true only on some machines and for some models.
#
# **By the end of this chapter you can:**
#
# 1. write gradient accumulation that gives exactly the big batch's update, with an uneven last
#    micro-batch and gradient clipping, and say why it cannot be exact with BatchNorm;
# 2. say which operations autocast runs in 16 bits on your device, show a small gradient
#    vanishing in float16 and surviving with a `GradScaler`, and pick the dtype and scaler per
#    device;
# 3. checkpoint a stack of layers in segments, count the bytes it keeps for backward, and time
#    what the recomputation costs;
# 4. measure what `torch.compile` costs on the first call and saves afterwards, and find a
#    graph break with `torch._dynamo.explain`.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
THREADS = 1  # CPU threads for torch: on a shared 2-core machine, more threads time the neighbours
MICRO_SIZES = [32, 32, 32, 4]  # the running batch of 100 examples, split as a DataLoader would
IN_FEATURES = 8  # inputs per example in the accumulation examples
N_BLOCKS = 16  # blocks in the deep running example (checkpointing, AMP, compile)
WIDTH = 64  # each block is Linear(WIDTH, 4·WIDTH) → GELU → Linear(4·WIDTH, WIDTH)
BATCH = 64  # examples per batch in the deep running example
TIMING_REPEATS = 7  # a timing is the fastest of this many runs, after one warm-up
COMPILE_BUDGET_S = 25  # the torch.compile demo is stopped after this many seconds

import json
import logging
import math
import subprocess
import sys
import time

import matplotlib.pyplot as plt
import torch
from torch import nn

from forge_course import pick_device
from forge_course.device import describe
from forge_course.sims.display import PALETTE

device = pick_device()
torch.set_num_threads(THREADS)
torch.manual_seed(SEED)
print("Running on", describe(device))


def fastest_ms(fn, repeats=TIMING_REPEATS):
    """The fastest of `repeats` calls of fn(), in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


# %% [markdown]
# ## 1 · Gradient accumulation
#
# Activation memory grows with the batch. When 100 examples do not fit at once, run them in
# *micro-batches*: forward and backward on each in turn, let `.grad` add up (backward always
# adds), and make **one** optimizer step at the end. Only one micro-batch's activations are
# alive at any moment.
#
# For that one step to be the big batch's step, the gradients must add up to the big batch's
# gradient. The big batch's loss is the mean over its $N$ examples. Split into micro-batches of
# sizes $n_1, \dots, n_K$ whose mean losses are $L_1, \dots, L_K$, that mean is
#
# $$L = \frac{1}{N}\sum_{\text{all examples}} \ell = \sum_{i=1}^{K} \frac{n_i}{N}\, L_i ,$$
#
# and since the gradient of a sum is the sum of the gradients, backpropagating
# $\frac{n_i}{N} L_i$ for each micro-batch leaves exactly $\nabla L$ in `.grad`. The common
# recipe `loss / K` is the special case where every $n_i = N / K$.
#
# ### By hand: the running batch `[32, 32, 32, 4]`
#
# $N = 32 + 32 + 32 + 4 = 100$. The right weights are $n_i / N = 0.32,\ 0.32,\ 0.32,\ 0.04$
# (they add up to 1). Each example's share of the loss is its micro-batch's weight divided by
# the micro-batch's size: $0.32 / 32 = 0.01$ and $0.04 / 4 = 0.01$, so every example gets
# $1/100$, as in the big batch.
#
# With `loss / K` every micro-batch gets $1/4 = 0.25$. An example in a full micro-batch then
# gets $0.25 / 32 = 0.0078125$, and one of the last 4 gets $0.25 / 4 = 0.0625$: $6.25$ times
# its fair share, and $8$ times as much as any of the other 96. The next cell checks these
# numbers.

# %%
N = sum(MICRO_SIZES)
right = [n / N for n in MICRO_SIZES]
one_over_k = [1 / len(MICRO_SIZES)] * len(MICRO_SIZES)
per_example_right = [w / n for w, n in zip(right, MICRO_SIZES)]
per_example_k = [w / n for w, n in zip(one_over_k, MICRO_SIZES)]
assert N == 100 and right == [0.32, 0.32, 0.32, 0.04] and math.isclose(sum(right), 1)
assert all(math.isclose(w, 0.01) for w in per_example_right)
assert per_example_k == [0.0078125] * 3 + [0.0625]
assert math.isclose(per_example_k[-1] / 0.01, 6.25) and per_example_k[-1] / per_example_k[0] == 8
print("n_i/N weights:       ", right, "→ every example gets", per_example_right[0])
print("1/K weights:         ", one_over_k, "→ per example", per_example_k)

fig, ax = plt.subplots(figsize=(9, 3))
index = torch.arange(N)
ax.step(index, [w for w, n in zip(per_example_k, MICRO_SIZES) for _ in range(n)], where="mid",
        color=PALETTE["vermillion"], label="loss / K")  # fmt: skip
ax.step(index, [w for w, n in zip(per_example_right, MICRO_SIZES) for _ in range(n)],
        where="mid", color=PALETTE["blue"], label="loss · n_i / N")  # fmt: skip
ax.set(xlabel="example (micro-batches of 32, 32, 32, 4)", ylabel="share of the loss",
       title="Each example's weight in the accumulated gradient")  # fmt: skip
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# *Alt text: a step plot over the 100 examples. The blue line (n_i/N weights) is flat at 0.01.
# The vermillion line (1/K weights) sits at 0.0078 for the first 96 examples and jumps to
# 0.0625 for the last 4.*
#
# ### Checked against one big batch
#
# The running model is a small MLP (8 → 32 → 1, Tanh) for regression, in float64 so that
# rounding cannot hide a real difference. The next cell makes one SGD step with momentum on
# all 100 examples at once, and the same step from the four micro-batches, with the course's
# reference `accumulate_step` (`forge_course.reference.accumulation`) and with the `loss / K`
# version. The printed numbers are the largest difference in any parameter after the step.


# %%
from forge_course.reference import accumulation as ref_acc


def make_regressor(seed=SEED, batchnorm=False):
    torch.manual_seed(seed)
    layers = [nn.Linear(IN_FEATURES, 32)]
    layers += [nn.BatchNorm1d(32)] if batchnorm else []
    layers += [nn.Tanh(), nn.Linear(32, 1)]
    return nn.Sequential(*layers).double().to(device)


gen = torch.Generator().manual_seed(SEED)
x_all = torch.randn(N, IN_FEATURES, generator=gen, dtype=torch.float64)
y_all = x_all[:, :1].sin() + 0.1 * torch.randn(N, 1, generator=gen, dtype=torch.float64)
x_all, y_all = x_all.to(device), y_all.to(device)
micro = list(zip(x_all.split(MICRO_SIZES), y_all.split(MICRO_SIZES)))
loss_fn = nn.MSELoss()


def big_batch_step(model, max_grad_norm=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.zero_grad()
    loss = loss_fn(model(x_all), y_all)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def variant_step(model, weights, max_grad_norm=None, clip_each=False):
    """Accumulation with the given per-micro-batch weights; clip_each clips inside the loop."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.zero_grad()
    for (x, y), weight in zip(micro, weights):
        (loss_fn(model(x), y) * weight).backward()
        if clip_each:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if max_grad_norm is not None and not clip_each:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()


def accumulated_step(model, max_grad_norm=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return ref_acc.accumulate_step(model, optimizer, loss_fn, micro, max_grad_norm)


def max_param_difference(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


big, acc, by_k = make_regressor(), make_regressor(), make_regressor()
big_loss = big_batch_step(big)
acc_loss = accumulated_step(acc)
variant_step(by_k, one_over_k)
print(f"loss of the big batch {big_loss:.12f}, returned by accumulate_step {acc_loss:.12f}")
print(f"largest parameter difference from the big batch, n_i/N weights: "
      f"{max_param_difference(big, acc):.1e}")  # fmt: skip
print(f"largest parameter difference from the big batch, 1/K weights:   "
      f"{max_param_difference(big, by_k):.1e}")  # fmt: skip

# %% [markdown]
# The $n_i / N$ version agrees with the big batch to the last few bits of float64 (the sums
# are added in a different order, nothing more); the $1/K$ version is off by far more than
# rounding after a single step. Both losses printed are the mean over all 100
# examples: `accumulate_step` weights each micro-batch's loss by $n_i / N$ as well, so a
# logged loss means the same thing whatever the split.
#
# ### Clip once, after the last micro-batch
#
# `clip_grad_norm_` scales the whole gradient down when its norm is above a threshold. After
# accumulation, `.grad` holds the big batch's gradient only once the last micro-batch's
# backward has run, so that is when to clip: once, just before `optimizer.step()`. Clipping
# inside the loop clips partial sums, and the result is a different update. The next cell
# clips at 0.05 (below this gradient's norm, so clipping acts) three ways: the big batch,
# accumulation clipped once, and accumulation (with the right $n_i / N$ weights) clipped
# after every micro-batch.

# %%
CLIP = 0.05
probe = make_regressor()
loss_fn(probe(x_all), y_all).backward()
grad_norm = torch.cat([p.grad.flatten() for p in probe.parameters()]).norm().item()
print(f"the big batch's gradient norm is {grad_norm:.4f}; clipping to {CLIP}")
assert grad_norm > CLIP

big_c, acc_c, each_c = make_regressor(), make_regressor(), make_regressor()
big_batch_step(big_c, CLIP)
accumulated_step(acc_c, CLIP)
variant_step(each_c, right, CLIP, clip_each=True)
print(f"clipped once, after accumulating:   difference {max_param_difference(big_c, acc_c):.1e}")
print(f"clipped after every micro-batch:    difference {max_param_difference(big_c, each_c):.1e}")

# %% [markdown]
# ### The BatchNorm caveat
#
# The equivalence rests on one fact: each example's loss depends only on that example. A
# `BatchNorm` layer breaks it in training mode: it normalises every example with the mean and
# variance *of its micro-batch*, so an example's output depends on which other examples share
# its micro-batch. Accumulation then computes a different function, not just the same sum in
# pieces. The next cell adds `BatchNorm1d(32)` after the first layer and compares the
# accumulated gradient with the big batch's, for the plain model and the BatchNorm model.


# %%
def gradient(model, batches):
    model.zero_grad()
    total = sum(len(x) for x, _ in batches)
    for x, y in batches:
        (loss_fn(model(x), y) * len(x) / total).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


gaps = {}
for name, batchnorm in (("no batch statistics", False), ("with BatchNorm1d", True)):
    model = make_regressor(batchnorm=batchnorm)
    whole = gradient(model, [(x_all, y_all)])
    pieces = gradient(model, micro)
    gaps[batchnorm] = gap = (whole - pieces).abs().max().item()
    print(f"{name:20} largest gradient difference {gap:.1e} "
          f"(gradient entries up to {whole.abs().max().item():.2f})")  # fmt: skip
assert gaps[False] < 1e-12 and gaps[True] > 1e-3  # float64 rounding; a different gradient

# %% [markdown]
# Without batch statistics the difference is rounding; with BatchNorm it is a different
# gradient. The usual answers: accept the approximation (with micro-batches of 32 the
# statistics are already decent), or use a normalisation that looks at one example at a time
# (`LayerNorm`, `GroupNorm`), which accumulation reproduces exactly.
#
# ## Exercise 1 · `ch10_accumulate_step`: one update from several micro-batches
#
# Write `accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None)`:
#
# * `micro_batches` is a list of `(x, y)` pairs, of possibly different sizes; `loss_fn`
#   returns a batch's mean loss;
# * the parameters after the call must equal one step on all the examples at once, reached
#   the accumulating way: clear the gradients, then for each micro-batch in turn one forward
#   pass and one backward of its loss weighted by $n_i / N$ (never one forward on all of them
#   at once: that is the big batch, with all its activations in memory), clip the total
#   gradient norm to `max_grad_norm` once (when it is given), and step once;
# * return the mean loss over all $N$ examples as a Python float.
#
# The check calls it twice in a row and compares what it returns and every parameter with the
# reference, and it notes the size of every batch the model's forward sees (one forward per
# micro-batch, in order) and when each backward runs: before the next micro-batch's forward, so
# that only one micro-batch's graph is alive at a time. The hidden check adds other splits,
# clipping, AdamW, float64 and every device. Its model has dropout and a forward hook, and its
# caller has put it in train mode: call the model itself (`model(x)`, which runs the hooks) in
# the mode you were given.


# %% nbgrader={"grade_id": "ch10_accumulate_step", "solution": true}
def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    ### BEGIN SOLUTION
    total = sum(len(x) for x, _ in micro_batches)
    optimizer.zero_grad()
    loss_sum = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model(x), y)
        (loss * (len(x) / total)).backward()
        loss_sum += loss.item() * len(x)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss_sum / total
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch10_accumulate_step_tests", "grade": true, "points": 3}
# Visible tests: micro-batches of 6, 6, 6 and 2 examples, SGD with momentum, with and
# without clipping, on the CPU; two calls in a row.
from forge_course.grading import ch10

ch10.check_accumulate_step(accumulate_step)
print("accumulate_step: the big batch's update and loss, clipped once, with an uneven tail.")
### BEGIN HIDDEN TESTS
ch10.check_accumulate_step(accumulate_step, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 2 · Automatic mixed precision
#
# Under `torch.autocast(device_type, dtype=...)` each operation chooses its own precision:
# autocast keeps per-device lists of operations that are safe and fast in 16 bits (matrix
# multiplications, convolutions) and of operations that need float32 (losses, and on some
# devices softmax and reductions). Everything else runs in whatever type its inputs have. The
# parameters stay float32 and so does the optimizer's update: never call `model.half()` for
# AMP.
#
# The lists differ between devices, so rather than copy a table from the documentation, the
# next cell asks this device. Each operation runs twice under autocast: once on float32 inputs
# and once on the 16-bit output of a matmul.

# %%
from forge_course.reference import amp as ref_amp

low = ref_amp.autocast_dtype(device)  # float16 on CUDA and MPS, bfloat16 on the CPU
a = torch.randn(8, 8, device=device)
target = torch.zeros(8, dtype=torch.long, device=device)
ops = {
    "a @ b (matmul)": lambda t: t @ t,
    "F.linear": lambda t: nn.functional.linear(t, t),
    "relu": torch.relu,
    "exp": torch.exp,
    "softmax": lambda t: torch.softmax(t, -1),
    "log_softmax": lambda t: torch.log_softmax(t, -1),
    "sum": torch.sum,
    "mean": torch.mean,
    "layer_norm": lambda t: nn.functional.layer_norm(t, (8,)),
    "t + float32 tensor": lambda t: t + a,
    "mse_loss": lambda t: nn.functional.mse_loss(t, a),
    "cross_entropy": lambda t: nn.functional.cross_entropy(t, target),
}
print(f"autocast on {device.type} with dtype {low}:")
print(f"{'operation':22} {'float32 input':>16} {'16-bit input':>16}")
with torch.autocast(device.type, dtype=low):
    half = a @ a
    assert half.dtype == low
    for name, op in ops.items():
        print(f"{name:22} {str(op(a).dtype):>16} {str(op(half).dtype):>16}")
    assert ops["cross_entropy"](half).dtype == torch.float32  # losses: float32 on every device
    if device.type == "cpu":  # the CPU's float32 list has no softmax and no sum
        assert ops["softmax"](half).dtype == ops["sum"](half).dtype == low

# %% [markdown]
# Read the table column by column. With float32 inputs, only the operations on autocast's
# low-precision list come out in 16 bits; the losses come out in float32. With a 16-bit input,
# operations on no list simply keep the input's type, which is why the output of a matmul
# stays 16-bit through the activations that follow it, until a loss or a float32 operand
# brings it back. (On CUDA, softmax and sums are on the float32 list; on the CPU they are not,
# as the table shows if you are on a CPU.)
#
# ### float16 underflow, and the scaler that prevents it
#
# float16 has 5 exponent bits. Its smallest positive number is a subnormal,
# $2^{-24} \approx 5.96 \times 10^{-8}$, and its smallest normal number is
# $2^{-14} \approx 6.10 \times 10^{-5}$. A value below half the smallest subnormal,
# $2^{-25} \approx 2.98 \times 10^{-8}$, rounds to 0. Gradients of $10^{-8}$ are common in a
# deep network, and in float16 they vanish: **$10^{-8} \to 0$**.
#
# A `GradScaler` multiplies the loss by a scale $S$ (65536 to start) before backward, so every
# gradient is $S$ times larger: $10^{-8} \times 65536 = 6.5536 \times 10^{-4}$, well above
# $2^{-14}$, so it is stored as a normal float16 number with about 3 significant digits. Before
# the step, the scaler divides by $S$ again, in float32, which gives back
# $\approx 10^{-8}$, off by at most float16's relative rounding, $2^{-11} \approx 0.05\%$.
#
# bfloat16 has float32's 8 exponent bits: it reaches down to about $10^{-38}$, and $10^{-8}$
# survives with no scaling at all (with bfloat16's 2 to 3 significant digits). That is why
# bfloat16 needs no scaler. The next cell checks each number, on any device.

# %%
g = torch.tensor(1e-8)
S = 65536.0
assert torch.finfo(torch.float16).smallest_normal * 2.0**-10 == 2.0**-24
assert torch.finfo(torch.float16).smallest_normal == 2.0**-14
assert math.isclose(1e-8 * S, 6.5536e-4)
as_fp16 = g.half().item()
scaled_fp16 = (g * S).half()
recovered = (scaled_fp16.float() / S).item()
as_bf16 = g.bfloat16().item()
assert as_fp16 == 0.0
assert scaled_fp16.item() >= 2.0**-14 and abs(recovered - 1e-8) / 1e-8 < 2.0**-11
assert abs(as_bf16 - 1e-8) / 1e-8 < 2.0**-8
print(f"1e-8 in float16:                      {as_fp16}")
print(f"1e-8 × 65536 in float16:              {scaled_fp16.item():.6e}")
print(f"... divided by 65536 again (float32): {recovered:.6e}")
print(f"1e-8 in bfloat16, no scaling:         {as_bf16:.6e}")

# %% [markdown]
# ### When the scale is too large: skipped steps
#
# Scaling can overshoot: a gradient times $S$ may overflow float16 (its largest value is
# 65504) to `inf`. `scaler.step(optimizer)` checks every gradient first and, if one is `inf` or
# `nan`, **skips the update**; `scaler.update()` then halves $S$. After 2000 clean steps in a
# row it doubles $S$ again, so the scale settles just below where overflow begins. The next
# cell forces an `inf` gradient with a hook and watches a CPU `GradScaler` (it exists on every
# device) refuse the step.

# %%
torch.manual_seed(SEED)
tiny = nn.Linear(4, 1).to(device)
before = tiny.weight.detach().clone()
optimizer = torch.optim.SGD(tiny.parameters(), lr=0.1)
scaler = torch.amp.GradScaler(device.type)
hook = tiny.weight.register_hook(lambda grad: torch.full_like(grad, math.inf))  # a fake overflow
scale_before = scaler.get_scale()
scaler.scale(tiny(torch.ones(2, 4, device=device)).pow(2).mean()).backward()
scaler.step(optimizer)
scaler.update()
hook.remove()
skipped = ref_amp.step_was_skipped(scaler, scale_before)
assert skipped and torch.equal(tiny.weight, before) and scaler.get_scale() == scale_before / 2
print(f"scale {scale_before:.0f} → {scaler.get_scale():.0f}; update skipped: {skipped}; "
      f"weights unchanged: {torch.equal(tiny.weight, before)}")  # fmt: skip
print(f"the scaler this device needs for {low}: {ref_amp.make_scaler(device)}")

# %% [markdown]
# So the rule is short: **float16 needs a `GradScaler`; bfloat16 does not.** Using a scaler
# with bfloat16 does no harm to the numbers, but it is dead weight, and copying such a script to
# float16 without understanding which half mattered is how runs lose their gradients.
#
# ### Which type for this hardware
#
# Autocast's default is float16 on CUDA and Apple MPS and bfloat16 on the CPU, whatever the
# hardware underneath can do. Choose by the hardware instead:
#
# * an NVIDIA GPU with bfloat16 arithmetic (Ampere, compute capability 8.0, and later: A100,
#   RTX 30xx, H100): **bfloat16, no scaler**. Ask for it, `dtype=torch.bfloat16`: the CUDA
#   default is still float16;
# * an older NVIDIA GPU (Volta, Turing: V100, T4): no bfloat16 arithmetic, so **float16 with a
#   `GradScaler`**;
# * a CPU with bfloat16 instructions (AVX512-BF16 or AMX on recent Xeons, some Arm server
#   chips): **bfloat16, no scaler**;
# * a CPU without them: autocast still runs in bfloat16, with the same numbers to bfloat16's
#   precision, but its kernels convert to float32 and back around the arithmetic, so it is
#   slower, and saves only activation memory: **stay in float32** unless memory is what you
#   lack (the measurement after this shows both on your device);
# * Apple MPS: autocast's default, **float16 with a `GradScaler`**.
#
# The next cell asks torch what this device has.


# %%
import platform


def has_bfloat16_arithmetic(device):
    """Whether `device` computes in bfloat16 in hardware, as far as torch can tell."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu" and platform.machine().lower() in ("x86_64", "amd64"):
        # torch's own tests of the CPU's instructions (no public call exists for them). oneDNN's
        # bfloat16 test is not one: it says yes to any AVX-512 CPU, emulating where it must.
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    if device.type == "cpu":  # Arm: oneDNN's test, which there looks for the instructions
        probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return torch.backends.mkldnn.is_available() and probe is not None and probe()
    return False  # MPS: this chapter keeps autocast's float16 there


native = has_bfloat16_arithmetic(device)
if native:
    advice = "bfloat16, no GradScaler"
elif device.type == "cpu":
    advice = "float32: autocast's bfloat16 would be emulated here"
else:
    advice = "float16 with a GradScaler"
print(f"{describe(device)}: bfloat16 arithmetic in hardware: {native}")
print(f"advice for training here: {advice}; autocast's default here is {low}")

# %% [markdown]
# ### Is it faster here? Does it save memory?
#
# The promise is "twice as fast, half the memory". The speed comes from hardware with fast
# 16-bit matrix units (tensor cores on recent NVIDIA GPUs, bfloat16 instructions on some
# CPUs); the memory from activations saved in 16 bits. The next cell measures both on the
# deep running example: 16 blocks of `Linear(64, 256) → GELU → Linear(256, 64)`, one
# forward and backward pass, at two batch sizes. On a GPU it adds a third case, 2 blocks of
# `Linear(2048, 8192) → GELU → Linear(8192, 2048)` at batch 4096: the running example's
# matrices are so small that a GPU spends its time launching kernels, not multiplying, and
# only large matrix products show what tensor cores do. Memory is the bytes saved for
# backward, counted exactly with `saved_activation_bytes`; time is the fastest of
# `TIMING_REPEATS` runs.

# %%
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from forge_course.reference.memory import saved_activation_bytes
from forge_course.sims.memory_compute import make_blocks

blocks = make_blocks(N_BLOCKS, WIDTH, seed=SEED).to(device)
stack = nn.Sequential(*blocks)
amp_cases = [(f"batch {BATCH}", stack, BATCH), (f"batch {16 * BATCH}", stack, 16 * BATCH)]
if device.type == "cuda":  # matrices large enough for tensor cores to matter
    wide = nn.Sequential(*make_blocks(2, 2048, seed=SEED)).to(device)
    amp_cases.append(("wide, batch 4096", wide, 4096))


def forward_backward(model, batch, amp):
    with torch.autocast(device.type, dtype=low, enabled=amp):
        loss = model(batch).float().square().mean()
    loss.backward()
    model.zero_grad()


amp_rows = {}
for name, model, batch_size in amp_cases:
    width = model[0][0].in_features
    xb = torch.randn(batch_size, width, generator=torch.Generator().manual_seed(SEED)).to(device)
    for amp in (False, True):
        with torch.autocast(device.type, dtype=low, enabled=amp):
            kept = saved_activation_bytes(model, xb)
        ms = fastest_ms(lambda m=model, xb=xb, amp=amp: forward_backward(m, xb, amp))
        amp_rows[(name, amp)] = (kept, ms)
        label = f"autocast {str(low)[6:]}" if amp else "float32"
        print(f"{name:16}, {label:18}: {kept / 2**20:7.2f} MiB kept, {ms:8.2f} ms/step")

names = [name for name, _, _ in amp_cases]
fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 3.4))
pos = torch.arange(len(names)).float()
for offset, amp, colour in ((-0.2, False, PALETTE["blue"]), (0.2, True, PALETTE["orange"])):
    label = f"autocast {str(low)[6:]}" if amp else "float32"
    values = [amp_rows[(name, amp)] for name in names]
    ax_t.bar(pos + offset, [v[1] for v in values], 0.4, color=colour, label=label)
    ax_m.bar(pos + offset, [v[0] / 2**20 for v in values], 0.4, color=colour, label=label)
for ax in (ax_t, ax_m):
    ax.set_xticks(pos.tolist(), names)
    if len(names) > 2:  # the wide case is hundreds of times the small ones: a log axis
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 1, 2, 5, 10, 20, ...
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
ax_t.set(xlabel="case", ylabel="forward + backward (ms, fastest)", title=f"Speed on {device.type}")
ax_m.set(xlabel="case", ylabel="kept for backward (MiB)", title="Activation memory (exact count)")
ax_t.legend(fontsize=8)
ax_m.legend(fontsize=8)
fig.tight_layout()
plt.show()
speedup = {name: amp_rows[(name, False)][1] / amp_rows[(name, True)][1] for name in names}
saving = {name: 1 - amp_rows[(name, True)][0] / amp_rows[(name, False)][0] for name in names}
for name in names:
    verdict = "faster" if speedup[name] > 1.1 else "not faster" if speedup[name] > 0.9 else "slower"
    print(f"{name}: autocast is {verdict} here ({speedup[name]:.2f}× the float32 speed) and "
          f"keeps {saving[name]:.0%} fewer bytes for backward.")  # fmt: skip
if device.type == "cuda":  # the fair float32: TF32 on tensor cores, for the wide case
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # float32 matmuls may use TF32
    try:
        xb = torch.randn(4096, 2048, generator=torch.Generator().manual_seed(SEED)).to(device)
        tf32_ms = fastest_ms(lambda: forward_backward(wide, xb, False))
    finally:
        torch.set_float32_matmul_precision(precision)
    plain_ms, amp_ms = (amp_rows[("wide, batch 4096", amp)][1] for amp in (False, True))
    print(f"wide, batch 4096: float32 with TF32 {tf32_ms:.2f} ms/step, {plain_ms / tf32_ms:.2f}× "
          f"plain float32; autocast is {tf32_ms / amp_ms:.2f}× the TF32 speed.")  # fmt: skip

# %% [markdown]
# *Alt text: two bar charts, float32 (blue) against autocast (orange), for the running
# example at batch 64 and 1024 and, on a GPU, the wide model at batch 4096 (then on
# logarithmic axes).
# Left, milliseconds per forward and backward pass on this device; right, MiB kept for
# backward. The printed lines under the figure give the measured ratios.*
#
# What this shows, honestly, is this machine and nothing more. Read the printed verdicts.
# Autocast adds work: before every matmul it converts the operands (the weights included) to
# 16 bits, one more kernel each. It saves work only where the hardware multiplies 16-bit
# numbers faster and the products are large enough for that to outweigh the conversions and
# the fixed cost of launching each kernel. The running example never gets there on a GPU:
# each of its steps is a few hundred tiny kernels, so float32 and autocast both take about
# what launching them takes, and autocast, with more kernels, can come out slower at either
# batch size (on an NVIDIA H200 with torch 2.11, autocast ran at 0.81× the float32 speed at
# batch 64 and 0.74× at batch 1024). The wide model's products are billions of multiply-adds
# each, and there tensor cores win by several times (11× on the same H200). Part of that is
# the float32 side's choice: by default PyTorch multiplies float32 matrices in full float32
# precision, without tensor cores. On Ampere and later GPUs,
# `torch.set_float32_matmul_precision("high")` lets them run as TF32 on tensor cores too, and
# against that fair float32 the gain of 16 bits is far smaller: the cell's last line measures
# it on a GPU (on the same H200, TF32 made the wide float32 step 5.8× faster, and autocast was
# then 1.9× the TF32 speed, not 11×; on an NVIDIA H100, an MLP step of hidden size 4096 at
# batch 8192: bfloat16 6.5× plain float32, but 1.55× TF32). On a
# CPU without 16-bit instructions bfloat16 is emulated and there may be no win at any size.
# The memory column follows the same logic: autocast also keeps 16-bit *copies of the weights* for backward (bfloat16 on
# the CPU, float16 on CUDA by default), which at batch 64 are much of what is kept, so the
# saving there is far from half; with more examples the activations dominate and it comes
# close to half. Measure on yours before you believe any "2×".
#
# ## Exercise 2 · `ch10_amp_step`: a mixed-precision step that fits the device
#
# Write `amp_train_step(model, optimizer, loss_fn, x, y, scaler=None)`:
#
# * clear the gradients, then run the forward pass **and the loss** under `torch.autocast` for
#   `x`'s device type (`x.device.type`: never a device written into the code), with bfloat16
#   on the CPU and float16 on CUDA and MPS: autocast's defaults, so that the check compares
#   the same step on every machine. On a GPU that supports bfloat16
#   (`torch.cuda.is_bf16_supported()`) bfloat16 is accepted too, as the advice above prefers:
#   the check then compares the loss at bfloat16's precision;
# * without a scaler: `loss.backward()` and `optimizer.step()`;
# * with a scaler (whoever calls you created it once, with `torch.amp.GradScaler(...)`): scale
#   the loss before backward, let the scaler make the step, and update the scaler;
# * return the loss as a Python float.
#
# The check's model has dropout and a forward hook: call the model itself (`model(x)`), in the
# train mode its caller set. The check runs two steps on the CPU (bfloat16) without a scaler,
# with a scaler passed in, and with a scaler and a gradient that overflows (the step must be
# skipped and the scale halved), and compares the model's output dtype, the returned loss and
# the parameters (at bfloat16 precision) with the reference. The hidden check adds more seeds,
# every device, and, so that a device written into the code shows even on a machine without a
# GPU, a CPU batch whose `device` says `cuda` (CUDA's autocast leaves its CPU arithmetic in
# float32).


# %% nbgrader={"grade_id": "ch10_amp_step", "solution": true}
def amp_train_step(model, optimizer, loss_fn, x, y, scaler=None):
    ### BEGIN SOLUTION
    dtype = torch.bfloat16 if x.device.type == "cpu" else torch.float16
    optimizer.zero_grad()
    with torch.autocast(x.device.type, dtype=dtype):
        loss = loss_fn(model(x), y)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return loss.item()
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch10_amp_step_tests", "grade": true, "points": 3}
# Visible tests: a small classifier on the CPU, two steps without a scaler, with one, and with
# a gradient that overflows.
from forge_course.grading import ch10

ch10.check_amp_step(amp_train_step)
print(
    "amp_train_step: bfloat16 forward on the CPU, float32 weights, the reference's update, "
    "with and without a scaler."
)
### BEGIN HIDDEN TESTS
ch10.check_amp_step(amp_train_step, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 3 · Gradient checkpointing
#
# A forward pass keeps, for backward, every tensor some gradient will need. In one block of
# the deep running example, `Linear(64, 256) → GELU → Linear(256, 64)`, that is three
# tensors: the block's input (the first linear's weight gradient needs it), GELU's input (its
# derivative depends on it) and GELU's output (the second linear's input). Checkpointing cuts
# the stack into *segments* and keeps only each segment's input; when backward reaches a
# segment, it runs that segment's forward again, keeping its activations this time, and
# backpropagates through it straight away.
#
# ### By hand: what the forward pass keeps
#
# With a batch of 64 in float32 (4 bytes), one block keeps
# $64 \times (64 + 256 + 256) \times 4 = 147{,}456$ bytes, and the 16 blocks keep
# $16 \times 147{,}456 = 2{,}359{,}296$ bytes (2.25 MiB). A checkpointed segment keeps only its
# input, $64 \times 64 \times 4 = 16{,}384$ bytes, so $k$ segments keep $16{,}384\,k$ bytes:
# $65{,}536$ for $k = 4$, 36 times less than the plain forward.
#
# That is not the whole story. During backward, one segment at a time is recomputed, and its
# activations are held on top of the kept inputs: with $k = 4$ segments of 4 blocks, that is
# $4 \times 147{,}456 = 589{,}824$ bytes, one of whose inputs ($16{,}384$) is already counted,
# so at worst $65{,}536 + 589{,}824 - 16{,}384 = 638{,}976$ bytes: 27% of the plain forward's
# memory. One segment ($k = 1$) keeps only the input, but recomputes everything at once, so
# its worst moment holds all $2{,}359{,}296$ bytes again: no saving at all. The next cell
# counts each number with `saved_activation_bytes` on the course's reference
# `checkpointed_forward` (`forge_course.reference.checkpointing`).

# %%
from forge_course.reference import checkpointing as ref_ckpt

x_deep = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(SEED)).to(device)
block_bytes = BATCH * (WIDTH + 4 * WIDTH + 4 * WIDTH) * 4
input_bytes = BATCH * WIDTH * 4
assert (block_bytes, input_bytes) == (147_456, 16_384)
plain_bytes = saved_activation_bytes(stack, x_deep)
assert plain_bytes == N_BLOCKS * block_bytes == 2_359_296
for k in (1, 2, 4, 16):
    kept = saved_activation_bytes(ref_ckpt.checkpointed_forward, blocks, x_deep, k)
    assert kept == k * input_bytes
    print(f"{k:2} segments keep {kept:9,} bytes ({kept / plain_bytes:.1%} of the plain forward)")
four_blocks = saved_activation_bytes(nn.Sequential(*blocks[:4]), x_deep)
assert 4 * input_bytes + four_blocks - input_bytes == 638_976
print(f"plain forward keeps {plain_bytes:,} bytes; k = 4 holds at most "
      f"{4 * input_bytes + four_blocks - input_bytes:,} during backward")  # fmt: skip

# %% [markdown]
# ### Simulation: memory against compute
#
# Choose the number of segments $k$ for the 16-block stack. The left panel shows the bytes kept
# when the forward pass ends (blue, exact) and the most held during backward (orange: the kept
# inputs plus the largest recomputed segment), against the plain forward (dashed); the right
# panel the time of one forward and backward pass, measured on this device. Every $k$ is
# measured once when the cell runs and cached, so the slider only redraws.
#
# Things to try: $k = 1$ (saves nothing at the worst moment, costs a whole extra forward);
# $k = 4 = \sqrt{16}$; $k = 16$ (every block its own segment). When a block's inner
# activations are about as large as its input, $k = \sqrt N$ balances kept inputs against the
# recomputed segment, and memory grows like $\sqrt N$. Here a block's inner activations are 8
# times its input, so the balance lies at more segments than 4: look where the orange curve
# is lowest.
#
# *Without a widget front end this cell shows the figure for $k = 4$.*

# %%
from forge_course.sims.memory_compute import draw, measure, memory_compute_view

sim_args = {"n_layers": N_BLOCKS, "width": WIDTH, "batch": BATCH, "device": str(device)}
memory_compute_view(segments=4, repeats=TIMING_REPEATS, **sim_args)

# %% [markdown]
# *Alt text: left, activation memory in KiB against the number of checkpoint segments from 1 to
# 16. The blue line (kept after forward) rises in a straight line from 16 KiB to 256 KiB; the
# orange line (held during backward, at worst) starts at the dashed plain-forward level of
# 2304 KiB for one segment and falls steeply; it is lowest at 16 segments, nearly as low at 8.
# The k = 4 points are circled. Right, the time of one forward and backward pass against the
# number of segments, each measured on this device, with the plain pass as a dashed line.*
#
# The next cell reads the measured numbers back, and times the slider: a cached lookup plus
# one redraw.

# %%
plain = measure(0, repeats=TIMING_REPEATS, **sim_args)
with torch.no_grad():
    forward_ms = fastest_ms(lambda: stack(x_deep))
print(f"plain forward + backward {plain.ms_per_step:.2f} ms; one forward {forward_ms:.2f} ms, "
      "the least that recomputation can add")  # fmt: skip
for k in (1, 4, 8, 16):
    m = measure(k, repeats=TIMING_REPEATS, **sim_args)
    print(f"k = {k:2}: at worst {m.peak_bytes / plain.saved_bytes:4.0%} of the plain memory, "
          f"{m.ms_per_step / plain.ms_per_step:.2f}× its time ({m.ms_per_step:.2f} ms vs "
          f"{plain.ms_per_step:.2f} ms)")  # fmt: skip
start = time.perf_counter()
measure(7, repeats=TIMING_REPEATS, **sim_args)
lookup_ms = (time.perf_counter() - start) * 1e3
start = time.perf_counter()
figure = draw([measure(k, repeats=TIMING_REPEATS, **sim_args) for k in range(N_BLOCKS + 1)], 7)
figure.canvas.draw()
draw_ms = (time.perf_counter() - start) * 1e3
plt.close(figure)
print(f"slider: {lookup_ms:.3f} ms to look a measurement up, {draw_ms:.0f} ms to redraw")

# %% [markdown]
# The bytes are exact and the same on every device. The times are this machine's, and they
# show the other half of the trade. Every checkpointed block runs forward twice, so the least
# a step can cost is one extra forward pass, the printed "one forward" time. A backward pass
# usually costs about two forwards, which is where the often-quoted "30% more compute" comes
# from. On top of that, each segment adds a fixed cost (saving and restoring random-number
# state, setting up the recomputation), which weighs most on a model this small. Timings of a
# few milliseconds are also noisy: on a busy shared machine they can jump by more than the
# effect between two runs, so run the simulation cell again and trust only the differences
# that stay. Neither "30% more compute" nor "60% less memory" is a property of checkpointing:
# both depend on where the boundaries are and on the model, as the two panels show.
#
# Always pass `use_reentrant=False`. The older reentrant implementation gives the layers
# **no gradient** when the segment's input does not require grad, which is the normal case for
# a batch of data; it only warns.
#
# ## Exercise 3 · `ch10_checkpointed_forward`: a segmented checkpointed forward
#
# Write `checkpointed_forward(layers, x, segments)`:
#
# * `layers` is a sequence of modules (a list, an `nn.ModuleList` or an `nn.Sequential`) to
#   apply one after another to `x`;
# * cut it into `segments` consecutive groups whose sizes differ by at most one, longer groups
#   first (5 layers in 2 segments: 3, then 2);
# * run every group, the last one too, through
#   `torch.utils.checkpoint.checkpoint(run_group, h, use_reentrant=False)`, where `run_group`
#   applies that group's layers in order, and return the final output.
#
# The check compares the output and every gradient with the plain forward's, the bytes kept
# for backward with the reference's (no more is allowed), and counts how often each block
# runs: once in the forward pass and once more during backward, when its segment is
# recomputed. Which blocks backward recomputes together are your segments: they must be the
# split above (10 blocks in 4 segments: 3, 3, 2, 2). The blocks must run under `checkpoint`'s
# own saved-tensor hooks or the check's, not under a `saved_tensors_hooks` of your own. The
# hidden check adds other uneven splits, one segment, one segment per layer, an input that
# requires grad, float64 and every device.


# %% nbgrader={"grade_id": "ch10_checkpointed_forward", "solution": true}
from torch.utils.checkpoint import checkpoint


def checkpointed_forward(layers, x, segments):
    ### BEGIN SOLUTION
    layers = list(layers)
    base, extra = divmod(len(layers), segments)
    sizes = [base + 1] * extra + [base] * (segments - extra)
    start = 0
    for size in sizes:
        group = layers[start : start + size]
        start += size

        def run_group(h, group=group):
            for layer in group:
                h = layer(h)
            return h

        x = checkpoint(run_group, x, use_reentrant=False)
    return x
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch10_checkpointed_forward_tests", "grade": true, "points": 2}
# Visible tests: 6 blocks in 3 segments and 10 in 4 on the CPU; outputs, gradients, bytes kept
# and segments.
from forge_course.grading import ch10

ch10.check_checkpointed_forward(checkpointed_forward)
print("checkpointed_forward: the plain forward's output and gradients, one input per segment.")
### BEGIN HIDDEN TESTS
ch10.check_checkpointed_forward(checkpointed_forward, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 4 · `torch.compile`
#
# `torch.compile(model)` returns a wrapper that, on its first call, traces the Python code of
# `forward` into a graph (TorchDynamo), and hands the graph to a compiler (TorchInductor by
# default, which writes and builds C++ on the CPU and Triton kernels on GPUs). Later calls with
# inputs of the same shapes and dtypes run the compiled code. The price is paid on the first
# call; the gain, if any, on every call after it.
#
# How big is that price here? The next cell compiles a tiny model (2 blocks of the running
# example, on this notebook's device) in a separate Python process, so that a slow first
# compile cannot use up this notebook's time: the process is stopped after `COMPILE_BUDGET_S`
# seconds. It reports the first call's time and the fastest eager and compiled calls. The very
# first compile on a machine is the slowest: it also builds C++ headers (or, on a GPU, Triton
# kernels) once and caches them on disk (under the temporary directory), so running this cell
# again is faster.

# %%
COMPILE_SCRIPT = f"""
import json, time, torch
from torch import nn
torch.set_num_threads({THREADS})
torch.manual_seed({SEED})
block = lambda: nn.Sequential(nn.Linear({WIDTH}, {4 * WIDTH}), nn.GELU(), nn.Linear({4 * WIDTH}, {WIDTH}))
device = torch.device("{device}")
model = nn.Sequential(block(), block()).to(device)
x = torch.randn({BATCH}, {WIDTH}).to(device)
sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

def fastest(fn, n=50):
    fn()
    times = []
    for _ in range(n):
        sync(); start = time.perf_counter(); fn(); sync(); times.append(time.perf_counter() - start)
    return min(times) * 1e3

with torch.no_grad():
    eager_ms = fastest(lambda: model(x))
    compiled = torch.compile(model)
    start = time.perf_counter()
    out = compiled(x)
    sync()
    first_s = time.perf_counter() - start
    compiled_ms = fastest(lambda: compiled(x))
    gap = (out - model(x)).abs().max().item()
print(json.dumps(dict(first_s=first_s, eager_ms=eager_ms, compiled_ms=compiled_ms, gap=gap)))
"""

started = time.perf_counter()
try:
    run = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True, text=True,
                         timeout=COMPILE_BUDGET_S)  # fmt: skip
    compiled_result = json.loads(run.stdout.splitlines()[-1]) if run.returncode == 0 else None
    if compiled_result is None:
        print("torch.compile failed here; its last words were:")
        print("\n".join(run.stderr.strip().splitlines()[-3:]))
except subprocess.TimeoutExpired:
    compiled_result = None
    print(f"The first compile did not finish within {COMPILE_BUDGET_S} s on this machine, so it "
          "was stopped; a second run is usually faster (its caches stay on disk).")  # fmt: skip
print(f"the whole demo took {time.perf_counter() - started:.1f} s, process start-up included")
if compiled_result:
    r = compiled_result
    print(f"first call (trace + compile): {r['first_s']:.1f} s")
    print(f"eager forward:    {r['eager_ms']:.3f} ms; compiled forward: {r['compiled_ms']:.3f} ms "
          f"({r['eager_ms'] / r['compiled_ms']:.2f}× the eager speed); largest output difference "
          f"{r['gap']:.1e}")  # fmt: skip
    saved_per_call_ms = r["eager_ms"] - r["compiled_ms"]
    if saved_per_call_ms > 0:
        print(
            f"calls needed to win back the first call: {r['first_s'] * 1e3 / saved_per_call_ms:,.0f}"
        )
    else:
        print("calls needed to win back the first call: never (compiled is not faster here)")

# %% [markdown]
# Read the last printed line before compiling a training script: the first call's seconds must
# be won back a fraction of a millisecond at a time. For a small model on a CPU that can take
# a very long time, or never happen; for a large model on a GPU, where fusing operations saves
# whole trips through memory, it can pay off within minutes.
#
# ### Graph breaks
#
# Dynamo traces Python, and some Python it cannot put in a graph: a `print`, a tensor turned
# into a Python number (`.item()`: by default Dynamo does not capture Python numbers made from
# tensors), a call into a library it does not know. At each such place it *breaks* the graph:
# it compiles what came before, runs the troublesome line in ordinary Python, and starts a new
# graph after it. The model still works; it is just compiled in pieces, with Python in between.
# `torch._dynamo.explain` traces without compiling (fast) and lists the breaks, each with the
# line of the reason that names its cause. The next cell asks it about two blocks: one that
# logs a number, and the same block logging a fixed message.


# %%
class ChattyBlock(nn.Module):
    """A block whose forward logs a number: the kind of line that breaks a graph."""

    def __init__(self):
        super().__init__()
        self.inner = make_blocks(1, WIDTH, seed=SEED)[0]

    def forward(self, x):
        h = self.inner(x)
        print("mean activation:", round(h.mean().item(), 3))
        return self.inner(h)


class MessageBlock(ChattyBlock):
    """The same block, logging a fixed message: no tensor becomes a number."""

    def forward(self, x):
        h = self.inner(x)
        print("block done")
        return self.inner(h)


def cause(reason):
    """The line of a break's reason that names what Dynamo could not trace."""
    lines = [line.strip() for line in str(reason.reason).splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("Explanation:")), lines[0])


# Dynamo also logs each break as a long warning; the summary below is enough here.
torch._logging.set_logs(dynamo=logging.ERROR)
causes = {}
for block in (ChattyBlock(), MessageBlock()):
    name = type(block).__name__
    explanation = torch._dynamo.explain(block.to(device))(x_deep)
    causes[name] = [cause(reason) for reason in explanation.break_reasons]
    print(f"{name}: {explanation.graph_count} graphs, {explanation.graph_break_count} break(s)")
    for line in causes[name]:
        print("   ", line)
    torch._dynamo.reset()
assert len(causes["ChattyBlock"]) == 1 and "item()" in causes["ChattyBlock"][0]
assert len(causes["MessageBlock"]) == 1 and "print" in causes["MessageBlock"][0]

# %% [markdown]
# Logging one number split the forward into two graphs, and the break names `.item()`, not
# `print`: tracing stops where the tensor becomes a Python number, and the `print` after it runs
# in the Python between the two graphs, at no extra cost. A `print` with no tensor in it breaks
# the graph on its own, as the second block shows. The fix is to keep logging out of `forward`
# (return the tensor, log it in the loop, outside the compiled code), and to check a model with
# `explain` before compiling it. `torch.compile(model, fullgraph=True)` turns every graph break
# into an error instead.
#
# ## Check your understanding
#
# **Question 1 (`ch10_q_tail_weight`).** A batch of 100 examples is accumulated from
# micro-batches of 32, 32, 32 and 4, so that the update equals the big batch's. By what number
# is the **last** micro-batch's mean loss multiplied before its backward? Set `tail_weight`.
#
# **Question 2 (`ch10_q_scaler`).** When does a training step need a `GradScaler`? Set
# `scaler_answer` to one letter.
#
# * **a**: whenever it uses `torch.autocast`, whatever the dtype.
# * **b**: when autocast runs in float16, because small gradients underflow to zero in float16
#   unless the loss is scaled up first.
# * **c**: when autocast runs in bfloat16, because bfloat16 has fewer mantissa bits than
#   float16.
# * **d**: only together with gradient accumulation.
#
# **Question 3 (`ch10_q_saved_bytes`).** The deep running example (16 blocks, batch 64, width
# 64, float32) is checkpointed in 8 segments with `checkpointed_forward`. How many bytes does
# the forward pass keep for backward, as `saved_activation_bytes` counts them? Set
# `saved_bytes`.

# %% nbgrader={"grade_id": "ch10_questions", "solution": true}
tail_weight = None
scaler_answer = None
saved_bytes = None
### BEGIN SOLUTION
tail_weight = 0.04
scaler_answer = "b"
saved_bytes = 131072
### END SOLUTION

# %% nbgrader={"grade_id": "ch10_q_tail_weight", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(tail_weight, "ch10_q_tail_weight")
### BEGIN HIDDEN TESTS
check_number(
    tail_weight,
    "ch10_q_tail_weight",
    expected=0.04,
    hints={
        0.25: "that is 1/K: it gives each of the last 4 examples 6.25 times its share. The "
        "weight is n_i / N.",
        0.01: "that is each example's share; the micro-batch's mean loss is multiplied by its "
        "size over N.",
        4: "the weight is a fraction of the batch: n_i / N, not n_i.",
        25: "that is N / n_i, upside down: the weight is n_i / N.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch10_q_scaler", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(scaler_answer, "ch10_q_scaler", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    scaler_answer,
    "ch10_q_scaler",
    choices="abcd",
    correct="b",
    why_not={
        "a": "with bfloat16 (the CPU's autocast type) no scaler is needed: it has float32's "
        "exponent range.",
        "c": "bfloat16's range is float32's, so small gradients do not underflow; fewer "
        "mantissa bits cost precision, which scaling cannot restore anyway.",
        "d": "accumulation changes how many backward passes add up, not the float format.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch10_q_saved_bytes", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(saved_bytes, "ch10_q_saved_bytes")
### BEGIN HIDDEN TESTS
check_number(
    saved_bytes,
    "ch10_q_saved_bytes",
    expected=131072,
    hints={
        2359296: "that is the plain forward: with checkpointing each segment keeps only its "
        "input, 64 × 64 × 4 bytes.",
        16384: "that is one segment's input; there are 8 segments.",
        65536: "that is 4 segments; the question has 8.",
        1179648: "that is half the plain forward, as if each segment kept its first block's "
        "activations; the 8 segments keep only their inputs.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# (loss * len(x) / N).backward()           # loss / K is right only when every micro-batch has N / K examples
# clip_grad_norm_(model.parameters(), c)    # once, after the last micro-batch, or you clip pieces of a gradient
# with torch.autocast(device.type, dtype=dtype):  # bfloat16 where the hardware has it, else float16
#     loss = loss_fn(model(x), y)                  #   (and float32 on a CPU without bfloat16)
# scaler.scale(loss).backward()             # float16 only: without it, gradients below 3e-8 become 0
# scaler.step(optimizer); scaler.update()   # skips the update after an overflow, then halves the scale
# x = checkpoint(run_segment, x, use_reentrant=False)  # reentrant: no gradients for the layers
# model = torch.compile(model)              # pays seconds on the first call; check graph breaks first
# ```
#
# * Accumulation equals the big batch exactly when each micro-batch is weighted by $n_i / N$
#   (the running batch: 0.32, 0.32, 0.32, 0.04) and the gradient is clipped once; it cannot be
#   exact with BatchNorm, whose statistics belong to each micro-batch.
# * Autocast chooses a precision per operation, and the lists differ per device (on the CPU,
#   softmax and sums stay in bfloat16; losses are float32 everywhere); float16 needs a scaler
#   (1e-8 becomes 0, 65536 × 1e-8 survives), bfloat16 does not. Which type to use depends on
#   the hardware: bfloat16 on Ampere and later GPUs and on CPUs with bfloat16 instructions,
#   float16 with a scaler on older GPUs, float32 on a CPU without them. Whether it is faster
#   is measured above, not assumed.
# * Checkpointing $k$ segments keeps $k$ inputs (16,384 bytes each here, against 2,359,296
#   for the plain forward) and recomputes about one forward pass; the worst moment of backward
#   also holds one recomputed segment, so one segment saves nothing.
# * `torch.compile` costs seconds on the first call and pays back per call, if at all; a
#   `print` or `.item()` in `forward` breaks the graph.
#
# Next, chapter 11 spreads the batch over several processes: the same gradient arithmetic,
# with an all-reduce in place of the accumulation loop.
