"""The grader on a whole class: a tamper suite, a canary, 40 submissions, a kill, a restart.

Every submission here is a copy of the solved chapter 04 example with some answer cells
replaced, graded by real isolated workers (bubblewrap where installed, as in CI).
"""

import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import nbformat
import pytest

from forge_course.grader import run, sandbox
from tests.conftest import REPO

pytestmark = pytest.mark.slow

CH = "ch04_one_training_step"
HAND, TRAIN, QUESTIONS = "ch04_hand_step", "ch04_train_step", "ch04_questions"
TESTS = ["ch04_hand_step_tests", "ch04_train_step_tests", "ch04_q_grad_multiple", "ch04_q_softmax"]
SOLVED = REPO / "autograder" / "examples" / "alice" / CH / f"{CH}.ipynb"
LIMITS = sandbox.Limits(seconds=15, memory_mb=3072)


def submit(submitted, student, answers, name=CH):
    """A copy of the solved example with the answer cells in ``answers`` replaced."""
    nb = nbformat.read(SOLVED, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    path = submitted / student / CH / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


@pytest.fixture
def grading(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_GRADING_DIR", str(tmp_path / "grading"))
    return tmp_path / "grading"


WRONG_STEP = "def train_step(model, optimizer, loss_fn, x, y):\n    return 0.0\n"
# name -> (replaced answer cells, the status each targeted test cell must end with)
TAMPERING = {
    # The one-line IPython transformer that turns every assert into pass.
    "assert_transformer": ({TRAIN: "get_ipython().input_transformers_post.append(\n"
        "    lambda lines: [l.replace('assert ', 'pass #') for l in lines])\n" + WRONG_STEP},
        "tampered"),
    "patched_allclose": ({TRAIN: "import torch\ntorch.allclose = lambda *a, **k: True\n"
        + WRONG_STEP}, "tampered"),
    "aliased_patch": ({TRAIN: "import torch as T\nT.testing.assert_close = lambda *a, **k: None\n"
        + WRONG_STEP}, "tampered"),
    # Patches the static scan cannot see: the worker notices them at run time.
    "dynamic_patch": ({TRAIN: "import torch\nvars(torch)['all' + 'close'] = lambda *a, **k: True\n"
        + WRONG_STEP}, "tampered"),
    "patched_tensor_method": ({TRAIN: "import torch\nTensor = torch.Tensor\n"
        "Tensor.tolist = lambda self: [0.0]\n" + WRONG_STEP}, "tampered"),
    "always_equal": ({TRAIN: "class Same:\n    def __eq__(self, other):\n        return True\n\n"
        "def train_step(*args):\n    return Same()\n"}, "wrong"),
    "float_subclass": ({TRAIN: "class F(float):\n    def __eq__(self, other):\n"
        "        return True\n\ndef train_step(*args):\n    return F(0.0)\n"}, "wrong"),
    "tensor_subclass": ({TRAIN: "import torch\nclass T(torch.Tensor):\n    pass\n" + WRONG_STEP},
        "tampered"),
    "torch_function": ({TRAIN: "class A:\n    @classmethod\n    def __torch_function__(cls, *a):\n"
        "        return True\n" + WRONG_STEP}, "tampered"),
    "settrace": ({TRAIN: "import sys\nsys.settrace(lambda *a: None)\n" + WRONG_STEP}, "tampered"),
    "os_exit": ({TRAIN: "import os\n\ndef train_step(*args):\n    os._exit(0)\n"}, "tampered"),
    # The same exit reached without naming it: the worker ends, which is reported, not obeyed.
    "hidden_exit": ({TRAIN: "import os\nquit_ = getattr(os, '_' + 'exit')\n\n"
        "def train_step(*args):\n    quit_(0)\n"}, "crashed"),
    "kill_the_worker": ({TRAIN: "import os\nsend = getattr(os, 'ki' + 'll')\n\n"
        "def train_step(*args):\n    send(os.getppid(), 9)\n"}, "crashed"),
    "read_sources": ({TRAIN: "source = open('../../build/source/ch04/ch04.ipynb').read()\n"
        + WRONG_STEP}, "tampered"),
    "read_gradebook": ({TRAIN: "db = open('gradebook.db', 'rb').read()\n" + WRONG_STEP},
        "tampered"),
    "import_reference": ({TRAIN: "from forge_course.reference.step import train_step\n"},
        "tampered"),
    # The reference reached without importing it: its tripwire fires when learner code calls it.
    "reach_reference": ({TRAIN: "import os\n"
        "ref = os.sys.modules['forge_course.reference.step']\n\n"
        "def train_step(*args):\n    return ref.train_step(*args)\n"}, "wrong"),
    "detect_grader": ({TRAIN: "import os\nGRADING = 'NBGRADER_EXECUTION' in os.environ\n"
        + WRONG_STEP}, "tampered"),
    "detect_grader_quietly": ({TRAIN: "import os\nGRADING = any('GRAD' in k for k in os.environ)\n"
        "\ndef train_step(*args):\n    return 0.0 if GRADING else 1.0\n"}, "wrong"),
    "forged_result": ({TRAIN: "import json, os\n\ndef train_step(*args):\n"
        "    line = json.dumps({'case': 0, 'observation': 0.0, 'done': True}) + '\\n'\n"
        "    for fd in range(3, 12):\n        try:\n            os.write(fd, line.encode())\n"
        "        except OSError:\n            pass\n    while True:\n        pass\n"}, "timeout"),
    "forged_then_wrong": ({TRAIN: "import json, os\n\ndef train_step(*args):\n"
        "    line = json.dumps({'case': 1, 'observation': 0.0}) + '\\n'\n"
        "    for fd in range(3, 12):\n        try:\n            os.write(fd, line.encode())\n"
        "        except OSError:\n            pass\n    return 0.0\n"}, "tampered"),
    "fork_bomb": ({TRAIN: "import os\nspawn = getattr(os, 'fo' + 'rk')\n\n"
        "def train_step(*args):\n    while True:\n        spawn()\n"}, "resource limit"),
    "memory_bomb": ({TRAIN: "def train_step(*args):\n    hoard = []\n    while True:\n"
        "        hoard.append(bytearray(10**8))\n"}, "resource limit"),
    "infinite_loop": ({TRAIN: "def train_step(*args):\n    while True:\n        try:\n"
        "            pass\n        except BaseException:\n            pass\n"}, "timeout"),
    "socket": ({TRAIN: "import socket\nsocket.create_connection(('1.1.1.1', 80))\n" + WRONG_STEP},
        "tampered"),
    "network_quietly": ({TRAIN: "import urllib.request\n\ndef train_step(*args):\n"
        "    return float(urllib.request.urlopen('http://1.1.1.1', timeout=3).read())\n"}, "wrong"),
    "system_exit": ({TRAIN: "def train_step(*args):\n    raise SystemExit(0)\n"}, "wrong"),
    "signal_handler": ({TRAIN: "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        + WRONG_STEP}, "tampered"),
    "exec_string": ({HAND: "exec('def hand_step(*a):\\n    return {}')\n"}, "tampered"),
    "patched_question_check": ({QUESTIONS: "import torch\ntorch.equal = lambda *a: True\n"
        "grad_multiple = 2\nsoftmax_answer = 'a'\n"}, "tampered"),
}  # fmt: skip


def _targets(answers: dict) -> list[str]:
    if QUESTIONS in answers:
        return ["ch04_q_grad_multiple", "ch04_q_softmax"]
    return [f"{cell}_tests" for cell in answers]


def test_tamper_suite_scores_zero_with_the_right_status(grading):
    submitted = grading / "submitted"
    submit(submitted, "reference", {})
    for name, (answers, _) in TAMPERING.items():
        submit(submitted, name, answers)
    outcomes = run.grade(jobs=2, limits=LIMITS, progress=False, unsafe=True)

    assert all(r["status"] == "graded" for r in outcomes[("reference", CH)].values())
    for name, (answers, status) in TAMPERING.items():
        results = outcomes[(name, CH)]
        for test in TESTS:
            got = results[test]
            if test in _targets(answers):
                assert (got["status"], got["points"]) == (status, 0.0), (name, test, got)
                assert got["message"], f"{name}: a zero must say why"
            else:
                assert got["status"] == "graded", f"{name}: the other exercises still count"


def test_no_hidden_test_text_is_readable_by_a_submission(grading, tmp_path):
    """A canary in a chapter's hidden tests: in the grader's files, never in the sandbox's."""
    canary = "CANARY-5d1e0b77"
    course = tmp_path / "course"
    shutil.copytree(REPO / "solutions", course / "solutions")
    solution = course / "solutions" / f"{CH}.py"
    text = solution.read_text()
    marker = "### BEGIN HIDDEN TESTS\n"
    assert marker in text
    solution.write_text(text.replace(marker, f"{marker}# {canary}\n", 1))
    submit(grading / "submitted", "alice", {})
    outcomes = run.grade(course_root=course, limits=LIMITS, progress=False, unsafe=True)
    assert all(r["status"] == "graded" for r in outcomes[("alice", CH)].values())
    grader_files = [grading / "gradebook.db", grading / "source" / CH / f"{CH}.ipynb"]
    assert all(canary.encode() in p.read_bytes() for p in grader_files), "canary not placed"

    # Search every place a submission can read: its environment, every file under the course
    # and the grading folder, its home and working folder, and what /proc shows of processes.
    snoop = (
        "import os\n"
        f"canary = {canary!r}.encode()\n"
        "found = [k for k, v in os.environ.items() if canary in (k + v).encode()]\n"
        f"roots = [{str(course)!r}, {str(grading)!r}, os.getcwd(), os.path.expanduser('~')]\n"
        "for root in roots:\n"
        "    for folder, _, files in os.walk(root):\n"
        "        for name in files:\n"
        "            path = os.path.join(folder, name)\n"
        "            try:\n"
        "                if canary in open(path, 'rb').read(50_000_000):\n"
        "                    found.append(path)\n"
        "            except OSError:\n"
        "                pass\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    for part in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            if canary in open(f'/proc/{pid}/{part}', 'rb').read():\n"
        "                found.append(f'/proc/{pid}/{part}')\n"
        "        except OSError:\n"
        "            pass\n"
    )
    job = {"prelude": "", "answer": snoop, "variables": ["found"]}
    # Reading every file takes a while on a busy machine: room enough for the search to finish.
    outcome = sandbox.run(job, sandbox.Limits(seconds=120, memory_mb=3072))
    assert outcome.status == "finished", outcome
    found = next(m["variables"]["found"] for m in outcome.messages if "variables" in m)
    if sandbox.isolation() == "bubblewrap":
        assert found == []
    feedback = (grading / "feedback" / "alice" / CH / f"{CH}.html").read_text()
    assert canary not in feedback and canary not in (grading / "grades.csv").read_text()


# A class of 40: each kind of submission with the points it must earn (7 in all).
KINDS = {
    "solved": ({}, 7.0),
    "blank": ({HAND: "def hand_step(W, b, x, t, lr):\n    raise NotImplementedError()\n",
               TRAIN: "def train_step(model, optimizer, loss_fn, x, y):\n"
               "    raise NotImplementedError()\n",
               QUESTIONS: "grad_multiple = None\nsoftmax_answer = None\n"}, 0.0),
    "no_zero_grad": ({TRAIN: "def train_step(model, optimizer, loss_fn, x, y):\n"
                      "    loss = loss_fn(model(x), y)\n    loss.backward()\n"
                      "    optimizer.step()\n    return loss.item()\n"}, 4.0),
    "questions_wrong": ({QUESTIONS: "grad_multiple = 2\nsoftmax_answer = 'a'\n"}, 5.0),
    "returns_tensor": ({TRAIN: "def train_step(model, optimizer, loss_fn, x, y):\n"
                        "    optimizer.zero_grad()\n    loss = loss_fn(model(x), y)\n"
                        "    loss.backward()\n    optimizer.step()\n    return loss\n"}, 4.0),
}  # fmt: skip


SIZE = 40  # large enough to be killed mid-run with both workers busy; 300 is a benchmark


def _class_of_40(submitted) -> dict[str, float]:
    expected = {}
    kinds = list(KINDS)
    for i in range(SIZE):
        kind = kinds[i % len(kinds)]
        student = f"s{i:03d}-{kind}"
        # Browsers and Colab rename downloads; the grader must not care.
        name = [CH, f"Copy of {CH}", f"{CH} (1)"][i % 3]
        submit(submitted, student, KINDS[kind][0], name=name)
        expected[student] = KINDS[kind][1]
    return expected


def _gradebook_scores(grading) -> list[tuple[str, float]]:
    """(student, score) for every submission row in nbgrader's own database."""
    with sqlite3.connect(grading / "gradebook.db") as db:
        rows = db.execute(
            "SELECT submitted_assignment.student_id, SUM(grade.auto_score) FROM grade "
            "JOIN submitted_notebook ON grade.notebook_id = submitted_notebook.id "
            "JOIN submitted_assignment ON submitted_notebook.assignment_id = "
            "submitted_assignment.id GROUP BY submitted_assignment.id"
        ).fetchall()
    return sorted(rows)


def _grade_command(grading):
    env = {**os.environ, "FORGE_GRADING_DIR": str(grading),
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}  # fmt: skip
    command = [sys.executable, "-m", "forge_course.cli", "grade", "--jobs", "2",
               "--timeout", str(LIMITS.seconds), "--unsafe"]  # fmt: skip
    return command, env


def test_a_class_of_40_killed_and_restarted_loses_and_repeats_nothing(grading):
    expected = _class_of_40(grading / "submitted")
    ledger = grading / "forge" / CH
    command, env = _grade_command(grading)

    # Kill the grader (and so its sandboxes) once about a third of the class is recorded.
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 600
    while len(list(ledger.glob("*.json"))) < SIZE // 3 and first.poll() is None:
        assert time.monotonic() < deadline, "the grader made no progress"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    done_before = {p.name: p.stat().st_mtime_ns for p in ledger.glob("*.json")}
    assert SIZE // 3 <= len(done_before) < SIZE

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-2000:]
    after = {p.name: p.stat().st_mtime_ns for p in ledger.glob("*.json")}
    assert len(after) == SIZE
    assert all(after[name] == mtime for name, mtime in done_before.items()), (
        "the restart must grade only what is missing"
    )

    scores = _gradebook_scores(grading)
    assert [s for s, _ in scores] == sorted(expected), "every student exactly once"
    assert {s: score for s, score in scores} == expected
    rows = list(csv.DictReader((grading / "grades.csv").open()))
    assert len(rows) == SIZE * len(TESTS)

    # The same submission graded several times (the copies of each kind, across two runs with their
    # own grading seeds and two parallel workers) ends with the same status and points.
    entries = [json.loads(p.read_text())["record"] for p in ledger.glob("*.json")]
    for kind in KINDS:
        copies = [_verdicts(e["results"]) for e in entries if e["student"].endswith(f"-{kind}")]
        assert len(copies) == SIZE // len(KINDS) and all(c == copies[0] for c in copies), kind


def _verdicts(results: dict) -> dict:
    return {test: (r["status"], r["points"]) for test, r in results.items()}


def test_two_folders_that_would_share_an_id_are_both_refused_by_name(grading):
    """A folder never replaces another's grades: two names equal after Unicode normalisation
    (the Kelvin sign), or a folder named like another's hashed id, are refused, each message
    naming both folders; the other students are graded as usual."""
    import hashlib

    submitted = grading.parent / "class"
    greek = "\u03a3\u03c9\u03ba\u03c1\u03ac\u03c4\u03b7\u03c2"
    hashed = "student-" + hashlib.sha256(greek.encode()).hexdigest()[:16]
    blank = {TRAIN: WRONG_STEP}
    for student, answers in [("Kate", {}), ("\u212aate", blank), (greek, {}), (hashed, blank),
                             ("solo", {})]:  # fmt: skip
        submit(submitted, student, answers)
    outcomes = run.grade([CH], submitted=submitted, limits=LIMITS, progress=False, unsafe=True)
    assert sorted(s for s, _ in outcomes) == sorted(["Kate", hashed, "solo"])
    named = {"Kate": ["'Kate'", "'\\u212aate'"], hashed: [ascii(greek), repr(hashed)]}
    for sid, names in named.items():
        for r in outcomes[(sid, CH)].values():
            assert r["status"] == "malformed" and r["points"] == 0, r
            assert all(name in r["message"] for name in names), r["message"]
    assert all(r["status"] == "graded" for r in outcomes[("solo", CH)].values())
