"""The grader end to end, with real isolated workers: the shipped examples and a tamper suite."""

import contextlib
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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


@pytest.mark.slow
def test_shipped_examples_get_their_statuses_scores_feedback_and_csv(grading):
    outcomes = run.grade(submitted=EXAMPLES, limits=LIMITS, progress=False, unsafe=True)
    for student, statuses in EXPECTED.items():
        got = [r["status"] for r in outcomes[(student, CH)].values()]
        assert got == statuses, f"{student}: {got}"
    assert sum(r["points"] for r in outcomes[("alice", CH)].values()) == 7
    feedback = (grading / "feedback" / "carol" / CH / f"{CH}.html").read_text()
    assert "Likely mistake" in feedback and "thorough=True" not in feedback
    rows = list(csv.DictReader((grading / "grades.csv").open()))
    assert len(rows) == 6 * 4
    export = _nbgrader("export", "--to", str(grading / "export.csv"))
    assert export.returncode == 0, export.stderr
    scores = {
        r["student_id"]: float(r["score"]) for r in csv.DictReader((grading / "export.csv").open())
    }
    assert scores["alice"] == 7 and scores["bob"] == 0 and scores["frank"] == 0

    # nbgrader's own feedback pages, from the autograded copies the grader writes.
    nbgrader_feedback = _nbgrader("generate_feedback", CH, "--student", "carol", "--force")
    assert nbgrader_feedback.returncode == 0, nbgrader_feedback.stderr
    page = (grading / "feedback" / "carol" / CH / f"{CH}.html").read_text()
    assert "Likely mistake" in page and "BEGIN HIDDEN TESTS" not in page

    again = run.grade(submitted=EXAMPLES, limits=LIMITS, progress=False, unsafe=True)
    assert again == outcomes, "a second run must resume from the ledger and change nothing"


@pytest.mark.slow
def test_a_stopped_run_ends_its_jobs_at_once_keeps_what_is_done_and_leaves_nothing(tmp_path):
    """SIGTERM (a batch system's time limit, `kill`), then Ctrl-C, while erin's endless loop runs
    under a 10-minute limit: each run ends at once with exit status 130 and says how to go on,
    removes its sandboxes and temporary folders, and records nothing the stop cut short; the
    next run grades only what is missing."""
    grading, scratch = tmp_path / "grading", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "FORGE_GRADING_DIR": str(grading), "TMPDIR": str(scratch),
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}  # fmt: skip
    command = [sys.executable, "-m", "forge_course.cli", "grade", "--submitted", str(EXAMPLES),
               "--jobs", "1"]  # fmt: skip
    if sandbox.isolation() != "bubblewrap":
        command.append("--unsafe")
    ledger = grading / "forge" / CH
    kept = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        # One job at a time, in name order: alice to dave are recorded, then erin's loop runs.
        started = subprocess.Popen([*command, "--timeout", "600"], env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        while len(list(ledger.glob("*.json"))) < 4 or not _processes_naming(scratch):
            assert started.poll() is None, started.communicate()
            time.sleep(0.1)
        time.sleep(2)  # erin's job is under way (or its worker starting)
        started.send_signal(signum)
        _, said = started.communicate(timeout=60)
        assert started.returncode == 130, said[-2000:]
        assert "stopped after 4 of 6 submission(s)" in said and "the same command" in said, said
        left = [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")]
        assert left == [], "the stopped run left its temporary folders"  # (torch's cache stays)
        assert _processes_naming(scratch) == [], "the stopped run left processes"
        recorded = {p.name: p.stat().st_mtime_ns for p in ledger.glob("*.json")}
        assert len(recorded) == 4 and kept in ({}, recorded), "only what was done is recorded"
        kept = recorded

    finished = subprocess.run([*command, "--timeout", "5"], env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-2000:]
    recorded = {p.name: p.stat().st_mtime_ns for p in ledger.glob("*.json")}
    assert len(recorded) == 6 and all(recorded[name] == t for name, t in kept.items())
    statuses = {}
    for row in csv.DictReader((grading / "grades.csv").open()):
        statuses.setdefault(row["student"], []).append(row["status"])
    assert {s: sorted(v) for s, v in statuses.items()} == {
        s: sorted(v) for s, v in EXPECTED.items()
    }


def _processes_naming(path: Path) -> list[str]:
    """Command lines of the processes still running that name ``path``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(path) in line:
                found.append(line)
    return found


def _nbgrader(*args):
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=REPO / "autograder", capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"},
    )  # fmt: skip


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
    outcome = sandbox.run(job, LIMITS)
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


def _modes_here() -> list[str]:
    found = sandbox.isolation()
    order = ["bubblewrap", "network namespace", "process"]
    return order[order.index(found) :]  # the strongest here, and every weaker one


@pytest.mark.parametrize("mode", _modes_here())
def test_every_isolation_keeps_loopback_and_leaves_no_process_behind(mode):
    """Distributed exercises rendezvous on 127.0.0.1, so each mode keeps loopback up; a process
    that left the worker's group with setsid still ends with the submission."""
    marker = f"forge-leftover-{os.getpid()}-{mode.replace(' ', '-')}"
    answer = (
        "import socket, subprocess, sys\n"
        "server = socket.create_server(('127.0.0.1', 0))\n"
        "socket.create_connection(server.getsockname(), timeout=2).close()\n"
        "loopback = 'up'\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)  # {marker}'],\n"
        "                 start_new_session=True)\n"
    )
    job = {"prelude": "", "answer": answer, "variables": ["loopback"]}
    with sandbox.Session(LIMITS, mode) as box:
        outcome = box.run(job)
        contained = mode == "bubblewrap" or bool(box._groups)
    messages = {k: v for m in outcome.messages for k, v in m.items()}
    assert messages.get("variables") == {"loopback": "up"}, outcome
    if not contained:
        pytest.skip("no pid namespace or control group here: a setsid process can outlive it")
    leftovers = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if marker in cmdline.read_text():
                leftovers.append(cmdline.parent.name)
    assert not leftovers, f"processes left behind: {leftovers}"


def test_the_sandbox_refuses_namespaces_mounts_ptrace_and_lasting_ipc():
    """The seccomp filter: calls no answer needs fail with EPERM, whatever starts them. System V
    IPC objects and POSIX message queues would outlive the job in a worker that serves the
    next student: no program run by an answer can make one."""
    if sandbox.isolation() != "bubblewrap":
        pytest.skip("the seccomp filter comes with bubblewrap")
    answer = (
        "import subprocess\n"
        "codes = [subprocess.run(c, capture_output=True).returncode for c in\n"
        "         (['unshare', '-U', 'true'], ['unshare', '-n', 'true'], ['true'])]\n"
        "run = subprocess.run(['unshare', '-U', 'true'], capture_output=True, text=True)\n"
        "denied = run.stderr\n"
        "ipc = [subprocess.run(['ipcmk', flag], capture_output=True, text=True).stderr\n"
        "       for flag in ('-M4096', '-S1', '-Q')]\n"
    )
    names = ["codes", "denied", "ipc"]
    outcome = sandbox.run({"prelude": "", "answer": answer, "variables": names}, LIMITS)
    values = next(m["variables"] for m in outcome.messages if "variables" in m)
    assert values["codes"][:2] != [0, 0] and values["codes"][2] == 0, values
    assert "not permitted" in values["denied"], values
    if shutil.which("ipcmk"):
        assert all("not permitted" in said for said in values["ipc"]), values


@pytest.mark.slow
def test_a_grader_failure_stays_with_its_submission(grading, monkeypatch):
    """A crash of the grader's own code on one notebook is that student's `grader error`,
    recorded in the ledger; the class finishes and grades.csv is written."""
    real = run.grade_notebook

    def fails_for_bob(assignment, path, *args):
        if "bob" in str(path):
            raise KeyError("a bug in the grader")
        return real(assignment, path, *args)

    monkeypatch.setattr(run, "grade_notebook", fails_for_bob)
    submitted = grading.parent / "class"
    for student in ("alice", "bob"):
        shutil.copytree(EXAMPLES / student, submitted / student)
    outcomes = run.grade(submitted=submitted, limits=LIMITS, progress=False, unsafe=True)
    bob = outcomes[("bob", CH)].values()
    assert {r["status"] for r in bob} == {"grader error"}
    assert all("KeyError" in r["message"] and "a bug in the grader" in r["message"] for r in bob)
    assert all(r["status"] == "graded" for r in outcomes[("alice", CH)].values())
    rows = list(csv.DictReader((grading / "grades.csv").open()))
    assert {r["student"] for r in rows} == {"alice", "bob"}
    ledger = run.Ledger(grading / "forge")
    assert ledger.path(CH, "bob").exists()


def test_the_watcher_reports_every_total_of_a_job_and_the_session_adds_them_up():
    """What a job used, measured from outside the learner's processes: four processes holding
    100 files and burning 0.3 CPU-seconds each, 10 more threads, 4 files of 5 MB."""
    if sandbox.isolation() != "bubblewrap":
        pytest.skip("the totals are measured in the sandbox's own process-id namespace")
    answer = (
        "import os, threading, time\n"
        "for i in range(4):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (5 << 20))\n"
        "threads = [threading.Thread(target=time.sleep, args=(1.5,)) for _ in range(10)]\n"
        "for t in threads:\n    t.start()\n"
        "forked = []\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n        break\n"
        "    forked.append(pid)\n"
        "held = [open('/dev/null') for _ in range(100)]\n"
        "end = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass\n"
        "time.sleep(1.5)\n"
        "if len(forked) < 3:\n    os._exit(0)\n"
        "for pid in forked:\n    os.waitpid(pid, 0)\n"
        "done = 1\n"
    )
    with sandbox.Session(LIMITS) as box:
        first = box.run({"prelude": "", "answer": answer, "variables": ["done"]})
        second = box.run({"prelude": "", "answer": "done = 1", "variables": ["done"]})
        peaks = box.peaks
    assert first.status == "finished", first
    job = first.peaks
    assert job["open_files"] >= 100 and job["open_files_total"] >= 4 * 100, job
    assert job["processes"] >= 4 + 10, job
    assert job["disk_mb"] >= 20 and job["files"] >= 4, job
    assert job["cpu_seconds"] >= 4 * 0.3 and job["memory_mb"] > 0, job  # the forks' included
    assert peaks["cpu_seconds"] == round(job["cpu_seconds"] + second.peaks["cpu_seconds"], 3)
    assert peaks["open_files_total"] == job["open_files_total"]
    assert peaks["seconds"] >= 1.5 and peaks["submission_seconds"] >= peaks["seconds"]


@pytest.mark.parametrize(
    "peaks",
    [
        '{"files": -1}',
        '{"files": NaN}',
        '{"files": true}',
        '{"forged": 1}',
        "[1]",
        '{"disk_mb": "1"}',
    ],
)
def test_an_answer_with_peaks_of_another_shape_is_no_answer(peaks):
    """Only the server writes the answer line, and its peaks are counts: anything else is not
    the server's answer."""
    line = '{"id": 1, "output": "", "exit": 0, "limit": "", "peaks": ' + peaks + "}"
    assert sandbox._reply(line) is None
    assert sandbox._reply(line.replace(peaks, '{"files": 3, "cpu_seconds": 0.5}')) is not None


@pytest.mark.slow
def test_a_worker_that_ended_between_submissions_is_replaced_not_blamed():
    """A warm worker killed from outside between two submissions (the host's OOM killer, say)
    is started afresh for the next one, which is graded as if nothing happened."""
    with sandbox.Session(LIMITS) as box:
        box.run({"prelude": "", "answer": "x = 1", "variables": ["x"]})
        os.killpg(box.process.pid, signal.SIGKILL)
        box.process.wait()
        box.begin()
        outcome = box.run({"prelude": "", "answer": "x = 2", "variables": ["x"]})
    assert outcome.status == "finished", outcome
    assert {"variables": {"x": 2}} in outcome.messages


@pytest.mark.parametrize(
    "answer,raised",
    [("raise ValueError('before the def')\ndef training_arithmetic(*a): pass", "ValueError"),
     ("def arithmetic(*a): pass", None)],
    ids=["raised first", "misnamed"],
)  # fmt: skip
def test_an_answer_cell_that_defines_nothing_is_told_so(answer, raised):
    """Not "should be a function, but it is NoneType": the name was never defined."""
    from forge_course.grading import ch00

    exercise = ch00.EXERCISES[0]
    job = {"prelude": "", "answer": answer, "observer": exercise.observer,
           "function": exercise.function, "cases": exercise.cases(False)}  # fmt: skip
    with sandbox.Session(LIMITS) as box:
        outcome = box.run(job)
    assert outcome.status == "finished", outcome
    told = "`training_arithmetic` is not defined: your answer cell never defined it."
    assert {"case": 0, "mistake": told} in outcome.messages
    errors = [m["error"].split(":")[0] for m in outcome.messages if "error" in m]
    assert errors == ([raised] if raised else [])


FLOOD = (  # 256 MB without a newline, to stdout, stderr or every pipe the job holds (its channel)
    "import os\nchunk = b'x' * (1 << 20)\n"
    "def pipes_held_once():  # a CUDA driver's own pipes hold both of their ends: not those\n"
    "    links = {{}}\n"
    "    for n in map(int, os.listdir('/proc/self/fd')):\n"
    "        try:\n            links[n] = os.readlink(f'/proc/self/fd/{{n}}')\n"
    "        except OSError:\n            pass\n"
    "    held = list(links.values())\n"
    "    return [n for n, link in links.items()\n"
    "            if n > 2 and link.startswith('pipe:') and held.count(link) == 1]\n"
    "for _ in range(256):\n"
    "    for fd in {fds}:\n"
    "        try:\n            os.write(fd, chunk)\n"
    "        except OSError:\n            pass\n"
)


@pytest.mark.parametrize("fds", ["(1,)", "(2,)", "pipes_held_once()"])
def test_a_flood_of_output_is_the_submissions_limit_not_the_graders_memory(fds):
    """Whatever a job writes, printed or sent down its channel, the grader reads in bounded
    chunks and keeps a bounded amount: a flood ends that exercise as over a limit, and the
    grader's own memory does not grow with it."""
    from resource import RUSAGE_SELF, getrusage

    before = getrusage(RUSAGE_SELF).ru_maxrss / 1024  # MB
    with sandbox.Session(LIMITS) as box:
        flooded = box.run({"prelude": "", "answer": FLOOD.format(fds=fds), "variables": []})
        after = box.run({"prelude": "", "answer": "x = 1", "variables": ["x"]})
    grew = getrusage(RUSAGE_SELF).ru_maxrss / 1024 - before
    assert flooded.status == "resource limit" and flooded.detail.startswith("output:"), flooded
    assert after.status == "finished" and {"variables": {"x": 1}} in after.messages, after
    assert grew < 64, f"the grader's peak memory grew by {grew:.0f} MB"


def test_the_grader_never_holds_a_line_longer_than_its_limit(monkeypatch):
    """The reply pipe is read in chunks: an over-long line is dropped as it arrives and named,
    and the lines after it are read as usual."""
    import queue

    monkeypatch.setattr(sandbox, "MAX_LINE", 1000)
    read, write = os.pipe()
    with os.fdopen(read, "rb") as pipe:
        lines = queue.Queue()
        os.write(write, b"first\n" + b"y" * 5000 + b"\nlast\n")
        os.close(write)
        sandbox._read_lines(pipe, lines)
    assert [lines.get() for _ in range(4)] == ["first", sandbox.TOO_LONG, "last", None]


SPOTS = ("/", "/etc", "/opt", "/opt/forge", "/usr", "/dev", "/dev/pts", "/sys", "/run", "/var",
         "/home", "/tmp", "/dev/shm")  # fmt: skip
PLANT_EVERYWHERE = f"""import os, stat, sys
spots = {SPOTS!r} + (os.path.dirname(os.__file__), sys.prefix, os.path.expanduser('~'))
written = []
for spot in spots:
    try:
        with open(os.path.join(spot, 'forge-planted'), 'w') as f:
            f.write('42')
        written.append(spot)
    except OSError:
        pass
changed = []  # each change sets what is there already: one allowed would change nothing
for node in ('/dev/null', '/dev/zero', '/dev/urandom'):
    now = os.stat(node)
    for change in (lambda: os.chmod(node, now.st_mode & 0o7777),
                   lambda: os.utime(node, ns=(now.st_atime_ns, now.st_mtime_ns))):
        try:
            change()
            changed.append(node)
        except OSError:
            pass
with open('/dev/null', 'w') as f:
    f.write('a device still works')
mounts = [line.split() for line in open('/proc/self/mountinfo')]
folders = [m[4] for m in mounts if not stat.S_ISCHR(os.stat(m[4]).st_mode)]
writable = sorted(m[4] for m in mounts if m[4] in folders and 'rw' in m[5].split(','))
"""
FIND_PLANTED = f"""import os, sys
spots = {SPOTS!r} + (os.path.dirname(os.__file__), sys.prefix, os.path.expanduser('~'))
found = [spot for spot in spots if os.path.exists(os.path.join(spot, 'forge-planted'))]
"""


def test_a_job_writes_nowhere_but_its_scratch_and_the_next_student_finds_nothing():
    """Everything in the sandbox but /tmp and /dev/shm (watched, emptied after every job) is
    mounted read-only: the root and /dev, tmpfs of bwrap's own, included. No job can change a
    device node's mode or times (the host's own, were it bound from /dev), and nothing one
    student writes anywhere reaches the next student graded by the same warm worker."""
    if sandbox.isolation() != "bubblewrap":
        pytest.skip("the read-only file system comes with bubblewrap")
    host_null = os.stat("/dev/null")
    names = ["written", "changed", "writable"]
    with sandbox.Session(LIMITS) as box:
        planted = box.run({"prelude": "", "answer": PLANT_EVERYWHERE, "variables": names})
        box.begin()  # the next student, in the same warm worker
        probe = box.run({"prelude": "", "answer": FIND_PLANTED, "variables": ["found"]})
    values = next(m["variables"] for m in planted.messages if "variables" in m)
    assert values["written"] == ["/tmp", "/dev/shm", "/tmp"], values  # the last: HOME is /tmp
    assert values["changed"] == [], values
    # procfs (its files are per process) and devpts (a pty lives as long as its holder)
    assert values["writable"] == ["/dev/pts", "/dev/shm", "/proc", "/tmp"], values
    assert {"variables": {"found": []}} in probe.messages, probe
    now = os.stat("/dev/null")
    assert (now.st_mode, now.st_mtime) == (host_null.st_mode, host_null.st_mtime)
