"""A reference as a learner who copied its source would define it: the tests' correct answer.

A reference carries a tripwire in its own code, so passing it (or its ``__wrapped__``) to a
check as the answer fails, as it must. The tests' "correct answer" is its source compiled again
without the tripwire, as an answer cell would define it, in a copy of its module's globals in
which the other references it uses are copied too (a learner copies the helpers as well).
"""

from __future__ import annotations
import __future__

import ast
import inspect
import sys
import textwrap

from forge_course.reference.guard import is_reference


def copied(reference, _made: dict | None = None):
    """The function or class ``reference`` compiled again from its source, unguarded."""
    made = {} if _made is None else _made
    if id(reference) in made:
        return made[id(reference)]
    lines, first = inspect.getsourcelines(reference)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    for node in ast.walk(tree):  # the class's, and its methods'
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.decorator_list = [
                d for d in node.decorator_list if getattr(d, "id", "") != "reference"
            ]
    ast.increment_lineno(tree, first - 1)
    module = sys.modules[reference.__module__].__dict__
    namespace = {**module, "__name__": "__main__"}  # defined as a notebook's cell defines it
    future = module.get("annotations") is __future__.annotations
    flags = __future__.annotations.compiler_flag if future else 0
    scope: dict = {}
    exec(compile(tree, "<a copied answer cell>", "exec", flags, True), namespace, scope)
    made[id(reference)] = copy = scope[reference.__name__]
    for name, value in module.items():
        if is_reference(value) and value is not reference:
            namespace[name] = copied(value, made)
    namespace[reference.__name__] = copy
    return copy
