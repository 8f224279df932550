"""The pipeline builder's engine: the plain loop, marked additions, and a fast click."""

import itertools

import pytest

from forge_course.sims.pipeline_builder import (
    COMPONENTS,
    build_loop,
    draw_loop,
    loop_html,
)

PLAIN = [
    "model = model.to(device)",
    "for epoch in range(EPOCHS):",
    "    model.train()",
    "    for x, y in loader:",
    "        x, y = x.to(device), y.to(device)",
    "        optimizer.zero_grad()",
    "        loss = loss_fn(model(x), y)",
    "        loss.backward()",
    "        optimizer.step()",
    "    scheduler.step()",
]


def test_no_component_gives_chapter_04s_loop():
    code = build_loop()
    assert list(code.lines) == PLAIN
    assert not code.added and not code.changed
    assert set(code.owner) == {""}


@pytest.mark.parametrize(
    "chosen",
    [set(c) for n in range(len(COMPONENTS) + 1) for c in itertools.combinations(COMPONENTS, n)],
)
def test_unmarked_lines_are_the_plain_loop_in_order(chosen):
    code = build_loop(chosen)
    kept = [line for i, line in enumerate(code.lines) if i not in code.added | code.changed]
    assert kept == [line for line in PLAIN if line in kept]
    assert len(kept) + len(code.changed) == len(PLAIN)
    assert {code.owner[i] for i in code.added | code.changed} <= chosen
    # What the components add is the same whatever else is on, and compiles as Python.
    compile(code.text, "<loop>", "exec")


def test_each_component_marks_its_lines():
    clipping = build_loop({"clipping"})
    assert [clipping.lines[i].strip() for i in clipping.added] == [
        "norm = clip_grad_norm_(model.parameters(), MAX_NORM)"
    ]
    bar = build_loop({"progress bar"})
    assert not bar.added
    assert "tqdm(loader" in bar.lines[next(iter(bar.changed))]
    ckpt = build_loop({"checkpointing"})
    assert any("save_checkpoint" in ckpt.lines[i] for i in ckpt.added)
    assert any("start_epoch" in ckpt.lines[i] for i in ckpt.changed)
    # The step counter is shared: it appears once when both need it.
    both = build_loop({"checkpointing", "logging"})
    assert sum("step += 1" in line for line in both.lines) == 1


def test_the_clipping_line_sits_between_backward_and_step():
    lines = [line.strip() for line in build_loop({"clipping"}).lines]
    clip = next(i for i, line in enumerate(lines) if "clip_grad_norm_" in line)
    assert lines[clip - 1] == "loss.backward()" and lines[clip + 1] == "optimizer.step()"


def test_unknown_component_is_named():
    with pytest.raises(ValueError, match="warp drive"):
        build_loop({"warp drive"})


def test_html_marks_and_escapes():
    html = loop_html(build_loop(set(COMPONENTS)))
    assert html.count("+ ") >= len(build_loop(set(COMPONENTS)).added)
    assert "&quot;" in html or "&#x27;" in html  # quotes inside the code are escaped


def test_the_figure_draws():
    fig = draw_loop(build_loop(set(COMPONENTS)))
    assert fig.axes[0].get_title()
