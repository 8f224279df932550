"""forge_course: references, simulations and checks for the PyTorch training-loop course."""

from forge_course.device import available_devices, pick_device, tolerance

__version__ = "0.1.0"
__all__ = ["available_devices", "pick_device", "tolerance", "__version__"]
