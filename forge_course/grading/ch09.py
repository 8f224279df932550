"""Checks for chapter 09, "The production loop".

Exercises:
    ch09_checkpoint: ``save_checkpoint(path, model, optimizer, scheduler, step)`` and
        ``load_checkpoint(path, model, optimizer, scheduler) -> step``, graded as two halves:
        the learner's save resumed by the spec's load, and the spec's save resumed by the
        learner's load. Each half trains, "crashes" mid-run, throws every live object away,
        rebuilds fresh ones from another seed, resumes from the file, and must reproduce the
        uninterrupted run bit for bit.
    ch09_early_stopping: ``class EarlyStopping(patience, min_delta=0.0, mode="min")``.
Questions:
    ch09_q_steps_lost, ch09_q_weights_only.

The checkpoint format the exercise asks for (smaller than `forge_course.reference.checkpoint`):

    {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
     "scheduler": scheduler.state_dict(), "step": step,
     "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}}
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from forge_course.device import available_devices
from forge_course.grading.core import Exercise, Mistake, call_answer, grading_seed
from forge_course.reference.guard import ReferenceCalled, reference
from forge_course.reference.seeding import EarlyStopping as _ReferenceStopper

CHECKPOINT = "ch09_checkpoint"
FILE = "checkpoint.pt"


def _attempt(name: str, fn, *args, case: str = ""):
    """``(result, None)``, or ``(None, error)`` when the learner's code raised an error.

    An unwritten answer or a call to the reference still fails the check at once.
    """
    try:
        return call_answer(CHECKPOINT, name, fn, *args, case=case), None
    except Mistake as err:
        cause = err.__cause__
        if cause is None or isinstance(cause, (NotImplementedError, ReferenceCalled)):
            raise
        return None, cause


# ---------------------------------------------------------------- the spec's own save and load


def _numpy_state() -> list:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]


@reference
def spec_save_checkpoint(path, model, optimizer, scheduler, step) -> None:
    """Write the exercise's checkpoint atomically: temp file, flush, fsync, rename."""
    path = Path(path)
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": step,
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": _numpy_state(),
        },
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@reference
def spec_load_checkpoint(path, model, optimizer, scheduler) -> int:
    """Restore what `spec_save_checkpoint` wrote; return the saved step.

    It accepts the RNG states as tuples or lists (and NumPy's keys as a list or a tensor), so
    that it judges what a learner's file holds, not how each value was spelled.
    """
    payload = torch.load(path, weights_only=True)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    rng = payload["rng"]
    # A generator missing from the file is left as it is, so the resume shows what it costs.
    if "torch" in rng:
        torch.set_rng_state(rng["torch"].cpu())
    if "python" in rng:
        version, internal, gauss = rng["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in rng:
        kind, keys, pos, has_gauss, cached = rng["numpy"]
        keys = np.asarray(keys.cpu() if isinstance(keys, torch.Tensor) else keys, dtype=np.uint32)
        np.random.set_state((kind, keys, int(pos), int(has_gauss), float(cached)))
    return int(payload["step"])


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


def _crash_and_resume(case: dict, folder: Path, save, load, label: str) -> dict:
    """Train with checkpoints, stop during step ``crash_at``, rebuild, resume, finish."""
    device, steps, every = case["device"], case["steps"], case["every"]
    data, model, optimizer, scheduler = _build(case["seed"], device)
    want = [_train_step(data, model, optimizer, scheduler, device) for _ in range(steps)]
    want_params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}

    path = folder / FILE
    data, model, optimizer, scheduler = _build(case["seed"], device)
    before = []
    for step in range(1, case["crash_at"]):  # step crash_at never completes
        before.append(_train_step(data, model, optimizer, scheduler, device))
        if step % every == 0:
            save(path, model, optimizer, scheduler, step)
    seen: dict = dict.fromkeys(case["keys"], "not reached")
    try:
        torch.load(path, weights_only=True)
        seen["torch.load(path, weights_only=True)"] = "loads"
    except FileNotFoundError:
        seen["torch.load(path, weights_only=True)"] = "no file was written at `path`"
        return seen
    except Exception as err:  # noqa: BLE001  (any refusal is the observation)
        seen["torch.load(path, weights_only=True)"] = f"refused: {type(err).__name__}"
        return seen

    # The crash: every live object is gone. Fresh ones come from another seed, so whatever the
    # checkpoint does not restore shows up as a difference.
    del model, optimizer, scheduler
    data, model, optimizer, scheduler = _build(case["seed"] + 1, device)
    resumed_from = load(path, model, optimizer, scheduler)
    seen["the step load_checkpoint returns"] = resumed_from
    if not isinstance(resumed_from, int) or not 0 <= resumed_from < case["crash_at"]:
        return seen
    after = [
        _train_step(data, model, optimizer, scheduler, device) for _ in range(resumed_from, steps)
    ]
    seen["the resumed run"] = _compare(before[:resumed_from] + after, model, want, want_params)
    return seen


_RUN_KEYS = [
    "torch.load(path, weights_only=True)",
    "the step load_checkpoint returns",
    "the resumed run",
]
_FAILED_SAVE_KEYS = [
    "a save that fails half-way",
    "the file at `path` after the failed save",
    "other files left in the folder",
]


def _case_label(case: dict) -> str:
    return (
        f"{case['steps']} steps, checkpoint every {case['every']}, killed during step "
        f"{case['crash_at']}, seed {case['seed']}, {case['device']}"
    )


def checkpoint_cases(thorough: bool = False) -> list[dict]:
    """Killed mid-run on the CPU; thorough: other seeds and kill points, every device."""
    if not thorough:
        return [{"seed": 0, "steps": 12, "every": 4, "crash_at": 11, "device": "cpu"}]
    seed = grading_seed()
    plans = [(12, 4, 11), (15, 5, 11), (10, 3, 7), (9, 2, 9)]
    return [
        {"seed": seed + 10 * i + j, "steps": s, "every": e, "crash_at": c, "device": str(dev)}
        for i, dev in enumerate(available_devices())
        for j, (s, e, c) in enumerate(plans)
    ]


# ------------------------------------------------ half 1: the learner's save, the spec's load


class _DiskFull(RuntimeError):
    """Raised while a checkpoint is being written, as a full disk would."""


class _Unwritable:
    def __reduce__(self):
        raise _DiskFull("no space left on device (simulated)")


class _FailingScheduler:
    """A scheduler whose state cannot be written: the save fails half-way through the file."""

    def state_dict(self):
        return {"last_epoch": 7, "broken": _Unwritable()}


def _failed_save(save_fn, folder: Path, case: dict, label: str) -> dict:
    """Overwrite a good checkpoint with a save that fails: the good one must survive."""
    _, model, optimizer, scheduler = _build(case["seed"], case["device"])
    path = folder / FILE
    before = path.read_bytes()
    _, error = _attempt(
        "save_checkpoint", save_fn, path, model, optimizer, _FailingScheduler(), 99, case=label
    )
    if not path.exists():
        after = "gone: the save deleted it before writing the new one"
    elif path.read_bytes() == before:
        after = "the previous checkpoint, unchanged"
    else:
        after = "overwritten by a partial file: the previous checkpoint is lost"
    return {
        "a save that fails half-way": "raises" if isinstance(error, _DiskFull) else "is silent",
        "the file at `path` after the failed save": after,
        "other files left in the folder": sorted(p.name for p in folder.iterdir() if p != path),
    }


def observe_save(fn, case: dict) -> dict:
    """The learner's save_checkpoint, resumed by the spec's load; then a save that fails."""
    label = _case_label(case)

    def save(path, model, optimizer, scheduler, step):
        return call_answer(
            CHECKPOINT, "save_checkpoint", fn, path, model, optimizer, scheduler, step, case=label
        )

    def load(path, model, optimizer, scheduler):
        try:
            return spec_load_checkpoint.__wrapped__(path, model, optimizer, scheduler)
        except Exception as err:
            raise Mistake(
                CHECKPOINT,
                f"the file your save_checkpoint wrote does not follow the format asked for "
                f"({type(err).__name__}: {err}) ({label}). Check the keys and the nesting "
                '(a dict with "model", "optimizer", "scheduler", "step" and "rng").',
            ) from err

    keys = [*_RUN_KEYS, *_FAILED_SAVE_KEYS]
    with _generators_kept(), tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        seen = _crash_and_resume({**case, "keys": keys}, folder, save, load, label)
        if seen["the resumed run"] != "not reached":
            seen.update(_failed_save(fn, folder, case, label))
    return seen


# ------------------------------------------------ half 2: the spec's save, the learner's load

HIDDEN_CODE_RAN: list[str] = []


def _hidden_code():
    """What a hostile checkpoint would run on loading; here it only leaves a note."""
    HIDDEN_CODE_RAN.append("ran")
    return "harmless"


class _Payload:
    def __reduce__(self):
        return (_hidden_code, ())


def _hostile_file(folder: Path, case: dict, label: str, fn) -> str:
    """A valid checkpoint with one extra object whose unpickling runs a function."""
    _, model, optimizer, scheduler = _build(case["seed"], case["device"])
    path = folder / "hostile.pt"
    payload = torch.load(folder / FILE, weights_only=True)
    payload["note"] = _Payload()
    torch.save(payload, path)
    HIDDEN_CODE_RAN.clear()
    _, error = _attempt("load_checkpoint", fn, path, model, optimizer, scheduler, case=label)
    if HIDDEN_CODE_RAN:
        return "loads it, and the code hidden in it runs"
    if isinstance(error, Exception):
        return "refuses it with an error"
    return "loads it without running the hidden code"


def observe_load(fn, case: dict) -> dict:
    """The spec's save resumed by the learner's load_checkpoint; then a file hiding code."""
    label = _case_label(case)

    def load(path, model, optimizer, scheduler):
        return call_answer(
            CHECKPOINT, "load_checkpoint", fn, path, model, optimizer, scheduler, case=label
        )

    with _generators_kept(), tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save = spec_save_checkpoint.__wrapped__
        keys = [*_RUN_KEYS, "a checkpoint with code hidden in it"]
        seen = _crash_and_resume({**case, "keys": keys}, folder, save, load, label)
        if seen["the resumed run"] != "not reached":
            seen["a checkpoint with code hidden in it"] = _hostile_file(folder, case, label, fn)
    return seen


# Known wrong saves: each forgets one thing, or writes in a way that is not safe.


def _payload(model, optimizer, scheduler, step, **rng):
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": _numpy_state()}
    state.update(rng)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": step,
        "rng": {key: value for key, value in state.items() if value is not None},
    }


def _atomic(payload, path):
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(payload, file)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _save_without(key):
    def save(path, model, optimizer, scheduler, step):
        _atomic(_payload(model, optimizer, scheduler, step, **{key: None}), path)

    return save


def _save_numpy_array(path, model, optimizer, scheduler, step):
    _atomic(_payload(model, optimizer, scheduler, step, numpy=list(np.random.get_state())), path)


def _save_in_place(path, model, optimizer, scheduler, step):
    torch.save(_payload(model, optimizer, scheduler, step), path)


def _save_no_cleanup(path, model, optimizer, scheduler, step):
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    torch.save(_payload(model, optimizer, scheduler, step), tmp)
    os.replace(tmp, path)


def _save_no_optimizer(path, model, optimizer, scheduler, step):
    payload = _payload(model, optimizer, scheduler, step)
    payload["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).state_dict()
    _atomic(payload, path)


SAVE_MISTAKES = [
    (
        "NumPy's generator is not saved, so the resumed run draws "
        "other noise. Save `np.random.get_state()` with its key array as a list.",
        _save_without("numpy"),
    ),
    (
        "Python's `random` is not saved, so the resumed run draws "
        "other augmentation factors. Save `random.getstate()`.",
        _save_without("python"),
    ),
    (
        "torch's CPU generator is not saved, so the resumed run "
        "picks other batches. Save `torch.get_rng_state()`.",
        _save_without("torch"),
    ),
    (
        "the optimizer's state is missing: without its momentum buffers the first updates "
        "after the resume differ. Save `optimizer.state_dict()`.",
        _save_no_optimizer,
    ),
    (
        "`np.random.get_state()` holds a NumPy array, which `torch.load(..., "
        "weights_only=True)` refuses to unpickle. Store its keys with `.tolist()`.",
        _save_numpy_array,
    ),
    (
        "`torch.save(checkpoint, path)` writes straight into the target, so a save that fails "
        "half-way destroys the previous checkpoint. Write to a temporary file in the same "
        "folder, then `os.replace` it onto `path`.",
        _save_in_place,
    ),
    (
        "a failed save leaves its temporary file behind. Delete it (`tmp.unlink()`) before "
        "re-raising the error, e.g. in `except BaseException:`.",
        _save_no_cleanup,
    ),
]


def _load_unsafe(path, model, optimizer, scheduler):
    payload = torch.load(path, weights_only=False)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    rng = payload["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return payload["step"]


def _load_without(part):
    def load(path, model, optimizer, scheduler):
        payload = torch.load(path, weights_only=True)
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        if part != "scheduler":
            scheduler.load_state_dict(payload["scheduler"])
        rng = payload["rng"]
        if part != "torch":
            torch.set_rng_state(rng["torch"])
        if part != "python":
            random.setstate(rng["python"])
        if part != "numpy":
            kind, keys, pos, has_gauss, cached = rng["numpy"]
            np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        return None if part == "step" else payload["step"]

    return load


LOAD_MISTAKES = [
    (
        "`torch.load(..., weights_only=False)` (or a torch older than 2.6 without the "
        "argument) unpickles anything, and unpickling runs code named in the file. Pass "
        "`weights_only=True`.",
        _load_unsafe,
    ),
    ("the step is not returned: `return checkpoint['step']`.", _load_without("step")),
    (
        "the scheduler is not restored, so the learning rate starts its schedule again. Call "
        "`scheduler.load_state_dict(...)`.",
        _load_without("scheduler"),
    ),
    (
        "NumPy's generator is not restored: `np.random.set_state(...)` with the keys turned "
        "back into a `np.uint32` array.",
        _load_without("numpy"),
    ),
    ("Python's `random` is not restored: `random.setstate(...)`.", _load_without("python")),
    ("torch's CPU generator is not restored: `torch.set_rng_state(...)`.", _load_without("torch")),
]

CHECKPOINT_SAVE = Exercise(
    grade_id=CHECKPOINT,
    function="save_checkpoint",
    reference=spec_save_checkpoint.__wrapped__,
    cases=checkpoint_cases,
    observe=observe_save,
    label=_case_label,
    mistakes=SAVE_MISTAKES,
    hint="the checkpoint needs every state the next step reads: model, optimizer, scheduler, "
    "step, and the three generators; write it to a temporary file and rename it onto `path`.",
)
CHECKPOINT_LOAD = Exercise(
    grade_id=CHECKPOINT,
    function="load_checkpoint",
    reference=spec_load_checkpoint.__wrapped__,
    cases=checkpoint_cases,
    observe=observe_load,
    label=_case_label,
    mistakes=LOAD_MISTAKES,
    hint="restore every entry the save wrote (the generators last, after everything else) and "
    "return the step.",
)


def check_checkpoint(save_fn, load_fn, thorough: bool = False) -> None:
    """Both halves: the learner's save with the spec's load, then the spec's save with theirs."""
    CHECKPOINT_SAVE.check(save_fn, thorough)
    CHECKPOINT_LOAD.check(load_fn, thorough)


# ---------------------------------------------------------------- ch09_early_stopping

STOPPING = "ch09_early_stopping"
NAN = math.nan


def early_stopping_cases(thorough: bool = False) -> list[dict]:
    """A falling then rising loss; thorough: min_delta edges, ties, NaN, mode="max", tensors."""
    cases = [
        {
            "patience": 2,
            "min_delta": 0.0,
            "mode": "min",
            "metrics": [1.0, 0.8, 0.9, 0.85, 0.7, 0.75, 0.72],
        },  # fmt: skip
    ]
    if not thorough:
        return cases
    rng = random.Random(grading_seed())
    walk = [round(1.0 + rng.uniform(-0.1, 0.1) - 0.01 * i, 3) for i in range(12)]
    cases += [
        {"patience": 1, "min_delta": 0.0, "mode": "min", "metrics": [0.5, 0.5, 0.5]},
        {"patience": 3, "min_delta": 0.0, "mode": "min", "metrics": [0.5, 0.5, 0.4, 0.4, 0.4]},
        {"patience": 2, "min_delta": 0.25, "mode": "min", "metrics": [2.0, 1.75, 1.5, 1.0, 0.9]},
        {"patience": 3, "min_delta": 0.05, "mode": "min", "metrics": [1.0, 0.96, 0.94, 0.9, 0.8]},
        {"patience": 2, "min_delta": 0.0, "mode": "min", "metrics": [NAN, 1.0, NAN, NAN, 0.5]},
        {"patience": 2, "min_delta": 0.0, "mode": "max", "metrics": [0.5, 0.7, 0.7, 0.6, 0.9]},
        {"patience": 2, "min_delta": 0.1, "mode": "max", "metrics": [0.5, 0.55, 0.65, 0.8]},
        {
            "patience": 3,
            "min_delta": 0.0,
            "mode": "min",
            "metrics": [0.9, 0.8, 0.85, 0.7],
            "tensors": True,
        },  # fmt: skip
        {"patience": 4, "min_delta": 0.02, "mode": "min", "metrics": walk},
        {"patience": 0, "min_delta": 0.0, "mode": "min", "metrics": []},
        {"patience": 2, "min_delta": -0.1, "mode": "min", "metrics": []},
        {"patience": 2, "min_delta": 0.0, "mode": "mean", "metrics": []},
    ]
    return cases


def _stopping_label(case: dict) -> str:
    kind = " as one-element tensors" if case.get("tensors") else ""
    return (
        f"EarlyStopping(patience={case['patience']}, min_delta={case['min_delta']}, "
        f"mode={case['mode']!r}) fed {case['metrics']}{kind}"
    )


def _reference_stopper(patience, min_delta=0.0, mode="min"):
    """The reference class, built without the guard that refuses it to learners' code."""
    stopper = _ReferenceStopper.__new__(_ReferenceStopper)
    _ReferenceStopper.__init__.__wrapped__(stopper, patience, min_delta, mode)
    return stopper


def _plain(value):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return f"a tensor ({value.item()}); keep plain floats: float(metric)"
    return value


def observe_early_stopping(fn, case: dict) -> dict:
    """What step() returns and what best, best_epoch and num_bad_epochs say after each call."""
    label = _stopping_label(case)
    if isinstance(fn, type) and issubclass(fn, _ReferenceStopper):
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
            seen[name].append(_plain(getattr(stopper, name, f"no attribute `{name}`")))
    return {f"{key} after each call": value for key, value in seen.items()}


def _stopper_variant(improves, counts=lambda bad, patience: bad >= patience, reset=True):
    class Wrong:
        def __init__(self, patience, min_delta=0.0, mode="min"):
            if patience < 1 or min_delta < 0 or mode not in ("min", "max"):
                raise ValueError("invalid settings")
            self.patience, self.min_delta, self.mode = patience, min_delta, mode
            self.best = math.inf if mode == "min" else -math.inf
            self.best_epoch, self.num_bad_epochs, self.epochs = None, 0, 0

        def step(self, metric):
            value = float(metric)
            if improves(self, value):
                self.best, self.best_epoch = value, self.epochs
                if reset:
                    self.num_bad_epochs = 0
            else:
                self.num_bad_epochs += 1
            self.epochs += 1
            return counts(self.num_bad_epochs, self.patience)

    return Wrong


def _sign(s):
    return 1 if s.mode == "min" else -1


STOPPING_MISTAKES = [
    (
        "a value equal to the best counts as an improvement (`<=` instead of `<`). A plateau "
        "is not progress: only a value *strictly* better than `best - min_delta` resets the "
        "count.",
        _stopper_variant(lambda s, v: _sign(s) * v <= _sign(s) * s.best - s.min_delta),
    ),
    (
        "`min_delta` is ignored: an improvement must beat the best by *more than* min_delta.",
        _stopper_variant(lambda s, v: _sign(s) * v < _sign(s) * s.best),
    ),
    (
        "the count of bad epochs is not reset to 0 when the metric improves.",
        _stopper_variant(lambda s, v: _sign(s) * v < _sign(s) * s.best - s.min_delta, reset=False),
    ),
    (
        "it stops one epoch late: return True once `num_bad_epochs >= patience`, not `>`.",
        _stopper_variant(
            lambda s, v: _sign(s) * v < _sign(s) * s.best - s.min_delta,
            counts=lambda bad, patience: bad > patience,
        ),
    ),
    (
        'mode="max" is ignored: for an accuracy, larger is better.',
        _stopper_variant(lambda s, v: v < s.best - s.min_delta if s.mode == "min" else v < s.best),
    ),
    (
        "a NaN counts as an improvement (`not value >= best` is True for NaN). Compare so that "
        "NaN is never better: `value < best - min_delta` is False for NaN.",
        _stopper_variant(lambda s, v: not _sign(s) * v >= _sign(s) * s.best - s.min_delta),
    ),
]

EARLY_STOPPING = Exercise(
    grade_id=STOPPING,
    function="EarlyStopping",
    reference=_reference_stopper,
    cases=early_stopping_cases,
    observe=observe_early_stopping,
    label=_stopping_label,
    mistakes=STOPPING_MISTAKES,
    hint='an improvement is `value < best - min_delta` for "min" (`value > best + min_delta` '
    'for "max"); on one, set best, best_epoch and reset num_bad_epochs; otherwise add 1; '
    "return num_bad_epochs >= patience.",
)
check_early_stopping = EARLY_STOPPING.check

EXERCISES = [CHECKPOINT_SAVE, CHECKPOINT_LOAD, EARLY_STOPPING]
