"""Mutants of one answer cell: the solution with one learner-like mistake put in.

Only code between nbgrader's ``### BEGIN SOLUTION`` and ``### END SOLUTION`` is changed: the
function's signature and everything the learner is given stay as released.

Two families of operators, applied to the cell's libcst tree (libcst keeps every comment and
space, so a mutant differs from the solution in the changed spot only, and the report can show
the line as the learner would have written it):

* mutmut's node operators (`mutmut.mutation.mutators.mutation_operators`): an integer or float
  plus one, ``True`` <-> ``False``, ``a = b`` -> ``a = None``, ``x += y`` -> ``x = y``, ``not``
  dropped, an argument dropped (not its variant that sets one to None: a crash more than a
  mistake, and a third of all mutants), arithmetic, comparison and boolean operators
  swapped (``<`` -> ``<=``, ``+`` -> ``-``, ``and`` -> ``or``), ``is``/``in`` negated, a
  conditional expression forced down one arm. Its string operator (``"x"`` -> ``"XXxXX"``) and
  its ``dict(a=...)`` keyword renaming are left out: they model typos in keys and messages, not
  the mistakes of a training loop.
* this module's, for the mistakes a learner of this course makes: a statement deleted; two
  adjacent statements swapped (unless they commute: `swap_statements`); a call such as
  ``zero_grad``/``backward``/``step``/``eval``/``set_epoch`` moved to the start or end of its
  block or out of its loop; a ``with`` block (``no_grad``, ``autocast``, ``open``) unwrapped;
  a method such as ``detach``/``item``/``to`` dropped from a chain; a reduction swapped
  (``mean`` <-> ``sum``, ``max`` <-> ``min``); a dimension changed; a comparison reversed; an
  integer or a range/slice bound off by one; an in-place op made out-of-place and back; a
  keyword argument dropped; ``eval`` <-> ``train``.

Every mutant is identified by `Mutant.key`: the exercise, the operator and a hash of the lines
it changes (old and new text, not their line numbers), so a reviewed equivalent mutant keeps
its key when unrelated lines of the cell change.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider
from mutmut.mutation.mutators import mutation_operators as MUTMUT_OPERATORS

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
# mutmut operators left out (see the module docstring).
MUTMUT_SKIPPED = {"operator_string", "operator_dict_arguments"}


# Calls whose place in a loop is the lesson: they are moved, not only deleted.
MOVABLE_CALLS = {
    "zero_grad", "backward", "step", "eval", "train", "set_epoch", "update", "unscale_",
    "clip_grad_norm_", "manual_seed", "seed", "barrier", "flush", "fsync",
}  # fmt: skip
# Methods a learner forgets in a chain: ``loss.item()`` -> ``loss``.
DROPPABLE_METHODS = {
    "detach", "item", "to", "cpu", "cuda", "clone", "float", "double", "long", "contiguous",
    "eval", "train", "tolist", "numpy", "squeeze", "unsqueeze", "flatten", "t", "view", "reshape",
}  # fmt: skip
REDUCTION_SWAPS = {
    "mean": "sum", "sum": "mean", "amax": "amin", "amin": "amax", "argmax": "argmin",
    "argmin": "argmax", "max": "min", "min": "max", "all": "any", "any": "all",
    "nanmean": "nansum", "nansum": "nanmean",
}  # fmt: skip
REDUCTION_STRINGS = {"mean": ("sum", "none"), "sum": ("mean", "none"), "none": ("mean", "sum")}
DIM_KEYWORDS = {"dim", "axis", "dim0", "dim1", "start_dim", "end_dim"}
DIM_FUNCTIONS = {
    "sum", "mean", "argmax", "argmin", "max", "min", "amax", "amin", "softmax", "log_softmax",
    "unsqueeze", "squeeze", "size", "cat", "stack", "flatten", "cumsum", "any", "all", "norm",
    "logsumexp", "split", "chunk", "transpose", "narrow", "select", "gather", "sort", "topk",
}  # fmt: skip
MODE_SWAPS = {"eval": "train", "train": "eval", "no_grad": "enable_grad", "enable_grad": "no_grad"}
# Tensor methods with an in-place twin (``x.mul(2)`` -> ``x.mul_(2)`` changes ``x``).
OUT_OF_PLACE = {
    "add", "sub", "mul", "div", "clamp", "clamp_min", "clamp_max", "neg", "exp", "log", "abs",
    "sqrt", "pow", "sigmoid", "tanh", "relu", "masked_fill", "fill", "zero", "copy", "lerp",
}  # fmt: skip
# In-place names whose underscore-less twin is no out-of-place version of the same operation.
NOT_IN_PLACE_TWINS = {"clip_grad_norm_", "clip_grad_value_", "requires_grad_", "manual_seed_"}
AUGMENTED = {
    cst.AddAssign: cst.Add, cst.SubtractAssign: cst.Subtract, cst.MultiplyAssign: cst.Multiply,
    cst.DivideAssign: cst.Divide, cst.FloorDivideAssign: cst.FloorDivide,
}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    """One mutated answer cell."""

    exercise: str
    operator: str
    source: str  # the whole answer cell, mutated
    line: int  # the first changed line, 1-based in the cell
    before: str  # the solution's text of the changed lines
    after: str  # the mutant's text of them ("" where lines were deleted)
    digest: str  # a hash of operator, before and after: stable when other lines change

    @property
    def key(self) -> str:
        return f"{self.exercise}:{self.operator}:{self.digest}"


def solution_regions(cell: str) -> list[tuple[int, int]]:
    """The 1-based line ranges strictly between each BEGIN/END SOLUTION pair of ``cell``."""
    regions, start = [], None
    for number, text in enumerate(cell.splitlines(), 1):
        if text.strip() == BEGIN:
            start = number
        elif text.strip() == END and start is not None:
            regions.append((start + 1, number - 1))
            start = None
    return regions


# -- how operators see the tree ----------------------------------------------------------------


class _Tree:
    """The cell's tree, its parents and positions, and which nodes lie inside a solution."""

    def __init__(self, cell: str):
        self.module = cst.parse_module(cell)
        wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
        self.positions = wrapper.resolve(PositionProvider)
        self.regions = solution_regions(cell)
        self.parent: dict[int, cst.CSTNode] = {}
        self.nodes: list[cst.CSTNode] = []
        self._walk(self.module)

    def _walk(self, node: cst.CSTNode) -> None:
        self.nodes.append(node)
        for child in node.children:
            self.parent[id(child)] = node
            self._walk(child)

    def inside(self, node: cst.CSTNode) -> bool:
        where = self.positions.get(node)
        return where is not None and any(
            first <= where.start.line and where.end.line <= last for first, last in self.regions
        )

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line


def _replace(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    class Replace(cst.CSTTransformer):
        def on_leave(self, original, updated):
            return new if original is old else updated

    return module.visit(Replace())


def _call_name(call: cst.CSTNode) -> str | None:
    if not isinstance(call, cst.Call):
        return None
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    if isinstance(call.func, cst.Name):
        return call.func.value
    return None


def _statement_call(statement: cst.CSTNode) -> str | None:
    """``name`` for a statement that is one bare call ``...name(...)``."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Expr):
            return _call_name(small.value)
    return None


def _body(block: cst.CSTNode) -> tuple:
    return tuple(block.body)


def _with_body(block: cst.CSTNode, body: list) -> cst.CSTNode:
    """``block`` with ``body``; the comments above the block's first statement (``### BEGIN
    SOLUTION``) stay first, whatever statement now comes first."""
    body = list(body) or [cst.SimpleStatementLine([cst.Pass()])]
    old_first = block.body[0] if block.body else None
    if old_first is not None and body[0] is not old_first:
        body = [
            s.with_changes(leading_lines=()) if s is old_first else s for s in body
        ]  # fmt: skip
        body[0] = body[0].with_changes(leading_lines=old_first.leading_lines)
    return block.with_changes(body=body)


def _int_node(value: int) -> cst.BaseExpression:
    if value < 0:
        return cst.UnaryOperation(cst.Minus(), cst.Integer(str(-value)))
    return cst.Integer(str(value))


def _int_value(node: cst.CSTNode) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value, 0)
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        return -int(node.expression.value, 0)
    return None


# -- statement operators: they replace a whole block -------------------------------------------

Operator = Callable[[cst.CSTNode, _Tree], Iterator[cst.CSTNode]]


def _block_statements(block: cst.CSTNode, tree: _Tree) -> list[int]:
    return [i for i, s in enumerate(_body(block)) if tree.inside(s)]


def delete_statement(block, tree):
    body = _body(block)
    for i in _block_statements(block, tree):
        yield _with_body(block, [*body[:i], *body[i + 1 :]])


_CONTROL = (cst.Return, cst.Raise, cst.Break, cst.Continue, cst.Yield, cst.Await)


def _nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from _nodes(child)


def _base_name(target: cst.CSTNode) -> Iterator[str]:
    """The names an assignment to ``target`` rebinds or changes (``a.b[c] = 1`` changes ``a``)."""
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, cst.Attribute | cst.Subscript):
        yield from _base_name(target.value)
    elif isinstance(target, cst.Tuple | cst.List):
        for element in target.elements:
            yield from _base_name(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from _base_name(target.value)


def _effects(statement: cst.CSTNode) -> tuple[set[str], set[str], bool]:
    """The names ``statement`` reads or writes, those it writes, and whether it is *pure*: no
    call, no return/raise/break/yield, and only plain names assigned."""
    names, written, pure = set(), set(), True
    for node in _nodes(statement):
        if isinstance(node, cst.Name):
            names.add(node.value)
        targets = []
        if isinstance(
            node, cst.AssignTarget | cst.AugAssign | cst.AnnAssign | cst.For | cst.CompFor
        ):
            targets = [node.target]
        elif isinstance(node, cst.AsName):
            targets = [node.name]
        for target in targets:
            written |= set(_base_name(target))
            pure &= isinstance(target, cst.Name)
        if isinstance(node, (cst.Call, cst.Del, cst.Global, cst.Nonlocal, *_CONTROL)):
            pure = False
    return names, written, pure


def _commute(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """Whether running ``b`` before ``a`` cannot change anything: neither writes a name the other
    uses, and one of them is pure (so aliasing, calls and early exits cannot link them)."""
    names_a, written_a, pure_a = _effects(a)
    names_b, written_b, pure_b = _effects(b)
    return not (written_a & names_b or written_b & names_a) and (pure_a or pure_b)


def swap_statements(block, tree):
    """Two adjacent statements swapped, unless they commute (`_commute`): such a swap cannot be
    told from the solution, and would only add equivalent mutants to review."""
    body = _body(block)
    inside = set(_block_statements(block, tree))
    for i in sorted(inside):
        if i + 1 in inside and not _commute(body[i], body[i + 1]):
            yield _with_body(block, [*body[:i], body[i + 1], body[i], *body[i + 2 :]])


def move_call(block, tree):
    """A call like ``optimizer.zero_grad()`` moved to the start or the end of its block, or
    out of the loop it is in (just before or just after the loop)."""
    body = list(_body(block))
    inside = _block_statements(block, tree)
    for i in inside:
        if _statement_call(body[i]) not in MOVABLE_CALLS:
            continue
        rest = body[:i] + body[i + 1 :]
        first, last = inside[0], len(rest)
        if isinstance(rest[-1] if rest else None, cst.SimpleStatementLine) and isinstance(
            rest[-1].body[0], cst.Return
        ):
            last -= 1  # before the return, not after it
        for where in (first, last):
            if where != i:
                yield _with_body(block, [*rest[:where], body[i], *rest[where:]])
    for j in inside:
        loop = body[j]
        if not isinstance(loop, cst.For | cst.While):
            continue
        inner = list(loop.body.body)
        for k, statement in enumerate(inner):
            if _statement_call(statement) not in MOVABLE_CALLS or not tree.inside(statement):
                continue
            emptied = loop.with_changes(body=_with_body(loop.body, inner[:k] + inner[k + 1 :]))
            statement = statement.with_changes(leading_lines=())
            yield _with_body(block, [*body[:j], statement, emptied, *body[j + 1 :]])
            yield _with_body(block, [*body[:j], emptied, statement, *body[j + 1 :]])


def unwrap_with(block, tree):
    """``with torch.no_grad(): body`` -> ``body``."""
    body = _body(block)
    for i in _block_statements(block, tree):
        if isinstance(body[i], cst.With):
            yield _with_body(block, [*body[:i], *body[i].body.body, *body[i + 1 :]])


BLOCK_OPERATORS: list[Operator] = [
    delete_statement,
    swap_statements,
    move_call,
    unwrap_with,
]


# -- expression operators: they replace one node -----------------------------------------------


def drop_method(node, tree):
    """``loss.item()`` -> ``loss``; not where the call is a statement (deleting covers it)."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in DROPPABLE_METHODS
        and not isinstance(tree.parent.get(id(node)), cst.Expr)
    ):
        yield node.func.value


def swap_reduction(node, tree):
    if isinstance(node, cst.Attribute) and node.attr.value in REDUCTION_SWAPS:
        yield node.with_changes(attr=cst.Name(REDUCTION_SWAPS[node.attr.value]))
    if (
        isinstance(node, cst.Arg)
        and node.keyword
        and node.keyword.value == "reduction"
        and isinstance(node.value, cst.SimpleString)
    ):
        quote, text = node.value.value[0], node.value.evaluated_value
        for other in REDUCTION_STRINGS.get(text, ()):
            yield node.with_changes(value=cst.SimpleString(f"{quote}{other}{quote}"))


def _other_dims(value: int) -> list[int]:
    return [d for d in dict.fromkeys([0, 1, -1, value - 1, value + 1]) if d != value]


def change_dimension(node, tree):
    """``dim=1`` -> ``dim=0``, ``dim=-1``...; and a literal dimension of ``.sum(1)``-like calls."""
    if isinstance(node, cst.Arg) and node.keyword and node.keyword.value in DIM_KEYWORDS:
        value = _int_value(node.value)
        if value is not None:
            for other in _other_dims(value):
                yield node.with_changes(value=_int_node(other))
    if isinstance(node, cst.Call) and _call_name(node) in DIM_FUNCTIONS:
        for i, arg in enumerate(node.args):
            value = None if arg.keyword or arg.star else _int_value(arg.value)
            if value is None:
                continue
            for other in _other_dims(value):
                changed = arg.with_changes(value=_int_node(other))
                yield node.with_changes(args=[*node.args[:i], changed, *node.args[i + 1 :]])


def reverse_comparison(node, tree):
    flips = {
        cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan,
        cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual,
    }  # fmt: skip
    if isinstance(node, cst.ComparisonTarget) and type(node.operator) in flips:
        yield node.with_changes(operator=flips[type(node.operator)]())


def _plus(expr: cst.BaseExpression, amount: int) -> cst.BaseExpression:
    op = cst.Add() if amount > 0 else cst.Subtract()
    left = expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if isinstance(
        expr, cst.BinaryOperation | cst.BooleanOperation | cst.IfExp
    ) else expr  # fmt: skip
    return cst.BinaryOperation(left, op, cst.Integer(str(abs(amount))))


def off_by_one(node, tree):
    """An integer minus one (mutmut adds one); a range's or a slice's bound plus or minus one."""
    if isinstance(node, cst.Integer):
        yield _int_node(int(node.value, 0) - 1)
    if isinstance(node, cst.Call) and _call_name(node) == "range":
        for i, arg in enumerate(node.args):
            if _int_value(arg.value) is None and not arg.star:
                for amount in (1, -1):
                    changed = arg.with_changes(value=_plus(arg.value, amount))
                    yield node.with_changes(args=[*node.args[:i], changed, *node.args[i + 1 :]])
    if isinstance(node, cst.Slice):
        for field in ("lower", "upper"):
            bound = getattr(node, field)
            if bound is not None and _int_value(bound) is None:
                for amount in (1, -1):
                    yield node.with_changes(**{field: _plus(bound, amount)})


MODULES = {"torch", "F", "np", "numpy", "math", "nn", "functional"}


def _operand_is_a_variable(call: cst.Call) -> bool:
    """Whether the tensor ``call`` would change in place is one the code holds (``x.mul(2)``,
    ``torch.exp(x)``), not a temporary (``(x - m).exp()``): in place on a temporary changes
    nothing anyone sees."""
    owner = call.func.value
    is_function = (
        isinstance(owner, cst.Name)
        and owner.value in MODULES
        or (isinstance(owner, cst.Attribute) and owner.attr.value in MODULES)
    )
    operand = (call.args[0].value if call.args else None) if is_function else owner
    return isinstance(operand, cst.Name | cst.Attribute | cst.Subscript)


def toggle_in_place(node, tree):
    """``x.add_(y)`` -> ``x.add(y)``; ``z = x.mul(2)`` -> ``z = x.mul_(2)``; ``x += y`` ->
    ``x = x + y``; ``x = x + y`` -> ``x += y``."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        name = node.func.attr.value
        if re.fullmatch(r"[a-z][a-z0-9_]*[a-z0-9]_", name) and name not in NOT_IN_PLACE_TWINS:
            yield node.with_changes(func=node.func.with_changes(attr=cst.Name(name[:-1])))
        elif (
            name in OUT_OF_PLACE
            and not isinstance(tree.parent.get(id(node)), cst.Expr)
            and _operand_is_a_variable(node)
        ):
            yield node.with_changes(func=node.func.with_changes(attr=cst.Name(name + "_")))
    if isinstance(node, cst.AugAssign) and type(node.operator) in AUGMENTED:
        value = cst.BinaryOperation(node.target, AUGMENTED[type(node.operator)](), node.value)
        yield cst.Assign([cst.AssignTarget(node.target)], value)
    if (
        isinstance(node, cst.Assign)
        and len(node.targets) == 1
        and isinstance(node.value, cst.BinaryOperation)
        and node.targets[0].target.deep_equals(node.value.left)
    ):
        back = {v: k for k, v in AUGMENTED.items()}.get(type(node.value.operator))
        if back is not None:
            yield cst.AugAssign(node.targets[0].target, back(), node.value.right)


def drop_keyword(node, tree):
    """``f(x, reduction="sum")`` -> ``f(x)``: a forgotten ``device=``, ``dim=``, ``dtype=``."""
    if isinstance(node, cst.Call):
        for i, arg in enumerate(node.args):
            if arg.keyword is not None:
                yield node.with_changes(args=[*node.args[:i], *node.args[i + 1 :]])


def swap_mode(node, tree):
    """``model.eval()`` <-> ``model.train()``, ``torch.no_grad()`` <-> ``torch.enable_grad()``."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        name = node.func.attr.value
        if name in MODE_SWAPS:
            yield node.with_changes(func=node.func.with_changes(attr=cst.Name(MODE_SWAPS[name])))


NODE_OPERATORS: list[Operator] = [
    drop_method,
    swap_reduction,
    change_dimension,
    reverse_comparison,
    off_by_one,
    toggle_in_place,
    drop_keyword,
    swap_mode,
]


def _mutmut_operators() -> list[tuple[str, type, Callable]]:
    return [
        (fn.__name__.removeprefix("operator_"), kind, fn)
        for kind, fn in MUTMUT_OPERATORS
        if fn.__name__ not in MUTMUT_SKIPPED
    ]


# -- the mutants of a cell ---------------------------------------------------------------------


def _change(cell: str, mutated: str) -> tuple[int, str, str]:
    """The first changed line, and the span of lines that differ, before and after."""
    old, new = cell.splitlines(), mutated.splitlines()
    first = next(i for i, (a, b) in enumerate(zip([*old, None], [*new, None])) if a != b)
    same_tail = 0
    while (
        same_tail < min(len(old), len(new)) - first
        and old[len(old) - 1 - same_tail] == new[len(new) - 1 - same_tail]
    ):
        same_tail += 1
    before = "\n".join(line.strip() for line in old[first : len(old) - same_tail])
    after = "\n".join(line.strip() for line in new[first : len(new) - same_tail])
    return first + 1, before, after


def _candidates(tree: _Tree) -> Iterator[tuple[str, cst.CSTNode, cst.CSTNode]]:
    mutmut = _mutmut_operators()
    for node in tree.nodes:
        if isinstance(node, cst.IndentedBlock | cst.Module):
            for operator in BLOCK_OPERATORS:
                for new in operator(node, tree):
                    yield operator.__name__, node, new
            continue
        if not tree.inside(node):
            continue
        for operator in NODE_OPERATORS:
            for new in operator(node, tree):
                yield operator.__name__, node, new
        for name, kind, fn in mutmut:
            if isinstance(node, kind):
                for new in fn(node):
                    if name == "arg_removal" and len(new.args) == len(node.args):
                        continue  # an argument set to None (see the module docstring)
                    yield name, node, new


def mutants(exercise: str, cell: str) -> list[Mutant]:
    """Every distinct mutant of ``cell`` that compiles, in a fixed order.

    Two operators that give the same source give one mutant, named after the first.
    """
    tree = _Tree(cell)
    seen, found, keys = {cell}, [], set()
    for operator, old, new in _candidates(tree):
        source = _replace(tree.module, old, new).code
        if source in seen:
            continue
        seen.add(source)
        try:
            compile(source, exercise, "exec")
        except SyntaxError:
            continue
        line, before, after = _change(cell, source)
        digest = hashlib.sha1(f"{operator}\n{before}\n->\n{after}".encode()).hexdigest()[:10]
        n = 2
        while f"{exercise}:{operator}:{digest}" in keys:  # the same change in two places
            digest = f"{digest.split('.')[0]}.{n}"
            n += 1
        mutant = Mutant(exercise, operator, source, line, before, after, digest)
        keys.add(mutant.key)
        found.append(mutant)
    return found
