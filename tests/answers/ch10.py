"""Answers that chapter 10's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

ACCUMULATE_ONE_OVER_K = """
def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    loss_sum = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model(x), y)
        (loss / len(micro_batches)).backward()
        loss_sum += loss.item() * len(x)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss_sum / total
"""

ACCUMULATE_CLIP_EACH = """
def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    loss_sum = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model(x), y)
        (loss * len(x) / total).backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        loss_sum += loss.item() * len(x)
    optimizer.step()
    return loss_sum / total
"""

ACCUMULATE_NO_ZERO_GRAD = """
def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    total = sum(len(x) for x, _ in micro_batches)
    loss_sum = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model(x), y)
        (loss * len(x) / total).backward()
        loss_sum += loss.item() * len(x)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss_sum / total
"""

ACCUMULATE_SET_TO_NONE_LAST = """
def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    n_total = sum(x.shape[0] for x, _ in micro_batches)
    mean_loss = 0.0
    for inputs, targets in micro_batches:
        share = inputs.shape[0] / n_total
        loss = loss_fn(model(inputs), targets)
        (share * loss).backward()
        mean_loss += share * float(loss.detach())
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return mean_loss
"""

ACCUMULATE_IN_EVAL_MODE = """
def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    model.eval()
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    loss_sum = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model(x), y)
        (loss * len(x) / total).backward()
        loss_sum += loss.item() * len(x)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    model.train()
    return loss_sum / total
"""

ACCUMULATE_ONE_BACKWARD = """
def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    n = sum(len(x) for x, _ in micro_batches)
    optimizer.zero_grad()
    total = sum(loss_fn(model(x), y) * len(x) / n for x, y in micro_batches)
    total.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return total.item()
"""

AMP_NO_AUTOCAST = """
def amp_train_step(model, optimizer, loss_fn, x, y, scaler=None):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
"""

AMP_IGNORES_SCALER = """
def amp_train_step(model, optimizer, loss_fn, x, y, scaler=None):
    dtype = torch.bfloat16 if x.device.type == "cpu" else torch.float16
    optimizer.zero_grad()
    with torch.autocast(x.device.type, dtype=dtype):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
"""

AMP_FLOAT16_ON_CPU = """
def amp_train_step(model, optimizer, loss_fn, x, y, scaler=None):
    optimizer.zero_grad()
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = loss_fn(model(x), y)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return loss.item()
"""

AMP_AUTOCAST_DEFAULTS = """
def amp_train_step(model, optimizer, loss_fn, x, y, scaler=None):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type):
        logits = model(x)
        loss = loss_fn(logits, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return float(loss.detach())
"""

CHECKPOINT_REENTRANT = """
from torch.utils.checkpoint import checkpoint


def checkpointed_forward(layers, x, segments):
    layers = list(layers)
    base, extra = divmod(len(layers), segments)
    start = 0
    for i in range(segments):
        size = base + (1 if i < extra else 0)
        x = checkpoint(torch.nn.Sequential(*layers[start:start + size]), x, use_reentrant=True)
        start += size
    return x
"""

CHECKPOINT_SEQUENTIAL = """
from torch.utils.checkpoint import checkpoint_sequential


def checkpointed_forward(layers, x, segments):
    return checkpoint_sequential(torch.nn.Sequential(*layers), segments, x, use_reentrant=False)
"""

CHECKPOINT_PLAIN = """
def checkpointed_forward(layers, x, segments):
    for layer in layers:
        x = layer(x)
    return x
"""

CHECKPOINT_LATE_BINDING = """
from torch.utils.checkpoint import checkpoint


def checkpointed_forward(layers, x, segments):
    layers = list(layers)
    base, extra = divmod(len(layers), segments)
    start = 0
    for size in [base + 1] * extra + [base] * (segments - extra):
        group = layers[start:start + size]
        start += size

        def run_group(h):
            for layer in group:
                h = layer(h)
            return h

        x = checkpoint(run_group, x, use_reentrant=False)
    return x
"""

CHECKPOINT_LATE_BOUNDS = """
from torch.utils.checkpoint import checkpoint


def checkpointed_forward(layers, x, segments):
    layers = list(layers)
    base, extra = divmod(len(layers), segments)
    start = 0
    for i in range(segments):
        size = base + (1 if i < extra else 0)
        x = checkpoint(lambda h: torch.nn.Sequential(*layers[start:start + size])(h), x,
                       use_reentrant=False)
        start += size
    return x
"""

CHECKPOINT_REMAINDER_LAST = """
from torch.utils.checkpoint import checkpoint


def checkpointed_forward(layers, x, segments):
    layers = list(layers)
    size = len(layers) // segments
    for s in range(segments):
        last = s == segments - 1
        group = layers[s * size:] if last else layers[s * size:(s + 1) * size]
        x = checkpoint(torch.nn.Sequential(*group), x, use_reentrant=False)
    return x
"""

CHECKPOINT_CEIL_CHUNKS = """
import math

from torch.utils.checkpoint import checkpoint


def checkpointed_forward(layers, x, segments):
    layers = list(layers)
    size = math.ceil(len(layers) / segments)
    for i in range(0, len(layers), size):
        x = checkpoint(torch.nn.Sequential(*layers[i:i + size]), x, use_reentrant=False)
    return x
"""

CHECKPOINT_SHORTER_FIRST = """
from torch.utils.checkpoint import checkpoint


def checkpointed_forward(layers, x, segments):
    layers = list(layers)
    base, extra = divmod(len(layers), segments)
    start = 0
    for size in [base] * (segments - extra) + [base + 1] * extra:
        x = checkpoint(torch.nn.Sequential(*layers[start:start + size]), x, use_reentrant=False)
        start += size
    return x
"""

# Balanced, but not longer first: 10 blocks in 4 segments give 2, 3, 3, 2.
CHECKPOINT_ROUNDED_BOUNDS = """
import torch.utils.checkpoint as ckpt


def checkpointed_forward(layers, x, segments):
    layers = list(layers)
    bounds = [round(i * len(layers) / segments) for i in range(segments + 1)]
    for a, b in zip(bounds, bounds[1:]):
        x = ckpt.checkpoint(torch.nn.Sequential(*layers[a:b]), x, use_reentrant=False)
    return x
"""

CHECKPOINT_ARRAY_SPLIT = """
import numpy as np
import torch.utils.checkpoint as ckpt


def checkpointed_forward(layers, x, segments):
    for indices in np.array_split(np.arange(len(layers)), segments):
        segment = torch.nn.Sequential(*(layers[int(i)] for i in indices))
        x = ckpt.checkpoint(segment, x, use_reentrant=False)
    return x
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch10_accumulate_step": [
        (ACCUMULATE_ONE_OVER_K, {"ch10_accumulate_step_tests": "weighted by 1/K"}),
        (ACCUMULATE_CLIP_EACH, {"ch10_accumulate_step_tests": "clipped after every micro-batch"}),
        (ACCUMULATE_NO_ZERO_GRAD, {"ch10_accumulate_step_tests": "zero_grad()` is missing"}),
        (ACCUMULATE_IN_EVAL_MODE, {"ch10_accumulate_step_tests": "ran in eval mode"}),
        (
            ACCUMULATE_ONE_BACKWARD,
            {"ch10_accumulate_step_tests": "One backward over the summed loss keeps every"},
        ),
    ],
    "ch10_amp_step": [
        (AMP_NO_AUTOCAST, {"ch10_amp_step_tests": "the forward pass ran in float32"}),
        (AMP_IGNORES_SCALER, {"ch10_amp_step_tests": "was passed but not used"}),
        (AMP_FLOAT16_ON_CPU, {"ch10_amp_step_tests": "autocast ran in float16 on the CPU"}),
    ],
    "ch10_checkpointed_forward": [
        (CHECKPOINT_REENTRANT, {"ch10_checkpointed_forward_tests": "use_reentrant=True"}),
        (
            CHECKPOINT_SEQUENTIAL,
            {"ch10_checkpointed_forward_tests": "the last segment is not checkpointed"},
        ),
        (CHECKPOINT_PLAIN, {"ch10_checkpointed_forward_tests": "nothing is checkpointed"}),
        (
            CHECKPOINT_LATE_BINDING,
            {"ch10_checkpointed_forward_tests": "recomputed the blocks of the last group"},
        ),
        (
            CHECKPOINT_LATE_BOUNDS,
            {"ch10_checkpointed_forward_tests": "reads the loop's variables"},
        ),
        (
            CHECKPOINT_REMAINDER_LAST,
            {"ch10_checkpointed_forward_tests": "the last one took the rest"},
        ),
        (
            CHECKPOINT_CEIL_CHUNKS,
            {"ch10_checkpointed_forward_tests": "fewer segments than asked"},
        ),
        (
            CHECKPOINT_SHORTER_FIRST,
            {"ch10_checkpointed_forward_tests": "the shorter groups come first"},
        ),
        (CHECKPOINT_ROUNDED_BOUNDS, {"ch10_checkpointed_forward_tests": "longer first"}),
    ],
    "ch10_questions": [
        (
            "tail_weight = 0.25\nscaler_answer = 'a'\nsaved_bytes = 2359296\n",
            {
                "ch10_q_tail_weight": "that is 1/K",
                "ch10_q_scaler": "no scaler is needed",
                "ch10_q_saved_bytes": "that is the plain forward",
            },
        ),
        (
            "tail_weight = 0.01\nscaler_answer = 'c'\nsaved_bytes = 16384\n",
            {
                "ch10_q_tail_weight": "each example's share",
                "ch10_q_scaler": "bfloat16's range is float32's",
                "ch10_q_saved_bytes": "there are 8 segments",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch10_accumulate_step": ACCUMULATE_SET_TO_NONE_LAST,
    "ch10_amp_step": AMP_AUTOCAST_DEFAULTS,
    "ch10_checkpointed_forward": CHECKPOINT_ARRAY_SPLIT,
    "ch10_questions": "tail_weight = 4 / 100\nscaler_answer = 'B'\nsaved_bytes = 8 * 64 * 64 * 4\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch10_accumulate_step": "from forge_course.reference.accumulation import accumulate_step\n",
    "ch10_amp_step": (
        "import forge_course.reference.amp as ref\n\n"
        "def amp_train_step(*args, **kwargs):\n    return ref.amp_train_step(*args, **kwargs)\n"
    ),
    "ch10_checkpointed_forward": (
        "from forge_course.reference.checkpointing import checkpointed_forward\n"
    ),
}
