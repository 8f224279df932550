"""`forge-course grade --cluster`: a real Dask scheduler and two workers on the loopback.

The scheduler and each worker are separate processes started with Dask's own commands, as on a
department's machines. The class is chapter 04: instructor solutions and typical wrong answers.
A cluster run must give the grades of a local run with the same seed, and a worker killed
mid-run must lose nothing: every student graded and recorded once.
"""

import contextlib
import csv
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from forge_course.grader import run
from forge_course.release import build_sources, generate_release
from tests.conftest import REPO
from tests.test_autograde import _answers, _solutions, _submission

distributed = pytest.importorskip("distributed", reason="the cluster extra is not installed")
pytestmark = pytest.mark.slow

CH = "ch04_one_training_step"
DASK = str(Path(sys.executable).with_name("dask"))


def _class(root: Path, size: int) -> Path:
    """``size`` students: every third one makes a typical mistake, the others are right."""
    build_sources(REPO, root / "build" / "source", [CH])
    generate_release(root, [CH])
    name = f"{CH}.ipynb"
    source = nbformat.read(root / "build" / "source" / CH / name, as_version=4)
    released = nbformat.read(root / "notebooks" / CH / name, as_version=4)
    solved = _solutions(source)
    wrong = [(cell, options[0][0]) for cell, options in _answers(CH).WRONG.items()]
    folder = root / "submitted"
    for i in range(size):
        answers = dict(solved)
        if i % 3 == 2:
            cell, text = wrong[(i // 3) % len(wrong)]
            answers[cell] = text
        path = folder / f"student_{i:02d}" / CH / name
        path.parent.mkdir(parents=True)
        nbformat.write(_submission(released, answers), path)
    return folder


class _Cluster:
    """A scheduler and workers, each its own process, talking over 127.0.0.1."""

    def __init__(self, folder: Path, workers: int):
        self.file = folder / "scheduler.json"
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.scheduler = subprocess.Popen(
            [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(self.file)], **quiet,
        )  # fmt: skip
        self.workers = [
            subprocess.Popen(
                [
                    DASK,
                    "worker",
                    "--scheduler-file",
                    str(self.file),
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--no-dashboard",
                    "--host",
                    "127.0.0.1",
                    "--name",
                    f"w{i}",
                ],
                **quiet,
            )  # fmt: skip
            for i in range(workers)
        ]
        with distributed.Client(scheduler_file=str(self.file), timeout="60s") as client:
            client.wait_for_workers(workers, timeout=120)
            self.address = client.scheduler.address

    def close(self) -> None:
        for process in (*self.workers, self.scheduler):
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = _Cluster(tmp_path_factory.mktemp("dask"), workers=2)
    yield started
    started.close()


def test_a_cluster_gives_the_grades_of_a_local_run(tmp_path, cluster):
    submitted = _class(tmp_path, 6)
    local = run.grade([CH], submitted=submitted, grading=tmp_path / "local", jobs=2, seed=7,
                      progress=False)  # fmt: skip
    env = {**os.environ, "FORGE_GRADING_DIR": str(tmp_path / "cluster")}
    command = [str(Path(sys.executable).with_name("forge-course")), "grade", CH, "--submitted",
               str(submitted), "--seed", "7", "--cluster", cluster.address]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"the Dask cluster at {cluster.address}" in done.stdout
    grades = [(tmp_path / where / "grades.csv").read_text() for where in ("cluster", "local")]
    assert grades[0] == grades[1]
    statuses = {s: {r["status"] for r in results.values()} for (s, _), results in local.items()}
    assert statuses["student_00"] == {"graded"}
    assert statuses["student_02"] != {"graded"}, "a wrong answer was graded as right"


def test_a_worker_killed_mid_run_loses_nothing(tmp_path, cluster):
    submitted = _class(tmp_path, 10)
    grading = tmp_path / "grading"
    ledger = grading / "forge" / CH
    victim = cluster.workers[0]

    def kill_after_the_first_record():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(ledger.glob("*.json")):
            time.sleep(0.05)
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)

    killer = threading.Thread(target=kill_after_the_first_record)
    killer.start()
    outcomes = run.grade([CH], submitted=submitted, grading=grading, seed=7, progress=False,
                         cluster=cluster.address)  # fmt: skip
    killer.join()
    assert victim.wait(timeout=10) == -signal.SIGKILL, "the worker was not killed mid-run"
    assert len(outcomes) == 10
    assert len(list(ledger.glob("*.json"))) == 10
    reference = run.grade([CH], submitted=submitted, grading=tmp_path / "local", seed=7,
                          progress=False)  # fmt: skip
    assert outcomes == reference
    rows = list(csv.DictReader((grading / "grades.csv").open()))
    students = sorted({row["student"] for row in rows})
    assert students == [f"student_{i:02d}" for i in range(10)]


def test_a_stopped_run_ends_its_jobs_on_the_workers(tmp_path, cluster):
    """Ctrl-C while a Dask worker grades an endless loop under a 10-minute limit: the run ends at
    once, and so does the job on the worker (Dask cannot end a running task; the worker ends
    the task's sandbox), which leaves the cluster free for the next run."""
    submitted = _class(tmp_path, 1)
    path = submitted / "student_00" / CH / f"{CH}.ipynb"
    looping = {"ch04_train_step": "def train_step(*args):\n    while True:\n        pass\n"}
    nbformat.write(_submission(nbformat.read(path, as_version=4), looping), path)
    env = {**os.environ, "FORGE_GRADING_DIR": str(tmp_path / "grading")}
    command = [str(Path(sys.executable).with_name("forge-course")), "grade", CH, "--submitted",
               str(submitted), "--timeout", "600", "--cluster", cluster.address]  # fmt: skip
    workers = [w.pid for w in cluster.workers if w.poll() is None]
    earlier = {child for pid in workers for child in _children(pid)}  # earlier runs' sandboxes
    started = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    with distributed.Client(cluster.address, timeout="60s") as client:
        while not any(client.processing().values()):  # a worker has the submission
            assert started.poll() is None, started.communicate()
            time.sleep(0.1)
    time.sleep(3)  # its sandbox starting, or the loop under way
    started.send_signal(signal.SIGINT)
    _, said = started.communicate(timeout=60)
    assert started.returncode == 130 and "stopped after 0 of 1 submission(s)" in said, said
    deadline = time.monotonic() + 60
    while any(set(_children(pid)) - earlier for pid in workers):
        assert time.monotonic() < deadline, "the job went on on the Dask worker"
        time.sleep(0.2)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def test_an_unreachable_scheduler_is_one_sentence(tmp_path):
    env = {**os.environ, "FORGE_GRADING_DIR": str(tmp_path)}
    (tmp_path / "submitted").mkdir()
    command = [str(Path(sys.executable).with_name("forge-course")), "grade", "--cluster",
               "tcp://127.0.0.1:9"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    assert "no Dask scheduler answers at tcp://127.0.0.1:9" in done.stderr
    assert "Traceback" not in done.stderr
