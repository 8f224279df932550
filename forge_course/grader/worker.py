"""The grading worker: a warm process that runs each exercise's answer in a fresh child.

Started by `forge_course.grader.sandbox` inside the sandbox, where it serves one submission
after another (each job's child, and whatever it left, is gone before the next), from a staged
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
behind is killed, the server answers ``{"id": 3, "output": "<the pipe's text>", "exit": code,
"limit": "<the total it went over, or nothing>", "peaks": {<the most it used of each: Watch>},
"restart": <true where it could not empty /tmp or /dev/shm, or end what the job started: it
then exits>}``. The verdict is reached by the grader, never here.

What learner code does that the audit hook refuses (memory searches, trace hooks, native
libraries loaded by name, frames of the call stack, a function's code replaced) is written to
the pipe at once as ``{"tampered": [...]}``, before the refusal is raised, so no later code can
take it back. Before each line, the job checks that nothing the observation relies on was
replaced (`_watched`) and that the pipe is still the channel it was given; what it checks and
writes with was bound before the learner's cell ran, out of that code's reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import dis
import gc
import importlib
import itertools
import json
import os
import random
import resource
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
from errno import EMFILE

PR_SET_DUMPABLE = 4
# Bytes a job may send through its channel, and print (stdout and stderr together): more is a
# flood, which ends the job as over a limit. What it prints is counted and dropped, never kept.
MAX_OUTPUT = 16 * 2**20
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
# Attributes that hand out a frame (each raises the audit event "object.__getattr__").
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# What learner code must leave alone: patching any of these could bend an observation.
WATCHED_MODULES = ("builtins", "math", "json", "json.encoder", "numpy", "torch",
                   "torch.nn.functional", "torch.testing", "torch.autograd", "torch.optim",
                   "forge_course.grader.codec")  # fmt: skip
# Whose every attribute is watched, constants included: the check's own code.
EVERY_ATTRIBUTE = (OBSERVERS, "forge_course.grader.codec")
# Entries that change without being patched: the slot-name cache copyreg adds to a class the
# first time one of its objects is pickled, and the storage class `torch.set_default_dtype`
# re-points (a default dtype left changed is for the observers to report, as a mistake).
UNWATCHED = frozenset({"__slotnames__", "Storage"})


def _not_dumpable() -> None:
    """Forbid other processes of this user to ptrace this one or open its /proc files."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the other layers remain
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _owners() -> dict[str, object]:
    """What the observation relies on: the watched modules, the observers, and every module and
    class an observer names (an observer's ``os`` or ``Path`` is as much its instrument)."""
    owners = {m: sys.modules[m] for m in WATCHED_MODULES if m in sys.modules}
    for name in [m for m in sys.modules if m.startswith(OBSERVERS)]:
        owners[name] = sys.modules[name]
        for value in list(vars(sys.modules[name]).values()):
            if isinstance(value, types.ModuleType):
                owners.setdefault(value.__name__, value)
            elif isinstance(value, type):
                owners.setdefault(f"{value.__module__}.{value.__qualname__}", value)
    return owners


def _watched() -> dict[str, tuple]:
    """What every owner (`_owners`) holds that the observation relies on, by identity: its
    functions and classes with their code and default arguments (``json.dumps``'s keyword
    defaults choose its encoder), and for the observers, the codec and the classes a result
    line is made with, every attribute (a constant, a separator or a property bends the line as
    well as a method does). Whatever learner code rebinds here can only add differences."""
    import torch

    whole = {"torch.Tensor": torch.Tensor, "torch.nn.Module": torch.nn.Module,
             "torch.optim.Optimizer": torch.optim.Optimizer,
             "json.JSONEncoder": json.JSONEncoder}  # fmt: skip
    function, method = types.FunctionType, (types.MethodType, classmethod, staticmethod)
    optimizer = torch.optim.Optimizer
    seen = {}
    for name, owner in [*_owners().items(), *whole.items()]:
        every = name in whole or name.startswith(EVERY_ATTRIBUTE)
        # torch wraps an optimizer class's step the first time one is made (for its profiler)
        moving = {"step"} if isinstance(owner, type) and issubclass(owner, optimizer) else ()
        entries = {
            attr: value
            for attr, value in list(vars(owner).items())
            if attr not in UNWATCHED and attr not in moving and (every or callable(value))
        }
        internals = []
        for attr, value in entries.items():
            inner = value.__func__ if isinstance(value, method) else value
            if isinstance(inner, function):
                # Its keyword defaults are a dict, which can change in place: its items count.
                keywords = tuple((inner.__kwdefaults__ or {}).items())
                internals.append((attr, inner, inner.__code__, inner.__defaults__, keywords))
        keys = frozenset(vars(owner)) - UNWATCHED if isinstance(owner, type) else None
        seen[name] = (owner, entries, internals, keys)
    return seen


def _replaced(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """What differs between two `_watched` snapshots, by name; compared by identity only, so
    no object learner code made can answer for itself. Whether anything differs is decided
    without a built-in function, which learner code could rebind (``builtins`` is watched, so
    a rebound one is itself found)."""
    found = []
    for name, (owner, entries, internals, keys) in before.items():
        now = after.get(name)
        if now is None or now[0] is not owner:
            found.append(name)
            continue
        held = now[1]
        found += [f"{name}.{a}" for a, v in entries.items() if a not in held or held[a] is not v]
        for attr, inner, code, defaults, keywords in internals:
            current = tuple((inner.__kwdefaults__ or {}).items())
            if (
                inner.__code__ is not code
                or inner.__defaults__ is not defaults
                or len(current) != len(keywords)
                or any(k is not j or v is not w for (k, v), (j, w) in zip(current, keywords))
            ):
                found.append(f"{name}.{attr}")
        if keys is not None and now[3] != keys:
            found.append(f"{name}.__dict__ keys")
    return found


def _evidence(names: list[str]) -> str:
    """The tamper report as a JSON line, built without the json module, which learner code may
    have patched to rewrite exactly this line."""
    quoted = []
    for name in names:
        safe = "".join(c if c.isalnum() or c in " ._:()-,`'" else "?" for c in str(name))
        quoted.append('"' + safe + '"')
    return '{"tampered": [' + ", ".join(quoted) + "]}\n"


# traceback's generators that yield a traceback's frames, and the summary they feed (its own
# method from Python 3.11, `extract` itself before).
_EXTRACTS = getattr(
    traceback.StackSummary, "_extract_from_extended_frame_gen", traceback.StackSummary.extract
).__func__
_WALKS = {traceback.walk_tb.__code__}
if hasattr(traceback, "_walk_tb_with_full_positions"):  # Python 3.11 and later
    _WALKS.add(traceback._walk_tb_with_full_positions.__code__)


# The hook and everything it calls are closures over what they use, bound when it is installed:
# a builtin, a module's attribute or a global of this module rebound by learner code (``type``,
# ``itertools.islice``, ``worker._EXTRACTS``) would otherwise run the learner's code inside the
# hook, where the thread's own frame lookups go unchecked, or bend its verdict.


def _handed_on_whole_check():
    """``handed_on_whole(walk, consumer)``: whether the frames that ``walk`` (a `traceback`
    walk generator's frame) yields go to traceback's own summary and no further: ``consumer``,
    the code resuming it, must iterate that very generator (not a ``map`` or ``filter`` around
    it, which would hand each frame to a function of the caller's), into a summary that keeps
    no locals."""
    type_of, length, generator, islice = type, len, types.GeneratorType, itertools.islice
    referents = gc.get_referents  # its audit event comes while the hook is looking: let through
    extracts_code, extracts_globals = _EXTRACTS.__code__, _EXTRACTS.__globals__

    def handed_on_whole(walk: types.FrameType, consumer: types.FrameType) -> bool:
        given = consumer.f_locals.get("frame_gen")
        if type_of(given) is islice:  # the summary's own `limit`: what it wraps counts
            inner = [r for r in referents(given) if type_of(r) is generator]
            given = inner[0] if length(inner) == 1 else None
        if type_of(given) is not generator or given.gi_frame is not walk:
            return False
        summary = consumer if consumer.f_code is extracts_code else consumer.f_back
        return (
            summary is not None
            and summary.f_code is extracts_code
            and summary.f_globals is extracts_globals
            and summary.f_locals.get("capture_locals") is False
        )

    return handed_on_whole


def _names(code: types.CodeType) -> set[str]:
    """Every global (or attribute) name ``code`` and the functions defined in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _where_it_takes_frames(code: types.CodeType) -> frozenset[int]:
    """The offsets of ``code``'s own instructions that take a frame: a frame attribute read
    (``tb.tb_frame``), or a call of ``_getframe``, from the attribute's load to the call. An
    event at any other instruction comes from C code the reader was given by its caller and
    is running (``map(sys._getframe, [0])`` as a namedtuple's field names)."""
    loads, calls = ("LOAD_ATTR", "LOAD_METHOD"), ("CALL", "CALL_FUNCTION", "CALL_METHOD")
    offsets, calling = set(), False
    for instruction in dis.get_instructions(code):
        if instruction.opname in loads and instruction.argval in FRAME_ATTRIBUTES:
            offsets.add(instruction.offset)
        calling = calling or (instruction.opname in loads and instruction.argval == "_getframe")
        if calling:
            offsets.add(instruction.offset)
            calling = instruction.opname not in calls
    return frozenset(offsets)


def _untouched_check(codes: dict[types.CodeType, dict]):
    """``untouched(code, home)``: whether what a frame reader relies on is as it was when
    grading began, compared by identity: the globals ``code`` (a reader's or its caller's) uses
    in its own module ``home``, the callables it reads on the modules among them
    (``collections.deque`` is handed traceback's frames), and the whole of `traceback`,
    `linecache` and their summaries, to which a reader may hand the frame it took
    (`Logger.findCaller` to `traceback.print_stack`). A learner's rebinding of any of them
    (``logging._is_internal_frame = grab``) would receive the frames. Each dict is walked once
    rather than searched: a key planted in it could run code when compared."""
    import linecache

    type_of, length, str_type, missing = type, len, str, object()

    def holds(entries, expected: dict, absent=frozenset()) -> bool:
        found = 0
        for key, value in entries.items():
            if type_of(key) is not str_type or key in absent:
                return False
            want = expected.get(key, missing)
            if want is not missing:
                if want is not value:
                    return False
                found += 1
        return found == length(expected)

    uses = {}
    for code, home in codes.items():
        names = _names(code)
        used = {n: home[n] for n in names if n in home}
        modules = [
            (vars(m), {a: v for a, v in vars(m).items() if a in names and callable(v)})
            for m in used.values()
            if isinstance(m, types.ModuleType)
        ]
        uses[code] = (used, frozenset(names - used.keys()), modules)  # builtins: none shadowed
    whole = [traceback.__dict__, linecache.__dict__, vars(traceback.StackSummary),
             vars(traceback.FrameSummary)]  # fmt: skip
    whole = [(d, dict(d)) for d in whole]

    def untouched(code: types.CodeType, home: dict) -> bool:
        used, absent, modules = uses[code]
        if not holds(home, used, absent):
            return False
        for entries, expected in modules:
            if not holds(entries, expected):
                return False
        for now, then in whole:  # noqa: SIM110  (``all`` is a builtin: learner code may rebind it)
            if length(now) != length(then) or not holds(now, then):
                return False
        return True

    return untouched


def _frame_readers() -> dict:
    """Library code that takes a frame for its own use and hands none on, by code object: the
    globals it must run with (its module's, not a copy made to run its code over other names),
    and the code that must be calling it, with that code's globals (None: any caller). A frame
    handed to learner code would lead, frame by frame, to the check's own variables: the
    observer's instruments, the channel."""
    import collections
    import enum
    import logging
    import typing

    import typing_extensions

    extract = traceback.StackSummary.extract.__func__.__code__
    home = traceback.__dict__
    gathers = {c: home for c in extract.co_consts if isinstance(c, types.CodeType)}
    gathers[_EXTRACTS.__code__] = home
    readers: dict = {
        traceback.format_stack: None,
        traceback.extract_stack: None,
        traceback.print_stack: None,
        typing._caller: None,
        collections.namedtuple: None,
        enum.EnumType._create_: None,
        typing_extensions._caller: None,
        traceback.walk_tb: gathers,
        logging.currentframe: {logging.Logger.findCaller.__code__: logging.__dict__},
        getattr(traceback, "_walk_tb_with_full_positions", None): gathers,
        getattr(typing_extensions, "_has_generic_or_protocol_as_origin", None): None,
        # matplotlib looks for the first caller outside itself to point its warnings at
        getattr(sys.modules.get("matplotlib._api"), "warn_external", None): None,
    }
    return {
        fn.__code__: (fn.__globals__, callers) for fn, callers in readers.items() if fn is not None
    }


def _install_audit_hook(write_now) -> None:
    """Refuse `REFUSED_EVENTS`, replacing a function's code, and frames taken by any code but
    `_frame_readers`, from here on; each refusal is reported before it is raised.

    The hook holds its own copy of everything it uses: the module's names are within reach of
    learner code, the hook is not.
    """
    refused, readers, evidence = dict(REFUSED_EVENTS), _frame_readers(), _evidence
    walks, handed_on_whole = frozenset(_WALKS), _handed_on_whole_check()
    codes = {code: home for code, (home, _) in readers.items()}
    for _, callers in readers.values():
        codes.update(callers or {})
    untouched = _untouched_check(codes)
    frame_of, thread_id, missing = sys._getframe, threading.get_ident, object()
    frame_attributes = FRAME_ATTRIBUTES
    takes_frames_at = {code: _where_it_takes_frames(code) for code in readers}
    looking: set[int] = set()  # threads in the hook's own lookups (which raise events)

    def refuse(event: str, why: str) -> None:
        write_now(evidence([f"{event}: {why}"]))
        raise RuntimeError(f"not allowed while grading: {why} ({event})")

    def hook(event: str, args: tuple) -> None:
        if thread_id() in looking:  # the hook's own frame and referent lookups
            return
        if event in refused:
            refuse(event, refused[event])
        if event == "object.__setattr__" and args[1] == "__code__":
            refuse(event, "replaces a function's code")
        takes_a_frame = event == "sys._getframe" or (
            event == "object.__getattr__" and args[1] in frame_attributes
        )
        if not takes_a_frame:
            return
        looking.add(thread_id())
        try:
            reader = frame_of(1)  # the code that asked
            home, callers = readers.get(reader.f_code, (None, missing))
            consumer = reader.f_back
            allowed = (
                callers is not missing
                and reader.f_globals is home
                and reader.f_lasti in takes_frames_at[reader.f_code]
                and untouched(reader.f_code, home)
            )
            if allowed and callers is not None:
                allowed = (
                    consumer is not None
                    and callers.get(consumer.f_code) is consumer.f_globals
                    and untouched(consumer.f_code, consumer.f_globals)
                    and (reader.f_code not in walks or handed_on_whole(reader, consumer))
                )
        finally:
            looking.discard(thread_id())
        if not allowed:
            refuse(event, "reads the call stack's frames")

    sys.addaudithook(hook)


def _seed(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _task_count(listdir=os.listdir, read=open) -> int:
    """Processes and threads in this process-id namespace, its init left out (as `Watch`
    counts them). Its defaults hold the functions it uses, out of learner code's reach."""
    count = 0
    for entry in listdir("/proc"):
        if entry.isdigit() and entry != "1":
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                read(f"/proc/{entry}/stat") as f,
            ):
                fields = f.read().rsplit(")", 1)[1].split()
                count += int(fields[17]) if fields[0] != "Z" else 0  # num_threads; no zombie
    return count


def _run_job(job: dict, write_fd: int, own_pid_namespace: bool, tasks_cap: int) -> None:
    """In the child: the set-up cell, the learner's cell, then the observations. ``tasks_cap``:
    the most processes and threads at once, counted before each message where the child is
    alone in its process-id namespace."""
    import torch

    from forge_course.grader.codec import to_plain
    from forge_course.observe import common
    from forge_course.observe.common import Mistake

    # Alone in its process-id namespace, the job can count the threads and processes the answer
    # starts (`common.alone`), once what torch starts on its own is running: autograd's device
    # threads (at its first backward) and CUDA's (with a context on each GPU the cases use).
    torch.ones((), requires_grad=True).backward()
    for case in job.get("cases", []):
        device = case.get("device") if isinstance(case, dict) else None
        if isinstance(device, str) and device.startswith("cuda"):
            with contextlib.suppress(RuntimeError, AssertionError):  # the observer says why
                torch.empty(1, device=device)

    # Everything the channel needs, bound before learner code runs: the module's names are
    # within its reach (it may rebind ``worker.json``), these locals are not.
    raw_write, getpid, fstat, exit_now, kill = os.write, os.getpid, os.fstat, os._exit, os.kill
    listdir, stat_path, open_path, dup2 = os.listdir, os.stat, os.open, os.dup2
    write_only = os.O_WRONLY
    dumps, snapshot, replaced_in, evidence = json.dumps, _watched, _replaced, _evidence
    limit_of = _limit_of
    tasks_now, stop = _task_count, signal.SIGKILL
    me, server = getpid(), os.getppid()
    channel = (fstat(write_fd).st_dev, fstat(write_fd).st_ino)

    def write_now(text: str) -> None:
        # Each line starts on a line of its own, so a stray partial line that learner code wrote
        # to the pipe cannot join it and make it unreadable.
        data = ("\n" + text).encode("utf-8", "replace")
        while data:
            data = data[raw_write(write_fd, data) :]

    def is_channel(fd: int) -> bool:
        try:
            info = fstat(fd)
        except OSError:
            return False
        return (info.st_dev, info.st_ino) == channel

    def channel_found() -> bool:
        """Put the channel back at its number from a copy learner code kept of it here."""
        for name in listdir("/proc/self/fd"):
            path = f"/proc/self/fd/{name}"
            try:
                info = stat_path(path)
                if (info.st_dev, info.st_ino) == channel:
                    dup2(open_path(path, write_only), write_fd)
                    return True
            except OSError:
                continue
        return False

    _seed(int(job.get("seed", 0)))
    namespace: dict = {"__name__": "__main__"}
    observer = None
    try:  # the instructor's cell: its output is not the learner's concern
        with contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
            exec(compile(job.get("prelude", ""), "<set-up cell>", "exec"), namespace)
        spec = job.get("observer")
        if spec:
            observer = getattr(importlib.import_module(spec["module"]), spec["name"])
        _close_unaudited_routes_to_frames()
    except BaseException as err:  # noqa: BLE001
        write_now(json.dumps({"setup_error": f"{type(err).__name__}: {err}"}) + "\n")
        return
    # The job's first line, written before any learner code runs: the grader takes a set-up
    # error only in its place, so an answer cannot blame the grader for its own failure.
    write_now(json.dumps({"ready": True}) + "\n")
    common.TASKS_BEFORE_ANSWER = common.last_task() if own_pid_namespace else None
    watched = snapshot()
    _install_audit_hook(write_now)

    def send(message: dict) -> None:
        if getpid() != me:  # a process the answer forked came back here: only the job speaks
            exit_now(0)
        if not is_channel(write_fd):
            # Learner code put another file at the channel's number, to speak for the job
            # through a copy of the real one. Through that copy, the job says so; when no copy
            # is left in this process, it stops its server, so that nothing the job sent counts
            # (the grader sees the worker end).
            if not channel_found():
                kill(server, signal.SIGKILL)
                exit_now(0)
            write_now(evidence(["the channel to the grader: replaced by the answer"]))
            exit_now(0)
        replaced = replaced_in(watched, snapshot())
        if replaced:  # checked before every message: nothing is sent from a patched world
            write_now(evidence(replaced))
            exit_now(0)
        if own_pid_namespace and tasks_now() > tasks_cap:
            # Threads the answer started may be gone before the server's watcher next looks, and
            # neither RLIMIT_NPROC (a grader running as root) nor a control group (none, or
            # read-only) may hold them: what the answer holds as it reports is over the limit.
            kill(me, stop)
        write_now(dumps(message, allow_nan=False) + "\n")

    try:
        exec(compile(job["answer"], "<your answer cell>", "exec"), namespace)
    except BaseException as err:  # noqa: BLE001  (SystemExit included: report, do not obey)
        send({"error": f"{type(err).__name__}: {err}"})
    else:
        send({"ran": True})

    name = job.get("function")
    if observer is not None and name not in namespace:  # the cell raised before it, or misnamed it
        send({"case": 0, "mistake": f"`{name}` is not defined: your answer cell never defined it."})
    elif observer is not None:
        fn = namespace[name]
        for i, case in enumerate(job["cases"]):
            try:
                send({"case": i, "observation": to_plain(observer(fn, case))})
            except Mistake as mistake:
                send({"case": i, "mistake": str(mistake), **limit_of(mistake)})
                break  # one failed case decides the exercise; the rest would only cost time
            except BaseException as err:  # noqa: BLE001
                send({"case": i, "mistake": f"{type(err).__name__}: {err}", **limit_of(err)})
                break
    names = job.get("variables", [])
    if names:
        send({"variables": {n: to_plain(namespace.get(n)) for n in names}})
    send({"done": True})


def _refusing(what: str):
    """A function that refuses, saying ``what`` it would have done; it holds nothing else."""

    def refuse(*args, **kwargs):
        raise RuntimeError(f"not allowed while grading: {what}")

    return refuse


# Extension modules no answer needs and that hand out the interpreter's internals.
_TEST_EXTENSIONS = frozenset({
    "_testcapi", "_testinternalcapi", "_testmultiphase", "_testsinglephase", "_testbuffer",
    "_testimportmultiple", "_testclinic", "_ctypes_test", "_xxsubinterpreters",
    "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues", "_xxtestfuzz",
})  # fmt: skip


def _loads_no_builtin_afresh(create_dynamic):
    """``_imp.create_dynamic``, for every extension module but a built-in one (its init
    function lies in libpython, which any file path to it reaches) or a test module of
    CPython's. The real function lives only in a suspended generator's frame, which learner
    code cannot read, and the checks run there on values read once from the spec."""

    def keeper(real, refused, make, type_of=type, str_type=str, base=BaseException):
        outcome = None
        while True:
            spec, file = yield outcome
            try:
                name, origin = spec.name, spec.origin
                if type_of(name) is not str_type or type_of(origin) is not str_type:
                    raise ImportError("a module spec's name and origin are strings")
                if name.rpartition(".")[2] in refused:
                    raise RuntimeError(f"not allowed while grading: loads {name} afresh")
                fresh = make(name=name, origin=origin)
                outcome = (True, real(fresh) if file is None else real(fresh, file))
            except base as err:  # noqa: BLE001  (handed back to the caller as it was)
                outcome = (False, err)

    refused = frozenset(sys.builtin_module_names) | _TEST_EXTENSIONS
    gate = keeper(create_dynamic, refused, types.SimpleNamespace)
    next(gate)

    def load(spec, file=None):
        done, result = gate.send((spec, file))
        if not done:
            raise result
        return result

    return load


def _frame_hook_only_off(set_eval_frame):
    """torch's ``set_eval_frame`` (PEP 523: the callback it is given is called at the start of
    every frame of the thread, the audit hook's own included, with its locals and closure, and
    no audit event is raised), for turning the hook off only: ``None``, as torch's own code
    does around an optimizer's step (``torch._dynamo.disable``). Anything else is refused: an
    object not callable yet could be made so later, and ``False`` ("run only") runs the
    entries loaded for a code object (``_load_precompile_entry``), whose guards are handed the
    frame's locals and whose code runs in place of the function's own. So ``torch.compile``
    does not run in a job. The real function lives only in a suspended generator's frame."""

    def keeper(real, base=BaseException):
        outcome = None
        while True:
            callback = yield outcome
            try:
                if callback is not None:
                    raise RuntimeError(
                        "not allowed while grading: torch's frame evaluation hook (torch.compile)"
                    )
                outcome = (True, real(callback))
            except base as err:  # noqa: BLE001  (handed back to the caller as it was)
                outcome = (False, err)

    gate = keeper(set_eval_frame)
    next(gate)

    def only_off(callback):
        done, result = gate.send(callback)
        if not done:
            raise result
        return result

    return only_off


def _replace_everywhere(real, stand_in) -> None:
    """Put ``stand_in`` wherever a module or a class holds ``real``."""
    for holder in gc.get_referrers(real):
        if type(holder) is dict:
            for key in [key for key, value in holder.items() if value is real]:
                holder[key] = stand_in


def _close_unaudited_routes_to_frames() -> None:
    """Two ways of being handed a frame raise no audit event: a Python signal handler is called
    with the frame the signal interrupted, and gc's DEBUG_SAVEALL keeps in ``gc.garbage`` what a
    collection found unreachable, a frame kept alive by a traceback's cycle included. From any
    frame of the answer's own, ``f_back`` leads to the job's.

    So from here on, in the job and in every process it forks, ``signal.signal`` and
    ``gc.set_debug`` refuse, and no built-in module can be made or run afresh (a fresh ``_signal``
    or ``gc`` would hold the real functions; every built-in module is imported first, so none
    is missing; an extension module may not be one of them, loaded from libpython, nor one
    of CPython's test modules). The handlers in place that are Python code go back to the
    default. Processes started afresh (spawn, forkserver, a subprocess) hold nothing of the
    job and keep theirs; handlers installed by C code (DataLoader's workers, faulthandler)
    call no Python code. A third: torch's frame evaluation hook, which hands a callback every
    new frame's locals and closure; it may only be turned off (`_frame_hook_only_off`).
    """
    import _imp
    import _signal

    import torch

    from forge_course.observe import common

    for name in sys.builtin_module_names:
        importlib.import_module(name)
    for number in signal.valid_signals():
        handler = signal.getsignal(number)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(number, signal.SIG_DFL)
    common.without_sigchld_handler()
    _signal.signal = signal.signal = _refusing("installs a signal handler")
    gc.set_debug = _refusing("makes gc keep what it collects (gc.set_debug)")
    _imp.create_builtin = _imp.exec_builtin = _refusing("makes a built-in module afresh")
    _imp.create_dynamic = _loads_no_builtin_afresh(_imp.create_dynamic)
    frame_hook = torch._C._dynamo.eval_frame.set_eval_frame
    _replace_everywhere(frame_hook, _frame_hook_only_off(frame_hook))


def _limit_of(err: BaseException) -> dict:
    """``{"limit": which}`` where a limit of the sandbox refused what the answer asked, told by
    the exception's type along the chain the checks keep (``raise Mistake(...) from err``),
    never by its text, which the answer writes; else ``{}``."""
    for _ in range(8):
        if isinstance(err, MemoryError):
            return {"limit": "memory"}
        if isinstance(err, BlockingIOError):  # fork refused (EAGAIN): the process cap
            return {"limit": "processes"}
        if isinstance(err, OSError) and err.errno == EMFILE:  # the per-process cap on files
            return {"limit": "files"}
        err = err.__cause__ or err.__context__
        if err is None:
            break
    return {}


def _child(
    job: dict,
    write_fd: int,
    print_fd: int,
    reply_fd: int,
    limits: dict,
    workdir: str,
    own_pid_namespace: bool,
):
    """The forked child: limits on, every route to the server closed, then the job."""
    code = 0
    try:
        os.close(reply_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the next jobs arrive on stdin: not for the learner to read
        # What it prints goes to a pipe the server counts, never to the grader's stderr.
        os.dup2(print_fd, 1)
        os.dup2(print_fd, 2)
        os.close(print_fd)
        if limits.get("address_space_mb"):  # only where no control group caps resident memory
            memory = limits["address_space_mb"] * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * 2**20,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
        cpu = int(limits["seconds"]) + 5
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        _cap_gpu_memory(limits.get("gpu_memory_mb", 0))
        os.chdir(workdir)
        _run_job(job, write_fd, own_pid_namespace, limits["tasks"])
    except BaseException:  # noqa: BLE001  (whatever happens, never return into the server)
        code = 1
    finally:
        os._exit(code)


def _cap_gpu_memory(megabytes: int) -> None:
    """Hold each GPU's caching allocator to the job's memory, from the moment the job first uses
    CUDA (queued on torch's lazy initialisation, so a job that never touches the GPU creates no
    context). Several jobs share one GPU: none may take the memory its neighbours need."""
    if not megabytes:
        return
    import torch

    def cap() -> None:
        for index in range(torch.cuda.device_count()):
            total = torch.cuda.get_device_properties(index).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, megabytes * 2**20 / total), index)

    torch.cuda._lazy_call(cap)


def _reap(pid: int, channel: _Drain, printed: _Drain, watch: Watch) -> tuple[str, int, str, bool]:
    """Wait for the child, kill what it left behind, and return its channel's text, exit code,
    the limit it went over ("" when none) and whether nothing it started is left."""

    def flooded() -> str:
        return channel.over("sent to the grader") or printed.over("printed to stdout and stderr")

    status, over = watch.wait(pid, flooded)
    all_gone = _kill_leftovers(watch.own_pid_namespace)
    for drain in (channel, printed):
        drain.join(timeout=2)  # a writer that escaped the kill cannot hold the answer back
    over = over or flooded()
    output = "" if over else b"".join(channel.chunks).decode("utf-8", "replace")
    return output, os.waitstatus_to_exitcode(status), over, all_gone


class _Drain(threading.Thread):
    """Read a pipe of the job's to its end in chunks, counting the bytes and keeping them
    (``keep``) only while they are within `MAX_OUTPUT`: a flood costs no memory."""

    def __init__(self, fd: int, keep: bool):
        super().__init__(daemon=True)
        self.fd, self.keep, self.size, self.chunks = fd, keep, 0, []
        self.start()

    def run(self) -> None:
        while data := os.read(self.fd, 65536):
            self.size += len(data)
            if self.keep and self.size <= MAX_OUTPUT:
                self.chunks.append(data)
        os.close(self.fd)

    def over(self, what: str) -> str:
        if self.size <= MAX_OUTPUT:
            return ""
        return f"output: more than {MAX_OUTPUT // 2**20} MB {what}"


class Watch:
    """The submission's totals, measured and enforced while a job runs, from the server's side
    of the sandbox: learner code cannot write what the watcher reads, so what it reports is
    the grader's evidence, not the learner's.

    Alone in a process-id namespace, every process but its init (1) belongs to the
    submission, and one pass over /proc sees them all. Each pass measures, under the name of
    the limit it is checked against:

    * ``files`` and ``disk_mb``: inodes and MB in use in the sandbox's /tmp and /dev/shm;
    * ``open_files_total`` and ``open_files``: file descriptors summed over the processes,
      and the most that one holds (its own limit is a kernel rlimit);
    * ``processes``: processes and threads at once;
    * ``memory_mb``: resident memory of the job's processes (the forked child's includes what
      it shares with the server);
    * ``cpu_seconds``: CPU time of the job's processes and of the children they waited for.

    The server's threads and descriptors are counted, since the process cap counts them too.
    Its CPU time (its imports) is not charged. ``peaks`` holds each total's maximum over the
    last job, sampled every 2 to 100 ms, plus the exact figures that wait4 reports for the child.
    Outside its own namespace, /proc shows the whole machine: only the child's CPU time and peak
    memory are measured, and the grader's control group does the capping.
    """

    TOTALS = ("files", "disk_mb", "open_files", "open_files_total", "processes", "memory_mb",
              "cpu_seconds")  # fmt: skip

    def __init__(self, limits: dict, scratch: str, own_pid_namespace: bool):
        self.limits, self.own_pid_namespace = limits, own_pid_namespace
        self.folders = (scratch, "/dev/shm")  # the sandbox's own tmpfs, both
        self.cpu_spent = 0.0  # CPU seconds of the submission's earlier jobs (from the grader)
        self.peaks: dict[str, float] = {}
        self.tick = os.sysconf("SC_CLK_TCK")
        self.page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20

    def watchable(self) -> None:
        """Called in the forked child. A fork inherits the server's non-dumpable flag, which
        would hide the child's descriptors from a watcher that has no capabilities. The learner
        gains nothing from the flag's removal, since learner code runs in that process and can
        open /proc/self/mem anyway, and the server stays closed. Core dumps are turned off:
        a dumpable torch process would dump hundreds of MB into the scratch."""
        if not self.own_pid_namespace:
            return
        with contextlib.suppress(OSError, ValueError, AttributeError):  # never into the server
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)

    def wait(self, pid: int, flooded) -> tuple[int, str]:
        """Wait for the child, measuring as it runs, and kill it at the first total over its
        limit, or once ``flooded()`` names the output it went over. Return its wait status and
        the limit it went over ("" when none)."""
        self.peaks = {}
        over, pause = "", 0.002
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            over = self._over(self._measure()) or flooded()
            if over:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _, status, usage = os.wait4(pid, 0)
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        # Once more with the child reaped: its time and peak memory now come from wait4, and
        # what it left running is still there. A job faster than one pass is judged here too.
        return status, over or self._over(self._measure(usage))

    def _measure(self, usage=None) -> dict[str, float]:
        measured = self.TOTALS if self.own_pid_namespace else ("memory_mb", "cpu_seconds")
        now: dict[str, float] = dict.fromkeys(measured, 0)
        if self.own_pid_namespace:
            self._scratch(now)
            self._processes(now)
        if usage is not None:
            now["cpu_seconds"] += usage.ru_utime + usage.ru_stime
            now["memory_mb"] = max(now["memory_mb"], usage.ru_maxrss / 1024)  # kB on Linux
        for name, value in now.items():
            self.peaks[name] = max(self.peaks.get(name, 0), round(value, 3))
        return now

    def _scratch(self, now: dict[str, float]) -> None:
        for folder in self.folders:
            with contextlib.suppress(OSError):
                fs = os.statvfs(folder)
                now["files"] += fs.f_files - fs.f_ffree
                now["disk_mb"] += (fs.f_blocks - fs.f_bfree) * fs.f_frsize / 2**20

    def _processes(self, now: dict[str, float]) -> None:
        server, ticks = os.getpid(), 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or entry == "1":
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] != "Z":  # a zombie holds no thread, only its exit status
                    now["processes"] += int(fields[17])  # num_threads
                if int(entry) != server:
                    ticks += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
                    now["memory_mb"] += int(fields[21]) * self.page_mb  # rss, in pages
                held = len(os.listdir(f"/proc/{entry}/fd"))
                now["open_files_total"] += held
                now["open_files"] = max(now["open_files"], held)
        now["cpu_seconds"] += ticks / self.tick

    def _over(self, now: dict[str, float]) -> str:
        limits, get = self.limits, now.get
        checks = (  # (the total now, its limit, what going over it means)
            (get("files", 0), limits["files"], "files: more than {} files and folders"),
            (get("disk_mb", 0), limits["disk_mb"], "disk: more than {} MB in /tmp and /dev/shm"),
            (get("open_files_total", 0), limits["open_files_total"],
             "open files: more than {} file descriptors open across its processes"),
            (get("processes", 0), limits["tasks"],
             "processes: more than {} processes and threads at once"),
            (self.cpu_spent + now["cpu_seconds"], limits["cpu_seconds"],
             "CPU time: more than {:g} CPU-seconds used"),
        )  # fmt: skip
        return next((text.format(limit) for value, limit, text in checks if value > limit), "")


def _kill_leftovers(own_pid_namespace: bool) -> bool:
    """Alone in a process-id namespace, every process but its init (1) and this server is the
    child's: kill them all, whatever group or session they moved to, and say whether none is
    left. Elsewhere they share the server's process group, which the grader kills when the
    submission is done."""
    if not own_pid_namespace:
        return True
    mine = {1, os.getpid()}
    for _ in range(100):  # a fork bomb forks behind one pass: again, until none is left
        # Those the answer made this server's children (clone's CLONE_PARENT, from a process
        # that replaced the job with exec) are its to reap: left, they would stay as zombies.
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        left = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
        left = [pid for pid in left if pid not in mine]
        if not left:
            return True
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)  # for the sandbox's init to reap the others
    return False


def _clear(folder: str, mode: int) -> None:
    """Empty a folder the jobs could write to and give it back its mode, so that the next job,
    which may be another student's, finds nothing of this one, whatever modes it set. Mount
    points are kept and never entered (a read-only interpreter below /tmp, as in a clone in
    /tmp): nothing can be written there. Iterative: a job may nest folders thousands deep."""
    try:
        os.chmod(folder, mode)
        device = os.stat(folder).st_dev
    except OSError:
        return
    stack, emptied = [folder], []
    while stack:
        emptied.append(stack.pop())
        with contextlib.suppress(OSError):
            for entry in os.scandir(emptied[-1]):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_dev != device:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        os.chmod(entry.path, 0o700)
                        stack.append(entry.path)
                    else:
                        os.unlink(entry.path)
    for path in reversed(emptied[1:]):  # each folder after everything below it
        with contextlib.suppress(OSError):
            os.rmdir(path)  # kept only where a mount point lies below


def _contents(folder: str) -> set[str] | None:
    """Every path below ``folder`` on its file system (mount points listed, not entered);
    None where something cannot be read."""
    try:
        device = os.stat(folder).st_dev
    except OSError:
        return None
    found, stack = set(), [folder]
    while stack:
        try:
            for entry in os.scandir(stack.pop()):
                found.add(entry.path)
                if entry.is_dir(follow_symlinks=False) and (
                    entry.stat(follow_symlinks=False).st_dev == device
                ):
                    stack.append(entry.path)
        except OSError:
            return None
    return found


def _holds_no_more(folder: str, first: set[str] | None) -> bool:
    now = _contents(folder)
    return now is not None and first is not None and now <= first


def serve(limits: dict, own_pid_namespace: bool) -> int:
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed goes to stderr, never to the grader's channel
    sys.stdout = sys.stderr
    _not_dumpable()
    import matplotlib  # the expensive imports, paid once per worker; none touches CUDA

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import torch
    import torch._dynamo  # noqa: F401  (an optimizer imports it; it rewraps torch functions)

    import forge_course.grader.codec  # noqa: F401
    import forge_course.observe.common  # noqa: F401

    scratch = tempfile.gettempdir()
    folders = (scratch, "/dev/shm") if own_pid_namespace else (scratch,)  # else the machine's
    modes = {folder: os.stat(folder).st_mode & 0o7777 for folder in folders}
    found_first = {folder: _contents(folder) for folder in folders}
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
        print_read, print_write = os.pipe()
        watch.cpu_spent = float(job.get("cpu_spent", 0.0))
        # Started before the fork: while the job runs, only its own processes start any (what
        # `observe.common.alone` counts in this process-id namespace).
        channel, printed = _Drain(read_fd, keep=True), _Drain(print_read, keep=False)
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            os.close(print_read)
            watch.watchable()
            _child(job, write_fd, print_write, reply.fileno(), limits, workdir, own_pid_namespace)
        os.close(write_fd)
        os.close(print_write)
        output, code, over, all_gone = _reap(pid, channel, printed, watch)
        for folder in folders:
            _clear(folder, modes[folder])
        # What could not be cleared (folders nested past the longest path, a process that
        # would not end) ends this worker: the grader starts a fresh sandbox for the next job.
        uncleared = [f for f in folders if not _holds_no_more(f, found_first[f])]
        restart = bool(uncleared) or not all_gone
        answer = {"id": job["id"], "output": output, "exit": code, "limit": over,
                  "peaks": watch.peaks, "restart": restart}  # fmt: skip
        reply.write(json.dumps(answer) + "\n")
        if restart:
            return 0
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
