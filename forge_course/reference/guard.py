"""A tripwire: an answer cannot score by calling the reference it is compared with.

Every reference function that answers an exercise carries `@reference`. While a check runs the
learner's code inside `learner_code()`, calling such a function raises `ReferenceCalled`, so an
answer such as ``def train_step(*a): return forge_course.reference.step.train_step(*a)`` fails
with a message instead of passing. Outside a check the references work as usual.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_state = threading.local()


class ReferenceCalled(RuntimeError):
    """Raised when an answer calls the reference implementation it is being graded against."""


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

    @functools.wraps(target)
    def guarded(*args, **kwargs):
        if _inside_learner_code():
            raise ReferenceCalled(
                f"Your answer calls forge_course's reference `{fn.__qualname__}`. "
                "The exercise asks you to write it yourself, so this does not score."
            )
        return target(*args, **kwargs)

    if isinstance(fn, type):
        fn.__init__ = guarded
        return fn
    return guarded  # type: ignore[return-value]
