"""Checks for chapter 10, "Scaling on one device": the grader's half.

The learner's half, `forge_course.observe.ch10`, builds the inputs, calls the answer and
reports; here are the cases, the references, the known mistakes and what counts as equal.

Exercises:
    ch10_accumulate_step: ``accumulate_step(model, optimizer, loss_fn, micro_batches,
        max_grad_norm=None) -> float``, one update equal to one step on the whole batch, from
        one forward and backward per micro-batch, each backward before the next forward.
    ch10_amp_step: ``amp_train_step(model, optimizer, loss_fn, x, y, scaler=None) -> float``,
        autocast on ``x``'s device type: bfloat16 on the CPU, float16 on CUDA and MPS (or
        bfloat16 where the GPU runs it).
    ch10_checkpointed_forward: ``checkpointed_forward(layers, x, segments) -> Tensor``: no more
        bytes kept for backward than the reference, and every block recomputed in backward, in
        the reference's segments.
Questions:
    ch10_q_tail_weight, ch10_q_scaler, ch10_q_saved_bytes.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, first_difference, grading_seed
from forge_course.observe.ch10 import (
    KEPT,
    label_accumulate,
    label_amp,
    label_checkpointed,
    observe_accumulate_step,
    observe_amp_step,
    observe_checkpointed_forward,
)
from forge_course.reference import accumulation as ref_accumulation
from forge_course.reference import amp as ref_amp
from forge_course.reference import checkpointing as ref_checkpointing


def _devices_and_seeds(thorough: bool):
    seed = grading_seed() if thorough else 0
    devices = available_devices() if thorough else [torch.device("cpu")]
    return seed, devices


# ---------------------------------------------------------------- ch10_accumulate_step


_FORWARD_SKIPS_HOOKS = (
    "`model.forward(x)` skips the model's hooks (this model has a forward hook that changes its "
    "output). Call the model itself, `model(x)`: `__call__` runs the hooks around `forward`."
)
_EVAL_MODE = (
    "the forward passes ran in eval mode (dropout off). A training step runs the model in the "
    "mode its caller set (train): no `model.eval()` in it."
)


def accumulate_cases(thorough: bool = False) -> list[dict]:
    """Uneven [6, 6, 6, 2] with and without clipping; thorough adds optimizers, dtypes, devices."""
    base = {"device": "cpu", "dtype": "float32", "optimizer": "momentum", "sizes": [6, 6, 6, 2]}
    if not thorough:
        return [{**base, "clip": None, "seed": 0}, {**base, "clip": 0.05, "seed": 1}]
    seed, devices = _devices_and_seeds(thorough)
    plans = [
        ("float32", "momentum", [6, 6, 6, 2], None),
        ("float32", "momentum", [6, 6, 6, 2], 0.05),
        ("float64", "adamw", [5, 5, 5, 1], 0.1),
        ("float64", "sgd", [4, 4, 4, 4], None),
        ("float32", "adamw", [3, 7, 2], 0.02),
        ("float64", "momentum", [9], 0.05),
    ]
    cases = []
    for i, device in enumerate(devices):
        for j, (dtype, optimizer, sizes, clip) in enumerate(plans):
            if dtype == "float64" and device.type == "mps":
                continue  # MPS has no float64.
            cases.append({"device": str(device), "dtype": dtype, "optimizer": optimizer,
                          "sizes": sizes, "clip": clip, "seed": seed + 10 * i + j})  # fmt: skip
    return cases


def _wrong_accumulate(*, one_over_k=False, clip_each=False, zero_grad=True, plain_mean=False,
                      forward=False, eval_mode=False):  # fmt: skip
    def wrong(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
        total = sum(len(x) for x, _ in micro_batches)
        if zero_grad:
            optimizer.zero_grad()
        model.train(not eval_mode)
        losses, weighted = [], 0.0
        for x, y in micro_batches:
            loss = loss_fn(model.forward(x) if forward else model(x), y)
            weight = 1 / len(micro_batches) if one_over_k else len(x) / total
            (loss * weight).backward()
            if clip_each and max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            losses.append(loss.item())
            weighted += loss.item() * len(x) / total
        if not clip_each and max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        model.train()
        return sum(losses) / len(losses) if plain_mean else weighted

    return wrong


def _summed_then_backward(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    loss = sum(loss_fn(model(x), y) * len(x) / total for x, y in micro_batches)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def _concatenated(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    optimizer.zero_grad()
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    loss = loss_fn(model(x), y)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


ACCUMULATE_MISTAKES = [
    (
        "each micro-batch's loss was weighted by 1/K. That equals the big batch only when every "
        "micro-batch has the same size; weight micro-batch i by n_i / N (its share of the "
        "examples), so that the short last one counts for what it holds.",
        _wrong_accumulate(one_over_k=True),
    ),
    (
        "the gradient was clipped after every micro-batch. Clip once, after the last backward "
        "and just before `optimizer.step()`: only then is `.grad` the whole batch's gradient.",
        _wrong_accumulate(clip_each=True),
    ),
    (
        "`optimizer.zero_grad()` is missing: the second update still carries the first one's "
        "gradient. Clear `.grad` before the first micro-batch (or after the step).",
        _wrong_accumulate(zero_grad=False),
    ),
    (
        "the returned loss is the plain mean of the micro-batch losses. Weight each by n_i / N, "
        "as the gradient is, so the result is the mean over all N examples.",
        _wrong_accumulate(plain_mean=True),
    ),
    (
        "the micro-batches were concatenated into one batch for a single forward pass. That is "
        "the big batch itself, with every example's activations in memory at once, which is "
        "what accumulation exists to avoid. Run forward and backward on each micro-batch in "
        "turn and let `.grad` add up.",
        _concatenated,
    ),
    (
        "every micro-batch's forward ran before the first backward. One backward over the "
        "summed loss keeps every micro-batch's graph, activations and all, until the end: the "
        "memory of the full batch, which accumulation exists to avoid. Call "
        "`(loss * n_i / N).backward()` inside the loop, right after that micro-batch's forward, "
        "so that its graph is freed before the next one is built, and add up `loss.item()` for "
        "the returned value.",
        _summed_then_backward,
    ),
    (_FORWARD_SKIPS_HOOKS, _wrong_accumulate(forward=True)),
    (_EVAL_MODE, _wrong_accumulate(eval_mode=True)),
]

ACCUMULATE = Exercise(
    grade_id="ch10_accumulate_step",
    function="accumulate_step",
    reference=ref_accumulation.accumulate_step.__wrapped__,
    cases=accumulate_cases,
    observe=observe_accumulate_step,
    label=label_accumulate,
    mistakes=ACCUMULATE_MISTAKES,
    hint="zero_grad, then for each micro-batch in turn a forward and, before the next forward, "
    "a backward of loss·n_i/N; then clip once (if asked), step once, and return the "
    "n_i/N-weighted mean loss as a float.",
)
check_accumulate_step = ACCUMULATE.check


# ---------------------------------------------------------------- ch10_amp_step


def amp_cases(thorough: bool = False) -> list[dict]:
    """The CPU without a scaler, with one, and with one whose gradient overflows (each case the
    exercise text names); thorough adds AdamW without a scaler, every device, and a CPU batch
    that says it is on CUDA (so that a hard-coded "cpu" shows on any machine)."""
    if not thorough:
        return [
            {"device": "cpu", "optimizer": "momentum", "scaler": "none", "seed": 0},
            {"device": "cpu", "optimizer": "adamw", "scaler": "given", "seed": 1},
            {"device": "cpu", "optimizer": "momentum", "scaler": "overflow", "seed": 2},
        ]
    seed, devices = _devices_and_seeds(thorough)
    cases = []
    for i, device in enumerate(devices):
        # A float16 device gets the run's scaler, as `make_scaler` would give it.
        float16 = ref_amp.autocast_dtype.__wrapped__(device) == torch.float16
        own = "given" if float16 else "none"
        plans = [("momentum", own), ("adamw", own), ("momentum", "overflow")]
        if device.type == "cpu":
            plans.append(("adamw", "given"))  # a scaler passed on the CPU must still be used
        for j, (optimizer, scaler) in enumerate(plans):
            cases.append({"device": str(device), "optimizer": optimizer, "scaler": scaler,
                          "seed": seed + 10 * i + j})  # fmt: skip
    cases.append({"device": "cpu", "claims": "cuda", "optimizer": "momentum", "scaler": "none",
                  "seed": seed + 99})  # fmt: skip
    return cases


def _bfloat16_on_a_gpu(observation, target, case: dict):
    """Accept bfloat16 where the reference runs float16 (CUDA, MPS): a GPU that ran the forward
    in bfloat16 supports it, and bfloat16 needs no scaler (one passed in may still be used).
    Such an answer is compared with the reference run in bfloat16 on the same case: rounding
    differs between the two types, and under AdamW, whose first steps move each weight by about
    the learning rate whatever the gradient's size, a gradient near zero may even change sign.
    Each part that agrees with that run is taken as agreeing with ``target``."""
    on_a_gpu = torch.device(case["device"]).type != "cpu"
    if not (on_a_gpu and isinstance(observation, dict) and isinstance(target, dict)):
        return observation
    dtypes = [key for key in target if key.startswith("the dtype of the model's output")]
    ran = [(target[key], observation.get(key)) for key in dtypes]
    if not ran or any(pair != ("torch.float16", "torch.bfloat16") for pair in ran):
        return observation
    in_bfloat16 = AMP.expected_of(partial(AMP.reference, dtype=torch.bfloat16), case, "bfloat16")
    return {
        key: target[key]
        if key in target and first_difference(got, in_bfloat16.get(key), key) is None
        else got
        for key, got in observation.items()
    }


def _wrong_amp(*, autocast=True, dtype=None, use_scaler=True, kind=None, forward=False,
               eval_mode=False):  # fmt: skip
    def wrong(model, optimizer, loss_fn, x, y, scaler=None):
        optimizer.zero_grad()
        kind_used = kind or x.device.type
        low = dtype or (torch.bfloat16 if kind_used == "cpu" else torch.float16)
        model.train(not eval_mode)
        with torch.autocast(kind_used, dtype=low, enabled=autocast):
            loss = loss_fn(model.forward(x) if forward else model(x), y)
        model.train()
        if scaler is None or not use_scaler:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss.item()

    return wrong


AMP_MISTAKES = [
    (
        'autocast was entered for the CPU whatever the input\'s device (`torch.autocast("cpu", '
        "...)`), which does nothing to a GPU's arithmetic. Take the device type from the input: "
        "`torch.autocast(x.device.type, dtype=...)`.",
        _wrong_amp(kind="cpu"),
    ),
    (
        "the forward pass ran in float32: run the model and the loss inside "
        "`with torch.autocast(x.device.type, dtype=...)` (bfloat16 on the CPU, float16 on "
        "CUDA and MPS).",
        _wrong_amp(autocast=False),
    ),
    (
        "autocast ran in float16 on the CPU. Use bfloat16 there: it is what the CPU's autocast "
        "kernels are made for, and it needs no GradScaler.",
        _wrong_amp(dtype=torch.float16),
    ),
    (
        "a GradScaler was passed but not used, so an inf gradient reached the weights. With a "
        "scaler: `scaler.scale(loss).backward()`, `scaler.step(optimizer)` (which skips the "
        "update when a gradient is inf or nan), then `scaler.update()`.",
        _wrong_amp(use_scaler=False),
    ),
    (_FORWARD_SKIPS_HOOKS, _wrong_amp(forward=True)),
    (_EVAL_MODE, _wrong_amp(eval_mode=True)),
]

AMP = Exercise(
    grade_id="ch10_amp_step",
    function="amp_train_step",
    reference=ref_amp.amp_train_step.__wrapped__,
    cases=amp_cases,
    observe=observe_amp_step,
    label=label_amp,
    mistakes=AMP_MISTAKES,
    prepare=_bfloat16_on_a_gpu,
    hint="zero_grad; forward and loss under autocast for x's device type, with its dtype; then "
    "either loss.backward() and optimizer.step(), or, with a scaler, scale/backward, step, "
    "update; return loss.item().",
)
check_amp_step = AMP.check


# ---------------------------------------------------------------- ch10_checkpointed_forward


def checkpoint_cases(thorough: bool = False) -> list[dict]:
    """6 blocks in 3 segments and 10 in 4 (where each wrong split of the sizes shows, and shows
    differently); thorough adds other uneven splits, 1 and N segments, float64, devices."""
    base = {"device": "cpu", "dtype": "float32", "input_grad": False, "container": "modulelist"}
    if not thorough:
        return [{**base, "layers": 6, "segments": 3, "seed": 0},
                {**base, "layers": 10, "segments": 4, "seed": 1}]  # fmt: skip
    seed, devices = _devices_and_seeds(thorough)
    plans = [
        (6, 3, "float32", False, "modulelist"),
        (10, 4, "float64", False, "modulelist"),
        (5, 2, "float64", False, "list"),
        (7, 3, "float32", True, "sequential"),
        (4, 1, "float64", False, "modulelist"),
        (4, 4, "float32", True, "list"),
    ]
    cases = []
    for i, device in enumerate(devices):
        for j, (n, k, dtype, input_grad, container) in enumerate(plans):
            if dtype == "float64" and device.type == "mps":
                continue  # MPS has no float64.
            cases.append({"device": str(device), "dtype": dtype, "input_grad": input_grad,
                          "container": container, "layers": n, "segments": k,
                          "seed": seed + 10 * i + j})  # fmt: skip
    return cases


def _remainder_last(n_layers, segments):
    base = n_layers // segments
    return [base] * (segments - 1) + [n_layers - base * (segments - 1)]


def _ceil_chunks(n_layers, segments):
    size = -(-n_layers // segments)
    return [min(size, n_layers - start) for start in range(0, n_layers, size)]


def _shorter_first(n_layers, segments):
    return ref_checkpointing.segment_sizes(n_layers, segments)[::-1]


def _split(sizes=ref_checkpointing.segment_sizes, late_binding=False):
    """A checkpointed forward with one thing changed: the segment sizes, or when the function
    given to `checkpoint` looks up its group."""

    def wrong(layers, x, segments):
        layers = list(layers)
        start = 0
        for size in sizes(len(layers), segments):
            group = layers[start : start + size]
            start += size

            def run_group(h, bound=group):
                # The mistake itself: without the default, `group` is looked up when backward
                # recomputes the segment, after the loop has ended.
                for layer in group if late_binding else bound:  # noqa: B023
                    h = layer(h)
                return h

            x = checkpoint(run_group, x, use_reentrant=False)
        return x

    return wrong


def _plain_forward(layers, x, segments):
    for layer in layers:
        x = layer(x)
    return x


def _reentrant(layers, x, segments):
    layers = list(layers)
    start = 0
    for size in ref_checkpointing.segment_sizes(len(layers), segments):
        segment = torch.nn.Sequential(*layers[start : start + size])
        start += size
        x = checkpoint(segment, x, use_reentrant=True)
    return x


def _sequential(layers, x, segments):
    return checkpoint_sequential(torch.nn.Sequential(*layers), segments, x, use_reentrant=False)


def _plain_forward_under_own_hooks(layers, x, segments):
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        return _plain_forward(layers, x, segments)


def _at_most_the_reference(observation, target, case: dict):
    """Keeping no more bytes for backward than the reference is as good as the reference."""
    if not (isinstance(observation, dict) and isinstance(target, dict)):
        return observation
    got, want = observation.get(KEPT), target.get(KEPT)
    if isinstance(got, int) and isinstance(want, int) and got <= want:
        return {**observation, KEPT: want}
    return observation


CHECKPOINT_MISTAKES = [
    (
        "`use_reentrant=True` (the old default) gives the layers no gradient when the segment's "
        "input does not require grad, as an input batch does not. Pass `use_reentrant=False`.",
        _reentrant,
    ),
    (
        "the last segment is not checkpointed, so all of its activations are kept "
        "(`torch.utils.checkpoint.checkpoint_sequential` runs its last segment plainly). Wrap "
        "every segment in `checkpoint(...)`.",
        _sequential,
    ),
    (
        "nothing is checkpointed: the forward keeps every block's activations. Run each "
        "segment through `torch.utils.checkpoint.checkpoint(run_segment, x, "
        "use_reentrant=False)`.",
        _plain_forward,
    ),
    (
        "the layers run under a `saved_tensors_hooks` of the answer's own, which hides what the "
        "forward keeps from the check, and nothing is recomputed during backward: nothing is "
        "checkpointed. Drop the hooks and run each segment through "
        "`torch.utils.checkpoint.checkpoint(run_segment, x, use_reentrant=False)`.",
        _plain_forward_under_own_hooks,
    ),
    (
        "every segment recomputed the blocks of the last group during backward. The function "
        "given to `checkpoint` runs again when backward reaches its segment, after the loop has "
        "ended, and a function defined in the loop looks up `group` only then: it sees the "
        "last group, so the gradients are wrong. Bind the group when the function is made: "
        "`def run_group(h, group=group)`, `functools.partial`, or `nn.Sequential(*group)`.",
        _split(late_binding=True),
    ),
    (
        "the segments were cut `len(layers) // segments` long and the last one took the rest "
        "(10 blocks in 4 give 2, 2, 2, 4), so the last segment can be longer than the others "
        "by up to `segments - 1` blocks. Sizes differ by at most one, longer groups first: with "
        "`base, extra = divmod(len(layers), segments)`, `[base + 1] * extra + [base] * "
        "(segments - extra)` (10 in 4: 3, 3, 2, 2).",
        _split(_remainder_last),
    ),
    (
        "the layers were cut into chunks of `ceil(len(layers) / segments)` (10 blocks in 4 give "
        "3, 3, 3, 1), which leaves a short last chunk and, for some sizes, fewer segments than "
        "asked (6 blocks in 4 give 3 chunks of 2). Cut exactly `segments` groups whose sizes "
        "differ by at most one, longer groups first: with `base, extra = divmod(len(layers), "
        "segments)`, `[base + 1] * extra + [base] * (segments - extra)` (10 in 4: 3, 3, 2, 2).",
        _split(_ceil_chunks),
    ),
    (
        "the shorter groups come first (10 blocks in 4 give 2, 2, 3, 3). The exercise puts the "
        "longer ones first: with `base, extra = divmod(len(layers), segments)`, "
        "`[base + 1] * extra + [base] * (segments - extra)` (10 in 4: 3, 3, 2, 2).",
        _split(_shorter_first),
    ),
]

CHECKPOINTED = Exercise(
    grade_id="ch10_checkpointed_forward",
    function="checkpointed_forward",
    reference=ref_checkpointing.checkpointed_forward.__wrapped__,
    cases=checkpoint_cases,
    observe=observe_checkpointed_forward,
    label=label_checkpointed,
    mistakes=CHECKPOINT_MISTAKES,
    prepare=_at_most_the_reference,
    hint="split the layers into `segments` consecutive groups (sizes differ by at most one, "
    "longer first) and pass each group's input through `checkpoint(run_group, x, "
    "use_reentrant=False)`, where `run_group` applies the group's layers in order.",
)
check_checkpointed_forward = CHECKPOINTED.check

EXERCISES = [ACCUMULATE, AMP, CHECKPOINTED]
