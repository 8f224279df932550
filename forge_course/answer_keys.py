"""The release step that gives each question's visible test its answer key (self-study mode).

A question's test cell in ``solutions/`` has a visible call that checks the answer's form,

    check_number(q_iterations, "ch00_q_iterations")

and a hidden block that checks its value, ``check_number(q_iterations, "ch00_q_iterations",
expected=196, hints={...})``. The release runs the hidden block with recorders in place of
``check_number`` and ``check_choice``, turns what they receive into a key
(`forge_course.grading.answers`), and adds it to the visible call of the self-study notebook:
``check_number(q_iterations, "ch00_q_iterations", key={...})``. The key is derived from the
hidden block at every release, so it cannot drift from what the grader checks; a graded
release leaves the visible call as it is.

A new chapter needs nothing more: any graded cell whose hidden block calls ``check_number`` or
``check_choice`` with its answer and grade id, and whose visible part makes the same call
without the expected answer, gets a key.
"""

from __future__ import annotations

import ast
import builtins
import importlib

from forge_course.grading import answers

BEGIN, END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
CHECKS = ("check_number", "check_choice", "check_labels")
_MODULES = ("math", "numpy", "torch")


def hidden_code(source: str) -> str:
    """The code of a test cell's hidden blocks."""
    blocks, rest = [], source
    while BEGIN in rest:
        block, _, rest = rest.split(BEGIN, 1)[1].partition(END)
        blocks.append(block)
    return "\n".join(blocks)


class _Unknown(dict):
    """Names the hidden block reads from the learner's notebook (their answer) are None here;
    the recorders and builtins are found where Python looks next."""

    def __init__(self, known: dict):
        super().__init__()
        self.known = known

    def __missing__(self, name):
        if name in self.known or hasattr(builtins, name):
            raise KeyError(name)
        if name in _MODULES:  # imported earlier in the chapter, used to write a hint's value
            return importlib.import_module(name)
        return None


def key_of(source: str, cell_id: str) -> tuple[str, dict] | None:
    """The grade id its checks report and the answer key of the test cell ``source`` (None if
    it checks no question)."""
    keys: list[tuple[str, dict]] = []

    def record_number(_answer, gid, expected=None, *, rel_tol=1e-9, hints=None, **_):
        if expected is not None:
            keys.append((gid, answers.number_key(gid, expected, rel_tol=rel_tol, hints=hints)))

    def record_choice(_answer, gid, choices=None, correct=None, why_not=None, **_):
        if correct is not None:
            keys.append((gid, answers.choice_key(gid, correct, why_not)))

    def record_labels(_answer, gid, loops=None, codes=None, correct=None, hints=None, **_):
        if correct is not None:
            keys.append((gid, answers.labels_key(gid, correct, hints)))

    code = hidden_code(source)
    if not any(name in code for name in CHECKS):
        return None
    scope = {"check_number": record_number, "check_choice": record_choice}
    scope["check_labels"] = record_labels
    exec(compile(code, f"<hidden tests of {cell_id}>", "exec"), scope, _Unknown(scope))  # noqa: S102
    if len(keys) > 1:
        raise ValueError(f"{cell_id}: its hidden tests check the answer {len(keys)} times")
    return keys[0] if keys else None


def _visible_call(tree: ast.AST, grade_id: str) -> ast.Call | None:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) in CHECKS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == grade_id
        ):
            return node
    return None


def _written(key: dict) -> str:
    """The key as code, one digest a line (the course's hints, long lines and all)."""
    lines = ["{", "    # digests of the right answer and of known wrong ones, with their hints"]
    for name, value in key.items():
        if isinstance(value, dict) and name != "hints":  # one digest per item
            lines += [f"    {name!r}: {{"] + [f"        {k!r}: {v!r}," for k, v in value.items()]
            lines.append("    },")
        elif name != "hints":
            lines.append(f"    {name!r}: {value!r},")
    lines.append("    'hints': {")
    lines += [f"        {digest!r}: {text!r}," for digest, text in key["hints"].items()]
    lines += ["    },", "}"]
    return "\n    ".join(lines)


def with_key(source: str, grade_id: str, key: dict) -> str:
    """``source``, a released test cell, with ``key=`` added to its visible check call."""
    call = _visible_call(ast.parse(source), grade_id)
    if call is None:
        raise ValueError(f"{grade_id}: no visible check_number/check_choice call to give a key")
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: call.lineno - 1]) + call.col_offset
    end = sum(len(line) for line in lines[: call.end_lineno - 1]) + call.end_col_offset
    old = source[start:end]
    args = [ast.get_source_segment(source, a) for a in call.args]
    args += [f"{k.arg}={ast.get_source_segment(source, k.value)}" for k in call.keywords]
    new = f"{ast.get_source_segment(source, call.func)}(\n    "
    new += ",\n    ".join(args) + f",\n    key={_written(key)},\n)"
    assert old.startswith(ast.get_source_segment(source, call.func))
    return source[:start] + new + source[end:]


def keyed_cells(source_nb, released_nb) -> dict[str, str]:
    """For each question test cell of ``released_nb``: its source with the key, by grade id.

    The keys come from the hidden tests of the same cells in ``source_nb``, the instructor's
    notebook the release was made from.
    """
    sources = {
        cell.metadata["nbgrader"]["grade_id"]: cell.source
        for cell in source_nb.cells
        if cell.metadata.get("nbgrader", {}).get("grade")
    }
    keyed = {}
    for cell in released_nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("grade") or meta["grade_id"] not in sources:
            continue
        found = key_of(sources[meta["grade_id"]], meta["grade_id"])
        if found is not None:
            keyed[meta["grade_id"]] = with_key(cell.source, *found)
    return keyed
