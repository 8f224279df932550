"""Run learner code in the strongest isolation this machine offers, within limits.

Layers, from always to where available:

1. A worker process per submission, in its own process group, that forks a child per exercise
   with resource limits: address space (a memory bomb fails inside the child), processes (a
   fork bomb stops at the cap), file size and CPU time. The grader kills the worker's group at
   the wall-clock limit, so a loop that swallows every exception still ends.
2. A scrubbed environment and an empty temporary working folder: no grader variables to detect.
3. A control group per submission (where the grader may make one, e.g. as root): at most
   ``processes`` processes and ``memory_mb`` for all it starts, and every one of them killed
   when the worker stops, even those that left its process group.
4. ``bwrap`` (bubblewrap): the file system read-only, the grading workspace and the course's
   sources hidden behind empty folders, no network but loopback, no capabilities, its own
   process ids (every process a job leaves behind is killed when the job ends). Without
   bubblewrap, ``unshare --net`` still removes the network.

What a department should add in production is written in the README's grader section.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from forge_course.grader import cgroup


@dataclass(frozen=True)
class Limits:
    seconds: float = 60.0  # wall clock for one exercise
    submission_seconds: float = 600.0  # wall clock for all of one submission's exercises
    memory_mb: int = 4096  # address space; torch alone maps about 1.5 GB of it
    processes: int = 64  # processes and threads a job may add (per sandbox user)
    file_mb: int = 64
    startup_seconds: float = 120.0  # the worker's own imports, not charged to the learner


@dataclass(frozen=True)
class Outcome:
    """What came back from one job."""

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


def _tasks_of(uid: int) -> int:
    """Processes and threads owned by ``uid`` now: what the kernel's process limit counts."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, KeyError, ValueError):
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
    return count


def _command(workdir: Path, hidden: list[Path], mode: str, limits: Limits, capped: bool):
    # The per-user process limit counts the grader's own processes too: allow for them, unless
    # a control group already caps the sandbox (root is exempt from the per-user limit anyway).
    own = 0 if capped or os.geteuid() == 0 else _tasks_of(os.getuid())
    job_limits = {
        "seconds": limits.seconds,
        "memory_mb": limits.memory_mb,
        "processes": limits.processes + own,
        "file_mb": limits.file_mb,
    }
    worker = [sys.executable, "-m", "forge_course.grader.worker", json.dumps(job_limits)]
    if mode == "bubblewrap":
        # The whole file system read-only (the course and its venv may live anywhere, /tmp
        # included), the worker's own folder writable, the grading files hidden below, and no
        # capabilities, so a grader running as root cannot be undone by unmounting them.
        command = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        command += ["--bind", str(workdir), str(workdir)]
        for path in hidden:
            if path.exists():
                command += ["--tmpfs", str(path)]
        command += ["--unshare-net", "--unshare-pid", "--die-with-parent", "--cap-drop", "ALL"]
        command += ["--chdir", str(workdir)]
        return command + worker + ["--own-pid-namespace"]
    if mode == "network namespace":  # loopback starts down there: the worker brings it up
        return ["unshare", "--net", *worker, "--loopback-up"]
    return worker


def _start_in(groups: list[Path]):
    def apply() -> None:
        os.setsid()  # its own process group: the grader kills the group at once
        cgroup.join(groups)

    return apply


def _environment(workdir: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "FORGE_DEVICE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    src = str(Path(__file__).resolve().parents[2])
    env.update(HOME=str(workdir), TMPDIR=str(workdir), PYTHONPATH=src, OMP_NUM_THREADS="1")
    env["MPLBACKEND"] = "Agg"
    return env


class Session:
    """One submission's sandbox: a warm worker that runs its jobs one by one.

    The worker imports torch once; each job runs in a child it forks. A job that overruns its
    time, or kills the worker, ends the worker: the next job starts a fresh one, so the other
    exercises are still graded. The time a worker spends starting is not charged to the learner.
    """

    def __init__(self, limits: Limits, hidden: list[Path], mode: str | None = None):
        self.limits, self.hidden, self.mode = limits, hidden, mode or isolation()
        self.spent = 0.0  # seconds of the submission's time limit used so far
        self.process: subprocess.Popen | None = None
        self._workdir = tempfile.TemporaryDirectory(prefix="forge-")
        self._groups = cgroup.make(limits.processes, limits.memory_mb)
        self._hits = 0
        self._jobs = 0

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self._stop()
        cgroup.remove(self._groups)
        self._workdir.cleanup()

    def _start(self) -> None:
        """Start a worker and wait until it is ready: a failure here is the grader's, not the
        learner's, so it stops the run instead of scoring anything."""
        workdir = Path(self._workdir.name)
        self.process = subprocess.Popen(
            _command(workdir, self.hidden, self.mode, self.limits, bool(self._groups)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            env=_environment(workdir),
            preexec_fn=_start_in(self._groups),
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.process, self._lines), daemon=True).start()
        try:
            ready = self._lines.get(timeout=self.limits.startup_seconds)
        except queue.Empty:
            ready = None
        if not (ready and json.loads(ready).get("ready")):
            self._stop()
            raise RuntimeError(f"the grading worker did not start ({' '.join(self.process.args)})")

    @staticmethod
    def _read(process: subprocess.Popen, lines: queue.Queue) -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    def _stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            cgroup.kill(self._groups)  # and whatever left the group with setsid
            self.process.wait()
            self.process = None

    def run(self, job: dict) -> Outcome:
        """Run one job within the exercise's and the submission's time limits."""
        left = self.limits.submission_seconds - self.spent
        if left <= 0:
            detail = f"the submission's {self.limits.submission_seconds:g} s were used up"
            return Outcome([], "timeout", detail)
        if self.process is None:
            self._start()
        budget = min(self.limits.seconds, left)
        self._jobs += 1
        job = {**job, "id": self._jobs}
        start = time.monotonic()
        reply = None
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
            while reply is None or reply.get("id") != job["id"]:
                line = self._lines.get(timeout=max(0.0, start + budget - time.monotonic()))
                if line is None:
                    break  # the worker itself is gone
                reply = json.loads(line)
        except queue.Empty:
            reply = None
        except BrokenPipeError:
            reply = None
        seconds = time.monotonic() - start
        self.spent += seconds
        if reply is None or reply.get("id") != job["id"]:
            self._stop()  # whatever it sent before it was stopped proves nothing
            outcome = Outcome([], "timeout", f"stopped after {budget:g} s", seconds)
            if seconds < budget:
                outcome = Outcome([], "crashed", "the grading worker ended", seconds)
        else:
            messages = _messages(reply["output"])
            outcome = Outcome(messages, "finished", "", seconds)
            if not any(m.get("done") for m in messages):
                outcome = Outcome(messages, *_why_it_died(reply["exit"], messages), seconds)
        hits, self._hits = self._hits, cgroup.limit_hits(self._groups)
        if self._hits > hits:  # the sandbox's process or memory cap refused something
            detail = "the submission went over its process or memory cap"
            return Outcome(outcome.messages, "resource limit", detail, seconds)
        return outcome


def _messages(output: str) -> list[dict]:
    messages = []
    for line in output.splitlines():
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue  # a stray write to the channel: ignored, it cannot forge a verdict
        if isinstance(message, dict):
            messages.append(message)
    return messages


def run(job: dict, limits: Limits, hidden: list[Path], mode: str | None = None) -> Outcome:
    """Run one job in a sandbox of its own."""
    with Session(limits, hidden, mode) as box:
        return box.run(job)


def _why_it_died(code: int, messages: list[dict]) -> tuple[str, str]:
    text = " ".join(str(m.get("error", "")) + str(m.get("mistake", "")) for m in messages)
    if "MemoryError" in text or code in (-signal.SIGKILL, -signal.SIGSEGV, -signal.SIGXCPU):
        return "resource limit", f"the worker exceeded a limit (exit {code})"
    return "crashed", f"the worker ended before finishing (exit {code})"
