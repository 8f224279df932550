"""The grading worker: a warm process that runs each exercise's answer in a fresh child.

Started by `forge_course.grader.sandbox` once per submission, inside the sandbox, from a staged
copy of the few modules it may import (`sandbox.WORKER_FILES`): the learner half of the checks
(`forge_course.observe`), the codec, the device helpers and the course's data. It never holds a
reference, an expected value, a known mistake or a hidden test: those stay in the grader.

It pays for ``import torch`` once (without initialising CUDA, so that forking stays safe), then
reads jobs as JSON lines on stdin:

    {"id": 3,
     "prelude": "<the chapter's set-up cell, from the instructor's copy>",
     "answer": "<the learner's answer cell>",
     "observer": {"module": "forge_course.observe.ch04", "name": "observe_train_step"},
     "cases": [<plain-data cases chosen by the grader>],
     "variables": ["grad_multiple", ...],
     "seed": 1234}

For each job it forks a child with the job's limits, which seeds every generator from the job,
runs the set-up cell, installs an audit hook, runs the learner's cell and observes each case,
writing ``{"ran": true}`` or ``{"error": ...}``, one ``{"case": i, "observation": ...}`` or
``{"case": i, "mistake": ...}`` per case, the requested ``{"variables": {...}}`` and
``{"done": true}`` to a pipe of its own. When the child has exited and every process it left
behind is killed, the server answers ``{"id": 3, "output": "<the pipe's text>", "exit": code}``.
The verdict is reached by the grader, never here.

What learner code does that the audit hook refuses (memory searches, trace hooks, native
libraries loaded by name) is written to the pipe at once as ``{"tampered": [...]}``, before the
refusal is raised, so no later code can take it back.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time

PR_SET_DUMPABLE = 4
MAX_OUTPUT = 16 * 2**20  # bytes kept from one job's pipe; a flood is cut here
OBSERVERS = "forge_course.observe."

# Audit events that learner code has no business raising: each is a way to reach what the
# check's own code holds (memory, frames of other threads, trace hooks) or to leave Python.
REFUSED_EVENTS = {
    "gc.get_objects": "searches the process's memory",
    "gc.get_referrers": "searches the process's memory",
    "gc.get_referents": "searches the process's memory",
    "sys._current_frames": "reads other threads' frames",
    "sys.settrace": "installs a trace hook",
    "sys.setprofile": "installs a profile hook",
    "sys.addaudithook": "installs an audit hook",
    "ctypes.dlopen": "loads a native library",
    "ctypes.dlsym": "looks up native functions",
    "ctypes.dlsym/handle": "looks up native functions",
    "ctypes.addressof": "reads raw memory addresses",
    "ctypes.string_at": "reads raw memory",
    "ctypes.wstring_at": "reads raw memory",
    "ctypes.cdata": "reads raw memory",
    "ctypes.cdata/buffer": "reads raw memory",
    "sys.remote_exec": "runs code in another process",
}
# What learner code must leave alone: patching any of these could bend an observation.
WATCHED_MODULES = ("builtins", "math", "json", "json.encoder", "numpy", "torch",
                   "torch.nn.functional", "torch.testing", "torch.autograd", "torch.optim",
                   "forge_course.grader.codec")  # fmt: skip


def _not_dumpable() -> None:
    """Forbid other processes of this user to ptrace this one or open its /proc files."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the other layers remain
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _watched() -> dict[str, int]:
    """The identity of every function and class the observation relies on, and of its code."""
    names = list(WATCHED_MODULES) + [m for m in sys.modules if m.startswith(OBSERVERS)]
    owners = [(m, sys.modules[m]) for m in names if m in sys.modules]
    import torch

    owners += [("torch.Tensor", torch.Tensor), ("torch.nn.Module", torch.nn.Module),
               ("torch.optim.Optimizer", torch.optim.Optimizer),
               ("json.JSONEncoder", json.JSONEncoder)]  # fmt: skip
    seen = {}
    for name, owner in owners:
        if isinstance(owner, type):  # a new entry on a class shadows an inherited method
            # (but for the slot-name cache that copyreg adds the first time a Tensor is pickled)
            seen[f"{name}.__dict__ keys"] = hash(frozenset(vars(owner)) - {"__slotnames__"})
        for attr, value in list(vars(owner).items()):
            if callable(value):
                seen[f"{name}.{attr}"] = id(value)
                code = getattr(value, "__code__", None)
                if code is not None:
                    seen[f"{name}.{attr}.__code__"] = id(code)
    return seen


def _replaced(before: dict[str, int]) -> list[str]:
    after = _watched()
    return sorted({k.removesuffix(".__code__") for k, v in before.items() if after.get(k) != v})


def _evidence(names: list[str]) -> str:
    """The tamper report as a JSON line, built without the json module, which learner code may
    have patched to rewrite exactly this line."""
    quoted = []
    for name in names:
        safe = "".join(c if c.isalnum() or c in " ._:()-,`'" else "?" for c in str(name))
        quoted.append('"' + safe + '"')
    return '{"tampered": [' + ", ".join(quoted) + "]}\n"


def _install_audit_hook(write_now) -> None:
    """Refuse `REFUSED_EVENTS` from here on; each refusal is reported before it is raised."""
    refused = REFUSED_EVENTS

    def hook(event: str, args: tuple) -> None:
        if event in refused:
            write_now(_evidence([f"{event}: {refused[event]}"]))
            raise RuntimeError(f"not allowed while grading: {refused[event]} ({event})")

    sys.addaudithook(hook)


def _seed(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _run_job(job: dict, write_fd: int) -> None:
    """In the child: the set-up cell, the learner's cell, then the observations."""
    from forge_course.grader.codec import to_plain
    from forge_course.observe.common import Mistake

    raw_write, getpid = os.write, os.getpid
    me = getpid()

    def write_now(text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:
            data = data[raw_write(write_fd, data) :]

    _seed(int(job.get("seed", 0)))
    namespace: dict = {"__name__": "__main__"}
    observer = None
    try:  # the instructor's cell: its output is not the learner's concern
        with contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
            exec(compile(job.get("prelude", ""), "<set-up cell>", "exec"), namespace)
        spec = job.get("observer")
        if spec:
            observer = getattr(importlib.import_module(spec["module"]), spec["name"])
    except BaseException as err:  # noqa: BLE001
        write_now(json.dumps({"setup_error": f"{type(err).__name__}: {err}"}) + "\n")
        return
    watched = _watched()
    _install_audit_hook(write_now)

    def send(message: dict) -> None:
        if getpid() != me:  # a process the answer forked came back here: only the job speaks
            os._exit(0)
        replaced = _replaced(watched)
        if replaced:  # checked before every message: nothing is sent from a patched world
            write_now(_evidence(replaced))
            os._exit(0)
        write_now(json.dumps(message, allow_nan=False) + "\n")

    try:
        exec(compile(job["answer"], "<your answer cell>", "exec"), namespace)
    except BaseException as err:  # noqa: BLE001  (SystemExit included: report, do not obey)
        send({"error": f"{type(err).__name__}: {err}"})
    else:
        send({"ran": True})

    if observer is not None:
        fn = namespace.get(job["function"])
        for i, case in enumerate(job["cases"]):
            try:
                send({"case": i, "observation": to_plain(observer(fn, case))})
            except Mistake as mistake:
                send({"case": i, "mistake": str(mistake)})
                break  # one failed case decides the exercise; the rest would only cost time
            except BaseException as err:  # noqa: BLE001
                send({"case": i, "mistake": f"{type(err).__name__}: {err}"})
                break
    names = job.get("variables", [])
    if names:
        send({"variables": {n: to_plain(namespace.get(n)) for n in names}})
    send({"done": True})


def _child(job: dict, write_fd: int, reply_fd: int, limits: dict, workdir: str):
    """The forked child: limits on, every route to the server closed, then the job."""
    code = 0
    try:
        os.close(reply_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the next jobs arrive on stdin: not for the learner to read
        if limits.get("address_space_mb"):  # only where no control group caps resident memory
            memory = limits["address_space_mb"] * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * 2**20,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
        cpu = int(limits["seconds"]) + 5
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        os.chdir(workdir)
        _run_job(job, write_fd)
    except BaseException:  # noqa: BLE001  (whatever happens, never return into the server)
        code = 1
    finally:
        os._exit(code)


def _reap(pid: int, read_fd: int, watch: Watch) -> tuple[str, int, str]:
    """Wait for the child, kill what it left behind, and return its pipe's text, exit code and
    the submission limit it went over ("" when none)."""
    chunks: list[bytes] = []

    def drain() -> None:
        size = 0
        while data := os.read(read_fd, 65536):
            if size < MAX_OUTPUT:
                chunks.append(data)
                size += len(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    status, over = watch.wait(pid)
    _kill_leftovers(watch.own_pid_namespace)
    reader.join(timeout=2)  # a writer that escaped the kill cannot hold the answer back
    os.close(read_fd)
    output = b"".join(chunks).decode("utf-8", "replace")
    return output, os.waitstatus_to_exitcode(status), over


class Watch:
    """The submission's totals, checked while a job runs: files and bytes in the sandbox's own
    ``/tmp``, and CPU time of every process in its own process-id namespace (elsewhere the
    grader's control group accounts CPU time, and the grader checks it)."""

    def __init__(self, limits: dict, scratch: str, own_pid_namespace: bool):
        self.limits, self.scratch, self.own_pid_namespace = limits, scratch, own_pid_namespace
        self.cpu_done = 0.0  # CPU seconds of the jobs that have ended
        self.tick = os.sysconf("SC_CLK_TCK")

    def wait(self, pid: int) -> tuple[int, str]:
        pause = 0.002
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                self.cpu_done += usage.ru_utime + usage.ru_stime
                return status, ""
            over = self.over()
            if over:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _, status, usage = os.wait4(pid, 0)
                self.cpu_done += usage.ru_utime + usage.ru_stime
                return status, over
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def over(self) -> str:
        if not self.own_pid_namespace:
            return ""
        with contextlib.suppress(OSError):
            fs = os.statvfs(self.scratch)
            if fs.f_files - fs.f_ffree > self.limits["files"]:
                return f"files: more than {self.limits['files']} files and folders written"
        cpu = self.cpu_done + self._cpu_running()
        if cpu > self.limits["cpu_seconds"]:
            return f"CPU time: more than {self.limits['cpu_seconds']:g} CPU-seconds used"
        return ""

    def _cpu_running(self) -> float:
        ticks = 0
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in (1, os.getpid()):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{entry}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / self.tick


def _kill_leftovers(own_pid_namespace: bool) -> None:
    """Alone in a process-id namespace, every process but its init (1) and this server is the
    child's: kill them all, whatever group or session they moved to. Elsewhere they share the
    server's process group, which the grader kills when the submission is done."""
    if not own_pid_namespace:
        return
    mine = {1, os.getpid()}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in mine:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)


def _clear(folder: str, keep: frozenset = frozenset()) -> None:
    """Empty a folder the jobs could write to, so the next job finds nothing of this one (but
    for ``keep``: what was there before any job, such as a read-only interpreter below /tmp)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name in keep:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def serve(limits: dict, own_pid_namespace: bool) -> int:
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed goes to stderr, never to the grader's channel
    sys.stdout = sys.stderr
    _not_dumpable()
    import matplotlib  # the expensive imports, paid once per submission; none touches CUDA

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import torch
    import torch._dynamo  # noqa: F401  (an optimizer imports it; it rewraps torch functions)

    import forge_course.grader.codec  # noqa: F401
    import forge_course.observe.common  # noqa: F401

    scratch = tempfile.gettempdir()
    before = frozenset(os.listdir(scratch))
    watch = Watch(limits, scratch, own_pid_namespace)
    reply.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        job = json.loads(line)
        spec = job.get("observer")
        if spec:
            if not spec["module"].startswith(OBSERVERS):
                raise SystemExit(f"refusing to import {spec['module']!r}")
            importlib.import_module(spec["module"])
        # Forking after CUDA is initialised breaks the child: the set-up cell runs in the child.
        if torch.cuda.is_initialized():
            raise SystemExit("CUDA was initialised in the grading server")
        workdir = tempfile.mkdtemp(prefix=f"job-{job['id']}-", dir=scratch)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _child(job, write_fd, reply.fileno(), limits, workdir)
        os.close(write_fd)
        output, code, over = _reap(pid, read_fd, watch)
        _clear(scratch, before)
        if own_pid_namespace:  # the sandbox's own /dev/shm (elsewhere it is the machine's)
            _clear("/dev/shm")
        answer = {"id": job["id"], "output": output, "exit": code, "limit": over}
        reply.write(json.dumps(answer) + "\n")
    return 0


def _loopback_up() -> None:
    """Bring up ``lo`` in a fresh network namespace (``unshare --net`` leaves it down, bwrap
    does not): distributed exercises rendezvous on 127.0.0.1."""
    import fcntl
    import socket
    import struct

    get_flags, set_flags, up = 0x8913, 0x8914, 0x1  # SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(sock, get_flags, request))[1]
        fcntl.ioctl(sock, set_flags, struct.pack("16sh14x", b"lo", flags | up))


def main(argv: list[str]) -> int:
    if "--loopback-up" in argv[1:]:
        with contextlib.suppress(OSError):  # without the right, distributed exercises time out
            _loopback_up()
    return serve(json.loads(argv[0]), "--own-pid-namespace" in argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
