"""The tape recorder: build a small expression, see the graph autograd records, press backward.

The engine, `TapeRecorder`, records one of a few expressions on two scalar leaves ``x`` and
``w`` and answers with a `TapeState`: plain data (names, numbers, positions) describing every
node of the recorded graph, the gradient that reached it in the last ``backward()``, and the
leaves' ``.grad``. Pressing backward again records the forward afresh (the graph of the last
call is freed) and *adds* into ``.grad``, as a training loop without ``zero_grad()`` would.

`draw_tape` draws a state as a small DAG with matplotlib; `tape_view` wires both to widgets.
Tests drive the engine; the browser test checks that the view renders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyBboxPatch

from forge_course.reference.autograd_tape import recorded_graph
from forge_course.sims.display import PALETTE, LiveFigure, show

Named = dict[str, torch.Tensor]


def _running_example(x, w, n) -> Named:
    y = w * x
    z = y + x
    return {"y": y, "z": z, "L": z**2}


def _branch(x, w, n) -> Named:
    # Plain Python decides which operations run; autograd records only the branch taken.
    if x > 0:
        c = x**3
        return {"c": c, "L": w * c}
    return {"L": w - x}


def _loop(x, w, n) -> Named:
    named, y = {}, x
    for i in range(1, n + 1):
        y = y * w
        named[f"y{i}"] = y
    named["L"] = named.pop(f"y{n}")
    return named


def _detach(x, w, n) -> Named:
    y = w * x
    return {"y": y, "L": y * y.detach()}


@dataclass(frozen=True)
class Expression:
    formula: str
    build: Callable[[torch.Tensor, torch.Tensor, int], Named]  # (x, w, n) -> tensors, "L" last


EXPRESSIONS = {
    "running example": Expression("L = (w·x + x)²,  y = w·x,  z = y + x", _running_example),
    "branch": Expression("L = w·x³ if x > 0 else w − x", _branch),
    "loop": Expression("L = x·wⁿ:  y ← y·w, n times", _loop),
    "detach": Expression("L = y · y.detach(),  y = w·x", _detach),
}


@dataclass(frozen=True)
class NodeInfo:
    """One node of the recorded graph, as plain data.

    Attributes:
        kind: the node's class name (``MulBackward0``, ``AccumulateGrad``).
        label: the tensor it made (``z``), or ``leaf x`` for a leaf's ``AccumulateGrad``.
        value: that tensor's value.
        grad: the gradient that reached the node in the last ``backward()`` (dL/d that tensor);
            None before the first call.
        total: for a leaf, its ``.grad`` (the sum over every call since ``zero_grad``).
        inputs: positions of the nodes it passes gradient to (its ``next_functions``).
        position: (x, y) where to draw it; the root is at the top, y = 0, and y decreases.
    """

    kind: str
    label: str
    value: float
    grad: float | None
    total: float | None
    inputs: tuple[int, ...]
    position: tuple[float, float]


@dataclass(frozen=True)
class TapeState:
    expression: str
    formula: str
    nodes: tuple[NodeInfo, ...]
    calls: int  # backward() calls since the last zero_grad (or since the leaves were made)
    history: dict[str, list[float]]  # leaf name -> its .grad after each of those calls
    caption: str


def layers(inputs: list[list[int]]) -> list[int]:
    """Each node's depth on the longest path from the root (node 0), so every edge points down."""
    depth = [0] * len(inputs)
    for _ in range(len(inputs)):  # a DAG's longest paths settle in at most n passes
        changed = False
        for node, feeds in enumerate(inputs):
            for nxt in feeds:
                if depth[nxt] < depth[node] + 1:
                    depth[nxt], changed = depth[node] + 1, True
        if not changed:
            break
    return depth


def _positions(inputs: list[list[int]]) -> list[tuple[float, float]]:
    depth = layers(inputs)
    rows: dict[int, list[int]] = {}
    for node, d in enumerate(depth):
        rows.setdefault(d, []).append(node)
    where = {}
    for d, row in rows.items():
        for k, node in enumerate(row):
            where[node] = (k - (len(row) - 1) / 2, -float(d))
    return [where[node] for node in range(len(inputs))]


class TapeRecorder:
    """Record an expression on leaves ``x`` and ``w``; run backward; clear ``.grad``.

    Example:
        >>> tape = TapeRecorder("running example", x=2.0, w=3.0)
        >>> tape.backward().history
        {'x': [64.0], 'w': [32.0]}
        >>> tape.backward().history  # no zero_grad: the second call adds the same again
        {'x': [64.0, 128.0], 'w': [32.0, 64.0]}
    """

    def __init__(self, expression: str = "running example", x=2.0, w=3.0, n: int = 3):
        self.record(expression, x, w, n)

    def record(self, expression: str, x: float, w: float, n: int = 3) -> TapeState:
        """Start afresh: new leaves with these values, ``.grad`` empty, the forward recorded."""
        if expression not in EXPRESSIONS:
            raise ValueError(f"unknown expression {expression!r}; choose from {list(EXPRESSIONS)}")
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        self.expression, self.n = expression, int(n)
        self.leaves = {
            "x": torch.tensor(float(x), dtype=torch.float64, requires_grad=True),
            "w": torch.tensor(float(w), dtype=torch.float64, requires_grad=True),
        }
        self.history: dict[str, list[float]] = {"x": [], "w": []}
        self._forward()
        self._grads: dict[object, float] = {}
        return self.state()

    def _forward(self) -> None:
        self.named = EXPRESSIONS[self.expression].build(self.leaves["x"], self.leaves["w"], self.n)
        self.graph = recorded_graph(self.named["L"])

    def backward(self) -> TapeState:
        """Record the forward again, then ``L.backward()``: each ``.grad`` grows by dL/dleaf."""
        self._forward()  # the previous call freed its graph: a new step records a new one
        seen: dict[object, float] = {}

        def keep(node):  # a node's hook sees the gradient arriving at it: dL/d(its output)
            return lambda grad_inputs, grad_outputs: seen.__setitem__(node, grad_outputs[0])

        hooks = [node.register_hook(keep(node)) for node in self.graph.nodes]
        try:
            self.named["L"].backward()
        finally:
            for hook in hooks:
                hook.remove()
        self._grads = {node: float(g) for node, g in seen.items() if g is not None}
        for name, leaf in self.leaves.items():
            if leaf.grad is not None:
                self.history[name].append(float(leaf.grad))
        return self.state()

    def zero_grad(self) -> TapeState:
        """``.grad = None`` on both leaves, as ``optimizer.zero_grad()`` does by default."""
        for leaf in self.leaves.values():
            leaf.grad = None
        self.history = {"x": [], "w": []}
        self._grads = {}
        return self.state()

    @property
    def calls(self) -> int:
        return max(len(h) for h in self.history.values())

    def state(self) -> TapeState:
        """The recorded graph and its numbers, as plain data."""
        made_by = {t.grad_fn: name for name, t in self.named.items()}
        leaf_of = {id(t): name for name, t in self.leaves.items()}
        positions = _positions(self.graph.inputs)
        nodes = []
        for node, feeds, position in zip(self.graph.nodes, self.graph.inputs, positions):
            total = None
            if hasattr(node, "variable"):  # AccumulateGrad: the leaf it adds into
                name = leaf_of[id(node.variable)]
                label, value = f"leaf {name}", node.variable.item()
                leaf_grad = self.leaves[name].grad
                total = None if leaf_grad is None else leaf_grad.item()
            else:
                label = made_by.get(node, "")
                value = self.named[label].item() if label else float("nan")
            grad = self._grads.get(node)
            nodes.append(
                NodeInfo(type(node).__name__, label, value, grad, total, tuple(feeds), position)
            )
        return TapeState(
            self.expression,
            EXPRESSIONS[self.expression].formula,
            tuple(nodes),
            self.calls,
            {k: list(v) for k, v in self.history.items()},
            self._caption(),
        )

    def _caption(self) -> str:
        if self.calls == 0:
            return "Recorded the forward. No backward yet: every .grad is None."
        parts = []
        for name, values in self.history.items():
            if values:
                steps = " → ".join(f"{v:g}" for v in values)
                parts.append(f"{name}.grad: {steps}")
            else:
                parts.append(f"{name}.grad: None (L does not depend on {name})")
        plural = "s" if self.calls > 1 else ""
        return f"{self.calls} backward call{plural} since zero_grad. " + "; ".join(parts)


def _fmt(value: float | None, sign: str = "") -> str:
    return "—" if value is None else f"{value:{sign}.4g}"


def figsize(state: TapeState) -> tuple[float, float]:
    """Inches for `draw_tape` of ``state``: about an inch per layer, so that three lines of
    text fit in every box."""
    xs = [n.position[0] for n in state.nodes] or [0.0]
    ys = [n.position[1] for n in state.nodes] or [0.0]
    return (max(6.4, 1.5 * (max(xs) - min(xs) + 1.5)), 1.0 * (max(ys) - min(ys)) + 1.6)


def _node_text(node: NodeInfo) -> str:
    name = node.label.removeprefix("leaf ")
    if node.kind == "AccumulateGrad":
        lines = [node.kind, f"{name} = {_fmt(node.value)}",
                 f"{_fmt(node.grad, '+')}  →  .grad {_fmt(node.total)}"]  # fmt: skip
    else:
        head = f"{node.label} = {_fmt(node.value)}" if node.label else ""
        lines = [node.kind, head, f"dL/d{node.label or '(output)'} = {_fmt(node.grad)}"]
    return "\n".join(line for line in lines if line)


class TapePicture:
    """`draw_tape`'s picture kept on one axes: an update sets the nodes' texts and the title,
    and makes the boxes and arrows again only when the graph's shape changes. All of them are
    what a view draws per event (`moving_artists`): two graphs can share the axes' limits."""

    def __init__(self, ax) -> None:
        self.ax, self.shape = ax, None
        self.arrows: list = []
        self.boxes: list = []
        self.texts: list = []
        ax.axis("off")
        self.title = ax.set_title("", fontsize=10, y=1.0)  # y given: not placed per draw

    def moving_artists(self) -> list:
        return [*self.boxes, *self.arrows, *self.texts, self.title]  # as a full draw orders them

    def update(self, state: TapeState, title: str | None = None) -> None:
        shape = tuple((n.kind, n.inputs, n.position) for n in state.nodes)
        if shape != self.shape:
            self._build(state)
            self.shape = shape
        for text, node in zip(self.texts, state.nodes):
            text.set_text(_node_text(node))
        plural = "s" if state.calls != 1 else ""
        self.title.set_text(title or f"{state.formula}\nafter {state.calls} backward call{plural}")

    def _build(self, state: TapeState) -> None:
        """The boxes and arrows of ``state``'s graph, in place of the last graph's."""
        for artist in [*self.arrows, *self.boxes, *self.texts]:
            artist.remove()
        ax = self.ax
        xs = [n.position[0] for n in state.nodes] or [0.0]
        ys = [n.position[1] for n in state.nodes] or [0.0]
        ax.set_xlim(min(xs) - 0.75, max(xs) + 0.75)
        ax.set_ylim(min(ys) - 0.6, max(ys) + 0.5)
        self.arrows, self.boxes, self.texts = [], [], []
        for node in state.nodes:
            (x0, y0) = node.position
            for target in node.inputs:
                (x1, y1) = state.nodes[target].position
                # An edge that skips a layer bends outwards, around the boxes in between.
                bend = 0.0 if y0 - y1 <= 1 else (0.35 if x1 <= x0 else -0.35)
                self.arrows.append(ax.annotate(
                    "", xy=(x1, y1 + 0.24), xytext=(x0, y0 - 0.24),
                    arrowprops={"arrowstyle": "->", "color": PALETTE["grey"], "lw": 1.4,
                                "connectionstyle": f"arc3,rad={bend}"},
                ))  # fmt: skip
        for node in state.nodes:
            colour = PALETTE["orange"] if node.kind == "AccumulateGrad" else PALETTE["sky"]
            x, y = node.position
            self.boxes.append(ax.add_patch(
                FancyBboxPatch((x - 0.42, y - 0.22), 0.84, 0.44, boxstyle="round,pad=0.02",
                               facecolor=colour, edgecolor=PALETTE["black"], alpha=0.9)
            ))  # fmt: skip
            self.texts.append(ax.text(x, y, "", ha="center", va="center", fontsize=8))


def draw_tape(state: TapeState, ax=None, title: str | None = None):
    """Draw ``state`` as a DAG: root on top, leaves in orange, arrows the way backward walks."""
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize(state))
    else:
        fig = ax.figure
    ax.clear()
    TapePicture(ax).update(state, title)
    return fig


def tape_view(expression: str = "running example", x=2.0, w=3.0, n: int = 3) -> None:
    """Widgets over a `TapeRecorder`: choose the expression and inputs, press backward, zero_grad.

    Without a widget front end the cell shows the default expression after one and after two
    backward calls, side by side.
    """
    import ipywidgets as widgets

    tape = TapeRecorder(expression, x, w, n)
    choose = widgets.Dropdown(options=list(EXPRESSIONS), value=expression, description="expression")
    x_slider = widgets.FloatSlider(x, min=-3, max=3, step=0.5, description="x")
    w_slider = widgets.FloatSlider(w, min=-3, max=3, step=0.5, description="w")
    n_slider = widgets.IntSlider(n, min=1, max=5, description="n (loop)")
    press_backward = widgets.Button(description="backward", button_style="primary")
    press_zero = widgets.Button(description="zero_grad")
    caption = widgets.HTML()
    live = LiveFigure((6.4, 1.6))
    picture = TapePicture(live.fig.subplots())
    live.moving(picture.moving_artists)

    def redraw(state: TapeState) -> None:
        caption.value = f"<b>{state.caption}</b>"
        live.fig.set_size_inches(figsize(state))  # this expression's layers
        picture.update(state)
        live.refresh()

    def rerecord(*_):
        redraw(tape.record(choose.value, x_slider.value, w_slider.value, n_slider.value))

    for control in (choose, x_slider, w_slider, n_slider):
        control.observe(rerecord, "value")
    press_backward.on_click(lambda _: redraw(tape.backward()))
    press_zero.on_click(lambda _: redraw(tape.zero_grad()))
    redraw(tape.state())
    box = widgets.VBox([
        widgets.HBox([choose, n_slider]),
        widgets.HBox([x_slider, w_slider]),
        widgets.HBox([press_backward, press_zero]),
        caption,
        live.image,
    ])  # fmt: skip

    still = TapeRecorder(expression, x, w, n)
    static, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    draw_tape(still.backward(), left)
    draw_tape(still.backward(), right)
    static.suptitle(
        "Backward pressed twice without zero_grad: the leaves' .grad doubles", fontsize=11, y=1.04
    )
    show(box, static)
