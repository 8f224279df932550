"""Every figure can be read without guessing and without full colour vision.

A figure has a title; every axes that plots data names what its x and y axes measure; every
line, patch and collection is drawn in Okabe–Ito (`forge_course.sims.display.PALETTE`), grey,
or a light tint of a palette colour (shading behind text). Drawings with their axes turned off
(a tape, a pipeline, a table) need no axis labels. An axis shared with another panel counts as
labelled when that panel carries the label, as under a column of panels with one x axis.

Every simulation view opens here, in this process, and each figure it shows or displays is
checked. A few chapters run as notebooks with a hook on `FigureCanvasBase.print_figure`, the
one call through which every rendered figure passes: inline plots, `display(fig)` in a widget's
output, and `savefig`, which draws the pictures `forge_course.sims.display.show` gives viewers
without widgets.
"""

import inspect
import json

import IPython.display
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from forge_course.check import errors, execute
from forge_course.data import make_imbalanced
from forge_course.sims import (
    arena,
    arithmetic_timeline,
    bug_detector,
    crash_replay,
    memory_compute,
    module_explorer,
    pipeline,
    pipeline_builder,
    ring_allreduce,
    sampler_view,
    step_through,
    tape,
    train_vs_eval,
    trainer,
)
from forge_course.sims.display import PALETTE
from tests.conftest import add_cells

matplotlib.use("Agg")

# Cheap chapters that draw most kinds of figure: a simulation's picture and its redraws, bar
# charts of categories, shared axes, a grid of panels.
NOTEBOOK_CHAPTERS = ["ch00_training_arithmetic", "ch03_samplers_collation", "ch07_bug_museum"]


def _describe_figure(fig):
    """What a reader needs from ``fig``, as plain data: its title, and for each axes its labels,
    whether it plots data, and the colours it draws with (hex, alpha dropped, transparent left
    out). Self-contained, so that its source also runs inside a notebook's kernel.
    """
    from matplotlib.collections import QuadMesh
    from matplotlib.colors import to_hex, to_rgba

    def label(ax, axis):
        # Its own label, else one on an axes that shares this axis (siblings include ``ax``).
        siblings = getattr(ax, f"get_shared_{axis}_axes")().get_siblings(ax)
        labels = [getattr(a, f"get_{axis}label")() for a in [ax, *siblings]]
        return next((text for text in labels if text), "")

    def colours(ax):
        found = []
        for line in ax.lines:
            found += [line.get_color(), line.get_markerfacecolor(), line.get_markeredgecolor()]
        for patch in ax.patches:
            found += [patch.get_facecolor(), patch.get_edgecolor()]
        for collection in ax.collections:
            # A mesh coloured by a colormap (pcolormesh) is a picture of values, as an image is.
            mesh = isinstance(collection, QuadMesh) and collection.get_array() is not None
            found += [*([] if mesh else collection.get_facecolor()), *collection.get_edgecolor()]
        rgba = [to_rgba(c) for c in found if not (isinstance(c, str) and c.lower() == "none")]
        return sorted({to_hex(c) for c in rgba if c[3] > 0})

    titles = [fig.get_suptitle()]
    titles += [ax.get_title(loc=loc) for ax in fig.axes for loc in ("left", "center", "right")]
    return {
        "title": next((t for t in titles if t), ""),
        "axes": [
            {
                "xlabel": label(ax, "x"),
                "ylabel": label(ax, "y"),
                "data": ax.axison and bool(ax.lines or ax.patches or ax.collections or ax.images),
                "colours": colours(ax),
            }
            for ax in fig.axes
        ],
    }


def _safe_colour(hex_colour: str) -> bool:
    """A palette colour, a grey (white and black too), or a light tint of a palette colour."""
    rgb = np.array(to_rgb(hex_colour))
    if rgb.max() - rgb.min() < 0.02:
        return True
    for colour in PALETTE.values():
        ink = 1 - np.array(to_rgb(colour))  # a tint is white minus a fraction of this
        amount = float(np.dot(1 - rgb, ink) / np.dot(ink, ink))
        if np.abs((1 - rgb) - amount * ink).max() < 0.02 and (amount > 0.97 or amount < 0.4):
            return True
    return False


def problems(record: dict) -> list[str]:
    """What a reader would miss in the figure ``record`` describes, one line each."""
    found = []
    if not record["title"]:
        found.append("no title: give the figure a suptitle, or an axes a title")
    for i, ax in enumerate(record["axes"]):
        for axis in ("x", "y") if ax["data"] else ():
            if not ax[f"{axis}label"]:
                found.append(
                    f"axes {i} plots data but its {axis} axis has no label: say what it "
                    "measures, with its unit (for categories, what they are)"
                )
        unsafe = [c for c in ax["colours"] if not _safe_colour(c)]
        if unsafe:
            found.append(
                f"axes {i} draws in {unsafe}: use PALETTE (Okabe–Ito), a grey, or a light tint "
                "of a palette colour"
            )
    return found


def report(records: list[dict]) -> str:
    """Every problem of every figure, numbered in the order the figures were drawn."""
    lines = []
    for number, record in enumerate(records, start=1):
        lines += [f"figure {number} ({record['title'][:60]!r}): {p}" for p in problems(record)]
    return "\n".join(lines)


# ----------------------------------------------------------------- the check checks something


def test_an_unlabelled_figure_in_default_colours_fails():
    fig, (ax, drawing) = plt.subplots(1, 2)
    ax.plot([1, 2, 3])  # matplotlib's blue, C0: not Okabe–Ito
    drawing.add_patch(plt.Rectangle((0, 0), 1, 1, color=PALETTE["sky"]))
    drawing.axis("off")
    found = problems(_describe_figure(fig))
    plt.close(fig)
    assert len(found) == 4, found
    assert found[0].startswith("no title")
    assert "x axis has no label" in found[1] and "y axis has no label" in found[2]
    assert "#1f77b4" in found[3]


def test_shared_axes_tints_and_greys_pass():
    fig, axes = plt.subplots(2, 1, sharex=True)
    for ax in axes:
        ax.bar([0, 1], [1, 2], color=PALETTE["orange"], edgecolor="black")
        ax.axhspan(0, 1, color="#f6d9c7")  # a light vermillion, behind the bars
        ax.set_ylabel("count")
    axes[0].set_title("Two panels, one x axis")
    axes[1].set_xlabel("bin")
    assert problems(_describe_figure(fig)) == []
    plt.close(fig)


# ---------------------------------------------------------------------------- the simulations


def _arena_run():
    return "one epoch", arena.run_arena({"epochs": 1}, seed=0)


def _replay():
    losses = {step: 1 / step for step in range(1, 11)}
    return {
        "uninterrupted": losses,
        "killed": {s: v for s, v in losses.items() if s < 7},
        "resumed": {s: v for s, v in losses.items() if s >= 5},
        "resumed_from": 5,
    }


_, LABELS = make_imbalanced()
LENGTHS = [5, 1, 4, 1, 3, 9, 2, 6] * 3

# Each view at small settings (given a folder for files), with the module whose `show` it calls.
VIEWS = {
    "arithmetic_timeline": (
        arithmetic_timeline,
        lambda tmp: arithmetic_timeline.arithmetic_timeline_view(),
    ),
    "arena": (
        arena,
        lambda tmp: arena.arena_view(arena.Scoreboard(tmp / "board.json"), shown=[_arena_run()]),
    ),
    "arena, no runs yet": (arena, lambda tmp: arena.arena_view(arena.Scoreboard(tmp / "b.json"))),
    "bug_detector": (
        bug_detector,
        lambda tmp: bug_detector.bug_detector_view({"kept_graph"}, steps=30),
    ),
    "memory_compute": (
        memory_compute,
        lambda tmp: memory_compute.memory_compute_view(4, 2, width=8, batch=4, repeats=1),
    ),
    "module_explorer": (module_explorer, lambda tmp: module_explorer.module_explorer_view("meta")),
    "pipeline": (pipeline, lambda tmp: pipeline.pipeline_view(n=20, batch_size=4, num_workers=2)),
    "pipeline_builder": (pipeline_builder, lambda tmp: pipeline_builder.pipeline_builder_view()),
    "ring": (ring_allreduce, lambda tmp: ring_allreduce.ring_view([[1.0, 2.0, 3.0]] * 3)),
    "ring memory": (ring_allreduce, lambda tmp: ring_allreduce.memory_view(1e9, 8, 3)),
    "sampler": (sampler_view, lambda tmp: sampler_view.sampler_view(LABELS)),
    "padding": (sampler_view, lambda tmp: sampler_view.padding_view(LENGTHS, batch_size=4)),
    "step_through": (
        step_through,
        lambda tmp: step_through.step_through_view(
            W=[[0.5, -0.3], [0.2, 0.8]], b=[0.0, 0.0], x=[1.0, 2.0], t=[1.0, 0.0]
        ),
    ),
    "tape": (tape, lambda tmp: tape.tape_view()),
    "train_vs_eval": (train_vs_eval, lambda tmp: train_vs_eval.train_vs_eval_view(seed=0)),
    "trainer": (trainer, lambda tmp: trainer.trainer_view(warm_up_epochs=1)),
}

# Figures that no view shows.
DRAWINGS = {
    "crash_replay": lambda: crash_replay.draw_replay(_replay(), kill_at=7),
    "shards": lambda: sampler_view.draw_shards(10, 3),
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("name", VIEWS)
def test_a_simulations_pictures_are_readable(name, monkeypatch, tmp_path):
    """The still picture for viewers without widgets, and what the view draws in its output."""
    module, open_view = VIEWS[name]
    records = []

    def record(*objects, **_):
        records.extend(_describe_figure(o) for o in objects if isinstance(o, Figure))

    monkeypatch.setattr(module, "show", lambda widget, fig: record(fig))
    monkeypatch.setattr(IPython.display, "display", record)
    if hasattr(module, "display"):
        monkeypatch.setattr(module, "display", record)
    monkeypatch.setattr(plt, "show", record)
    open_view(tmp_path)
    assert records, "the view showed no figure"
    assert not report(records), report(records)


@pytest.mark.parametrize("name", DRAWINGS)
def test_a_simulations_drawing_is_readable(name):
    record = _describe_figure(DRAWINGS[name]())
    assert not problems(record), report([record])


# ------------------------------------------------------------------------------- the chapters

_HOOK = f"""\
import matplotlib.backend_bases as _backend_bases

{inspect.getsource(_describe_figure)}
_figures_rendered = []
_print_figure = _backend_bases.FigureCanvasBase.print_figure


def _recording_print_figure(self, *args, **kwargs):
    _figures_rendered.append(_describe_figure(self.figure))
    return _print_figure(self, *args, **kwargs)


_backend_bases.FigureCanvasBase.print_figure = _recording_print_figure
"""
_REPORT = "import json as _json\nprint(_json.dumps(_figures_rendered))"


@pytest.mark.slow
@pytest.mark.parametrize("chapter", NOTEBOOK_CHAPTERS)
def test_every_figure_a_chapter_renders_is_readable(chapter, sources):
    path = sources / chapter / f"{chapter}.ipynb"
    add_cells(path, first=_HOOK, last=_REPORT)
    nb = execute(path)
    for cell in (nb.cells[0], nb.cells[-1]):
        assert not errors(cell), errors(cell)[0]["evalue"]
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o["output_type"] == "stream")
    records = json.loads(text)
    assert records, f"{chapter} rendered no figure"
    assert not report(records), report(records)
