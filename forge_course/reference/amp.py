"""Automatic mixed precision: the forward pass in 16 bits, the weights and the update in 32.

Under ``torch.autocast`` each operation picks its own precision from per-device lists: matrix
multiplications and convolutions run in a 16-bit type, and losses run in float32 on every device.
Softmax, ``log_softmax``, sums and ``layer_norm`` are on CUDA's float32 list but not on the
CPU's: there they keep their input's type, so after a bfloat16 matmul they come out in bfloat16.
Every operation on no list also keeps its input's type. The parameters stay float32 throughout
(never call ``model.half()`` for AMP), so the optimizer updates full-precision weights.

Which 16-bit type
    float16 has 10 mantissa bits but only 5 exponent bits: its smallest positive value is about
    6e-8, so small gradients round to zero (underflow). bfloat16 has float32's 8 exponent bits
    and only 7 mantissa bits: coarser, but it reaches down to about 1e-38 as float32 does.
    Which one to train in depends on the hardware: bfloat16 on NVIDIA GPUs from Ampere on
    (``torch.cuda.is_bf16_supported(including_emulation=False)``) and on CPUs with bfloat16
    instructions (AVX512-BF16, AMX), with no scaler; float16 with a ``GradScaler`` on older
    GPUs; on a CPU without bfloat16 instructions autocast's bfloat16 is computed through float32
    and is slower than float32 itself. This module follows autocast's own defaults instead, the
    same on every machine so that chapter 10's check compares one thing: float16 on CUDA and
    Apple MPS, bfloat16 on the CPU.

Why float16 needs a ``GradScaler`` and bfloat16 does not
    The scaler multiplies the loss by a large factor ``S`` (65536 to start) before ``backward``,
    so every gradient is ``S`` times larger and clears float16's underflow limit; it divides
    ``S`` back out (``unscale_``) before the update. If a scaled gradient overflowed to inf or
    nan, ``scaler.step`` skips the update and ``scaler.update`` halves ``S``; after 2000 clean
    steps in a row it doubles ``S`` again. bfloat16 has no underflow problem to solve, so it gets no
    scaler: `make_scaler` returns ``None`` for it.

Knowing when an update was skipped
    ``scaler.update`` lowers the scale exactly when it found an inf or nan, and it only ever
    lowers it for that reason, so a skipped update shows as a scale that went down. Read
    ``scaler.get_scale()`` before the step and ask `step_was_skipped` afterwards. A run that
    skips every step is not training; a few skips while the scale calibrates are normal.

Is it faster?
    On GPUs with tensor cores, large 16-bit matrix multiplications run much faster and the
    activations they save take half the memory. On a CPU without bfloat16 instructions,
    autocast gives the same numbers to bfloat16 precision but is slower (chapter 10 measures
    by how much on the learner's device): measure before claiming.
"""

from __future__ import annotations

import torch

from forge_course.reference.guard import reference

__all__ = ["autocast_dtype", "make_scaler", "amp_train_step", "step_was_skipped"]


@reference
def autocast_dtype(device: torch.device | str) -> torch.dtype:
    """Autocast's own default 16-bit type on ``device`` (a ``torch.device`` or a string).

    float16 on CUDA and MPS, bfloat16 on the CPU; any other device type gets torch's own
    autocast default for it. Not a recommendation: a GPU that runs bfloat16 is better served by
    it (no scaler needed), as the module's docstring says.
    """
    kind = torch.device(device).type
    if kind in ("cuda", "mps"):
        return torch.float16
    if kind == "cpu":
        return torch.bfloat16
    return torch.get_autocast_dtype(kind)


@reference
def make_scaler(device: torch.device | str) -> torch.amp.GradScaler | None:
    """A fresh ``GradScaler`` where autocast runs in float16 on ``device``, else ``None``.

    Create it once, before the loop: its scale adapts from one step to the next.
    """
    kind = torch.device(device).type
    if autocast_dtype(kind) == torch.float16:
        return torch.amp.GradScaler(kind)
    return None


@reference
def amp_train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    scaler: torch.amp.GradScaler | None = None,
    max_grad_norm: float | None = None,
    dtype: torch.dtype | None = None,
) -> float:
    """One optimizer update with the forward pass and loss under autocast.

    Args:
        model: a float32 model on ``x``'s device.
        optimizer: the optimizer over ``model``'s parameters.
        loss_fn: the loss; it runs under autocast too, which keeps losses in float32.
        x: the input batch; autocast runs on its device type.
        y: the targets.
        scaler: the run's ``GradScaler`` (from `make_scaler`), or ``None`` for plain backward.
        max_grad_norm: if given, the (unscaled) gradient's total 2-norm is clipped to it.
        dtype: the 16-bit type autocast runs in; `autocast_dtype` of ``x``'s device if None
            (pass ``torch.bfloat16`` on a GPU that runs it: then no scaler is needed).

    Returns:
        The batch's loss as a Python float. With a scaler the update may have been skipped; see
        `step_was_skipped`.
    """
    optimizer.zero_grad()
    with torch.autocast(x.device.type, dtype=dtype or autocast_dtype(x.device)):
        loss = loss_fn(model(x), y)
    # Backward runs outside autocast: each operation's backward uses the type its forward used.
    if scaler is None:
        loss.backward()
    else:
        scaler.scale(loss).backward()
        # Divide the scale back out now, so clipping sees the true gradients, not S times them.
        scaler.unscale_(optimizer)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)  # calls optimizer.step() only if no gradient is inf or nan
        scaler.update()
    return loss.item()


def step_was_skipped(scaler: torch.amp.GradScaler | None, scale_before: float) -> bool:
    """Whether the scaler skipped the last update because a gradient was inf or nan.

    Args:
        scaler: the ``GradScaler`` used for the step, or ``None`` (no scaler never skips).
        scale_before: ``scaler.get_scale()`` read just before the step.

    Returns:
        True if the scale went down in ``scaler.update()``, which happens exactly when the
        update was skipped.

    Example::

        before = scaler.get_scale()
        loss = amp_train_step(model, optimizer, loss_fn, x, y, scaler)
        if step_was_skipped(scaler, before):
            skipped += 1
    """
    return scaler is not None and scaler.get_scale() < scale_before
