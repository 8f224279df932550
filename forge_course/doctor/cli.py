"""``forge-course doctor path/to/script.py:fit``: examine a training function from the shell."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from forge_course.doctor.examine import Fit, diagnose


def load_function(target: str) -> Fit:
    """Import ``path/to/script.py[:name]`` by path; return its function `name` (default `fit`).

    The script runs as a module that is not ``__main__``, so its ``if __name__ == "__main__":``
    block stays quiet; its own folder is importable while it loads, as with ``python script.py``.
    """
    path_text, _, name = target.rpartition(":") if ":" in target else (target, "", "fit")
    path = Path(path_text)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"_doctor_target_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    # Registered like any import, so dataclasses and pickling inside the script find it.
    sys.modules[spec.name] = module
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.resolve().parent))
    fit = getattr(module, name or "fit", None)
    if not callable(fit):
        raise AttributeError(f"{path} defines no function {name or 'fit'!r}")
    return fit


def main(argv: list[str] | None = None) -> int:
    """Examine a function in a file; exit 0 if nothing is found, 1 if something is, 2 on errors."""
    parser = argparse.ArgumentParser(
        prog="forge-course doctor",
        description="Run a training function fit(model, optimizer, loss_fn, train_loader, "
        "val_loader, epochs, device) on a small problem and name the silent bugs it shows.",
    )
    parser.add_argument("target", help="path/to/script.py:function (the function defaults to fit)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs to run (default 2)")
    parser.add_argument("--device", default=None, help="device to ask for (default: the best one)")
    args = parser.parse_args(argv)
    try:
        fit = load_function(args.target)
    except Exception as exc:  # the script may fail in any way while it is imported
        print(f"forge-course doctor: cannot load {args.target}: {exc}", file=sys.stderr)
        return 2
    report = diagnose(fit, epochs=args.epochs, device=args.device)
    print(report)
    return 0 if report.ok else 1
