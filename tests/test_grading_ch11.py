"""Chapter 11's checks: correct answers in any style pass; each typical mistake is named."""

import os
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from forge_course.grading import Mistake, ch11
from forge_course.reference import collectives
from forge_course.reference.ddp import GLOBAL_BATCH, SEED, make_dataset, make_model, train


def numpy_ring(buffers):
    n = len(buffers)
    parts = [np.array_split(np.array(b, dtype=np.float64), n) for b in buffers]
    sends = []
    for step in range(2 * n - 2):
        gather = step >= n - 1
        s = step - (n - 1) if gather else step
        triples = [(r, (r + 1) % n, (r + gather - s) % n) for r in range(n)]
        snapshot = [parts[src][k].copy() for src, _, k in triples]
        for (_, dst, k), data in zip(triples, snapshot):
            parts[dst][k] = data if gather else parts[dst][k] + data
        sends.append(triples)
    return tuple(np.concatenate(p) for p in parts), tuple(sends)


def in_place_ring(buffers):
    results, sends = collectives.ring_allreduce.__wrapped__(buffers)
    buffers[0][0] = 1e9  # the check hands over a copy: changing it must not matter
    return results, sends


def sum_in_other_order(buffers):
    # The right sends, but each worker sums everything itself: bits differ from the ring's.
    _, sends = collectives.ring_allreduce.__wrapped__(buffers)
    return [[sum(reversed(col)) for col in zip(*buffers)] for _ in buffers], sends


@pytest.mark.parametrize("answer", [numpy_ring, in_place_ring])
def test_ring_accepts_correct_answers_in_any_style(answer):
    ch11.check_ring_allreduce(answer)
    ch11.check_ring_allreduce(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch11.RING_MISTAKES, ids=range(3))
def test_ring_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch11.check_ring_allreduce(wrong)
    assert message in str(caught.value)


def test_ring_bits_depend_on_the_order_of_additions():
    ch11.check_ring_allreduce(sum_in_other_order)  # ordinary values: within tolerance
    with pytest.raises(Mistake, match="results"):
        ch11.check_ring_allreduce(sum_in_other_order, thorough=True)


def test_ring_must_return_a_pair():
    with pytest.raises(Mistake, match=r"should return a pair `\(results, sends\)`"):
        ch11.check_ring_allreduce(lambda buffers: [sum(c) for c in zip(*buffers)])


def test_ring_refuses_the_reference():
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch11.check_ring_allreduce(collectives.ring_allreduce)


def ddp_with_own_loop(rank, world_size, port, out_dir):
    dist.init_process_group(
        backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world_size, rank=rank
    )
    try:
        data = make_dataset()
        sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=SEED)
        batches = DataLoader(data, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
        net = DistributedDataParallel(make_model())
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        for inputs, targets in batches:
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(inputs), targets).backward()
            opt.step()
        torch.save(net.module.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_worker_accepts_a_correct_answer_with_its_own_loop():
    ch11.check_ddp_worker(ddp_with_own_loop)
    ch11.check_ddp_worker(ddp_with_own_loop, thorough=True)


@pytest.mark.slow
@pytest.mark.parametrize("message,wrong", ch11.DDP_MISTAKES, ids=range(4))
def test_ddp_worker_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch11.check_ddp_worker(wrong)
    assert message in str(caught.value)


def fixed_batch_of_eight(rank, world_size, port, out_dir):
    # Right for 2 ranks only: the hidden test's 4 ranks and 1 rank show it.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)  # fmt: skip
    try:
        dataset = make_dataset()
        sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED)
        model = DistributedDataParallel(make_model())
        train(model, DataLoader(dataset, batch_size=8, sampler=sampler), torch.device("cpu"))
        torch.save(model.module.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_worker_hidden_cases_catch_a_hard_coded_world_size():
    ch11.check_ddp_worker(fixed_batch_of_eight)
    with pytest.raises(Mistake, match="GLOBAL_BATCH // world_size"):
        ch11.check_ddp_worker(fixed_batch_of_eight, thorough=True)


def joins_a_bigger_group(rank, world_size, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size + 1)  # fmt: skip


def rank_one_raises(rank, world_size, port, out_dir):
    if rank == 1:
        raise ValueError("rank one gives up")
    collectives.ddp_rank_worker.__wrapped__(rank, world_size, port, out_dir)


def saves_nothing(rank, world_size, port, out_dir):
    pass


@pytest.mark.slow
def test_ddp_worker_failures_end_in_bounded_time_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(ch11, "DDP_TIMEOUT_S", 5)
    start = time.monotonic()
    with pytest.raises(Mistake, match="did not finish within 5 s"):
        ch11.check_ddp_worker(joins_a_bigger_group)
    assert time.monotonic() - start < 15
    with pytest.raises(Mistake, match="rank 1 raised .*ValueError: rank one gives up"):
        ch11.check_ddp_worker(rank_one_raises)
    with pytest.raises(Mistake, match=r"\['rank0.pt', 'rank1.pt'\] are missing"):
        ch11.check_ddp_worker(saves_nothing)
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch11.check_ddp_worker(collectives.ddp_rank_worker)
