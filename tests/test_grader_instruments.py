"""A check's instruments cannot be switched off, graded as one class in one run.

Chapter 06's `evaluate` is checked by how it ran (modes, autograd), not only by what it
returned, so it is where a determined student attacks the instruments: blinding them (hooks
cleared, layers called directly, methods shadowed, torch's own forward put back), forging the
observation on its way out (the JSON encoder patched through a spelling the scan cannot read),
reaching native code for a System V segment, or leaving the model changed. Each attack must
end `evaluate`'s test with its status and zero points while the rest of the notebook, the
controls and the instructor's solution score full.
"""

import inspect

import nbformat
import pytest

from forge_course.grader import run
from forge_course.release import build_sources, generate_release
from tests import test_grading_ch06 as attacks
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
        "    total, correct, count = 0.0, 0, 0\n"
        "    with torch.no_grad():\n"
        "        for inputs, targets in loader:\n"
        "            inputs, targets = inputs.to(device), targets.to(device)\n"
        "            outputs = model(inputs)\n"
        "            total += loss_fn(outputs, targets).item() * targets.numel()\n"
        "            correct += (outputs.argmax(dim=-1) == targets).sum().item()\n"
        "            count += targets.numel()\n"
        "    for m, training in modes.items():\n"
        "        m.training = training\n"
        + "".join(f"    {line}\n" for line in extra.splitlines())
        + "    return total / count, correct / count\n"
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


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("instruments")
    build_sources(REPO, root / "build" / "source")
    generate_release(root, [CH])
    name = f"{CH}.ipynb"
    solved = _solutions(nbformat.read(root / "build" / "source" / CH / name, as_version=4))
    released = nbformat.read(root / "notebooks" / CH / name, as_version=4)
    students = {"solved": solved, **{k: {**solved, EVALUATE: a} for k, (a, _) in ATTACKS.items()}}
    for student, answers in students.items():
        path = root / "submitted" / student / CH / name
        path.parent.mkdir(parents=True)
        nbformat.write(_submission(released, answers), path)
    return run.grade([CH], submitted=root / "submitted", grading=root / "grading",
                     progress=False, unsafe=True)  # fmt: skip


def test_each_attack_on_the_instruments_scores_zero_with_its_status(graded):
    assert all(r["status"] == "graded" for r in graded[("solved", CH)].values())
    problems = []
    for student, (_, status) in ATTACKS.items():
        for test, r in graded[(student, CH)].items():
            want = status if test == TEST else "graded"
            if r["status"] != want:
                problems.append(f"{student}: {test} is {r['status']}: {r['message'][:300]}")
    assert not problems, "\n".join(problems)
