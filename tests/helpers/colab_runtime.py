"""A Colab-like runtime on this machine: a venv pinned to Colab's packages, and its kernel.

`runtime()` builds the venv once and keeps it under ``build/colab-runtime/<key>/`` (ignored by
git), keyed by the hash of Colab's package list, so a new snapshot builds a new one. Colab's pip
is pinned too (from the full freeze), since it is pip's output that Colab reads. Torch is the
CPU wheel that pip finds on this machine; everything else comes from the package index.

The kernel starts as Colab's does: its start-up code has imported ipywidgets (7.7.1 in the
snapshot) before the learner's first cell, and ``google.colab.output`` is there (a stand-in
that records whether the custom widget manager was enabled). The course package is not
installed; `fresh` puts the venv back in that state.

Run as a script (``python tests/helpers/colab_runtime.py``) it builds the venv and prints where.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Colab's package lists (googlecolab/backend-info, pip-freeze.txt, snapshot of 2026-08-19).
SNAPSHOT = REPO / "tests" / "colab"
SUBSET = SNAPSHOT / "colab-subset.txt"
FREEZE = SNAPSHOT / "colab-pip-freeze.txt"
TORCH = "torch==2.13.0+cpu"  # Colab's torch is a CUDA build; this is the CPU wheel on this machine
# torch 2.13 asks for setuptools>=77.0.3; Colab's torch 2.11 does not, so its pin (75.2.0) goes.
UNPINNED = {"setuptools"}
KERNEL_NAME = "colab-like"

# What Colab's start-up code leaves in the kernel before the first cell runs.
STARTUP = '''\
"""Colab's kernel start-up, as far as the course can tell: ipywidgets imported, google.colab."""

import sys
import types

import ipywidgets  # noqa: F401  (Colab imports it at start-up: its version is the one loaded)

widget_manager_calls = []
output = types.ModuleType("google.colab.output")
output.enable_custom_widget_manager = lambda: widget_manager_calls.append("enabled")
output.calls = widget_manager_calls
colab = types.ModuleType("google.colab")
colab.output = output
sys.modules["google.colab"] = colab
sys.modules["google.colab.output"] = output
'''


@dataclass(frozen=True)
class Runtime:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    @property
    def kernels(self) -> Path:
        """The folder holding the kernel spec (for `KernelSpecManager.kernel_dirs`)."""
        return self.root / "kernels"

    def pip(self, *args: str, env: dict | None = None) -> str:
        done = subprocess.run(
            [str(self.python), "-m", "pip", *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"pip {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def versions(self) -> dict[str, str]:
        """Installed distributions of the venv: normalised name -> version."""
        listed = json.loads(self.pip("list", "--format=json"))
        return {normalise(d["name"]): d["version"] for d in listed}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    """The subset's pins (but `UNPINNED`), Colab's pip, and the CPU torch."""
    subset = [line.strip() for line in SUBSET.read_text().splitlines()]
    subset = [line for line in subset if line and not line.startswith("#")]
    kept = [line for line in subset if normalise(line.partition("==")[0]) not in UNPINNED]
    pip = next(line.strip() for line in FREEZE.read_text().splitlines() if line.startswith("pip=="))
    return [pip, *kept, TORCH]


def key() -> str:
    text = "\n".join([*pins(), f"python {sys.version_info[:2]}", STARTUP])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def runtime() -> Runtime:
    """The Colab-like venv and its kernel spec, built on first use."""
    rt = Runtime(REPO / "build" / "colab-runtime" / key())
    if (rt.root / ".ready").exists():
        return rt
    shutil.rmtree(rt.root, ignore_errors=True)
    rt.root.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", str(rt.root / "venv")], check=True)
    pip, *rest = pins()
    rt.pip("install", "--progress-bar=off", pip)
    rt.pip("install", "--progress-bar=off", *rest)
    startup = rt.root / "startup"
    startup.mkdir()
    (startup / "colab_startup.py").write_text(STARTUP)
    spec = rt.kernels / KERNEL_NAME
    spec.mkdir(parents=True)
    argv = [str(rt.python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    argv.append("--IPKernelApp.exec_lines=from colab_startup import widget_manager_calls")
    kernel = {
        "argv": argv,
        "display_name": "Python 3 (Colab-like)",
        "language": "python",
        "env": {"PYTHONPATH": str(startup)},
    }
    (spec / "kernel.json").write_text(json.dumps(kernel, indent=1))
    (rt.root / ".ready").write_text(json.dumps(rt.versions(), indent=1, sort_keys=True))
    return rt


def fresh(rt: Runtime) -> dict[str, str]:
    """Back to a first-time learner's runtime: the venv as built, the course package missing.

    Returns the installed versions. (A run that failed may have changed or added packages.)
    """
    built = json.loads((rt.root / ".ready").read_text())
    installed = rt.versions()
    extra = sorted(set(installed) - set(built))
    if extra:
        rt.pip("uninstall", "--yes", *extra)
    if any(installed.get(name) != version for name, version in built.items()):
        rt.pip(
            "install", "--progress-bar=off", "--no-deps", *(f"{n}=={v}" for n, v in built.items())
        )
    return rt.versions()


if __name__ == "__main__":
    built = runtime()
    print(built.root)
    print(json.dumps(built.versions(), indent=1))
