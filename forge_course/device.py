"""Which device to train on, which devices to test on, and how close is close enough.

Course code never writes `.cuda()`: it asks `pick_device()` once and passes the result around.
Tests call `available_devices()` and compare on each, with `tolerance(dtype, device)`.
"""

from __future__ import annotations

import os

import torch

__all__ = ["pick_device", "available_devices", "tolerance", "describe"]


def _mps_ready() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())


def pick_device() -> torch.device:
    """The best device present: CUDA, then Apple MPS, then CPU.

    Set the environment variable ``FORGE_DEVICE`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``) to
    choose one yourself, for example to compare a run on the CPU with the GPU.
    """
    wanted = os.environ.get("FORGE_DEVICE", "").strip()
    if wanted:
        device = torch.device(wanted)
        if device.type not in {d.type for d in _present()}:
            raise RuntimeError(f"FORGE_DEVICE={wanted!r} is not available on this machine.")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_ready():
        return torch.device("mps")
    return torch.device("cpu")


def _present() -> list[torch.device]:
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    if _mps_ready():
        devices.append(torch.device("mps"))
    return devices


def available_devices() -> list[torch.device]:
    """Every device a test should run on: the CPU first, then each GPU present.

    ``FORGE_DEVICE=cpu`` (or ``cuda``, ``mps``) limits the list to the CPU and that device, so
    that a grader told ``--device cpu`` checks on the CPU alone, as its workers do.
    """
    wanted = os.environ.get("FORGE_DEVICE", "").strip()
    kind = torch.device(wanted).type if wanted else None
    devices = [torch.device("cpu")]
    if torch.cuda.is_available() and kind in (None, "cuda"):
        devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    if _mps_ready() and kind in (None, "mps"):
        devices.append(torch.device("mps"))
    return devices


# (rtol, atol) for comparing a learner's result with the reference computed the same way.
# Same arithmetic on the CPU agrees to rounding; GPUs may reorder sums (and use TF32 for
# float32 matmuls on Ampere and later), so they get more room.
_TOLERANCES = {
    (torch.float64, "cpu"): (1e-7, 1e-9),
    (torch.float32, "cpu"): (1e-5, 1e-6),
    (torch.float16, "cpu"): (1e-3, 1e-3),
    (torch.bfloat16, "cpu"): (1.6e-2, 1e-2),
    (torch.float64, "gpu"): (1e-7, 1e-9),
    (torch.float32, "gpu"): (1e-3, 1e-4),
    (torch.float16, "gpu"): (1e-3, 1e-3),
    (torch.bfloat16, "gpu"): (1.6e-2, 1e-2),
}


def tolerance(dtype: torch.dtype, device: torch.device | str = "cpu") -> dict[str, float]:
    """Keyword arguments for `torch.testing.assert_close` / `torch.allclose` at a dtype and device.

    Example: ``torch.testing.assert_close(a, b, **tolerance(a.dtype, a.device))``.
    """
    kind = "cpu" if torch.device(device).type == "cpu" else "gpu"
    rtol, atol = _TOLERANCES.get((dtype, kind), (1e-5, 1e-6))
    return {"rtol": rtol, "atol": atol}


def describe(device: torch.device | None = None) -> str:
    """One line naming the device and the torch build, for figure captions and benchmark tables."""
    device = device or pick_device()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = "Apple MPS"
    else:
        threads = torch.get_num_threads()
        name = f"CPU, {threads} thread{'s' if threads != 1 else ''}"
    return f"{device} ({name}), torch {torch.__version__}"
