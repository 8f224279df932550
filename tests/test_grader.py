"""The grader end to end, with real isolated workers: the shipped examples and a tamper suite."""

import csv
import os
import shutil
import socket
import subprocess
import sys

import nbformat
import pytest

from forge_course.grader import run, sandbox
from tests.conftest import REPO

CH = "ch04_one_training_step"
EXAMPLES = REPO / "autograder" / "examples"
EXPECTED = {  # student -> status of each test cell, in notebook order
    "alice": ["graded", "graded", "graded", "graded"],
    "bob": ["wrong", "wrong", "wrong", "wrong"],
    "carol": ["wrong", "wrong", "wrong", "wrong"],
    "dave": ["tampered", "tampered", "graded", "graded"],
    "erin": ["graded", "timeout", "graded", "graded"],
    "frank": ["malformed"] * 4,
}
LIMITS = sandbox.Limits(seconds=30, memory_mb=4096)


@pytest.fixture
def grading(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_GRADING_DIR", str(tmp_path / "grading"))
    return tmp_path / "grading"


def _submit(grading, student, answers, name=CH):
    """A copy of the solved example with some answer cells replaced."""
    nb = nbformat.read(EXAMPLES / "alice" / CH / f"{CH}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") in answers:
            cell.source = answers[cell.metadata["nbgrader"]["grade_id"]]
    path = grading / "submitted" / student / CH / f"{name}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)


@pytest.mark.slow
def test_shipped_examples_get_their_statuses_scores_feedback_and_csv(grading):
    outcomes = run.grade(submitted=EXAMPLES, limits=LIMITS, progress=False)
    for student, statuses in EXPECTED.items():
        got = [r["status"] for r in outcomes[(student, CH)].values()]
        assert got == statuses, f"{student}: {got}"
    assert sum(r["points"] for r in outcomes[("alice", CH)].values()) == 7
    feedback = (grading / "feedback" / "carol" / CH / f"{CH}.html").read_text()
    assert "Likely mistake" in feedback and "thorough=True" not in feedback
    rows = list(csv.DictReader((grading / "grades.csv").open()))
    assert len(rows) == 6 * 4
    export = subprocess.run(
        [sys.executable, "-m", "nbgrader", "export", "--to", str(grading / "export.csv")],
        cwd=REPO / "autograder", capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    scores = {
        r["student_id"]: float(r["score"]) for r in csv.DictReader((grading / "export.csv").open())
    }
    assert scores["alice"] == 7 and scores["bob"] == 0 and scores["frank"] == 0

    again = run.grade(submitted=EXAMPLES, limits=LIMITS, progress=False)
    assert again == outcomes, "a second run must resume from the ledger and change nothing"


RUNTIME_TAMPERING = {
    # An infinite loop that swallows every exception, so only the wall clock can end it.
    "loop": "def train_step(*args):\n    while True:\n        try:\n            pass\n"
    "        except BaseException:\n            pass\n",
    # Memory is bounded per worker: the bomb ends inside the worker, not on the machine.
    "bomb": "def train_step(*args):\n    hoard = []\n    while True:\n"
    "        hoard.append(bytearray(10**8))\n",
    # Forged result lines on every descriptor, then a hang: nothing sent before a kill counts.
    "forge": "import json, os\n\ndef train_step(*args):\n"
    "    line = json.dumps({'case': 0, 'observation': 0.0, 'done': True}) + '\\n'\n"
    "    for fd in range(3, 12):\n        try:\n            os.write(fd, line.encode())\n"
    "        except OSError:\n            pass\n    while True:\n        pass\n",
    # Forged lines followed by a wrong answer: the worker's own later line wins.
    "forge_wrong": "import json, os\n\ndef train_step(*args):\n"
    "    line = json.dumps({'case': 1, 'observation': 0.0}) + '\\n'\n"
    "    for fd in range(3, 12):\n        try:\n            os.write(fd, line.encode())\n"
    "        except OSError:\n            pass\n    return 0.0\n",
    # A SystemExit raised from inside the answer is reported, not obeyed.
    "exit": "def train_step(*args):\n    raise SystemExit(0)\n",
}
RUNTIME_STATUS = {"loop": "timeout", "bomb": "resource limit", "forge": "timeout",
                  "forge_wrong": "wrong", "exit": "wrong"}  # fmt: skip


@pytest.mark.slow
def test_runtime_tampering_ends_with_the_right_status(grading):
    for name, source in RUNTIME_TAMPERING.items():
        _submit(grading, name, {"ch04_train_step": source})
    limits = sandbox.Limits(seconds=40, memory_mb=3072)
    outcomes = run.grade(limits=limits, progress=False)
    for name, status in RUNTIME_STATUS.items():
        results = outcomes[(name, CH)]
        assert results["ch04_train_step_tests"]["status"] == status, (name, results)
        assert results["ch04_hand_step_tests"]["status"] == "graded", "other exercises still count"


def test_worker_sees_no_secret_files_environment_or_network(tmp_path, monkeypatch):
    canary = "CANARY-7f3a9c"
    secret = tmp_path / "grading"
    secret.mkdir()
    (secret / "gradebook.db").write_text(canary)
    monkeypatch.setenv("FORGE_SECRET", canary)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    snoop = (
        "import os, socket\n"
        f"path = {str(secret / 'gradebook.db')!r}\n"
        "try:\n    seen = open(path).read()\n"
        "except OSError as err:\n    seen = type(err).__name__\n"
        "env = ' '.join(f'{k}={v}' for k, v in os.environ.items())\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
        "    network = 'open'\n"
        "except OSError:\n    network = 'closed'\n"
    )
    job = {"prelude": "", "answer": snoop, "variables": ["seen", "env", "network"]}
    outcome = sandbox.run(job, LIMITS, hidden=[secret])
    server.close()
    values = next(m["variables"] for m in outcome.messages if "variables" in m)
    assert canary not in values["env"]
    if sandbox.isolation() == "bubblewrap":
        assert canary not in values["seen"]
    if sandbox.isolation() != "process":
        assert values["network"] == "closed"


def test_ci_has_the_strongest_isolation():
    if os.environ.get("CI") and shutil.which("apt-get"):
        assert sandbox.isolation() == "bubblewrap", ".ci/run installs bubblewrap"
