"""Chapter 09's checks: correct answers in any style pass; each typical mistake is named."""

import contextlib
import io
import itertools
import math
import os
import pickle
import pickletools
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from forge_course.grading import Mistake, ch09
from forge_course.observe import ch09 as observe_ch09
from forge_course.reference import checkpoint as ref_checkpoint
from forge_course.reference import seeding
from tests.helpers.copied import copied

SPEC_SAVE = copied(ch09.spec_save_checkpoint)
SPEC_LOAD = copied(ch09.spec_load_checkpoint)


def save_with_tempfile(path, model, optimizer, scheduler, step):
    """Another correct save: tempfile.NamedTemporaryFile, numpy keys as a tensor, a tuple."""
    path = Path(path)
    state = np.random.get_state()
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": step,
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": (state[0], torch.from_numpy(state[1].astype(np.int64)), *state[2:]),
        },
    }
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as file:
        try:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        except BaseException:
            file.close()
            os.unlink(file.name)
            raise
    os.replace(file.name, path)


def load_with_map_location(path, model, optimizer, scheduler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    kind, keys, *rest = state["rng"]["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    version, internal, gauss = state["rng"]["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["rng"]["torch"])
    return int(state["step"])


@pytest.mark.parametrize("save", [SPEC_SAVE, save_with_tempfile])
def test_checkpoint_accepts_correct_saves(save):
    ch09.CHECKPOINT_SAVE.check(save, thorough=True)


@pytest.mark.parametrize("load", [SPEC_LOAD, load_with_map_location])
def test_checkpoint_accepts_correct_loads(load):
    ch09.CHECKPOINT_LOAD.check(load, thorough=True)


@pytest.mark.parametrize("message,wrong", ch09.SAVE_MISTAKES, ids=range(len(ch09.SAVE_MISTAKES)))
def test_checkpoint_names_each_wrong_save(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch09.CHECKPOINT_SAVE.check(wrong)
    assert message in str(caught.value)


@pytest.mark.parametrize("message,wrong", ch09.LOAD_MISTAKES, ids=range(len(ch09.LOAD_MISTAKES)))
def test_checkpoint_names_each_wrong_load(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch09.CHECKPOINT_LOAD.check(wrong)
    assert message in str(caught.value)


def test_a_save_that_takes_only_a_path_object_is_told_about_strings():
    """The text says `path` is a str or a Path; the run gives a str, the failing save a Path."""

    def save_for_paths_only(path, model, optimizer, scheduler, step):
        if not isinstance(path, Path):
            path.with_name  # what `path.with_name(...)` finds on a str: nothing  # noqa: B018
        save_with_tempfile(path, model, optimizer, scheduler, step)

    with pytest.raises(Mistake, match="raised AttributeError .*'str' object has no attribute"):
        ch09.CHECKPOINT_SAVE.check(save_for_paths_only)


def test_checkpoint_refuses_the_reference():
    def save(path, model, optimizer, scheduler, step):
        ref_checkpoint.save_checkpoint(path, model, optimizer, scheduler, step=step)

    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch09.check_checkpoint(save, SPEC_LOAD)


def test_checkpoint_reports_an_unwritten_answer():
    def save(path, model, optimizer, scheduler, step):
        raise NotImplementedError()

    with pytest.raises(Mistake, match="not written yet"):
        ch09.check_checkpoint(save, SPEC_LOAD)


def test_checkpoint_in_another_format_is_explained():
    def save(path, model, optimizer, scheduler, step):
        torch.save({"weights": model.state_dict(), "step": step}, path)

    with pytest.raises(Mistake, match="does not follow the format"):
        ch09.check_checkpoint(save, SPEC_LOAD)


def test_checks_leave_the_global_generators_alone():
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    ch09.check_checkpoint(SPEC_SAVE, SPEC_LOAD)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want


def test_each_hostile_file_really_runs_code_without_weights_only():
    with tempfile.TemporaryDirectory() as tmp:
        target, path = Path(tmp) / "target", Path(tmp) / "x.pt"
        unknown = observe_ch09._unknown_module(str(target))
        sys.modules[unknown.__name__] = unknown
        try:
            for code in observe_ch09._hidden_code(str(target), unknown):
                target.unlink(missing_ok=True)
                target.touch(mode=0o600)
                torch.save({"note": code}, path)
                with pytest.raises(pickle.UnpicklingError):
                    torch.load(path, weights_only=True)
                assert target.stat().st_mode & 0o777 == 0o600 and target.stat().st_size == 0
                before = target.stat().st_ctime_ns
                time.sleep(0.02)  # past a tick of the file system's clock
                torch.load(path, weights_only=False)
                assert target.stat().st_ctime_ns > before, code.call
        finally:
            sys.modules.pop(unknown.__name__)


def _strings_in_the_pickle(path):
    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    return [arg for _, arg, _ in pickletools.genops(io.BytesIO(data)) if isinstance(arg, str)]


def scrubbing_load(path, model, optimizer, scheduler):
    """Unsafe, then wipes every trace it can find and raises as a safe loader would.

    Before loading it notes the mode of every file the pickle names; afterwards it empties the
    lists of strings kept beside every Python function the pickle names (where the evidence
    used to be kept, reached through the function's ``__globals__``) and puts the modes back.
    """
    names = _strings_in_the_pickle(path)
    modes = {text: os.stat(text).st_mode & 0o777 for text in names if os.path.isfile(text)}
    checkpoint = torch.load(path, weights_only=False)
    if "note" not in checkpoint:
        return ch09._load_unsafe(path, model, optimizer, scheduler)
    for text in names:
        module, _, name = text.partition(" ")
        planted = getattr(sys.modules.get(module), name, None)
        for value in getattr(planted, "__globals__", {}).values():
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value.clear()
    for file, mode in modes.items():
        os.chmod(file, mode)
    raise pickle.UnpicklingError("Weights only load failed: Unsupported global")


def test_hidden_code_that_ran_is_seen_whatever_the_load_wipes_afterwards():
    with pytest.raises(Mistake, match="unpickling runs code"):
        ch09.CHECKPOINT_LOAD.check(scrubbing_load, thorough=True)


def save_with_tmp_in_the_system_folder(path, model, optimizer, scheduler, step):
    """Atomic-looking, but the temporary file is in /tmp: across file systems the final move
    is a copy."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "scheduler": scheduler.state_dict(), "step": step,
               "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                       "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}  # fmt: skip
    with tempfile.NamedTemporaryFile(delete=False) as file:
        try:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        except BaseException:
            file.close()
            os.unlink(file.name)
            raise
    os.replace(file.name, path)


def test_a_temporary_file_outside_the_folder_is_named():
    with pytest.raises(Mistake, match="written outside the checkpoint's folder"):
        ch09.CHECKPOINT_SAVE.check(save_with_tmp_in_the_system_folder, thorough=True)


@contextlib.contextmanager
def another_thread_writing_files_elsewhere():
    """What IPython's history thread does in a kernel (CI saw it): a new file, a journal,
    opened for writing outside the checkpoint's folder at any moment. Here one always is."""
    stop = threading.Event()

    def write():
        with tempfile.TemporaryDirectory() as folder:
            held = open(Path(folder, "0-journal"), "wb")  # noqa: SIM115  (closed in turn)
            for n in itertools.count(1):
                if stop.is_set():
                    break
                fresh = open(Path(folder, f"{n}-journal"), "wb")  # noqa: SIM115
                held.close()
                os.unlink(held.name)
                held = fresh
            held.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


def test_files_other_threads_write_elsewhere_are_not_the_saves():
    with another_thread_writing_files_elsewhere():
        for save in (SPEC_SAVE, save_with_tempfile, save_in_a_folder_inside, save_from_memory):
            ch09.CHECKPOINT_SAVE.check(save, thorough=True)
        with pytest.raises(Mistake, match="written outside the checkpoint's folder"):
            ch09.CHECKPOINT_SAVE.check(save_with_tmp_in_the_system_folder, thorough=True)


def save_keeping_a_backup(path, model, optimizer, scheduler, step):
    """Correct, as the course's reference does it: the previous checkpoint is kept as .prev."""
    path = Path(path)
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "scheduler": scheduler.state_dict(), "step": step,
               "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                       "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}  # fmt: skip
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            shutil.copy2(path, path.with_name(path.name + ".prev"))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_from_memory(path, model, optimizer, scheduler, step):
    """Correct: serialised into memory first, then written to a temporary file beside `path`."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "scheduler": scheduler.state_dict(), "step": step,
               "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                       "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}  # fmt: skip
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(buffer.getvalue())
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@pytest.mark.parametrize("save", [save_keeping_a_backup, save_from_memory])
def test_checkpoint_accepts_backups_and_saves_serialised_in_memory(save):
    ch09.CHECKPOINT_SAVE.check(save, thorough=True)


def _exercise_payload(model, optimizer, scheduler, step):
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "step": step,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}  # fmt: skip


def save_in_a_folder_inside(path, model, optimizer, scheduler, step):
    """Correct: the temporary file lies in a folder made inside the checkpoint's folder."""
    path = Path(path)
    with tempfile.TemporaryDirectory(dir=path.parent) as folder:
        tmp = Path(folder) / "checkpoint"
        with open(tmp, "wb") as file:
            torch.save(_exercise_payload(model, optimizer, scheduler, step), file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)


def save_with_fdatasync(path, model, optimizer, scheduler, step):
    """Correct: `os.fdatasync` makes the bytes durable as `os.fsync` does."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as file:
            torch.save(_exercise_payload(model, optimizer, scheduler, step), file)
            file.flush()
            os.fdatasync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.remove(tmp)
        raise


def save_with_os_sync(path, model, optimizer, scheduler, step):
    """Correct, if heavy-handed: `os.sync()` flushes every file system before the rename."""
    tmp = Path(path).with_suffix(".part")
    try:
        torch.save(_exercise_payload(model, optimizer, scheduler, step), tmp)
        os.sync()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_synced_through_another_descriptor(path, model, optimizer, scheduler, step):
    """Correct: written by name, then synced through a descriptor of its own before the rename."""
    tmp = f"{path}.tmp"
    try:
        torch.save(_exercise_payload(model, optimizer, scheduler, step), tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def save_moving_the_old_one_aside(path, model, optimizer, scheduler, step):
    """Correct, as the course's reference keeps its backup: the old file renamed to .prev."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(_exercise_payload(model, optimizer, scheduler, step), file)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            os.replace(path, path.with_name(path.name + ".prev"))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# `fsync` bound under a name of the answer's own, where the check cannot see it called.
_NAMED_FSYNC: dict = {}
exec(
    "import os, random\n"
    "from os import fsync\n"
    "from pathlib import Path\n"
    "import numpy as np\n"
    "import torch\n"
    "def save_checkpoint(path, model, optimizer, scheduler, step):\n"
    "    tmp = Path(str(path) + '.tmp')\n"
    "    try:\n"
    "        with open(tmp, 'wb') as file:\n"
    "            torch.save(payload(model, optimizer, scheduler, step), file)\n"
    "            file.flush()\n"
    "            fsync(file.fileno())\n"
    "        os.replace(tmp, path)\n"
    "    except BaseException:\n"
    "        tmp.unlink(missing_ok=True)\n"
    "        raise\n",
    _NAMED_FSYNC,
)
_NAMED_FSYNC["payload"] = _exercise_payload


@pytest.mark.parametrize(
    "save",
    [save_in_a_folder_inside, save_with_fdatasync, save_with_os_sync,
     save_synced_through_another_descriptor, save_moving_the_old_one_aside,
     _NAMED_FSYNC["save_checkpoint"]],
    ids=["folder inside", "fdatasync", "os.sync", "another descriptor", "old one renamed aside",
         "from os import fsync"],
)  # fmt: skip
def test_checkpoint_accepts_other_atomic_and_synced_saves(save):
    ch09.CHECKPOINT_SAVE.check(save, thorough=True)


def save_copied_into_place(path, model, optimizer, scheduler, step):
    """Wrong: the temporary file is complete, but `path` is then written by a copy."""
    tmp = str(path) + ".tmp"
    try:
        torch.save(_exercise_payload(model, optimizer, scheduler, step), tmp)
    except BaseException:
        os.remove(tmp)
        raise
    shutil.copyfile(tmp, path)
    os.remove(tmp)


def save_copied_by_hand(path, model, optimizer, scheduler, step):
    """Wrong: the bytes of a synced temporary file are written into `path`."""
    tmp = Path(str(path) + ".tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(_exercise_payload(model, optimizer, scheduler, step), file)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        tmp.unlink()
        raise
    with open(path, "wb") as file:
        file.write(tmp.read_bytes())
    tmp.unlink()


@pytest.mark.parametrize("save", [save_copied_into_place, save_copied_by_hand])
def test_a_file_written_into_path_is_named(save):
    with pytest.raises(Mistake, match="copying into place is not atomic"):
        ch09.CHECKPOINT_SAVE.check(save)


def test_the_sync_calls_are_put_back_after_every_check():
    real, noted = (os.fsync, os.fdatasync, os.sync), []

    def save_raising(path, model, optimizer, scheduler, step):
        noted.append(os.fsync is not real[0])
        raise OSError("disk full")

    with pytest.raises(Mistake):
        ch09.CHECKPOINT_SAVE.check(save_raising)
    ch09.CHECKPOINT_SAVE.check(SPEC_SAVE)
    assert noted == [True]  # replaced while the save ran, and put back after it
    assert (os.fsync, os.fdatasync, os.sync) == real


def test_observations_survive_the_trip_from_a_grading_worker():
    """The worker sends plain JSON; the grader judges what arrives, as it arrives."""
    from forge_course.grader.codec import dumps, loads

    case = ch09.checkpoint_cases()[0]
    for exercise, fn in ((ch09.CHECKPOINT_SAVE, SPEC_SAVE), (ch09.CHECKPOINT_LOAD, SPEC_LOAD)):
        exercise.judge(case, loads(dumps(exercise.observe(fn, case))))
    case = ch09.early_stopping_cases()[0]
    seen = ch09.EARLY_STOPPING.observe(copied(seeding.EarlyStopping), case)
    ch09.EARLY_STOPPING.judge(case, loads(dumps(seen)))


class CountingStopper:
    """A correct answer in another style: the sign trick for both modes."""

    def __init__(self, patience, min_delta=0.0, mode="min"):
        if not (patience >= 1 and min_delta >= 0 and mode in {"min", "max"}):
            raise ValueError("bad settings")
        self.sign = 1.0 if mode == "min" else -1.0
        self.patience, self.min_delta = patience, min_delta
        self.best = self.sign * math.inf
        self.best_epoch, self.num_bad_epochs, self.seen = None, 0, 0

    def step(self, metric):
        value = metric.item() if isinstance(metric, torch.Tensor) else float(metric)
        if self.sign * value < self.sign * self.best - self.min_delta:
            self.best, self.best_epoch, self.num_bad_epochs = value, self.seen, 0
        else:
            self.num_bad_epochs += 1
        self.seen += 1
        return self.num_bad_epochs >= self.patience


@pytest.mark.parametrize("answer", [copied(seeding.EarlyStopping), CountingStopper])
def test_early_stopping_accepts_correct_answers(answer):
    ch09.check_early_stopping(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch09.STOPPING_MISTAKES, ids=range(6))
def test_early_stopping_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch09.check_early_stopping(wrong, thorough=True)
    assert message in str(caught.value)


def test_early_stopping_refuses_the_reference_class():
    from forge_course.reference.seeding import EarlyStopping

    with pytest.raises(Mistake, match="reference `EarlyStopping`"):
        ch09.check_early_stopping(EarlyStopping)


def test_early_stopping_wants_float_best_for_tensor_metrics():
    class KeepsTensors(CountingStopper):
        def step(self, metric):
            improved = self.sign * metric < self.sign * self.best - self.min_delta
            if improved:
                self.best, self.best_epoch, self.num_bad_epochs = metric, self.seen, 0
            else:
                self.num_bad_epochs += 1
            self.seen += 1
            return self.num_bad_epochs >= self.patience

    with pytest.raises(Mistake, match="float"):
        ch09.check_early_stopping(KeepsTensors, thorough=True)


def test_early_stopping_must_refuse_bad_settings():
    class AcceptsAnything(CountingStopper):
        def __init__(self, patience, min_delta=0.0, mode="min"):
            self.sign = 1.0 if mode == "min" else -1.0
            self.patience, self.min_delta = patience, min_delta
            self.best = self.sign * math.inf
            self.best_epoch, self.num_bad_epochs, self.seen = None, 0, 0

    with pytest.raises(Mistake, match="raises ValueError"):
        ch09.check_early_stopping(AcceptsAnything, thorough=True)


def test_early_stopping_names_nan_as_an_improvement_in_max_mode():
    class NanImprovesAccuracy(CountingStopper):
        def step(self, metric):
            value = float(metric)
            if self.sign > 0:
                improved = value < self.best - self.min_delta
            else:
                improved = not value <= self.best + self.min_delta  # True for NaN
            if improved:
                self.best, self.best_epoch, self.num_bad_epochs = value, self.seen, 0
            else:
                self.num_bad_epochs += 1
            self.seen += 1
            return self.num_bad_epochs >= self.patience

    with pytest.raises(Mistake, match="a NaN counts as an improvement"):
        ch09.check_early_stopping(NanImprovesAccuracy, thorough=True)


def _resume_from(state, model, optimizer, scheduler):
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    kind, keys, *rest = state["rng"]["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    version, internal, gauss = state["rng"]["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["rng"]["torch"])
    return int(state["step"])


class _RefusingChmod(pickle.Unpickler):
    def find_class(self, module, name):
        if name == "chmod":
            raise pickle.UnpicklingError("Weights only load failed: Unsupported global")
        return super().find_class(module, name)


class _PickleRefusingChmod:
    Unpickler, load, __name__ = _RefusingChmod, pickle.load, "pickle"


def load_refusing_only_chmod(path, model, optimizer, scheduler):
    """Unsafe, but refuses the one kind of hidden code it expects the check to use."""
    state = torch.load(path, weights_only=False, pickle_module=_PickleRefusingChmod)
    return _resume_from(state, model, optimizer, scheduler)


_NAMED = set()  # every file a hostile checkpoint named so far


def load_with_the_evidence_moved_aside(path, model, optimizer, scheduler):
    """Unsafe, with every file a checkpoint has named swapped for a stand-in while it loads,
    so that the hidden code never touches the file the check watches: only its folder moves."""
    _NAMED.update(
        Path(p) for t in _strings_in_the_pickle(path) for p in re.findall(r"/[\w/.-]+", t)
    )
    moved = []
    for found in {p for p in _NAMED if p.is_file()}:
        folder, aside = found.parent, found.parent.with_name(found.parent.name + "-aside")
        folder.rename(aside)
        folder.mkdir()
        found.touch(mode=0o600)
        moved.append((folder, aside))
    try:
        state = torch.load(path, weights_only=False)
    finally:
        for folder, aside in moved:
            shutil.rmtree(folder)
            aside.rename(folder)
    if "note" in state:
        raise pickle.UnpicklingError("Weights only load failed: Unsupported global")
    return _resume_from(state, model, optimizer, scheduler)


@pytest.mark.parametrize("load", [load_refusing_only_chmod, load_with_the_evidence_moved_aside])
def test_hidden_code_is_seen_when_a_load_refuses_some_or_moves_the_evidence(load):
    with pytest.raises(Mistake, match="unpickling runs code"):
        ch09.CHECKPOINT_LOAD.check(load)
