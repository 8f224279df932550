"""Answers that chapter 07's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

GRAD_NORM_SUM_OF_NORMS = """
def grad_norm(model):
    return float(sum(p.grad.norm() for p in model.parameters() if p.grad is not None))
"""

GRAD_NORM_EVERY_PARAMETER = """
import math

def grad_norm(model):
    return math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters()))
"""

GRAD_NORM_TENSOR = """
import torch

def grad_norm(model):
    norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(norms).norm() if norms else torch.tensor(0.0)
"""

GRAD_NORM_FLAT = """
import torch

def grad_norm(model):
    pieces = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    if not pieces:
        return 0.0
    return float(torch.linalg.vector_norm(torch.cat(pieces)))
"""

LEAK_REQUIRES_GRAD = """
import torch

def graph_leaks(obj):
    if isinstance(obj, torch.Tensor):
        return int(obj.requires_grad)
    if isinstance(obj, dict):
        return sum(graph_leaks(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(graph_leaks(v) for v in obj)
    return 0
"""

LEAK_EVERY_ITERABLE = """
import torch

def graph_leaks(obj):
    if isinstance(obj, torch.Tensor):
        return int(obj.grad_fn is not None)
    if isinstance(obj, dict):
        obj = obj.values()
    try:
        return sum(graph_leaks(item) for item in obj)
    except TypeError:
        return 0
"""

LEAK_TOP_LEVEL = """
import torch

def graph_leaks(obj):
    items = obj.values() if isinstance(obj, dict) else obj
    if isinstance(items, torch.Tensor):
        items = [items]
    if not isinstance(items, (list, tuple, type({}.values()))):
        return 0
    return sum(isinstance(v, torch.Tensor) and v.grad_fn is not None for v in items)
"""

# Counts each tensor once: the exercise counts a tensor stored twice twice.
LEAK_ONCE_EACH = """
import torch

def graph_leaks(obj, seen=None):
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        if obj.grad_fn is None or id(obj) in seen:
            return 0
        seen.add(id(obj))
        return 1
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(graph_leaks(item, seen) for item in obj)
    return 0
"""

LEAK_STACK = """
import torch

def graph_leaks(obj):
    count, pending = 0, [obj]
    while pending:
        item = pending.pop()
        if torch.is_tensor(item):
            count += 0 if item.grad_fn is None else 1
        elif isinstance(item, dict):
            pending += list(item.values())
        elif isinstance(item, (list, tuple)):
            pending += list(item)
    return count
"""

RIGHT_LABELS = {
    "A": "missing_zero_grad",
    "B": "no_eval_mode",
    "C": "none",
    "D": "graph_kept_alive",
    "E": "stale_optimizer",
    "F": "softmax_before_cross_entropy",
}


def _labels(**changes):
    return f"labels = { ({**RIGHT_LABELS, **changes})!r}\n"


# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
GRAD_NORM_STATE_DICT = """
import math

def grad_norm(model):
    total = 0.0
    for name, p in model.state_dict(keep_vars=True).items():
        if p.grad is not None:
            total += p.grad.pow(2).sum().item()
    return math.sqrt(total)
"""

WRONG = {
    "ch07_grad_norm": [
        (GRAD_NORM_SUM_OF_NORMS, {"ch07_grad_norm_tests": "sum of the per-parameter norms"}),
        (GRAD_NORM_EVERY_PARAMETER, {"ch07_grad_norm_tests": "has `.grad = None`"}),
        (GRAD_NORM_TENSOR, {"ch07_grad_norm_tests": "Return a Python float"}),
        (GRAD_NORM_STATE_DICT, {"ch07_grad_norm_tests": "shared by two layers was counted twice"}),
    ],
    "ch07_leak_check": [
        (LEAK_REQUIRES_GRAD, {"ch07_leak_check_tests": "merely *require* grad"}),
        (LEAK_EVERY_ITERABLE, {"ch07_leak_check_tests": "a string is iterable"}),
        (LEAK_TOP_LEVEL, {"ch07_leak_check_tests": "only the top level was searched"}),
    ],
    "ch07_mystery_loops": [
        (
            _labels(A="graph_kept_alive", D="missing_zero_grad"),
            {"ch07_mystery_loops_tests": "4 of 6 loops labelled right"},
        ),
        (
            _labels(C="missing_zero_grad"),
            {"ch07_mystery_loops_tests": "Zeroing after `step()`"},
        ),
        (
            _labels(F="softmax"),
            {"ch07_mystery_loops_tests": "Loop F: 'softmax' is not one of the codes"},
        ),
    ],
    "ch07_questions": [
        (
            "grad_growth = 100\nfrozen_answer = 'a'\nmemory_answer = 'a'\n",
            {
                "ch07_q_grad_growth": "k² would be the norm squared",
                "ch07_q_frozen": "set_to_none=False",
                "ch07_q_kept_memory": "backward already freed",
            },
        ),
        (
            "grad_growth = 1024\nfrozen_answer = 'd'\nmemory_answer = 'b'\n",
            {
                "ch07_q_grad_growth": "not exponentially",
                "ch07_q_frozen": "moments and all",
                "ch07_q_kept_memory": "memory stays flat",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch07_grad_norm": GRAD_NORM_FLAT,
    "ch07_leak_check": LEAK_STACK,
    "ch07_mystery_loops": (
        "labels = {key.lower(): f' {code.upper()} ' for key, code in "
        + repr(RIGHT_LABELS)
        + ".items()}\n"
    ),
    "ch07_questions": "grad_growth = 10.0\nfrozen_answer = 'B'\nmemory_answer = ' c'\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch07_grad_norm": "from forge_course.reference.detectors import grad_norm\n",
    "ch07_leak_check": (
        "import forge_course.reference.detectors as ref\n\n"
        "def graph_leaks(obj):\n    return ref.graph_leaks(obj)\n"
    ),
}
