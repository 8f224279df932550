"""The learner half of the checks holds nothing worth stealing, and is all a worker can import.

`forge_course.observe` is the only part of the checks a grading worker runs (the sandbox
mounts a staged copy of `sandbox.WORKER_FILES` and nothing else of the course). These tests
keep it that way: what each observer imports, where every exercise's observer lives, and what a
worker started from the staged copy can and cannot import, set-up cells included.
"""

import ast
import importlib
import json
import subprocess
import sys

import pytest

from forge_course.grader import sandbox
from forge_course.grader.assignment import load
from forge_course.release import build_sources
from tests.conftest import CHAPTERS, REPO

OBSERVE = REPO / "forge_course" / "observe"
ALLOWED = ("torch", "numpy", "forge_course.observe", "forge_course.device", "forge_course.data",
           "forge_course.doctor", "forge_course.ports")  # fmt: skip


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


@pytest.mark.parametrize("path", sorted(OBSERVE.glob("*.py")), ids=lambda p: p.stem)
def test_observers_import_nothing_that_knows_an_answer(path):
    for name in _imports(path):
        root = name.split(".")[0]
        allowed = (
            root in sys.stdlib_module_names or name.startswith(ALLOWED) or name == "__future__"
        )
        assert allowed, f"{path.name} imports {name}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_exercise_observer_lives_in_the_learner_half(chapter):
    for exercise in importlib.import_module(f"forge_course.grading.{chapter[:4]}").EXERCISES:
        assert exercise.observer["module"] == f"forge_course.observe.{chapter[:4]}"


def test_a_worker_reaches_no_reference_and_runs_every_set_up_cell(tmp_path):
    """From the staged copy, in isolated mode: every observer and every chapter's set-up cell
    imports, and neither the references nor the grader half can be imported at all."""
    build_sources(REPO, tmp_path / "source")
    preludes = [load(c, tmp_path / "source" / c / f"{c}.ipynb").prelude for c in CHAPTERS]
    stage = sandbox.stage(tmp_path / "stage")
    probe = (
        "import importlib, json, pkgutil, sys\n"
        "import matplotlib\nmatplotlib.use('Agg')\n"
        "import forge_course.observe as observe\n"
        "for info in pkgutil.iter_modules(observe.__path__):\n"
        "    importlib.import_module(f'forge_course.observe.{info.name}')\n"
        "for prelude in json.loads(sys.argv[2]):\n"
        "    exec(compile(prelude, '<set-up cell>', 'exec'), {'__name__': '__main__'})\n"
        "missing = []\n"
        "for name in ('forge_course.reference', 'forge_course.grading', 'forge_course.sims.tape',\n"
        "             'forge_course.grader.run', 'forge_course.reference.step'):\n"
        "    try:\n        importlib.import_module(name)\n"
        "    except ImportError:\n        missing.append(name)\n"
        "loaded = [m for m in sys.modules if m.startswith(('forge_course.reference',\n"
        "          'forge_course.grading'))]\n"
        "print(json.dumps({'missing': missing, 'loaded': loaded}))\n"
    )
    boot = sandbox.BOOT.split("from forge_course")[0] + f"exec({probe!r})"
    done = subprocess.run(
        [sys.executable, "-I", "-c", boot, str(stage), "-", json.dumps(preludes)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"MPLBACKEND": "Agg", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == []
    assert len(seen["missing"]) == 5, seen
