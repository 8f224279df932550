"""Run learner code in the strongest isolation this machine offers, within limits.

The sandbox holds nothing worth stealing: the worker runs from a staged copy of the few modules
it may import (`WORKER_FILES`: the learner half of the checks, the codec, the device helpers
and the course's data), never from the course's folder, and the references, the expected
values, the hidden tests, the gradebook and the class stay outside it.

Layers:

1. ``bwrap`` (bubblewrap), required unless the instructor says ``--unsafe``: a file system made
   of an allow-list (the system's libraries, the interpreter, its site-packages and the staged
   modules; everything read-only, bwrap's own root and /dev included, but a size-capped ``/tmp``
   and ``/dev/shm`` of its own, emptied after every job; device nodes no job can change:
   `copy_devices`), no network but its own loopback, its own process ids, IPC objects and
   host name, its own user namespace (``nobody`` inside), no capabilities, even when the
   grader is root, and a seccomp filter (`seccomp`) that refuses ptrace, mounts, namespaces
   and keyrings. Whatever a job leaves running is killed and its files removed before the
   next job.
2. A control group per submission where the grader may make one (as root): at most
   ``processes`` processes and threads and ``memory_mb`` of resident memory for everything the
   submission starts, its CPU time accounted, and every process killed when it stops. The
   warm worker, which serves one submission after another, joins each submission's group
   while it grades it.
3. Per job: a fresh child of a warm worker with process limits (open files, file size, CPU
   time), a wall-clock limit the grader enforces by killing the worker, and totals per
   submission checked while it runs by the worker's watcher (`worker.Watch`), which learner
   code cannot write to: wall time, CPU seconds across its processes, files and bytes in its
   tmpfs, open files across its processes, processes and threads. Their peaks come back
   with each answer (`Outcome.peaks`, `Session.peaks`): `benchmarks/limits.py` measures what
   every chapter's solution uses against `Limits`.
4. A scrubbed environment (nothing says "grader"), the interpreter in isolated mode (``-I``).

Without bubblewrap (``--unsafe``), ``unshare --net`` still removes the network where it can; the
other layers remain, but learner code runs as the grader's user and can read what it can read.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import shutil
import signal
import stat as statmod
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from forge_course.grader import cgroup, seccomp
from forge_course.grader.worker import MAX_OUTPUT, Watch

PACKAGE = Path(__file__).resolve().parents[1]
# The only parts of forge_course a grading worker can import: none holds an answer (the loop
# doctor is an instrument: it runs the learner's loop and names what it sees).
WORKER_FILES = (
    "__init__.py", "device.py", "ports.py", "data", "observe", "doctor", "sims/__init__.py",
    "sims/display.py", "grader/__init__.py", "grader/worker.py", "grader/codec.py",
)  # fmt: skip
STAGE_IN_SANDBOX = "/opt/forge"
NOBODY = 65534
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")  # what `bwrap --dev` binds
# The longest reply a worker writes: a job's output (at most MAX_OUTPUT bytes) spelled as JSON,
# each byte at most 6 characters (\u0000), and the reply's own fields. A longer line is not read.
MAX_LINE = 6 * MAX_OUTPUT + 2**20
TOO_LONG = "a line longer than MAX_LINE"  # what `_read_lines` queues in its place
MAX_SAID = 64 * 2**10  # the worker's stderr kept, to explain a worker that did not start
CHUNK = 2**16
# Each tmpfs holds this much more than the disk limit, so that a job going over the limit is
# seen and named by the watcher, not only refused by a full disk.
DISK_SLACK_MB = 16
# The staged copy first on the path, and no editable install's finder (which would map
# forge_course to the course's folder) before the worker starts.
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); del sys.argv[1]; "
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
    "from forge_course.grader.worker import main; sys.exit(main(sys.argv[1:]))"
)
INSTALL_BWRAP = (
    "bubblewrap is not installed, so learner code would run with the grader's rights. Install "
    "it (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install "
    "bubblewrap`) or, on a machine you can afford to lose, pass --unsafe."
)


@dataclass(frozen=True)
class Limits:
    """What one submission may use. Each default leaves room over the most that a chapter's
    solution used, as measured by `benchmarks/limits.py`. The README's table gives each margin."""

    seconds: float = 60.0  # wall clock for one exercise
    submission_seconds: float = 600.0  # wall clock for all of one submission's exercises
    cpu_seconds: float = 60.0  # CPU time of every process of one submission, together
    memory_mb: int = 4096  # resident memory of one submission (its control group)
    processes: int = 64  # processes and threads a submission may have at once
    file_mb: int = 16  # largest file one process may write
    disk_mb: int = 64  # MB in the sandbox's /tmp and /dev/shm together
    files: int = 10_000  # files and folders in the sandbox's /tmp and /dev/shm at once
    open_files: int = 1024  # file descriptors per process (DataLoader workers pass tensors as fds)
    open_files_total: int = 4096  # file descriptors of all its processes together
    startup_seconds: float = 120.0  # the worker's own imports, not charged to the learner


@dataclass(frozen=True)
class Outcome:
    """What came back from one job."""

    messages: list[dict]
    status: str  # "finished", "timeout", "resource limit" or "crashed"
    detail: str = ""
    seconds: float = 0.0
    # The job's peak of each total (`worker.Watch.TOTALS`), as the watcher measured it; empty
    # when the worker sent no answer.
    peaks: dict[str, float] = field(default_factory=dict)


class SandboxError(RuntimeError):
    """The sandbox could not start: the machine's fault, not the learner's. Stops the run."""


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


def stage(folder: Path) -> Path:
    """Copy `WORKER_FILES` into ``folder/forge_course``: the worker's whole view of the course."""
    target = folder / "forge_course"
    for name in WORKER_FILES:
        source = PACKAGE / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return folder


def _bind_if_present(flag: str, path: str) -> list[str]:
    return [flag, path, path] if os.path.lexists(path) else []


def _system_mounts() -> list[str]:
    """What any Python needs from the system: libraries, binaries and a few settings files."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        else:
            args += _bind_if_present("--ro-bind", top)
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime",
                 "hosts", "nsswitch.conf", "passwd", "group", "matplotlibrc"):  # fmt: skip
        args += _bind_if_present("--ro-bind", f"/etc/{name}")
    return args


def _python_mounts() -> list[str]:
    """The interpreter, its standard library and its site-packages, read-only; an installed
    (not editable) copy of forge_course there is hidden: the staged copy is the worker's."""
    args = []
    for prefix in sorted({sys.base_prefix, sys.prefix, sys.exec_prefix}):
        if not prefix.startswith("/usr/"):
            args += _bind_if_present("--ro-bind", prefix)
    installed = Path(sysconfig.get_paths()["purelib"]) / "forge_course"
    if installed.is_dir() and installed.resolve() != PACKAGE:
        args += ["--tmpfs", str(installed), "--remount-ro", str(installed)]
    return args


def _gpu_nodes() -> list[Path]:
    """NVIDIA's device nodes, where the machine has them, those in its folders included
    (/dev/nvidia-caps): each is bound on its own, so that the folder is the sandbox's, in its
    read-only /dev, and not the host's, which a job running as the host's root could write."""
    nodes = []
    for path in sorted(Path("/dev").glob("nvidia*")):
        if not path.is_dir():
            nodes.append(path)
            continue
        with contextlib.suppress(OSError):  # a folder this user may not list
            nodes += sorted(path.iterdir())
    return nodes


def copy_devices(folder: Path) -> Path | None:
    """Copies of the device nodes a job may use (`DEVICES`, NVIDIA's), owned by nobody outside
    the sandbox, in ``folder``; None where they cannot be made (not root, or a file system
    that ignores device nodes). Bound from /dev itself, a node is the host's own inode, and
    a grader running as root runs its sandbox as the host's root (mapped to "nobody" inside):
    its jobs own that inode and could change its mode or times for the whole machine. A copy
    is the same device, whose mode and times no job can change, since no job owns it."""
    if os.geteuid() != 0 or os.statvfs(folder.parent).f_flag & os.ST_NODEV:
        return None
    folder.mkdir()
    for node in [Path("/dev", name) for name in DEVICES] + _gpu_nodes():
        kind, copy = os.stat(node), folder / node.relative_to("/dev")
        if statmod.S_ISCHR(kind.st_mode):
            copy.parent.mkdir(exist_ok=True)
            os.mknod(copy, statmod.S_IFCHR, kind.st_rdev)
            os.chown(copy, NOBODY, NOBODY)
            os.chmod(copy, 0o666)  # as bwrap's own (mknod's mode obeys the umask)
    return folder


def _device_mounts(copies: Path | None) -> list[str]:
    """NVIDIA's device nodes and driver files, where the machine has them (nothing else of
    /dev), and every node bound from its copy in ``copies`` where there is one."""
    args = []
    for node in [Path("/dev", name) for name in DEVICES] + _gpu_nodes():
        copy = copies / node.relative_to("/dev") if copies else None
        if copy is not None and copy.exists():
            args += ["--dev-bind", str(copy), str(node)]
        elif node.name not in DEVICES:  # bwrap's --dev binds those itself
            args += ["--dev-bind", str(node), str(node)]
    if _gpu_nodes():
        args += _bind_if_present("--ro-bind", "/proc/driver/nvidia")
    return args


def _command(
    stage_dir: Path,
    mode: str,
    limits: Limits,
    capped: bool,
    seccomp_fd: int | None = None,
    devices: Path | None = None,
) -> list[str]:
    job_limits = {
        "seconds": limits.seconds,
        "processes": limits.processes if capped or os.geteuid() == 0 else _process_room(limits),
        "file_mb": limits.file_mb,
        "open_files": limits.open_files,
        "open_files_total": limits.open_files_total,
        "tasks": limits.processes,  # the watcher's count: every process and thread at once
        "files": limits.files,
        "disk_mb": limits.disk_mb,
        "cpu_seconds": limits.cpu_seconds,
        # Address space only where no control group caps resident memory and no GPU is
        # visible: a CUDA context reserves far more address space than it uses.
        "address_space_mb": 0 if capped or _gpu_nodes() else limits.memory_mb + 2048,
        "gpu_memory_mb": limits.memory_mb,  # on each GPU, in the caching allocator
    }
    python = [sys.executable, "-I", "-c", BOOT]
    if mode != "bubblewrap":
        return _unsafe(python + [str(stage_dir), json.dumps(job_limits)], mode)
    size = str((limits.disk_mb + DISK_SLACK_MB) * 2**20)
    # /tmp first: the interpreter may live below it (a clone in /tmp), bound over the tmpfs.
    command = ["bwrap", "--size", size, "--tmpfs", "/tmp", *_system_mounts(), *_python_mounts()]
    command += ["--ro-bind", str(stage_dir), STAGE_IN_SANDBOX, "--ro-bind", "/sys", "/sys"]
    command += ["--proc", "/proc", "--dev", "/dev", *_device_mounts(devices)]  # nodes after /dev
    command += ["--size", size, "--tmpfs", "/dev/shm", "--chdir", "/tmp"]
    # Everything but the watched, emptied /tmp and /dev/shm read-only, once all is mounted: the
    # root and /dev are tmpfs of bwrap's own, which would keep a job's files for the next job.
    command += ["--remount-ro", "/dev", "--remount-ro", "/"]
    command += ["--unshare-all", "--hostname", "sandbox", "--die-with-parent", "--new-session"]
    # Its own user namespace, as "nobody" inside and with no capability outside it, even when
    # the grader is root (the interpreter may live where only root can read, as under pyenv).
    command += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL"]
    if seccomp_fd is not None:  # no ptrace, mounts, namespaces or keyrings (`seccomp`)
        command += ["--seccomp", str(seccomp_fd)]
    return command + python + [STAGE_IN_SANDBOX, json.dumps(job_limits), "--own-pid-namespace"]


def _unsafe(worker: list[str], mode: str) -> list[str]:
    if mode == "network namespace":  # loopback starts down there: the worker brings it up
        return ["unshare", "--net", *worker, "--loopback-up"]
    return worker


def _process_room(limits: Limits) -> int:
    """The per-user process limit counts the grader's own processes too: allow for them."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, KeyError, ValueError):
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
            if int(fields["Uid"].split()[0]) == os.getuid():
                count += int(fields["Threads"])
    return limits.processes + count


def _start_in(groups: list[Path]):
    def apply() -> None:
        os.setsid()  # its own process group: the grader kills the group at once
        cgroup.join(groups)

    return apply


def device_environment(device: str) -> dict[str, str]:
    """What tells a worker's checks which devices to use, for ``--device`` auto, cpu or cuda.
    The grader's own process draws the cases from ``FORGE_DEVICE`` alone (`chosen_devices`)."""
    if device == "cpu":
        return {**chosen_devices(device), "CUDA_VISIBLE_DEVICES": ""}
    return chosen_devices(device)


def chosen_devices(device: str) -> dict[str, str]:
    """``FORGE_DEVICE`` for ``--device`` cpu or cuda (auto: nothing, every device present)."""
    return {"FORGE_DEVICE": device} if device in ("cpu", "cuda") else {}


def _environment(home: str, devices: dict[str, str]) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "FORGE_DEVICE",
            "CUDA_VISIBLE_DEVICES")  # fmt: skip
    env = {k: os.environ[k] for k in keep if k in os.environ}
    # The run's devices are handed to each worker, never set in the grader's own environment: a
    # process that has opened CUDA cannot hide a GPU from itself, and one process may serve
    # runs with different devices (a Dask worker).
    env.update(devices)
    env.update(HOME=home, TMPDIR=home, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    env["MPLCONFIGDIR"] = f"{home}/.matplotlib"
    return env


class Session:
    """A warm worker that grades submissions one after another, each begun with `begin`.

    The worker imports torch once; each job runs in a child it forks, and when the child has
    ended the worker kills whatever it left and empties the sandbox's /tmp and /dev/shm, so
    the next job, even another student's, finds the sandbox as the first job found it. Each
    submission has control groups of its own, which the worker joins while it grades that
    submission and leaves after, so its caps and totals count that submission alone. A job
    that overruns its time, or kills the worker, ends the worker: the next job starts a fresh
    one, so the other exercises are still graded. The time, CPU and memory a worker spends
    starting are not charged to the learner. Without bubblewrap the worker cannot see what a
    job left behind, so every submission gets a fresh worker.
    """

    def __init__(
        self,
        limits: Limits,
        mode: str | None = None,
        stage_dir: Path | None = None,
        devices: dict[str, str] | None = None,
    ):
        self.limits, self.mode, self.devices = limits, mode or isolation(), devices or {}
        self._own_stage = None if stage_dir else tempfile.TemporaryDirectory(prefix="forge-stage-")
        self.stage_dir = stage_dir or stage(Path(self._own_stage.name))
        self.process: subprocess.Popen | None = None
        self._home = tempfile.TemporaryDirectory(prefix="forge-")
        self._devices = None
        if self.mode == "bubblewrap":
            self._devices = copy_devices(Path(self._home.name) / "dev")
        self._idle = cgroup.make(limits.processes, limits.memory_mb)  # between submissions
        self._groups: list[Path] = []
        self._jobs = 0
        self._interrupted = False
        self.begin()

    def begin(self) -> None:
        """Start the next submission: fresh control groups, and its time and totals at zero."""
        if self.process is not None and (
            self.mode != "bubblewrap" or self.process.poll() is not None
        ):
            self._stop()  # a fresh worker: always without bubblewrap, and for one that ended
        self._move(self._idle)
        cgroup.kill(self._groups)  # what the last submission left, had it escaped the worker
        cgroup.remove(self._groups)
        self._groups = cgroup.make(self.limits.processes, self.limits.memory_mb)
        self._move(self._groups)
        self.spent = 0.0  # seconds of the submission's time limit used so far
        # The submission's peak of each total over its jobs so far (CPU seconds summed), from
        # the watcher's answers, the grader's clock and its control group: see `_tally`.
        self.peaks: dict[str, float] = {}
        self._hits = 0

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self._stop()
        cgroup.remove(self._groups + self._idle)
        self._home.cleanup()
        if self._own_stage:
            self._own_stage.cleanup()

    def _move(self, groups: list[Path]) -> None:
        """Move the worker (bubblewrap's processes and the server) into ``groups``. Between
        jobs the worker's are its only processes: what a job left is already killed."""
        if self.process is None or not groups:
            return
        for pid in _tree(self.process.pid):
            with contextlib.suppress(OSError):
                for group in groups:
                    (group / "cgroup.procs").write_text(str(pid))

    def _start(self) -> None:
        """Start a worker and wait until it is ready: a failure here is the machine's, not the
        learner's, so it stops the run with what the sandbox said."""
        home = "/tmp" if self.mode == "bubblewrap" else self._home.name
        filter_fd = seccomp.open_program() if self.mode == "bubblewrap" else None
        command = _command(self.stage_dir, self.mode, self.limits, bool(self._groups), filter_fd,
                           self._devices)  # fmt: skip
        try:
            self.process = self._popen(command, home, () if filter_fd is None else (filter_fd,))
        finally:
            if filter_fd is not None:
                os.close(filter_fd)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._said = bytearray()  # the last `MAX_SAID` bytes of the worker's stderr
        threading.Thread(
            target=_read_lines, args=(self.process.stdout, self._lines), daemon=True
        ).start()
        threading.Thread(
            target=_read_tail, args=(self.process.stderr, self._said), daemon=True
        ).start()
        try:
            ready = self._lines.get(timeout=self.limits.startup_seconds)
        except queue.Empty:
            ready = None
        if not (ready and ready.startswith('{"ready": true}')):
            self._stop()
            if self._interrupted:
                return
            said = self._said.decode("utf-8", "replace").strip()[-2000:] or "nothing"
            raise SandboxError(f"the grading sandbox did not start ({self.mode}); it said: {said}")
        self._move(self._groups)

    def _popen(self, command: list[str], home: str, fds: tuple) -> subprocess.Popen:
        return subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self._home.name,
            env=_environment(home, self.devices),
            preexec_fn=_start_in(self._idle or self._groups),
            pass_fds=fds,
        )

    def interrupt(self) -> None:
        """From another thread: end the job under way now, and run no other (a run stopping)."""
        self._interrupted = True
        process = self.process  # set before `run` looks at the flag: one of the two sees the other
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)

    def _stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            cgroup.kill(self._groups + self._idle)  # and whatever left the group with setsid
            self.process.wait()
            self.process = None

    def _cpu_over(self) -> bool:
        used = cgroup.cpu_seconds(self._groups) or 0.0
        return max(used, self.peaks.get("cpu_seconds", 0.0)) > self.limits.cpu_seconds

    def run(self, job: dict) -> Outcome:
        """Run one job within the exercise's and the submission's limits."""
        left = self.limits.submission_seconds - self.spent
        if left <= 0:
            detail = f"the submission's {self.limits.submission_seconds:g} s were used up"
            return Outcome([], "timeout", detail)
        if self._cpu_over():
            return Outcome([], "resource limit", self._cpu_detail())
        stopped = Outcome([], "crashed", "the run was stopped")
        if self._interrupted:
            return stopped
        if self.process is None:
            self._start()
            if self._interrupted:  # while it started: `interrupt` may not have seen it
                self._stop()
                return stopped
        budget = min(self.limits.seconds, left)
        self._jobs += 1
        # The CPU time already spent goes with the job: a fresh worker still counts it.
        job = {**job, "id": self._jobs, "cpu_spent": self.peaks.get("cpu_seconds", 0.0)}
        start = time.monotonic()
        reply, cpu_over, over = None, False, ""
        try:
            self.process.stdin.write(json.dumps(job).encode() + b"\n")
            self.process.stdin.flush()
            while reply is None or reply.get("id") != job["id"]:
                wait = min(0.5, start + budget - time.monotonic())
                if wait <= 0:
                    break
                try:
                    line = self._lines.get(timeout=wait)
                except queue.Empty:
                    if cpu_over := self._cpu_over():
                        break
                    continue
                if line is None:
                    break  # the worker itself is gone
                if line is TOO_LONG:
                    over = f"output: a reply of more than {MAX_LINE // 2**20} MB"
                    break
                reply = _reply(line)
        except (BrokenPipeError, OSError):
            reply = None
        seconds = time.monotonic() - start
        self.spent += seconds
        answered = reply is not None and reply.get("id") == job["id"]
        peaks = reply.get("peaks", {}) if answered else {}
        self._tally(peaks, seconds)
        if not answered:
            self._stop()  # whatever it sent before it was stopped proves nothing
            if cpu_over or over:
                return Outcome([], "resource limit", over or self._cpu_detail(), seconds)
            outcome = Outcome([], "timeout", f"stopped after {budget:g} s", seconds)
            if seconds < budget:
                outcome = Outcome([], "crashed", "the grading worker ended", seconds)
        else:
            messages = _messages(reply["output"])
            outcome = Outcome(messages, "finished", "", seconds, peaks)
            if reply.get("limit"):
                outcome = Outcome(messages, "resource limit", reply["limit"], seconds, peaks)
            elif not any(m.get("done") for m in messages):
                outcome = Outcome(messages, *_why_it_died(reply["exit"], messages), seconds, peaks)
        if answered and reply.get("restart"):
            self._stop()  # the worker could not empty its sandbox: the next job gets a fresh one
        hits, self._hits = self._hits, cgroup.limit_hits(self._groups)
        if self._hits > hits:  # the sandbox's process or memory cap refused something
            detail = (
                f"the submission went over its cap of {self.limits.processes} processes "
                f"and threads or {self.limits.memory_mb} MB of memory"
            )
            return Outcome(outcome.messages, "resource limit", detail, seconds, peaks)
        return outcome

    def _tally(self, peaks: dict[str, float], seconds: float) -> None:
        """Fold one job's peaks into the submission's. Where a control group holds the
        sandbox, its memory peak replaces the watcher's: it counts every process once, the
        server and the files in its tmpfs included, as the memory cap does."""
        for name, value in peaks.items():
            if name == "cpu_seconds":
                self.peaks[name] = round(self.peaks.get(name, 0.0) + value, 3)
            else:
                self.peaks[name] = max(self.peaks.get(name, 0), value)
        self.peaks["seconds"] = max(self.peaks.get("seconds", 0.0), round(seconds, 3))
        self.peaks["submission_seconds"] = round(self.spent, 3)
        memory = cgroup.memory_peak_mb(self._groups)
        if memory is not None:
            self.peaks["memory_mb"] = round(memory, 3)

    def _cpu_detail(self) -> str:
        return f"CPU time: the submission used more than {self.limits.cpu_seconds:g} CPU-seconds"


def run(job: dict, limits: Limits, mode: str | None = None) -> Outcome:
    """Run one job in a sandbox of its own."""
    with Session(limits, mode) as box:
        return box.run(job)


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += parents.get(found[-1], [])
    return found


def _read_lines(pipe, lines: queue.Queue) -> None:
    """Queue each line the worker writes, read in bounded chunks: a line longer than
    `MAX_LINE` is never held, and `TOO_LONG` is queued in its place. None at the end."""
    held, too_long = bytearray(), False
    while chunk := os.read(pipe.fileno(), CHUNK):
        *complete, rest = chunk.split(b"\n")
        for part in complete:
            if too_long or len(held) + len(part) > MAX_LINE:
                lines.put(TOO_LONG)
            else:
                lines.put((held + part).decode("utf-8", "replace"))
            held, too_long = bytearray(), False
        too_long = too_long or len(held) + len(rest) > MAX_LINE
        if too_long:
            held.clear()
        else:
            held += rest
    lines.put(None)


def _read_tail(pipe, tail: bytearray) -> None:
    """Keep the last `MAX_SAID` bytes of what the worker writes to ``pipe``, read in chunks."""
    while chunk := os.read(pipe.fileno(), CHUNK):
        tail += chunk
        del tail[:-MAX_SAID]


def _reply(line: str) -> dict | None:
    """The worker's answer line, checked for shape: anything else is not an answer."""
    try:
        reply = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(reply, dict) or not isinstance(reply.get("id"), int):
        return None
    if not isinstance(reply.get("output"), str) or not isinstance(reply.get("exit"), int):
        return None
    if not isinstance(reply.get("limit", ""), str) or type(reply.get("restart", False)) is not bool:
        return None
    peaks = reply.get("peaks", {})
    if not isinstance(peaks, dict) or not all(
        name in Watch.TOTALS and type(value) in (int, float) and math.isfinite(value) and value >= 0
        for name, value in peaks.items()
    ):
        return None
    return reply


def _messages(output: str) -> list[dict]:
    """The job's lines that parse as JSON objects (the grader checks each one's shape)."""
    messages = []
    for line in output.splitlines():
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a stray write to the channel: ignored, it cannot forge a verdict
        if isinstance(message, dict):
            messages.append(message)
    return messages


def _why_it_died(code: int, messages: list[dict]) -> tuple[str, str]:
    # A limit the worker named by the exception's type (`worker._limit_of`), never by its text.
    named = any(m.get("limit") for m in messages)
    if named or code in (-signal.SIGKILL, -signal.SIGSEGV, -signal.SIGXCPU):
        return "resource limit", f"the worker exceeded a limit (exit {code})"
    return "crashed", f"the worker ended before finishing (exit {code})"
