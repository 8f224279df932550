"""Chapter 11's checks: correct answers in any style pass; each typical mistake is named."""

import dataclasses
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import forge_course
from forge_course import ports
from forge_course.grader.assignment import INSTALL_TAG
from forge_course.grading import Mistake, ch11
from forge_course.observe import ch11 as observe
from forge_course.reference import collectives, ddp
from forge_course.reference.ddp import GLOBAL_BATCH, SEED, make_dataset, make_model, train
from forge_course.release import source_notebook
from tests.answers import ch11 as answers
from tests.conftest import REPO
from tests.helpers.copied import copied

CHAPTER = REPO / "solutions" / "ch11_distributed.py"


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
    # Right results and sends, but it works in the caller's lists: they end up holding the sums.
    n = len(buffers)
    bounds = collectives.chunk_bounds(len(buffers[0]), n)
    sends = []
    for step in range(2 * n - 2):
        gather = step >= n - 1
        s = step - (n - 1) if gather else step
        triples = [(r, (r + 1) % n, (r + gather - s) % n) for r in range(n)]
        moving = [buffers[src][bounds[k] : bounds[k + 1]] for src, _, k in triples]
        for (_, dst, k), values in zip(triples, moving):
            mine = buffers[dst][bounds[k] : bounds[k + 1]]
            new = values if gather else [a + b for a, b in zip(mine, values)]
            buffers[dst][bounds[k] : bounds[k + 1]] = new
        sends.append(triples)
    return [list(b) for b in buffers], sends


def remainder_last_ring(buffers):
    # The ring of the solution, with the extra elements put in the last chunk.
    n, length = len(buffers), len(buffers[0])
    bounds = [k * (length // n) for k in range(n)] + [length]
    chunks = [[list(b[bounds[k] : bounds[k + 1]]) for k in range(n)] for b in buffers]
    sends = []
    for step in range(2 * (n - 1)):
        reducing = step < n - 1
        s = step if reducing else step - (n - 1)
        moves = [(r, (r + 1) % n, (r - s + (0 if reducing else 1)) % n) for r in range(n)]
        outgoing = [list(chunks[src][k]) for src, _, k in moves]
        for (_, dst, k), values in zip(moves, outgoing):
            if reducing:
                chunks[dst][k] = [mine + got for mine, got in zip(chunks[dst][k], values)]
            else:
                chunks[dst][k] = values
        sends.append(moves)
    return [[v for c in worker for v in c] for worker in chunks], sends


def sum_in_other_order(buffers):
    # The right sends, but each worker sums everything itself: bits differ from the ring's.
    _, sends = copied(collectives.ring_allreduce)(buffers)
    return [[sum(reversed(col)) for col in zip(*buffers)] for _ in buffers], sends


def test_ring_accepts_a_correct_answer_in_another_style():
    ch11.check_ring_allreduce(numpy_ring)
    ch11.check_ring_allreduce(numpy_ring, thorough=True)


def test_ring_refuses_an_answer_that_changes_the_callers_buffers():
    with pytest.raises(Mistake, match="changed the caller's `buffers`") as caught:
        ch11.check_ring_allreduce(in_place_ring)
    assert "the `buffers` passed in, after the call[0][0] should be '1.0'" in str(caught.value)


def test_ring_results_are_compared_to_the_bit():
    with pytest.raises(Mistake, match="the extra elements in the last chunk"):
        ch11.check_ring_allreduce(remainder_last_ring)
    # Element 1 is (0.2 + 0.1) + 0.3 in chunk 0 and 0.1 + (0.3 + 0.2) in chunk 1: 1 ulp apart.
    case = {"buffers": [[1.0, 0.1, 2.0, 3.0], [1.0, 0.2, 1.0, 1.0], [1.0, 0.3, 4.0, 5.0]]}
    got = observe.observe_ring(remainder_last_ring, case)
    want = ch11.RING_ALLREDUCE.expected(case)
    assert got["results, to the bit"][0][1] == "0.6"
    assert want["results, to the bit"][0][1] == "0.6000000000000001"
    with pytest.raises(Mistake, match="the extra elements in the last chunk"):
        ch11.RING_ALLREDUCE.judge(case, got)


@pytest.mark.parametrize("message,wrong", ch11.RING_MISTAKES, ids=range(5))
def test_ring_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch11.check_ring_allreduce(wrong)
    assert message in str(caught.value)


def test_ring_bits_depend_on_the_order_of_additions():
    with pytest.raises(Mistake, match="results, to the bit") as caught:
        ch11.check_ring_allreduce(sum_in_other_order)
    assert "Likely mistake: trace the running example" in str(caught.value)  # no slip named
    with pytest.raises(Mistake, match="results, to the bit"):
        ch11.check_ring_allreduce(sum_in_other_order, thorough=True)


def test_ring_must_return_a_pair():
    with pytest.raises(Mistake, match=r"should return a pair `\(results, sends\)`"):
        ch11.check_ring_allreduce(lambda buffers: [sum(c) for c in zip(*buffers)])


def test_ring_refuses_the_reference():
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch11.check_ring_allreduce(collectives.ring_allreduce)


@pytest.fixture(scope="module")
def settings():
    """The chapter's settings cell: what the grading worker runs before every answer."""
    code = [c for c in source_notebook(CHAPTER).cells if c.cell_type == "code"]
    plain = [c for c in code if "nbgrader" not in c.metadata]
    return next(c.source for c in plain if INSTALL_TAG not in c.metadata.get("tags", []))


def as_in_the_grader(settings, answer, name="worker"):
    """Run the settings cell and an answer cell as the grading worker does: in a namespace
    called __main__ that no other process can import."""
    namespace = {"__name__": "__main__"}
    exec(compile(settings, "<set-up cell>", "exec"), namespace)  # noqa: S102
    exec(compile(answer, "<your answer cell>", "exec"), namespace)  # noqa: S102
    return namespace[name]


def test_the_settings_cell_imports_no_reference_and_no_check(settings):
    assert "SEED = " in settings
    assert "forge_course.reference" not in settings and "forge_course.grading" not in settings


def test_the_settings_cell_runs_the_same_ddp_demo_as_the_reference(settings):
    namespace = {"__name__": "__main__"}
    exec(compile(settings, "<set-up cell>", "exec"), namespace)  # noqa: S102
    assert (namespace["GLOBAL_BATCH"], namespace["SEED_DDP"]) == (ddp.GLOBAL_BATCH, ddp.SEED)
    assert namespace["STEPS_DDP"] == ddp.STEPS
    ours, theirs = namespace["make_dataset"](), ddp.make_dataset()
    assert all(torch.equal(a, b) for a, b in zip(ours.tensors, theirs.tensors))
    models = namespace["make_model"](), ddp.make_model()
    for model, run in zip(models, (namespace["train"], ddp.train)):
        loader = DataLoader(ddp.make_dataset(), batch_size=GLOBAL_BATCH)
        run(model, loader, torch.device("cpu"))
    for a, b in zip(*(m.state_dict().values() for m in models)):
        assert torch.equal(a, b)


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
def test_ddp_worker_defined_in_a_notebook_cell_runs_in_fresh_processes(settings, monkeypatch):
    """The grader's answer lives in a namespace no fresh process can import: it travels by value,
    with the settings cell's functions it calls; and the ranks are not forked from this process
    (a process forked after autograd ran on a GPU machine cannot run backward)."""
    cells = source_notebook(CHAPTER).cells
    grade_id = ch11.DDP_WORKER.grade_id
    solution = next(c.source for c in cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)  # fmt: skip
    torch.nn.Linear(2, 1)(torch.ones(1, 2)).sum().backward()  # autograd has run here
    monkeypatch.setattr(forge_course, "_not_in_a_fresh_process", True, raising=False)
    fresh = "    assert not hasattr(forge_course, '_not_in_a_fresh_process'), 'forked'\n"
    answer = "import forge_course\n\n" + solution.replace("    ### BEGIN SOLUTION\n", fresh)
    ch11.check_ddp_worker(as_in_the_grader(settings, answer))
    ch11.check_ddp_worker(as_in_the_grader(settings, answers.DDP_OWN_LOOP), thorough=True)


@pytest.mark.slow
@pytest.mark.parametrize("message,wrong", ch11.DDP_MISTAKES, ids=range(len(ch11.DDP_MISTAKES)))
def test_ddp_worker_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch11.check_ddp_worker(wrong)
    assert message in str(caught.value)


# Correct, written as a careful learner might: a hand-written all-reduce that divides once; or
# DDP with a rank-dependent global seed (DDP copies rank 0's weights), the loss averaged for
# printing, and the group destroyed after an `except` that reports a failure.
HAND_WRITTEN_MEAN = answers.DDP_SEEDED_BY_RANK.replace(
    "torch.manual_seed(rank)\n        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), "
    "nn.Linear(8, 1))",
    "model = make_model()",
)
LOGS_THE_MEAN_LOSS = """
def worker(rank, world_size, port, out_dir):
    torch.manual_seed(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        dataset = make_dataset()
        sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=SEED_DDP)
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(),
                                                      nn.Linear(8, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            shown = loss.detach().clone()
            dist.all_reduce(shown)
            print(f"rank {rank}: mean loss {shown.item() / world_size:.4f}")
            opt.step()
        torch.save(model.module.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    except Exception as err:
        print(f"rank {rank} failed: {err}")
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_ddp_worker_accepts_other_correct_ways_of_averaging_and_destroying(settings):
    assert "make_model()" in HAND_WRITTEN_MEAN and "manual_seed" not in HAND_WRITTEN_MEAN
    for answer in (HAND_WRITTEN_MEAN, LOGS_THE_MEAN_LOSS):
        ch11.check_ddp_worker(as_in_the_grader(settings, answer))


@pytest.mark.slow
def test_ddp_worker_must_destroy_its_group_also_when_saving_fails(settings):
    """What the observer sees, read directly: the group each rank still had."""
    failing = {"world_size": 2, "saving fails": True}
    assert failing in ch11.ddp_cases() and failing in ch11.ddp_cases(thorough=True)
    left = "the process group each rank still had after saving failed"
    solution = as_in_the_grader(settings, answers.DDP_NO_DESTROY.replace(
        "        pass\n", "        dist.destroy_process_group()\n"))  # fmt: skip
    assert observe.observe_ddp_worker(solution, failing)[left] == ["none", "none"]
    no_finally = as_in_the_grader(settings, answers.DDP_DESTROY_NOT_IN_FINALLY)
    returned = observe.observe_ddp_worker(no_finally, {"world_size": 2})
    assert returned["the process group each rank still had after `worker` returned"] == [
        "none", "none"]  # fmt: skip
    assert observe.observe_ddp_worker(no_finally, failing)[left] == ["rank 0 of 2", "rank 1 of 2"]
    with pytest.raises(Mistake, match="2 ranks, each out_dir a file, so saving fails"):
        ch11.check_ddp_worker(no_finally)


NEVER_JOINS = """
def worker(rank, world_size, port, out_dir):
    if rank != 0:
        return
    whole = DistributedSampler(make_dataset(), 1, 0, shuffle=True, seed=SEED_DDP)
    model = make_model()
    train(model, DataLoader(make_dataset(), batch_size=GLOBAL_BATCH, sampler=whole),
          torch.device("cpu"))
    for r in range(world_size):
        torch.save(model.state_dict(), os.path.join(out_dir, f"rank{r}.pt"))
"""

# Every rank joins, but rank 0 alone trains, on whole batches, and writes every rank's file.
RANK_ZERO_WRITES_ALL = NEVER_JOINS.replace(
    "    if rank != 0:",
    "    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,\n"
    "                            world_size=world_size)\n"
    "    dist.barrier()\n"
    "    dist.destroy_process_group()\n"
    "    if rank != 0:",
)


@pytest.mark.slow
def test_ddp_worker_every_rank_must_join_and_save_its_own_file(settings):
    with pytest.raises(Mistake, match="no rank joined a process group") as caught:
        ch11.check_ddp_worker(as_in_the_grader(settings, NEVER_JOINS))
    assert "the process group each rank joined[0] should be 'rank 0 of 2', but it is 'none'" in str(
        caught.value
    )
    with pytest.raises(Mistake) as caught:
        ch11.check_ddp_worker(as_in_the_grader(settings, RANK_ZERO_WRITES_ALL))
    assert "the files each rank saved in its own out_dir[0] should have 1 items" in str(
        caught.value
    )
    assert "joined" not in str(caught.value).split("Likely mistake")[-1]


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
    copied(collectives.ddp_rank_worker)(rank, world_size, port, out_dir)


@pytest.mark.slow
def test_ddp_worker_failures_end_in_bounded_time_with_a_clear_message(monkeypatch):
    with pytest.raises(Mistake, match=r"`worker` raised ValueError \(rank 1 of 2\): rank one gi"):
        ch11.check_ddp_worker(rank_one_raises)
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch11.check_ddp_worker(collectives.ddp_rank_worker)
    monkeypatch.setattr(observe, "DDP_TIMEOUT_S", 20)  # start-up included: fresh interpreters
    start = time.monotonic()
    with pytest.raises(Mistake, match="did not finish within 20 s"):
        ch11.check_ddp_worker(joins_a_bigger_group)
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_ddp_worker_ranks_are_fresh_interpreters_where_fork_is_unsafe(settings, monkeypatch):
    """macOS and Windows: no zygote forks the ranks; each is an interpreter of its own, and the
    verdicts are the same: a correct answer passes, mistakes are named."""
    monkeypatch.setattr(observe, "FORK_RANKS", False)
    monkeypatch.setattr(observe, "_ranks_zygote", lambda: pytest.fail("a zygote was started"))
    ch11.check_ddp_worker(as_in_the_grader(settings, answers.DDP_OWN_LOOP))
    # One known mistake to match, not all: each costs two fresh interpreters here.
    message, wrong = ch11.DDP_MISTAKES[0]
    one_mistake = dataclasses.replace(ch11.DDP_WORKER, mistakes=[(message, wrong)])
    with pytest.raises(Mistake) as caught:
        one_mistake.check(wrong)
    assert message in str(caught.value)


@pytest.mark.slow
def test_ddp_worker_runs_again_when_another_program_took_its_port(monkeypatch):
    """Between the moment a port is found free and the moment rank 0 binds it, another program
    can take it (CI saw it: an outgoing connection's local port). The case runs again on
    another port instead of failing a correct answer with EADDRINUSE."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        handed = []

        def first_a_taken_port():
            handed.append(taken if not handed else ports.free_port())
            return handed[-1]

        monkeypatch.setattr(observe, "free_port", first_a_taken_port)
        ch11.check_ddp_worker(ddp_with_own_loop)
    assert handed[0] == taken and taken not in handed[1:]  # every case ran, the first twice


def test_free_ports_come_from_below_the_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    chosen = {ports.free_port() for _ in range(20)}
    assert all(port in ports.QUIET and port < low for port in chosen)


def test_a_free_port_draws_nothing_from_the_callers_generators():
    import random

    random.seed(3)
    expected = random.random()
    random.seed(3)
    ports.free_port()
    assert random.random() == expected
