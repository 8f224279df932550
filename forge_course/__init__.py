"""forge_course: references, simulations and checks for the PyTorch training-loop course."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["available_devices", "pick_device", "tolerance", "__version__"]

# The device helpers need torch; imported when first used, so the parts of the package that do
# not (the release, the LMS collector, `forge-course lab`'s checks) import on any Python, torch
# or not.
_DEVICE_HELPERS = {"available_devices", "pick_device", "tolerance"}


def __getattr__(name: str):
    if name in _DEVICE_HELPERS:
        from forge_course import device

        return getattr(device, name)
    raise AttributeError(f"module 'forge_course' has no attribute {name!r}")
