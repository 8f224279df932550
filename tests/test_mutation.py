"""The mutation tool itself: the mutants it makes, and verdicts on a deliberately weak check."""

import pytest

from mutation import report
from mutation.campaign import Chapter, run_chapter
from mutation.operators import mutants

TRAIN_STEP = """def train_step(model, optimizer, loss_fn, x, y):
    ### BEGIN SOLUTION
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
    ### END SOLUTION
"""


def changes(cell: str) -> set[tuple[str, str, str]]:
    return {(m.operator, m.before, m.after) for m in mutants("ex", cell)}


def test_a_training_step_gets_the_learners_mistakes():
    found = changes(TRAIN_STEP)
    assert ("delete_statement", "optimizer.zero_grad()", "") in found
    assert ("drop_method", "return loss.item()", "return loss") in found
    assert ("swap_statements", "loss.backward()\noptimizer.step()",
            "optimizer.step()\nloss.backward()") in found  # fmt: skip
    moved_last = (
        "move_call",
        "optimizer.zero_grad()\nloss = loss_fn(model(x), y)\nloss.backward()\noptimizer.step()",
        "loss = loss_fn(model(x), y)\nloss.backward()\noptimizer.step()\noptimizer.zero_grad()",
    )
    assert moved_last in found


def test_only_the_solution_is_changed_and_the_markers_stay():
    for m in mutants("ex", TRAIN_STEP):
        lines = m.source.splitlines()
        assert lines[0] == "def train_step(model, optimizer, loss_fn, x, y):"
        assert lines[1].strip() == "### BEGIN SOLUTION", m.key
        assert lines[-1].strip() == "### END SOLUTION", m.key


def test_mutants_are_the_same_every_time_and_keep_their_keys_when_other_lines_change():
    keys = [m.key for m in mutants("ex", TRAIN_STEP)]
    assert keys == [m.key for m in mutants("ex", TRAIN_STEP)]
    assert len(set(keys)) == len(keys)
    edited = TRAIN_STEP.replace("    return loss.item()", "    y = None\n    return loss.item()")
    deleted = lambda cell: {m.key for m in mutants("ex", cell) if m.before == "optimizer.step()"}
    assert len(deleted(TRAIN_STEP)) == 1
    assert deleted(TRAIN_STEP) == deleted(edited)


def test_dimensions_reductions_loops_and_in_place_ops():
    cell = """def f(x, n):
    ### BEGIN SOLUTION
    total = 0
    for i in range(n):
        total += x.mean(dim=1)
    with torch.no_grad():
        x.add_(total)
    return total
    ### END SOLUTION
"""
    found = changes(cell)
    assert ("swap_reduction", "total += x.mean(dim=1)", "total += x.sum(dim=1)") in found
    assert ("change_dimension", "total += x.mean(dim=1)", "total += x.mean(dim=0)") in found
    assert ("off_by_one", "for i in range(n):", "for i in range(n - 1):") in found
    assert ("toggle_in_place", "total += x.mean(dim=1)", "total = total + x.mean(dim=1)") in found
    assert ("toggle_in_place", "x.add_(total)", "x.add(total)") in found
    assert ("unwrap_with", "with torch.no_grad():\nx.add_(total)", "x.add_(total)") in found


WEAK = Chapter(
    id="ch99",
    name="ch99_weak",
    settings="import math\nSTART = 0",
    answers={
        "ch99_add_one": "def add_one(x):\n    ### BEGIN SOLUTION\n    return x + 1\n"
        "    ### END SOLUTION\n",
        "ch99_count": "def count(n):\n    ### BEGIN SOLUTION\n    i = START\n    while i < n:\n"
        "        i += 1\n    return i\n    ### END SOLUTION\n",
    },
    tests={
        # Deliberately weak: any increasing answer passes.
        "ch99_add_one": "assert add_one(0) > 0",
        "ch99_count": "assert count(3) == 3",
    },
)


@pytest.mark.slow
def test_a_weak_check_lets_a_known_mutant_survive_and_a_loop_times_out():
    found = {e: mutants(e, cell) for e, cell in WEAK.answers.items()}
    result = run_chapter(WEAK, found, jobs=2, gpu=False, limit_floor=3, limit_factor=1)
    by_change = {
        (e, m["before"], m["after"]): m["status"]
        for e, data in result["exercises"].items()
        for m in data["mutants"]
    }
    assert result["exercises"]["ch99_add_one"]["baseline"]["status"] == "survived"
    assert by_change["ch99_add_one", "return x + 1", "return x + 2"] == "survived"
    assert by_change["ch99_add_one", "return x + 1", "return x - 1"] == "mistake" or (
        by_change["ch99_add_one", "return x + 1", "return x - 1"] == "error"
    )
    assert by_change["ch99_count", "i += 1", "i -= 1"] == "timeout"
    assert by_change["ch99_count", "i += 1", "i = 1"] == "timeout"

    s = report.score(result["exercises"]["ch99_add_one"], equivalent={})
    assert s["survived"] >= 1 and s["score"] < 1
    survivor = next(m["key"] for m in s["survivors"] if m["after"] == "return x + 2")
    reviewed = report.score(result["exercises"]["ch99_add_one"], equivalent={survivor: "why"})
    assert reviewed["equivalent"] == 1 and reviewed["survived"] == s["survived"] - 1
