"""What every observer shares: call the learner's function, and say why when it fails.

`call_answer` turns the ways an answer can fail into a `Mistake` worded for the learner. In a
notebook the grader half installs a guard (`set_guard`) that makes the course's references
refuse to be called from the answer; a grading worker holds no references, so it needs none.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any


class Mistake(AssertionError):
    """A failed check, worded for the learner. The first line names the exercise id."""

    def __init__(self, grade_id: str, message: str):
        self.grade_id = grade_id
        super().__init__(f"[{grade_id}] {message}")

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it: the message and the learner's own frames, not ours."""
        from forge_course.observe.shown import render

        return render(self)


class Tampered(Mistake):
    """The answer switched off or rewrote one of the check's instruments: not graded."""


# What an observer reports where it found its instrument changed by the answer.
INSTRUMENT_TAMPERED = "changed by the answer: the check's instrument is not where it put it"
# The namespace's last process id when the answer began to run, set by a grading worker alone
# in its process-id namespace (None elsewhere); a change by the answer is found as tampering.
TASKS_BEFORE_ANSWER: str | None = None


def last_task() -> str:
    """The last process or thread id the kernel gave out in this process-id namespace."""
    with open("/proc/sys/kernel/ns_last_pid") as f:
        return f.read()


@contextmanager
def alone(grade_id: str):
    """The body calls the answer under instruments that watch how it runs (torch's modes,
    saved-tensor hooks, grad mode): each is this thread's own, so work the answer hands to a
    thread or process of its own would run unseen. In a grading worker, any thread or process
    started since the answer began, however it was made (in the body, or before it to wait
    for work), is a `Mistake`: the kernel's count of process ids in the worker's namespace,
    which the job cannot write, says so."""
    try:
        yield
    finally:  # also when the answer failed: it may have failed in the thread it started
        if TASKS_BEFORE_ANSWER is not None and last_task() != TASKS_BEFORE_ANSWER:
            raise Mistake(
                grade_id,
                "your code started a thread or a process, and the check watches how your "
                "answer runs: it cannot see into those, so it cannot grade the answer. Do the "
                "work in the calling thread.",
            )


def without_sigchld_handler() -> None:
    """Let DataLoader run where `signal.signal` refuses (a grading job and the processes it
    forks): it installs a SIGCHLD handler in the process that iterates, once. Without it a
    worker that dies is still noticed, at DataLoader's next check of its workers."""
    from torch.utils.data._utils import signal_handling

    signal_handling._SIGCHLD_handler_set = True


_guard: Callable[[Callable], AbstractContextManager] = lambda fn: nullcontext()
_translate: Callable[[BaseException], str | None] = lambda err: None
_trusting: Callable[[], bool] = lambda: False
_trust: Callable[[], AbstractContextManager] = nullcontext


def set_guard(
    guard: Callable[[Callable], AbstractContextManager],
    translate: Callable[[BaseException], str | None],
    trusting: Callable[[], bool] = lambda: False,
    trust: Callable[[], AbstractContextManager] = nullcontext,
) -> None:
    """Install the notebook's tripwire: ``guard(fn)`` wraps each call of ``fn``; ``translate``
    turns the tripwire's exception into a message (None for any other exception);
    ``trusting()`` says whether this thread observes the check's own code (the reference, a
    known mistake), and ``trust()`` makes the body do so: what a process the check starts for
    that observation (a rank, in chapter 11) enters."""
    global _guard, _translate, _trusting, _trust
    _guard, _translate, _trusting, _trust = guard, translate, trusting, trust


def call_answer(grade_id: str, name: str, fn: Callable, *args, case: str = "", **kwargs) -> Any:
    """Call the learner's ``fn`` and turn the ways it can fail into a `Mistake` that says why."""
    __tracebackhide__ = True  # IPython and pytest show the learner's frames, not ours
    if not callable(fn):
        raise Mistake(grade_id, f"`{name}` should be a function, but it is {type(fn).__name__}.")
    where = f" ({case})" if case else ""
    try:
        # A warning from correct code is no mistake, and on stderr it would cost the test cell
        # its points under nbgrader: it is shown as a note instead.
        with _guard(fn), warnings.catch_warnings(record=True) as caught:
            result = fn(*args, **kwargs)
        for text in dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught):
            print(f"Note: `{name}` warned: {text}")
        return result
    except Mistake:
        raise
    except Exception as err:
        if type(err) is NotImplementedError and not err.args:
            # The released cell's own `raise NotImplementedError()`. torch raises it too, with
            # a message ('"log_softmax" not implemented for \'Long\''): that is an error to show.
            raise Mistake(
                grade_id,
                f"`{name}` is not written yet: replace `raise NotImplementedError()` with your "
                "code.",
            ) from None
        message = _translate(err)
        if message is not None:
            raise Mistake(grade_id, message) from err
        raise Mistake(
            grade_id, f"`{name}` raised {type(err).__name__}{where}: {err}".rstrip(": ")
        ) from err
