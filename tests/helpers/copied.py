"""A reference as a learner who copied its source would define it: the tests' correct answer.

A reference carries a tripwire in its own code, so passing it (or its ``__wrapped__``) to a
check as the answer fails, as it must. The tests' "correct answer" is its source compiled again
without the tripwire, in the reference module's globals, as an answer cell would define it.
"""

from __future__ import annotations
import __future__

import ast
import inspect
import sys
import textwrap


def copied(reference):
    """The function or class ``reference`` compiled again from its source, unguarded."""
    lines, first = inspect.getsourcelines(reference)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    for node in ast.walk(tree):  # the class's, and its methods'
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.decorator_list = [
                d for d in node.decorator_list if getattr(d, "id", "") != "reference"
            ]
    ast.increment_lineno(tree, first - 1)
    module = sys.modules[reference.__module__].__dict__
    future = module.get("annotations") is __future__.annotations
    flags = __future__.annotations.compiler_flag if future else 0
    made: dict = {}
    exec(compile(tree, "<a copied answer cell>", "exec", flags, True), module, made)
    return made[reference.__name__]
