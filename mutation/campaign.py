"""One chapter's campaign: read its cells, make the mutants, run them in `mutation.server`."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mutation.operators import Mutant, mutants

REPO = Path(__file__).resolve().parent.parent
GRADING_SEED = 20240611  # hidden cases are drawn from it: the same cases, so the same verdicts


@dataclass
class Chapter:
    """What a notebook's kernel runs for one chapter's exercises."""

    id: str  # "ch04"
    name: str  # "ch04_one_training_step"
    settings: str  # the settings cell: the first plain code cell
    answers: dict[str, str]  # exercise id -> its solution cell
    tests: dict[str, str]  # exercise id -> its test cell, hidden tests included


def chapter_ids() -> list[str]:
    return sorted(p.name[:4] for p in (REPO / "solutions").glob("ch[0-9][0-9]_*.py"))


def load_chapter(chapter: str) -> Chapter:
    from forge_course.grader.assignment import INSTALL_TAG
    from forge_course.release import source_notebook

    source = next((REPO / "solutions").glob(f"{chapter}_*.py"))
    exercise_ids = _exercise_ids(chapter)
    cells = [c for c in source_notebook(source).cells if c.cell_type == "code"]
    plain = [c for c in cells if "nbgrader" not in c.metadata]
    settings = next(c.source for c in plain if INSTALL_TAG not in c.metadata.get("tags", []))
    by_id = {
        c.metadata["nbgrader"]["grade_id"]: c.source for c in cells if "nbgrader" in c.metadata
    }
    return Chapter(
        chapter,
        source.stem,
        settings,
        {e: by_id[e] for e in exercise_ids},
        {e: by_id[f"{e}_tests"] for e in exercise_ids},
    )


def _exercise_ids(chapter: str) -> list[str]:
    """The chapter's exercises, from its checks module (run in a child: it imports torch)."""
    code = (
        "import importlib, json; m = importlib.import_module('forge_course.grading.' + "
        f"{chapter!r}); print(json.dumps(list(dict.fromkeys(e.grade_id for e in m.EXERCISES))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def chapter_mutants(chapter: Chapter) -> dict[str, list[Mutant]]:
    return {e: mutants(e, cell) for e, cell in chapter.answers.items()}


def accelerated() -> bool:
    """Whether torch sees CUDA (asked in a child, so that this process never touches CUDA)."""
    code = "import torch; print(torch.cuda.is_available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip().endswith("True")


def run_chapter(
    chapter: Chapter,
    found: dict[str, list[Mutant]],
    *,
    jobs: int,
    gpu: bool,
    limit_floor: float = 30.0,
    limit_factor: float = 4.0,
    progress=lambda line: None,
) -> dict:
    """Run every mutant of ``found``: the chapter's results as plain data (`mutation.report`)."""
    job = {
        "settings": chapter.settings,
        "jobs": jobs,
        "warm": not gpu,
        "limit_floor": limit_floor,
        "limit_factor": limit_factor,
        "baseline_limit": 600,
        # A mutant may allocate without end; CUDA needs its address space, so no limit there.
        "memory_gib": 0 if gpu else 8,
        "exercises": [
            {
                "id": exercise,
                "original": chapter.answers[exercise],
                "tests": chapter.tests[exercise],
                "mutants": [{"key": m.key, "source": m.source} for m in found[exercise]],
            }
            for exercise in found
        ],
    }
    env = {
        **os.environ,
        "FORGE_GRADING_SEED": str(GRADING_SEED),
        "OMP_NUM_THREADS": "1",  # one thread a child: the children are the parallelism
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    results = {e: {"baseline": None, "mutants": {}} for e in found}
    load = os.getloadavg()[0]  # the machine may be shared: its load explains the run time
    started = time.monotonic()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(job, file)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "mutation.server", file.name],
            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO,
        )  # fmt: skip
        for line in process.stdout:
            record = json.loads(line)
            exercise = results[record.pop("exercise")]
            if "baseline" in record:
                exercise["baseline"] = record["baseline"]
                passes = "passes" if record["baseline"]["status"] == "survived" else "FAILS"
                progress(f"  the solution {passes} its check "
                         f"({record['baseline'].get('seconds', 0):.1f} s)")  # fmt: skip
            else:
                exercise["mutants"][record.pop("key")] = record
                if record["status"] == "survived":
                    progress(f"  survived: {list(exercise['mutants'])[-1]}")
        process.wait()
    finally:
        os.unlink(file.name)
    import torch

    return {
        "chapter": chapter.id,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores"
        + (f", {torch.cuda.get_device_name(0)}" if gpu else ", no GPU")
        + f", load {load:.1f} at the start",
        "torch": torch.__version__,
        "jobs": jobs,
        "seconds": round(time.monotonic() - started, 1),
        "grading_seed": GRADING_SEED,
        "exercises": {
            exercise: {
                "baseline": results[exercise]["baseline"],
                "mutants": [
                    {
                        "key": m.key,
                        "operator": m.operator,
                        "line": m.line,
                        "before": m.before,
                        "after": m.after,
                        **results[exercise]["mutants"].get(m.key, {"status": "not run"}),
                    }
                    for m in found[exercise]
                ],
            }
            for exercise in found
        },
    }
