"""Answers that chapter 13's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

BOTTLENECK_SELF_TIME = """
def bottleneck(averages, phases):
    times = {row.key: row.self_cpu_time_total for row in averages if row.key in phases}
    name = max(phases, key=lambda p: times.get(p, 0.0))
    return name, times[name] / sum(times.values())
"""

BOTTLENECK_PER_CALL = """
def bottleneck(averages, phases):
    times = {row.key: row.cpu_time for row in averages if row.key in phases}
    name = max(phases, key=lambda p: times.get(p, 0.0))
    return name, times[name] / sum(times.values())
"""

BOTTLENECK_OVER_ALL_ROWS = """
def bottleneck(averages, phases):
    times = {row.key: row.cpu_time_total for row in averages if row.key in phases}
    name = max(phases, key=lambda p: times.get(p, 0.0))
    return name, times[name] / sum(row.cpu_time_total for row in averages)
"""

BOTTLENECK_SORTED = """
from collections import Counter

def bottleneck(averages, phases):
    spent = Counter()
    for row in averages:
        if row.key in set(phases):
            spent[row.key] += row.cpu_time_total
    ranked = sorted(phases, key=lambda phase: (-spent[phase], list(phases).index(phase)))
    return ranked[0], spent[ranked[0]] / sum(spent.values())
"""

BOTTLENECK_LAST_ROW = """
def bottleneck(averages, phases):
    times = {}
    for row in averages:
        if row.key in phases:
            times[row.key] = row.cpu_time_total
    name = max(phases, key=lambda p: times.get(p, 0.0))
    return name, times[name] / sum(times.values())
"""

BOTTLENECK_LAST_ON_TIE = """
def bottleneck(averages, phases):
    totals = {phase: 0.0 for phase in phases}
    for row in averages:
        if row.key in totals:
            totals[row.key] += row.cpu_time_total
    name, top = sorted(totals.items(), key=lambda kv: kv[1])[-1]
    return name, top / sum(totals.values())
"""

BOTTLENECK_TABLE_ORDER = """
from collections import defaultdict

def bottleneck(averages, phases):
    totals = defaultdict(float)
    for row in averages:
        if row.key in phases:
            totals[row.key] += row.cpu_time_total
    name = max(totals, key=totals.get)
    return name, totals[name] / sum(totals.values())
"""

BOTTLENECK_LARGEST_ROW = """
from collections import defaultdict

def bottleneck(averages, phases):
    totals = defaultdict(float)
    for row in averages:
        totals[row.key] += row.cpu_time_total
    name = max(totals, key=totals.get)
    return name, totals[name] / sum(totals[phase] for phase in phases)
"""

PRELOAD_UNCHANGED = """
def preload(dataset):
    return dataset
"""

PRELOAD_TWICE = """
def preload(dataset):
    inputs = torch.stack([dataset[i][0] for i in range(len(dataset))])
    targets = torch.stack([dataset[i][1] for i in range(len(dataset))])
    return torch.utils.data.TensorDataset(inputs, targets)
"""

PRELOAD_FLOAT_TARGETS = """
def preload(dataset):
    pairs = [dataset[i] for i in range(len(dataset))]
    inputs = torch.stack([x for x, _ in pairs])
    return torch.utils.data.TensorDataset(inputs, torch.Tensor([int(y) for _, y in pairs]))
"""

PRELOAD_LIST = """
def preload(dataset):
    return [tuple(dataset[i]) for i in range(len(dataset))]
"""

# Iterating over a map-style dataset calls dataset[0], dataset[1], ... until an IndexError.
PRELOAD_ITERATED = """
def preload(dataset):
    pairs = [(x, y) for x, y in dataset]
    inputs = torch.stack([x for x, _ in pairs])
    return torch.utils.data.TensorDataset(inputs, torch.stack([y for _, y in pairs]))
"""

PRELOAD_LAZY_CACHE = """
class Cached(torch.utils.data.Dataset):
    def __init__(self, source):
        self.source, self.cache = source, {}

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        if i not in self.cache:
            self.cache[i] = self.source[i]
        return self.cache[i]

def preload(dataset):
    return Cached(dataset)
"""

PRELOAD_LRU_CACHE = """
import functools

class Remembered(torch.utils.data.Dataset):
    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(self.source)

    @functools.lru_cache(maxsize=None)
    def __getitem__(self, i):
        return self.source[i]

def preload(dataset):
    return Remembered(dataset)
"""

WRONG = {
    "ch13_bottleneck": [
        (BOTTLENECK_SELF_TIME, {"ch13_bottleneck_tests": "ranked by self time"}),
        (BOTTLENECK_LAST_ROW, {"ch13_bottleneck_tests": "only one row of a phase was counted"}),
        (BOTTLENECK_PER_CALL, {"ch13_bottleneck_tests": "time per call"}),
        (BOTTLENECK_OVER_ALL_ROWS, {"ch13_bottleneck_tests": "sum of every row"}),
        (BOTTLENECK_LAST_ON_TIE, {"ch13_bottleneck_tests": "two phases tie for the most time"}),
        (BOTTLENECK_TABLE_ORDER, {"ch13_bottleneck_tests": "two phases tie for the most time"}),
        (BOTTLENECK_LARGEST_ROW, {"ch13_bottleneck_tests": "`ProfilerStep*` is a whole step"}),
    ],
    "ch13_preload": [
        (PRELOAD_UNCHANGED, {"ch13_preload_tests": "came back unchanged"}),
        (PRELOAD_TWICE, {"ch13_preload_tests": "decoded twice"}),
        (PRELOAD_FLOAT_TARGETS, {"ch13_preload_tests": "targets came back as floats"}),
        (PRELOAD_LAZY_CACHE, {"ch13_preload_tests": "decoded on first use (a lazy cache)"}),
        (PRELOAD_LRU_CACHE, {"ch13_preload_tests": "decoded on first use (a lazy cache)"}),
    ],
    "ch13_questions": [
        (
            "step_ms = 17\nphase_answer = 'a'\nsync_answer = 'a'\n",
            {
                "ch13_q_step_ms": "loading and computing one after the other",
                "ch13_q_phase_time": "self time leaves out the operators",
                "ch13_q_sync": "the CPU waits for that",
            },
        ),
        (
            "step_ms = 5\nphase_answer = 'd'\nsync_answer = 'c'\n",
            {
                "ch13_q_step_ms": "that is the compute alone",
                "ch13_q_phase_time": "the time of one call",
                "ch13_q_sync": "the CPU must have the value",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch13_bottleneck": BOTTLENECK_SORTED,
    "ch13_preload": PRELOAD_ITERATED,
    "ch13_questions": "step_ms = max(5, 12 / 2)\nphase_answer = ' B'\nsync_answer = 'B'\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch13_bottleneck": "from forge_course.reference.profiling import bottleneck\n",
    "ch13_preload": (
        "import forge_course.reference.profiling as ref\n\n"
        "def preload(dataset):\n    return ref.preload(dataset)\n"
    ),
}
