"""Tests for forge_course.reference.collectives: the ring against real gloo, traffic, memory."""

import random
import time

import pytest
import torch

from forge_course.reference import collectives
from forge_course.reference.collectives import (
    chunk_bounds,
    gloo_all_reduce,
    memory_per_rank,
    ring_allreduce,
    ring_allreduce_trace,
    ring_traffic,
    run_ranks,
)


def test_chunks_cut_like_array_split():
    import numpy as np

    for length in range(1, 12):
        for n in range(1, 8):
            sizes = [len(c) for c in np.array_split(np.arange(length), n)]
            bounds = chunk_bounds(length, n)
            assert [b - a for a, b in zip(bounds, bounds[1:])] == sizes


@pytest.mark.parametrize("n", range(2, 8))
def test_ring_equals_the_sum_on_every_worker(n):
    rng = random.Random(n)
    buffers = [[rng.uniform(-5, 5) for _ in range(2 * n + 1)] for _ in range(n)]
    results, sends = ring_allreduce(buffers)
    want = torch.tensor(buffers, dtype=torch.float64).sum(0)
    for worker in results:
        torch.testing.assert_close(torch.tensor(worker, dtype=torch.float64), want)
        assert worker == results[0]  # all-gather copies: bit for bit the same everywhere
    assert len(sends) == 2 * (n - 1)
    for step in sends:
        assert [(src, dst) for src, dst, _ in step] == [(r, (r + 1) % n) for r in range(n)]
        assert sorted(chunk for _, _, chunk in step) == list(range(n))


@pytest.mark.parametrize("n,size", [(4, 100), (2, 60), (8, 64), (5, 7)])
def test_traffic_formula_counts_what_the_ring_sends(n, size):
    # Count the elements each worker actually sends in the simulation.
    states = ring_allreduce_trace([[1.0] * size for _ in range(n)])
    bounds = chunk_bounds(size, n)
    sent = [0] * n
    for state in states[1:]:
        for src, _, chunk in state["sends"]:
            sent[src] += bounds[chunk + 1] - bounds[chunk]
    steps, per_worker = ring_traffic(n, size)
    assert steps == len(states) - 1
    assert sum(sent) / n == pytest.approx(per_worker)
    assert ring_traffic(4, 100e6) == (6, 150e6)


def test_memory_per_rank_for_one_billion_parameters_on_eight_ranks():
    gb = {s: {k: v / 1e9 for k, v in memory_per_rank(1e9, 8, s).items()} for s in range(4)}
    assert gb[0] == {"params": 4.0, "grads": 4.0, "optimizer": 8.0, "total": 16.0}
    assert gb[1] == {"params": 4.0, "grads": 4.0, "optimizer": 1.0, "total": 9.0}
    assert gb[2] == {"params": 4.0, "grads": 0.5, "optimizer": 1.0, "total": 5.5}
    assert gb[3] == {"params": 0.5, "grads": 0.5, "optimizer": 1.0, "total": 2.0}
    with pytest.raises(ValueError):
        memory_per_rank(1e9, 8, 4)


@pytest.mark.slow
def test_ring_matches_torch_distributed_all_reduce_over_two_gloo_processes():
    buffers = [[0.1, -2.5, 3.25, 1e-3, 7.0], [4.0, 0.2, -1.0, 2e-3, -7.0]]
    start = time.monotonic()
    real = gloo_all_reduce(buffers, timeout_s=60)
    assert time.monotonic() - start < 60
    simulated, _ = ring_allreduce(buffers)
    assert real == simulated  # two workers: one addition per element, bit for bit


def _sleeps_forever(rank):
    time.sleep(3600)


def _rank_one_fails(rank):
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    time.sleep(3600)


def test_run_ranks_stops_hanging_and_failing_ranks_in_bounded_time():
    start = time.monotonic()
    hung = run_ranks(_sleeps_forever, 2, timeout_s=2)
    assert hung["timed_out"] and not hung["ok"] and time.monotonic() - start < 10
    failed = run_ranks(_rank_one_fails, 2, timeout_s=30)
    assert not failed["ok"] and "rank one fails on purpose" in failed["errors"][1]
    assert failed["seconds"] < 20


@pytest.mark.slow
def test_run_ranks_spawns_where_it_cannot_fork(monkeypatch):
    """macOS and Windows: each rank a spawned interpreter, the ring's check the same."""
    monkeypatch.setattr(collectives, "FORK_RANKS", False)
    hung = run_ranks(_sleeps_forever, 2, timeout_s=5)
    assert hung["timed_out"] and not hung["ok"]
    failed = run_ranks(_rank_one_fails, 2, timeout_s=60)
    assert not failed["ok"] and "rank one fails on purpose" in failed["errors"][1]
    assert gloo_all_reduce([[1.0, 2.0], [10.0, 20.0]]) == [[11.0, 22.0], [11.0, 22.0]]
