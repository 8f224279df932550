"""A tripwire: an answer cannot score by calling the reference it is compared with.

Every reference function that answers an exercise carries `@reference`. While a check runs the
learner's code inside `learner_code()`, calling such a function raises `ReferenceCalled`, so an
answer such as ``def train_step(*a): return forge_course.reference.step.train_step(*a)`` fails
with a message instead of passing. Outside a check the references work as usual.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_state = threading.local()
_REFERENCE_DIR = Path(__file__).resolve().parent
# The undecorated reference functions: a check may observe them directly, nested calls included.
_ORIGINALS: set = set()


class ReferenceCalled(RuntimeError):
    """Raised when an answer calls the reference implementation it is being graded against."""


def is_reference(fn: Callable) -> bool:
    """True for the undecorated function behind a `@reference` (what checks compare with)."""
    try:
        return fn in _ORIGINALS
    except TypeError:  # unhashable callables are never references
        return False


def _called_from_reference(frame) -> bool:
    return Path(frame.f_code.co_filename).resolve().parent == _REFERENCE_DIR


def _inside_learner_code() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextmanager
def learner_code() -> Iterator[None]:
    """Run the body as the learner's code: references refuse to be called inside it."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def reference(fn: F) -> F:
    """Mark `fn` (a function or a class) as a reference answer that learner code may not call."""
    target = fn.__init__ if isinstance(fn, type) else fn
    if not isinstance(fn, type):
        # A class stays the same object once decorated, so it cannot be told apart from an
        # answer that imports it: only functions get an unguarded original.
        _ORIGINALS.add(target)

    @functools.wraps(target)
    def guarded(*args, **kwargs):
        # One reference may use another (an epoch loop calls the step): only learner code is barred.
        if _inside_learner_code() and not _called_from_reference(sys._getframe(1)):
            raise ReferenceCalled(
                f"Your answer calls forge_course's reference `{fn.__qualname__}`. "
                "The exercise asks you to write it yourself, so this does not score."
            )
        return target(*args, **kwargs)

    if isinstance(fn, type):
        fn.__init__ = guarded
        return fn
    return guarded  # type: ignore[return-value]
