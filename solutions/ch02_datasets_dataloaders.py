# %% [markdown]
# # Chapter 02 · Datasets and DataLoaders
#
# A training loop asks for batches; your data sits in a file. Between the two stand two objects
# with small, exact contracts. A **Dataset** says how many examples there are and how to fetch
# one. A **DataLoader** decides which examples travel together, which process fetches them, and
# how they become one tensor. This chapter builds both on a small file of product reviews,
# counts by hand what a DataLoader does, measures what worker processes cost and what they buy,
# and fixes a bug where workers silently repeat each other's "random" augmentations.
#
# **By the end of this chapter you can:**
#
# 1. write a map-style dataset over a CSV file, and say when an iterable dataset fits better;
# 2. predict the batches a DataLoader yields for any dataset size, batch size and `drop_last`,
#    and which worker builds each one;
# 3. decide from a measurement, not a rule of thumb, whether `num_workers > 0` helps, and say
#    what `persistent_workers`, `prefetch_factor` and `pin_memory` change;
# 4. give every worker its own reproducible random stream with a `worker_init_fn`;
# 5. measure why a dataset held as many Python objects grows in every forked worker, and
#    store it so that it does not.

# %%
# Settings for this chapter: change them and run the notebook again.
SEED = 0  # seed of every shuffle and every random draw below
N_EXAMPLES = 100  # dataset size of the hand calculation ...
BATCH_SIZE = 16  # ... and its batch size
NUM_WORKERS = 2  # worker processes in the demos (one per core of a small machine)
TIMING_ROWS = 4096  # rows of the in-memory dataset that is timed
ITEM_DELAY = 0.004  # seconds of simulated work per item (a disk read, a decode)
DELAYED_ROWS = 160  # rows of the slow dataset: 160 × 4 ms = 0.64 s of work per epoch
TIMING_EPOCHS = 2  # epochs timed per loader; the first one includes starting the workers
COW_PATHS = 200_000  # paths in the copy-on-read demo: 80 bytes each as Python str (64 from 3.12)

import csv
import random
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from forge_course import pick_device
from forge_course.data import UNK_ID, build_vocabulary, encode, reviews_csv_path, tokenize
from forge_course.device import describe
from forge_course.sims.display import PALETTE

device = pick_device()
torch.manual_seed(SEED)
print("Running on", describe(device))

# %% [markdown]
# ## The running example: product reviews in a CSV file
#
# The course ships `reviews.csv`: a header row `text,label`, then one review per row, labelled 1
# if it is positive and 0 if it is negative. Several reviews contain commas, so the CSV format
# wraps them in quotes. That is why the next cell reads the file with Python's `csv` module:
# cutting each line at its commas would cut those reviews in two.
#
# A model cannot read words, so each review becomes a list of integer ids. `tokenize` lower-cases
# a text and splits it into words, `build_vocabulary` numbers the words it sees (id 0 is
# `<pad>`, id 1 is `<unk>` for any word it has not seen), and `encode` turns a text into an int64
# tensor of ids.

# %%
with open(reviews_csv_path(), newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))  # one dict per row, keyed by the header: text, label
texts = [row["text"] for row in rows]
labels = [int(row["label"]) for row in rows]
vocabulary = build_vocabulary(texts)
lengths = [len(tokenize(text)) for text in texts]

print(f"{len(rows)} reviews ({sum(labels)} positive), {len(vocabulary)} ids in the vocabulary")
print(f"row 6: {rows[6]}")
print(f"encoded: {encode(rows[6]['text'], vocabulary)}")
print(f"a word never seen becomes UNK_ID = {UNK_ID}: {encode('The kettle is zorbly', vocabulary)}")
print(f"lengths: {min(lengths)} to {max(lengths)} tokens")

fig, ax = plt.subplots(figsize=(7, 3))
bins = np.arange(0.5, max(lengths) + 1.5)
for label, name, colour in [(1, "positive", PALETTE["blue"]), (0, "negative", PALETTE["orange"])]:
    ax.hist([n for n, y in zip(lengths, labels) if y == label], bins=bins, histtype="step",
            linewidth=2, color=colour, label=name)  # fmt: skip
ax.set(xlabel="review length (tokens)", ylabel="reviews", title="How long the reviews are")
ax.yaxis.get_major_locator().set_params(integer=True)
ax.legend()
plt.show()

# %% [markdown]
# *Alt text: two step histograms of review length in tokens, positive and negative reviews.
# Both classes fall mostly into three groups: very short reviews of 2 to 4 tokens, a broad group from about
# 9 to 17 tokens, and a few long ones from 25 to 29.*
#
# The reviews are *ragged*: their lengths differ, so two encoded reviews cannot simply be stacked
# into one tensor. Keep that in mind until the section on collation.
#
# ## Two kinds of dataset
#
# | | map-style `Dataset` | iterable `IterableDataset` |
# | --- | --- | --- |
# | what you write | `__len__()` and `__getitem__(i)` | `__iter__()` |
# | who chooses the order | the DataLoader's sampler, so shuffling is free | the dataset: `shuffle=True` is refused |
# | random access | any example, at any time | examples arrive in stream order |
# | with worker processes | the main process tells each worker which indices to load | every worker runs its own `__iter__`: the dataset must split the stream itself |
# | fits | anything you can index: rows of a file, images in a folder, records | streams: a database cursor, logs, data generated on the fly, files too large to index |
#
# The map-style contract is so small that a `range` already meets it: it has a length and
# returns an item for each index. So does the class below, which is the whole contract in two
# methods. `list(squares)` works too, although the class defines no `__iter__`: Python falls
# back on calling `__getitem__(0)`, `__getitem__(1)`, ... until one raises `IndexError`. A
# dataset that never raises it makes `list(dataset)` run forever.


# %%
class Squares(Dataset):
    """The squares of 0 .. n-1, with list-like indexing."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if not -self.n <= index < self.n:
            raise IndexError(f"index {index} is out of range for {self.n} items")
        return (index % self.n) ** 2


squares = Squares(5)
print(f"len {len(squares)}, squares[3] = {squares[3]}, squares[-1] = {squares[-1]}")
print(f"list(squares) = {list(squares)}")
print("DataLoader(range(10), batch_size=4):", [b.tolist() for b in DataLoader(range(10), 4)])
print("DataLoader(squares, batch_size=2):  ", [b.tolist() for b in DataLoader(squares, 2)])

# %% [markdown]
# ## Exercise 1 · `ch02_csv_dataset`: the reviews as a map-style dataset
#
# Write `ReviewsDataset(path, vocabulary)` for a CSV file with the columns `text,label`:
#
# * `__init__` reads the file at `path` with the `csv` module, inside
#   `with open(path, newline="", encoding="utf-8") as f:`, so the file is closed again: the
#   dataset keeps no open file. (`csv.DictReader(f)` gives one dict per row, keyed by the header.)
# * `len(dataset)` is the number of reviews; the header row is not a review.
# * `dataset[i]` returns a tuple `(token_ids, label)`: `token_ids` is `encode(text, vocabulary)`,
#   a `[length]` int64 tensor (words missing from the vocabulary become `UNK_ID`; an empty review
#   gives an empty tensor), and `label` is a 0-d int64 tensor, `torch.tensor(1)` or
#   `torch.tensor(0)`.
# * Indices work as for a list: `dataset[-1]` is the last review, and an index outside
#   `[-len(dataset), len(dataset))` raises `IndexError`.
#
# Whether you encode every text in `__init__` or one text per `__getitem__` call is up to you.
# The check also loads your dataset through a shuffling DataLoader (with worker processes in
# the hidden tests), copies it with `copy.deepcopy` (workers started with *spawn*, the default
# on macOS and Windows, receive such a copy, so the dataset must hold nothing that cannot be
# copied, like an open file), and tries a file whose fields hold commas, quotes and a line
# break.


# %% nbgrader={"grade_id": "ch02_csv_dataset", "solution": true}
class ReviewsDataset(Dataset):
    def __init__(self, path, vocabulary):
        ### BEGIN SOLUTION
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        self.token_ids = [encode(row["text"], vocabulary) for row in rows]
        self.labels = [torch.tensor(int(row["label"])) for row in rows]
        ### END SOLUTION

    def __len__(self):
        ### BEGIN SOLUTION
        return len(self.labels)
        ### END SOLUTION

    def __getitem__(self, index):
        ### BEGIN SOLUTION
        return self.token_ids[index], self.labels[index]
        ### END SOLUTION


# %% nbgrader={"grade_id": "ch02_csv_dataset_tests", "grade": true, "points": 3}
# Visible tests: the shipped file; its length, six items (negative indices too), the errors past
# both ends, no open file, a deep copy and one shuffled DataLoader epoch.
from forge_course.grading import ch02

ch02.check_csv_dataset(ReviewsDataset)
print("ReviewsDataset: length, items, index errors and loading all match the reference.")
### BEGIN HIDDEN TESTS
ch02.check_csv_dataset(ReviewsDataset, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# ## From items to a batch: `collate_fn`
#
# For each batch the DataLoader calls `dataset[i]` once per index, then hands the list of items
# to its `collate_fn`. The default one, `default_collate`, stacks tensors with `torch.stack`,
# which needs equal shapes. Reviews are ragged, so the default fails on the first batch; the
# next cell shows the error. The fix is a collate function that pads every review to the
# longest *in its batch* and returns a mask of the real tokens: `pad_collate`, which chapter 03
# builds in full. The cells from here on use the course's own `ReviewsDataset`, so they run
# whatever your answer above does.

# %%
from forge_course.reference.datasets import ReviewsDataset as CourseReviews
from forge_course.reference.sampling import pad_collate

reviews = CourseReviews(reviews_csv_path(), vocabulary)
shuffled = torch.Generator().manual_seed(SEED)
try:
    next(iter(DataLoader(reviews, batch_size=BATCH_SIZE, shuffle=True, generator=shuffled)))
except RuntimeError as err:
    print("default_collate:", str(err).splitlines()[0])

loader = DataLoader(reviews, batch_size=BATCH_SIZE, shuffle=True, collate_fn=pad_collate,
                    generator=torch.Generator().manual_seed(SEED))  # fmt: skip
batch = next(iter(loader))
print({name: (list(t.shape), str(t.dtype)) for name, t in batch.items()})
real = batch["attention_mask"].sum().item()
print(f"{real} real tokens and {batch['attention_mask'].numel() - real} padding in this batch")

# %% [markdown]
# ## The DataLoader and its arguments
#
# | argument | default | what it does | change it when |
# | --- | --- | --- | --- |
# | `batch_size` | 1 | examples per batch | almost always |
# | `shuffle` | `False` | a new random order every epoch (a `RandomSampler`) | training; keep `False` for evaluation |
# | `sampler`, `batch_sampler` | `None` | choose the order, or the batches, yourself | class balance, sharding, length bucketing (chapter 03) |
# | `drop_last` | `False` | drop the last batch if it is short | a layer misbehaves on tiny batches (BatchNorm), or every batch must have one shape |
# | `collate_fn` | `default_collate` | turns a list of items into one batch | items of unequal shapes (padding) |
# | `num_workers` | 0 | processes that load batches in parallel; 0 loads in the main process | loading takes real time per item: measure first |
# | `worker_init_fn` | `None` | runs once in each worker as it starts (every epoch, or once with `persistent_workers`) | per-worker set-up, such as seeding |
# | `generator` | `None` | the random generator of the shuffle and of the workers' seeds | reproducible runs |
# | `prefetch_factor` | 2 with workers | batches requested from each worker ahead of the model | loading time varies from batch to batch |
# | `persistent_workers` | `False` | keep workers alive between epochs | worker start-up is slow |
# | `pin_memory` | `False` | put batches in page-locked memory | training on a CUDA GPU |
# | `in_order` | `True` | hand batches over in the sampler's order (torch 2.6 and later) | `False`: a slow batch does not hold up the others |
#
# `prefetch_factor` and `persistent_workers` only mean something with workers: setting them
# with `num_workers=0` raises a `ValueError`.
#
# ## Batch assembly by hand
#
# Take $N = 100$ examples and `batch_size` $B = 16$. The batch sampler walks through the
# sampler's order of the 100 indices (shuffled or not) and cuts it every 16.
#
# * Full batches: $\lfloor 100 / 16 \rfloor = 6$, holding $6 \times 16 = 96$ examples.
# * What is left: $100 - 96 = 4$ examples, a seventh, short batch. So an epoch has
#   $\lceil 100 / 16 \rceil = 7$ batches: six of 16 and the last of 4.
# * With `drop_last=True` that short batch is dropped: **6 batches**, and **4 examples are not
#   seen** in that epoch. With `shuffle=True` those 4 are different examples each epoch, so
#   every example is still seen over many epochs; without shuffling it is the same 4 every time.
#
# The next cell asks a real DataLoader.

# %%
by_hand = {"batches": 7, "last batch": 4, "batches with drop_last": 6, "unseen with drop_last": 4}
kept = [b.tolist() for b in DataLoader(range(N_EXAMPLES), batch_size=BATCH_SIZE)]
dropped = [b.tolist() for b in DataLoader(range(N_EXAMPLES), batch_size=BATCH_SIZE, drop_last=True)]
unseen = sorted(set(range(N_EXAMPLES)) - {i for b in dropped for i in b})
counted = {"batches": len(kept), "last batch": len(kept[-1]),
           "batches with drop_last": len(dropped), "unseen with drop_last": len(unseen)}  # fmt: skip
assert counted == by_hand, counted
print(f"batch sizes: {[len(b) for b in kept]}")
print(f"with drop_last: {[len(b) for b in dropped]}; never seen this epoch: {unseen}")
reshuffled = DataLoader(range(N_EXAMPLES), batch_size=BATCH_SIZE, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(SEED))  # fmt: skip
for epoch in range(3):
    seen = {i for batch in reshuffled for i in batch.tolist()}
    print(f"shuffled, epoch {epoch}: unseen {sorted(set(range(N_EXAMPLES)) - seen)}")
print("Every count worked out by hand agrees with the DataLoader.")

# %% [markdown]
# ## Simulation: the pipeline, batch by batch
#
# A DataLoader is a pipeline. The **sampler** gives the epoch's order of indices; the **batch
# sampler** cuts it into lists of `batch_size`; the main process sends each list to a **worker**
# (or loads it itself when `num_workers=0`), which calls `dataset[i]` for every index and passes
# the items to **`collate_fn`**; the finished batch goes to the **model**.
#
# The simulation shows every batch of one epoch as a row of the indices in it, coloured by the
# worker that builds it. Things to try:
#
# * set `drop_last` and watch the hatched row of unseen examples appear (4 of them at the
#   defaults);
# * change `num_workers`: batch $k$ goes to worker $k \bmod$ `num_workers`, in turn, whatever
#   the workers' speed (with the default `in_order=True`; with `in_order=False`, torch 2.6 and
#   later, a batch goes to a worker with room in its queue, and batches are handed over as
#   they are finished, so a slow worker's batch comes later and the fast worker takes on more);
# * change `epoch` with `shuffle` on: every epoch draws a new order;
# * read the notes on the right: with workers, the first `num_workers × prefetch_factor`
#   batches are requested as soon as the epoch starts, and each later one while an earlier batch
#   is being handed to the model. Without workers nothing is prepared ahead.
#
# *Without a widget front end this cell shows the default state: N = 100, batch size 16,
# shuffled, 2 workers: seven rows of indices in alternating colours, the last row 4 long.*

# %%
from forge_course.sims.pipeline import pipeline_view, plan_epoch

pipeline_view(n=N_EXAMPLES, batch_size=BATCH_SIZE, shuffle=True, num_workers=NUM_WORKERS, seed=SEED)

# %% [markdown]
# *Alt text: a row of six boxes, Dataset → Sampler → Batch sampler → Workers → collate_fn →
# Model, above seven rows of index numbers, one per batch. Rows alternate between blue (worker 0)
# and orange (worker 1); each row ends with its size and when it was requested.*
#
# The simulation's engine, `plan_epoch`, is a plain function. The next cell runs a real
# DataLoader with two workers on a dataset whose item `i` is `(i, id of the worker that loaded
# it)`, and compares every batch and every worker with the engine's plan.

# %%
from forge_course.reference.datasets import TracedDataset

plan = plan_epoch(N_EXAMPLES, BATCH_SIZE, shuffle=True, num_workers=NUM_WORKERS, seed=SEED)
real_loader = DataLoader(TracedDataset(N_EXAMPLES), batch_size=BATCH_SIZE, shuffle=True,
                         num_workers=NUM_WORKERS, generator=torch.Generator().manual_seed(SEED))  # fmt: skip
real_batches, real_workers = [], []
for indices, workers in real_loader:
    real_batches.append(indices.tolist())
    real_workers.append(workers.unique().tolist())
assert real_batches == plan.batches, "the engine's batches differ from the DataLoader's"
assert real_workers == [[w] for w in plan.workers], "the engine's workers differ"
print(f"batch 0, from the engine:     {plan.batches[0]}")
print(f"batch 0, from the DataLoader: {real_batches[0]}")
print(
    f"workers per batch: {[w[0] for w in real_workers]}: the engine agrees on all {len(plan.batches)}"
)

# %% [markdown]
# ## Iterable datasets and workers
#
# An `IterableDataset` has no indices, so the main process cannot tell workers what to load.
# Instead, **each worker runs `__iter__` on its own copy of the dataset** and batches what comes
# out. Unless the dataset splits the stream between workers, each of them streams all of it.
# `ReviewsStream` reads the same CSV row by row; with `shard=True`, worker $k$ of $W$ keeps rows
# $k, k + W, k + 2W, \dots$ (it asks `get_worker_info()` who it is).
#
# Count by hand, with 2 workers and batches of 16:
#
# * **without sharding** each worker streams all 164 reviews: $164 = 10 \times 16 + 4$, so 11
#   batches per worker, 22 in all, and $2 \times 164 = 328$ examples: every review twice;
# * **with sharding** each worker streams $164 / 2 = 82$ reviews: $82 = 5 \times 16 + 2$, so
#   6 batches per worker, 12 in all, 164 examples, and **two** short batches of 2, one per
#   worker. With an iterable dataset every worker ends its own stream with its own short batch.

# %%
from forge_course.reference.datasets import ReviewsStream

for shard in (False, True):
    stream = ReviewsStream(reviews_csv_path(), vocabulary, shard=shard)
    loader = DataLoader(
        stream, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS, collate_fn=pad_collate
    )
    sizes = [len(batch["labels"]) for batch in loader]
    print(f"shard={shard!s:5}: {len(sizes)} batches, {sum(sizes)} examples, sizes {sizes}")
try:
    DataLoader(stream, shuffle=True)
except ValueError as err:
    print(f"DataLoader(stream, shuffle=True): {err}")
try:
    len(stream)
except TypeError as err:
    print(f"len(stream): {err}")

# %% [markdown]
# ## Workers, measured
#
# With `num_workers=0`, the main process loads each batch itself, then trains on it, then loads
# the next. With workers, separate processes load batches while the main process trains. That
# can only help if loading is slow enough to be worth overlapping, and workers are not free:
#
# * **start-up**: each epoch starts `num_workers` processes (unless `persistent_workers=True`),
#   and each gets a copy of the dataset;
# * **transfer**: every batch a worker builds is sent back to the main process through shared
#   memory, which costs time per batch.
#
# The next cell times one loop over the data, with no model at all, for two datasets:
# `TIMING_ROWS` rows already in memory (an item costs a tensor index), and the same kind of rows
# with `ITEM_DELAY` seconds of simulated work per item, a `time.sleep` standing for a disk read
# or a decode. Each loader runs `TIMING_EPOCHS` epochs; for 2 workers the loader keeps its
# workers (`persistent_workers=True`), so its first epoch shows the start-up and the later ones
# show the steady state. The bars split each epoch into the wait for the first batch and the
# rest.


# %%
from tqdm.auto import tqdm

from forge_course.reference.datasets import SlowDataset


def epoch_times(loader, epochs):
    """Per epoch: (seconds to the first batch, seconds for the whole epoch)."""
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        batches = iter(loader)
        next(batches)
        first = time.perf_counter() - start
        for _ in batches:
            pass
        times.append((first, time.perf_counter() - start))
    return times


gen = torch.Generator().manual_seed(SEED)
features = torch.randn(TIMING_ROWS, 32, generator=gen)
targets = torch.randint(0, 2, (TIMING_ROWS,), generator=gen)

datasets = {
    "in-memory rows": (SlowDataset(features, targets), 64),
    f"{ITEM_DELAY * 1e3:g} ms of work per item": (
        SlowDataset(features[:DELAYED_ROWS], targets[:DELAYED_ROWS], delay=ITEM_DELAY), 16),
}  # fmt: skip
timings = {}
runs = [(name, workers) for name in datasets for workers in (0, NUM_WORKERS)]
for name, workers in tqdm(runs, desc="timing loaders"):
    data, size = datasets[name]
    extra = {"persistent_workers": True} if workers else {}
    loader = DataLoader(data, batch_size=size, num_workers=workers, **extra)
    timings[name, workers] = epoch_times(loader, TIMING_EPOCHS)
    del loader  # shuts its workers down

fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
for ax, name in zip(axes, datasets):
    bars = {
        "0 workers": timings[name, 0][-1],
        f"{NUM_WORKERS} workers, 1st epoch": timings[name, NUM_WORKERS][0],
        f"{NUM_WORKERS} workers, later epoch": timings[name, NUM_WORKERS][-1],
    }
    names = list(bars)
    firsts = [1e3 * bars[k][0] for k in names]
    rests = [1e3 * (bars[k][1] - bars[k][0]) for k in names]
    ax.barh(names, firsts, color=PALETTE["vermillion"], label="wait for the first batch")
    ax.barh(names, rests, left=firsts, color=PALETTE["sky"], label="rest of the epoch")
    ax.invert_yaxis()
    ax.set(xlabel="milliseconds per epoch", ylabel="loader", title=name)
axes[0].legend(fontsize=8, loc="lower right")
fig.suptitle(f"One pass over the data, no model: {describe(device)}", fontsize=10)
fig.tight_layout()
plt.show()

for name in datasets:
    alone = timings[name, 0][-1][1]
    started = timings[name, NUM_WORKERS][0][1]
    steady = timings[name, NUM_WORKERS][-1][1]
    verdict = "faster" if steady < alone else "slower"
    print(
        f"{name}: 0 workers {alone * 1e3:.0f} ms; {NUM_WORKERS} workers {started * 1e3:.0f} ms "
        f"with start-up, {steady * 1e3:.0f} ms once running: {max(alone, steady) / min(alone, steady):.1f}× "
        f"{verdict} than the main process alone."
    )
work = DELAYED_ROWS * ITEM_DELAY
print(f"(the slow dataset sleeps {work * 1e3:.0f} ms per epoch in all: "
      f"{work / NUM_WORKERS * 1e3:.0f} ms per worker if {NUM_WORKERS} share it evenly)")  # fmt: skip

# %% [markdown]
# *Alt text: two horizontal bar charts, one per dataset, each with three bars (0 workers; 2
# workers, first epoch; 2 workers, later epoch), split into the wait for the first batch and the
# rest of the epoch. The printed lines give the measured times.*
#
# Read the printed ratios for your machine. On in-memory rows an item costs microseconds, so
# there is nothing for workers to take over, and what they add (starting processes, sending
# every batch back) can only cost time: if your line says "slower", that is why. With real work
# per item, the workers share it: their epoch time approaches the work divided by the number of
# workers, plus the start-up. `time.sleep` stands for waiting (on a disk, on a network), which
# leaves the cores free, so this case shows the effect even on a busy machine; decoding that
# keeps a core busy speeds up only as far as idle cores exist.
#
# The rule is not "use 4 to 8 workers" but: time an epoch of the loader alone, and compare it
# with an epoch of training. Workers help only when loading is a large part of the step.
#
# ## `persistent_workers`, `prefetch_factor` and `pin_memory`
#
# **`persistent_workers`.** Without it, every epoch starts new workers: each epoch waits for
# start-up before its first batch, as the "1st epoch" bar above did. The next cell measures that
# wait at the start of a *second* epoch, without it and (from the loader timed above) with it.
#
# **`prefetch_factor`.** With workers, the main process keeps `num_workers × prefetch_factor`
# batches requested ahead of the one the model is using, so a slow batch here and there is
# absorbed by the queue. The cell logs every request the DataLoader makes to its batch sampler
# and every batch it hands over, and counts the batches already requested while the model holds
# batch 0: it is exactly `num_workers × prefetch_factor`, as in the simulation. More prefetching
# means more batches held in memory at once.


# %%
class RequestLog:
    """Wraps a batch sampler and records when the DataLoader asks it for each batch."""

    def __init__(self, batch_sampler, log):
        self.batch_sampler, self.log = batch_sampler, log

    def __len__(self):
        return len(self.batch_sampler)

    def __iter__(self):
        for k, indices in enumerate(self.batch_sampler):
            self.log.append(("requested", k))
            yield indices


def requested_while_model_holds_batch_0(workers, prefetch_factor):
    log = []
    sampler = torch.utils.data.BatchSampler(range(40), batch_size=4, drop_last=False)
    loader = DataLoader(TracedDataset(40), batch_sampler=RequestLog(sampler, log),
                        num_workers=workers, prefetch_factor=prefetch_factor)  # fmt: skip
    for k, _ in enumerate(loader):
        log.append(("handed over", k))
    before = log[: log.index(("handed over", 0))]
    return sum(1 for kind, k in before if k > 0)  # batches requested beyond the one in hand


for factor in (1, 2, 4):
    ahead = requested_while_model_holds_batch_0(NUM_WORKERS, factor)
    planned = plan_epoch(40, 4, num_workers=NUM_WORKERS, prefetch_factor=factor).requested_with
    engine = sum(1 for k, r in enumerate(planned) if k > 0 and r in (None, 0))
    assert ahead == engine == NUM_WORKERS * factor
    print(f"prefetch_factor={factor}: {ahead} batches requested ahead of batch 0 "
          f"= {NUM_WORKERS} workers × {factor}")  # fmt: skip

data, size = datasets["in-memory rows"]
fresh = epoch_times(DataLoader(data, batch_size=size, num_workers=NUM_WORKERS), 2)[1][0]
kept = timings["in-memory rows", NUM_WORKERS][1][0]  # the persistent loader timed above
print(f"persistent_workers=False: the 2nd epoch waited {fresh * 1e3:6.1f} ms for its first batch")
print(f"persistent_workers=True:  the 2nd epoch waited {kept * 1e3:6.1f} ms for its first batch")

# %% [markdown]
# **`pin_memory`.** A copy from the CPU to a CUDA GPU goes through page-locked ("pinned") host
# memory; from ordinary memory the driver first copies into a pinned buffer. With
# `pin_memory=True` the DataLoader puts each batch in pinned memory in a background thread, so
# that `batch.to("cuda", non_blocking=True)` can start at once and overlap with computation. On
# a machine without a GPU it changes nothing, and PyTorch says so (on Apple MPS it is switched
# off, with a warning). The next cell measures the copy on a CUDA device, or prints what PyTorch
# says about yours instead of inventing a number.

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pinned_batch = next(
        iter(DataLoader(datasets["in-memory rows"][0], batch_size=1024, pin_memory=True))
    )
print(f"batch from pin_memory=True is pinned: {pinned_batch[0].is_pinned()}")
for warning in caught:
    print(f"PyTorch warns: {warning.message}")
if device.type == "cuda":
    pageable = torch.randn(16, 1024, 1024)  # 64 MiB
    pinned = pageable.pin_memory()
    for name, source in (("pageable", pageable), ("pinned", pinned)):
        source.to(device, non_blocking=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            source.to(device, non_blocking=True)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / 5
        print(f"{name:8} host memory → {device}: {seconds * 1e3:.1f} ms for 64 MiB")
else:
    print(f"No CUDA device here ({device.type}): there is no pinned copy to measure.")

# %% [markdown]
# ## Workers and memory: copy-on-read
#
# On Linux a worker starts by **fork**: it gets the main process's memory *shared*, page by
# page (4 KiB each), and a page is copied only when one of the two processes writes to it
# (copy-on-write). A dataset that workers only read should then cost no memory per worker.
# For one NumPy array or one tensor that holds: reading `array[i]` writes nothing to the
# array's pages. For a list of Python objects it does not. Every Python object carries a
# reference count, and `path = self.paths[i]` adds 1 to it: a *write*, to the page the object
# lives on. So each object a worker reads costs it a private copy of that object's page. Over
# an epoch a worker touches objects all over the list and ends up copying nearly all of them:
# memory that grows as it reads, once per worker. This is why a DataLoader over a long list
# of file names or records can look as if it leaks: nothing leaks, every worker copies.
#
# **Hand calculation.** `COW_PATHS` = 200,000 paths like `images/000123.jpg` (17 characters).
# On Python 3.10 and 3.11 `sys.getsizeof` says 66 bytes each (49 bytes of header and 17 of
# text), and Python's allocator keeps small objects in slots rounded up to a multiple of 16
# bytes, so each takes 80: $200{,}000 \times 80 = 16{,}000{,}000$ bytes $= 15.3$ MiB, about 51
# strings per page. (Python 3.12 dropped a pointer from the header: 41 + 17 = 58 bytes, slots
# of 64, 12.2 MiB, 64 strings per page; the next cell prints the slot of the Python you run.)
# With `shuffle=True` each of 2 workers reads a random half of the strings, and a page is
# spared only if a worker reads none of its 51 (or 64): a chance of $2^{-51}$ (or $2^{-64}$).
# So **each** worker should copy about 15.3 MiB (12.2 from Python 3.12). The same paths in one
# NumPy array of bytes (`dtype='S17'`, 17 bytes each, 3.4 MB in one block) are a single object
# whose pages nobody writes: about 0.
#
# The measurement, from `forge_course/reference/copy_on_read.py`: a dataset whose item is the
# length of a path, and a loader whose workers report their **private memory** (the pages no
# other process maps, `Private_Clean + Private_Dirty` in `/proc/<pid>/smaps_rollup`; tools
# call it USS) as they start and after each batch:
#
# ```python
# class PathLengths(Dataset):
#     def __getitem__(self, index):
#         return len(self.paths[index])  # reading paths[index] adds 1 to its reference count
#
# DataLoader(PathLengths(paths), batch_size=4096, shuffle=True, num_workers=2,
#            worker_init_fn=_note_start,      # in the worker: private_mib() as it starts
#            collate_fn=_report_growth,       # in the worker: (its id, private_mib() - start)
#            multiprocessing_context="fork")  # the effect belongs to fork: ask for it by name
# ```
#
# The loader asks for fork by name because a notebook may run with spawn as its default
# (macOS, Windows, and this course's tests). And the cell runs it all in a fresh Python
# process, which builds the paths and forks the workers: a forked worker starts as large as
# the process it is forked from, and this kernel is a few hundred MB already. Only Linux has
# both fork and `/proc`; elsewhere the cell explains instead of measuring.

# %%
from forge_course.reference import copy_on_read

if copy_on_read.measurable():
    measured = copy_on_read.compare_in_fresh_process(COW_PATHS, NUM_WORKERS, seed=SEED)
    slot = measured["slot"]
    by_hand = COW_PATHS * slot / 2**20
    print(f"by hand: each worker copies {COW_PATHS:,} × {slot} B = {by_hand:.1f} MiB of str")
    for name in ("list of str", "one NumPy array"):
        grown = ", ".join(f"worker {w} {mib:+.1f} MiB" for w, mib in sorted(measured[name].items()))
        print(f"{name:15}: {grown}")
    assert all(0.85 * by_hand < mib < 1.3 * by_hand for mib in measured["list of str"].values())
    assert all(abs(mib) < 0.2 * by_hand for mib in measured["one NumPy array"].values())
else:
    print(
        "Not measured here: this needs workers started by fork and Linux's /proc.\n"
        "On macOS and Windows workers start by spawn: each one receives the dataset pickled,\n"
        "so a list of str is rebuilt, object by object, in every worker as it starts (its\n"
        "whole size at once, instead of growing towards it). A NumPy array is copied whole\n"
        "into each worker too; a tensor travels through shared memory, stored once."
    )

# %% [markdown]
# Both workers copied about the hand's figure, 15.3 MiB (12.2 from Python 3.12), a little
# more: the worker's own bookkeeping while it builds batches. With the array they barely
# moved, a MiB or so either way: the worker's own allocations coming and going. Scale it up:
# ten million such paths held as `str` are about 800 MB (640 MB from Python 3.12), and 8
# workers copy nearly all of it each, on top of the main process's copy, during the first
# epoch.
#
# **The fix** is to keep what workers read out of Python objects: store the data in a few
# NumPy arrays or tensors (fixed-width bytes as above, or all the strings' bytes in one
# `uint8` array plus an array of where each one starts), and make a Python object only for
# the item you return. With spawn (macOS, Windows) the workers get the dataset pickled
# instead, so a list and a NumPy array are both copied whole into every worker as it starts,
# while a tensor is sent through shared memory and stored once for all of them.
#
# *Try it:* predict each worker's growth with `shuffle=False`, then run
# `copy_on_read.compare_in_fresh_process(COW_PATHS, shuffle=False)`. (Each worker then reads
# every other batch of 4,096 consecutive paths: how many of the pages does it touch?)

# %% [markdown]
# ## Randomness in workers
#
# Random augmentation (crop a window, drop a word, flip an image) happens in `__getitem__`, so
# with workers it happens in the workers. A worker starts as a copy of the main process,
# random generators included. If nothing reseeds those copies, every worker draws the same
# numbers, and batches built by different workers get the same "random" augmentation.
#
# This was a famous bug for NumPy's global generator (`np.random.rand()` and friends). Since
# PyTorch 1.9 the DataLoader reseeds, in every worker, torch's generator and Python's `random`
# from `base_seed + worker_id`, and NumPy's global generator from a mix of the two numbers
# (`_generate_state(base_seed, worker_id)`, a hash in the style of NumPy's `SeedSequence`, so
# that neighbouring workers do not get neighbouring NumPy seeds). `base_seed` is drawn from the
# loader's `generator` each time the loader starts its workers: every epoch, or only once with
# `persistent_workers=True`. But the loader cannot reseed a generator **object** your dataset
# owns, such as the `np.random.default_rng(seed)` that NumPy recommends for new code, or a
# `random.Random(seed)`.
#
# `RandomDraws` stands in for a dataset with random augmentation: each item reports the two
# numbers its augmentation would draw, one from NumPy and one from Python. With
# `source="global"` it draws from the module-level generators; with `source="own"` from
# generators it creates in `__init__`. Two real workers load 8 items in batches of 2, so each
# worker builds 2 batches and makes 4 draws of each kind.

# %%
from forge_course.reference.datasets import RandomDraws


def draws_by_worker(dataset, seed=SEED, worker_init_fn=None):
    """Load ``dataset`` with two workers; each worker's NumPy and Python draws, in order."""
    loader = DataLoader(dataset, batch_size=2, num_workers=NUM_WORKERS,
                        worker_init_fn=worker_init_fn,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    draws = {}
    for batch in loader:
        for w, a, b in zip(
            batch["worker"].tolist(), batch["numpy"].tolist(), batch["python"].tolist()
        ):
            draws.setdefault(w, {"numpy": [], "python": []})
            draws[w]["numpy"].append(round(a, 4))
            draws[w]["python"].append(round(b, 4))
    return draws


for source in ("global", "own"):
    draws = draws_by_worker(RandomDraws(8, seed=SEED, source=source))
    print(f"source={source!r}:")
    for worker, drawn in draws.items():
        print(f"  worker {worker}: NumPy {drawn['numpy']}  Python {drawn['python']}")
    same = draws[0] == draws[1]
    print(f"  → the two workers drew {'the SAME numbers' if same else 'different numbers'}")

# %% [markdown]
# Check the printout: with the global generators the two workers differ, because the
# DataLoader reseeded them; with the dataset's own generators both workers drew exactly the
# same numbers. Every batch that worker 1 builds gets the same augmentation as the batch
# before it from worker 0, and nothing warns you.
#
# ## Exercise 2 · `ch02_worker_init`: one random stream per worker
#
# `RandomDraws` keeps its generators in two attributes: `np_rng` (a NumPy `Generator`) and
# `py_rng` (a `random.Random`). Write `worker_init_fn(worker_id)` that, inside a worker,
# replaces the worker's copies of both with new generators seeded from the worker's own seed,
# so that:
#
# 1. different workers draw different numbers;
# 2. a DataLoader whose `generator` is seeded the same way draws the same numbers again;
# 3. another generator seed, or the next epoch, draws new numbers in every worker.
#
# Inside a worker, `get_worker_info()` returns an object with `.id`, `.num_workers`, `.seed`
# (this worker's seed, `base_seed + worker_id`: different for every worker, set by the loader's
# `generator`, and new each time workers start; `torch.initial_seed()` returns the same number)
# and `.dataset` (this worker's copy of the dataset). The check runs your function in 2 real
# worker processes (3 in the hidden tests), three loaders per case.


# %% nbgrader={"grade_id": "ch02_worker_init", "solution": true}
def worker_init_fn(worker_id):
    ### BEGIN SOLUTION
    info = get_worker_info()
    info.dataset.np_rng = np.random.default_rng(info.seed)
    info.dataset.py_rng = random.Random(info.seed)
    ### END SOLUTION


# %% nbgrader={"grade_id": "ch02_worker_init_tests", "grade": true, "points": 3}
# Visible tests: 2 real workers; the draws differ between workers, repeat with the same
# generator seed, and change with another seed. Hidden tests add the next epoch, 3 workers and
# persistent workers.
from forge_course.grading import ch02

ch02.check_worker_init(worker_init_fn)
print("worker_init_fn: distinct streams per worker, reproducible under the loader's seed.")
### BEGIN HIDDEN TESTS
ch02.check_worker_init(worker_init_fn, thorough=True)
### END HIDDEN TESTS

# %% [markdown]
# The cell below uses the course's `seed_worker`, which does what the exercise asks, and checks
# the three properties on the same 8 items. The figure plots each worker's NumPy draws: without
# a `worker_init_fn` the two workers' points lie on top of each other; with it they differ, and
# a second run with the same generator seed (hollow squares) lands exactly on the first.

# %%
from forge_course.reference.datasets import seed_worker

broken = draws_by_worker(RandomDraws(8, seed=SEED))
fixed = draws_by_worker(RandomDraws(8, seed=SEED), worker_init_fn=seed_worker)
again = draws_by_worker(RandomDraws(8, seed=SEED), worker_init_fn=seed_worker)
other = draws_by_worker(RandomDraws(8, seed=SEED), seed=SEED + 1, worker_init_fn=seed_worker)
assert fixed[0] != fixed[1], "the workers should differ"
assert fixed == again, "the same generator seed should repeat the draws"
assert fixed != other, "another generator seed should change them"
print("seed_worker: workers differ; same seed → same draws; another seed → other draws.")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
panels = [("own generators, no worker_init_fn", broken, None),
          ("worker_init_fn=seed_worker", fixed, again)]  # fmt: skip
for ax, (title, first, second) in zip(axes, panels):
    for worker, marker, colour in ((0, "o", PALETTE["blue"]), (1, "x", PALETTE["vermillion"])):
        draws = first[worker]["numpy"]
        ax.plot(range(1, len(draws) + 1), draws, marker, color=colour, markersize=9,
                label=f"worker {worker}")  # fmt: skip
        if second is not None:
            ax.plot(range(1, len(draws) + 1), second[worker]["numpy"], "s", mfc="none",
                    color=colour, markersize=14, label=f"worker {worker}, 2nd run")  # fmt: skip
    ax.set(title=title, xlabel="draw number within the worker", xticks=range(1, 5), ylim=(0, 1))
axes[0].set_ylabel("NumPy draw")
fig.legend(*axes[1].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8)
fig.tight_layout(rect=(0, 0.1, 1, 1))
plt.show()

# %% [markdown]
# *Alt text: two scatter plots of the NumPy draws of worker 0 (blue circles) and worker 1
# (vermillion crosses), four draws each. Left, with the dataset's own generators and no
# worker_init_fn, each cross sits exactly on a circle. Right, with seed_worker, the two workers'
# points differ, and hollow squares from a second run with the same seed surround every point.*
#
# Three more things to know about seeds in workers:
#
# * Without a `generator`, the DataLoader draws `base_seed` from torch's global generator, so
#   `torch.manual_seed(...)` before building the iterator also makes the workers reproducible.
# * The popular fix `np.random.seed(42 + worker_id)` is now worse than nothing for the global
#   generator: it replaces a seed that followed your `generator` with a fixed one that ignores
#   it, and without persistent workers every epoch repeats the first epoch's draws.
# * `np.random.seed` only takes seeds below $2^{32}$, and `info.seed` almost always is larger; use
#   `np.random.default_rng(info.seed)`, which takes any size.
#
# ### Seeds when workers persist
#
# The summary below keeps workers alive between epochs (`persistent_workers=True`). Then the
# workers start once, so `base_seed` is drawn once and `worker_init_fn` runs once per worker
# for the loader's whole life: `get_worker_info().seed` stays the same in every epoch, and the
# generators seeded in `worker_init_fn` simply go on drawing. The next cell loads `RandomDraws`
# with `seed_worker` for two epochs, both ways. Each item also reports the seed of the worker
# that drew it, so the main process can seed its own generator the same way and check where
# each epoch's draws come from.


# %%
def two_epochs(persistent):
    """For each of two epochs: worker -> (the seed it reports, its NumPy draws in order)."""
    loader = DataLoader(RandomDraws(8, seed=SEED), batch_size=2, num_workers=NUM_WORKERS,
                        worker_init_fn=seed_worker, persistent_workers=persistent,
                        generator=torch.Generator().manual_seed(SEED))  # fmt: skip
    epochs = []
    for _ in range(2):
        by_worker = {}
        for batch in loader:
            for w, seed, draw in zip(batch["worker"].tolist(), batch["seed"].tolist(),
                                     batch["numpy"].tolist()):  # fmt: skip
                by_worker.setdefault(w, (seed, []))[1].append(draw)
        epochs.append(by_worker)
    del loader  # shuts persistent workers down
    return epochs


for persistent in (False, True):
    first, second = two_epochs(persistent)
    for w in sorted(first):
        (seed_1, draws_1), (seed_2, draws_2) = first[w], second[w]
        stream = np.random.default_rng(seed_1).random(len(draws_1) + len(draws_2)).tolist()
        assert draws_1 == stream[: len(draws_1)]  # seed_worker seeded from the reported seed
        if persistent:  # one seed; epoch 2 goes on with the stream worker_init_fn started
            assert seed_2 == seed_1 and draws_2 == stream[len(draws_1) :]
            where = f"draws {len(draws_1) + 1}-{len(stream)} of the stream seeded in epoch 1"
        else:  # new workers, a new seed, worker_init_fn run again
            assert seed_2 != seed_1
            assert draws_2 == np.random.default_rng(seed_2).random(len(draws_2)).tolist()
            where = "a fresh stream from the new seed"
        print(f"persistent_workers={persistent!s:5} worker {w}: seed ...{seed_1 % 10**6:06d} in "
              f"epoch 1, ...{seed_2 % 10**6:06d} in epoch 2; epoch 2 drew {where}")  # fmt: skip

# %% [markdown]
# `seed_worker` stays right with persistent workers: every epoch draws new numbers, and the
# loader's seed repeats them all. Two things do change. Anything a `worker_init_fn` was meant
# to do at the start of every epoch happens only once. And what a worker draws in epoch $k$
# depends on every epoch before it in that worker: a run resumed at epoch $k$ starts new
# workers from a new seed, and draws other numbers than the run that never stopped.

# %% [markdown]
# ## Check your understanding
#
# **Question 1 (`ch02_q_unseen`).** A dataset of 100 examples is loaded with `batch_size=16`
# and `drop_last=True`. How many examples are **not** seen in one epoch? Set `unseen_examples`
# to a number.
#
# **Question 2 (`ch02_q_worker_batches`).** The same dataset is loaded with `batch_size=16`,
# `drop_last=False` and `num_workers=2`. How many of the epoch's batches does **worker 0**
# build? Set `worker0_batches` to a number.
#
# **Question 3 (`ch02_q_workers`).** What does setting `num_workers=4` speed up? Set
# `workers_answer` to one letter.
#
# * **a**: the forward and backward passes, because each worker trains a copy of the model.
# * **b**: the work done in `__getitem__` and `collate_fn` (reading, decoding, augmenting),
#   which then runs in other processes while the main process trains; it helps only when that
#   work is a large part of each step.
# * **c**: every DataLoader, because more processes always move more data.
# * **d**: the copy of each batch to the GPU.

# %% nbgrader={"grade_id": "ch02_questions", "solution": true}
unseen_examples = None
worker0_batches = None
workers_answer = None
### BEGIN SOLUTION
unseen_examples = 4
worker0_batches = 4
workers_answer = "b"
### END SOLUTION

# %% nbgrader={"grade_id": "ch02_q_unseen", "grade": true, "points": 1}
from forge_course.grading.ch02 import check_number

check_number(unseen_examples, "ch02_q_unseen")
### BEGIN HIDDEN TESTS
check_number(
    unseen_examples,
    "ch02_q_unseen",
    expected=4,
    hints={
        96: "96 examples are seen (6 batches of 16); the question asks for the ones left out.",
        6: "6 is the number of batches; count the examples of the dropped batch instead.",
        12: "the dropped batch holds what is left after 6 × 16 = 96, that is 100 − 96.",
        0: "drop_last drops the short last batch, and its examples with it.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch02_q_worker_batches", "grade": true, "points": 1}
from forge_course.grading.ch02 import check_number

check_number(worker0_batches, "ch02_q_worker_batches")
### BEGIN HIDDEN TESTS
check_number(
    worker0_batches,
    "ch02_q_worker_batches",
    expected=4,
    hints={
        3: "without drop_last there are 7 batches (0 to 6), handed out in turn: worker 0 gets "
        "the even ones, and there are four of those.",
        3.5: "batches are not split between workers: each batch is built by one worker.",
        7: "with 2 workers, each builds every other batch.",
        50: "count batches, not examples.",
    },
)
### END HIDDEN TESTS

# %% nbgrader={"grade_id": "ch02_q_workers", "grade": true, "points": 1}
from forge_course.grading import check_choice

check_choice(workers_answer, "ch02_q_workers", choices="abcd")
### BEGIN HIDDEN TESTS
check_choice(
    workers_answer,
    "ch02_q_workers",
    choices="abcd",
    correct="b",
    why_not={
        "a": "workers only load data; the model runs in the main process (that is data "
        "parallelism, chapter 11).",
        "c": "every worker costs start-up time and a transfer per batch; with no slow loading "
        "to overlap (in-memory data) that is pure cost. Time your own loader.",
        "d": "that is pin_memory (and non_blocking copies); workers build batches on the CPU.",
    },
)
### END HIDDEN TESTS

# %% [markdown]
# ## Summary: the lines this chapter taught
#
# ```python
# class ReviewsDataset(Dataset):
#     def __init__(self, path, vocabulary):
#         with open(path, newline="", encoding="utf-8") as f:   # csv module: quotes, commas, line
#             rows = list(csv.DictReader(f))                     # breaks; closed again: nothing kept
#         ...                              # many items? a few NumPy arrays or tensors, not a list of
#                                          # objects: forked workers copy every object they read
#     def __len__(self): ...               # without it: no sampler, no len(loader)
#     def __getitem__(self, i): ...        # IndexError past the end, or `for x in dataset` never ends
#
# loader = DataLoader(
#     dataset,
#     batch_size=16,                       # N=100: 7 batches, the last of 4
#     shuffle=True,                        # without it: the same order, the same tail, every epoch
#     drop_last=False,                     # True: 6 batches, 4 examples unseen per epoch
#     collate_fn=pad_collate,              # without it: ragged items cannot be stacked
#     num_workers=2,                       # helps only if loading is slow: measure; batch k → worker k mod 2
#     persistent_workers=True,             # without it: every epoch waits for new workers; with it: one seed per worker, for good
#     prefetch_factor=2,                   # num_workers × prefetch_factor batches requested ahead
#     pin_memory=device.type == "cuda",    # only matters for copies to a CUDA GPU
#     worker_init_fn=seed_worker,          # without it: workers repeat the dataset's own generators
#     generator=torch.Generator().manual_seed(SEED),  # reproducible order and worker seeds
# )
# ```
#
# * A map-style dataset answers `len` and `dataset[i]`; the DataLoader's sampler picks the
#   order. An iterable dataset streams, and must split its stream between workers itself.
# * Batches: $\lceil N/B \rceil$ of them, the last of $N - B(\lceil N/B \rceil - 1)$ (a full $B$
#   when $B$ divides $N$, not $N \bmod B = 0$); `drop_last` leaves a short last batch out of
#   the epoch.
# * Workers take over `__getitem__` and `collate_fn`; they cost start-up and transfer time, so
#   in-memory data rarely needs them. Measure an epoch of the loader alone before choosing.
# * A forked worker shares the dataset's pages until it writes to one, and reading a Python
#   object writes its reference count: over an epoch each worker copies nearly every object
#   of a list (15.3 MiB per worker for 200,000 paths as `str`, 12.2 MiB from Python 3.12),
#   and none of one NumPy array.
# * Each worker copies the dataset, generators included: reseed generators the dataset owns in a
#   `worker_init_fn`, from `get_worker_info().seed`. It runs each time workers start: every
#   epoch, or once for the loader's life with `persistent_workers=True`.
#
# Next, chapter 03 opens the sampler and the collate function: weighted and distributed
# samplers, padding with attention masks, and batches bucketed by length.
