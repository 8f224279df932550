"""The isolated worker: a warm fork server that runs each exercise's answer in a fresh child.

Started by `forge_course.grader.sandbox` once per submission, inside the sandbox. It pays for
``import torch`` once, then reads jobs as JSON lines on stdin:

    {"id": 3,
     "prelude": "<the chapter's set-up cell, from the instructor's copy>",
     "answer": "<the learner's answer cell>",
     "exercise": {"module": "forge_course.grading.ch04", "index": 1},
     "cases": [<plain-data cases chosen by the grader>],
     "variables": ["grad_multiple", ...]}

For each job it runs the instructor's set-up cell itself (once per distinct cell), then forks a
child with the job's limits, which runs the learner's cell and calls the answer on each case,
writing ``{"ran": true}`` or ``{"error": ...}``, one ``{"case": i, "observation": ...}`` or
``{"case": i, "mistake": ...}`` per case, the requested ``{"variables": {...}}`` and
``{"done": true}`` to a pipe of its own. When the child has exited and every process it left
behind is killed, the server answers ``{"id": 3, "output": "<the pipe's text>", "exit": code}``.
The verdict is reached by the grader, never here.

The server's answer line goes out on a descriptor the child closes, and the server makes itself
non-dumpable, so learner code can neither write to it nor read it through ``/proc``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import resource
import signal
import sys
import tempfile
import threading

PR_SET_DUMPABLE = 4
MAX_OUTPUT = 16 * 2**20  # bytes kept from one job's pipe; a flood is cut here


def _not_dumpable() -> None:
    """Forbid other processes of this user to ptrace this one or open its /proc files."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the other layers remain
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


# What learner code must leave alone: patching any of these could bend an observation.
WATCHED_MODULES = ("builtins", "math", "json", "numpy", "torch", "torch.nn.functional",
                   "torch.testing", "torch.autograd", "torch.optim")  # fmt: skip


def _watched() -> dict[str, int]:
    """The identity of every function and class the grading relies on, and of its code."""
    owners = [(m, sys.modules[m]) for m in WATCHED_MODULES if m in sys.modules]
    owners += [(m, mod) for m, mod in list(sys.modules.items()) if m.startswith("forge_course")]
    import torch

    owners += [("torch.Tensor", torch.Tensor), ("torch.nn.Module", torch.nn.Module),
               ("torch.optim.Optimizer", torch.optim.Optimizer)]  # fmt: skip
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


def _run_job(job: dict, namespace: dict, prelude_error: str | None, channel) -> None:
    """In the child: run the learner's cell, then the exercise's observations."""
    from forge_course.grader.codec import to_plain
    from forge_course.grading.core import Mistake

    watched = _watched()

    def send(message: dict) -> None:
        replaced = _replaced(watched)
        if replaced:  # checked before every message: nothing is sent from a patched world
            message = {"tampered": replaced}
        channel.write(json.dumps(message, allow_nan=False) + "\n")
        if replaced:
            channel.flush()
            os._exit(0)

    if prelude_error:
        send({"error": prelude_error})
    else:
        try:
            exec(compile(job["answer"], "<your answer cell>", "exec"), namespace)
        except BaseException as err:  # noqa: BLE001  (SystemExit included: report, do not obey)
            send({"error": f"{type(err).__name__}: {err}"})
        else:
            send({"ran": True})

    spec = job.get("exercise")
    if spec:
        exercise = importlib.import_module(spec["module"]).EXERCISES[spec["index"]]
        fn = namespace.get(exercise.function)
        for i, case in enumerate(job["cases"]):
            try:
                send({"case": i, "observation": to_plain(exercise.observe(fn, case))})
            except Mistake as mistake:
                send({"case": i, "mistake": str(mistake)})
                break  # one failed case decides the exercise; the rest would only cost time
            except BaseException as err:  # noqa: BLE001
                send({"case": i, "mistake": f"[{exercise.grade_id}] {type(err).__name__}: {err}"})
                break
    names = job.get("variables", [])
    if names:
        send({"variables": {n: to_plain(namespace.get(n)) for n in names}})
    send({"done": True})
    channel.flush()


def _child(job: dict, namespace, prelude_error, write_fd: int, reply_fd: int, limits: dict):
    """The forked child: limits on, every route to the server closed, then the job."""
    code = 0
    try:
        os.close(reply_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the next jobs arrive on stdin: not for the learner to read
        memory = limits["memory_mb"] * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * 2**20,) * 2)
        cpu = int(limits["seconds"]) + 5
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        os.chdir(tempfile.mkdtemp(prefix=f"job-{job['id']}-", dir=os.getcwd()))
        with os.fdopen(write_fd, "w", buffering=1) as channel:
            _run_job(job, namespace, prelude_error, channel)
    except BaseException:  # noqa: BLE001  (whatever happens, never return into the server)
        code = 1
    finally:
        os._exit(code)


def _reap(pid: int, read_fd: int, own_pid_namespace: bool) -> tuple[str, int]:
    """Wait for the child, kill what it left behind, and return its pipe's text and exit code."""
    chunks: list[bytes] = []

    def drain() -> None:
        size = 0
        while data := os.read(read_fd, 65536):
            if size < MAX_OUTPUT:
                chunks.append(data)
                size += len(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    _, status = os.waitpid(pid, 0)
    _kill_leftovers(own_pid_namespace)
    reader.join(timeout=2)  # a writer that escaped the kill cannot hold the answer back
    os.close(read_fd)
    return b"".join(chunks).decode("utf-8", "replace"), os.waitstatus_to_exitcode(status)


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


def serve(limits: dict, own_pid_namespace: bool) -> int:
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed goes to stderr, never to the grader's channel
    sys.stdout = sys.stderr
    _not_dumpable()
    import torch  # the expensive imports, paid once per submission
    import torch._dynamo  # noqa: F401  (an optimizer imports it; it rewraps torch functions)

    import forge_course.grader.codec  # noqa: F401
    import forge_course.grading.core  # noqa: F401

    reply.write(json.dumps({"ready": True}) + "\n")
    preludes: dict[str, tuple[dict, str | None]] = {}
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("exercise"):
            importlib.import_module(job["exercise"]["module"])
        prelude = job.get("prelude", "")
        if prelude not in preludes:
            namespace: dict = {"__name__": "__main__"}
            try:  # the instructor's cell: run once here, inherited by every child
                exec(compile(prelude, "<set-up cell>", "exec"), namespace)
                preludes[prelude] = (namespace, None)
            except BaseException as err:  # noqa: BLE001
                preludes[prelude] = (namespace, f"{type(err).__name__}: {err}")
        namespace, error = preludes[prelude]
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _child(job, namespace, error, write_fd, reply.fileno(), limits)
        os.close(write_fd)
        output, code = _reap(pid, read_fd, own_pid_namespace)
        reply.write(json.dumps({"id": job["id"], "output": output, "exit": code}) + "\n")
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
