"""The arena engine, headless: scoring, the search space, the budget, and the scoreboard file."""

import json
import time

import pytest

from forge_course.sims import arena

# The chapter's solution to the 50-step challenge: the tests keep it honest.
FULL_BATCH_ADAM = {"optimizer": "adam", "lr": 0.05, "batch_size": 300, "epochs": 50}


def test_steps_to_target_is_the_first_step_at_or_above_it():
    result = arena.run_arena({"epochs": 3}, seed=1)
    curve = result.curve
    assert len(curve) == result.total_steps == 30
    assert result.final_accuracy == curve[-1] and result.best_accuracy == max(curve)
    for target in (curve[0], sorted(curve)[len(curve) // 2], max(curve)):
        reached = arena.run_arena({"epochs": 3}, seed=1, target=target).steps_to_target
        assert curve[reached - 1] >= target and all(a < target for a in curve[: reached - 1])
    assert arena.run_arena({"epochs": 3}, seed=1, target=1.01).steps_to_target is None


def test_a_whole_20_epoch_run_reports_its_steps_and_time():
    # How fast it runs is measured by `make bench` (benchmarks/RESULTS.md), not asserted here.
    start = time.perf_counter()
    result = arena.run_arena({"epochs": 20}, seed=0)
    assert result.total_steps == 200
    assert 0 < result.wall_time_s <= time.perf_counter() - start


def test_progress_is_reported_after_every_step():
    seen = []
    arena.run_arena({"epochs": 1, "batch_size": 100}, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 3), (2, 3), (3, 3)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_full_batch_adam_reaches_90_percent_within_the_budget(seed):
    assert arena.config_problems(FULL_BATCH_ADAM, budget=arena.BUDGET_STEPS) == []
    result = arena.run_arena(FULL_BATCH_ADAM, seed=seed)
    assert result.steps_to_target is not None and result.steps_to_target <= 45


def test_the_default_run_does_not_reach_the_target_within_the_budget():
    result = arena.run_arena({"epochs": 5}, seed=0)
    assert result.total_steps == 50 and result.steps_to_target is None


def test_planned_steps_count_the_short_last_batch():
    assert arena.planned_steps({}) == 200
    assert arena.planned_steps({"batch_size": 300, "epochs": 50}) == 50
    assert arena.planned_steps({"batch_size": 299, "epochs": 25}) == 50
    assert arena.budget_epochs(32) == 5 and arena.budget_epochs(300) == 50


@pytest.mark.parametrize(
    "config,phrase",
    [
        ([("lr", 0.1)], "should be a dict"),
        ({"seed": 3}, "remove 'seed'"),
        ({"learning_rate": 0.1}, "'learning_rate' is not a setting"),
        ({"optimizer": "rmsprop"}, "optimizer must be one of"),
        ({"scheduler": "linear"}, "scheduler must be one of"),
        ({"lr": 2.0}, "lr must be between 0.0001 and 1, not 2"),
        ({"lr": "0.1"}, "lr must be a number"),
        ({"batch_size": 400}, "batch_size must be between 8 and 300"),
        ({"epochs": 2.0}, "epochs must be a whole number"),
        ({"dropout": True}, "dropout must be a number"),
        ({"epochs": 6}, "the run plans 6 epochs × 10 steps = 60 steps, over the budget of 50"),
    ],
)
def test_config_problems_name_each_problem(config, phrase):
    problems = arena.config_problems(config, budget=50)
    assert any(phrase in p for p in problems), problems


def test_without_a_budget_any_length_is_allowed():
    assert arena.config_problems({"epochs": 200}) == []


def _result(steps, final, lr=0.01, seed=0):
    config = {**arena.DEFAULT_CONFIG, "lr": lr}
    del config["seed"]
    return arena.ArenaResult(config, seed, steps, final, final, 50, 0.1, "cpu", [final])


def test_the_scoreboard_ranks_runs_and_keeps_them_in_a_file(tmp_path):
    board = arena.Scoreboard(tmp_path / "board.json")
    assert board.entries() == []
    assert board.record(_result(None, 0.8, lr=0.1), "never") == 1
    assert board.record(_result(30, 0.95, lr=0.2), "thirty") == 1
    assert board.record(_result(20, 0.91, lr=0.3), "twenty") == 1
    assert board.record(_result(30, 0.97, lr=0.4), "thirty, better") == 2
    names = [e["name"] for e in arena.Scoreboard(tmp_path / "board.json").entries()]
    assert names == ["twenty", "thirty, better", "thirty", "never"]
    data = json.loads((tmp_path / "board.json").read_text())
    assert data["target"] == 0.9 and "curve" not in data["runs"][0]
    table = board.table()
    assert "twenty" in table and "never" in table.splitlines()[-1]


def test_recording_the_same_config_and_seed_replaces_its_entry(tmp_path):
    board = arena.Scoreboard(tmp_path / "board.json")
    board.record(_result(20, 0.9), "first name")
    board.record(_result(20, 0.9), "second name")
    board.record(_result(20, 0.9, seed=1), "other seed")
    assert [e["name"] for e in board.entries()] == ["second name", "other seed"]


def test_a_failed_save_leaves_the_old_file_whole_and_no_debris(tmp_path, monkeypatch):
    path = tmp_path / "board.json"
    board = arena.Scoreboard(path)
    board.record(_result(20, 0.9), "kept")
    before = path.read_bytes()

    def broken_dump(data, f, **kwargs):
        f.write('{"runs": [')  # half a file, then the failure
        raise OSError("disk full")

    monkeypatch.setattr(arena.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        board.record(_result(10, 0.95), "lost")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["board.json"]


def test_a_file_that_is_not_a_scoreboard_is_reported(tmp_path):
    path = tmp_path / "board.json"
    path.write_text("not json")
    with pytest.raises(ValueError, match="not an arena scoreboard"):
        arena.Scoreboard(path).entries()


def test_the_scoreboard_creates_its_folder(tmp_path):
    board = arena.Scoreboard(tmp_path / "new" / "board.json")
    board.record(_result(20, 0.9), "first")
    assert board.path.exists()
