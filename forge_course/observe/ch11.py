"""Chapter 11's learner half: call the ring, start real ranks for the DDP worker, report facts.

The DDP worker runs as ``world_size`` processes that share nothing with the caller, as torchrun
and `torch.multiprocessing.spawn` start ranks. The caller is never forked: a process forked after
autograd has run on a machine with a GPU cannot run backward ("Unable to handle autograd's
threading in combination with fork-based multiprocessing"). Instead a fresh interpreter, the
ranks' zygote, imports torch and dynamo (5 CPU-seconds) once per caller and runs nothing else;
for each case it forks a leader, which forks one child per rank (`_serve_ranks`). So each rank
starts as clean as a spawned one, in a process group of its case that is killed as one, and a
check of six cases starts torch once, not six or fourteen times.

A fresh interpreter cannot import a function defined in a notebook cell, so the worker travels
by value (`forge_course.observe.by_value`). Where fork is missing or unsafe (Windows, macOS)
each rank is a fresh interpreter of its own instead of a fork of the zygote.
"""

from __future__ import annotations

import contextlib
import copy
import dis
import importlib
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import torch

from forge_course.observe import by_value, common
from forge_course.observe.common import Mistake, call_answer
from forge_course.ports import free_port

RING, DDP = "ch11_ring_allreduce", "ch11_ddp_worker"

# ---------------------------------------------------------------- ch11_ring_allreduce


def label_ring(case: dict) -> str:
    buffers = case["buffers"]
    return f"{len(buffers)} workers, {len(buffers[0])} values each"


def _as_lists(value):
    """Lists from lists, tuples, NumPy arrays and tensors (whatever holds the numbers)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value


def _bits(values, what: str) -> list[list[str]]:
    """Each worker's numbers as the shortest text that gives the float back exactly."""
    try:
        return [[repr(float(x)) for x in worker] for worker in values]
    except (TypeError, ValueError):
        raise Mistake(
            RING, f"{what} should be one list of numbers per worker, but it is {values!r:.120}."
        ) from None


def observe_ring(fn, case: dict) -> dict:
    """What every worker ends with (to the bit), the steps, the sends, and the caller's buffers.

    The buffers handed over are the caller's own lists: what they hold after the call shows
    whether the answer changed them.
    """
    buffers = copy.deepcopy(case["buffers"])
    out = call_answer(RING, "ring_allreduce", fn, buffers, case=label_ring(case))
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise Mistake(
            RING,
            f"`ring_allreduce` should return a pair `(results, sends)`, but it returned "
            f"{type(out).__name__}.",
        )
    results = _bits(_as_lists(out[0]), "`results`")
    try:
        sends = [[[int(v) for v in send] for send in step] for step in _as_lists(out[1])]
    except (TypeError, ValueError):
        raise Mistake(
            RING, "`sends` should be one list per step of `(src, dst, chunk)` tuples of ints."
        ) from None
    return {
        "results, to the bit": results,
        "every worker holds the same bits": all(worker == results[0] for worker in results),
        "number of steps": len(sends),
        "sends": sends,
        "the `buffers` passed in, after the call": _bits(buffers, "`buffers`"),
    }


# ---------------------------------------------------------------- ch11_ddp_worker

DDP_TIMEOUT_S = 60  # seconds all ranks together may take, start-up included, before they stop
_DONE_WAIT_S = 10  # how long a finished rank waits for its peers before it leaves
_FAILED_WAIT_S = 5  # how long the peers of a failed rank get to fail on their own
PORT_TRIES = 3  # a case whose rendezvous port another program took first runs again
EXIT_CODES = "exit codes.json"  # beside the ranks' reports (`rank{r}.json`), by their leader
# The zygote starts with the caller's path (its first line) and serves one case per line.
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.stdin.buffer.readline()); "
    "from forge_course.observe.ch11 import _serve_ranks; _serve_ranks()"
)
# Linux forks each case's ranks from the zygote. Elsewhere every rank is a fresh interpreter
# of its own, as `torch.multiprocessing.spawn` starts them (Windows has no fork; macOS forks
# unsafely once threads run): slower to start, the same ranks. Its lines: path, job.
FORK_RANKS = sys.platform.startswith("linux")
_RANK_BOOT = (
    "import json, os, pickle, sys; sys.path[:] = json.loads(sys.stdin.buffer.readline()); "
    "job = pickle.loads(bytes.fromhex(sys.stdin.buffer.readline().decode())); "
    "from forge_course.observe.ch11 import _rank_process; _rank_process(job); os._exit(1)"
)


def label_ddp(case: dict) -> str:
    world_size = case["world_size"]
    ranks = f"{world_size} rank{'s' if world_size > 1 else ''}"
    return f"{ranks}, each out_dir a file, so saving fails" if case.get("saving fails") else ranks


# -- one rank --------------------------------------------------------------------------------

_RETURNS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}


def _rank_process(job: dict) -> None:
    """A rank: arm the caller's guard, watch init_process_group, run the worker, report."""
    torch.set_num_threads(1)  # a tiny model: one thread per rank is plenty
    if job["guard"]:
        importlib.import_module(job["guard"])  # the caller's tripwire: references refuse to run
    trust = common._trust()  # kept until the rank exits: a context left unreferenced would end
    if job["guard"] and job.get("trusted"):  # ranks of the reference or of a known mistake
        trust.__enter__()
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    real_init, joined = distributed_c10d.init_process_group, []
    real_all_reduce, reduced = distributed_c10d.all_reduce, []
    port_taken: list[bool] = []
    # The library's own, whatever the worker rebinds.
    is_initialized = distributed_c10d.is_initialized
    get_rank, get_world_size = distributed_c10d.get_rank, distributed_c10d.get_world_size

    def group() -> str:
        return f"rank {get_rank()} of {get_world_size()}" if is_initialized() else "none"

    def init_process_group(*args, **kwargs):
        try:
            real_init(*args, **kwargs)
        except Exception as err:
            port_taken.append("EADDRINUSE" in str(err))  # another program bound it first
            raise
        joined.append(group())

    def all_reduce(tensor, *args, **kwargs):  # notes how many numbers each call reduced
        reduced.append(tensor.numel() if isinstance(tensor, torch.Tensor) else None)
        return real_all_reduce(tensor, *args, **kwargs)

    for watch, real in ((init_process_group, real_init), (all_reduce, real_all_reduce)):
        watch.__module__, watch.__qualname__ = real.__module__, real.__qualname__
    # Installed before the worker's globals are rebuilt, so that a global bound to the library's
    # function (`from torch.distributed import init_process_group`) is bound to this one.
    dist.init_process_group = distributed_c10d.init_process_group = init_process_group
    dist.all_reduce = distributed_c10d.all_reduce = all_reduce
    report = Path(job["reports"], f"rank{job['args'][0]}.json")

    def finish(error: str | None) -> None:
        watched = dist.init_process_group is init_process_group
        result = {
            "joined": ", ".join(joined) or "none",
            "left": group(),  # a group the worker did not destroy, returning or raising
            "reduced only single numbers": bool(reduced) and set(reduced) == {1},
            "intact": watched and distributed_c10d.init_process_group is init_process_group,
            "port taken": any(port_taken),
            "error": error,
            "time": time.time(),
        }
        Path(f"{report}.part").write_text(json.dumps(result))
        os.replace(f"{report}.part", report)
        if error is None:  # stay until every rank is through, so no peer vanishes mid-collective
            deadline = time.monotonic() + _DONE_WAIT_S
            while len(list(report.parent.glob("rank*.json"))) < job["world_size"]:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if error is None else 1)  # no interpreter teardown: nothing is left to wait for

    try:
        fn = by_value.unpack(job["worker"], job["unsent"])
    except Exception as err:  # noqa: BLE001
        finish(f"`worker` could not be rebuilt in the rank's process: {type(err).__name__}: {err}")
        return
    code = fn.__code__

    # Leave the moment the worker returns, before its locals are freed: a DDP model freed after
    # its process group was destroyed can block forever in its destructor (about 1 run in 20).
    def in_worker(frame, event, arg):
        if event == "return" and frame.f_code.co_code[frame.f_lasti] in _RETURNS:
            finish(None)
        return in_worker

    rank, world_size = job["args"][:2]
    where = f"rank {rank} of {world_size}"
    sys.settrace(lambda frame, event, arg: in_worker if frame.f_code is code else None)
    try:
        call_answer(DDP, "worker", fn, *job["args"], case=where)
    except Mistake as mistake:
        message = str(mistake).removeprefix(f"[{DDP}] ")
        if "NameError" in message and job["unsent"]:
            left = ", ".join(f"`{k}` ({v})" for k, v in job["unsent"].items())
            message += (f". These globals could not be sent to the rank processes: {left}; "
                        "create them inside `worker`")  # fmt: skip
        finish(message)
    except BaseException as err:  # noqa: BLE001  (SystemExit included: this rank failed)
        finish(f"`worker` raised {type(err).__name__} ({where}): {err}".rstrip(": "))
    finish(None)


def _serve_ranks() -> None:
    """The zygote: for each line of stdin (a case's jobs, pickled, in hex), fork a leader in a
    process group of its own, answer its pid, and go on until stdin closes with the caller."""
    # Imported once, here, for every rank: DDP's constructor imports dynamo (2.5 CPU-seconds).
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # leaders are reaped by the kernel
    for line in sys.stdin.buffer:
        jobs = pickle.loads(bytes.fromhex(line.decode()))  # written by `_start_ranks`
        leader = os.fork()
        if leader == 0:
            os.setsid()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(2, 1)  # what the ranks print goes to stderr, never into the answers
            try:
                _lead_ranks(jobs)
            finally:
                os._exit(0)
        sys.stdout.write(f"{leader}\n")
        sys.stdout.flush()


def _lead_ranks(jobs: list[dict]) -> None:
    """A case's leader: fork one rank per job, wait for them all, and write their exit codes
    beside the ranks' reports. When one fails, the others get `_FAILED_WAIT_S` to fail on their
    own, then go."""
    ranks = []
    for job in jobs:
        pid = os.fork()
        if pid == 0:
            try:
                _rank_process(job)
            finally:
                os._exit(1)  # `_rank_process` leaves by os._exit; anything else is a failure
        ranks.append(pid)
    codes, deadline = {}, None
    while len(codes) < len(ranks):
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid in ranks:
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0 and deadline is None:
                deadline = time.monotonic() + _FAILED_WAIT_S
        elif deadline is not None and time.monotonic() > deadline:
            for left in set(ranks) - set(codes):
                os.kill(left, signal.SIGKILL)
            deadline = float("inf")
        elif pid == 0:
            time.sleep(0.02)
    path = Path(jobs[0]["reports"], EXIT_CODES)
    Path(f"{path}.part").write_text(json.dumps([codes[pid] for pid in ranks]))
    os.replace(f"{path}.part", path)


# This process's zygote, in a list that is changed in place: a grading worker checks that no
# name of an observer module is rebound while an answer runs.
_zygote: list[subprocess.Popen] = []
_zygote_lock = threading.Lock()  # one case at a time on the zygote's pipes


def _ranks_zygote() -> subprocess.Popen:
    """This process's zygote, started when it has none (or the one it had ended)."""
    if not _zygote or _zygote[0].poll() is not None:
        _zygote[:] = [
            subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "OMP_NUM_THREADS": "1"},  # read as torch starts: 1 a rank
            )
        ]  # fmt: skip
        _zygote[0].stdin.write(json.dumps(sys.path).encode() + b"\n")
    return _zygote[0]


def _start_ranks(fn, world_size: int, out_dirs: list[str], reports: str) -> dict:
    """Start the ranks, wait at most `DDP_TIMEOUT_S`, and kill whatever they leave behind."""
    worker = by_value.pack(fn)
    guard = getattr(common._guard, "__module__", None) or common.__name__
    port = free_port()
    jobs = [
        {
            "worker": worker, "unsent": worker["unsent"], "world_size": world_size,
            "args": (rank, world_size, port, out_dirs[rank]), "reports": reports,
            "guard": "" if guard == common.__name__ else guard, "trusted": common._trusting(),
        }
        for rank in range(world_size)
    ]  # fmt: skip
    deadline = time.monotonic() + DDP_TIMEOUT_S
    timed_out, exitcodes = (_forked_ranks if FORK_RANKS else _fresh_ranks)(jobs, deadline)
    ranks = []
    for rank in range(world_size):
        path = Path(reports, f"rank{rank}.json")
        ranks.append(json.loads(path.read_text()) if path.exists() else None)
    return {"timed_out": timed_out, "exitcodes": exitcodes, "ranks": ranks}


def _forked_ranks(jobs: list[dict], deadline: float) -> tuple[bool, list]:
    """The case's ranks forked by this process's zygote: (timed out, exit codes)."""
    timed_out, leader = False, None
    codes = Path(jobs[0]["reports"], EXIT_CODES)
    try:
        with _zygote_lock:
            zygote = _ranks_zygote()
            with contextlib.suppress(BrokenPipeError):
                zygote.stdin.write(pickle.dumps(jobs).hex().encode() + b"\n")
                zygote.stdin.flush()
            leader = int(zygote.stdout.readline() or 0) or None  # nothing: the zygote ended
        while leader is not None and not codes.exists():
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.02)
    finally:
        if leader is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, signal.SIGKILL)  # the leader, its ranks and all they started
    exitcodes = json.loads(codes.read_text()) if codes.exists() else [None] * len(jobs)
    return timed_out, exitcodes


def _fresh_ranks(jobs: list[dict], deadline: float) -> tuple[bool, list]:
    """Each rank a fresh interpreter: (timed out, exit codes). When one fails, the others get
    `_FAILED_WAIT_S` to fail on their own, then go."""
    ranks = []
    for job in jobs:
        rank = subprocess.Popen(
            [sys.executable, "-I", "-c", _RANK_BOOT], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,  # what a rank prints never mixes with the caller's output
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        ranks.append(rank)
        with contextlib.suppress(BrokenPipeError):
            rank.stdin.write(json.dumps(sys.path).encode() + b"\n")
            rank.stdin.write(pickle.dumps(job).hex().encode() + b"\n")
            rank.stdin.close()
    timed_out = False
    try:
        while any(rank.poll() is None for rank in ranks):
            if time.monotonic() > deadline:
                timed_out = True
                break
            if any(rank.poll() not in (None, 0) for rank in ranks):
                deadline = min(deadline, time.monotonic() + _FAILED_WAIT_S)
            time.sleep(0.02)
    finally:
        for rank in ranks:
            rank.kill()  # nothing if it has ended
            rank.wait()
    return timed_out, [rank.returncode for rank in ranks]


def _weights(path: Path):
    """The state dict saved at ``path``, in float64 (exact), or what was found instead."""
    if not path.exists():
        return "no file"
    try:
        saved = torch.load(path, weights_only=True)
    except Exception as err:  # noqa: BLE001  (whatever was written there, say what it is)
        return f"a file torch.load cannot read ({type(err).__name__})"
    if not (isinstance(saved, dict) and all(isinstance(v, torch.Tensor) for v in saved.values())):
        return f"a {type(saved).__name__}, not a state_dict"
    return {str(k): v.detach().cpu().double() for k, v in saved.items()}


def observe_ddp_worker(fn, case: dict) -> dict:
    """Run ``fn`` as ``world_size`` fresh processes, each with its own empty ``out_dir``.

    Returns, in this order: the process group each rank joined (read from torch after its
    ``init_process_group`` returned), the files each rank saved in its own folder, whether the
    ranks' ``rank{r}.pt`` hold the same weights, rank 0's weights (float64, exact), the group
    each rank still had when ``worker`` returned, and whether ranks that ended apart all-reduced
    only single numbers (a loss, not the gradients; False while they agree).

    A case with ``"saving fails"`` gives each rank a file for its ``out_dir``, so that the worker
    fails after training; its ranks may raise, and only the group each still had is returned.
    """
    world_size, label = case["world_size"], label_ddp(case)
    failing = case.get("saving fails", False)
    if not isinstance(fn, types.FunctionType):
        raise Mistake(DDP, f"`worker` should be a function defined with `def`, not "
                           f"{type(fn).__name__}.")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="forge-ch11-") as root:
        for _ in range(PORT_TRIES):  # each try in folders of its own
            attempt = tempfile.mkdtemp(prefix="try-", dir=root)
            if failing:  # a file where the folder should be: torch.save and os.makedirs fail
                out_dirs = [_a_file(attempt) for _ in range(world_size)]
            else:
                out_dirs = [tempfile.mkdtemp(prefix="out-", dir=attempt) for _ in
                            range(world_size)]  # fmt: skip
            reports = tempfile.mkdtemp(prefix="reports-", dir=attempt)
            run = _start_ranks(fn, world_size, out_dirs, reports)
            if not any(report and report["port taken"] for report in run["ranks"]):
                break
        failed = [(r["time"], rank, r["error"]) for rank, r in enumerate(run["ranks"])
                  if r is not None and r["error"] is not None]  # fmt: skip
        if failed and not failing:  # the first to fail is the cause; its peers failed after it
            raise Mistake(DDP, min(failed)[2])
        if run["timed_out"]:
            raise Mistake(
                DDP,
                f"the ranks did not finish within {DDP_TIMEOUT_S} s ({label}) and were stopped. "
                "A rank waits forever when the others never join or skip a collective: check "
                "that every rank calls init_process_group with the same world_size and port, and "
                "runs the same number of steps.",
            )
        if any(report is None for report in run["ranks"]):
            raise Mistake(DDP, f"a rank crashed ({label}): exit codes {run['exitcodes']}.")
        intact = all(report["intact"] for report in run["ranks"])
        left = [report["left"] for report in run["ranks"]]
        if failing:
            return {
                "the check's watch on init_process_group was left in place": intact,
                "the process group each rank still had after saving failed": left,
            }
        saved = [sorted(p.name for p in Path(d).iterdir()) for d in out_dirs]
        weights = [_weights(Path(d, f"rank{rank}.pt")) for rank, d in enumerate(out_dirs)]
    same = all(
        isinstance(w, dict) and w.keys() == weights[0].keys()
        and all(torch.equal(w[k], weights[0][k]) for k in w)
        for w in weights
    )  # fmt: skip
    apart = not same and all(isinstance(w, dict) for w in weights)
    return {
        "the check's watch on init_process_group was left in place": intact,
        "the process group each rank joined": [report["joined"] for report in run["ranks"]],
        "the files each rank saved in its own out_dir": saved,
        "every rank saved the same weights": same,
        "the weights rank 0 saved": weights[0],
        "the process group each rank still had after `worker` returned": left,
        "the ranks ended apart, having all-reduced only single numbers": apart
        and all(report["reduced only single numbers"] for report in run["ranks"]),
    }


def _a_file(folder: str) -> str:
    handle, path = tempfile.mkstemp(prefix="out-", dir=folder)
    os.close(handle)
    return path
