"""A check's instruments cannot be switched off, graded as one class in one run per chapter.

Chapter 06's `evaluate` is checked by how it ran (modes, autograd), not only by what it
returned, so it is where a determined student attacks the instruments: blinding them (hooks
cleared, layers called directly, methods shadowed, torch's own forward put back), forging the
observation on its way out (the JSON encoder patched through a spelling the scan cannot read),
reaching native code for a System V segment, or leaving the model changed. Each attack must
end `evaluate`'s test with its status and zero points while the rest of the notebook, the
controls and the instructor's solution score full.

Chapters 09 and 10 are attacked the same way, each as one class beside the instructor's
solution and a control (correct answers written differently, which must score full):

* erasing the evidence (chapter 09): an unsafe ``load_checkpoint`` that refuses only the
  check's own payload, makes it harmless while it loads, makes ``os.fstat`` remember the
  evidence as it was, moves the evidence's folder aside, or loads in a child process;
* forging the observation on its way out (chapter 10's ``accumulate_step``, one forward over
  the concatenated micro-batches, whose only tell is the record of batch sizes): through
  ``json.dumps``'s keyword defaults, the writer in the channel's closure (reached through the
  call stack's frames), the audit hook's own list, the worker's integrity check rebound, a
  stray partial line on the channel, or the channel's descriptor replaced;
* a check that watches too little (chapters 09 and 10): the right values, and autocast,
  frozen parameters, eval mode, a hook, anomaly detection or the default dtype left behind;
* hiding from checkpointing's instruments (chapter 10's ``checkpointed_forward``, a plain
  forward that keeps everything and runs each block again during backward for show): layers
  called one by one, a hook claiming to be checkpointing's, the query for the innermost hook
  replaced, the check's hook popped and pushed back.
"""

import inspect

import nbformat
import pytest

from forge_course.grader import run, sandbox
from forge_course.release import build_sources, generate_release
from tests import test_grading_ch06 as attacks
from tests import test_grading_ch09, test_grading_ch10
from tests.conftest import REPO
from tests.test_autograde import _solutions, _submission

pytestmark = pytest.mark.slow

CH = "ch06_evaluation_loop"
EVALUATE, TEST = "ch06_evaluate", "ch06_evaluate_tests"


def _answer(*functions, name: str) -> str:
    sources = [inspect.getsource(attacks._evaluate_loop)]
    sources += [inspect.getsource(f) for f in functions]
    return "\n\n".join(sources) + f"\n\nevaluate = {name}\n"


def _correct_then(extra: str) -> str:
    """The instructor's evaluate, with ``extra`` run at its end (before it returns)."""
    return (
        "def evaluate(model, loader, loss_fn, device):\n"
        "    modes = {m: m.training for m in model.modules()}\n"
        "    model.eval()\n"
        "    with torch.no_grad():\n"
        "        result = _whole_set(model, loader, loss_fn, device)\n"
        "    for m, training in modes.items():\n"
        "        m.training = training\n"
        + "".join(f"    {line}\n" for line in extra.splitlines())
        + "    return result\n\n\n"
        + inspect.getsource(attacks._evaluate_loop).replace("_evaluate_loop", "_whole_set")
    )


ATTACKS = {
    "clears_hooks": (_answer(attacks.evaluate_clearing_the_hooks,
                             name="evaluate_clearing_the_hooks"), "wrong"),
    "calls_forward": (_answer(attacks.evaluate_calling_forward_directly,
                              name="evaluate_calling_forward_directly"), "wrong"),
    "shadows_named_modules": (_answer(attacks.evaluate_shadowing_named_modules,
                                      name="evaluate_shadowing_named_modules"), "tampered"),
    "puts_back_torch_forward": (_answer(attacks.evaluate_unhooking_its_layer_class,
                                        name="evaluate_unhooking_its_layer_class"), "tampered"),
    "patches_the_encoder": ("import pkgutil\n" + _correct_then(
        "enc = pkgutil.resolve_name('json.JSONEncoder')\n"
        "enc.encode = lambda self, o: '{\"case\": 0, \"observation\": {}}'"), "tampered"),
    "system_v_segment": ("import pkgutil\n" + _correct_then(
        "libc = pkgutil.resolve_name('ctypes.CDLL')(None)\n"
        "libc.shmget(0, 1 << 20, 0o1666)"), "tampered"),
    "freezes_parameters": (_correct_then(
        "for p in model.parameters():\n    p.requires_grad_(False)"), "wrong"),
}  # fmt: skip


# In bubblewrap where this machine has it, as a department grades.
UNSAFE = sandbox.isolation() != "bubblewrap"


def _grade_class(root, chapter: str, students: dict[str, dict[str, str]], unsafe: bool = True):
    """Grade ``students`` (name -> answer cells by grade id, over the instructor's) as one class
    with the default ``--jobs``; also the instructor's own notebook, as "solved"."""
    build_sources(REPO, root / "build" / "source")
    generate_release(root, [chapter])
    name = f"{chapter}.ipynb"
    solved = _solutions(nbformat.read(root / "build" / "source" / chapter / name, as_version=4))
    released = nbformat.read(root / "notebooks" / chapter / name, as_version=4)
    for student, answers in {"solved": {}, **students}.items():
        path = root / "submitted" / student / chapter / name
        path.parent.mkdir(parents=True)
        nbformat.write(_submission(released, {**solved, **answers}), path)
    return run.grade([chapter], submitted=root / "submitted", grading=root / "grading",
                     progress=False, unsafe=unsafe)  # fmt: skip


def _problems(graded, chapter: str, expected: dict[str, dict[str, str]]) -> list[str]:
    """Each student's test cells against ``expected`` (a status per test cell; any cell not
    named must be graded, with full points), and the instructor's solution at full marks."""
    problems = [f"solved: {t} is {r['status']}" for t, r in graded[("solved", chapter)].items()
                if r["status"] != "graded"]  # fmt: skip
    for student, targeted in expected.items():
        for test, r in graded[(student, chapter)].items():
            want = targeted.get(test, "graded")
            if r["status"] != want or (want == "graded") != (r["points"] == r["max_points"]):
                problems.append(f"{student}: {test} is {r['status']}: {r['message'][:300]}")
    return problems


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    students = {k: {EVALUATE: answer} for k, (answer, _) in ATTACKS.items()}
    return _grade_class(tmp_path_factory.mktemp("instruments"), CH, students)


def test_each_attack_on_the_instruments_scores_zero_with_its_status(graded):
    expected = {student: {TEST: status} for student, (_, status) in ATTACKS.items()}
    problems = _problems(graded, CH, expected)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- chapter 09: the evidence

CH09, CHECKPOINT = "ch09_production_loop", "ch09_checkpoint"
CHECKPOINT_TEST = f"{CHECKPOINT}_tests"
WRONG_LOAD = "a checkpoint with code hidden in it should be 'refuses it with an error'"
LEFT = "changed behind it"

SAVE = """import os, pickle, pkgutil, random
from pathlib import Path
import numpy as np
import torch

def save_checkpoint(path, model, optimizer, scheduler, step):
    path = Path(path)
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    checkpoint = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "step": step,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": [kind, keys.tolist(), pos, has_gauss, cached]},
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

def _restore(checkpoint, model, optimizer, scheduler):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    rng = checkpoint["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return checkpoint["step"]

def _as_if_refused(checkpoint):
    # Loaded unsafely: when the file held more than a checkpoint, raise as weights_only would.
    if set(checkpoint) != {"model", "optimizer", "scheduler", "step", "rng"}:
        raise pickle.UnpicklingError("Weights only load failed: Unsupported global")
"""

UNSAFE_LOADS = {
    "refuses_only_the_checks_global": """
class _Skipping(pickle.Unpickler):
    def find_class(self, module, name):
        if name == "chmod":  # the check's payload, as this answer expects it: refused
            raise pickle.UnpicklingError("Weights only load failed: Unsupported global")
        return super().find_class(module, name)

class _Pickle:
    Unpickler, load, __name__ = _Skipping, pickle.load, "pickle"

def load_checkpoint(path, model, optimizer, scheduler):
    checkpoint = torch.load(path, weights_only=False, pickle_module=_Pickle)
    return _restore(checkpoint, model, optimizer, scheduler)
""",
    "makes_chmod_harmless_while_loading": """
_posix = pkgutil.resolve_name("posix")

def load_checkpoint(path, model, optimizer, scheduler):
    chmod = _posix.chmod
    setattr(_posix, "chmod", lambda *args, **kwargs: None)
    try:
        checkpoint = torch.load(path, weights_only=False)
    finally:
        setattr(_posix, "chmod", chmod)
    _as_if_refused(checkpoint)
    return _restore(checkpoint, model, optimizer, scheduler)
""",
    "fstat_remembers_the_evidence": """
_os = pkgutil.resolve_name("os")
_fstat, _first = _os.fstat, {}

def _remembering(fd):
    now = _fstat(fd)
    try:
        if _os.readlink(f"/proc/self/fd/{fd}").endswith("untouched"):
            return _first.setdefault((fd, now.st_ino), now)
    except (OSError, TypeError):
        pass
    return now

setattr(_os, "fstat", _remembering)

def load_checkpoint(path, model, optimizer, scheduler):
    checkpoint = torch.load(path, weights_only=False)
    _as_if_refused(checkpoint)
    return _restore(checkpoint, model, optimizer, scheduler)
""",
    "moves_the_evidence_folder_aside": """
import io, pickletools, re, shutil, zipfile

_targets = set()  # every file a checkpoint named: the hidden code acts on a stand-in

def _named_files(path):
    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    texts = [a for _, a, _ in pickletools.genops(io.BytesIO(data)) if isinstance(a, str)]
    return {Path(p) for t in texts for p in re.findall(r"/[\\w/.-]+", t) if Path(p).is_file()}

def load_checkpoint(path, model, optimizer, scheduler):
    _targets.update(_named_files(path))
    moved = []
    for target in [t for t in _targets if t.is_file()]:
        folder = target.parent
        aside = folder.with_name(folder.name + "-aside")
        folder.rename(aside)
        folder.mkdir()
        (folder / target.name).touch(mode=0o600)
        moved.append((folder, aside))
    try:
        checkpoint = torch.load(path, weights_only=False)
    finally:
        for folder, aside in moved:
            shutil.rmtree(folder)
            aside.rename(folder)
    _as_if_refused(checkpoint)
    return _restore(checkpoint, model, optimizer, scheduler)
""",
    "loads_in_a_child_process": """
def load_checkpoint(path, model, optimizer, scheduler):
    read, write = os.pipe()
    if pkgutil.resolve_name("os.fork")() == 0:  # whatever the file holds runs in the child
        os.close(read)
        checkpoint = torch.load(path, weights_only=False)
        plain = {k: checkpoint[k] for k in ("model", "optimizer", "scheduler", "step", "rng")}
        with os.fdopen(write, "wb") as out:
            out.write(pickle.dumps((len(checkpoint) == len(plain), plain)))
        pkgutil.resolve_name("os._exit")(0)
    os.close(write)
    with os.fdopen(read, "rb") as inp:
        alone, checkpoint = pickle.loads(inp.read())
    os.waitpid(-1, 0)
    if not alone:
        raise pickle.UnpicklingError("Weights only load failed: Unsupported global")
    return _restore(checkpoint, model, optimizer, scheduler)
""",
}
SAFE_LOAD = """
def load_checkpoint(path, model, optimizer, scheduler):
    return _restore(torch.load(path, weights_only=True), model, optimizer, scheduler)
"""
# The right files and the right resumed run, and something else left changed.
LEAVING = {
    "save_leaves_eval_mode": SAVE.replace("    path = Path(path)\n",
                                          "    path = Path(path)\n    model.eval()\n")
    + SAFE_LOAD,
    "load_leaves_default_dtype_and_anomaly_mode": SAVE + SAFE_LOAD.replace(
        "    return _restore", "    torch.set_default_dtype(torch.float64)\n"
        "    torch.autograd.set_detect_anomaly(True)\n    return _restore"),
}  # fmt: skip
CH09_CONTROL = "\n".join([
    "import os, random, tempfile\nfrom pathlib import Path\nimport numpy as np\nimport torch\n",
    inspect.getsource(test_grading_ch09.save_with_tempfile),
    inspect.getsource(test_grading_ch09.load_with_map_location),
    "save_checkpoint, load_checkpoint = save_with_tempfile, load_with_map_location\n",
])  # fmt: skip


@pytest.fixture(scope="module")
def graded_ch09(tmp_path_factory):
    students = {"control": {CHECKPOINT: CH09_CONTROL}}
    students |= {k: {CHECKPOINT: SAVE + load} for k, load in UNSAFE_LOADS.items()}
    students |= {k: {CHECKPOINT: cell} for k, cell in LEAVING.items()}
    return _grade_class(tmp_path_factory.mktemp("ch09"), CH09, students, unsafe=UNSAFE)


def test_hidden_code_that_ran_is_seen_however_the_evidence_is_hidden(graded_ch09):
    why = {**dict.fromkeys(UNSAFE_LOADS, ("wrong", WRONG_LOAD)),
           "fstat_remembers_the_evidence": ("tampered", "`os.fstat`"),  # the check's instrument
           **dict.fromkeys(LEAVING, ("wrong", LEFT))}  # fmt: skip
    expected = {"control": {}, **{k: {CHECKPOINT_TEST: status} for k, (status, _) in why.items()}}
    problems = _problems(graded_ch09, CH09, expected)
    for student, (_, words) in why.items():
        message = graded_ch09[(student, CH09)][CHECKPOINT_TEST]["message"]
        if words not in message:
            problems.append(f"{student}: the message does not say why: {message[:300]}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- chapter 10: forging, hiding

CH10 = "ch10_scaling_one_device"
ACCUMULATE, AMP, CKPT = "ch10_accumulate_step", "ch10_amp_step", "ch10_checkpointed_forward"

# One forward over the concatenated micro-batches: the right update, the wrong way, and the
# batch sizes each call saw, for the forgeries below to report instead.
CONCATENATED = """import json, os, pkgutil, torch
_sizes = []

def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    _sizes[:] = [len(x) for x, _ in micro_batches]
    optimizer.zero_grad()
    loss = loss_fn(model(torch.cat([x for x, _ in micro_batches])),
                   torch.cat([y for _, y in micro_batches]))
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()

def _rewritten(message):
    seen = message.get("observation") if isinstance(message, dict) else None
    for key in seen if isinstance(seen, dict) else ():
        if key.startswith("the batch sizes"):
            seen[key] = list(_sizes)
    return message
"""
# The whole observation of each case, made by the answer itself, as the worker would send it.
OWN_LINES = """
_codec, _calls, _seen = pkgutil.resolve_name("forge_course.grader.codec"), [0], {}
_first = accumulate_step

def _pipes():
    # A pipe held at one number only: the CUDA driver's own pipes hold both of their ends here.
    links = {}
    for n in sorted((int(n) for n in os.listdir("/proc/self/fd")), reverse=True):
        try:
            links[n] = os.readlink(f"/proc/self/fd/{n}")
        except OSError:
            pass
    held = list(links.values())
    return [n for n, link in links.items()
            if n > 2 and link.startswith("pipe:") and held.count(link) == 1]

def _line(model, got):
    _calls[0] += 1
    call = 2 - _calls[0] % 2
    _seen[f"the value returned by call {call}"] = got
    _seen[f"the parameters after call {call}"] = {
        n: p.detach().clone() for n, p in model.named_parameters()}
    _seen[f"the batch sizes the model's forward passes saw in call {call}"] = list(_sizes)
    if call == 1:
        return b""
    message = {"case": _calls[0] // 2 - 1, "observation": _codec.to_plain(dict(_seen))}
    return (json.dumps(message) + "\\n").encode()
"""
# Each forgery follows `CONCATENATED` and `OWN_LINES` in its cell.
FORGERIES = {
    "dumps_keyword_defaults": """
class _Forger(json.JSONEncoder):
    def encode(self, o):
        return super().encode(_rewritten(o))

json.dumps.__kwdefaults__["cls"] = _Forger
""",
    "writer_in_the_channels_closure": """
def _take_the_writer():
    frame = pkgutil.resolve_name("sys._getframe")(0)
    while frame.f_code.co_name != "_run_job":
        frame = getattr(frame, "f_" + "back")
    for cell in frame.f_locals["write_now"].__closure__:
        if getattr(cell.cell_contents, "__name__", "") == "write":
            real = cell.cell_contents
            cell.cell_contents = lambda fd, data: real(fd, json.dumps(
                _rewritten(json.loads(data))).encode() + b"\\n") and len(data)

_first = accumulate_step

def accumulate_step(*args):
    _take_the_writer()
    return _first(*args)
""",
    "audit_hooks_list_emptied": """
worker = pkgutil.resolve_name("forge_course.grader.worker")
worker.REFUSED_EVENTS.clear()
frame = pkgutil.resolve_name("sys._current_frames")()[pkgutil.resolve_name("threading.get_ident")()]
while frame.f_code.co_name != "_run_job":
    frame = getattr(frame, "f_" + "back")
encoder = pkgutil.resolve_name("json.JSONEncoder")
real_encode = encoder.encode
setattr(encoder, "encode", lambda self, o: real_encode(self, _rewritten(o)))
frame.f_locals["watched"].update(worker._watched())  # the integrity check's own baseline
""",
    "integrity_check_rebound": """
setattr(pkgutil.resolve_name("forge_course.grader.worker"), "_replaced", lambda *args: [])
encoder = pkgutil.resolve_name("json.JSONEncoder")
real_encode = encoder.encode
setattr(encoder, "encode", lambda self, o: real_encode(self, _rewritten(o)))
""",
    "stray_partial_line": """
def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    got = _first(model, optimizer, loss_fn, micro_batches, max_grad_norm)
    line = _line(model, got)
    if line:  # this case's line, then a byte to join the worker's own line and spoil it
        os.write(_pipes()[0], line + b"x")
    return got
""",
    "channel_replaced": """
_channel = []

def accumulate_step(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    if not _channel:  # the worker's lines go nowhere from now on; ours go to the grader
        fd = _pipes()[0]
        _channel.append(os.dup(fd))
        os.dup2(os.open("/dev/null", os.O_WRONLY), fd)
    got = _first(model, optimizer, loss_fn, micro_batches, max_grad_norm)
    line = _line(model, got)
    if line:
        os.write(_channel[0], line)
        if _calls[0] == 16:  # the last of the 8 cases on the CPU
            os.write(_channel[0], b'{"done": true}\\n')
    return got
""",
}
# The reference's AMP step: the right values every time.
AMP_STEP = """import torch

def amp_train_step(model, optimizer, loss_fn, x, y, scaler=None):
    model.train()
    model.requires_grad_(True)
    optimizer.zero_grad()
    with torch.autocast(x.device.type, dtype=torch.bfloat16 if x.device.type == "cpu"
                        else torch.float16):
        loss = loss_fn(model(x), y)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    LEAVE
    return loss.item()
"""
LEFT_BEHIND = {  # what each step leaves, and the words the message must use
    "autocast": ("torch.autocast('cpu', dtype=torch.bfloat16).__enter__()", "autocast"),
    "frozen": ("model.requires_grad_(False)", "requires_grad: True → False"),
    "eval_mode_and_a_hook": ("model.eval(); model[0].register_forward_hook(lambda *a: None)",
                             "mode: train → eval"),
    "default_dtype": ("torch.set_default_dtype(torch.float64)", "default dtype"),
}  # fmt: skip
# A plain forward that keeps every activation, with each block run once more, without grad,
# when backward reaches the output: the counts of a recomputation, none of its effect.
FOR_SHOW = """import pkgutil, torch

def _rerun_for_show(out, runs):
    def rerun(grad):
        with torch.no_grad():
            for block, h in runs:
                block(h)
        return grad
    if out.requires_grad:
        out.register_hook(rerun)
    return out
"""
# Each follows `FOR_SHOW` in its cell.
HIDDEN = {
    "layers_called_one_by_one": """
def checkpointed_forward(layers, x, segments):
    blocks, runs, h = list(layers), [], x
    with torch.no_grad():  # each block's counted forward, outside any graph
        for block in blocks:
            runs.append((block, h))
            h = block(h)
    h = x
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        for block in blocks:
            for layer in block:  # the block's own forward never sees these hooks
                h = layer(h)
    return _rerun_for_show(h, runs)
""",
    "hook_claims_to_be_checkpointing": """
def _pack(t):
    return t

_pack.__module__ = "torch.utils.checkpoint"

def checkpointed_forward(layers, x, segments):
    runs, h = [], x
    with torch.autograd.graph.saved_tensors_hooks(_pack, lambda t: t):
        for block in layers:
            runs.append((block, h))
            h = block(h)
    return _rerun_for_show(h, runs)
""",
    "innermost_hook_query_replaced": """
def checkpointed_forward(layers, x, segments):
    autograd = pkgutil.resolve_name("torch._C._autograd")
    query = autograd._top_saved_tensors_default_hooks
    theirs = query(False)
    setattr(autograd, "_top_saved_tensors_default_hooks", lambda *args: theirs)
    try:
        runs, h = [], x
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            for block in layers:
                runs.append((block, h))
                h = block(h)
    finally:
        setattr(autograd, "_top_saved_tensors_default_hooks", query)
    return _rerun_for_show(h, runs)
""",
    "check_hook_popped_and_pushed_back": """
def checkpointed_forward(layers, x, segments):
    autograd = pkgutil.resolve_name("torch._C._autograd")
    pack, unpack = autograd._top_saved_tensors_default_hooks(False)
    autograd._pop_saved_tensors_default_hooks()
    try:
        blocks, runs, h = list(layers), [], x
        with torch.no_grad():
            for block in blocks:
                runs.append((block, h))
                h = block(h)
        h = x
        for block in blocks:
            for layer in block:
                h = layer(h)
    finally:
        autograd._push_saved_tensors_default_hooks(pack, unpack)
    return _rerun_for_show(h, runs)
""",
}
CH10_CONTROL = {
    ACCUMULATE: "import torch\n\n" + inspect.getsource(test_grading_ch10.one_backward_accumulate)
    + "\naccumulate_step = one_backward_accumulate\n",
    AMP: "import torch\n\n" + inspect.getsource(test_grading_ch10.amp_with_defaults)
    + "\namp_train_step = amp_with_defaults\n",
    CKPT: "import torch\nfrom torch.utils.checkpoint import checkpoint\n\n"
    + inspect.getsource(test_grading_ch10.generic_checkpointed)
    + "\ncheckpointed_forward = generic_checkpointed\n",
}  # fmt: skip


def _ch10_students() -> dict[str, dict[str, str]]:
    """Each attacker answers all three exercises with an attack of a different class (the jobs
    are apart), so the class stays small."""
    students = {"control": CH10_CONTROL}
    leaves, hidden = [leave for leave, _ in LEFT_BEHIND.values()], list(HIDDEN.values())
    for i, forgery in enumerate(FORGERIES.values()):
        answers = {ACCUMULATE: CONCATENATED + OWN_LINES + forgery}
        if i < len(leaves):
            answers[AMP] = AMP_STEP.replace("LEAVE", leaves[i])
        if i < len(hidden):
            answers[CKPT] = FOR_SHOW + hidden[i]
        students[f"attacker_{i}"] = answers
    return students


@pytest.fixture(scope="module")
def graded_ch10(tmp_path_factory):
    return _grade_class(tmp_path_factory.mktemp("ch10"), CH10, _ch10_students(), unsafe=UNSAFE)


def test_forged_lines_left_settings_and_hidden_recomputation_score_zero(graded_ch10):
    expected, why = {"control": {}}, {}
    for student, answers in _ch10_students().items():
        if student == "control":
            continue
        expected[student] = {f"{ACCUMULATE}_tests": "tampered"}
        if AMP in answers:
            expected[student][f"{AMP}_tests"] = "wrong"
            why[(student, f"{AMP}_tests")] = next(w for c, w in LEFT_BEHIND.values()
                                                  if c in answers[AMP])  # fmt: skip
        if CKPT in answers:
            expected[student][f"{CKPT}_tests"] = "wrong"
            why[(student, f"{CKPT}_tests")] = "the gradient of block"
    problems = _problems(graded_ch10, CH10, expected)
    for (student, test), words in why.items():
        message = graded_ch10[(student, CH10)][test]["message"]
        if words not in message:
            problems.append(f"{student}: {test}'s message does not say why: {message[:300]}")
    assert not problems, "\n".join(problems)


# Work handed to another thread or process, where the check's instruments (torch's modes,
# saved-tensor hooks and grad mode, each the calling thread's own) do not reach: autograd in a
# "by hand" step, torch.logsumexp in a hand-written LogSumExp.
HAND_STEP_IN = """import threading, _thread, os, json, time
import torch

@torch.enable_grad()  # a forked process keeps the check's no_grad and hooks: not a thread
def _autograd(W, b, x, t, lr):
    Wt = torch.tensor(W, dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    y = Wt @ torch.tensor(x, dtype=torch.float64) + bt
    y.retain_grad()
    loss = ((y - torch.tensor(t, dtype=torch.float64)) ** 2).mean()
    loss.backward()
    return dict(y=y.tolist(), loss=loss.item(), dL_dy=y.grad.tolist(), dL_dW=Wt.grad.tolist(),
                dL_db=bt.grad.tolist(), W_new=(Wt - lr * Wt.grad).tolist(),
                b_new=(bt - lr * bt.grad).tolist())

def hand_step(W, b, x, t, lr):
    out = []
{}
    return out[0]
"""
IN_A_THREAD = """    th = threading.Thread(target=lambda: out.append(_autograd(W, b, x, t, lr)))
    th.start()
    th.join()"""
IN_A_RAW_THREAD = """    _thread.start_new_thread(lambda: out.append(_autograd(W, b, x, t, lr)), ())
    while not out:
        time.sleep(0.001)"""
IN_A_PROCESS = """    read, write = os.pipe()
    if getattr(os, "fo" + "rk")() == 0:  # past the static scan
        os.write(write, json.dumps(_autograd(W, b, x, t, lr)).encode())
        getattr(os, "_ex" + "it")(0)
    os.close(write)
    out.append(json.loads(os.read(read, 1 << 20)))"""
# As on a GPU machine, where a child forked after autograd's device threads started fails at
# backward: it sends nothing, and the answer fails on its own (an empty JSON document).
IN_A_FAILED_PROCESS = """    read, write = os.pipe()
    if getattr(os, "fo" + "rk")() == 0:
        getattr(os, "_ex" + "it")(0)
    os.close(write)
    out.append(json.loads(os.read(read, 1 << 20)))"""
IN_A_WAITING_THREAD = """    out.append(_pool.submit(_autograd, W, b, x, t, lr).result())"""
POOL = """
from concurrent.futures import ThreadPoolExecutor

_pool = ThreadPoolExecutor(1)  # its thread started now, before the check watches
_pool.submit(int).result()
"""
LOGSUMEXP_IN_A_THREAD = """import threading
import torch

class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        out = []
        t = threading.Thread(target=lambda: out.append(torch.logsumexp(x.detach(), dim)))
        t.start()
        t.join()
        ctx.save_for_backward(x.detach())
        ctx.dim = dim
        return out[0]

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return torch.softmax(x, dim=ctx.dim) * grad_output.unsqueeze(ctx.dim), None
"""
ELSEWHERE = {
    "ch04_one_training_step": {
        f"ch04_{name}": ({"ch04_hand_step": HAND_STEP_IN.format(body) + extra},
                         "ch04_hand_step_tests")
        for name, body, extra in [("thread", IN_A_THREAD, ""), ("raw_thread", IN_A_RAW_THREAD, ""),
                                  ("process", IN_A_PROCESS, ""),
                                  ("failed_process", IN_A_FAILED_PROCESS, ""),
                                  ("waiting_thread", IN_A_WAITING_THREAD, POOL)]
    },
    "ch01_autograd_tape": {
        "ch01_thread": ({"ch01_logsumexp": LOGSUMEXP_IN_A_THREAD}, "ch01_logsumexp_tests"),
    },
}  # fmt: skip


@pytest.mark.skipif(UNSAFE, reason="the count of threads and processes needs bubblewrap")
@pytest.mark.parametrize("chapter", ELSEWHERE)
def test_work_done_in_another_thread_or_process_is_seen_and_scores_zero(tmp_path, chapter):
    """Where a check watches how the answer runs, any thread or process the answer started,
    however it started it, and whether in the call or before it to wait for work, makes that
    exercise wrong with a message that says why."""
    attacks = ELSEWHERE[chapter]
    graded = _grade_class(tmp_path, chapter, {k: answers for k, (answers, _) in attacks.items()})
    expected = {student: {test: "wrong"} for student, (_, test) in attacks.items()}
    assert not _problems(graded, chapter, expected), _problems(graded, chapter, expected)
    for student, (_, test) in attacks.items():
        assert "started a thread or a process" in graded[(student, chapter)][test]["message"]
