"""A tripwire: an answer cannot score by calling the reference it is compared with.

Every reference that answers an exercise carries `@reference`. The decorator compiles the
function (or every method of the class) again from its source with one statement first: a call
of this module's `entered`, `constructed` or `method`. The tripwire is in the reference's own
code, so every way of reaching that code meets it: the function itself, its ``__wrapped__``, a
method borrowed into a class of the learner's, a call from a thread or a process the answer
started.

While a check runs the learner's code inside `learner_code()` (process-wide, so threads the
answer starts count too), a reference refuses to run and raises `ReferenceCalled`, except in a
thread that the check itself marked with `trusted_code()` to observe the reference or a known
mistake. A reference class's methods run on the instances that legitimate code built: the
check's own, or the notebook's outside a check; a method borrowed into another class never runs.
Outside a check the references work as usual.
"""

from __future__ import annotations
import __future__

import ast
import inspect
import sys
import textwrap
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable)

TRIPWIRE = "__forge_tripwire__"  # the global each reference module holds: this module

_lock = threading.Lock()
_learner_depth = 0  # process-wide: threads started by the answer are learner code too
_local = threading.local()  # .trusted: this thread observes the reference or a known mistake
_check = 0  # counts checks: an instance blessed in an earlier one is not the current check's
_blessed: dict[int, tuple[Callable[[], Any], int]] = {}  # id → (the instance, when blessed)
_codes: set[types.CodeType] = set()  # the code of every guarded function, methods included
_classes: set[type] = set()
_modules: list[dict] = []  # the globals of each guarded module, watched for a removed tripwire


class ReferenceCalled(RuntimeError):
    """Raised when an answer calls the reference implementation it is being graded against."""


def is_reference(fn: Any) -> bool:
    """True for a guarded reference: its function, a copy of its code, its class or a method."""
    if isinstance(fn, type):
        return fn in _classes
    fn = getattr(fn, "__func__", fn)
    try:
        return getattr(fn, "__code__", None) in _codes
    except TypeError:  # a __code__ that is not hashable is not ours
        return False


def _learner_active() -> bool:
    return _learner_depth > 0 and not trusting()


def refusal(qualname: str) -> ReferenceCalled:
    return ReferenceCalled(
        f"Your answer calls forge_course's reference `{qualname}`. "
        "The exercise asks you to write it yourself, so this does not score."
    )


def _intact() -> bool:
    this = sys.modules[__name__]
    return all(module.get(TRIPWIRE) is this for module in _modules)


@contextmanager
def learner_code() -> Iterator[None]:
    """Run the body as the learner's code: references refuse to run, in every thread, inside it."""
    global _learner_depth
    if not _intact():
        raise ReferenceCalled("The check's tripwire on forge_course's references was removed.")
    with _lock:
        _learner_depth += 1
    try:
        yield
    finally:
        with _lock:
            _learner_depth -= 1
    if not _intact():
        raise ReferenceCalled(
            "Your answer removed the check's tripwire on forge_course's references."
        )


@contextmanager
def trusted_code() -> Iterator[None]:
    """Run the body as the check's own code, in this thread: references run inside it."""
    _local.trusted = getattr(_local, "trusted", 0) + 1
    try:
        yield
    finally:
        _local.trusted -= 1


def trusting() -> bool:
    """Whether this thread runs the check's own code (`trusted_code`)."""
    return bool(getattr(_local, "trusted", 0))


def new_check() -> None:
    """A check begins: instances of reference classes built before it are not its own."""
    global _check
    _check += 1


# -- what the compiled references call first ------------------------------------------------


def entered(qualname: str) -> None:
    """First statement of a guarded function."""
    if _learner_active():
        raise refusal(qualname)


def constructed(instance: object, qualname: str) -> None:
    """First statement of a guarded class's ``__init__``: refuse, or bless the instance."""
    if _learner_active():
        raise refusal(qualname)
    key = id(instance)
    try:
        alive: Callable[[], Any] = weakref.ref(instance, lambda _: _forget(key))
    except TypeError:  # no weak references to it: kept for good (rare, and small)
        alive = lambda: instance  # noqa: E731
    _blessed[key] = (alive, _check)


def _forget(key: int) -> None:
    _blessed.pop(key, None)


def method(instance: object, owner: type, qualname: str) -> None:
    """First statement of a guarded class's other methods."""
    if trusting():
        return
    alive, when = _blessed.get(id(instance), (lambda: None, -1))
    blessed = alive() is instance
    if _learner_active():
        # Inside an answer, only on what the check built for it (a dataset it passes in).
        if blessed and when == _check:
            return
        raise refusal(qualname)
    # Outside one, on any instance of the class; a borrowed method never runs.
    if blessed or type(instance) is owner:
        return
    raise refusal(qualname)


# -- the decorator -------------------------------------------------------------------------------


def _call(name: str, *args: ast.expr) -> ast.stmt:
    func = ast.Attribute(ast.Name(TRIPWIRE, ast.Load()), name, ast.Load())
    return ast.Expr(ast.Call(func, list(args), []))


def _arm(node: ast.FunctionDef | ast.AsyncFunctionDef, first: ast.stmt) -> None:
    """Put ``first`` at the top of the body (after the docstring, which must stay first)."""
    body = node.body
    docstring = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    at = 1 if docstring and len(body) > 1 else 0
    body.insert(at, ast.copy_location(first, body[min(at, len(body) - 1)]))


def _arm_class(node: ast.ClassDef) -> None:
    for item in node.body:
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        qualname = ast.Constant(f"{node.name}.{item.name}")
        decorators = {getattr(d, "id", None) for d in item.decorator_list}
        positional = item.args.posonlyargs + item.args.args
        if decorators & {"staticmethod", "classmethod"} or not positional:
            _arm(item, _call("entered", qualname))
            continue
        self = ast.Name(positional[0].arg, ast.Load())
        if item.name == "__init__":
            _arm(item, _call("constructed", self, qualname))
        else:
            _arm(item, _call("method", self, ast.Name("__class__", ast.Load()), qualname))


def _copy(fn: types.FunctionType) -> types.FunctionType:
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)  # fmt: skip
    twin.__kwdefaults__, twin.__qualname__, twin.__doc__ = (
        fn.__kwdefaults__, fn.__qualname__, fn.__doc__,
    )  # fmt: skip
    twin.__module__, twin.__annotations__ = fn.__module__, fn.__annotations__
    return twin


def _codes_of(obj: Any) -> Iterator[types.CodeType]:
    functions = [obj] if isinstance(obj, types.FunctionType) else []
    for value in vars(obj).values() if isinstance(obj, type) else ():
        value = getattr(value, "__func__", getattr(value, "fget", value))
        if isinstance(value, types.FunctionType):
            functions.append(value)
    for fn in functions:
        yield fn.__code__


def reference(obj: F) -> F:
    """Mark ``obj`` (a function or a class) as a reference answer that learner code may not run.

    Returns ``obj`` compiled again from its source with the tripwire in its own code. For the
    checks, ``fn.__wrapped__`` (and a class's ``__init__.__wrapped__``) is a second function of
    the same code: what a check observes as the expected answer, guarded just the same.
    """
    lines, first = inspect.getsourcelines(obj)
    tree = ast.parse(textwrap.dedent("".join(lines)))  # a method's source is indented
    node = tree.body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    # Those above @reference are applied to what it returns: only those below are recompiled.
    names = [getattr(d, "id", "") for d in node.decorator_list]
    node.decorator_list = node.decorator_list[names.index("reference") + 1 :]
    if isinstance(node, ast.ClassDef):
        if not any(getattr(item, "name", "") == "__init__" for item in node.body):
            raise TypeError(f"@reference class {node.name} must define __init__ (it blesses)")
        _arm_class(node)
    else:
        _arm(node, _call("entered", ast.Constant(obj.__qualname__)))
    ast.increment_lineno(ast.fix_missing_locations(tree), first - 1)
    module = sys.modules[obj.__module__].__dict__
    module[TRIPWIRE] = sys.modules[__name__]
    if module not in _modules:
        _modules.append(module)
    future = module.get("annotations") is __future__.annotations
    flags = __future__.annotations.compiler_flag if future else 0
    code = compile(tree, inspect.getsourcefile(obj) or "<reference>", "exec", flags, True)
    made: dict[str, Any] = {}
    exec(code, module, made)
    guarded = made[obj.__name__]
    guarded.__qualname__ = obj.__qualname__
    _codes.update(_codes_of(guarded))
    if isinstance(guarded, type):
        _classes.add(guarded)
        guarded.__init__.__wrapped__ = _copy(guarded.__init__)
    else:
        guarded.__wrapped__ = _copy(guarded)
    return guarded
