"""The machinery every exercise check shares: run the learner's code, compare, explain.

A check works in three moves, so that the same pieces serve the notebook's test cells and the
grader (which runs the learner's half in an isolated worker):

1. ``observe(fn, case)`` builds fresh inputs from a plain-data ``case`` (a seed, sizes, a device),
   calls ``fn`` on them and returns what came out as plain data: floats, ints, strings, lists,
   dicts and tensors. It runs once with the learner's function and once with the reference.
2. ``first_difference(got, want)`` finds the first place where the two observations disagree,
   with a tolerance that depends on dtype and device, and exact types (a tensor is not a float).
3. ``explain(...)`` turns a difference into one message a teaching assistant would write: what
   was expected, what came back, and the likely mistake, found by observing known wrong
   implementations on the same case and seeing which one the learner's output matches.
"""

from __future__ import annotations

import io
import math
import os
import random
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext, redirect_stderr
from dataclasses import dataclass
from typing import Any

import torch

from forge_course.device import tolerance
from forge_course.grading import answers
from forge_course.observe.common import INSTRUMENT_TAMPERED, Mistake, Tampered, set_guard
from forge_course.observe.common import call_answer as call_answer  # re-exported for the checks
from forge_course.reference.guard import (
    ReferenceCalled,
    is_reference,
    learner_code,
    new_check,
    refusal,
    trusted_code,
    trusting,
)

Observation = Any
KnownMistake = tuple[str, Callable[[], Observation]]


def _guard(fn: Callable):
    # The reference and the known mistakes run as the check's own code (`Exercise._observed`
    # marks its thread), as does a copy of the reference in another process (ch11's ranks).
    return nullcontext() if trusting() or is_reference(fn) else learner_code()


def _tripwire(err: BaseException) -> str | None:
    return str(err) if isinstance(err, ReferenceCalled) else None


set_guard(_guard, _tripwire, trusting, trusted_code)


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.numel() > 12:
            return f"a tensor of shape {list(value.shape)} ({value.dtype})"
        plain = value.detach().cpu()
        shown = (
            torch.round(plain.double(), decimals=5).tolist()
            if plain.is_floating_point()
            else plain.tolist()
        )
        dtype = str(value.dtype).replace("torch.", "")
        return f"tensor {shown} ({dtype}, shape {list(value.shape)})"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = repr(value)
    return text if len(text) < 160 else text[:157] + "..."


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "a tensor"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a Python float"
    if value is None:
        return "None"
    return f"a {type(value).__name__}"


def first_difference(got: Observation, want: Observation, path: str = "the result") -> str | None:
    """Where ``got`` first differs from ``want``, as a sentence; None when they agree.

    Floats and tensors agree within `forge_course.device.tolerance` for their dtype and device;
    everything else must be equal. Types are compared exactly, except that an int is accepted
    where a float is expected (``3`` for ``3.0``) and a tuple where a list is.
    """
    if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        got = float(got)  # ints and NumPy floats stand for floats
    if isinstance(want, list) and isinstance(got, tuple):
        got = list(got)
    if type(got) is not type(want) and not (
        isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
    ):
        expected, actual = f"{_kind(want)} ({_show(want)})", f"{_kind(got)} ({_show(got)})"
        return f"{path} should be {expected}, but it is {actual}"
    if isinstance(want, torch.Tensor):
        return _tensor_difference(got, want, path)
    if isinstance(want, float):
        if math.isnan(want) and math.isnan(got):
            return None
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            return f"{path} should be {_show(want)}, but it is {_show(got)}"
        return None
    if isinstance(want, dict):
        missing = [k for k in want if k not in got]
        if missing:
            return f"{path} is missing the key(s) {missing}"
        extra = [k for k in got if k not in want]
        if extra:
            return f"{path} has unexpected key(s) {extra}"
        for key in want:
            inner = key if path == "the result" and isinstance(key, str) else f"{path}[{key!r}]"
            diff = first_difference(got[key], want[key], inner)
            if diff:
                return diff
        return None
    if isinstance(want, list):
        if len(got) != len(want):
            return f"{path} should have {len(want)} items, but it has {len(got)}"
        for i, (g, w) in enumerate(zip(got, want)):
            diff = first_difference(g, w, f"{path}[{i}]")
            if diff:
                return diff
        return None
    if got != want:
        return f"{path} should be {_show(want)}, but it is {_show(got)}"
    return None


def _tensor_difference(got: torch.Tensor, want: torch.Tensor, path: str) -> str | None:
    if got.dtype != want.dtype:
        return f"{path} should have dtype {want.dtype}, but it has {got.dtype}"
    if got.shape != want.shape:
        return f"{path} should have shape {list(want.shape)}, but it has {list(got.shape)}"
    if got.device != want.device:
        return f"{path} should be on {want.device}, but it is on {got.device}"
    if got.is_floating_point():
        tol = tolerance(want.dtype, want.device)
        close = torch.isclose(got.detach(), want.detach(), equal_nan=True, **tol)
    else:
        close = got == want
    if bool(close.all()):
        return None
    if want.numel() <= 6:
        return f"{path} should be {_show(want)}, but it is {_show(got)}"
    # Large tensors: point at the worst element rather than printing everything.
    gap = (got.detach().double() - want.detach().double()).abs().nan_to_num(float("inf"))
    index = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    return (
        f"{path} differs in {int((~close).sum())} of {want.numel()} entries; at {list(index)} "
        f"it should be {_show(want[index].item())}, but it is {_show(got[index].item())}"
    )


def explain(
    grade_id: str,
    got: Observation,
    want: Observation,
    *,
    case: str = "",
    known_mistakes: Iterable[KnownMistake] = (),
    hint: str = "",
) -> None:
    """Raise a `Mistake` if ``got`` differs from ``want``, naming a known mistake that matches.

    Args:
        grade_id: the exercise id, shown first in the message.
        got, want: observations of the learner's function and of the reference.
        case: a few words describing the inputs, shown with the difference.
        known_mistakes: ``(message, observe_wrong)`` pairs; ``observe_wrong()`` observes a known
            wrong implementation on the same case. The first whose observation equals ``got``
            gives the likely mistake. They only run when the answer is wrong.
        hint: the likely mistake to suggest when no known mistake matches.
    """
    __tracebackhide__ = True  # IPython and pytest show the learner's frames, not ours
    diff = first_difference(got, want)
    if diff is None:
        return
    where = f" (case: {case})" if case else ""
    key = _first_differing_key(got, want)
    wrongs = []
    for message, observe_wrong in known_mistakes:
        try:
            wrongs.append((message, observe_wrong()))
        except Exception:  # noqa: BLE001  (a wrong implementation that fails explains nothing)
            continue
    # A known mistake is named only when the answer shows all of it: the whole observation, or
    # (where the answer also goes wrong elsewhere) every part in which the mistake differs from
    # the reference, each the same way. One shared symptom is not enough: several mistakes
    # share one (the parameters never move), and naming the wrong one misleads.
    for message, wrong in wrongs:
        if first_difference(got, wrong) is None:
            raise Mistake(grade_id, f"{diff}{where}.\nLikely mistake: {message}")
    # And only one that goes wrong where the answer first does, so that it explains the
    # difference the message starts with (not only a symptom further down).
    shown = [
        (m, w)
        for m, w in wrongs
        if _shows_all_of(got, w, want) and _difference_at(w, want, key) is not None
    ]
    for message, wrong in shown:
        also = "; something else differs too" if first_difference(got, wrong) else ""
        raise Mistake(grade_id, f"{diff}{where}.\nLikely mistake: {message}{also}")
    others = _other_differences(got, want, key)
    raise Mistake(
        grade_id,
        f"{diff}{where}."
        + (f"\nAlso different: {', '.join(others)}." if others else "")
        + (f"\nLikely mistake: {hint}" if hint else ""),
    )


def _first_differing_key(got: Observation, want: Observation) -> str | None:
    if not (isinstance(got, dict) and isinstance(want, dict)) or got.keys() != want.keys():
        return None
    return next((k for k in want if first_difference(got[k], want[k]) is not None), None)


def _shows_all_of(got: Observation, wrong: Observation, want: Observation) -> bool:
    """Whether ``got`` differs from ``want`` wherever ``wrong`` does, and in the same way."""
    if not all(isinstance(o, dict) for o in (got, wrong, want)) or not (
        got.keys() == wrong.keys() == want.keys()
    ):
        return False
    signature = [k for k in want if first_difference(wrong[k], want[k]) is not None]
    return bool(signature) and all(first_difference(got[k], wrong[k]) is None for k in signature)


def _difference_at(observation: Observation, want: Observation, key: str | None) -> str | None:
    if key is None or not isinstance(observation, dict) or key not in observation:
        return None
    return first_difference(observation[key], want[key])


def _other_differences(got: Observation, want: Observation, first: str | None) -> list[str]:
    if first is None:
        return []
    return [k for k in want if k != first and first_difference(got[k], want[k]) is not None][:6]


THOROUGH = "FORGE_COURSE_THOROUGH"


def thorough_requested() -> bool:
    """Whether this process runs every check thoroughly (the hidden tests' cases), as
    `forge-course check` asks its kernel to: then a visible test's verdict is the grader's."""
    return os.environ.get(THOROUGH) == "1"


def grading_seed() -> int:
    """The seed for hidden cases: new for every grading run, so answers cannot be tuned to it.

    Set ``FORGE_GRADING_SEED`` to replay a run exactly.
    """
    env = os.environ.get("FORGE_GRADING_SEED")
    return int(env) if env else _RUN_SEED


_RUN_SEED = random.SystemRandom().randrange(2**31)


# Reference observations run one at a time, each from the same state, so that what a check
# expects never depends on what else the process did before (another submission, in
# `forge-course grade`'s threads; the learner's own cells, in a notebook).
_CLEAN_ROOM = threading.RLock()
_EXPECTED: dict[tuple, Any] = {}


@contextmanager
def clean_room(seed: int = 0):
    """Run the body from a fixed state and put back every process-wide setting it may change.

    Seeds Python's, NumPy's and torch's generators with ``seed``; restores them afterwards, with
    the default dtype, grad mode, torch's thread count, the warning filters, the working folder
    and the environment. One body at a time: threads wait for each other here.
    """
    import numpy as np

    with _CLEAN_ROOM:
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        saved = (
            random.getstate(), np.random.get_state(), torch.get_default_dtype(),
            torch.is_grad_enabled(), torch.get_num_threads(), os.getcwd(), dict(os.environ),
        )  # fmt: skip
        try:
            with torch.random.fork_rng(devices=cuda), warnings.catch_warnings():
                random.seed(seed)
                np.random.seed(seed)
                torch.manual_seed(seed)
                torch.set_default_dtype(torch.float32)
                torch.set_grad_enabled(True)
                yield
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_default_dtype(saved[2])
            torch.set_grad_enabled(saved[3])
            if torch.get_num_threads() != saved[4]:
                torch.set_num_threads(saved[4])
            os.chdir(saved[5])
            if dict(os.environ) != saved[6]:
                os.environ.clear()
                os.environ.update(saved[6])


@contextmanager
def quiet_stderr(name: str):
    """Run a check with nothing reaching stderr: what arrives there is shown on stdout as notes.

    nbgrader gives 0 to a test cell that wrote anything to stderr, so a warning from correct
    code (torch's, a DataLoader worker's, a ``logging`` call) would cost the exercise. Python
    warnings, ``sys.stderr`` and file descriptor 2 (C++ and child processes write there) are
    captured while the body runs, and printed afterwards as notes. `forge-course grade` reads no
    stream at all, so the two grade such an answer alike.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    text = io.StringIO()
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings(record=True) as caught:
        os.dup2(sink.fileno(), 2)
        try:
            with redirect_stderr(text):
                yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            written = sink.read(_MAX_NOTE).decode("utf-8", "replace") + text.getvalue()[:_MAX_NOTE]
            notes = dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught)
            for note in notes:
                print(f"Note: while `{name}` was checked, Python warned: {note}")
            if written.strip():
                print(f"Note: while `{name}` was checked, this was written to stderr:")
                print(written.rstrip()[:_MAX_NOTE])


_MAX_NOTE = 4000  # characters of captured stderr shown: enough to read, not a flood


def _process_settings() -> dict[str, str]:
    """The process-wide settings an answer could leave switched, which the check relies on."""
    return {
        "grad mode": "on" if torch.is_grad_enabled() else "off",
        "inference mode": "on" if torch.is_inference_mode_enabled() else "off",
        "the default dtype": str(torch.get_default_dtype()),
    }


def _crashed(err: BaseException, label: str, before: dict[str, str]) -> str:
    """The message for a check that failed on an answer, and the settings put back for the next.

    The check's own code failed (an answer is judged by what it leaves, and what it left made
    the observation impossible): say where, and name a setting the answer left switched, the
    one cause the check can see.
    """
    now = _process_settings()
    changed = [
        f"{name} {before[name]} → {now[name]}" for name in before if now[name] != before[name]
    ]
    torch.set_grad_enabled(before["grad mode"] == "on")
    torch.set_default_dtype(getattr(torch, before["the default dtype"].removeprefix("torch.")))
    where = f" ({label})" if label else ""
    message = f"The check could not observe your answer{where}: {type(err).__name__}: {err}".rstrip(
        ": "
    )
    if changed:
        return (
            f"{message}.\nLikely mistake: your answer left {'; '.join(changed)} behind it. "
            "Whatever a function switches for its own work it must put back: the check's next "
            "steps, like every later cell, ran in the changed setting (put back now)."
        )
    return f"{message}.\nLook at what your function returns and leaves behind for its caller."


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: a learner half a sandbox may run, and a grader half it never sees.

    Attributes:
        grade_id: nbgrader's id of the solution cell (``ch04_train_step``).
        function: the name the learner's answer defines (``train_step``).
        reference: the undecorated reference (``ref.train_step.__wrapped__``). Grader half.
        cases: ``cases(thorough) -> list of plain-data cases``. Grader half (it holds the seed).
        observe: ``observe(fn, case) -> plain data``, defined in ``forge_course.observe``: builds
            fresh inputs from the case, calls ``fn`` through `call_answer`, returns what came
            out. The learner half: the only part a grading worker runs.
        label: a few words describing a case, for messages.
        mistakes: ``(message, wrong_fn)`` pairs of known wrong implementations. Grader half.
        hint: the likely mistake to suggest when none of ``mistakes`` matches.
        prepare: ``prepare(observation, target, case)``, applied to an observation before it is
            compared with ``target``; for example to accept rounding a case legitimately allows.
        raised_hint: ``raised_hint(message, case) -> str``, the likely mistake of an answer
            whose call ended in the `Mistake` ``message`` (as text: a grading worker sends
            only text) on ``case``; "" for none. Applied in a notebook and in the grader alike.
    """

    grade_id: str
    function: str
    reference: Callable
    cases: Callable[[bool], list[dict]]
    observe: Callable[[Callable, dict], Observation]
    label: Callable[[dict], str] = str
    mistakes: Sequence[tuple[str, Callable]] = ()
    hint: str = ""
    prepare: Callable[[Observation, Observation, dict], Observation] | None = None
    raised_hint: Callable[[str, dict], str] | None = None

    @property
    def observer(self) -> dict[str, str]:
        """Where a grading worker finds ``observe``: the only code of this check it runs."""
        module = getattr(self.observe, "__module__", "")
        if not module.startswith("forge_course.observe."):
            raise TypeError(f"{self.grade_id}: observe must live in forge_course.observe, "
                            f"the learner half, not in {module!r}")  # fmt: skip
        return {"module": module, "name": self.observe.__name__}

    def _observed(self, kind: str, fn: Callable, case: dict) -> Observation:
        """``observe(fn, case)`` from a clean state, once per case (the reference and the known
        mistakes are deterministic, so a class shares them; a failure is not kept, since in a
        notebook it may come from what the learner's cells changed)."""
        key = (self.grade_id, self.function, kind, repr(case))
        with _CLEAN_ROOM:
            if key not in _EXPECTED:
                with clean_room(), trusted_code():
                    _EXPECTED[key] = self.observe(fn, case)
            return _EXPECTED[key]

    def expected(self, case: dict) -> Observation:
        """The reference's observation of ``case``."""
        return self._observed("reference", self.reference, case)

    def expected_of(self, reference: Callable, case: dict, variant: str) -> Observation:
        """The observation of ``case`` by another reference, ``variant`` naming it (a
        ``prepare`` that accepts a second correct answer compares with it)."""
        return self._observed(f"reference, {variant}", reference, case)

    def judged(self, case: dict, got: Observation) -> Any:
        """`judge` in the clean room, as every caller runs it: a judge may run torch code (the
        arena's training, a ``prepare``) that seeds and draws from torch's process-wide
        generators, and the grader judges submissions in threads, beside another thread's
        observation of a reference or a known mistake, which would draw from them too."""
        __tracebackhide__ = True
        with clean_room():
            return self.judge(case, got)

    def judge(self, case: dict, got: Observation) -> None:
        """Raise a `Mistake` unless ``got``, observed on ``case``, matches the reference."""
        __tracebackhide__ = True  # IPython and pytest show the learner's frames, not ours
        try:
            self._judge(case, got)
        except Mistake:
            raise
        except Exception as err:  # noqa: BLE001  (a check ends in a message, never a crash)
            where = f" (case: {self.label(case)})"
            raise Mistake(
                self.grade_id,
                f"The check could not compare what your answer produced{where}: "
                f"{type(err).__name__}: {err}",
            ) from err

    def _judge(self, case: dict, got: Observation) -> None:
        __tracebackhide__ = True
        if isinstance(got, dict):
            for key, value in got.items():
                if isinstance(value, str) and value == INSTRUMENT_TAMPERED:
                    raise Tampered(self.grade_id, f"Not graded: {key} was {value}.")
        want = self.expected(case)
        prepare = self.prepare or (lambda observation, target, case: observation)
        got = prepare(got, want, case)
        explain(
            self.grade_id,
            got,
            want,
            case=self.label(case),
            known_mistakes=[
                (
                    message,
                    lambda i=i, wrong=wrong: prepare(
                        self._observed(f"mistake {i}", wrong, case), got, case
                    ),
                )
                for i, (message, wrong) in enumerate(self.mistakes)
            ],  # fmt: skip
            hint=self.hint,
        )

    def explain_raised(self, message: str, case: dict) -> str:
        """``message``, the text of a `Mistake` the observation of ``case`` ended in, with the
        likely mistake (`raised_hint`) added where there is one and none is named yet."""
        hint = self.raised_hint(message, case) if self.raised_hint else ""
        return (
            f"{message}\nLikely mistake: {hint}"
            if hint and "Likely mistake" not in message
            else message
        )

    def check(self, fn: Callable, thorough: bool = False) -> None:
        """Observe ``fn`` on every case and judge it: what a notebook's test cell calls."""
        __tracebackhide__ = True  # IPython and pytest show the learner's frames, not ours
        thorough = thorough or thorough_requested()
        if is_reference(fn):  # the answer *is* the reference (``ref.f.__wrapped__``, say)
            raise Mistake(self.grade_id, str(refusal(self.function)))
        new_check()
        with quiet_stderr(self.function):
            self._check(fn, thorough)

    def _check(self, fn: Callable, thorough: bool) -> None:
        __tracebackhide__ = True
        for case in self.cases(thorough):
            before = _process_settings()
            try:
                observed = self.observe(fn, case)
            except Mistake as err:
                message = str(err).removeprefix(f"[{self.grade_id}] ")
                explained = self.explain_raised(message, case)
                if explained == message:
                    raise
                raise Mistake(self.grade_id, explained) from err.__cause__
            except Exception as err:  # noqa: BLE001  (a check ends in a message, never a crash)
                raise Mistake(self.grade_id, _crashed(err, self.label(case), before)) from err
            self.judged(case, observed)


def check_choice(
    answer: Any,
    grade_id: str,
    choices: Sequence[str],
    correct: str | None = None,
    why_not: dict[str, str] | None = None,
    *,
    key: dict | None = None,
) -> None:
    """Check a multiple-choice answer: first its form, then that it is right.

    Hidden tests pass ``correct``; a self-study notebook's visible test passes ``key`` instead
    (`forge_course.grading.answers`), which tells right from wrong without holding the answer.
    """
    __tracebackhide__ = True  # IPython and pytest show the learner's frames, not ours
    choices = list(choices)  # a string of letters is a list of one-letter choices, not a word
    if answer is None or answer is ...:
        raise Mistake(grade_id, f"No answer yet: set it to one of {choices}.")
    if not isinstance(answer, str) or answer.strip().lower() not in choices:
        raise Mistake(grade_id, f"The answer should be one of {list(choices)}, got {answer!r}.")
    if correct is not None and answer.strip().lower() != correct:
        reason = (why_not or {}).get(answer.strip().lower(), "")
        raise Mistake(grade_id, f"{answer!r} is not right. {reason}".strip())
    if correct is None and key is not None:
        message = answers.judge_choice(key, grade_id, answer)
        if message:
            raise Mistake(grade_id, message)


def check_number(
    answer: Any,
    grade_id: str,
    expected: float | None = None,
    *,
    rel_tol: float = 1e-9,
    hints: dict[float, str] | None = None,
    key: dict | None = None,
) -> None:
    """Check a numeric answer: first that it is a number, then that it equals ``expected``.

    ``hints`` maps the values that common slips produce to what the slip was. Hidden tests pass
    ``expected``; a self-study notebook's visible test passes ``key`` instead
    (`forge_course.grading.answers`), which gives the same verdict without holding the answer.
    """
    __tracebackhide__ = True  # IPython and pytest show the learner's frames, not ours
    if answer is None or answer is ...:
        raise Mistake(grade_id, "No answer yet: set it to a number.")
    if type(answer).__module__ == "numpy" and getattr(answer, "ndim", None) == 0:
        answer = answer.item()  # NumPy's own numbers are numbers
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        raise Mistake(grade_id, f"The answer should be a number, got {answer!r}.")
    if expected is None and key is not None:
        message = answers.judge_number(key, grade_id, answer)
        if message:
            raise Mistake(grade_id, message)
        return
    if expected is None or math.isclose(answer, expected, rel_tol=rel_tol, abs_tol=1e-12):
        return
    for value, slip in (hints or {}).items():
        if math.isclose(answer, value, rel_tol=rel_tol, abs_tol=1e-12):
            raise Mistake(grade_id, f"{answer} is not right: {slip}")
    raise Mistake(grade_id, f"{answer} is not right.")
