"""Chapter 09's learner half: run the interrupted training, call the answer, report plain data.

``ch09_checkpoint`` is observed in two halves, so that each function is judged on its own and
this module needs neither a working save nor a working load:

* `observe_save`: the learner's ``save_checkpoint`` is called during a run that is then killed;
  what the file holds at that moment is reported entry by entry (the grader compares it with
  what a correct save writes at the same moment), with how each save put its file at ``path``
  (the kernel's own account of what happened to that name) and whether the file was synced
  before it got there; then a save that fails half-way shows whether the write is atomic.
* `observe_load`: a file written at the same moment by a plain, non-atomic ``torch.save`` (all a
  file to read needs; not the exercise's save) is resumed by the learner's ``load_checkpoint``
  with fresh objects from another seed, and the finished run is compared with the
  uninterrupted one. Then checkpoints with code hidden in them are loaded, each naming its
  code another way (a function of the standard library, ``exec``, a function of torch, a
  module whose name the answer cannot know in advance), so that a load that refuses only the
  names it expects still runs one. The hidden code changes a file in a folder the load is not
  given, and the kernel stamps the change on that file and on any move of its folder: no
  process of the learner's can set either back, and the check reads them through functions
  bound before any answer ran, so the evidence does not depend on anything in this process's
  memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import stat
import struct
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

from forge_course.observe import common
from forge_course.observe.ch04 import Settings
from forge_course.observe.common import Mistake, call_answer

try:
    import fcntl
except ImportError:  # Windows: which files are open cannot be asked, so it is not observed
    fcntl = None

CHECKPOINT, STOPPING = "ch09_checkpoint", "ch09_early_stopping"
FILE = "checkpoint.pt"
NOT_REACHED = "not reached"
# What the evidence is read and made with, bound when this module is imported, before any
# answer runs: an answer that later replaces ``os.fstat`` or ``os.chmod`` changes none of these.
_open, _close, _dup, _fstat, _chmod = os.open, os.close, os.dup, os.fstat, os.chmod
_stat, _read, _sleep = os.stat, os.read, time.sleep


def _attempt(name: str, fn, *args, case: str = ""):
    """``(result, None)``, or ``(None, error)`` when the learner's code raised an error.

    An unwritten answer, or one the notebook's tripwire stopped (it called a reference), still
    fails the check at once.
    """
    try:
        return call_answer(CHECKPOINT, name, fn, *args, case=case), None
    except Mistake as err:
        cause = err.__cause__
        if cause is None or common._translate(cause) is not None:
            raise
        return None, cause


def label_checkpoint(case: dict) -> str:
    return (
        f"{case['steps']} steps, checkpoint every {case['every']}, killed during step "
        f"{case['crash_at']}, seed {case['seed']}, {case['device']}"
    )


# ---------------------------------------------------------------- the run that gets killed


def _build(seed: int, device: str):
    """Seed every generator, then build data, model, optimizer and scheduler from them."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(1234)  # the dataset is the same for every run
    x = torch.randn(64, 4, generator=data)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return (x, y), model, optimizer, scheduler


def _train_step(data, model, optimizer, scheduler, device: str) -> float:
    """One step that draws from all three generators: torch, Python and NumPy."""
    x, y = data
    index = torch.randint(0, len(x), (8,))  # torch's CPU generator picks the batch
    noise = torch.from_numpy(np.random.normal(0.0, 0.1, (8, 4))).float()  # NumPy's jitters it
    scale = random.uniform(0.8, 1.2)  # Python's scales it
    inputs = (x[index] * scale + noise).to(device)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(inputs), y[index].to(device))
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


@contextlib.contextmanager
def _generators_kept():
    """Leave every global generator as it was: the check must not change the notebook's run."""
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy)


def _run_until_the_crash(case: dict, path: str | Path, save) -> list[float]:
    """Train from the case's seed, calling ``save`` every ``every`` steps; step ``crash_at``
    never completes. Returns the losses of the completed steps."""
    device = case["device"]
    data, model, optimizer, scheduler = _build(case["seed"], device)
    losses = []
    for step in range(1, case["crash_at"]):
        losses.append(_train_step(data, model, optimizer, scheduler, device))
        if step % case["every"] == 0:
            save(path, model, optimizer, scheduler, step)
    return losses


def _load_status(path: Path) -> tuple[str, dict | None]:
    try:
        return "loads", torch.load(path, weights_only=True)
    except FileNotFoundError:
        return "no file was written at `path`", None
    except Exception as err:  # noqa: BLE001  (any refusal is the observation)
        return f"refused: {type(err).__name__}", None


# ------------------------------------------------ half 1: what the learner's save writes

WEIGHTS_ONLY = "torch.load(path, weights_only=True)"
ENTRIES = (  # what the file must hold, by the path to it
    ("checkpoint['model']", ("model",)),
    ("checkpoint['optimizer']", ("optimizer",)),
    ("checkpoint['scheduler']", ("scheduler",)),
    ("checkpoint['step']", ("step",)),
    ("checkpoint['rng']['torch']", ("rng", "torch")),
    ("checkpoint['rng']['python']", ("rng", "python")),
    ("checkpoint['rng']['numpy']", ("rng", "numpy")),
)
RAISES = "a save that fails half-way"
FILE_AFTER = "the file at `path` after the failed save"
LEFT = "files the failed save left in the folder"
ELSEWHERE = "a file outside the checkpoint's folder was being written when the save failed"
KEPT_OPEN = "descriptors of the checkpoint's folder or its files a save left open"
PLACED = "how each save puts its file at `path`"
RENAMED = "renamed onto it in one step"
WRITTEN = "written into it: while that lasts, `path` holds part of a checkpoint"
DELETED = "deleted first: until the new file is in place, there is no checkpoint at all"
SYNCED = "the file renamed onto `path`, at the rename"
SYNCED_FIRST = "already synced to disk (os.fsync)"
NEVER_SYNCED = "never synced: no os.fsync of it during the save"
SYNCED_LATE = "not yet synced: os.fsync came only after the rename"


def _plain(value):
    """``value`` with its spelling taken out: tuples as lists, keys as strings, tensors and
    NumPy arrays of whole numbers as lists, tensors detached on the CPU."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (torch.Tensor, np.ndarray)):
        tensor = torch.as_tensor(value).detach().cpu()
        if tensor.dtype == torch.uint8 or tensor.is_floating_point():
            return tensor.clone()
        return tensor.tolist()  # NumPy's keys, saved as a tensor of whole numbers
    if isinstance(value, np.generic):
        return value.item()
    return value


def _entry(payload: dict, keys: tuple[str, ...]):
    value = payload
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return "missing"
        value = value[key]
    if keys == ("step",) and isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return _plain(value)


def _missing_keys(payload) -> list[str]:
    """The top-level entries the exercise's format needs and the file lacks."""
    if not isinstance(payload, dict):
        return [f"dict (it holds a {type(payload).__name__})"]
    missing = [repr(k) for k in ("model", "optimizer", "scheduler", "step", "rng") if k not in
               payload]  # fmt: skip
    if "rng" in payload and not isinstance(payload["rng"], dict):
        missing.append('dict under "rng"')
    return missing


class _DiskFull(RuntimeError):
    """Raised while a checkpoint is being written, as a full disk would."""


STILL_OPEN_S = 0.05  # how long a file outside must stay open to be the failed save's own


class _Unwritable:
    """Fails to be written; first it notes whether the save was writing outside the folder."""

    def __init__(self, folder: Path, open_before: set[tuple[int, int, int]]):
        self.folder, self.outside = folder, False
        self.open_before = {(dev, ino) for dev, ino, _ in open_before}

    def __reduce__(self):
        with contextlib.suppress(OSError):  # the folder changing under us: nothing to note
            here = {(info.st_dev, info.st_ino) for info in map(os.stat, _files_under(self.folder))}
            folder_device = self.folder.stat().st_dev

            def new_files(held=None, skip=frozenset()) -> dict:
                return {(dev, ino): links for dev, ino, links in
                        _files_open_for_writing(held, skip)
                        if (dev, ino) not in self.open_before}  # fmt: skip

            def inside(file, links) -> bool:
                # In the folder (or a folder inside it), or an unnamed file on the folder's file
                # system (an O_TMPFILE there): where a rename onto `path` is atomic.
                return file in here or (links == 0 and file[0] == folder_device)

            # Only a save writing nothing inside can be writing outside, and only what stays
            # open while the save is held here is its own: another thread of the process
            # (IPython's history journal, a logger) may open a file anywhere for a moment.
            held: list[int] = []  # while held, no new file can take these files' inodes
            new = new_files(held)
            try:
                if new and not any(inside(*item) for item in new.items()):
                    _sleep(STILL_OPEN_S)
                    still = new_files(skip=set(held))
                    new = {file: links for file, links in new.items() if file in still}
            finally:
                for fd in held:
                    _close(fd)
            self.outside = bool(new) and not any(inside(*item) for item in new.items())
        raise _DiskFull("no space left on device (simulated)")


def _files_under(folder: Path) -> list[Path]:
    """Every file in ``folder`` and in the folders inside it (a ``TemporaryDirectory`` made in
    the checkpoint's folder holds its temporary file one level down)."""
    return [Path(root) / name for root, _, names in os.walk(folder) for name in names]


class _FailingScheduler:
    """A scheduler whose state cannot be written: the save fails half-way through the file."""

    def __init__(self, unwritable: _Unwritable):
        self.unwritable = unwritable

    def state_dict(self):
        return {"last_epoch": 7, "broken": self.unwritable}


def _files_open_for_writing(
    held: list[int] | None = None, skip: frozenset | set = frozenset()
) -> set[tuple[int, int, int]]:
    """``(device, inode, links)`` of every regular file this process has open for writing
    (through a descriptor not in ``skip``).

    Each descriptor is looked at through a copy of it: another thread may close it and open
    another file under its number meanwhile. Those copies are appended to ``held``, if given,
    for the caller to close: while they are open, no new file can have those inodes.
    """
    if fcntl is None:
        return set()
    try:
        descriptors = [int(name) for name in os.listdir("/dev/fd")]
    except OSError:
        return set()
    found = set()
    for fd in set(descriptors) - set(skip):
        try:
            copy = _dup(fd)
        except OSError:  # the descriptor of the listing itself, closed by now
            continue
        with contextlib.suppress(OSError):
            info, flags = _fstat(copy), fcntl.fcntl(copy, fcntl.F_GETFL)
            if stat.S_ISREG(info.st_mode) and flags & os.O_ACCMODE != os.O_RDONLY:
                found.add((info.st_dev, info.st_ino, info.st_nlink))
                if held is not None:
                    held.append(copy)
                    continue
        _close(copy)
    return found


def _descriptors_into(folder: Path) -> set[int]:
    """This process's file descriptors that name ``folder`` or a file in it (Linux's
    /proc/self/fd; elsewhere none are seen, so nothing is observed)."""
    found = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if Path(os.readlink(f"/proc/self/fd/{name}")).is_relative_to(folder):
                    found.add(int(name))
    return found


# How a save puts its file at `path`: Linux's inotify queues, in order, what happens to each
# name in a folder, and the queue is read once the save has returned. Elsewhere nothing is seen,
# so nothing is judged.
IN_MODIFY, IN_DELETE = 0x2, 0x200  # a rename onto the name (IN_MOVED_TO) is what is wanted
_EVENT_SIZE = struct.calcsize("iIII")  # struct inotify_event, before its name


def _inotify():
    """``inotify_init1`` and ``inotify_add_watch`` from the C library, or None where there are
    none (not Linux)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.inotify_init1, libc.inotify_add_watch
    return None


_INOTIFY = _inotify()  # looked up when this module is imported, before any answer runs


def _watch(folder: Path) -> int | None:
    if _INOTIFY is None:
        return None
    init, add_watch = _INOTIFY
    fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        return None
    if add_watch(fd, os.fsencode(folder), IN_MODIFY | IN_DELETE) < 0:
        _close(fd)
        return None
    return fd


@contextlib.contextmanager
def _what_happens_to(path: Path):
    """Yield a list that, once the body has run, holds what it did to the name ``path`` other
    than renaming a file onto it, in order: "written" or "deleted" (empty where nothing can be
    seen)."""
    happened: list[str] = []
    fd = _watch(path.parent)
    try:
        yield happened
    finally:
        if fd is not None:
            data = b""
            with contextlib.suppress(BlockingIOError):
                while chunk := _read(fd, 65536):
                    data += chunk
            _close(fd)
            name, offset = os.fsencode(path.name), 0
            while offset + _EVENT_SIZE <= len(data):
                _, mask, _, length = struct.unpack_from("iIII", data, offset)
                start = offset + _EVENT_SIZE
                if data[start : start + length].rstrip(b"\0") == name:
                    happened.append("deleted" if mask & IN_DELETE else "written")
                offset = start + length


def _placed(happened: list[str]) -> str:
    """A rename alone keeps `path` whole at every moment; a write into it, or a deletion before
    the new file is there, does not (a backup made by renaming the old file away is fine)."""
    if not happened:
        return RENAMED
    return DELETED if happened[0] == "deleted" else WRITTEN


# Whether the file was synced before its rename: os.fsync, os.fdatasync and os.sync are
# replaced, while a save runs, by functions that note what each call syncs and which file
# `path` named at that moment. One replacement serves every save watched at once (threads).
_SYNC_CALLS = {name: getattr(os, name) for name in ("fsync", "fdatasync", "sync") if
               hasattr(os, name)}  # fmt: skip
EVERYTHING = "everything"  # what os.sync syncs
_watched_saves: dict[int, tuple[Path, list]] = {}
_put_back: dict = {}  # what os held before: put back as found, whatever that was
_watched_saves_lock = threading.Lock()


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        info = _stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _note_sync(synced) -> None:
    for path, notes in list(_watched_saves.values()):
        notes.append((synced, _file_id(path)))


def _noting(name: str):
    real = _SYNC_CALLS[name]
    if name == "sync":

        def noted():
            _note_sync(EVERYTHING)
            return real()

    else:

        def noted(fd):
            with contextlib.suppress(Exception):  # a bad argument: the real call says so
                info = _fstat(fd if isinstance(fd, int) else fd.fileno())
                _note_sync((info.st_dev, info.st_ino))
            return real(fd)

    noted.__name__ = noted.__qualname__ = name
    noted.__doc__ = real.__doc__
    return noted


_NOTING = {name: _noting(name) for name in _SYNC_CALLS}


@contextlib.contextmanager
def _syncs_during(path: Path):
    """Yield a list that, once the body has run, holds ``(what was synced, what path named
    then)`` for each sync call the body made."""
    notes: list = []
    with _watched_saves_lock:
        if not _watched_saves:
            _put_back.update({name: getattr(os, name) for name in _NOTING})
            for name, noted in _NOTING.items():
                setattr(os, name, noted)
        _watched_saves[id(notes)] = (path, notes)
    try:
        yield notes
    finally:
        with _watched_saves_lock:
            del _watched_saves[id(notes)]
            if not _watched_saves:
                for name, before in _put_back.items():
                    setattr(os, name, before)


def _synced(notes: list, path: Path) -> str:
    """Whether the file now at ``path`` was synced while it was not yet there."""
    now = _file_id(path)
    if now is None:  # no file at all: the entries say so
        return SYNCED_FIRST
    late = False
    for synced, named_then in notes:
        if synced in (now, EVERYTHING):
            if named_then != now:
                return SYNCED_FIRST
            late = True
    return SYNCED_LATE if late else NEVER_SYNCED


def _sync_unseen(fn) -> bool:
    """Whether the answer holds a sync call under a name of its own (``from os import fsync``):
    replacing os's attribute does not reach that name, so its calls cannot be seen."""
    names = getattr(fn, "__globals__", {})
    return any(value is real for value in list(names.values()) for real in _SYNC_CALLS.values())


def _failed_save(save_fn, folder: Path, case: dict, label: str) -> dict:
    """Overwrite a good checkpoint with a save that fails: the good one must survive."""
    _, model, optimizer, _ = _build(case["seed"], case["device"])
    path = folder / FILE
    before = path.read_bytes()
    names_before = {p.name for p in folder.iterdir()}
    # Held open until the save is over, so that no file it creates can get the inode of one
    # that was open before and closed since (another thread's): it would pass for old.
    held: list[int] = []
    unwritable = _Unwritable(folder, _files_open_for_writing(held))
    try:
        _, error = _attempt(
            "save_checkpoint", save_fn, path, model, optimizer, _FailingScheduler(unwritable),
            99, case=label,
        )  # fmt: skip
    finally:
        for fd in held:
            _close(fd)
    if not path.exists():
        after = "gone: the save deleted it before writing the new one"
    elif path.read_bytes() == before:
        after = "the previous checkpoint, unchanged"
    else:
        after = "overwritten by a partial file: the previous checkpoint is lost"
    # A copy of the previous checkpoint (a ``.prev`` backup) is not litter.
    left = sorted(
        p.name
        for p in folder.iterdir()
        if p.name not in names_before and not (p.is_file() and p.read_bytes() == before)
    )
    return {
        RAISES: "raises" if isinstance(error, _DiskFull) else "is silent",
        FILE_AFTER: after,
        LEFT: left,
        ELSEWHERE: unwritable.outside,
    }


def observe_save(fn, case: dict) -> dict:
    """What the learner's save_checkpoint wrote when the run was killed; then a failing save."""
    label = label_checkpoint(case)

    def save(path, model, optimizer, scheduler, step):
        settings = Settings(model)  # a save reads the generators and changes nothing
        open_before = _descriptors_into(folder)
        target = folder / FILE
        with _what_happens_to(target) as happened, _syncs_during(target) as syncs:
            call_answer(
                CHECKPOINT, "save_checkpoint", fn, path, model, optimizer, scheduler, step,
                case=label,
            )  # fmt: skip
        settings.check(CHECKPOINT, "save_checkpoint", label)
        placed.append(_placed(happened))
        # A file written into `path` has no rename to be synced before: that is judged above.
        if placed[-1] != WRITTEN and not sync_unseen:
            synced.append(_synced(syncs, target))
        # A folder opened to be synced and never closed: one descriptor lost per save.
        left_open.update(_descriptors_into(folder) - open_before)

    names = [WEIGHTS_ONLY, *(name for name, _ in ENTRIES), RAISES, FILE_AFTER, LEFT, ELSEWHERE]
    seen: dict = dict.fromkeys([*names, PLACED, SYNCED, KEPT_OPEN], NOT_REACHED)
    left_open: set[int] = set()
    placed: list[str] = []
    synced: list[str] = []
    sync_unseen = _sync_unseen(fn)
    with _generators_kept(), tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp).resolve()
        # The run passes a string and the failing save below a Path: the text allows both.
        _run_until_the_crash(case, str(folder / FILE), save)
        seen[PLACED] = next((how for how in placed if how != RENAMED), RENAMED)
        seen[SYNCED] = next((how for how in synced if how != SYNCED_FIRST), SYNCED_FIRST)
        seen[KEPT_OPEN] = len(left_open)
        seen[WEIGHTS_ONLY], payload = _load_status(folder / FILE)
        if payload is None:
            return seen
        missing = _missing_keys(payload)
        if missing:
            raise Mistake(
                CHECKPOINT,
                f"the file your save_checkpoint wrote does not follow the format asked for: it "
                f"has no {' and no '.join(missing)} ({label}). Check the keys and the nesting: "
                'a dict with "model", "optimizer", "scheduler", "step" and "rng", and under '
                '"rng" a dict with "torch", "python" and "numpy".',
            )
        seen.update({name: _entry(payload, keys) for name, keys in ENTRIES})
        seen.update(_failed_save(fn, folder, case, label))
    return seen


# ------------------------------------------------ half 2: the learner's load resumes the run


def _write_plainly(path, model, optimizer, scheduler, step) -> None:
    """The exercise's format, written straight onto ``path`` (not atomically): a file for the
    learner's load to read, which is all this half needs."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "step": step,
            "rng": {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
            },
        },
        path,
    )


def _compare(losses, model, want_losses, want_params) -> str:
    for step, (got, want) in enumerate(zip(losses, want_losses), start=1):
        if got != want:
            return (
                f"differs from the uninterrupted run from step {step} on "
                f"(loss {got:.6f} instead of {want:.6f})"
            )
    for name, param in model.named_parameters():
        if not torch.equal(param.detach().cpu(), want_params[name]):
            return f"same losses, but the final {name} differs from the uninterrupted run"
    return "identical to the uninterrupted run, bit for bit"


class _HiddenCode:
    """Unpickling this calls ``call(*args)``: code named in the file."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return (self.call, self.args)


def _unknown_module(target: str) -> types.ModuleType:
    """A module with a fresh random name, holding a function that changes ``target``."""
    name = f"_note_{os.urandom(6).hex()}"
    module = types.ModuleType(name)

    def note():
        _chmod(target, 0o640)

    note.__module__, note.__qualname__ = name, "note"
    module.note = note
    return module


def _hidden_code(target: str, unknown: types.ModuleType) -> list[_HiddenCode]:
    """Four ways a file can name code that changes ``target``, one file each."""
    return [
        _HiddenCode(_chmod, target, 0o640),
        _HiddenCode(exec, f"open({target!r}, 'w').close()"),
        _HiddenCode(torch.save, 0, target),
        _HiddenCode(unknown.note),
    ]


def _after_a_clock_tick(ctime_ns: int, folder: str) -> None:
    """Wait until the file system's clock has moved past ``ctime_ns``, so that any later change
    to a file gets a later change time (the kernel stamps times from a clock that ticks every
    few milliseconds)."""
    probe = Path(folder) / "tick"
    probe.touch(mode=0o600)
    deadline = time.monotonic() + 1.0
    mode = 0o600
    while time.monotonic() < deadline:
        mode ^= 0o040
        _chmod(probe, mode)
        if _fstat_path(probe).st_ctime_ns > ctime_ns:
            return


def _fstat_path(path) -> os.stat_result:
    fd = _open(path, os.O_RDONLY)
    try:
        return _fstat(fd)
    finally:
        _close(fd)


def _stamps(fds: list[int]) -> list[tuple]:
    """What the kernel says of each open file: which file it is, and when and how it changed."""
    found = []
    for fd in fds:
        info = _fstat(fd)
        found.append((info.st_dev, info.st_ino, info.st_mode, info.st_nlink, info.st_ctime_ns))
    return found


def _hostile_files(folder: Path, case: dict, label: str, fn) -> str:
    """Valid checkpoints, each with one extra object whose unpickling changes a file.

    The file lives in a folder of its own that the learner's function is not given. The kernel
    stamps a change time on the file whenever anything changes it (mode, contents, name, links)
    and on the folder whenever it is moved or its entries change, and no unprivileged process
    can set either back, so "did the hidden code run" is read from the file system after the
    calls, not from anything the learner's code could reach and reset.
    """
    _, model, optimizer, scheduler = _build(case["seed"], case["device"])
    payload = torch.load(folder / FILE, weights_only=True)
    errors = []
    with tempfile.TemporaryDirectory() as hidden:
        target = Path(hidden) / "untouched"
        target.touch(mode=0o600)
        unknown = _unknown_module(str(target))
        sys.modules[unknown.__name__] = unknown
        fds = [_open(hidden, os.O_RDONLY), _open(target, os.O_RDONLY)]
        try:
            before = _stamps(fds)
            _after_a_clock_tick(max(stamp[-1] for stamp in before), str(folder))
            for i, code in enumerate(_hidden_code(str(target), unknown)):
                path = folder / f"hostile-{i}.pt"
                torch.save({**payload, "note": code}, path)
                _, error = _attempt("load_checkpoint", fn, path, model, optimizer, scheduler,
                                    case=label)  # fmt: skip
                errors.append(error)
            after = _stamps(fds)
        finally:
            for fd in fds:
                _close(fd)
            sys.modules.pop(unknown.__name__, None)
    if after != before:
        return "loads it, and the code hidden in it runs"
    if all(isinstance(error, Exception) for error in errors):
        return "refuses it with an error"
    return "loads it without running the hidden code"


RUN_KEYS = ("the step load_checkpoint returns", "the resumed run")
HOSTILE = "a checkpoint with code hidden in it"


def observe_load(fn, case: dict) -> dict:
    """The learner's load_checkpoint resumes a killed run; then a file hiding code."""
    label = label_checkpoint(case)
    device, steps = case["device"], case["steps"]
    seen: dict = dict.fromkeys([*RUN_KEYS, HOSTILE], NOT_REACHED)
    with _generators_kept(), tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data, model, optimizer, scheduler = _build(case["seed"], device)
        want = [_train_step(data, model, optimizer, scheduler, device) for _ in range(steps)]
        want_params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
        before = _run_until_the_crash(case, folder / FILE, _write_plainly)

        # The crash: every live object is gone. Fresh ones come from another seed, so whatever
        # the load does not restore shows up as a difference.
        data, model, optimizer, scheduler = _build(case["seed"] + 1, device)
        settings = Settings(model, generator=False)  # a load sets the generators, and no more
        resumed_from = call_answer(CHECKPOINT, "load_checkpoint", fn, folder / FILE, model,
                                   optimizer, scheduler, case=label)  # fmt: skip
        settings.check(CHECKPOINT, "load_checkpoint", label)
        seen[RUN_KEYS[0]] = resumed_from
        if not isinstance(resumed_from, int) or not 0 <= resumed_from < case["crash_at"]:
            return seen
        after = [
            _train_step(data, model, optimizer, scheduler, device)
            for _ in range(resumed_from, steps)
        ]
        seen[RUN_KEYS[1]] = _compare(before[:resumed_from] + after, model, want, want_params)
        seen[HOSTILE] = _hostile_files(folder, case, label, fn)
    return seen


# ---------------------------------------------------------------- ch09_early_stopping


def label_early_stopping(case: dict) -> str:
    kind = " as one-element tensors" if case.get("tensors") else ""
    return (
        f"EarlyStopping(patience={case['patience']}, min_delta={case['min_delta']}, "
        f"mode={case['mode']!r}) fed {case['metrics']}{kind}"
    )


def _kept(value):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return f"a tensor ({value.item()}); keep plain floats: float(metric)"
    return value


def observe_early_stopping(fn, case: dict) -> dict:
    """What step() returns and what best, best_epoch and num_bad_epochs say after each call."""
    label = label_early_stopping(case)
    # In a notebook the tripwire stops the course's class when it is called; a subclass that
    # reaches around it is still the course's code. (A grading worker holds no such class.)
    if isinstance(fn, type) and any(
        getattr(c, "__module__", "").startswith("forge_course.reference") for c in fn.__mro__
    ):
        raise Mistake(
            STOPPING,
            "Your answer calls forge_course's reference `EarlyStopping`. The exercise asks you "
            "to write it yourself, so this does not score.",
        )
    args = (case["patience"], case["min_delta"], case["mode"])
    try:
        stopper = call_answer(STOPPING, "EarlyStopping", fn, *args, case=label)
    except Mistake as err:
        if isinstance(err.__cause__, ValueError):
            return {"EarlyStopping(...)": "raises ValueError"}
        raise
    if not case["metrics"]:
        return {"EarlyStopping(...)": "accepts these settings"}
    seen: dict = {"step() returns": [], "best": [], "best_epoch": [], "num_bad_epochs": []}
    for value in case["metrics"]:
        metric = torch.tensor(value) if case.get("tensors") else value
        seen["step() returns"].append(
            call_answer(STOPPING, "EarlyStopping.step", stopper.step, metric, case=label)
        )
        for name in ("best", "best_epoch", "num_bad_epochs"):
            seen[name].append(_kept(getattr(stopper, name, f"no attribute `{name}`")))
    return {f"{key} after each call": value for key, value in seen.items()}
