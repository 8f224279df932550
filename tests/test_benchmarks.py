"""The benchmark script's cheap sections run and report every figure against its budget."""

import importlib.util

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("bench", REPO / "benchmarks" / "run.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_simulation_rows_state_latency_and_budget():
    rows = bench.bench_simulations(repeats=3)
    assert len(rows) == 2 + len(bench.simulation_cases())
    assert all(("met" in r or "missed" in r) for r in rows[2:])


def test_claims_are_measured_not_quoted():
    rows = bench.bench_claims(repeats=1)
    assert "MB with grad" in rows[2] and "0.0 MB under `no_grad`" in rows[2]
    assert "ms vs" in rows[3] and "ms vs" in rows[4]
