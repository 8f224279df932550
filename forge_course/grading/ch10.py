"""Checks for chapter 10, "Scaling on one device".

Exercises:
    ch10_accumulate_step: ``accumulate_step(model, optimizer, loss_fn, micro_batches,
        max_grad_norm=None) -> float``, one update equal to one step on the whole batch.
    ch10_amp_step: ``amp_train_step(model, optimizer, loss_fn, x, y, scaler=None) -> float``.
    ch10_checkpointed_forward: ``checkpointed_forward(layers, x, segments) -> Tensor``.
Questions:
    ch10_q_tail_weight, ch10_q_scaler, ch10_q_saved_bytes.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, Mistake, call_answer, grading_seed
from forge_course.reference import accumulation as ref_accumulation
from forge_course.reference import amp as ref_amp
from forge_course.reference import checkpointing as ref_checkpointing
from forge_course.reference.memory import saved_activation_bytes


def _devices_and_seeds(thorough: bool):
    seed = grading_seed() if thorough else 0
    devices = available_devices() if thorough else [torch.device("cpu")]
    return seed, devices


def _parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _plain(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


# ---------------------------------------------------------------- ch10_accumulate_step


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


def _accumulate_setup(case: dict):
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    torch.manual_seed(case["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model = model.to(device=device, dtype=dtype)
    params = model.parameters()
    optimizer = {
        "sgd": lambda: torch.optim.SGD(params, lr=0.1),
        "momentum": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        "adamw": lambda: torch.optim.AdamW(params, lr=0.05, weight_decay=0.1),
    }[case["optimizer"]]()
    gen = torch.Generator().manual_seed(case["seed"])
    groups = []
    for _ in range(2):
        group = []
        for size in case["sizes"]:
            x = torch.randn(size, 4, generator=gen, dtype=dtype)
            y = torch.randn(size, 2, generator=gen, dtype=dtype)
            group.append((x.to(device), y.to(device)))
        groups.append(group)
    return model, optimizer, torch.nn.MSELoss(), groups


def _accumulate_label(case: dict) -> str:
    clip = f", clipped to {case['clip']}" if case["clip"] is not None else ""
    return (f"micro-batch sizes {case['sizes']}{clip}, {case['optimizer']}, {case['dtype']}, "
            f"{case['device']}")  # fmt: skip


def observe_accumulate_step(fn, case: dict) -> dict:
    """Two updates from two groups of micro-batches: each returned value and the parameters."""
    model, optimizer, loss_fn, groups = _accumulate_setup(case)
    seen = {}
    for call, group in enumerate(groups, start=1):
        returned = call_answer(
            "ch10_accumulate_step", "accumulate_step", fn, model, optimizer, loss_fn, group,
            case["clip"], case=_accumulate_label(case),
        )  # fmt: skip
        seen[f"the value returned by call {call}"] = _plain(returned)
        seen[f"the parameters after call {call}"] = _parameters(model)
    return seen


def _wrong_accumulate(*, one_over_k=False, clip_each=False, zero_grad=True, plain_mean=False):
    def wrong(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
        total = sum(len(x) for x, _ in micro_batches)
        if zero_grad:
            optimizer.zero_grad()
        losses, weighted = [], 0.0
        for x, y in micro_batches:
            loss = loss_fn(model(x), y)
            weight = 1 / len(micro_batches) if one_over_k else len(x) / total
            (loss * weight).backward()
            if clip_each and max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            losses.append(loss.item())
            weighted += loss.item() * len(x) / total
        if not clip_each and max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        return sum(losses) / len(losses) if plain_mean else weighted

    return wrong


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
]

ACCUMULATE = Exercise(
    grade_id="ch10_accumulate_step",
    function="accumulate_step",
    reference=ref_accumulation.accumulate_step.__wrapped__,
    cases=accumulate_cases,
    observe=observe_accumulate_step,
    label=_accumulate_label,
    mistakes=ACCUMULATE_MISTAKES,
    hint="zero_grad, then for each micro-batch backward of loss·n_i/N, then clip once (if asked), "
    "step once, and return the n_i/N-weighted mean loss as a float.",
)
check_accumulate_step = ACCUMULATE.check


# ---------------------------------------------------------------- ch10_amp_step


def amp_cases(thorough: bool = False) -> list[dict]:
    """CPU with the device's own scaler (none); thorough adds AdamW, a scaler, an overflow."""
    if not thorough:
        return [{"device": "cpu", "optimizer": "momentum", "scaler": "auto", "seed": 0}]
    seed, devices = _devices_and_seeds(thorough)
    cases = []
    for i, device in enumerate(devices):
        plans = [("momentum", "auto"), ("adamw", "auto"), ("momentum", "overflow")]
        if device.type == "cpu":
            plans.append(("adamw", "given"))  # a scaler passed on the CPU must still be used
        for j, (optimizer, scaler) in enumerate(plans):
            cases.append({"device": str(device), "optimizer": optimizer, "scaler": scaler,
                          "seed": seed + 10 * i + j})  # fmt: skip
    return cases


def _amp_label(case: dict) -> str:
    scaler = {
        "auto": "the device's scaler (None on the CPU)",
        "given": "a GradScaler passed in",
        "overflow": "a GradScaler and an inf gradient",
    }[case["scaler"]]
    return f"{case['device']}, {case['optimizer']}, {scaler}"


def observe_amp_step(fn, case: dict) -> dict:
    """Two steps: the returned loss, the model's output dtype, the parameters, the scale."""
    device = torch.device(case["device"])
    torch.manual_seed(case["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model = model.to(device)
    params = model.parameters()
    optimizer = {
        "momentum": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        "adamw": lambda: torch.optim.AdamW(params, lr=0.01),
    }[case["optimizer"]]()
    if case["scaler"] == "auto":
        scaler = ref_amp.make_scaler.__wrapped__(device)
    else:
        scaler = torch.amp.GradScaler(device.type)
    if case["scaler"] == "overflow":
        # As if a scaled gradient had overflowed float16: the scaler must skip the update.
        model[0].weight.register_hook(lambda grad: torch.full_like(grad, math.inf))
    dtypes = []
    model.register_forward_hook(lambda module, args, out: dtypes.append(str(out.dtype)))
    gen = torch.Generator().manual_seed(case["seed"])
    rounded = ref_amp.autocast_dtype.__wrapped__(device)
    seen = {}
    for call in (1, 2):
        x = torch.randn(32, 8, generator=gen).to(device)
        y = torch.randint(0, 3, (32,), generator=gen).to(device)
        dtypes.clear()
        returned = call_answer(
            "ch10_amp_step", "amp_train_step", fn, model, optimizer, torch.nn.CrossEntropyLoss(),
            x, y, scaler, case=_amp_label(case),
        )  # fmt: skip
        seen[f"the dtype of the model's output in call {call}"] = dtypes[0] if dtypes else None
        seen[f"the value returned by call {call}"] = _plain(returned)
        # Compared at the precision the forward pass ran in: that is all AMP promises.
        seen[f"the parameters after call {call} (rounded to {str(rounded)[6:]})"] = {
            name: p.detach().to(rounded) for name, p in model.named_parameters()
        }
        if scaler is not None:
            seen[f"the scaler's scale after call {call}"] = float(scaler.get_scale())
    return seen


def _wrong_amp(*, autocast=True, dtype=None, use_scaler=True):
    def wrong(model, optimizer, loss_fn, x, y, scaler=None):
        optimizer.zero_grad()
        kind = x.device.type
        low = dtype or (torch.bfloat16 if kind == "cpu" else torch.float16)
        with torch.autocast(kind, dtype=low, enabled=autocast):
            loss = loss_fn(model(x), y)
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
]

AMP = Exercise(
    grade_id="ch10_amp_step",
    function="amp_train_step",
    reference=ref_amp.amp_train_step.__wrapped__,
    cases=amp_cases,
    observe=observe_amp_step,
    label=_amp_label,
    mistakes=AMP_MISTAKES,
    hint="zero_grad; forward and loss under autocast with the device's dtype; then either "
    "loss.backward() and optimizer.step(), or, with a scaler, scale/backward, step, update; "
    "return loss.item().",
)
check_amp_step = AMP.check


# ---------------------------------------------------------------- ch10_checkpointed_forward


def checkpoint_cases(thorough: bool = False) -> list[dict]:
    """6 blocks in 3 segments; thorough adds uneven splits, 1 and N segments, float64, devices."""
    base = {"device": "cpu", "dtype": "float32", "input_grad": False, "container": "modulelist"}
    if not thorough:
        return [{**base, "layers": 6, "segments": 3, "seed": 0}]
    seed, devices = _devices_and_seeds(thorough)
    plans = [
        (6, 3, "float32", False, "modulelist"),
        (5, 2, "float64", False, "list"),
        (7, 3, "float32", True, "sequential"),
        (4, 1, "float64", False, "modulelist"),
        (4, 4, "float32", True, "list"),
        (10, 4, "float64", False, "modulelist"),
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


def _checkpoint_label(case: dict) -> str:
    grad = ", the input requires grad" if case["input_grad"] else ""
    return (f"{case['layers']} blocks in {case['segments']} segments, as a {case['container']}, "
            f"{case['dtype']}, {case['device']}{grad}")  # fmt: skip


def _checkpoint_setup(case: dict):
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    torch.manual_seed(case["seed"])
    width = 4
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                            torch.nn.Linear(4 * width, width)).to(device=device, dtype=dtype)
        for _ in range(case["layers"])
    ]  # fmt: skip
    layers = {
        "modulelist": torch.nn.ModuleList,
        "sequential": lambda b: torch.nn.Sequential(*b),
        "list": list,
    }[case["container"]](blocks)
    gen = torch.Generator().manual_seed(case["seed"])
    x = torch.randn(3, width, generator=gen, dtype=dtype).to(device)
    weights = torch.randn(3, width, generator=gen, dtype=dtype).to(device)
    return blocks, layers, x, weights


def observe_checkpointed_forward(fn, case: dict) -> dict:
    """The output, the gradients it gives, and the bytes it keeps (at most the reference's)."""
    blocks, layers, x, weights = _checkpoint_setup(case)
    label = _checkpoint_label(case)

    def run(inp):
        return call_answer("ch10_checkpointed_forward", "checkpointed_forward", fn, layers, inp,
                           case["segments"], case=label)  # fmt: skip

    x_in = x.clone().requires_grad_(case["input_grad"])
    out = run(x_in)
    if not isinstance(out, torch.Tensor):
        raise Mistake(
            "ch10_checkpointed_forward",
            f"the output should be a tensor, but `checkpointed_forward` returned "
            f"{type(out).__name__} (case: {label}). Return what the last segment gives.",
        )
    seen = {"the output": out.detach().clone(), "the output needs grad": out.requires_grad}
    if out.requires_grad:
        (out * weights).sum().backward()
    for b, block in enumerate(blocks):
        for name, p in block.named_parameters():
            seen[f"the gradient of block {b}'s {name}"] = _plain(p.grad)
    if case["input_grad"]:
        seen["the gradient of the input"] = _plain(x_in.grad)
    budget = saved_activation_bytes(
        ref_checkpointing.checkpointed_forward.__wrapped__, layers, x, case["segments"]
    )
    kept = saved_activation_bytes(run, x.clone().requires_grad_(case["input_grad"]))
    # At most the reference's bytes is as good as the reference: report the budget then.
    seen["the bytes kept for backward (at most)"] = max(kept, budget)
    return seen


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
]

CHECKPOINTED = Exercise(
    grade_id="ch10_checkpointed_forward",
    function="checkpointed_forward",
    reference=ref_checkpointing.checkpointed_forward.__wrapped__,
    cases=checkpoint_cases,
    observe=observe_checkpointed_forward,
    label=_checkpoint_label,
    mistakes=CHECKPOINT_MISTAKES,
    hint="split the layers into `segments` consecutive groups (sizes differ by at most one, "
    "longer first) and pass each group's input through `checkpoint(run_group, x, "
    "use_reentrant=False)`, where `run_group` applies the group's layers in order.",
)
check_checkpointed_forward = CHECKPOINTED.check

EXERCISES = [ACCUMULATE, AMP, CHECKPOINTED]
