# %% [markdown]
# # Chapter 06 · The evaluation loop
#
# Evaluating a model looks like training with two lines deleted: no `backward()`, no `step()`.
# Two lines have to be *added* instead, and they are easy to confuse: `model.eval()` and
# `with torch.no_grad():`. This chapter takes them apart on one small classifier. It shows what
# each one changes, with numbers you can check by hand, and it measures what each costs when it
# is missing: wrong metrics, memory, time. Then you write the evaluation loop and the
# prediction helper that the rest of the course uses.
#
# **By the end of this chapter you can:**
#
# 1. say what `model.eval()` changes (dropout and batch norm) and what `torch.no_grad()` /
#    `torch.inference_mode()` change (autograd recording), and predict all four combinations;
# 2. compute dropout and batch norm outputs in train and in eval mode by hand;
# 3. write `evaluate(model, loader, loss_fn, device)` that is deterministic, records no graph,
#    weighs a short last batch correctly and puts every module's mode back;
# 4. tell from a measurement whether memory grows because of a missing `no_grad()` or because
#    graph-attached tensors are kept, and whether `inference_mode()` is faster on your device.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
N_PER_CLASS = 150  # spiral points per class: 300 in all, 75 of them held out for validation
BATCH_SIZE = 32  # validation batches of 32, 32 and 11: the last one is short
P_DROP = 0.3  # dropout probability of the running example
TRAIN_EPOCHS = 40  # epochs to train it, 7 steps each
EVAL_REPEATS = 20  # evaluations in the "train mode or eval mode" experiment
MEMORY_EVALS = 8  # evaluations in the memory experiment
TIMING_ROUNDS = 60  # rounds of the timing race; each round times all three contexts once
CPU_THREADS = 1  # torch's CPU threads; the models are tiny, and the timings below use this many

import copy
import math
import statistics
import time
from contextlib import nullcontext

import matplotlib.pyplot as plt
import torch
from torch.utils.data import DataLoader, TensorDataset

from forge_course import pick_device
from forge_course.data import make_spiral, train_val_split
from forge_course.device import describe
from forge_course.sims.display import PALETTE

torch.set_num_threads(CPU_THREADS)
device = pick_device()
torch.manual_seed(SEED)
print("Running on", describe(device))

# %% [markdown]
# ## The running example
#
# Two interleaved spiral arms, one class each, and a small network with the two layers that
# behave differently in training: batch norm and dropout.
#
# `Linear(2→64) → BatchNorm → ReLU → Dropout → Linear(64→64) → BatchNorm → ReLU → Dropout →
# Linear(64→2)`
#
# The next cell trains it for a few hundred steps with the loop of chapter 04, so that the
# evaluations below measure a model that has learnt something.


# %%
def make_model():
    layers = []
    for width_in in (2, 64):
        layers += [torch.nn.Linear(width_in, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU()]
        layers.append(torch.nn.Dropout(P_DROP))
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 2))


X, y = make_spiral(N_PER_CLASS, seed=SEED)
X_train, y_train, X_val, y_val = train_val_split(X, y, val_fraction=0.25, seed=SEED)
# drop_last: BatchNorm1d on [N, C] cannot take the variance of a batch of one, and 225 = 7·32 + 1.
train_loader = DataLoader(
    TensorDataset(X_train, y_train), batch_size=BATCH_SIZE, shuffle=True, drop_last=True,
    generator=torch.Generator().manual_seed(SEED),
)  # fmt: skip
val_loader = DataLoader(TensorDataset(X_val, y_val), batch_size=BATCH_SIZE)

torch.manual_seed(SEED)
model = make_model().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
for _ in range(TRAIN_EPOCHS):
    model.train()
    for inputs, targets in train_loader:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
print(f"{len(X_train)} training and {len(X_val)} validation points;")
print(f"validation batches of {[len(batch) for batch, _ in val_loader]}")
print(f"training loss on the last batch: {loss.item():.4f}")

# %% [markdown]
# ## Two switches, not one
#
# | switch | what it sets | what it changes | what it leaves alone |
# | --- | --- | --- | --- |
# | `model.train()` / `model.eval()` | the `training` flag of the model and of every submodule | the layers that behave differently in training: dropout (random zeros, or nothing) and batch norm (this batch's statistics, or the running ones) | autograd: a model in eval mode still records a graph |
# | `with torch.no_grad():` / `with torch.inference_mode():` | a flag of autograd, for the code inside the `with` | whether operations are recorded for a backward pass: outputs get `grad_fn=None` and nothing is saved for backward | layers: dropout still drops, batch norm still updates its running statistics |
#
# Neither implies the other, and an evaluation loop needs both. Linear layers, convolutions
# and activations behave the same in both modes. A layer changes with the flag when it holds a
# dropout or a batch norm, and attention layers usually hold one: `nn.TransformerEncoderLayer`
# drops values in its attention and in its feed-forward block (`dropout=0.1` by default), and
# `nn.MultiheadAttention(..., dropout=p)` drops attention weights for any `p > 0` (its default
# is 0). The next cell calls each twice on the same input, in each mode.

# %%
tokens = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(SEED))  # [B, T, features]
torch.manual_seed(SEED)
mha = torch.nn.MultiheadAttention(16, num_heads=2, dropout=0.1, batch_first=True)
encoder = torch.nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
attention_layers = {
    "MultiheadAttention(dropout=0.1)": (mha, lambda: mha(tokens, tokens, tokens)[0]),
    "TransformerEncoderLayer()": (encoder, lambda: encoder(tokens)),
}
for name, (layer, run) in attention_layers.items():
    for mode in ("train", "eval"):
        layer.train(mode == "train")
        with torch.no_grad():
            gap = (run() - run()).abs().max().item()
        print(f"{name:32} {mode:5} mode: largest difference between two calls {gap:.4f}")
        assert (gap > 0) == (mode == "train")

# %% [markdown]
# In train mode two calls disagree; in eval mode they agree. A transformer's evaluation loop
# needs `model.eval()` as much as this chapter's network does.

# %% [markdown]
# ## Dropout by hand
#
# In train mode, `nn.Dropout(p)` zeroes each value with probability $p$ and divides the survivors
# by $1 - p$, so that every value keeps its expected size. In eval mode it passes its input
# through unchanged.
#
# Take $p = 0.5$ and the input $[0.8,\ 1.2,\ 0.3,\ 0.9]$, and suppose the random mask keeps
# positions 0 and 2. The survivors are divided by $1 - 0.5 = 0.5$, that is doubled:
#
# * train mode: $[0.8 \cdot 2,\ 0,\ 0.3 \cdot 2,\ 0] = [1.6,\ 0,\ 0.6,\ 0]$;
# * eval mode: $[0.8,\ 1.2,\ 0.3,\ 0.9]$, whatever the mask.
#
# Why the factor: position 1 is $1.2 \cdot 2 = 2.4$ half of the time and $0$ the other half, so
# its average in train mode is $0.5 \cdot 2.4 = 1.2$, exactly its eval-mode value. Without the
# factor, the values the next layer sees in evaluation would be twice their average in
# training.
#
# The next cell asks a real `nn.Dropout` for the same numbers. The mask is random, so it draws
# masks under seeds 0, 1, 2, … until one keeps positions 0 and 2, then compares.

# %%
x = torch.tensor([0.8, 1.2, 0.3, 0.9])
dropout = torch.nn.Dropout(p=0.5)  # a new module starts in train mode
for seed in range(1000):
    torch.manual_seed(seed)
    train_out = dropout(x)
    if (train_out != 0).tolist() == [True, False, True, False]:
        break
print(f"seed {seed} draws the hand case's mask: train mode gives {train_out.tolist()}")
torch.testing.assert_close(train_out, torch.tensor([1.6, 0.0, 0.6, 0.0]))
mask = torch.tensor([1.0, 0.0, 1.0, 0.0])
torch.testing.assert_close(x * mask / (1 - 0.5), train_out)  # the rule, applied by hand

dropout.eval()
print(f"eval mode gives {[round(v, 4) for v in dropout(x).tolist()]}")
assert torch.equal(dropout(x), x)

dropout.train()
torch.manual_seed(SEED)
average = dropout(x.expand(20_000, 4)).mean(dim=0)  # 20,000 masks at once
print(f"train-mode average over 20,000 masks: {[round(v, 3) for v in average.tolist()]}")
torch.testing.assert_close(average, x, atol=0.05, rtol=0)
print("Both outputs match the hand case, and train mode keeps each value's average.")

# %% [markdown]
# ## Batch norm by hand
#
# Batch norm normalises each feature. In **train mode** it uses the mean and variance of the
# current batch, and it also updates running averages of them:
# $\text{running} \leftarrow 0.9 \cdot \text{running} + 0.1 \cdot \text{batch statistic}$
# (PyTorch's default `momentum=0.1`). In **eval mode** it uses those running averages and
# updates nothing. A new layer starts with running mean 0 and running variance 1, scale 1 and
# shift 0.
#
# One feature, the batch $[2,\ 4,\ 6,\ 8]$:
#
# * **train mode.** The mean is $5$, the deviations are $[-3,\ -1,\ 1,\ 3]$ and the variance is
#   $(9 + 1 + 1 + 9)/4 = 5$. The output is the deviation over $\sqrt{5} \approx 2.23607$:
#   $[-1.34164,\ -0.44721,\ 0.44721,\ 1.34164]$.
# * **the update.** Running mean $0.9 \cdot 0 + 0.1 \cdot 5 = 0.5$. The running variance uses
#   the *unbiased* batch variance, $20/3 \approx 6.66667$: $0.9 \cdot 1 + 0.1 \cdot 6.66667 =
#   1.56667$.
# * **eval mode, after that one step.** $(x - 0.5)/\sqrt{1.56667} = [1.5,\ 3.5,\ 5.5,\ 7.5] /
#   1.25167 = [1.19840,\ 2.79627,\ 4.39413,\ 5.99200]$.
#
# In train mode an example's output depends on the rest of its batch. Replace the 8 with a 16:
# the mean becomes $7$, the variance $(25 + 9 + 1 + 81)/4 = 29$, and the example $2$ now gives
# $-5/\sqrt{29} \approx -0.92848$ instead of $-1.34164$. In eval mode the example $2$ gives
# $1.19840$ in any batch. (Batch norm also adds $\epsilon = 10^{-5}$ to the variance, which moves
# these numbers in the sixth digit.)

# %%
norm = torch.nn.BatchNorm1d(1)
batch = torch.tensor([[2.0], [4.0], [6.0], [8.0]])
train_out = norm(batch).flatten()
print(f"train mode: {[round(v, 5) for v in train_out.tolist()]}")
print(
    f"running mean {norm.running_mean.item():.5f}, running variance {norm.running_var.item():.5f}"
)
norm.eval()
eval_out = norm(batch).flatten()
print(f"eval mode:  {[round(v, 5) for v in eval_out.tolist()]}")
close = {"rtol": 0, "atol": 1e-4}
torch.testing.assert_close(train_out, torch.tensor([-1.34164, -0.44721, 0.44721, 1.34164]), **close)
torch.testing.assert_close(norm.running_mean, torch.tensor([0.5]), **close)
torch.testing.assert_close(norm.running_var, torch.tensor([1.56667]), **close)
torch.testing.assert_close(eval_out, torch.tensor([1.19840, 2.79627, 4.39413, 5.99200]), **close)

other_batch = torch.tensor([[2.0], [4.0], [6.0], [16.0]])
fresh = torch.nn.BatchNorm1d(1)  # train mode, on the other batch
torch.testing.assert_close(fresh(other_batch)[0], torch.tensor([-0.92848]), **close)
torch.testing.assert_close(norm(other_batch)[0], torch.tensor([1.19840]), **close)
print("Every number worked out by hand agrees with nn.BatchNorm1d.")

# %% [markdown]
# ## All the combinations, on the running example
#
# The next cell takes a fresh copy of the trained model for each combination of the two
# switches (and `inference_mode`, the stricter form of `no_grad`), runs the same validation
# batch through it twice, and reports three facts: whether the two outputs are equal, what the
# output's `grad_fn` is, and whether the first batch norm's running mean moved.

# %%
val_batch = X_val[:BATCH_SIZE].to(device)
contexts = {
    "grad on": nullcontext,
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}
print(f"{'mode':6} {'autograd':15} {'same output twice':18} {'output grad_fn':16} BN running mean")
for mode in ("train", "eval"):
    for name, context in contexts.items():
        twin = copy.deepcopy(model).train(mode == "train")
        before = twin[1].running_mean.clone()
        with context():
            first, second = twin(val_batch), twin(val_batch)
        same = torch.equal(first, second)
        node = type(first.grad_fn).__name__ if first.grad_fn is not None else "None"
        moved = "moved" if not torch.equal(before, twin[1].running_mean) else "unchanged"
        print(f"{mode:6} {name:15} {str(same):18} {node:16} {moved}")

# %% [markdown]
# Read the table by column. The output is the same twice **only in eval mode**, whatever
# autograd does. `grad_fn` is `None` **only under no_grad or inference_mode**, whatever the
# mode. And batch norm's running statistics move in **every train-mode row, under `no_grad`
# too**: a validation loop that forgets `model.eval()` quietly blends the validation batches
# into the statistics the model will use later.
#
# ## What a forgotten `model.eval()` does to the metrics
#
# The next cell evaluates the trained model `EVAL_REPEATS` times on the same validation set:
# once correctly (eval mode), and once with a copy left in train mode, both under `no_grad`.


# %%
def accuracy_of(net):
    with torch.no_grad():
        hits = sum(
            (net(x.to(device)).argmax(dim=1) == t.to(device)).sum().item() for x, t in val_loader
        )
    return hits / len(X_val)


forgetful = copy.deepcopy(model).train()
stats_before = forgetful[1].running_mean.clone()
train_mode_acc = [accuracy_of(forgetful) for _ in range(EVAL_REPEATS)]
drift = (forgetful[1].running_mean - stats_before).abs().max().item()
model.eval()
eval_mode_acc = [accuracy_of(model) for _ in range(EVAL_REPEATS)]
model.train()

fig, ax = plt.subplots(figsize=(7, 3.4))
runs = range(1, EVAL_REPEATS + 1)
ax.plot(runs, train_mode_acc, "o-", color=PALETTE["vermillion"], label="model left in train mode")
ax.plot(runs, eval_mode_acc, "s-", color=PALETTE["blue"], label="model.eval()")
ax.set(xlabel="evaluation number", ylabel="validation accuracy", xticks=list(runs)[::2])
ax.set_title("The same model and data, evaluated again and again")
ax.legend(fontsize=8)
plt.show()
assert len(set(eval_mode_acc)) == 1  # eval mode: the same number every time
print(f"eval mode:  accuracy {eval_mode_acc[0]:.1%} every time")
print(f"train mode: accuracy from {min(train_mode_acc):.1%} to {max(train_mode_acc):.1%}, "
      f"mean {statistics.mean(train_mode_acc):.1%}")  # fmt: skip
print(f"after {EVAL_REPEATS} train-mode evaluations, a running mean of the first batch norm "
      f"moved by up to {drift:.3f}")  # fmt: skip

# %% [markdown]
# *Alt text: a line chart of validation accuracy over 20 evaluations. The eval-mode line is
# flat; the train-mode line jumps from one evaluation to the next and lies below it.*
#
# In train mode each evaluation measures a different random sub-network, normalised with each
# batch's own statistics: the accuracy wanders, and here its mean (printed above) is lower
# too, because each sub-network lacks units the trained model relies on. Comparing two
# checkpoints, or deciding when to stop, on numbers like these is comparing noise. Meanwhile the
# copy's running statistics drifted towards the validation batches'.

# %% [markdown]
# ## Simulation: train mode and eval mode, side by side
#
# Press **forward** to send one batch of 4 examples through two copies of a small trained
# network (`Linear → BatchNorm → Tanh → Dropout → Linear`), one in train mode and one in eval
# mode. Each heatmap shows the hidden units after dropout, grey with a cross where dropout
# zeroed one, and the outputs beside them. Press again: the train-mode masks and outputs
# change, the eval-mode ones never do, and the train-mode copy's running mean creeps on.
#
# The bars at the bottom are measured, not drawn from a formula: the bytes autograd saved for
# backward in each forward, and the bytes still held after the press. Tick **torch.no_grad()**
# and both "saved" bars fall to zero, while dropout keeps dropping. Tick **keep outputs in a
# list** and press a few times: with recording on, the held bytes climb press after press,
# because every kept output keeps its graph alive; under `no_grad` they stay put.
#
# *Without a widget front end this cell shows the first two presses as a still picture.*

# %%
from forge_course.sims.train_vs_eval import TrainVsEval, train_vs_eval_view

train_vs_eval_view(seed=SEED, p=0.5)

engine, latencies = TrainVsEval(seed=SEED), []
for _ in range(20):
    start = time.perf_counter()
    engine.press()
    latencies.append(time.perf_counter() - start)
print(f"one press takes {statistics.median(latencies) * 1e3:.2f} ms to compute (median of 20)")

# %% [markdown]
# *Alt text: two rows (press 1 and press 2), each with a train-mode and an eval-mode heatmap of
# 4 examples by 8 hidden units and a small table of outputs. About half the train-mode cells are
# grey crosses and differ between the rows; the eval-mode panels are identical in both rows.
# Below, three bars: bytes saved by the train-mode forward, by the eval-mode forward (smaller,
# but not zero), and zero bytes still held.*
#
# The two panels are two copies of one model for a reason: a train-mode forward moves batch
# norm's running statistics, and in a single model those would then move the eval-mode outputs
# as well. That is how a validation loop that forgets `model.eval()` changes the very model it
# measures.

# %% [markdown]
# ## Putting the mode back
#
# `model.eval()` is `model.train(False)`: it sets the `training` flag of the model and of every
# submodule. An evaluation helper must undo it afterwards, and the rule this course uses is:
# **`evaluate` restores each module's mode as it found it.** That is not `model.train()`:
#
# * a model being **served** is in eval mode; an evaluation helper that ends with
#   `model.train()` switches dropout back on for every prediction that follows;
# * a model being **fine-tuned** often keeps its pretrained batch norm layers frozen in eval
#   mode while the rest trains. `model.train()`, or `model.train(was_training)`, sets them all
#   to train mode, and from the next batch on their running statistics drift.
#
# The fix is to remember each module's own flag and give each one back:
#
# ```python
# modes = {module: module.training for module in model.modules()}
# model.eval()
# ...                                  # the evaluation
# for module, training in modes.items():
#     module.training = training
# ```
#
# The next cell shows both failures with a careless helper, then one training step.


# %%
def careless_evaluate(net, loader):
    net.eval()
    with torch.no_grad():
        for inputs, _ in loader:
            net(inputs.to(device))
    net.train()  # the bug: assumes every module of the model was training before


def careful_evaluate(net, loader):
    modes = {module: module.training for module in net.modules()}
    net.eval()
    with torch.no_grad():
        for inputs, _ in loader:
            net(inputs.to(device))
    for module, training in modes.items():
        module.training = training


batch_inputs, batch_targets = X_val[:BATCH_SIZE].to(device), y_val[:BATCH_SIZE].to(device)
for helper in (careless_evaluate, careful_evaluate):
    served = copy.deepcopy(model).eval()
    helper(served, val_loader)
    repeatable = torch.equal(served(batch_inputs), served(batch_inputs))

    tuned = copy.deepcopy(model).train()
    tuned[1].eval()  # the first batch norm is frozen: its statistics must not change
    tuned[1].requires_grad_(False)
    helper(tuned, val_loader)
    frozen_stats = tuned[1].running_mean.clone()
    step = torch.optim.SGD([p for p in tuned.parameters() if p.requires_grad], lr=0.01)
    step.zero_grad()
    loss_fn(tuned(batch_inputs), batch_targets).backward()
    step.step()
    moved = (tuned[1].running_mean - frozen_stats).abs().max().item()
    print(f"{helper.__name__}: served model still repeatable: {repeatable}; frozen batch norm "
          f"in {'train' if tuned[1].training else 'eval'} mode, its running mean moved by "
          f"{moved:.4f} in one training step")  # fmt: skip
    careful = helper is careful_evaluate
    assert repeatable == careful and (moved == 0) == careful

# %% [markdown]
# ## Averaging over uneven batches
#
# `CrossEntropyLoss()` returns the *mean* over its batch. An epoch's loss is the mean over all
# examples, and the mean of the batch means is only that when every batch has the same size.
# The last batch often does not.
#
# By hand: 10 examples in batches of 4, 4 and 2, with these per-example losses:
#
# | batch | per-example losses | batch mean | correct |
# | --- | --- | --- | --- |
# | 1 | 0.2, 0.4, 0.6, 0.8 | 0.5 | 3 of 4 |
# | 2 | 0.3, 0.5, 0.7, 0.5 | 0.5 | 4 of 4 |
# | 3 | 1.8, 2.2 | 2.0 | 0 of 2 |
#
# * The mean of the batch means is $(0.5 + 0.5 + 2.0)/3 = 1.0$.
# * The mean over the 10 examples is $(4 \cdot 0.5 + 4 \cdot 0.5 + 2 \cdot 2.0)/10 = 8/10 = 0.8$:
#   each batch mean weighted by its size.
# * Accuracy has the same trap: the mean of $0.75$, $1$ and $0$ is $0.58333$, but $7$ of the $10$
#   are correct: $0.7$.
#
# In the naive mean the 2 examples of the short batch weigh as much as the 4 of a full batch:
# each of them counts twice.

# %%
losses = torch.tensor([0.2, 0.4, 0.6, 0.8, 0.3, 0.5, 0.7, 0.5, 1.8, 2.2], dtype=torch.float64)
correct = torch.tensor([1, 1, 1, 0, 1, 1, 1, 1, 0, 0], dtype=torch.float64)
loss_batches, correct_batches = losses.split(4), correct.split(4)
naive_loss = sum(b.mean() for b in loss_batches) / len(loss_batches)
weighted_loss = sum(b.mean() * len(b) for b in loss_batches) / len(losses)
naive_accuracy = sum(b.mean() for b in correct_batches) / len(correct_batches)
print(
    f"batch sizes {[len(b) for b in loss_batches]}, means {[b.mean().item() for b in loss_batches]}"
)
print(f"loss: mean of batch means {naive_loss:.5f}, weighted {weighted_loss:.5f}, "
      f"over all {losses.mean():.5f}")  # fmt: skip
print(f"accuracy: mean of batch accuracies {naive_accuracy:.5f}, over all {correct.mean():.5f}")
assert math.isclose(naive_loss, 1.0) and math.isclose(weighted_loss, 0.8)
assert math.isclose(weighted_loss, losses.mean()) and math.isclose(naive_accuracy, 1.75 / 3)
assert math.isclose(correct.mean(), 0.7)

# %% [markdown]
# On the running example the last validation batch holds 11 of 75 examples. The next cell
# computes the validation loss three ways: the mean of the three batch means, the weighted
# mean, and one batch holding all 75 (nothing to weigh, so it is the reference).

# %%
model.eval()
with torch.no_grad():
    batch_means, sizes = [], []
    for batch_x, batch_y in val_loader:
        batch_means.append(loss_fn(model(batch_x.to(device)), batch_y.to(device)).item())
        sizes.append(len(batch_y))
    whole = loss_fn(model(X_val.to(device)), y_val.to(device)).item()
model.train()
naive = sum(batch_means) / len(batch_means)
weighted = sum(m * n for m, n in zip(batch_means, sizes)) / sum(sizes)
print(f"batch sizes {sizes}, batch mean losses {[round(m, 4) for m in batch_means]}")
print(f"mean of batch means {naive:.5f} | weighted {weighted:.5f} | all 75 at once {whole:.5f}")
print(f"the naive mean is off by {abs(naive - whole) / whole:.1%} here; the weighted one by "
      f"{abs(weighted - whole) / whole:.1e} (float32 rounding)")  # fmt: skip

# %% [markdown]
# Weighing each batch mean by the batch's size is right only when every example counts once in
# that mean. Two common settings of `CrossEntropyLoss` break this. With class weights
# (`weight=w`) the batch mean is $\sum_j w_{y_j} \ell_j / \sum_j w_{y_j}$: it divides by the
# total weight of the batch's targets, not by their number. With `ignore_index`, it divides by
# the number of targets not ignored. For these, add up each batch's **sum**
# (`reduction="sum"`) and divide by the same total over the whole set: the total weight of the
# counted targets (or their number). The next cell compares the two on the running example,
# first with class 1 weighted 3 times, then with the first 20 targets ignored (as padding
# tokens are in a sequence task), against one batch holding all 75.


# %%
def counted_weight(targets, weight=None, ignore_index=-100):
    """What a mean-reduced CrossEntropyLoss divides by: the weight of the targets it counts."""
    counted = targets[targets != ignore_index]
    return (weight[counted].sum() if weight is not None else torch.tensor(len(counted))).item()


class_weight = torch.tensor([1.0, 3.0], device=device)
y_some_ignored = y_val.clone()
y_some_ignored[:20] = -100  # CrossEntropyLoss's default ignore_index, as padding would be
settings = {
    "class weights [1, 3]": ({"weight": class_weight}, y_val),
    "first 20 targets ignored": ({}, y_some_ignored),
}
model.eval()
with torch.no_grad():
    for name, (options, targets) in settings.items():
        mean_loss = torch.nn.CrossEntropyLoss(**options)
        sum_loss = torch.nn.CrossEntropyLoss(reduction="sum", **options)
        by_size = summed = total_weight = 0.0
        for batch_x, batch_y in DataLoader(TensorDataset(X_val, targets), batch_size=BATCH_SIZE):
            outputs, batch_y = model(batch_x.to(device)), batch_y.to(device)
            by_size += mean_loss(outputs, batch_y).item() * len(batch_y)
            summed += sum_loss(outputs, batch_y).item()
            total_weight += counted_weight(batch_y, options.get("weight"))
        whole = mean_loss(model(X_val.to(device)), targets.to(device)).item()
        by_size, summed = by_size / len(targets), summed / total_weight
        print(f"{name}: batch means weighted by size {by_size:.5f} (off by "
              f"{abs(by_size - whole) / whole:.1%}); sums over total weight {summed:.5f}; "
              f"all 75 at once {whole:.5f}")  # fmt: skip
        assert math.isclose(summed, whole, rel_tol=1e-5)
        assert not math.isclose(by_size, whole, rel_tol=1e-3)
model.train()

# %% [markdown]
# ## Memory: what `no_grad()` saves, and what really grows
#
# With recording on, each operation of the forward pass saves what its backward will need: a
# linear layer its input, a ReLU its output, dropout its mask. These *activations* stay in
# memory as long as the graph does. The next cell counts them exactly for one validation batch
# of 32, with `forge_course.reference.memory.saved_activation_bytes` (it sees every tensor
# autograd saves, on any device).

# %%
from forge_course.reference.memory import saved_activation_bytes


def saved_bytes(mode, context):
    twin = copy.deepcopy(model).train(mode == "train")  # a copy: train mode moves BN statistics
    with context():
        return saved_activation_bytes(twin, val_batch)


one_forward = {
    "train mode, grad on": saved_bytes("train", nullcontext),
    "eval mode, grad on": saved_bytes("eval", nullcontext),
    "eval mode, no_grad": saved_bytes("eval", torch.no_grad),
    "eval mode, inference_mode": saved_bytes("eval", torch.inference_mode),
}
for name, count in one_forward.items():
    print(f"{name:27} {count:8,} bytes saved for backward")

# %% [markdown]
# Eval mode alone saves less (dropout is the identity, so there is no mask to keep) but not
# nothing; `no_grad` and `inference_mode` save nothing at all.
#
# That is memory per forward, while its graph lives. Does evaluating without `no_grad` make
# memory *grow*, evaluation after evaluation? A graph dies, and frees what it saved, as soon as
# nothing refers to its outputs any more. So it depends on what the loop keeps. The next cell
# runs `MEMORY_EVALS` evaluations with three loops and, after each, asks
# `LiveGraphMemory` (from this chapter's simulation) how many saved bytes are still held by
# live graphs. The caller keeps every returned value in a history list, as a training loop
# that logs its validation loss does.


# %%
from forge_course.sims.train_vs_eval import LiveGraphMemory


def loss_as_float(net, loader):
    total = 0.0
    for inputs, targets in loader:
        loss = loss_fn(net(inputs.to(device)), targets.to(device))
        total += loss.item() * len(targets)  # a float: the batch's graph dies with `loss`
    return total / len(loader.dataset)


def loss_as_tensor(net, loader):
    total = 0.0
    for inputs, targets in loader:
        loss = loss_fn(net(inputs.to(device)), targets.to(device))
        total = total + loss * len(targets)  # a tensor: it refers to every batch's graph
    return total / len(loader.dataset)


loops = {
    "grad on, total += loss.item()": (loss_as_float, nullcontext),
    "grad on, total += loss": (loss_as_tensor, nullcontext),
    "no_grad, total += loss": (loss_as_tensor, torch.no_grad),
}
model.eval()
held = {}
for name, (evaluate_loop, context) in loops.items():
    memory, history, held[name] = LiveGraphMemory(), [], []
    for _ in range(MEMORY_EVALS):
        with memory, context():
            history.append(evaluate_loop(model, val_loader))
        held[name].append(memory.live_bytes())
    attached = sum(isinstance(v, torch.Tensor) and v.grad_fn is not None for v in history)
    print(f"{name:30} held after each evaluation (KiB): "
          f"{[round(b / 1024, 1) for b in held[name]]}; graph-attached values kept: {attached}")  # fmt: skip
    del history
model.train()

fig, (ax_one, ax_many) = plt.subplots(1, 2, figsize=(12, 3.8), width_ratios=[1, 1.3])
colours = [PALETTE["orange"], PALETTE["blue"], PALETTE["green"], PALETTE["sky"]]
bars = ax_one.barh(list(one_forward), [b / 1024 for b in one_forward.values()], color=colours)
ax_one.bar_label(bars, [f" {b:,} bytes" for b in one_forward.values()], fontsize=8)
ax_one.set_xlim(0, max(one_forward.values()) / 1024 * 1.35)
ax_one.invert_yaxis()
ax_one.set(xlabel="KiB saved for backward", ylabel="model mode, autograd",
           title=f"One forward pass, batch of {len(val_batch)}")  # fmt: skip
styles = zip(loops, [PALETTE["blue"], PALETTE["vermillion"], PALETTE["green"]], ["o-", "s-", "^--"])
for name, colour, style in styles:
    ax_many.plot(
        range(1, MEMORY_EVALS + 1), [b / 1024 for b in held[name]], style, color=colour, label=name
    )
ax_many.set(xlabel="evaluations so far", ylabel="KiB still held by graphs",
            title="Repeated evaluations, results kept in a list")  # fmt: skip
ax_many.legend(fontsize=8)
fig.tight_layout()
plt.show()
growth = held["grad on, total += loss"][1] - held["grad on, total += loss"][0]
print(f"keeping tensor totals with recording on: +{growth / 1024:.1f} KiB per evaluation")

# %% [markdown]
# *Alt text: left, four horizontal bars of the bytes saved by one forward: train mode with grad
# the longest, eval mode with grad shorter, no_grad and inference_mode zero. Right, the
# bytes still held after each of 8 evaluations: a straight rising line for "grad on, total +=
# loss" and two flat lines at zero for the other loops.*
#
# Evaluating without `no_grad` wasted memory in every forward pass, but memory did **not** grow
# while the loop turned each loss into a float: each batch's graph died when `loss` was
# reassigned. What grows is a kept reference to a graph: a total built from loss tensors, a list
# of losses, a logged output. Every evaluation then adds its whole graph for good. `no_grad`
# makes that harmless here, since there is no graph to keep, but the habit worth keeping is
# `.item()` for numbers and `.detach()` for tensors you store.

# %% [markdown]
# ## Exercise 1 · `ch06_evaluate`: the evaluation loop
#
# Write `evaluate(model, loader, loss_fn, device)` that returns `(mean_loss, accuracy)`, two
# Python floats over every example the loader yields.
#
# * **Eval mode** during every forward pass, and afterwards **each module's mode restored as
#   you found it** (the rule of "Putting the mode back"): the check starts from train mode, from
#   eval mode, and from a model whose batch norm is frozen in eval mode while the rest trains.
# * **No graph**: run the forward passes under `torch.no_grad()` (or `torch.inference_mode()`).
#   Leave autograd as you found it: no `torch.set_grad_enabled(False)` that outlives the call,
#   no `requires_grad_(False)` left on the parameters.
# * **The whole set's mean**: the mean loss is what `loss_fn` would give on all the examples at
#   once, as one batch. `loss_fn` is one of torch's loss modules with `reduction="mean"`:
#   `CrossEntropyLoss()` (with or without `label_smoothing`, class `weight` or ignored
#   targets) or `MultiMarginLoss()`; use it, whichever it is. A batch's mean is its sum divided
#   by what the loss counts in it, so add up each batch's `reduction="sum"` loss and what its
#   mean divides by, and divide once at the end. What it divides by: for `CrossEntropyLoss`, the
#   total class weight `loss_fn.weight[t]` of the targets `t` that are not
#   `loss_fn.ignore_index` (their number when `weight` is None); for any other loss, the
#   number of targets. The sums come from a copy (`copy.copy(loss_fn)`, then set its
#   `reduction`): leave the caller's `loss_fn` and its settings as they are.
# * **Accuracy**: the fraction of counted targets (those not `ignore_index`, for a loss that
#   has one) whose highest score is the target, `outputs.argmax(dim=-1) == targets`.
# * Move the inputs **and the targets** of each batch to `device`, and leave every parameter,
#   buffer and `.grad` as it is.
#
# Why not the batch means times the batch sizes: that is right only when every target counts
# once. With class weights, `CrossEntropyLoss`'s batch mean divides by the total weight of the
# batch's targets, and with `ignore_index` by the number of targets not ignored, so weighing it
# by the batch size is off ("Averaging over uneven batches" measured by how much), and a batch
# of nothing but ignored targets has a mean of nan but a sum of 0. The check runs such a loss,
# with a first batch that is all padding, in the visible tests.


# %% nbgrader={"grade_id": "ch06_evaluate", "solution": true}
def evaluate(model, loader, loss_fn, device):
    ### BEGIN SOLUTION
    summed = copy.copy(loss_fn)  # the caller's loss keeps its own reduction
    summed.reduction = "sum"
    ignore = getattr(loss_fn, "ignore_index", None)
    weight = getattr(loss_fn, "weight", None)
    modes = {module: module.training for module in model.modules()}
    model.eval()
    total_loss, total_weight, correct, count = 0.0, 0.0, 0, 0
    try:
        with torch.no_grad():
            for inputs, targets in loader:
                inputs, targets = inputs.to(device), targets.to(device)
                outputs = model(inputs)
                if isinstance(loss_fn, torch.nn.CrossEntropyLoss):
                    kept = targets != ignore
                    divisor = weight[targets[kept]].sum() if weight is not None else kept.sum()
                else:
                    kept = torch.ones_like(targets, dtype=torch.bool)
                    divisor = kept.sum()
                total_loss += summed(outputs, targets).item()
                total_weight += divisor.item()
                correct += (outputs.argmax(dim=-1) == targets)[kept].sum().item()
                count += int(kept.sum())
    finally:
        for module, training in modes.items():
            module.training = training
    return total_loss / total_weight, correct / count
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch06_evaluate_tests", "grade": true, "points": 3}
# Visible tests: uneven batches, from train mode, from eval mode, with a frozen batch norm, and a
# class-weighted loss whose first batch is all ignored targets.
from forge_course.grading import ch06

ch06.check_evaluate(evaluate)
print("evaluate: eval mode, no graph, weighted means, every mode restored, .grad untouched.")
### BEGIN HIDDEN TESTS
ch06.check_evaluate(evaluate, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# The rest of the chapter uses the course's reference `evaluate`, so it runs whatever your
# answer does. On the running example:

# %%
from forge_course.reference.evaluation import evaluate as reference_evaluate

val_loss, val_accuracy = reference_evaluate(model, val_loader, loss_fn, device)
print(f"validation loss {val_loss:.4f}, accuracy {val_accuracy:.1%}; "
      f"model back in {'train' if model.training else 'eval'} mode")  # fmt: skip

# %% [markdown]
# ## `inference_mode()` or `no_grad()`?
#
# Both stop recording. `torch.inference_mode()` also marks every tensor it creates as an
# *inference tensor*, which can never be saved for backward later. In exchange PyTorch skips
# some bookkeeping on those tensors (version counters, view tracking). The promise is useful in
# a prediction helper: nothing it returns can sneak into a graph. The next cell shows the
# promise being kept.

# %%
model.eval()
with torch.inference_mode():
    served_scores = model(val_batch)
with torch.no_grad():
    plain_scores = model(val_batch)
model.train()
weights = torch.ones(2, device=device, requires_grad=True)
(plain_scores @ weights).sum().backward()  # a no_grad output can feed a later graph
print(f"no_grad output in a later graph: fine; is_inference() = {plain_scores.is_inference()}")
try:
    (served_scores @ weights).sum().backward()
except RuntimeError as err:
    print(f"inference_mode output, is_inference() = {served_scores.is_inference()}:")
    print(f"  RuntimeError: {str(err).split('.')[0]}.")

# %% [markdown]
# Is it faster? Figures of 10–20% and more circulate, measured on other models and other
# hardware. The next cell measures it on yours: one forward of a wider version of the running
# network (128 units per layer, 4 hidden layers, eval mode), for a single example and for a
# batch of 256. Each round times one forward under each of the three contexts, interleaved so
# that a change in the machine's load hits all three alike.
#
# To call a gap real, the cell uses a **sign test**: if two contexts were equally fast, each
# would win about half of the rounds, like a fair coin. For `inference_mode` against `no_grad`,
# and for `no_grad` against recording, it prints how many rounds the first won and the chance
# that a fair coin splits at least that unevenly; below 5% the gap counts as real.


# %%
def sign_test(faster, slower):
    """Two-sided chance of a split at least this lopsided if both were equally fast."""
    wins, n = sum(a < b for a, b in zip(faster, slower)), len(faster)
    tail = sum(math.comb(n, k) for k in range(min(wins, n - wins) + 1)) / 2**n
    return wins, min(1.0, 2 * tail)


torch.manual_seed(SEED)
wide_layers = [torch.nn.Linear(2, 128)]
for _ in range(4):
    wide_layers += [torch.nn.BatchNorm1d(128), torch.nn.ReLU(), torch.nn.Dropout(P_DROP)]
    wide_layers.append(torch.nn.Linear(128, 128))
wide = torch.nn.Sequential(*wide_layers, torch.nn.Linear(128, 2)).to(device).eval()
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
timings = {}
for batch_size in (1, 256):
    timing_batch = torch.randn(batch_size, 2, device=device)
    samples = {name: [] for name in contexts}
    for _ in range(3):  # warm-up: first calls allocate memory and pick kernels
        for context in contexts.values():
            with context():
                wide(timing_batch)
    for _ in range(TIMING_ROUNDS):
        for name, context in contexts.items():
            start = time.perf_counter()
            with context():
                wide(timing_batch)
            sync()
            samples[name].append((time.perf_counter() - start) * 1e3)
    timings[batch_size] = samples

fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
for ax, (batch_size, samples) in zip(axes, timings.items()):
    boxes = ax.boxplot(
        list(samples.values()), showfliers=False, patch_artist=True, medianprops={"color": "black"}
    )
    for box, colour in zip(boxes["boxes"], [PALETTE["orange"], PALETTE["blue"], PALETTE["green"]]):
        box.set_facecolor(colour)
    ax.set_xticks([1, 2, 3], list(samples))
    ax.set_ylim(bottom=0)
    ax.set(xlabel="autograd context", ylabel="ms per forward (median line)",
           title=f"Batch of {batch_size} on {device.type}")  # fmt: skip
fig.suptitle(f"One forward of the wide network, {TIMING_ROUNDS} interleaved rounds")
fig.tight_layout()
plt.show()


def verdict(samples, faster, slower):
    """One line: how often `faster` beat `slower`, and whether that is more than a coin toss."""
    wins, chance = sign_test(samples[faster], samples[slower])
    gap = 1 - statistics.median(samples[faster]) / statistics.median(samples[slower])
    line = (
        f"{faster} beat {slower} in {wins} of {len(samples[faster])} rounds (chance {chance:.2g})"
    )
    if chance >= 0.05:
        return f"{line}: within noise, no gap this measurement can show"
    return f"{line}: a real gap, {abs(gap):.1%} {'faster' if gap > 0 else 'slower'}"


for batch_size, samples in timings.items():
    medians = ", ".join(f"{name} {statistics.median(ms):.3f} ms" for name, ms in samples.items())
    print(f"batch {batch_size}, medians: {medians}")
    print(f"  {verdict(samples, 'inference_mode', 'no_grad')}")
    print(f"  {verdict(samples, 'no_grad', 'grad on')}")

# %% [markdown]
# *Alt text: two box plots of milliseconds per forward pass, for a batch of 1 and a batch of
# 256, each with three boxes: grad on, no_grad, inference_mode. The printed lines give the
# medians and the verdict.*
#
# Read the verdicts your device printed, not a rule of thumb: percentages quoted for other
# models on other hardware say nothing about this one. Put the `inference_mode` gap, real or
# not, next to the one printed under it, which comes from not recording at all. Choose
# `inference_mode` for prediction because of its promise, and count any speed it brings as a
# bonus you have measured.

# %% [markdown]
# ## Exercise 2 · `ch06_predict`: the prediction helper
#
# Write `predict(model, x)` that returns the predicted class of every input, for serving:
#
# * an int64 tensor of class indices, the argmax over the **last** dimension of the model's
#   output (inputs may have extra leading dimensions, such as `[B, T, features]`);
# * computed in eval mode under **`torch.inference_mode()`**, on the model's device: `x`
#   arrives on the CPU, so move it to the device of the model's parameters;
# * returned **on the model's device**, where they were computed: no `.cpu()`, `.tolist()` or
#   `.numpy()` (the caller decides where they go next). The check also runs a model on `meta`,
#   which keeps shapes but no values, so it sees where the result lands on any machine;
# * each module's mode restored as you found it, and every `.grad` left as it is.


# %% nbgrader={"grade_id": "ch06_predict", "solution": true}
def predict(model, x):
    ### BEGIN SOLUTION
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.inference_mode():
            outputs = model(x.to(next(model.parameters()).device))
            return outputs.argmax(dim=-1)
    finally:
        for module, training in modes.items():
            module.training = training
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch06_predict_tests", "grade": true, "points": 2}
# Visible tests: from train mode, from eval mode and with a frozen batch norm, on the CPU.
from forge_course.grading import ch06

ch06.check_predict(predict)
print("predict: class indices under inference_mode, every mode restored, .grad untouched.")
### BEGIN HIDDEN TESTS
ch06.check_predict(predict, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch06_q_dropout_value`).** `nn.Dropout(p=0.2)` in train mode receives
# $[0.8,\ 1.2,\ 0.3,\ 0.9]$, and its mask drops position 3 only. What is the output at
# position 1? Set `dropout_value` to a number.
#
# **Question 2 (`ch06_q_switch`).** Which of these, on its own, makes `nn.Dropout` pass its
# input through unchanged? Set `switch_answer` to one letter.
#
# * **a**: `with torch.no_grad():`
# * **b**: `model.eval()`
# * **c**: `with torch.inference_mode():`
# * **d**: any of the three.
#
# **Question 3 (`ch06_q_bn_no_grad`).** A validation loop runs the forward passes under
# `torch.no_grad()` but forgets `model.eval()`. The model has batch norm layers. What happens to
# their running statistics? Set `bn_answer` to one letter.
#
# * **a**: nothing: `no_grad()` freezes every part of the model.
# * **b**: they are updated with every validation batch, so validation data leaks into the
#   statistics the model uses afterwards.
# * **c**: PyTorch raises an error, because running statistics need gradients.
# * **d**: they are reset to mean 0 and variance 1.

# %% nbgrader={"grade_id": "ch06_questions", "solution": true}
dropout_value = None
switch_answer = None
bn_answer = None
### BEGIN SOLUTION
dropout_value = 1.5
switch_answer = "b"
bn_answer = "b"
### END SOLUTION

# %% nbgrader={"grade_id": "ch06_q_dropout_value", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(dropout_value, "ch06_q_dropout_value")
### BEGIN HIDDEN TESTS
check_number(
    dropout_value,
    "ch06_q_dropout_value",
    expected=1.5,
    hints={
        1.2: "that is the eval-mode output. In train mode the kept values are divided by 1 − p.",
        0.96: "the kept values are divided by 1 − p = 0.8, not multiplied by it.",
        2.4: "the factor 2 belongs to p = 0.5; here the kept values are divided by 1 − 0.2.",
        6.0: "divide by the keep probability 1 − p, not by the drop probability p.",
        0.0: "position 1 is kept: the mask drops position 3 only.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch06_q_switch", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(switch_answer, "ch06_q_switch", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    switch_answer,
    "ch06_q_switch",
    choices="abcd",
    correct="b",
    why_not={
        "a": "no_grad switches off autograd's recording; dropout still drops in train mode.",
        "c": "inference_mode is a stricter no_grad: it changes recording, not layers.",
        "d": "only the module's training flag changes dropout; the contexts change recording.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch06_q_bn_no_grad", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(bn_answer, "ch06_q_bn_no_grad", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    bn_answer,
    "ch06_q_bn_no_grad",
    choices="abcd",
    correct="b",
    why_not={
        "a": "no_grad only stops recording. The running statistics are buffers, updated in "
        "place by every train-mode forward, as the table of combinations showed.",
        "c": "running statistics are plain averages, not learnt by gradients: nothing fails.",
        "d": "nothing resets them; each train-mode batch moves them 10% of the way to its own.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# def evaluate(model, loader, loss_fn, device):
#     modes = {m: m.training for m in model.modules()}  # without: a served model or a frozen
#                                                       #   batch norm comes back training
#     model.eval()                                      # without: dropout on, batch norm on batch
#                                                       #   statistics (and updating them)
#     total, correct, count = 0.0, 0, 0
#     with torch.no_grad():                             # without: every forward saves activations
#         for x, y in loader:                           #   for a backward that never comes
#             x, y = x.to(device), y.to(device)
#             out = model(x)
#             total += loss_fn(out, y).item() * len(y)  # without * len(y): a short last batch
#                                                       #   weighs as much as a full one
#             correct += (out.argmax(-1) == y).sum().item()  # .item(): kept tensors keep memory
#             count += len(y)                                #   (and graphs) alive
#     for m, training in modes.items():
#         m.training = training                         # without: see the first line
#     return total / count, correct / count
#
#
# def predict(model, x):                                # plus the mode bookkeeping above
#     device = next(model.parameters()).device          # x may arrive on the CPU
#     with torch.inference_mode():                      # without: a graph per prediction, and
#                                                       #   outputs that could slip into one later
#         return model(x.to(device)).argmax(dim=-1)     # dim=-1: the class scores are last; dim=1
#                                                       #   picks over T for [B, T, features]
# ```
#
# * Dropout by hand: $[0.8, 1.2, 0.3, 0.9]$ with $p = 0.5$ and positions 0 and 2 kept gives
#   $[1.6, 0, 0.6, 0]$ in train mode and the input unchanged in eval mode.
# * Batch norm normalises with the batch's statistics in train mode (and updates its running
#   ones, under `no_grad` too), with the running ones in eval mode. Dropout, batch norm and the
#   layers that hold them (attention layers with `dropout > 0`, `TransformerEncoderLayer`) are
#   what the mode changes.
# * A batch mean times the batch size adds up right only when every example counts once. With
#   class weights or `ignore_index`, add up `reduction="sum"` losses and divide by the total
#   weight (or number) of the targets counted.
# * Without `no_grad`, evaluation saves activations in every forward; memory *grows* only when
#   graph-attached tensors are kept.
# * `inference_mode` promises that its outputs never join a graph; whether it is faster than
#   `no_grad` is for your device's measurement to say.
#
# Next, chapter 07 opens the bug museum: loops that run without an error and learn the wrong
# thing, a forgotten `model.eval()` among them.
