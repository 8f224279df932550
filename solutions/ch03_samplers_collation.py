# %% [markdown]
# # Chapter 03 · Shuffling, samplers and collation
#
# A `DataLoader` makes two decisions that the model never sees: which examples go into each
# batch, and how the examples of one batch become tensors. The first is the **sampler**'s job,
# the second the **collate function**'s. A few of their mistakes stop the loop with an error
# (a collate function that cannot stack examples of different lengths, a `sampler` passed
# together with `shuffle=True`), and this chapter shows them. The costly ones raise nothing,
# because the batches still come out: a model sees 28 batches of dogs before its first cat;
# three processes read the same order every epoch; half of every batch is padding. This
# chapter shows each one on a small data set you can count by hand.
#
# **By the end of this chapter you can:**
#
# 1. say which indices `SequentialSampler`, `RandomSampler`, `WeightedRandomSampler` and
#    `DistributedSampler` yield in an epoch, and what a generator and `set_epoch` change;
# 2. compute inverse-frequency weights, and predict by hand the batches they give on a
#    900-to-100 data set: their balance and how many examples an epoch leaves out;
# 3. work out each rank's indices under `DistributedSampler`, padding included, and count the
#    duplicates the padding adds to a distributed evaluation;
# 4. write a padding `collate_fn` with an attention mask, and measure how much padding length
#    bucketing saves.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # every random number below follows from this seed
BATCH_SIZE = 32  # examples per batch on the 900 dogs / 100 cats data set
MEASURE_BATCHES = 2_000  # weighted batches drawn to compare with the hand calculation
WORLD_SIZE = 3  # processes ("ranks") in the set_epoch example
REVIEW_BATCH = 8  # reviews per batch in the padding sections
BUCKET_MULTIPLIER = 5  # batches per length-sorted chunk of LengthBucketSampler
PAD_EPOCHS = 10  # epochs averaged when measuring padding
TIMING_REPEATS = 5  # timings are the median of this many runs

import math
import time
from fractions import Fraction

import matplotlib.pyplot as plt
import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    RandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

from forge_course import pick_device
from forge_course.data import build_vocabulary, encode, load_reviews, make_imbalanced
from forge_course.device import describe
from forge_course.sims.display import PALETTE

device = pick_device()
torch.manual_seed(SEED)
print("Running on", describe(device))


def median_ms(fn, repeats=TIMING_REPEATS):
    """Median wall time of ``fn()`` in milliseconds."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2] * 1e3


# %% [markdown]
# ## The running example, and where the sampler sits
#
# 900 dogs (label 0) and 100 cats (label 1), stored dogs first, as files sorted by folder
# often are. A `DataLoader` over them works in four stages:
#
# | stage | what it produces | chosen by |
# | --- | --- | --- |
# | sampler | indices, one at a time, in this epoch's order | `shuffle=` or `sampler=` |
# | batch sampler | the indices cut into lists of `batch_size` | `batch_size=`, `drop_last=` or `batch_sampler=` |
# | dataset | `dataset[i]` for every index of a list | your `Dataset` |
# | collate | one batch of tensors from the list of examples | `collate_fn=` |
#
# `shuffle=False` means a `SequentialSampler` (0, 1, 2, ...), `shuffle=True` a
# `RandomSampler`. Passing `sampler=` replaces both; combining it with `shuffle=True` raises a
# `ValueError`.

# %%
X, y = make_imbalanced(n_major=900, n_minor=100, seed=SEED)
dataset = TensorDataset(X, y)
for shuffle in (False, True):
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=shuffle)
    first_labels = next(iter(loader))[1]
    print(
        f"shuffle={shuffle!s:5}  sampler: {type(loader.sampler).__name__:17} "
        f"{len(loader)} batches, the first holds {int(first_labels.sum())} cats"
    )
try:
    DataLoader(dataset, sampler=RandomSampler(dataset), shuffle=True)
except ValueError as err:
    print("sampler= together with shuffle=True:", err)
else:
    raise AssertionError("this torch accepted sampler= together with shuffle=True")

# %% [markdown]
# With `shuffle=False` the first 28 batches hold only dogs ($28 \times 32 = 896$), batch 28
# (counting from 0) holds 4 dogs and 28 cats, and the last three only cats. A model trained in
# that order gets 28 updates in a row that only ever say "dog", then four that say (almost) only
# "cat".
#
# ## The per-epoch permutation
#
# `RandomSampler` draws **one permutation** of $0 \dots N-1$ when an epoch starts, and the
# batches are consecutive slices of it: within an epoch every example comes exactly once.
# The next epoch draws a new permutation.
#
# Where does the randomness come from? Without a generator, each epoch `RandomSampler` draws a
# fresh seed from torch's **global** generator. The order then depends on everything else that
# drew random numbers before it: build one more layer, add a dropout, and the data order
# changes too. Give the sampler its **own** `torch.Generator` and the order depends on that
# generator alone: the same seed gives the same sequence of epochs. (`DataLoader(...,
# shuffle=True, generator=g)` hands `g` to its `RandomSampler`.)


# %%
def three_epochs(sampler):
    return [list(sampler) for _ in range(3)]


own = three_epochs(RandomSampler(range(10), generator=torch.Generator().manual_seed(SEED)))
for epoch, order in enumerate(own):
    print(f"epoch {epoch}: {order}  a permutation of 0..9: {sorted(order) == list(range(10))}")

torch.manual_seed(SEED)
global_a = three_epochs(RandomSampler(range(10)))
torch.manual_seed(SEED)
torch.nn.Linear(4, 4)  # one more layer built: its initialisation draws from the global generator
global_b = three_epochs(RandomSampler(range(10)))
own_again = three_epochs(RandomSampler(range(10), generator=torch.Generator().manual_seed(SEED)))
same_global, same_own = global_a == global_b, own == own_again
print(f"global generator reseeded, one layer built in between -> same orders: {same_global}")
print(f"own generator, re-created from the same seed          -> same orders: {same_own}")

g = torch.Generator().manual_seed(SEED)
print("DataLoader(shuffle=True, generator=g) uses g:",
      DataLoader(dataset, shuffle=True, generator=g).sampler.generator is g)  # fmt: skip

# %% [markdown]
# "Everything else that drew random numbers" includes other DataLoaders, even ones that never
# shuffle. Each `iter(loader)`, that is each epoch's `for batch in loader`, draws a seed for
# the workers from the loader's `generator`, or without one from the global generator, and it
# does so with `shuffle=False` and with no workers at all. The next cell trains on a shuffled
# loader for two epochs without a generator of its own, once as it is and once with a pass
# over an evaluation loader (`shuffle=False`, no workers) after the first epoch.


# %%
def two_epoch_orders(evaluate_between, eval_generator=None):
    torch.manual_seed(SEED)
    train_loader = DataLoader(range(10), batch_size=10, shuffle=True)  # no generator of its own
    eval_loader = DataLoader(range(4), batch_size=2, generator=eval_generator)  # never shuffles
    orders = []
    for _ in range(2):
        orders.append(next(iter(train_loader)).tolist())
        if evaluate_between:
            for _batch in eval_loader:
                pass
    return orders


plain = two_epoch_orders(evaluate_between=False)
evaluated = two_epoch_orders(evaluate_between=True)
shielded = two_epoch_orders(evaluate_between=True, eval_generator=torch.Generator())
print(f"epoch 2 order, no evaluation:                     {plain[1]}")
print(f"epoch 2 order, evaluation in between:             {evaluated[1]}")
print(f"epoch 2 order, evaluation loader has a generator: {shielded[1]}")
assert plain[0] == evaluated[0] and plain[1] != evaluated[1] and shielded == plain

# %% [markdown]
# Adding an evaluation pass changed the training order of every later epoch. The fix is the
# one above: a generator of its own for the training loader makes its order independent of
# anything else. The evaluation loader still takes one number from the global generator per
# pass, which moves whatever else draws from it (dropout masks, a layer built later), unless
# it has a generator of its own too, as in the third line.
#
# A generator advances as it is used, so resuming a run in the middle needs its state saved
# (chapter 09). `DistributedSampler` takes another route, below: it reseeds from `seed + epoch`
# every epoch.
#
# ## Simulation: what each sampler puts in a batch
#
# Each row is one epoch of a sampler over the 900 dogs and 100 cats; each bar is one batch,
# as wide as the examples it holds, and its height is the share of cats in it. The dashed line
# is the share in the data (10%), the dotted one a half.
#
# * **sequential**: 28 batches without a cat, then only cats;
# * **random**: about 10% in every batch;
# * **weighted** (with inverse-frequency weights, next section): about half;
# * **weighted, no replacement**: half at first, then almost none: the epoch still holds
#   exactly 100 cats, the weights only decide *when* they come;
# * **distributed**: rank 0 of 3, a third of the epoch.
#
# The title of each row counts the batches without a cat and the distinct dogs and cats the
# epoch shows. In the live view, pick a sampler, batch size, seed and epoch; for
# **distributed**, also the world size, the rank, and whether the loop calls `set_epoch`. Untick
# it and move the epoch slider: the bars stay where they are.
#
# *Without a widget front end this cell shows the five samplers' first epochs as one still
# picture, as drawn below.*

# %%
from forge_course.sims.sampler_view import composition, draw_shards, padding_view, sampler_view

sampler_view(y, batch_size=BATCH_SIZE, seed=SEED)
latency = median_ms(lambda: composition(y, "weighted", BATCH_SIZE, seed=SEED, epoch=3), 21)
print(f"One update of the view's engine (4 epochs of weighted draws): {latency:.1f} ms")

# %% [markdown]
# *Alt text: five bar charts, one per sampler, of the share of cats in each batch of one
# epoch. Sequential: no bars until batch 28, then four bars near or at 1. Random: low bars
# around the dashed 10% line. Weighted: bars around the dotted 50% line. Weighted without
# replacement: bars near 50% for the first five batches, falling to almost nothing. Distributed:
# eleven low bars around 10%, a third as many batches as the others.*
#
# ## Rebalancing with `WeightedRandomSampler`
#
# `WeightedRandomSampler(weights, num_samples)` draws `num_samples` indices, each with
# probability proportional to its weight, **with replacement** by default. Give each example
# the weight 1 / (number of examples of its class): the *inverse frequency*.
#
# **By hand.** A dog weighs $1/900$, a cat $1/100$. The total weight is
# $900 \cdot \tfrac{1}{900} + 100 \cdot \tfrac{1}{100} = 1 + 1 = 2$, so one draw picks
#
# * one particular dog with probability $\tfrac{1/900}{2} = \tfrac{1}{1800}$, one particular cat
#   with $\tfrac{1/100}{2} = \tfrac{1}{200}$: each cat is $\tfrac{1800}{200} = 9$ times as
#   likely as each dog;
# * *some* cat with probability $100 \cdot \tfrac{1}{200} = \tfrac{1}{2}$: each class carries
#   the same total weight.
#
# A batch of 32 then holds $32 \cdot \tfrac12 = 16$ cats in expectation, give or take
# $\sqrt{32 \cdot \tfrac12 \cdot \tfrac12} = 2.83$ (a binomial's standard deviation), against
# $32 \cdot 0.1 = 3.2$ for plain shuffling.
#
# **The price.** An epoch of 1,000 draws draws each cat $1000/200 = 5$ times on average and
# each dog $1000/1800 \approx 0.556$ times. A given dog is never drawn with probability
# $(1 - \tfrac{1}{1800})^{1000} \approx 0.574$, so about $900 \times 0.574 \approx 516$ dogs
# are left out of each epoch, while the same 100 cats come back again and again.

# %%
dog, cat = Fraction(1, 900), Fraction(1, 100)
total_weight = 900 * dog + 100 * cat
p_dog, p_cat = dog / total_weight, cat / total_weight
assert total_weight == 2 and (p_dog, p_cat) == (Fraction(1, 1800), Fraction(1, 200))
assert p_cat / p_dog == 9 and 100 * p_cat == Fraction(1, 2)
expected_cats = BATCH_SIZE * 100 * p_cat
spread = math.sqrt(BATCH_SIZE * 0.5 * 0.5)
unseen_dogs = 900 * (1 - p_dog) ** 1000
print(f"each cat is {p_cat / p_dog} times as likely as each dog; P(some cat) = {100 * p_cat}")
print(f"cats per batch of {BATCH_SIZE}: {expected_cats} ± {spread:.2f} (plain shuffling: "
      f"{BATCH_SIZE * 0.1:.1f})")  # fmt: skip
print(f"per epoch of 1,000 draws: each cat {1000 * p_cat} times, each dog "
      f"{float(1000 * p_dog):.3f} times, dogs never drawn ≈ {float(unseen_dogs):.1f}")  # fmt: skip

# %% [markdown]
# Now the measurement: `MEASURE_BATCHES` batches of 32 from `WeightedRandomSampler`, against the
# same number from plain shuffling (a new permutation every 1,000 draws).

# %%
weights = torch.where(y == 1, 1 / 100, 1 / 900)  # one weight per example: 1 / its class count
draws = MEASURE_BATCHES * BATCH_SIZE
generator = torch.Generator().manual_seed(SEED)
weighted = torch.tensor(list(WeightedRandomSampler(weights, draws, generator=generator)))
shuffled = torch.tensor(list(RandomSampler(range(1000), num_samples=draws, generator=generator)))
cats_weighted = (y[weighted] == 1).view(MEASURE_BATCHES, BATCH_SIZE).sum(dim=1)
cats_shuffled = (y[shuffled] == 1).view(MEASURE_BATCHES, BATCH_SIZE).sum(dim=1)

times_drawn = torch.bincount(weighted, minlength=1000).double()
one_epoch = weighted[:1000]  # the first 1,000 draws: what one epoch would show
dogs_seen = len(set(one_epoch[one_epoch < 900].tolist()))

fig, ax = plt.subplots(figsize=(7, 3.4))
bins = torch.arange(-0.5, BATCH_SIZE + 1.5).tolist()
ax.hist(cats_shuffled.tolist(), bins=bins, color=PALETTE["grey"], label="shuffled")
ax.hist(cats_weighted.tolist(), bins=bins, color=PALETTE["orange"], alpha=0.85,
        label="weighted, 1 / class count")  # fmt: skip
for expected in (BATCH_SIZE * 0.1, float(expected_cats)):
    ax.axvline(expected, color=PALETTE["black"], ls="--", lw=1)
ax.set(xlabel=f"cats in a batch of {BATCH_SIZE}", ylabel="batches",
       title=f"Cats per batch over {MEASURE_BATCHES:,} batches (dashed: by hand)")  # fmt: skip
ax.legend()
plt.show()
print(f"weighted: {cats_weighted.double().mean():.2f} ± {cats_weighted.double().std():.2f} cats "
      f"per batch (by hand 16 ± 2.83); shuffled: {cats_shuffled.double().mean():.2f}")  # fmt: skip
print(f"draws per cat / draws per dog: {times_drawn[900:].mean() / times_drawn[:900].mean():.2f}"
      " (by hand 9)")  # fmt: skip
print(f"one epoch of 1,000 weighted draws showed {dogs_seen} of the 900 dogs "
      f"(by hand ≈ {900 - float(unseen_dogs):.0f})")  # fmt: skip

# %% [markdown]
# *Alt text: two histograms of the number of cats per batch. The shuffled batches pile up
# around 3, at the left dashed line (3.2); the weighted batches form a wider hump around 16,
# at the right dashed line. The printed lines give the measured means next to the hand
# calculation.*
#
# **Replacement matters.** With `replacement=False` and `num_samples=1000`, the sampler draws
# every example exactly once: the weights only change the *order*, cats early and dogs late,
# and the epoch still holds 10% cats.

# %%
generator = torch.Generator().manual_seed(SEED)
no_replacement = torch.tensor(
    list(WeightedRandomSampler(weights, 1000, replacement=False, generator=generator))
)
is_cat = y[no_replacement] == 1
print(f"cats in the epoch: {int(is_cat.sum())} of 1000, every example drawn once: "
      f"{sorted(no_replacement.tolist()) == list(range(1000))}")  # fmt: skip
print(f"cats among the first 200 draws: {int(is_cat[:200].sum())}, among the last 500: "
      f"{int(is_cat[500:].sum())}")  # fmt: skip

# %% [markdown]
# The other common fix for imbalance keeps the natural batches and scales the loss instead:
# `nn.CrossEntropyLoss(weight=...)` with one weight per class. It sees every dog every epoch;
# oversampling sees more cat examples per batch. Which works better depends on the data.
#
# ## Exercise 1 · `ch03_inverse_frequency`: weights for any labels
#
# Write `inverse_frequency_weights(labels)`. `labels` holds `N` integer class labels, given as a
# list, a NumPy array or an integer tensor; the class ids can be any non-negative integers
# (3, 7 and 42, say), not necessarily $0 \dots K-1$. Return a **float64 tensor of shape `[N]`**
# on the CPU whose entry `i` is `1 / (number of examples whose label is labels[i])`.


# %% nbgrader={"grade_id": "ch03_inverse_frequency", "solution": true}
def inverse_frequency_weights(labels):
    ### BEGIN SOLUTION
    from collections import Counter

    labels = torch.as_tensor(labels).tolist()
    counts = Counter(labels)
    return torch.tensor([1.0 / counts[label] for label in labels], dtype=torch.float64)
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch03_inverse_frequency_tests", "grade": true, "points": 2}
# Visible tests: the 900 dogs and 100 cats, and six labels of three classes given as a list.
from forge_course.grading import ch03

ch03.check_inverse_frequency(inverse_frequency_weights)
print("inverse_frequency_weights: right on the 900/100 data set and on three classes.")
### BEGIN HIDDEN TESTS
ch03.check_inverse_frequency(inverse_frequency_weights, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## `DistributedSampler`: one part of every epoch per process
#
# In data-parallel training (chapter 11) `W` processes, the *ranks*, each train a copy of the
# model on their own part of every epoch. `DistributedSampler` gives rank `r` its part without
# any communication: every rank computes the same order from the same seed and epoch, pads it
# so that its length is a multiple of `W`, and takes every `W`-th index starting at `r`.
#
# **By hand: N = 10 examples, W = 3 ranks, `shuffle=False`.** Each rank gets
# $\lceil 10/3 \rceil = 4$ indices, $3 \times 4 = 12$ in all, so the order $0 \dots 9$ is padded
# by wrapping around to its start: `0 1 2 3 4 5 6 7 8 9 | 0 1`. Slot $i$ goes to rank
# $i \bmod 3$:
#
# | rank | slots | indices |
# | --- | --- | --- |
# | 0 | 0, 3, 6, 9 | `[0, 3, 6, 9]` |
# | 1 | 1, 4, 7, 10 | `[1, 4, 7, 0]` |
# | 2 | 2, 5, 8, 11 | `[2, 5, 8, 1]` |
#
# Twelve reads for ten examples: examples 0 and 1 are read twice, **2 duplicates**. With
# `drop_last=True` the order is cut instead, to $10 // 3 = 3$ per rank: `[0, 3, 6]`,
# `[1, 4, 7]`, `[2, 5, 8]`, and example 9 is never read.

# %%
fig = draw_shards(10, 3)
plt.show()
by_hand = {
    False: [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]],
    True: [[0, 3, 6], [1, 4, 7], [2, 5, 8]],
}
for drop_last, expected in by_hand.items():
    shards = [
        list(DistributedSampler(range(10), num_replicas=3, rank=rank, shuffle=False,
                                drop_last=drop_last))
        for rank in range(3)
    ]  # fmt: skip
    print(f"drop_last={drop_last!s:5}: {shards}")
    assert shards == expected
print("Both match the table worked out by hand.")

# %% [markdown]
# *Alt text: twelve boxes in a row holding 0 to 9 and then 0 and 1 again, coloured by the rank
# that reads them (rank 0, 1, 2, 0, 1, 2, ...); the last two boxes are hatched: the padding.*
#
# ## The duplicates skew a distributed evaluation
#
# Say the model is wrong on examples 0 and 1 and right on the other eight: its accuracy is
# $8/10 = 80\%$. Evaluated on 3 ranks with `DistributedSampler`, the two wrong examples are
# exactly the ones read twice, and averaging over all reads gives $8/12 = 66.7\%$. With
# `drop_last=True` example 9 is dropped: $7/9 = 77.8\%$. Neither is the true accuracy.
#
# The exact way is to shard **without** padding (rank `r` takes `r, r + W, ...`, so the parts
# differ in size by at most one), count `correct` and `seen` on each rank, and add the counts
# over the ranks (in chapter 11, with one `all_reduce`).

# %%
wrong_on = {0, 1}


def accuracy(reads):
    return sum(i not in wrong_on for i in reads) / len(reads)


padded = [i for r in range(3) for i in DistributedSampler(range(10), 3, r, shuffle=False)]
dropped = [
    i for r in range(3) for i in DistributedSampler(range(10), 3, r, shuffle=False, drop_last=True)
]
uneven = [list(range(10))[r::3] for r in range(3)]  # no padding: 4, 3 and 3 examples
correct = sum(sum(i not in wrong_on for i in part) for part in uneven)
seen = sum(len(part) for part in uneven)
print(f"padded:    {len(padded)} reads, {len(padded) - 10} duplicates, "
      f"accuracy {accuracy(padded):.1%}")  # fmt: skip
print(f"drop_last: {len(dropped)} reads, example 9 missing, accuracy {accuracy(dropped):.1%}")
print(f"uneven shards, counts added: {correct}/{seen} = {correct / seen:.1%}")
repeats = {w: w * math.ceil(1000 / w) - 1000 for w in range(1, 9)}
print("duplicates for the 1,000 dogs and cats on W ranks:", repeats)

# %% [markdown]
# There are $W \lceil N/W \rceil - N$ duplicates, never more than $W - 1$: negligible on a
# large validation set, large on a small one, and on a per-class metric of a rare class.
#
# ## `set_epoch`: a new order every epoch
#
# When `shuffle=True`, `DistributedSampler` builds a fresh generator from `seed + epoch` each
# time an epoch starts. It has no state that advances by itself, so that every rank (and a run
# resumed at epoch 5) gets the same order without talking to the others. It learns the epoch
# only from `sampler.set_epoch(epoch)`, called before iterating. Forget it and the epoch stays
# 0: **every epoch repeats the first epoch's order**.


# %%
def rank_orders(call_set_epoch, rank=0, epochs=3):
    sampler = DistributedSampler(range(10), WORLD_SIZE, rank, shuffle=True, seed=SEED)
    orders = []
    for epoch in range(epochs):
        if call_set_epoch:
            sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


print("rank 0 without set_epoch:", rank_orders(False))
print("rank 0 with set_epoch:   ", rank_orders(True))
epoch_1 = [rank_orders(True, rank)[1] for rank in range(WORLD_SIZE)]
print(f"epoch 1, all ranks: {epoch_1}; every example read: "
      f"{sorted(set(sum(epoch_1, []))) == list(range(10))}")  # fmt: skip

# %% [markdown]
# In a loop, the call goes at the top of the epoch:
#
# ```python
# sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed)
# loader = DataLoader(train_set, batch_size=32, sampler=sampler)
# for epoch in range(epochs):
#     sampler.set_epoch(epoch)
#     for batch in loader:
#         ...
# ```
#
# `LengthBucketSampler`, later in this chapter, reseeds the same way and needs the same call.
#
# ## Exercise 2 · `ch03_shard_indices`: what `DistributedSampler` hands one rank
#
# Write `shard_indices(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0,
# drop_last=False)` returning the list of indices that rank `rank` reads in epoch `epoch`,
# exactly as `DistributedSampler(range(dataset_size), world_size, rank, shuffle, seed,
# drop_last)` after `set_epoch(epoch)`:
#
# * the order is `torch.randperm(dataset_size, generator=g).tolist()` with
#   `g = torch.Generator().manual_seed(seed + epoch)`, or `0 .. dataset_size-1` without shuffle;
# * without `drop_last` every rank gets $\lceil N / W \rceil$ indices, the order padded by
#   wrapping around to its start (more than once if $N < W$); with `drop_last`, $N // W$;
# * rank `r` takes every `W`-th index of the padded order, starting at `r`.
#
# The check compares every rank with torch's real `DistributedSampler` on many
# configurations; using `DistributedSampler` inside your answer does not count. Leave torch's
# global generator alone (no `torch.manual_seed`).


# %% nbgrader={"grade_id": "ch03_shard_indices", "solution": true}
def shard_indices(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    ### BEGIN SOLUTION
    if shuffle:
        generator = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(dataset_size, generator=generator).tolist()
    else:
        order = list(range(dataset_size))
    # drop_last cuts the order down to a multiple of world_size; otherwise it is padded up.
    per_rank = dataset_size // world_size if drop_last else math.ceil(dataset_size / world_size)
    total = per_rank * world_size
    padded = [order[i % dataset_size] for i in range(total)]
    return padded[rank::world_size]
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch03_shard_indices_tests", "grade": true, "points": 3}
# Visible tests: N=10 on 3 ranks without shuffle, shuffled at epoch 1, and with drop_last.
from forge_course.grading import ch03

ch03.check_shard_indices(shard_indices)
print("shard_indices: every rank matches DistributedSampler in the three cases.")
### BEGIN HIDDEN TESTS
ch03.check_shard_indices(shard_indices, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Collation: from a list of examples to one batch
#
# Once the batch sampler has a list of indices, the `DataLoader` fetches the examples and
# hands the list to `collate_fn`. The default stacks them along a new first dimension. That
# works when every example has the same shape; sentences do not. The running example for the
# rest of the chapter is 164 short product reviews shipped with the course, turned into token
# ids.

# %%
texts, review_labels = load_reviews()
vocabulary = build_vocabulary(texts)
reviews = [(encode(text, vocabulary), label) for text, label in zip(texts, review_labels)]
lengths = [len(ids) for ids, _ in reviews]
print(f"{len(reviews)} reviews, {len(vocabulary)} ids in the vocabulary, "
      f"{min(lengths)} to {max(lengths)} tokens, {sum(lengths)} tokens in all")  # fmt: skip
for text, (ids, label) in zip(texts[:3], reviews[:3]):
    print(f"  {text!r:52} label {label}  ids {ids.tolist()}")
try:
    next(iter(DataLoader(reviews, batch_size=3)))
except RuntimeError as err:
    print("default collate_fn:", err)
else:
    raise AssertionError("the default collate_fn stacked reviews of different lengths")

# %% [markdown]
# **By hand: pad the first three reviews.** Their lengths are 2, 2 and 9, so the batch is
# $3 \times 9$: 27 positions, of which $2 + 2 + 9 = 13$ are real tokens and 14 (52%) padding.
# With `<pad>` = 0:
#
# ```
# input_ids                                   attention_mask              labels
# [165,   6,   0,   0,   0,   0,   0,   0,   0]   [1, 1, 0, 0, 0, 0, 0, 0, 0]   1
# [117, 445,   0,   0,   0,   0,   0,   0,   0]   [1, 1, 0, 0, 0, 0, 0, 0, 0]   0
# [  2, 156, 268, 139,   3,   2,  76, 203, 319]   [1, 1, 1, 1, 1, 1, 1, 1, 1]   1
# ```
#
# The batch is padded to its *own* longest review, 9, not to the longest in the data set, 29.

# %%
from forge_course.reference import sampling as ref

batch = ref.pad_collate(reviews[:3])
by_hand = {
    "input_ids": [[165, 6] + [0] * 7, [117, 445] + [0] * 7, [2, 156, 268, 139, 3, 2, 76, 203, 319]],
    "attention_mask": [[1, 1] + [0] * 7, [1, 1] + [0] * 7, [1] * 9],
    "labels": [1, 0, 1],
}
for key, rows in by_hand.items():
    assert batch[key].tolist() == rows, key
    print(
        f"{key:15} shape {list(batch[key].shape)}, dtype {batch[key].dtype}: as worked out by hand"
    )
real = int(batch["attention_mask"].sum())
print(f"{real} real tokens, {batch['input_ids'].numel() - real} padding positions")

# %% [markdown]
# **Why the mask.** Padding positions are numbers like any other to the model. Take the
# simplest sentence model, the mean of the token embeddings. Without the mask, "Love it." gets
# one vector when it is alone in its batch and another when it shares the batch with a 9-token
# review: its own 2 tokens are averaged with 7 padding vectors. With the mask it gets the same
# vector in any batch.

# %%
torch.manual_seed(SEED)
embed = torch.nn.Embedding(len(vocabulary), 4)


def mean_embedding(batch, use_mask):
    vectors = embed(batch["input_ids"])  # [B, L, 4]
    if not use_mask:
        return vectors.mean(dim=1)
    mask = batch["attention_mask"].unsqueeze(-1).to(vectors.dtype)  # [B, L, 1]
    return (vectors * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


with torch.no_grad():
    for use_mask in (False, True):
        alone = mean_embedding(ref.pad_collate(reviews[:1]), use_mask)[0]
        in_batch = mean_embedding(ref.pad_collate(reviews[:3]), use_mask)[0]
        print(f"mask {'used' if use_mask else 'ignored':7}: 'Love it.' alone "
              f"{[round(v, 3) for v in alone.tolist()]}, in the batch of three "
              f"{[round(v, 3) for v in in_batch.tolist()]}")  # fmt: skip

# %% [markdown]
# Collation runs inside the `DataLoader`, in its worker processes when `num_workers > 0`, so a
# `collate_fn` builds CPU tensors and leaves the move to the device to the training loop.
#
# ## Exercise 3 · `ch03_pad_collate`: a padding collate function
#
# Write `pad_collate(batch, pad_value=0)`. `batch` is a list of `(sequence, label)` pairs: a
# sequence is a 1-D tensor of token ids (of any integer dtype, and possibly empty), a label a
# Python int. Return a dict:
#
# * `"input_ids"`: `[B, L]`, where `L` is the longest sequence **in this batch** (0 if all are
#   empty), in the sequences' dtype; each row is its sequence followed by `pad_value`;
# * `"attention_mask"`: `[B, L]`, `torch.long`, 1 on real tokens and 0 on padding. Build it
#   from the lengths: a real token may be equal to `pad_value`;
# * `"labels"`: `[B]`, `torch.long` (int64) whatever the sequences' dtype, the class indices
#   that `CrossEntropyLoss` takes (it refuses int32); `torch.tensor(labels)` gives that.


# %% nbgrader={"grade_id": "ch03_pad_collate", "solution": true}
def pad_collate(batch, pad_value=0):
    ### BEGIN SOLUTION
    sequences = [sequence for sequence, _ in batch]
    longest = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(batch), longest), pad_value, dtype=sequences[0].dtype)
    attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = sequence
        attention_mask[row, : len(sequence)] = 1
    labels = torch.tensor([label for _, label in batch])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch03_pad_collate_tests", "grade": true, "points": 3}
# Visible tests: the three reviews above, and a batch padded with -1.
from forge_course.grading import ch03

ch03.check_pad_collate(pad_collate)
print("pad_collate: both batches match the reference, mask and dtypes included.")
### BEGIN HIDDEN TESTS
ch03.check_pad_collate(pad_collate, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# **PyTorch's own padding.** `torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True,
# padding_value=0)` builds the same `input_ids` in one call. It builds no mask: the mask comes
# from the lengths, `arange(L) < lengths[:, None]`, which is also why a real token equal to the
# pad id stays unmasked. Its `padding_side="left"` (torch 2.6 and later) puts the padding
# first, which models that generate text after the last real token need.

# %%
import inspect

from torch.nn.utils.rnn import pad_sequence

sequences = [ids for ids, _ in reviews[:3]]
padded = pad_sequence(sequences, batch_first=True, padding_value=0)
lengths = torch.tensor([len(ids) for ids in sequences])
mask = (torch.arange(padded.shape[1]) < lengths[:, None]).long()
assert torch.equal(padded, batch["input_ids"]) and torch.equal(mask, batch["attention_mask"])
print("pad_sequence + a mask from the lengths: the same batch as pad_collate")
if "padding_side" in inspect.signature(pad_sequence).parameters:
    left = pad_sequence(sequences, batch_first=True, padding_value=0, padding_side="left")
    print("padded on the left, 'Love it.':", left[0].tolist())

# %% [markdown]
# ## Length bucketing: batches of similar lengths
#
# A batch is as wide as its longest review, so random batches that mix a 2-token review with
# a 29-token one are mostly padding. `LengthBucketSampler` (in `forge_course.reference.sampling`)
# keeps most of the randomness and removes most of the padding. Each epoch it
#
# 1. shuffles the indices (from `seed + epoch`, so it has a `set_epoch` too);
# 2. cuts them into chunks of `batch_size × bucket_size_multiplier` examples;
# 3. sorts each chunk by length and cuts it into batches;
# 4. shuffles the order of all the batches.
#
# Every review still comes once per epoch. The multiplier trades padding for randomness: at 1
# the batches are plain random batches; once a chunk covers the whole data set, every epoch
# groups the same neighbouring lengths together (only reviews of equal length change places)
# and just serves the batches in another order. It is passed as
# `DataLoader(reviews, batch_sampler=sampler, collate_fn=pad_collate)`.
#
# In the view, every row is one review, the epoch's batches one under the other: blue for
# tokens, orange for padding. Move the **multiplier** to watch the orange shrink, and the
# **batch size** to see that larger batches waste more.
#
# *Without a widget front end this cell shows random and bucketed batches of one epoch side by
# side, as drawn below.*

# %%
padding_view(lengths, batch_size=REVIEW_BATCH, multiplier=BUCKET_MULTIPLIER, seed=SEED)

# %% [markdown]
# *Alt text: two grids of 164 rows, one per review, grouped into batches of 8. On the left
# (random batches) most rows end in a long orange stretch of padding; on the right (bucketed)
# each batch is nearly all blue, with short orange ends. The titles give the padding counts.*
#
# ## The padding saved, measured
#
# Over `PAD_EPOCHS` epochs, the next cell counts the padding positions of random batches and of
# bucketed ones with `BUCKET_MULTIPLIER`, then sweeps the multiplier. It also checks the count
# against the zeros in the attention masks of a real `DataLoader`.


# %%
def random_batches(epoch, batch_size=REVIEW_BATCH):
    generator = torch.Generator().manual_seed(SEED + epoch)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def bucketed_batches(epoch, multiplier=BUCKET_MULTIPLIER):
    sampler = ref.LengthBucketSampler(
        lengths, REVIEW_BATCH, seed=SEED, bucket_size_multiplier=multiplier
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def mean_padding(make_batches):
    counts = [ref.padding_tokens(lengths, make_batches(epoch)) for epoch in range(PAD_EPOCHS)]
    return sum(counts) / len(counts)


tokens = sum(lengths)
pad_random = mean_padding(random_batches)
pad_bucketed = mean_padding(bucketed_batches)
for name, pad in (("random", pad_random), (f"bucketed ×{BUCKET_MULTIPLIER}", pad_bucketed)):
    print(f"{name:12} batches: {pad:7.1f} padding positions per epoch = "
          f"{pad / (tokens + pad):.1%} of all positions")  # fmt: skip
print(f"bucketing removes {1 - pad_bucketed / pad_random:.0%} of the padding")

sampler = ref.LengthBucketSampler(lengths, REVIEW_BATCH, seed=SEED,
                                  bucket_size_multiplier=BUCKET_MULTIPLIER)  # fmt: skip
loader = DataLoader(reviews, batch_sampler=sampler, collate_fn=ref.pad_collate)
mask_zeros = sum(int((b["attention_mask"] == 0).sum()) for b in loader)
assert mask_zeros == ref.padding_tokens(lengths, sampler)
print(f"epoch 0 through a DataLoader: {mask_zeros} zeros in the attention masks = the count")

multipliers = list(range(1, 22))
fractions = []
for m in multipliers:
    pad = mean_padding(lambda epoch, m=m: bucketed_batches(epoch, multiplier=m))
    fractions.append(pad / (tokens + pad))
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.plot(multipliers, fractions, "o-", color=PALETTE["blue"], label="bucketed")
ax.axhline(pad_random / (tokens + pad_random), color=PALETTE["orange"], ls="--",
           label="random batches")  # fmt: skip
ax.set(xlabel="bucket_size_multiplier (batches per sorted chunk)",
       ylabel="share of positions that are padding", ylim=(0, None),
       title=f"Padding of the reviews, batches of {REVIEW_BATCH}, mean of {PAD_EPOCHS} epochs")  # fmt: skip
ax.xaxis.get_major_locator().set_params(integer=True)
ax.legend()
plt.show()

# %% [markdown]
# *Alt text: the share of padding under bucketing against the multiplier. It starts on the
# dashed line of random batches at multiplier 1, falls steeply over the first few
# multipliers, flattens out, and drops once more at 21.*
#
# At multiplier 1 bucketing gives the random batches back: the line starts on the dashed one.
# From 11 to 20 a chunk holds 88 to 160 reviews, so the 164 reviews fall into two chunks
# sorted separately; at 21 one chunk (168 places) holds them all, and the only padding left
# is between neighbouring lengths within a batch.
#
# **Does less padding make training faster?** Fewer positions mean less arithmetic, but each
# batch also has fixed costs. The next cell times forward and backward over one epoch of a
# small transformer layer, random against bucketed batches, on your device. On a CPU it uses
# one thread, so that the timing does not depend on what else the machine is running; the two
# kinds of epoch take turns, so that a slow moment hits both.

# %%
vocab_size = len(vocabulary)


class TinyEncoder(torch.nn.Module):
    """Embedding, one transformer layer that ignores padding, a masked mean, two logits."""

    def __init__(self, width=128):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, width)
        self.layer = torch.nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0,
                                                      batch_first=True)  # fmt: skip
        self.head = torch.nn.Linear(width, 2)

    def forward(self, input_ids, attention_mask):
        hidden = self.layer(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * mask).sum(dim=1) / mask.sum(dim=1))


torch.manual_seed(SEED)
encoder = TinyEncoder().to(device)
cross_entropy = torch.nn.CrossEntropyLoss()
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def on_device(batch):
    return {key: value.to(device) for key, value in batch.items()}


def train_pass(batches):
    for batch in batches:
        encoder.zero_grad()
        logits = encoder(batch["input_ids"], batch["attention_mask"])
        cross_entropy(logits, batch["labels"]).backward()
    sync()


prepared = {
    "random": [on_device(ref.pad_collate([reviews[i] for i in b])) for b in random_batches(0)],
    "bucketed": [on_device(ref.pad_collate([reviews[i] for i in b])) for b in bucketed_batches(0)],
}
positions = {name: sum(b["input_ids"].numel() for b in bs) for name, bs in prepared.items()}
samples = {name: [] for name in prepared}
threads = torch.get_num_threads()
torch.set_num_threads(1)
try:
    for batches in prepared.values():
        train_pass(batches)  # warm-up: the first pass allocates memory and picks kernels
    for _ in range(TIMING_REPEATS):
        for name, batches in prepared.items():
            start = time.perf_counter()
            train_pass(batches)
            samples[name].append((time.perf_counter() - start) * 1e3)
finally:
    torch.set_num_threads(threads)
timings = {name: sorted(times)[len(times) // 2] for name, times in samples.items()}
for name in prepared:
    print(f"{name:8}: {positions[name]:5} positions, forward + backward {timings[name]:6.1f} ms "
          f"per epoch (median of {TIMING_REPEATS})")  # fmt: skip
print(f"bucketing: {positions['random'] / positions['bucketed']:.2f}× fewer positions, "
      f"{timings['random'] / timings['bucketed']:.2f}× less time on {device.type}")  # fmt: skip

# %% [markdown]
# Compare the two ratios printed last. Time falls by less than the positions where part of
# each step does not grow with the width of the batch: the Python code, launching each
# operation, the layers that work on whole examples. It can fall by more where a cost grows
# faster than the width: attention compares every position with every other, so its work
# grows with the square of the width. Which side wins depends on the model, the batch and the
# device, so measure your own before counting on a speed-up.
#
# ## Check your understanding
#
# **Question 1 (`ch03_q_duplicates`).** Ten validation examples are evaluated on 3 ranks with
# `DistributedSampler(val_set, num_replicas=3, rank=r, shuffle=False)` (so `drop_last=False`).
# How many of the predictions made over all ranks repeat an example already predicted on?
# Set `duplicates` to a number.
#
# **Question 2 (`ch03_q_cat_odds`).** With weight $1/900$ on each of 900 dogs and $1/100$ on
# each of 100 cats, one draw of `WeightedRandomSampler` picks one particular cat how many times
# as often as one particular dog? Set `cat_vs_dog` to a number.
#
# **Question 3 (`ch03_q_set_epoch`).** A loop builds `DistributedSampler(train_set,
# shuffle=True)` and a `DataLoader` over it, and never calls `sampler.set_epoch`. What happens
# over the epochs? Set `set_epoch_answer` to one letter.
#
# * **a**: the `DataLoader` raises an error when the second epoch starts.
# * **b**: each rank reads its own share of the examples, in an order that is shuffled once and
#   then repeated: every epoch is the same as the first.
# * **c**: each rank reshuffles on its own every epoch, so ranks overlap and some examples
#   are skipped.
# * **d**: nothing is shuffled: every rank reads its indices in increasing order.
#
# **Question 4 (`ch03_q_replacement`).** `WeightedRandomSampler(weights, num_samples=1000,
# replacement=False)` with inverse-frequency weights on the 900 dogs and 100 cats: how many
# cats does one epoch hold? Set `cats_without_replacement` to a number.

# %% nbgrader={"grade_id": "ch03_questions", "solution": true}
duplicates = None
cat_vs_dog = None
set_epoch_answer = None
cats_without_replacement = None
### BEGIN SOLUTION
duplicates = 2
cat_vs_dog = 9
set_epoch_answer = "b"
cats_without_replacement = 100
### END SOLUTION

# %% nbgrader={"grade_id": "ch03_q_duplicates", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(duplicates, "ch03_q_duplicates")
### BEGIN HIDDEN TESTS
check_number(
    duplicates,
    "ch03_q_duplicates",
    expected=2,
    hints={
        0: "without drop_last, DistributedSampler pads every rank to ceil(10 / 3) = 4 indices.",
        12: "12 is the number of predictions; the question asks how many of them are repeats.",
        4: "4 is the number of indices per rank; count the reads beyond the 10 examples.",
        1: "each rank reads 4, so 12 reads for 10 examples: count the repeats again.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch03_q_cat_odds", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(cat_vs_dog, "ch03_q_cat_odds")
### BEGIN HIDDEN TESTS
check_number(
    cat_vs_dog,
    "ch03_q_cat_odds",
    expected=9,
    hints={
        1 / 9: "that is a dog compared with a cat: the cat's weight 1/100 is 9 times 1/900.",
        0.5: "one half is the chance that a draw is *some* cat; the question is about one cat.",
        1: "equal chances per example is plain random sampling; these weights differ.",
        0.1: "10% is the share of cats in the data, before any weighting.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch03_q_set_epoch", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(set_epoch_answer, "ch03_q_set_epoch", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    set_epoch_answer,
    "ch03_q_set_epoch",
    choices="abcd",
    correct="b",
    why_not={
        "a": "nothing checks for the call: the loop runs without any error or warning.",
        "c": "every rank seeds with seed + epoch; with the epoch stuck at 0 they still agree "
        "with each other, so nothing overlaps. They just never change.",
        "d": "the order is shuffled, once, from seed + 0, and that one order is then repeated.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch03_q_replacement", "grade": true, "points": 1}
from forge_course.grading import check_number

check_number(cats_without_replacement, "ch03_q_replacement")
### BEGIN HIDDEN TESTS
check_number(
    cats_without_replacement,
    "ch03_q_replacement",
    expected=100,
    hints={
        500: "half cats is what drawing *with* replacement gives. Without it, 1,000 draws from "
        "1,000 examples take each one exactly once.",
        50: "without replacement each example is drawn exactly once per 1,000 draws.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# loader = DataLoader(train_set, batch_size=32, shuffle=True,
#                     generator=torch.Generator().manual_seed(seed))
#                     # without a generator: the order depends on every other use of the global RNG
# weights = inverse_frequency_weights(labels)          # without: batches follow the 90/10 split
# sampler = WeightedRandomSampler(weights, num_samples=len(labels))
#                     # replacement=False: the same 10% cats per epoch, only earlier
# sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed)
# for epoch in range(epochs):
#     sampler.set_epoch(epoch)                         # without: the same order every epoch
#     ...
# loader = DataLoader(reviews, batch_sampler=LengthBucketSampler(lengths, 8),
#                     collate_fn=pad_collate)
#                     # without pad_collate: the default collate cannot stack ragged sequences;
#                     # without its mask: padding leaks into the model's view of each example;
#                     # without bucketing: the share of padding measured above
# ```
#
# * `RandomSampler` draws one permutation per epoch; a generator of its own makes the order
#   reproducible. Without one, every `iter()` of any DataLoader, unshuffled and without workers
#   included, draws from the global generator and moves the training order.
# * Inverse-frequency weights make each class equally likely per draw: every cat 9 times as
#   likely as every dog, batches half cats, and about 516 dogs left out of each epoch.
# * `DistributedSampler` pads by wrapping around (N=10 on 3 ranks: rank 1 reads
#   `[1, 4, 7, 0]`), which puts 2 duplicates into a distributed evaluation; shard without
#   padding and add the counts to evaluate exactly.
#
# Next, chapter 04 takes one training step apart: what happens to a batch once the loader has
# made it.
