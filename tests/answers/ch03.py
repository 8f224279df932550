"""Answers that chapter 03's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

INVERSE_FREQUENCY_PROPORTIONAL = """
def inverse_frequency_weights(labels):
    labels = torch.as_tensor(labels)
    classes, counts = torch.unique(labels, return_counts=True)
    share = {int(c): int(k) / len(labels) for c, k in zip(classes, counts)}
    return torch.tensor([share[int(v)] for v in labels], dtype=torch.float64)
"""

INVERSE_FREQUENCY_PER_CLASS = """
def inverse_frequency_weights(labels):
    _, counts = torch.unique(torch.as_tensor(labels), return_counts=True)
    return 1.0 / counts.double()
"""

INVERSE_FREQUENCY_FLOAT32 = """
import numpy as np

def inverse_frequency_weights(labels):
    labels = np.asarray(labels)
    values, counts = np.unique(labels, return_counts=True)
    lookup = dict(zip(values.tolist(), counts.tolist()))
    return torch.tensor([1 / lookup[v] for v in labels.tolist()])
"""

INVERSE_FREQUENCY_UNIQUE = """
def inverse_frequency_weights(labels):
    labels = torch.as_tensor(labels)
    _, position, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return counts.double().reciprocal()[position]
"""

SHARD_NO_PADDING = """
def shard_indices(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    if shuffle:
        order = torch.randperm(dataset_size, generator=torch.Generator().manual_seed(seed + epoch))
        order = order.tolist()
    else:
        order = list(range(dataset_size))
    if drop_last:
        order = order[: dataset_size // world_size * world_size]
    return order[rank::world_size]
"""

SHARD_IGNORES_EPOCH = """
def shard_indices(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    order = list(range(dataset_size))
    if shuffle:
        order = torch.randperm(dataset_size, generator=torch.Generator().manual_seed(seed)).tolist()
    per_rank = dataset_size // world_size if drop_last else math.ceil(dataset_size / world_size)
    padded = [order[i % dataset_size] for i in range(per_rank * world_size)]
    return padded[rank::world_size]
"""

SHARD_BLOCKS = """
def shard_indices(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    order = list(range(dataset_size))
    if shuffle:
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(dataset_size, generator=g).tolist()
    per_rank = dataset_size // world_size if drop_last else math.ceil(dataset_size / world_size)
    padded = [order[i % dataset_size] for i in range(per_rank * world_size)]
    return padded[rank * per_rank : (rank + 1) * per_rank]
"""

SHARD_WHILE_LOOP = """
def shard_indices(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.arange(dataset_size)
    if shuffle:
        order = torch.randperm(dataset_size, generator=generator)
    if drop_last:
        total = dataset_size - dataset_size % world_size
        order = order[:total]
    else:
        total = -(-dataset_size // world_size) * world_size
        while len(order) < total:
            order = torch.cat([order, order[: total - len(order)]])
    return order[rank:total:world_size]
"""

COLLATE_FLOAT_MASK = """
def pad_collate(batch, pad_value=0):
    sequences, labels = zip(*batch)
    longest = max(len(s) for s in sequences)
    ids, masks = [], []
    for s in sequences:
        pad = longest - len(s)
        ids.append(torch.cat([s, torch.full((pad,), pad_value, dtype=s.dtype)]))
        masks.append(torch.cat([torch.ones(len(s)), torch.zeros(pad)]))
    return {"input_ids": torch.stack(ids), "attention_mask": torch.stack(masks),
            "labels": torch.tensor(labels)}
"""

COLLATE_MASK_FROM_IDS = """
from torch.nn.utils.rnn import pad_sequence

def pad_collate(batch, pad_value=0):
    input_ids = pad_sequence([s for s, _ in batch], batch_first=True, padding_value=pad_value)
    return {"input_ids": input_ids, "attention_mask": (input_ids != pad_value).long(),
            "labels": torch.tensor([y for _, y in batch])}
"""

COLLATE_IGNORES_PAD_VALUE = """
def pad_collate(batch, pad_value=0):
    longest = max(len(s) for s, _ in batch)
    input_ids = torch.zeros((len(batch), longest), dtype=batch[0][0].dtype)
    attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
    for row, (s, _) in enumerate(batch):
        input_ids[row, : len(s)] = s
        attention_mask[row, : len(s)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "labels": torch.tensor([y for _, y in batch])}
"""

COLLATE_PAD_SEQUENCE = """
from torch.nn.utils.rnn import pad_sequence

def pad_collate(batch, pad_value=0):
    sequences = [s for s, _ in batch]
    lengths = torch.tensor([len(s) for s in sequences])
    input_ids = pad_sequence(sequences, batch_first=True, padding_value=pad_value)
    positions = torch.arange(input_ids.shape[1])
    attention_mask = (positions[None, :] < lengths[:, None]).long()
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "labels": torch.tensor([y for _, y in batch])}
"""

# Correct, but it warns twice while it runs: torch's UserWarning (a tensor copied with
# torch.tensor) and a logged warning, which Python's logging writes to stderr. Neither may cost
# a point: nbgrader gives 0 to a test cell that writes to stderr.
COLLATE_WARNS = """
import logging

def pad_collate(batch, pad_value=0):
    sequences = [s for s, _ in batch]
    if any(len(s) == 0 for s in sequences):
        logging.warning("pad_collate: an empty sequence in the batch")
    width = max((len(s) for s in sequences), default=0)
    input_ids = torch.full((len(batch), width), pad_value, dtype=sequences[0].dtype)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, s in enumerate(sequences):
        input_ids[row, : len(s)] = torch.tensor(s)
        attention_mask[row, : len(s)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "labels": torch.tensor([y for _, y in batch])}
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch03_inverse_frequency": [
        (
            INVERSE_FREQUENCY_PROPORTIONAL,
            {"ch03_inverse_frequency_tests": "these weights grow with the class count"},
        ),
        (
            INVERSE_FREQUENCY_PER_CLASS,
            {"ch03_inverse_frequency_tests": "one weight per *class* came back"},
        ),
        (
            INVERSE_FREQUENCY_FLOAT32,
            {"ch03_inverse_frequency_tests": "dtype=torch.float64"},
        ),
    ],
    "ch03_shard_indices": [
        (SHARD_NO_PADDING, {"ch03_shard_indices_tests": "there is no padding"}),
        (SHARD_IGNORES_EPOCH, {"ch03_shard_indices_tests": "the order ignores `epoch`"}),
        (SHARD_BLOCKS, {"ch03_shard_indices_tests": "each rank took a contiguous block"}),
    ],
    "ch03_pad_collate": [
        (
            COLLATE_FLOAT_MASK,
            {"ch03_pad_collate_tests": "float32 unless you pass dtype=torch.long"},
        ),
        (COLLATE_MASK_FROM_IDS, {"ch03_pad_collate_tests": "input_ids != pad_value"}),
        (COLLATE_IGNORES_PAD_VALUE, {"ch03_pad_collate_tests": "instead of pad_value"}),
    ],
    "ch03_questions": [
        (
            "duplicates = 12\ncat_vs_dog = 0.5\nset_epoch_answer = 'c'\n"
            "cats_without_replacement = 500\n",
            {
                "ch03_q_duplicates": "12 is the number of predictions",
                "ch03_q_cat_odds": "*some* cat",
                "ch03_q_set_epoch": "they still agree",
                "ch03_q_replacement": "*with* replacement",
            },
        ),
        (
            "duplicates = 0\ncat_vs_dog = 1 / 9\nset_epoch_answer = 'a'\n"
            "cats_without_replacement = 100\n",
            {
                "ch03_q_duplicates": "pads every rank",
                "ch03_q_cat_odds": "a dog compared with a cat",
                "ch03_q_set_epoch": "nothing checks for the call",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch03_inverse_frequency": INVERSE_FREQUENCY_UNIQUE,
    "ch03_shard_indices": SHARD_WHILE_LOOP,
    "ch03_pad_collate": COLLATE_WARNS,
    "ch03_questions": (
        "duplicates = 2.0\ncat_vs_dog = 9.0\nset_epoch_answer = ' B '\n"
        "cats_without_replacement = 100.0\n"
    ),
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch03_inverse_frequency": (
        "from forge_course.reference.sampling import inverse_frequency_weights\n"
    ),
    "ch03_shard_indices": (
        "import forge_course.reference.sampling as sampling\n\n"
        "def shard_indices(*args, **kwargs):\n    return sampling.shard_indices(*args, **kwargs)\n"
    ),
    "ch03_pad_collate": (
        "from forge_course.reference import sampling\n\n"
        "def pad_collate(batch, pad_value=0):\n"
        "    return sampling.pad_collate(batch, pad_value=pad_value)\n"
    ),
}
