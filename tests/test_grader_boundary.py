"""The grader's trust boundary, attacked as a determined class would, graded as one class.

Every attack here is a copy of the solved chapter 04 example with one answer cell replaced. The
class runs once, with the default ``--jobs``; each attack must end its targeted exercise with
a named status and zero points, leave the other exercises graded, and leave the run, the other
students and the outputs intact. Kinds of attack (each with several cases of its own):

* reaching an answer: the references, the checks' grader half, the course's files or history
  are not in the sandbox, whatever the spelling;
* one exercise controlling the next: files planted in the working folder or ``/tmp``;
* one student controlling the next, graded after them by the same warm worker: files, folders
  made unreadable, a folder's mode, a process that outlives its job;
* forging the worker's messages: lines it never writes, duplicated results, huge numbers,
  deep nesting;
* refused at run time: memory searches, native libraries, trace hooks;
* totals per submission, enforced while it runs: files, bytes, CPU time, open files in one
  process and across processes, processes and threads;
* names and text that would break a writer: formula-like, multi-line, over-long, not UTF-8,
  lone surrogates, symbolic links.
"""

import csv
import json
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from forge_course.grader import run, sandbox, text
from tests.conftest import REPO

pytestmark = pytest.mark.slow

CH = "ch04_one_training_step"
HAND, TRAIN, QUESTIONS = "ch04_hand_step", "ch04_train_step", "ch04_questions"
HAND_TEST, TRAIN_TEST = "ch04_hand_step_tests", "ch04_train_step_tests"
SOLVED = REPO / "autograder" / "examples" / "alice" / CH / f"{CH}.ipynb"
# 6 CPU-seconds: the twelve busy processes spend them in under 20 s of wall clock even when the
# sandbox gets a third of a core (a loaded CI machine); the solution spends 0.6 (RESULTS.md).
LIMITS = sandbox.Limits(seconds=20, cpu_seconds=6, files=2000)
STEP = "def train_step(model, optimizer, loss_fn, x, y):\n"
WRONG = STEP + "    return 0.0\n"


def submit(submitted, student, answers):
    nb = nbformat.read(SOLVED, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    path = submitted / student / CH / f"{CH}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def _answer_with(body: str) -> str:
    """A train_step that runs ``body`` (which sets ``got``) and returns it."""
    indented = "".join(f"    {line}\n" for line in body.splitlines())
    return STEP + indented + "    return got\n"


# Lines written to every descriptor that may be the channel to the grader.
FORGE = (
    "for fd in range(3, 40):\n    try:\n        os.write(fd, b'\\n{}')\n"
    "    except OSError:\n        pass\n"
)
SETUP_ERROR = '{\\"setup_error\\": \\"RuntimeError: CUDA error: the GPU of the grader\\"}\\n'
DONE = '{\\"done\\": true}\\n'
EXIT = "pkgutil.resolve_name('os._exit')(0)\n"  # a spelling the static scan cannot see

KEPT = "import traceback\n\n\nclass Kept:\n    frames = []\n    error = ValueError('kept')\n\n\n"

HONEST_READERS = """import collections, enum, logging, traceback


def train_step(model, optimizer, loss_fn, x, y):
    log = logging.getLogger("student")
    log.warning("one step")
    log.warning("one step", stack_info=True)
    traceback.format_stack()
    collections.namedtuple("Pair", "a b")
    enum.Enum("Colour", "RED GREEN")
    try:
        raise ValueError("caught")
    except ValueError:
        traceback.format_exc(limit=2)
        traceback.format_exc()
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
"""

# name -> (answers, {test: status it must end with}); tests not named must score full.
ATTACKS = {
    # Reaching an answer: nothing of the references, the grader half or the course is inside.
    "resolve_reference": ({TRAIN: "import pkgutil\n" + _answer_with(
        "ref = pkgutil.resolve_name('forge_course.reference.step')\n"
        "got = ref.train_step.__wrapped__(model, optimizer, loss_fn, x, y)")},
        {TRAIN_TEST: "wrong"}),
    "reference_as_the_answer": ({TRAIN: "import pkgutil\ntrain_step = pkgutil.resolve_name("
        "'forge_course.reference.step:train_step').__wrapped__\n"}, {TRAIN_TEST: "wrong"}),
    "reference_in_a_thread": ({TRAIN: "import threading, pkgutil\n" + _answer_with(
        "out = []\nref = lambda: pkgutil.resolve_name('forge_course.reference.step:train_step')\n"
        "t = threading.Thread(target=lambda: out.append(ref().__wrapped__(model, optimizer, "
        "loss_fn, x, y)))\nt.start()\nt.join()\ngot = out[0]")}, {TRAIN_TEST: "wrong"}),
    "grader_half": ({TRAIN: "import pkgutil\n" + _answer_with(
        "g = pkgutil.resolve_name('forge_course.grading.ch04')\n"
        "got = g.TRAIN_STEP.reference(model, optimizer, loss_fn, x, y)")}, {TRAIN_TEST: "wrong"}),
    "read_course_files": ({TRAIN: _answer_with(
        f"got = float(len(open({str(REPO / 'forge_course/reference/step.py')!r}).read()))")},
        {TRAIN_TEST: "wrong"}),
    "git_history": ({TRAIN: "import pkgutil\n" + _answer_with(
        "sp = pkgutil.resolve_name('subprocess')\n"
        f"got = sp.run(['git', '-C', {str(REPO)!r}, 'show', 'HEAD:forge_course/reference/step.py'],"
        " capture_output=True, check=True).stdout.decode()")}, {TRAIN_TEST: "wrong"}),
    # One exercise controlling the next: planted modules never reach the next worker.
    "plant_modules": ({HAND: "import os\nfor folder in ('.', '/tmp'):\n"
        "    os.makedirs(f'{folder}/forge_course/observe', exist_ok=True)\n"
        "    open(f'{folder}/torch.py', 'w').write('raise SystemExit')\n"
        "    open(f'{folder}/forge_course/observe/ch04.py', 'w').write("
        "'def observe_train_step(fn, case): return {}')\n"
        "def hand_step(W, b, x, t, lr):\n    raise NotImplementedError()\n"},
        {HAND_TEST: "wrong"}),
    "plant_sitecustomize": ({HAND: "open('sitecustomize.py', 'w').write('import os; os._exit(0)')\n"
        "open('/tmp/usercustomize.py', 'w').write('import os; os._exit(0)')\n"
        "def hand_step(W, b, x, t, lr):\n    raise NotImplementedError()\n"},
        {HAND_TEST: "wrong"}),
    "leave_a_process": ({HAND: "import os, pkgutil\nif pkgutil.resolve_name('os.fork')() == 0:\n"
        "    os.execv('/bin/sleep', ['sleep', '61.5'])\n"
        "def hand_step(W, b, x, t, lr):\n    raise NotImplementedError()\n"},
        {HAND_TEST: "wrong"}),
    # Forged messages: lines the worker never writes make the exercise tampered.
    "forged_line": ({TRAIN: "import os\n" + _answer_with(
        "for fd in range(3, 40):\n"
        "    try:\n        os.write(fd, b'{\"case\": 0, \"observation\": 1}\\n')\n"
        "    except OSError:\n        pass\ngot = 0.0")},
        {TRAIN_TEST: "tampered"}),
    # A status of the grader's own claimed: a set-up error, which reads as the grader's fault,
    # by a line on the channel, and then an exit before the worker says more.
    "forged_setup_error": ({TRAIN: "import os\n" + _answer_with(FORGE.format(
        SETUP_ERROR) + "got = 0.0")}, {TRAIN_TEST: "tampered"}),
    "forged_setup_error_and_end": ({TRAIN: "import os, pkgutil\n" + _answer_with(FORGE.format(
        SETUP_ERROR + DONE) + EXIT)}, {TRAIN_TEST: "tampered"}),
    "forged_setup_error_for_questions": ({QUESTIONS: "import os, pkgutil\n" + FORGE.format(
        SETUP_ERROR + DONE) + "grad_multiple, softmax_answer = 7, 'a'\n" + EXIT},
        dict.fromkeys(["ch04_q_grad_multiple", "ch04_q_softmax"], "tampered")),
    # A limit is told by what refused the answer, never by the words of an error it raised.
    "limit_words_in_an_error": ({TRAIN: _answer_with(
        "raise ValueError('MemoryError, BlockingIOError, [Errno 24]')")}, {TRAIN_TEST: "wrong"}),
    "huge_integer": ({TRAIN: _answer_with("got = 10 ** 5000")}, {TRAIN_TEST: "wrong"}),
    "deep_nesting": ({TRAIN: _answer_with(
        "got = []\nfor _ in range(5000):\n    got = [got]")}, {TRAIN_TEST: "wrong"}),
    # Refused at run time, however it is spelled.
    "memory_search": ({TRAIN: "import pkgutil\n" + _answer_with(
        "objects = pkgutil.resolve_name('gc.get_objects')()\ngot = 0.0")},
        {TRAIN_TEST: "tampered"}),
    "native_library": ({TRAIN: "import pkgutil\n" + _answer_with(
        "libc = pkgutil.resolve_name('ctypes.CDLL')(None)\ngot = float(libc.getpid())")},
        {TRAIN_TEST: "tampered"}),
    "trace_hook": ({TRAIN: "import threading\n" + _answer_with(
        "threading.setprofile(None)\nimport pkgutil\n"
        "pkgutil.resolve_name('sys.settrace')(lambda *a: None)\ngot = 0.0")},
        {TRAIN_TEST: "tampered"}),
    # The cell's own exception, raised through the worker and kept: its traceback leads to the
    # worker's frames (the job's hidden cases, the observer, the channel) only through a frame,
    # and traceback's summaries read frames for themselves, not for a function slipped between.
    "frames_through_map": ({TRAIN: KEPT + STEP + "    traceback.StackSummary.extract(map(\n"
        "        Kept.frames.append, traceback.walk_tb(Kept.error.__traceback__)))\n"
        "    return float(len(Kept.frames))\nraise Kept.error\n"}, {TRAIN_TEST: "tampered"}),
    "frames_through_filter": ({TRAIN: KEPT + STEP + "    list(traceback.StackSummary._extract_"
        "from_extended_frame_gen(filter(\n        Kept.frames.append, traceback._walk_tb_with_"
        "full_positions(Kept.error.__traceback__))))\n    return float(len(Kept.frames))\n"
        "raise Kept.error\n"}, {TRAIN_TEST: "tampered"}),
    "locals_through_a_summary": ({TRAIN: KEPT + STEP + "    summary = traceback.TracebackException("
        "\n        ValueError, Kept.error, Kept.error.__traceback__, capture_locals=True)\n"
        "    return float(len(str([f.locals for f in summary.stack])))\nraise Kept.error\n"},
        {TRAIN_TEST: "tampered"}),
    # The readers trusted with a frame, turned: a name one of them hands its frame to, rebound
    # (logging's own test of each frame), and a reader's code run over names of the answer's.
    "frames_through_a_logging_global": ({TRAIN: KEPT + "import logging\n\n\n" + STEP
        + "    real = logging._is_internal_frame\n"
        "    logging._is_internal_frame = lambda f: Kept.frames.append(f) or real(f)\n"
        "    try:\n        logging.getLogger('x').findCaller()\n    finally:\n"
        "        logging._is_internal_frame = real\n    return float(len(Kept.frames))\n"},
        {TRAIN_TEST: "tampered"}),
    "frames_through_a_copied_reader": ({TRAIN: KEPT + "import types\n\n\n" + STEP
        + "    names = dict(vars(traceback), walk_stack=lambda f: Kept.frames.append(f) or ())\n"
        "    types.FunctionType(traceback.extract_stack.__code__, names, 'x', (None, None))()\n"
        "    return float(len(Kept.frames))\n"}, {TRAIN_TEST: "tampered"}),
    # ... while the library's own uses of them, in a correct answer, are left alone.
    "library_frame_readers_used_honestly": ({TRAIN: HONEST_READERS}, {}),
    "shared_memory": ({HAND: "import pkgutil\n"
        "pkgutil.resolve_name('multiprocessing.shared_memory.SharedMemory')("
        "name='forge-boundary-probe', create=True, size=1 << 20)\n"
        "def hand_step(W, b, x, t, lr):\n    raise NotImplementedError()\n"},
        {HAND_TEST: "wrong"}),
    # Totals per submission, enforced while it runs.
    "many_files": ({HAND: "import os\nos.makedirs('d', exist_ok=True)\n"
        "for i in range(100_000):\n    open(f'd/{i}', 'w').close()\n"
        "def hand_step(W, b, x, t, lr):\n    raise NotImplementedError()\n"},
        {HAND_TEST: "resource limit"}),
    # Twelve busy processes: the scheduler shares a loaded machine per process, so together
    # they reach the CPU limit well before the exercise's wall clock runs out.
    "cpu_in_processes": ({HAND: "import os, time, pkgutil\n"
        "for _ in range(11):\n    if pkgutil.resolve_name('os.fork')() == 0:\n"
        "        end = time.time() + 30\n        while time.time() < end: pass\n"
        "end = time.time() + 30\nwhile time.time() < end: pass\n"
        "def hand_step(W, b, x, t, lr):\n    raise NotImplementedError()\n"},
        # The CPU time is the submission's: once spent, nothing more of it runs.
        dict.fromkeys([HAND_TEST, TRAIN_TEST, "ch04_q_grad_multiple", "ch04_q_softmax"],
                      "resource limit")),
    "open_files": ({TRAIN: _answer_with(
        "files = [open('/dev/null') for _ in range(20_000)]\ngot = 0.0")},
        {TRAIN_TEST: "resource limit"}),
    # Each of 9 processes stays under the per-process cap; together they are over the total.
    "open_files_in_processes": ({HAND: "import os, time, pkgutil\n"
        "for _ in range(8):\n    if pkgutil.resolve_name('os.fork')() == 0:\n        break\n"
        "held = [open('/dev/null') for _ in range(800)]\ntime.sleep(30)\n"
        "def hand_step(W, b, x, t, lr):\n    raise NotImplementedError()\n"},
        {HAND_TEST: "resource limit"}),
    "many_threads": ({HAND: "import threading, time\nfor _ in range(200):\n"
        "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "def hand_step(W, b, x, t, lr):\n    raise NotImplementedError()\n"},
        {HAND_TEST: "resource limit"}),
    # Files under the per-file limit, a full disk ignored: the total is what counts.
    "many_bytes": ({TRAIN: _answer_with(
        "for i in range(16):\n    try:\n"
        "        open(f'/tmp/b{i}', 'wb').write(b'x' * (8 << 20))\n"
        "    except OSError:\n        pass\ngot = 0.0")},
        {TRAIN_TEST: "resource limit"}),
    # A cell the parser gives up on: that cell is refused, the others graded, the run goes on.
    "deep_source": ({TRAIN: "got = a" + "[0]" * 45000 + "\n"}, {TRAIN_TEST: "malformed"}),
    "deep_question": ({QUESTIONS: "f" + "()" * 60000 + "\n"},
        dict.fromkeys(["ch04_q_grad_multiple", "ch04_q_softmax"], "malformed")),
    # Text that would break a writer: it is stored, bounded and valid.
    "surrogate_message": ({TRAIN: _answer_with(
        "raise ValueError('\\ud800' * 10 + '=1+1' * 10**6)")},
        {TRAIN_TEST: "wrong"}),
}  # fmt: skip
# Found by a red team, one answer cell each (tests/attacks/settings): wrong steps that hide
# what they left changed from the check, with a method set on the model object, state the
# check did not note (hooks for every module, saved-tensor hooks, warn-always), or a torch
# function mode left pushed that tidies up at the check's first tensor operation.
ATTACKS.update(
    {
        p.stem: ({TRAIN: p.read_text()}, {TRAIN_TEST: "wrong"})
        for p in sorted((REPO / "tests/attacks/settings").glob("*.cell"))
    }
)

# Holes found and still open, each answer returning REACHED where it got what it should not.
REACHED = 424242.0
# From any frame of the answer's own, `f_back` leads to the job's (its cases, its channel). Each
# answer below tries one way to get hold of a frame with no audit event on the way (a signal
# handler is handed the one it interrupted; gc.garbage keeps what a collection found
# unreachable under DEBUG_SAVEALL) and returns REACHED if it found the job's.
CLIMB = (
    "    frame = got[0] if got else None\n"
    "    while frame is not None and 'job' not in frame.f_locals:\n"
    "        frame = getattr(frame, 'f_' + 'back')\n"
    f"    return {REACHED} if frame is not None else 0.0\n"
)
GRAB = "    got = []\n    grab = lambda number, frame: got.append(frame)\n"
# Each written past the grader's reading of the source (which would refuse it as tampering),
# to show what the sandbox does when it runs.
EVADE = ("import os, pkgutil\nsignal = pkgutil.resolve_name('_' + 'signal')\n"
         "fork, leave = getattr(os, 'fo' + 'rk'), getattr(os, '_ex' + 'it')\n")  # fmt: skip
SIGNALS = {
    "signal_raised": EVADE + STEP + GRAB
        + "    signal.signal(signal.SIGUSR1, grab)\n    signal.raise_signal(signal.SIGUSR1)\n",
    "signal_from_a_timer": EVADE + "import time\n" + STEP + GRAB
        + "    signal.signal(signal.SIGALRM, grab)\n"
        "    signal.setitimer(signal.ITIMER_REAL, 0.01)\n"
        "    end = time.monotonic() + 2\n    while not got and time.monotonic() < end:\n"
        "        pass\n",
    "signal_from_a_child_that_ends": EVADE + "import time\n" + STEP + GRAB
        + "    signal.signal(signal.SIGCHLD, grab)\n    pid = fork()\n"
        "    if pid == 0:\n        leave(0)\n    os.waitpid(pid, 0)\n    time.sleep(0.1)\n",
    "signal_module_made_afresh": EVADE + STEP + GRAB
        + "    machinery = pkgutil.resolve_name('importlib.' + 'machinery')\n"
        "    spec = machinery.BuiltinImporter.find_spec('_' + 'signal')\n"
        "    fresh = pkgutil.resolve_name('importlib.' + 'util').module_from_spec(spec)\n"
        "    spec.loader.exec_module(fresh)\n"
        "    fresh.signal(fresh.SIGUSR2, grab)\n    fresh.raise_signal(fresh.SIGUSR2)\n",
    # No new handler: the cells of every handler in place that is Python code now call `grab`.
    "signal_handlers_in_place_rewired": EVADE + STEP + GRAB
        + "    for number in signal.valid_signals():\n"
        "        handler = signal.getsignal(number)\n"
        "        for cell in getattr(handler, '__closure__', None) or ():\n"
        "            cell.cell_contents = grab\n"
        "            signal.raise_signal(number)\n",
    # A forked child holds a copy of the job's frames: it reports what it reached on a pipe.
    "signal_in_a_forked_child": EVADE + STEP + GRAB
        + "    read, write = os.pipe()\n    pid = fork()\n    if pid == 0:\n"
        "        try:\n            signal.signal(signal.SIGUSR1, grab)\n"
        "            signal.raise_signal(signal.SIGUSR1)\n"
        "            frame = got[0]\n"
        "            while frame is not None and 'job' not in frame.f_locals:\n"
        "                frame = getattr(frame, 'f_' + 'back')\n"
        "            os.write(write, b'y' if frame is not None else b'n')\n"
        "        finally:\n            leave(0)\n"
        "    os.close(write)\n    os.waitpid(pid, 0)\n"
        f"    return {REACHED} if os.read(read, 1) == b'y' else 0.0\n",
}  # fmt: skip
# A frame outlives its call in a cycle through a traceback; DEBUG_SAVEALL keeps it.
CYCLE = ("def _cycle():\n    try:\n        raise ValueError\n"
         "    except ValueError as e:\n        k = e\n")  # fmt: skip
SAVED = ("    _cycle()\n    gc.set_debug(gc.DEBUG_SAVEALL)\n    gc.collect()\n    gc.set_debug(0)\n"
         "    got = [o for o in gc.garbage if type(o).__name__ == 'frame']\n")  # fmt: skip
FRAMES = {
    **SIGNALS,
    "gc_keeps_a_frame": "import pkgutil\ngc = pkgutil.resolve_name('g' + 'c')\n" + CYCLE
        + STEP + SAVED,
    "gc_made_afresh_keeps_a_frame": EVADE + CYCLE + STEP
        + "    machinery = pkgutil.resolve_name('importlib.' + 'machinery')\n"
        "    spec = machinery.BuiltinImporter.find_spec('g' + 'c')\n"
        "    gc = pkgutil.resolve_name('importlib.' + 'util').module_from_spec(spec)\n"
        "    spec.loader.exec_module(gc)\n" + SAVED,
    "gc_reloaded_keeps_a_frame": EVADE + CYCLE + STEP
        + "    gc = pkgutil.resolve_name('importlib').reload(pkgutil.resolve_name('g' + 'c'))\n"
        + SAVED,
    "gc_callbacks_cleared_first": "import pkgutil\ngc = pkgutil.resolve_name('g' + 'c')\n"
        + CYCLE + STEP + "    gc.callbacks.clear()\n" + SAVED,
    "signal_module_reloaded": EVADE + STEP + GRAB
        + "    fresh = pkgutil.resolve_name('importlib').reload(signal)\n"
        "    fresh.signal(fresh.SIGUSR1, grab)\n    fresh.raise_signal(fresh.SIGUSR1)\n",
}  # fmt: skip
FRAMES = {name: {TRAIN: answer + CLIMB} for name, answer in FRAMES.items()}
# Found by red teams, one answer cell each (tests/attacks/frames): code run inside the audit
# hook through a module attribute it looked up (catch_warnings, islice), a rebound consumer of
# traceback's walk (deque), built-in modules made afresh from libpython's init functions, C
# iterators that take a frame while a trusted reader (namedtuple, enum) consumes them, and
# torch's frame evaluation hook (every new frame's locals and closure, the audit hook's too;
# its "run only" mode hands them to the guards of entries loaded for a code object).
CELL_FRAMES = {
    p.stem: p.read_text() for p in sorted((REPO / "tests/attacks/frames").glob("*.cell"))
}
FRAMES.update(
    {
        name: {TRAIN: cell.replace("REACHED_IF_FOUND", f"{REACHED} if _f is not None else 0.0")}
        for name, cell in CELL_FRAMES.items()
    }
)

NAMES = [  # folder names no tool downstream should see as they are
    '=HYPERLINK("http:x","y")',  # (a folder name holds no slash)
    "+1+1",
    "-2",
    "@SUM(A1)",
    "\tTAB",
    'line\nbreak,"other",7',
    "x" * 251,
    "é-normal_name.1",
]


def _class(submitted):
    for name, (answers, _) in ATTACKS.items():
        submit(submitted, name, answers)
    for name, answers in FRAMES.items():
        submit(submitted, name, answers)
    submit(submitted, "solved", {})
    submit(submitted, "wrong", {TRAIN: WRONG})
    for name in NAMES:
        submit(submitted, name, {})
    # Symbolic links: a notebook linked to the instructor's copy, a folder linked to another's.
    (submitted / "linked_notebook" / CH).mkdir(parents=True)
    (submitted / "linked_notebook" / CH / f"{CH}.ipynb").symlink_to(SOLVED)
    (submitted / "linked_folder").symlink_to(submitted / "solved")
    bad = os.fsencode(str(submitted)) + b"/not-utf8-\xff"
    os.makedirs(os.fsdecode(bad) + f"/{CH}")
    shutil.copy(SOLVED, os.fsdecode(bad) + f"/{CH}/{CH}.ipynb")
    # A notebook whose answer cell's source is not text, and one with a forged test cell.
    nb = json.loads(SOLVED.read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == TRAIN:
            cell["source"] = {"not": "text"}
    (submitted / "odd_source" / CH).mkdir(parents=True)
    (submitted / "odd_source" / CH / f"{CH}.ipynb").write_text(json.dumps(nb))
    # An extra cell claiming a test's id, to replace the test's text in the autograded copy.
    path = submit(submitted, "forged_test_cell", {TRAIN: WRONG})
    nb = nbformat.read(path, as_version=4)
    forged = nbformat.v4.new_code_cell("print('all tests passed')")
    forged.metadata["nbgrader"] = {"grade_id": TRAIN_TEST, "solution": True, "grade": False}
    nb.cells.append(forged)
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("boundary")
    grading = root / "grading"
    _class(grading / "submitted")
    outcomes = run.grade([CH], grading=grading, limits=LIMITS, progress=False, unsafe=True,
                         seed=1234)  # fmt: skip
    return grading, outcomes


def _by_folder(outcomes):
    return {student: results for (student, _), results in outcomes.items()}


def test_every_attack_scores_zero_with_its_status_and_the_rest_is_graded(graded):
    _, outcomes = graded
    results = _by_folder(outcomes)
    assert all(r["status"] == "graded" for r in results["solved"].values())
    assert results["wrong"][TRAIN_TEST]["status"] == "wrong"
    problems = []
    for name, (_, targeted) in ATTACKS.items():
        for test, r in results[name].items():
            want = targeted.get(test, "graded")
            if r["status"] != want or (want != "graded") != (r["points"] == 0):
                problems.append(f"{name}: {test} is {r['status']} ({r['message'][:200]})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", FRAMES)
def test_no_answer_gets_hold_of_a_frame_of_the_job(graded, name):
    _, outcomes = graded
    result = _by_folder(outcomes)[name][TRAIN_TEST]
    assert f"{REACHED:g}" not in result["message"], result["message"]
    assert result["status"] in ("wrong", "tampered") and result["points"] == 0, result


def test_the_autograded_copy_keeps_every_test_cell_of_the_instructor(graded):
    grading, outcomes = graded
    assert _by_folder(outcomes)["forged_test_cell"][TRAIN_TEST]["status"] == "wrong"
    copy = grading / "autograded" / "forged_test_cell" / CH / f"{CH}.ipynb"
    cells = [c for c in nbformat.read(copy, as_version=4).cells
             if c.metadata.get("nbgrader", {}).get("grade_id") == TRAIN_TEST]  # fmt: skip
    assert len(cells) == 1 and "check_train_step" in cells[0].source


def test_links_and_unreadable_cells_are_refused_and_named(graded):
    _, outcomes = graded
    results = _by_folder(outcomes)
    for name in ("linked_notebook", "odd_source"):
        assert {r["status"] for r in results[name].values()} == {"malformed"}, results[name]
    linked = results[run.student_id("linked_folder")]
    assert {r["status"] for r in linked.values()} == {"malformed"}


def test_every_student_once_under_a_safe_id_and_no_cell_is_a_formula(graded):
    grading, outcomes = graded
    students = [s for s, _ in outcomes]
    assert len(students) == len(set(students)) == len(ATTACKS) + len(FRAMES) + len(NAMES) + 7
    for student in students:
        assert len(student) <= 64 and student[0] not in "-.=+@" and "\n" not in student
    for name in NAMES:
        assert all(
            r["status"] == "graded" for r in _by_folder(outcomes)[run.student_id(name)].values()
        )
    ids = list(csv.DictReader((grading / "student_ids.csv").open(encoding="utf-8")))
    assert len(ids) == sum(run.student_id(n) != n for n in NAMES) + 1  # + the one not UTF-8
    rows = list(csv.reader((grading / "grades.csv").open(encoding="utf-8")))
    exported_csv = grading / "export.csv"
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", "export", "--to", str(exported_csv)],
        cwd=REPO / "autograder", capture_output=True, text=True, timeout=120,
        env={**os.environ, "FORGE_GRADING_DIR": str(grading),
             "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows += list(csv.reader(exported_csv.open(encoding="utf-8")))
    for row in rows:
        for cell in row:
            assert not cell.startswith(text.FORMULA_START), row
            assert len(cell) < 3000
    exported = [r["student_id"] for r in csv.DictReader(exported_csv.open(encoding="utf-8"))]
    assert sorted(exported) == sorted(students)


def test_nothing_is_left_on_the_host(graded):
    assert not os.path.exists("/dev/shm/forge-boundary-probe")
    leftovers = subprocess.run(["pgrep", "-f", "sleep 61.5"], capture_output=True)
    assert leftovers.stdout == b"", "a process outlived its sandbox"


def test_a_resumed_run_changes_nothing_and_a_forged_entry_is_regraded(graded):
    grading, outcomes = graded
    ledger = run.Ledger(grading / "forge")
    entry = ledger.path(CH, "wrong")
    saved = json.loads(entry.read_text())
    saved["record"]["results"][TRAIN_TEST].update(status="graded", points=3.0)
    entry.write_text(json.dumps(saved))
    again = run.grade([CH], grading=grading, limits=LIMITS, progress=False, unsafe=True,
                      seed=1234)  # fmt: skip
    assert again == outcomes


def test_grading_refuses_to_run_without_a_sandbox_unless_told(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "isolation", lambda: "process")
    with pytest.raises(run.SandboxUnavailable, match="bubblewrap"):
        run.grade([CH], grading=tmp_path, progress=False)


# One student controlling the next: a warm worker grades one submission after another, so
# whatever the first leaves in its sandbox (files, unreadable folders, a process that
# outlives its job, zombies, /tmp made read-only, folders nested past the longest path) would reach
# the second. The planters leave what they
# can; each probe, graded next by the same worker, fails its exercise if it finds any of it.
PLANT = """import os, pkgutil, sys, time
os.makedirs('/tmp/forge-planted-locked/inner', exist_ok=True)
open('/tmp/forge-planted-locked/inner/answer', 'w').write('42')
os.chmod('/tmp/forge-planted-locked/inner', 0)
os.chmod('/tmp/forge-planted-locked', 0o100)
open('/tmp/forge-planted-file', 'w').write('42')
open('/dev/shm/forge-planted-shm', 'w').write('42')
os.makedirs(os.path.expanduser('~/.cache'), exist_ok=True)
open(os.path.expanduser('~/.cache/forge-planted-home'), 'w').write('42')
start = pkgutil.resolve_name('sub' + 'process.Popen')  # past the static scan
start([sys.executable, '-c', 'import time\\nwhile True:\\n'
       '    open(\\'/tmp/forge-planted-lingering\\', \\'w\\').close()\\n    time.sleep(0.02)'],
      start_new_session=True)
time.sleep(0.5)
assert os.path.exists('/tmp/forge-planted-lingering')
"""
LOCK = "import os\nos.chmod('/dev/shm', 0o500)\nos.chmod('/tmp', 0o500)\n"
NEST = """import os
here = os.getcwd()
os.chdir('/tmp')
for _ in range(25):  # past the longest path (4096 bytes) that a folder's name may have
    os.mkdir('forge-planted-deep' + 'x' * 200)
    os.chdir('forge-planted-deep' + 'x' * 200)
open('answer', 'w').write('42')
os.chdir(here)
"""
# The job replaces itself with a fresh interpreter (no audit hook, the job's pid, still the
# server's child), which makes processes the server's children too (clone's CLONE_PARENT): each
# burns CPU and exits, a zombie until the server reaps it, seen in /proc by every later job.
ZOMBIES = """import pkgutil, sys
CODE = '''
import ctypes, os, time
libc = ctypes.CDLL(None)
libc.syscall.restype = ctypes.c_long
for _ in range(40):
    if libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0) == 0:  # clone(CLONE_PARENT | SIGCHLD)
        end = time.process_time() + 0.1
        while time.process_time() < end:
            pass
        os._exit(0)
time.sleep(3)
os._exit(0)
'''
pkgutil.resolve_name('os.execv')(sys.executable, [sys.executable, '-I', '-c', CODE])
"""
PROBE = """import os, time
time.sleep(0.3)
def _traces():
    found = []
    for top in ('/tmp', '/dev/shm'):
        device = os.stat(top).st_dev
        for root, folders, files in os.walk(top, onerror=found.append):
            folders[:] = [f for f in folders
                          if os.lstat(os.path.join(root, f)).st_dev == device]
            found += [name for name in folders + files if 'planted' in name]
        if not os.access(top, os.W_OK):
            found.append(top + ' is not writable')
    return found
assert not _traces(), _traces()
"""


def test_one_student_leaves_nothing_for_the_next(tmp_path):
    if sandbox.isolation() != "bubblewrap":
        pytest.skip("without bubblewrap every submission gets a fresh worker")
    solved = _solved(HAND)
    submitted = tmp_path / "submitted"
    # (in train_step's cell: hand_step's check refuses an answer that starts a process)
    submit(submitted, "a_planter", {TRAIN: PLANT + _solved(TRAIN)})
    submit(submitted, "b_probe", {HAND: PROBE + solved, TRAIN: PROBE + _solved(TRAIN)})
    submit(submitted, "c_locker", {HAND: LOCK + solved})
    submit(submitted, "d_probe", {HAND: PROBE + solved})
    submit(submitted, "e_nester", {HAND: NEST + solved})
    submit(submitted, "f_probe", {HAND: PROBE + solved})
    submit(submitted, "g_zombies", {HAND: ZOMBIES + solved})
    submit(submitted, "h_probe", {HAND: PROBE + solved, TRAIN: PROBE + _solved(TRAIN)})
    # One job at a time: one warm worker grades them in this order.
    outcomes = run.grade([CH], submitted=submitted, grading=tmp_path / "grading", jobs=1,
                         limits=LIMITS, progress=False, seed=1234)  # fmt: skip
    for planter, test in [("a_planter", TRAIN_TEST), ("e_nester", HAND_TEST)]:
        assert outcomes[(planter, CH)][test]["status"] == "graded"  # it planted all it meant to
    for probe in ("b_probe", "d_probe", "f_probe", "h_probe"):
        results = outcomes[(probe, CH)]
        assert all(r["status"] == "graded" for r in results.values()), results
    assert not subprocess.run(["pgrep", "-f", "forge-planted"], capture_output=True).stdout


def _solved(grade_id: str) -> str:
    cells = nbformat.read(SOLVED, as_version=4).cells
    return next(
        c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
    )


REPLACED_ONCE_CLOSED = """
import _imp, _signal, gc, importlib
import matplotlib, torch, torch._dynamo
from forge_course.grader import worker
for chapter in range(14):
    importlib.import_module(f"forge_course.observe.ch{chapter:02d}")
real = [_signal.signal, gc.set_debug, _imp.create_builtin, _imp.exec_builtin, _imp.create_dynamic,
        torch._C._dynamo.eval_frame.set_eval_frame]
worker._close_unaudited_routes_to_frames()
# Held by nothing but the generators that keep create_dynamic and set_eval_frame (their frames
# cannot be read).
print(*(len([r for r in gc.get_referrers(fn) if r is not real and type(r).__name__ != "generator"])
        for fn in real))
importlib.import_module("_lzma")  # an extension module not loaded before: still loads
model = torch.nn.Linear(2, 2)  # an optimizer's step turns torch's frame hook off and back: it runs
model(torch.ones(1, 2)).sum().backward()
torch.optim.AdamW(model.parameters()).step()
try:
    torch.compile(lambda x: x + 1)(torch.ones(1))
except RuntimeError as refused:
    print("compile:", "frame evaluation hook" in str(refused))
"""


def test_nothing_in_a_job_still_holds_the_functions_it_replaced():
    """`signal.signal`, `gc.set_debug`, the ways to make a built-in module afresh and torch's
    frame evaluation hook are replaced in a job by functions that refuse: no module, closure
    or object that torch, the observers or the standard library hold still refers to the real
    ones."""
    done = subprocess.run([sys.executable, "-c", REPLACED_ONCE_CLOSED], cwd=REPO,
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.split() == ["0"] * 6 + ["compile:", "True"], done.stdout + done.stderr
