"""Answers that chapter 00's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

ARITHMETIC_NAIVE_TAIL = """
import math

def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    if drop_last:
        iters = dataset_size // batch_size
        last = batch_size if iters else 0
        seen = iters * batch_size
    else:
        iters = math.ceil(dataset_size / batch_size)
        last = dataset_size - (iters - 1) * batch_size
        seen = dataset_size
    updates = iters // accum_steps
    return {"iters_per_epoch": iters, "last_batch_size": last, "micro_steps": iters * epochs,
            "updates_per_epoch": updates, "total_updates": updates * epochs,
            "effective_batch_size": batch_size * accum_steps, "examples_seen": seen * epochs}
"""

ARITHMETIC_IGNORES_DROP_LAST = """
import math

def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    iters = math.ceil(dataset_size / batch_size)
    updates = math.ceil(iters / accum_steps)
    return {
        "iters_per_epoch": iters,
        "last_batch_size": dataset_size - (iters - 1) * batch_size,
        "micro_steps": iters * epochs,
        "updates_per_epoch": updates,
        "total_updates": updates * epochs,
        "effective_batch_size": batch_size * accum_steps,
        "examples_seen": dataset_size * epochs,
    }
"""

ARITHMETIC_REMAINDER_LAST = """
import math

def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    iters = dataset_size // batch_size if drop_last else math.ceil(dataset_size / batch_size)
    if drop_last:
        last = batch_size if iters else 0
    else:
        last = dataset_size % batch_size
    updates = math.ceil(iters / accum_steps)
    return {"iters_per_epoch": iters, "last_batch_size": last, "micro_steps": iters * epochs,
            "updates_per_epoch": updates, "total_updates": updates * epochs,
            "effective_batch_size": batch_size * accum_steps,
            "examples_seen": (iters * batch_size if drop_last else dataset_size) * epochs}
"""

ARITHMETIC_DIVMOD = """
def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    full, rest = divmod(dataset_size, batch_size)
    keep_rest = rest > 0 and not drop_last
    iters = full + keep_rest
    if iters == 0:
        last = 0
    elif keep_rest:
        last = rest
    else:
        last = batch_size
    groups, short = divmod(iters, accum_steps)
    per_epoch = groups + (short > 0)
    examples = full * batch_size + (rest if keep_rest else 0)
    return dict(
        iters_per_epoch=iters,
        last_batch_size=last,
        micro_steps=epochs * iters,
        updates_per_epoch=per_epoch,
        total_updates=epochs * per_epoch,
        effective_batch_size=accum_steps * batch_size,
        examples_seen=epochs * examples,
    )
"""

ARITHMETIC_FLOOR = """
def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    iters = dataset_size // batch_size
    updates = dataset_size // (batch_size * accum_steps)
    return {"iters_per_epoch": iters, "last_batch_size": batch_size, "micro_steps": iters * epochs,
            "updates_per_epoch": updates, "total_updates": updates * epochs,
            "effective_batch_size": batch_size * accum_steps,
            "examples_seen": iters * batch_size * epochs}
"""

ARITHMETIC_FLOOR_UPDATES = """
import math

def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    if drop_last:
        iters, last = dataset_size // batch_size, batch_size
        seen = iters * batch_size
    else:
        iters = math.ceil(dataset_size / batch_size)
        last, seen = dataset_size - (iters - 1) * batch_size, dataset_size
    updates = dataset_size // (batch_size * accum_steps)
    return {"iters_per_epoch": iters, "last_batch_size": last if iters else 0,
            "micro_steps": iters * epochs, "updates_per_epoch": updates,
            "total_updates": updates * epochs, "effective_batch_size": batch_size * accum_steps,
            "examples_seen": seen * epochs}
"""

ARITHMETIC_PLUS_ONE = """
def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    if drop_last:
        iters = dataset_size // batch_size
        last = batch_size if iters else 0
    else:
        iters = int(dataset_size / batch_size) + 1
        last = dataset_size % batch_size
    updates = -(-iters // accum_steps)
    seen = iters * batch_size if drop_last else dataset_size
    return {"iters_per_epoch": iters, "last_batch_size": last, "micro_steps": iters * epochs,
            "updates_per_epoch": updates, "total_updates": updates * epochs,
            "effective_batch_size": batch_size * accum_steps, "examples_seen": seen * epochs}
"""

ARITHMETIC_ROUND = """
import math

def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    if drop_last:
        iters = dataset_size // batch_size
        last, seen = (batch_size if iters else 0), iters * batch_size
    else:
        iters = round(dataset_size / batch_size)
        last, seen = dataset_size - (iters - 1) * batch_size, dataset_size
    updates = math.ceil(iters / accum_steps)
    return {"iters_per_epoch": iters, "last_batch_size": last, "micro_steps": iters * epochs,
            "updates_per_epoch": updates, "total_updates": updates * epochs,
            "effective_batch_size": batch_size * accum_steps, "examples_seen": seen * epochs}
"""

# Right on every visible case: only the hidden N < B with drop_last shows it.
ARITHMETIC_LAST_FULL_WHEN_NONE = """
import math

def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    if drop_last:
        iters, last = dataset_size // batch_size, batch_size
        seen = iters * batch_size
    else:
        iters = math.ceil(dataset_size / batch_size)
        last, seen = dataset_size - (iters - 1) * batch_size, dataset_size
    updates = math.ceil(iters / accum_steps)
    return {"iters_per_epoch": iters, "last_batch_size": last, "micro_steps": iters * epochs,
            "updates_per_epoch": updates, "total_updates": updates * epochs,
            "effective_batch_size": batch_size * accum_steps, "examples_seen": seen * epochs}
"""

ARITHMETIC_SEEN_FULL_BATCHES = """
import math

def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    if drop_last:
        iters = dataset_size // batch_size
        last = batch_size if iters else 0
    else:
        iters = math.ceil(dataset_size / batch_size)
        last = dataset_size - (iters - 1) * batch_size
    updates = math.ceil(iters / accum_steps)
    return {"iters_per_epoch": iters, "last_batch_size": last, "micro_steps": iters * epochs,
            "updates_per_epoch": updates, "total_updates": updates * epochs,
            "effective_batch_size": batch_size * accum_steps,
            "examples_seen": iters * batch_size * epochs}
"""


def _per_epoch(key: str) -> str:
    """A right answer but for one count of the whole run, given for one epoch."""
    counts = {"micro_steps": "iters", "total_updates": "updates", "examples_seen": "seen"}
    return f"""
import math

def training_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    if drop_last:
        iters = dataset_size // batch_size
        last, seen = (batch_size if iters else 0), iters * batch_size
    else:
        iters = math.ceil(dataset_size / batch_size)
        last, seen = dataset_size - (iters - 1) * batch_size, dataset_size
    updates = math.ceil(iters / accum_steps)
    counts = {{"micro_steps": iters * epochs, "total_updates": updates * epochs,
              "examples_seen": seen * epochs}}
    counts["{key}"] = {counts[key]}
    return {{"iters_per_epoch": iters, "last_batch_size": last, "updates_per_epoch": updates,
            "effective_batch_size": batch_size * accum_steps, **counts}}
"""


SCHEDULE_NAIVE = """
def update_schedule(dataset_size, batch_size, accum_steps, drop_last=False):
    full, rest = divmod(dataset_size, batch_size)
    sizes = [batch_size] * full + ([rest] if rest and not drop_last else [])
    return [(size, (i + 1) % accum_steps == 0) for i, size in enumerate(sizes)]
"""

SCHEDULE_ALL_FULL = """
import math

def update_schedule(dataset_size, batch_size, accum_steps, drop_last=False):
    if drop_last:
        count = dataset_size // batch_size
    else:
        count = math.ceil(dataset_size / batch_size)
    schedule = []
    for i in range(count):
        steps = (i + 1) % accum_steps == 0 or i == count - 1
        schedule.append((batch_size, steps))
    return schedule
"""

SCHEDULE_FLOOR_COUNT = """
def update_schedule(dataset_size, batch_size, accum_steps, drop_last=False):
    count = dataset_size // batch_size
    return [(batch_size, (i + 1) % accum_steps == 0 or i + 1 == count) for i in range(count)]
"""

SCHEDULE_NUMPY = """
import numpy as np

def update_schedule(dataset_size, batch_size, accum_steps, drop_last=False):
    starts = np.arange(0, dataset_size, batch_size)
    sizes = np.minimum(batch_size, dataset_size - starts)
    if drop_last:
        sizes = sizes[sizes == batch_size]
    position = np.arange(1, len(sizes) + 1)
    steps = (position % accum_steps == 0) | (position == len(sizes))
    return list(zip(sizes, steps))
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch00_training_arithmetic": [
        (
            ARITHMETIC_NAIVE_TAIL,
            {"ch00_training_arithmetic_tests": "updates_per_epoch counts only full groups"},
        ),
        (
            ARITHMETIC_IGNORES_DROP_LAST,
            {"ch00_training_arithmetic_tests": "`drop_last=True` throws the partial last batch"},
        ),
        (
            ARITHMETIC_REMAINDER_LAST,
            {"ch00_training_arithmetic_tests": "`N % B` is 0 when B divides N"},
        ),
        (
            ARITHMETIC_PLUS_ONE,
            {"ch00_training_arithmetic_tests": "is one batch too many when B divides N"},
        ),
        (
            ARITHMETIC_ROUND,
            {"ch00_training_arithmetic_tests": "or to the nearest (`round(N / B)`"},
        ),
        (
            ARITHMETIC_LAST_FULL_WHEN_NONE,
            {"ch00_training_arithmetic_tests": "so last_batch_size is 0, not B"},
        ),
        (
            ARITHMETIC_SEEN_FULL_BATCHES,
            {"ch00_training_arithmetic_tests": "examples_seen = N × epochs, not I·B"},
        ),
        (
            _per_epoch("micro_steps"),
            {"ch00_training_arithmetic_tests": "micro_steps counts the micro-batches of the whole"},
        ),
        (
            _per_epoch("total_updates"),
            {"ch00_training_arithmetic_tests": "total_updates counts the updates of the whole run"},
        ),
        (
            _per_epoch("examples_seen"),
            {"ch00_training_arithmetic_tests": "examples_seen counts the examples of the whole"},
        ),
    ],
    "ch00_update_schedule": [
        (
            SCHEDULE_NAIVE,
            {"ch00_update_schedule_tests": "the last, shorter group of micro-batches gets no"},
        ),
        (
            SCHEDULE_ALL_FULL,
            {"ch00_update_schedule_tests": "every micro-batch is listed with B examples"},
        ),
        (
            SCHEDULE_FLOOR_COUNT,
            {"ch00_update_schedule_tests": "the partial last batch is still a micro-batch"},
        ),
    ],
    "ch00_questions": [
        (
            "q_iterations = 195\nq_updates = 780\nq_scheduler = 'a'\n",
            {
                "ch00_q_iterations": "50,000 // 256 rounds down",
                "ch00_q_updates": "10 × 78 rounds down",
                "ch00_q_scheduler": "939 counts micro-batches",
            },
        ),
        (
            "q_iterations = 195.3125\nq_updates = 3130\nq_scheduler = 'c'\n",
            {
                "ch00_q_iterations": "so round up",
                "ch00_q_updates": "3,130 counts micro-batches",
                "ch00_q_scheduler": "runs out at micro-batch 238",
            },
        ),
        (
            "q_iterations = 80\nq_updates = 79\nq_scheduler = 'd'\n",
            {
                "ch00_q_iterations": "the size of the last batch",
                "ch00_q_updates": "79 is the number per epoch",
                "ch00_q_scheduler": "takes only three values",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch00_training_arithmetic": ARITHMETIC_DIVMOD,
    "ch00_update_schedule": SCHEDULE_NUMPY,
    "ch00_questions": "q_iterations = 196.0\nq_updates = 790.0\nq_scheduler = ' B '\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch00_training_arithmetic": (
        "from forge_course.reference.arithmetic import training_arithmetic\n"
    ),
    "ch00_update_schedule": (
        "import forge_course.reference.schedule as ref\n\n"
        "def update_schedule(*args, **kwargs):\n    return ref.update_schedule(*args, **kwargs)\n"
    ),
}
