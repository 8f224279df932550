"""A function sent to a fresh interpreter by value, for checks that start processes.

A fresh interpreter (a spawned DataLoader worker, a DDP rank) cannot import a function defined
in a notebook cell by name. `pack` turns one into plain data: its code object (`marshal`), and
the globals, defaults and closure it uses, each by reference where it can be imported (modules,
library functions and classes) and by value where it cannot (the notebook's own functions).
`unpack` rebuilds it on the other side.
"""

from __future__ import annotations

import builtins
import importlib
import marshal
import pickle
import sys
import types


def pack(fn: types.FunctionType) -> dict:
    """``fn`` as plain data for `unpack`; ``"unsent"`` names the globals that could not go."""
    packer = Packer()
    root = packer.function(fn)[1]
    return {"functions": packer.functions, "namespaces": packer.namespaces, "root": root,
            "unsent": packer.unsent}  # fmt: skip


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def defined_here(value) -> bool:
    """Defined in a notebook cell or a script run as the main program: not importable."""
    return getattr(value, "__module__", None) in ("__main__", "__mp_main__", None)


class Packer:
    """Turns a function into plain data a fresh interpreter can rebuild it from (`unpack`)."""

    def __init__(self) -> None:
        self.functions: dict[int, dict] = {}
        self.namespaces: dict[int, dict] = {}
        self.unsent: dict[str, str] = {}

    def function(self, fn: types.FunctionType) -> tuple:
        key = id(fn)
        if key not in self.functions:
            entry = {"code": marshal.dumps(fn.__code__), "name": fn.__name__}
            self.functions[key] = entry
            entry["qualname"] = fn.__qualname__
            space = id(fn.__globals__)
            if space not in self.namespaces:
                self.namespaces[space] = {"name": fn.__globals__.get("__name__"), "values": {}}
            values = self.namespaces[space]["values"]
            for name in sorted(_global_names(fn.__code__)):
                if name in fn.__globals__ and name not in values:
                    values[name] = None  # taken: a function that refers to itself stops here
                    ref = self.value(fn.__globals__[name], name)
                    if ref is None:
                        del values[name]
                    else:
                        values[name] = ref
            entry["namespace"] = space
            entry["defaults"] = [self.value(v, "a default") for v in fn.__defaults__ or ()]
            keywords = fn.__kwdefaults__ or {}
            entry["kwdefaults"] = {k: self.value(v, k) for k, v in keywords.items()}
            entry["closure"] = [self.cell(c) for c in fn.__closure__ or ()]
        return ("function", key)

    def cell(self, cell: types.CellType) -> tuple | None:
        try:
            contents = cell.cell_contents
        except ValueError:  # a closure variable not assigned yet
            return None
        return self.value(contents, "a closure variable")

    def value(self, value, name: str) -> tuple | None:
        if isinstance(value, types.ModuleType):
            return ("module", value.__name__)
        if isinstance(value, types.FunctionType) and (
            defined_here(value) or value.__name__ != value.__qualname__ or not _importable(value)
        ):
            return self.function(value)
        if isinstance(value, type) and defined_here(value):
            self.unsent[name] = f"a class defined in the notebook ({value.__name__})"
            return None
        try:
            return ("pickle", pickle.dumps(value))
        except Exception:  # noqa: BLE001  (anything that cannot be pickled stays behind)
            self.unsent[name] = f"a {type(value).__name__}"
            return None


def _importable(fn: types.FunctionType) -> bool:
    module = sys.modules.get(fn.__module__)
    return module is not None and getattr(module, fn.__name__, None) is fn


def unpack(payload: dict, unsent: dict[str, str]) -> types.FunctionType:
    """The function `Packer` packed; globals that cannot be rebuilt here are left out and
    named in ``unsent``, with the ones the parent could not send."""
    namespaces = {
        key: {"__builtins__": builtins, "__name__": space["name"] or "__main__"}
        for key, space in payload["namespaces"].items()
    }
    functions = {}
    for key, entry in payload["functions"].items():
        code = marshal.loads(entry["code"])
        cells = tuple(types.CellType() for _ in entry["closure"])
        fn = types.FunctionType(code, namespaces[entry["namespace"]], entry["name"], None,
                                cells or None)  # fmt: skip
        fn.__qualname__ = entry["qualname"]
        functions[key] = fn

    def resolve(ref):
        if ref is None:  # a value that could not be sent (named in `unsent`)
            return None
        kind, what = ref
        if kind == "module":
            return importlib.import_module(what)
        if kind == "function":
            return functions[what]
        return pickle.loads(what)  # the parent wrote it, for this very process

    for key, space in payload["namespaces"].items():
        for name, ref in space["values"].items():
            try:
                namespaces[key][name] = resolve(ref)
            except Exception as err:  # noqa: BLE001  (a global the worker may not even use)
                unsent[name] = f"{type(err).__name__} when it was rebuilt"
    for key, entry in payload["functions"].items():
        fn = functions[key]
        fn.__defaults__ = tuple(resolve(ref) for ref in entry["defaults"]) or None
        fn.__kwdefaults__ = {k: resolve(ref) for k, ref in entry["kwdefaults"].items()} or None
        for cell, ref in zip(fn.__closure__ or (), entry["closure"]):
            if ref is not None:
                cell.cell_contents = resolve(ref)
    return functions[payload["root"]]
