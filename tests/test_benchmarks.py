"""The benchmark script covers every simulation engine, and its cheap sections run and report
every figure against its budget."""

import importlib.util

import torch

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("bench", REPO / "benchmarks" / "run.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

ENGINES = {path.stem for path in (REPO / "forge_course" / "sims").glob("*.py")} - {
    "__init__",
    "display",  # the views' shared helpers, not engines
    "pasted_text",
    "outlines",
}


def test_every_simulation_engine_has_a_benchmark_row():
    covered = {case.engine for case in bench.simulation_cases(torch.device("cpu"))}
    assert ENGINES - covered == set(), (
        f"no benchmark for {sorted(ENGINES - covered)}: add one update at the chapter's "
        "defaults to simulation_cases() in benchmarks/run.py"
    )
    assert covered - ENGINES == set(), f"rows for engines that do not exist: {covered - ENGINES}"


def test_simulation_rows_state_latency_and_budget():
    # The crash replay starts three processes (seconds); tests/test_sims_crash_replay.py runs it.
    cases = [c for c in bench.simulation_cases(torch.device("cpu")) if c.engine != "crash_replay"]
    rows = bench.bench_simulations(repeats=1, cases=cases)
    table = rows[rows.index("| --- | --- | --- | --- | --- | --- |") + 1 :]
    assert [row.split(" | ")[1] for row in table] == [case.update for case in cases]
    assert all(row.endswith(("| met |", "| **missed** |")) for row in table), table


def test_claims_are_measured_not_quoted():
    rows = bench.bench_claims(repeats=1, with_compile=False)
    assert f"on {bench.pick_device()} (" in rows[0], "the section names its device first"

    def claim(word):
        return next(row for row in rows if word in row.split(" | ")[0])

    saved = claim("bytes saved")
    assert "under `no_grad` 0," in saved and "under `inference_mode` 0 |" in saved
    assert "train mode 0," not in saved, "with grad on, the forward must save something"
    for batch in (64, 1024):  # chapter 10's two batch sizes
        assert "× the float32 speed" in claim(f"batch {batch}, float32")
    # Chapter 10's exact counts: 16 blocks keep 2,359,296 bytes, k = 4 at worst 638,976 (27%).
    checkpoint = claim("checkpointing")
    assert "2,359,296 bytes plain" in checkpoint and "at worst 638,976" in checkpoint
    assert "not measured with `--quick`" in claim("torch.compile")


redraws_spec = importlib.util.spec_from_file_location("redraws", REPO / "benchmarks" / "redraws.py")
redraws = importlib.util.module_from_spec(redraws_spec)
redraws_spec.loader.exec_module(redraws)


def test_every_slider_view_has_a_redraw_row():
    # Every module with a view that redraws a figure per event: the pipeline builder shows
    # HTML, and the arena redraws after a training run of seconds, not a slider.
    drawn = {
        path.stem
        for path in (REPO / "forge_course" / "sims").glob("*.py")
        if "_view(" in path.read_text() and path.stem not in {"pipeline_builder", "arena"}
    }
    covered = {view.name.split(" ")[0] for view in redraws.views(torch.device("cpu"))}
    assert drawn - covered == set(), f"no redraw sweep for {sorted(drawn - covered)}"


def test_redraw_rows_give_both_paths_at_the_95th_percentile_with_a_verdict():
    rows = redraws.bench_redraws(rounds=1, only=["step_through", "ring_allreduce (ZeRO)"])
    table = rows[rows.index("| --- | --- | --- | --- | --- | --- | --- |") + 1 : -2]
    assert [row.split(" | ")[0] for row in table] == ["| step_through", "| ring_allreduce (ZeRO)"]
    for row in table:
        cells = row.strip("| ").split(" | ")
        assert cells[-1] in {"≤ 50 ms", "≤ 100 ms", "**over 100 ms**"}, row
        assert cells[-2].endswith("×"), row
    assert rows[-1].startswith("Every view at most 100 ms at p95: "), rows[-1]


def test_the_95th_percentile_lies_between_the_nearest_samples():
    assert redraws.p95([float(v) for v in range(1, 21)]) == 19.05  # 0.95 of the way: 19 → 20
    assert redraws.p95([7.0]) == 7.0
