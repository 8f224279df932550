"""Chapter 10's learner half: build each case's model and batches, call the answer, report.

Where a check must see *how* the answer ran, not only what it left behind, the model carries
an instrument of the check's own: a `_Probe` at the end of a model notes the size and dtype of
every batch that reaches it (and, for accumulation, the order of forward and backward passes),
and a `_CountedBlock` counts its forward passes, notes which blocks backward recomputed
together, and notes whether the saved-tensor hooks in effect were the answer's own. After
every call the observer verifies that its instruments are still in place and untouched, and
says so in the observation.

Recomputation is judged by its outcome, not by those notes: a `_CountedBlock` adds to its
output a term worth zero whose gradient depends on when the block ran, so the gradients that
backward takes through a block recomputed during backward differ from those through a block
whose forward activations were kept. Whatever an answer does to the notes or to the
saved-tensor hooks, only recomputing gives the reference's gradients. After each call the
observer also checks that the answer left nothing else changed
(`forge_course.observe.ch04.Settings`).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointError

from forge_course.observe.ch04 import OwnDropout, Settings, halve_output
from forge_course.observe.common import INSTRUMENT_TAMPERED, Mistake, alone, call_answer

ACCUMULATE, AMP, CHECKPOINTED = (
    "ch10_accumulate_step", "ch10_amp_step", "ch10_checkpointed_forward",
)  # fmt: skip
TAMPERED = INSTRUMENT_TAMPERED


def _parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _plain(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class _Probe(nn.Module):
    """The identity, noting ``(batch size, dtype)`` of every tensor that passes through; given a
    list of ``passes``, it also notes there, in order, each forward pass and each backward pass
    that reaches the forward's output."""

    def __init__(self, passes: list | None = None):
        super().__init__()
        self.seen: list[tuple[int, str]] = []
        self.passes = passes

    def forward(self, x):
        self.seen.append((int(x.shape[0]), str(x.dtype)))
        passes = self.passes
        if passes is not None:
            passes.append("forward")
            if x.requires_grad:
                x.register_hook(lambda grad: passes.append("backward"))
        return x


def _probed(model: nn.Sequential, passes: list | None = None) -> tuple[nn.Sequential, _Probe, list]:
    probe = _Probe(passes)
    model.append(probe)  # last, so the parameters keep their names
    return model, probe, probe.seen


def _probe_intact(model: nn.Sequential, probe: _Probe, seen: list, passes=None) -> bool:
    """The probe is still the model's last module, unchanged, and still fills the same lists."""
    return (
        model[-1] is probe
        and type(probe) is _Probe
        and "forward" not in vars(probe)
        and not probe._forward_hooks
        and not probe._forward_pre_hooks
        and probe.seen is seen
        and probe.passes is passes
    )


# ---------------------------------------------------------------- ch10_accumulate_step


def label_accumulate(case: dict) -> str:
    clip = f", clipped to {case['clip']}" if case["clip"] is not None else ""
    return (f"micro-batch sizes {case['sizes']}{clip}, {case['optimizer']}, {case['dtype']}, "
            f"{case['device']}")  # fmt: skip


def _accumulate_setup(case: dict):
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    torch.manual_seed(case["seed"])
    # Dropout and a forward hook: a step in eval mode, or one that calls `model.forward`, shows.
    model = nn.Sequential(
        nn.Linear(4, 8), nn.Tanh(), OwnDropout(0.25, case["seed"]), nn.Linear(8, 2)
    )
    model.register_forward_hook(halve_output)
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
    return model, optimizer, nn.MSELoss(), groups


def observe_accumulate_step(fn, case: dict) -> dict:
    """Two updates from two groups of micro-batches: each returned value, the parameters, the
    size of every batch the model's forward saw (one forward per micro-batch, or not), and the
    order of the forward and backward passes (each micro-batch's backward before the next
    forward, so that only one micro-batch's graph is alive at a time, or not)."""
    model, optimizer, loss_fn, groups = _accumulate_setup(case)
    passes: list[str] = []
    model, probe, seen = _probed(model, passes)
    observed = {}
    for call, group in enumerate(groups, start=1):
        seen.clear()
        passes.clear()
        settings = Settings(model)
        returned = call_answer(
            ACCUMULATE, "accumulate_step", fn, model, optimizer, loss_fn, group, case["clip"],
            case=label_accumulate(case),
        )  # fmt: skip
        settings.check(ACCUMULATE, "accumulate_step", label_accumulate(case))
        observed[f"the value returned by call {call}"] = _plain(returned)
        observed[f"the parameters after call {call}"] = _parameters(model)
        intact = _probe_intact(model, probe, seen, passes)
        observed[f"the batch sizes the model's forward passes saw in call {call}"] = (
            [size for size, _ in seen] if intact else TAMPERED
        )
        observed[f"the order of the forward and backward passes in call {call}"] = (
            ", ".join(passes) if intact else TAMPERED
        )
    return observed


# ---------------------------------------------------------------- ch10_amp_step


class _ClaimsDevice(torch.Tensor):
    """A CPU tensor that says it lives on a CUDA device: a stand-in for a GPU's batch.

    Its arithmetic stays on the CPU, so on a machine without a GPU it still shows whether an
    answer takes autocast's device type from its input (``torch.autocast(x.device.type)``
    enters CUDA's autocast, which leaves CPU arithmetic in float32) or hard-codes the CPU's.
    """

    @property
    def device(self):
        return torch.device("cuda")

    @property
    def is_cuda(self):
        return True

    @property
    def is_cpu(self):
        return False

    def to(self, *args, **kwargs):
        # Moving a stand-in to the device it claims is a no-op, as it would be on that GPU.
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "cuda":
            return self if dtype is None else super().to(dtype=dtype, non_blocking=non_blocking)
        return super().to(*args, **kwargs)


def label_amp(case: dict) -> str:
    scaler = {
        "none": "no scaler",
        "given": "a GradScaler passed in",
        "overflow": "a GradScaler and an inf gradient",
    }[case["scaler"]]
    where = case["device"]
    if case.get("claims"):
        where = f"a CPU batch that says it is on {case['claims']} (a stand-in for a GPU)"
    return f"{where}, {case['optimizer']}, {scaler}"


def observe_amp_step(fn, case: dict) -> dict:
    """Two steps: the model's output dtype, the returned loss, the parameters, the scale."""
    device = torch.device(case["device"])
    torch.manual_seed(case["seed"])
    model = nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), OwnDropout(0.25, case["seed"]), nn.Linear(16, 3)
    )
    model.register_forward_hook(halve_output)
    model = model.to(device)
    params = model.parameters()
    optimizer = {
        "momentum": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        "adamw": lambda: torch.optim.AdamW(params, lr=0.01),
    }[case["optimizer"]]()
    scaler = None if case["scaler"] == "none" else torch.amp.GradScaler(device.type)
    if case["scaler"] == "overflow":
        # As if a scaled gradient had overflowed float16: the scaler must skip the update.
        model[0].weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    model, probe, seen = _probed(model)
    gen = torch.Generator().manual_seed(case["seed"])
    observed = {}
    for call in (1, 2):
        x = torch.randn(32, 8, generator=gen).to(device)
        y = torch.randint(0, 3, (32,), generator=gen).to(device)
        if case.get("claims"):
            x, y = x.as_subclass(_ClaimsDevice), y.as_subclass(_ClaimsDevice)
        seen.clear()
        settings = Settings(model)
        with warnings.catch_warnings():
            # A stand-in's CUDA autocast on a machine without CUDA: torch says it is disabled.
            warnings.filterwarnings("ignore", message="CUDA is not available")
            returned = call_answer(
                AMP, "amp_train_step", fn, model, optimizer, nn.CrossEntropyLoss(), x, y, scaler,
                case=label_amp(case),
            )  # fmt: skip
        settings.check(AMP, "amp_train_step", label_amp(case))
        dtypes = [dtype for _, dtype in seen] if _probe_intact(model, probe, seen) else None
        observed[f"the dtype of the model's output in call {call}"] = (
            TAMPERED if dtypes is None else dtypes[0] if dtypes else "the model never ran"
        )
        observed[f"the value returned by call {call}"] = _plain(returned)
        # Compared at bfloat16's precision, the coarser of the two: that is all AMP promises.
        observed[f"the parameters after call {call} (rounded to bfloat16)"] = {
            name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()
        }
        if scaler is not None:
            observed[f"the scaler's scale after call {call}"] = float(scaler.get_scale())
    return observed


# ---------------------------------------------------------------- ch10_checkpointed_forward

OWN_HOOKS = "the blocks ran under saved_tensors_hooks of the answer's own"
KEPT = "the bytes kept for backward (at most)"
RUNS_FORWARD = "how many times each block ran in the forward pass"
RUNS_BACKWARD = "how many times each block ran again during backward (recomputation)"
SEGMENTS = "the segments (the blocks backward recomputed together)"


UNKNOWN = "unknown"  # this torch cannot say which saved-tensor hooks are in effect


def _top_pack_hook():
    """The pack function of the innermost ``saved_tensors_hooks`` in effect, or None."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return UNKNOWN
    try:
        hooks = top(False)
    except TypeError:  # older torch: no argument
        hooks = top()
    return hooks[0] if hooks else None


def _drop_left_over(pack) -> None:
    """Take the check's hook off the stack if an answer left a hook of its own above it (the
    context manager's exit then removed that one instead of the check's)."""
    pop = getattr(torch._C._autograd, "_pop_saved_tensors_default_hooks", None)
    for _ in range(8):
        if pop is None or _top_pack_hook() is not pack:
            return
        pop()


def _is_checkpoints_own(pack) -> bool:
    return getattr(pack, "__module__", None) == "torch.utils.checkpoint"


# Which backward is running, -1 outside one; bound before any answer can replace it.
_graph_task = torch._C._current_graph_task_id
TILT = 0.01  # how much a block's gradient grows when it ran outside backward; twice inside


class _CountedBlock(nn.Sequential):
    """A block that counts its calls, notes whose saved-tensor hooks it ran under, and tilts its
    gradient by when it ran.

    Its output gains ``(out − out.detach())·w``: zero in value, but a factor ``1 + w`` on every
    gradient that backward takes through it, where ``w`` is a tensor autograd saves: ``TILT``
    when the call was in the forward pass, ``2·TILT`` when it was during a backward (a
    recomputation). Backward uses the saved ``w`` of the call whose activations it uses, so the
    gradients tell a block recomputed in backward from one whose activations were kept, and do
    not depend on how the blocks were grouped into segments.

    Under the check, a block's activations are saved either through the check's own hook
    (nothing checkpointed) or through ``torch.utils.checkpoint``'s (checkpointed). Any other
    hook innermost hides what the forward keeps from the check's count.

    Each call during a backward also appends the block's ``index`` to ``rerun``, a list the
    blocks share: backward recomputes one segment at a time, its blocks in order, the last
    segment first, so the list falls into the segments (`segments_rerun`).
    """

    def __init__(self, *layers, index: int = 0, rerun: list | None = None):
        super().__init__(*layers)
        self.runs, self.check_pack, self.foreign_hooks = 0, None, False
        self.index, self.rerun = index, rerun

    def forward(self, x):
        self.runs += 1
        if _graph_task() >= 0 and self.rerun is not None:
            self.rerun.append(self.index)
        pack = _top_pack_hook()
        theirs = pack not in (self.check_pack, UNKNOWN) and not _is_checkpoints_own(pack)
        if self.check_pack is not None and theirs and torch.is_grad_enabled():
            self.foreign_hooks = True
        out = super().forward(x)
        # A tensor, so that autograd saves it and checkpointing recomputes it: a plain number
        # would stay in the graph as the forward pass left it.
        tilt = torch.full((), TILT * (2 if _graph_task() >= 0 else 1), dtype=out.dtype,
                          device=out.device)  # fmt: skip
        return out + (out - out.detach()) * tilt


def _blocks_intact(blocks: list, rerun: list) -> bool:
    return all(
        type(b) is _CountedBlock
        and "forward" not in vars(b)
        and not b._forward_pre_hooks
        and b.index == index
        and b.rerun is rerun
        for index, b in enumerate(blocks)
    )


def segments_rerun(rerun: list[int]) -> str:
    """The blocks recomputed during backward, cut into the segments they ran in, first segment
    first: ``[4, 5, 2, 3, 0, 1]`` is ``"[0, 1] [2, 3] [4, 5]"``.

    A segment's blocks run in order and the segments in reverse (backward reaches the last one
    first), so a new segment starts wherever a block is not the one after the previous block.
    """
    segments: list[list[int]] = []
    for index in rerun:
        if segments and index == segments[-1][-1] + 1:
            segments[-1].append(index)
        else:
            segments.append([index])
    return " ".join(str(segment) for segment in reversed(segments))


def label_checkpointed(case: dict) -> str:
    grad = ", the input requires grad" if case["input_grad"] else ""
    return (f"{case['layers']} blocks in {case['segments']} segments, as a {case['container']}, "
            f"{case['dtype']}, {case['device']}{grad}")  # fmt: skip


def _checkpoint_setup(case: dict):
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    torch.manual_seed(case["seed"])
    width = 4
    rerun: list[int] = []
    blocks = [
        _CountedBlock(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width),
                      index=index, rerun=rerun).to(device=device, dtype=dtype)
        for index in range(case["layers"])
    ]  # fmt: skip
    layers = {
        "modulelist": nn.ModuleList,
        "sequential": lambda b: nn.Sequential(*b),
        "list": list,
    }[case["container"]](blocks)
    gen = torch.Generator().manual_seed(case["seed"])
    x = torch.randn(3, width, generator=gen, dtype=dtype).to(device)
    weights = torch.randn(3, width, generator=gen, dtype=dtype).to(device)
    return blocks, rerun, layers, x, weights


def _is_parameter(tensor: torch.Tensor) -> bool:
    # A view (weight.t(), weight[0]) points at the tensor that owns the memory through `_base`.
    owner = tensor._base if tensor._base is not None else tensor
    return isinstance(owner, nn.Parameter)


class _SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """Counts the distinct storages autograd saves for backward, parameters left out (the model
    holds them anyway), while the body runs."""

    def __init__(self):
        self.storages: dict[tuple[str, int], torch.UntypedStorage] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            if not _is_parameter(tensor):
                storage = tensor.untyped_storage()
                # Holding the storage keeps its address from being reused by a later tensor.
                self.storages[(str(tensor.device), storage.data_ptr())] = storage
            # A detached alias: an op that saves its own output would otherwise hold that
            # output through its grad_fn, a cycle that keeps the graph alive.
            return tensor.detach()

        self.pack = pack
        super().__init__(pack, lambda tensor: tensor)

    def total(self) -> int:
        return sum(storage.nbytes() for storage in self.storages.values())


def observe_checkpointed_forward(fn, case: dict) -> dict:
    """The output, the gradients it gives, the bytes it keeps, how often each block ran, and
    which blocks backward recomputed together (the segments)."""
    blocks, rerun, layers, x, weights = _checkpoint_setup(case)
    label = label_checkpointed(case)
    x_in = x.clone().requires_grad_(case["input_grad"])
    counting = _SavedBytes()
    for block in blocks:
        block.check_pack = counting.pack
    try:
        with alone(CHECKPOINTED), counting:
            settings = Settings()
            out = call_answer(CHECKPOINTED, "checkpointed_forward", fn, layers, x_in,
                              case["segments"], case=label)  # fmt: skip
            # The answer must leave the check's hook where it found it: innermost.
            hooks_kept = _top_pack_hook() in (counting.pack, UNKNOWN)
            settings.check(CHECKPOINTED, "checkpointed_forward", label)
    finally:
        _drop_left_over(counting.pack)
    if not isinstance(out, torch.Tensor):
        raise Mistake(
            CHECKPOINTED,
            f"the output should be a tensor, but `checkpointed_forward` returned "
            f"{type(out).__name__} (case: {label}). Return what the last segment gives.",
        )
    intact = _blocks_intact(blocks, rerun)
    in_forward = [block.runs for block in blocks]
    # How it ran comes first, so that a difference there is named before the gradients.
    seen = {
        "the output": out.detach().clone(),
        "the output needs grad": out.requires_grad,
        OWN_HOOKS: any(block.foreign_hooks for block in blocks) or not hooks_kept,
        KEPT: counting.total(),
        RUNS_FORWARD: in_forward if intact else TAMPERED,
    }
    if out.requires_grad:
        try:
            (out * weights).sum().backward()
        except CheckpointError as err:
            said = str(err).strip().splitlines()[0].removeprefix("torch.utils.checkpoint: ")
            raise Mistake(
                CHECKPOINTED,
                f"during backward, a segment's recomputation did not save what its forward pass "
                f"saved (case: {label}); torch says: {said}\n"
                "Likely mistake: the function given to `checkpoint` ran something else when "
                "backward called it again. One defined in a loop that reads the loop's variables "
                "(`group`, `start`) when it runs sees their values after the loop has ended. "
                "Bind them when the function is made: `def run_group(h, group=group)`, "
                "`functools.partial`, or `nn.Sequential(*group)`.",
            ) from None
    intact = intact and _blocks_intact(blocks, rerun)
    seen[RUNS_BACKWARD] = (
        [block.runs - ran for block, ran in zip(blocks, in_forward)] if intact else TAMPERED
    )
    for b, block in enumerate(blocks):
        for name, p in block.named_parameters():
            seen[f"the gradient of block {b}'s {name}"] = _plain(p.grad)
    if case["input_grad"]:
        seen["the gradient of the input"] = _plain(x_in.grad)
    # Last, so that where the gradients differ too, they are named first.
    seen[SEGMENTS] = segments_rerun(rerun) if intact else TAMPERED
    return seen
