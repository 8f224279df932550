"""Run the worker in the strongest isolation this machine offers, within time and memory limits.

Layers, from always to where available:

1. A separate process in its own session, with resource limits: address space (a memory bomb
   fails inside the worker), number of processes (a fork bomb stops at the cap), file size and
   CPU time. The grader kills the whole process group at the wall-clock limit, so a loop that
   swallows every exception still ends.
2. A scrubbed environment and an empty temporary working folder: no grader variables to detect.
3. ``bwrap`` (bubblewrap): the file system read-only, the grading workspace and the course's
   sources hidden behind empty folders, no network, its own process ids. Without bubblewrap,
   ``unshare --net`` still removes the network.

What a department should add in production is written in the README's grader section.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    seconds: float = 60.0  # wall clock for one exercise, imports included
    memory_mb: int = 4096  # address space; torch alone maps about 1.5 GB of it
    processes: int = 512  # per user: counts the grader's own, so not tiny
    file_mb: int = 64


@dataclass(frozen=True)
class Outcome:
    """What came back from one worker run."""

    messages: list[dict]
    status: str  # "finished", "timeout", "resource limit" or "crashed"
    detail: str = ""
    seconds: float = 0.0


def isolation() -> str:
    """The strongest isolation available here: "bubblewrap", "network namespace" or "process"."""
    if shutil.which("bwrap") and _works(["bwrap", "--ro-bind", "/", "/", "true"]):
        return "bubblewrap"
    if shutil.which("unshare") and _works(["unshare", "--net", "true"]):
        return "network namespace"
    return "process"


def _works(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _command(workdir: Path, hidden: list[Path], mode: str) -> list[str]:
    worker = [sys.executable, "-m", "forge_course.grader.worker"]
    if mode == "bubblewrap":
        # The whole file system read-only (the course and its venv may live anywhere, /tmp
        # included), the worker's own folder writable, the grading files hidden below.
        command = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        command += ["--bind", str(workdir), str(workdir)]
        for path in hidden:
            if path.exists():
                command += ["--tmpfs", str(path)]
        command += ["--unshare-net", "--unshare-pid", "--die-with-parent", "--chdir", str(workdir)]
        return command + worker
    if mode == "network namespace":
        return ["unshare", "--net", *worker]
    return worker


def _limit(limits: Limits):
    def apply() -> None:
        os.setsid()
        memory = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
        size = limits.file_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        cpu = int(limits.seconds) + 5
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))

    return apply


def _environment(workdir: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "FORGE_DEVICE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    src = str(Path(__file__).resolve().parents[2])
    env.update(HOME=str(workdir), TMPDIR=str(workdir), PYTHONPATH=src, OMP_NUM_THREADS="1")
    env["MPLBACKEND"] = "Agg"
    return env


def run(job: dict, limits: Limits, hidden: list[Path], mode: str | None = None) -> Outcome:
    """Run one job in a fresh worker and collect its messages, enforcing ``limits``."""
    mode = mode or isolation()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="forge-worker-") as tmp:
        workdir = Path(tmp)
        process = subprocess.Popen(
            _command(workdir, hidden, mode),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            env=_environment(workdir),
            preexec_fn=_limit(limits),
            text=True,
        )
        try:
            stdout, _ = process.communicate(json.dumps(job), timeout=limits.seconds)
            status = "finished"
        except subprocess.TimeoutExpired:
            _kill(process)
            stdout, _ = process.communicate()
            status = "timeout"
        messages = []
        for line in stdout.splitlines():
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue  # a stray write to the channel: ignored, it cannot forge a verdict
            if isinstance(message, dict):
                messages.append(message)
        seconds = time.monotonic() - start
        if status == "timeout":
            return Outcome(messages, status, f"stopped after {limits.seconds:g} s", seconds)
        if any(m.get("done") for m in messages):
            return Outcome(messages, "finished", "", seconds)
        return Outcome(messages, *_why_it_died(process.returncode, messages), seconds)


def _why_it_died(code: int, messages: list[dict]) -> tuple[str, str]:
    text = " ".join(str(m.get("error", "")) + str(m.get("mistake", "")) for m in messages)
    if "MemoryError" in text or code in (-signal.SIGKILL, -signal.SIGSEGV, -signal.SIGXCPU):
        return "resource limit", f"the worker exceeded a limit (exit {code})"
    return "crashed", f"the worker ended before finishing (exit {code})"


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
