"""Static checks on an answer cell: the shortcuts and tampering visible in its source.

This is a way to name the obvious in feedback ("your answer patches `torch.allclose`"), not the
wall. The wall is elsewhere: the sandbox holds no reference or expected value to reach, the
worker's audit hook refuses memory searches, trace hooks and native libraries however they
are spelled, and the grader checks every line the worker sends.
"""

from __future__ import annotations

import ast
import threading

# CPython 3.11's parser is not safe to call from several threads at once ("AST constructor
# recursion depth mismatch"), and the grader parses answers in its worker threads.
_PARSING = threading.Lock()


def parse(source: str) -> ast.AST:
    with _PARSING:
        return ast.parse(source)


# Module roots whose attributes an answer may read but never assign.
PROTECTED_MODULES = {
    "torch", "nn", "F", "np", "numpy", "math", "random", "builtins", "sys", "os", "time",
    "functools", "operator", "inspect", "json",
}  # fmt: skip
# Assignments under these prefixes are configuration an answer may legitimately set.
ALLOWED_SETTINGS = ("torch.backends.",)

FORBIDDEN_CALLS = {
    "__import__": "imports modules by name at run time",
    "importlib.import_module": "imports modules by name at run time",
    "exec": "runs code built at run time",
    "eval": "runs code built at run time",
    "compile": "runs code built at run time",
    "sys.settrace": "installs a trace hook",
    "sys.setprofile": "installs a profile hook",
    "threading.settrace": "installs a trace hook",
    "sys.addaudithook": "installs an audit hook",
    "sys._getframe": "inspects the grader's frames",
    "inspect.stack": "inspects the grader's frames",
    "inspect.currentframe": "inspects the grader's frames",
    "gc.get_objects": "searches the grader's memory",
    "gc.get_referrers": "searches the grader's memory",
    "os._exit": "ends the interpreter",
    "os.abort": "ends the interpreter",
    "os.kill": "sends signals",
    "sys.exit": "ends the interpreter",
    "exit": "ends the interpreter",
    "quit": "ends the interpreter",
    "os.fork": "starts processes",
    "os.system": "starts processes",
    "os.popen": "starts processes",
    "get_ipython": "changes how IPython runs cells",
    "setattr": None,  # judged by its first argument, below
}
FORBIDDEN_MODULES = {
    "forge_course": "imports forge_course, where the references and the checks live",
    "importlib": "imports modules by name at run time",
    "ctypes": "reaches into memory below Python",
    "subprocess": "starts processes",
    "socket": "opens network connections",
    "multiprocessing": "starts processes",
    "signal": "handles signals (a way to outlive time limits)",
    "builtins": "changes Python's built-in functions",
    "gc": "searches the grader's memory",
    "nbgrader": "talks to the grader",
}
SECRET_WORDS = ("gradebook", "nbgrader", "autograded", "submitted", "build/source", "solutions")


def _dotted(node: ast.AST) -> str:
    """``torch.testing.assert_close`` for an attribute chain, '' when it is not one."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _aliases(tree: ast.AST) -> set[str]:
    """Names bound to protected modules or their members: ``import torch as T`` protects T."""
    names = set(PROTECTED_MODULES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                root = (module or alias.name).split(".")[0]
                if root in PROTECTED_MODULES:
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def _patches(target: ast.AST, protected: set[str]) -> str | None:
    name = _dotted(target)
    if "." not in name:
        return None
    root = name.split(".")[0]
    if root in protected and not name.startswith(ALLOWED_SETTINGS):
        return f"patches `{name}`"
    return None


class Unreadable(ValueError):
    """A cell Python's parser gives up on (nested too deeply, too large): it is not graded."""


def findings(source: str) -> list[str]:
    """Reasons this cell may not be graded, in source order; empty when nothing was found.

    Raises `Unreadable`, with a reason, where the parser gives up on the cell: the worker's
    interpreter would give up on it as well, and the grader must not.
    """
    try:
        return _findings(source)
    except SyntaxError:
        return []  # running it reports the syntax error as the learner's mistake
    except (RecursionError, MemoryError, ValueError) as err:
        raise Unreadable(
            f"Python cannot read this cell ({type(err).__name__}: "
            f"{str(err)[:100] or 'out of memory'}); it is nested too deeply or too large"
        ) from None


def _findings(source: str) -> list[str]:
    tree = parse(source)
    found: list[str] = []
    protected = _aliases(tree)

    def add(node: ast.AST, reason: str) -> None:
        line = f"line {getattr(node, 'lineno', '?')}: {reason}"
        if line not in found:
            found.append(line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                root = name.split(".")[0]
                if root in FORBIDDEN_MODULES:
                    add(node, FORBIDDEN_MODULES[root])
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name == "setattr" and node.args:
                reason = _patches(ast.Attribute(value=node.args[0], attr="_"), protected)
                if reason:
                    add(node, reason.replace("._`", "`"))
            elif FORBIDDEN_CALLS.get(name):
                add(node, f"calls `{name}`: {FORBIDDEN_CALLS[name]}")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                reason = _patches(target, protected)
                if reason:
                    add(node, reason)
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                if _dotted(base) in ("torch.Tensor", "Tensor"):
                    add(node, f"subclasses torch.Tensor (`{node.name}`)")
        elif isinstance(node, ast.FunctionDef) and node.name == "__torch_function__":
            add(node, "overrides `__torch_function__`")
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__"):
            add(node, f"uses `{node.id}`")
        elif isinstance(node, ast.Attribute) and node.attr in ("modules", "f_back", "f_globals"):
            if _dotted(node) in ("sys.modules",) or node.attr in ("f_back", "f_globals"):
                add(node, f"reaches `{_dotted(node) or node.attr}`")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.lower()
            for word in SECRET_WORDS:
                if word in text:
                    add(node, f"refers to the grader's files or variables ({word!r})")
            if "nbgrader" in text or "forge_grading" in text:
                add(node, "looks for the grader's environment")
    return found
