"""Pipeline builder: the production loop as marked additions to chapter 04's plain loop.

The engine, `build_loop`, takes a set of components (checkpointing, early stopping, clipping,
logging, seeding, progress bar) and returns the loop's code, line by line, with each line
tagged: a line of the plain loop, a line a component *adds*, or a plain-loop line a component
*changes*. It is pure and cheap, so a view can rebuild it on every click. `draw_loop` renders a
`LoopCode` as a matplotlib figure (the static fallback), `loop_html` as HTML for the widget, and
`pipeline_builder_view` wires one checkbox per component to the HTML.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import matplotlib.pyplot as plt

from forge_course.sims.display import PALETTE, show

COMPONENTS = (
    "seeding",
    "checkpointing",
    "early stopping",
    "clipping",
    "logging",
    "progress bar",
)
COLOURS = {
    "seeding": PALETTE["purple"],
    "checkpointing": PALETTE["blue"],
    "early stopping": PALETTE["vermillion"],
    "clipping": PALETTE["orange"],
    "logging": PALETTE["green"],
    "progress bar": PALETTE["sky"],
}

# Each entry: (components that add the line, or () for the plain loop; the line; for a plain-loop
# line, {component: replacement}). A line added by several components appears once if any is on.
_TEMPLATE: list[tuple[tuple[str, ...], str, dict[str, str]]] = [
    (("seeding",), "seed_everything(SEED)", {}),
    ((), "model = model.to(device)", {}),
    (("logging",), "writer = SummaryWriter(log_dir)", {}),
    (("early stopping",), "stopper = EarlyStopping(patience=PATIENCE)", {}),
    (("checkpointing", "logging"), "start_epoch, step = 0, 0", {}),
    (("checkpointing",), "if (last := latest_checkpoint(folder)) is not None:", {}),
    (
        ("checkpointing",),
        "    counters = load_checkpoint(last, model, optimizer, scheduler, sampler=sampler)",
        {},
    ),  # fmt: skip
    (("checkpointing",), '    start_epoch, step = counters["epoch"], counters["step"]', {}),
    (
        (),
        "for epoch in range(EPOCHS):",
        {"checkpointing": "for epoch in range(start_epoch, EPOCHS):"},
    ),  # fmt: skip
    (("checkpointing",), "    sampler.set_epoch(epoch)", {}),
    ((), "    model.train()", {}),
    (("logging",), "    total, count = 0.0, 0", {}),
    (
        (),
        "    for x, y in loader:",
        {"progress bar": '    for x, y in tqdm(loader, desc=f"epoch {epoch}"):'},
    ),  # fmt: skip
    ((), "        x, y = x.to(device), y.to(device)", {}),
    ((), "        optimizer.zero_grad()", {}),
    ((), "        loss = loss_fn(model(x), y)", {}),
    ((), "        loss.backward()", {}),
    (("clipping",), "        norm = clip_grad_norm_(model.parameters(), MAX_NORM)", {}),
    ((), "        optimizer.step()", {}),
    (("checkpointing", "logging"), "        step += 1", {}),
    (("logging",), "        total, count = total + loss.item() * len(x), count + len(x)", {}),
    (("checkpointing",), "        if step % EVERY == 0:", {}),
    (
        ("checkpointing",),
        "            save_checkpoint(checkpoint_path(folder, step), model, optimizer, scheduler,",
        {},
    ),  # fmt: skip
    (
        ("checkpointing",),
        "                            sampler=sampler, epoch=epoch, step=step)",
        {},
    ),  # fmt: skip
    ((), "    scheduler.step()", {}),
    (("logging",), '    writer.add_scalar("loss/train", total / count, epoch)', {}),
    (("early stopping",), "    if stopper.step(evaluate(model, val_loader)):", {}),
    (("early stopping",), "        break", {}),
]


@dataclass(frozen=True)
class LoopCode:
    """The assembled loop.

    Attributes:
        lines: the code, one string per line.
        added: indices of the lines a component added.
        changed: indices of plain-loop lines a component rewrote.
        owner: for each line, the component that added or changed it ("" for the plain loop).
    """

    lines: tuple[str, ...]
    added: frozenset[int]
    changed: frozenset[int]
    owner: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def build_loop(components: set[str] | frozenset[str] | tuple[str, ...] = ()) -> LoopCode:
    """Assemble the loop with the given components on.

    Args:
        components: any of `COMPONENTS`; the empty set gives chapter 04's plain loop.

    Raises:
        ValueError: naming any component that does not exist.
    """
    chosen = set(components)
    unknown = chosen - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown component(s) {sorted(unknown)}; choose from {COMPONENTS}")
    lines, added, changed, owner = [], set(), set(), []
    for adders, line, replacements in _TEMPLATE:
        if adders:
            on = [c for c in adders if c in chosen]
            if not on:
                continue
            added.add(len(lines))
            owner.append(on[0])
            lines.append(line)
            continue
        rewrite = next((c for c in replacements if c in chosen), None)
        if rewrite:
            changed.add(len(lines))
            owner.append(rewrite)
            lines.append(replacements[rewrite])
        else:
            owner.append("")
            lines.append(line)
    return LoopCode(tuple(lines), frozenset(added), frozenset(changed), tuple(owner))


def loop_html(code: LoopCode) -> str:
    """The loop as an HTML ``<pre>``: added lines marked ``+``, changed ones ``~``, coloured."""
    rows = []
    for i, (line, who) in enumerate(zip(code.lines, code.owner)):
        mark = "+" if i in code.added else "~" if i in code.changed else " "
        style = f"background:{COLOURS[who]}33;" if who else ""
        note = f"  # {who}" if who else ""
        rows.append(f'<span style="{style}">{mark} {html.escape(line)}{html.escape(note)}</span>')
    count = len(code.added) + len(code.changed)
    head = f"<b>{len(code.lines)} lines, {count} added or changed by the components</b>"
    return f'{head}<pre style="font-size:12px;line-height:1.35">' + "\n".join(rows) + "</pre>"


def draw_loop(code: LoopCode, title: str = ""):
    """A figure of the loop's code, added and changed lines shaded in their component's colour."""
    height = 0.2 * len(code.lines) + 0.9
    fig, ax = plt.subplots(figsize=(10, height))
    ax.set_xlim(0, 1)
    ax.set_ylim(len(code.lines), -1)
    ax.axis("off")
    for i, (line, who) in enumerate(zip(code.lines, code.owner)):
        mark = "+" if i in code.added else "~" if i in code.changed else " "
        if who:
            ax.axhspan(i - 0.5, i + 0.5, color=COLOURS[who], alpha=0.25, lw=0)
        ax.text(0.0, i, f"{mark} {line}", family="monospace", fontsize=8, va="center")
    shown = [c for c in COMPONENTS if c in set(code.owner)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[c], alpha=0.5) for c in shown]
    if handles:
        ax.legend(handles, shown, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    ax.set_title(title or "The production loop: + added, ~ changed, unmarked = chapter 04's loop")
    fig.tight_layout()
    return fig


def pipeline_builder_view(initial: tuple[str, ...] = COMPONENTS) -> None:
    """One checkbox per component over the assembled loop; a static figure for plain viewers."""
    import ipywidgets as widgets

    boxes = {
        c: widgets.Checkbox(value=c in initial, description=c, indent=False) for c in COMPONENTS
    }
    out = widgets.HTML()

    def redraw(*_):
        out.value = loop_html(build_loop({c for c, box in boxes.items() if box.value}))

    for box in boxes.values():
        box.observe(redraw, names="value")
    redraw()
    controls = widgets.HBox(list(boxes.values()))
    show(widgets.VBox([controls, out]), draw_loop(build_loop(initial)))
