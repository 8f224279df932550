"""The grader on a machine with a CUDA GPU: what only a GPU can show.

Everywhere else these tests do not apply and say so (skipped, with the reason). On a GPU they
grade every chapter's instructor solution and its blank release twice, once with the grader's
default devices (CPU and GPU) and once told ``--device cpu``, with the default limits and the
strongest isolation the machine has; and they hold one submission to its GPU memory.
"""

import csv
import os
import subprocess
import sys
import time

import pytest
import torch

from forge_course.grader import run, sandbox
from tests.conftest import CHAPTERS, REPO
from tests.helpers.classes import build_class

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
UNSAFE = sandbox.isolation() != "bubblewrap"  # GPU machines without bubblewrap exist


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_solutions_score_full_and_blanks_zero_on_a_gpu_machine(tmp_path, device):
    """As a grader runs it: `forge-course grade --device D` in a fresh process (whether this
    one has used CUDA already must not matter)."""
    build_class(tmp_path, CHAPTERS, lambda chapter, solved: {"solution": solved, "blank": {}})
    command = [sys.executable, "-m", "forge_course.cli", "grade", "--submitted",
               str(tmp_path / "submitted"), "--device", device, "--force"]  # fmt: skip
    env = {**os.environ, "FORGE_GRADING_DIR": str(tmp_path / "grading")}
    started = time.perf_counter()
    graded = subprocess.run(command + ["--unsafe"] * UNSAFE, cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=900)  # fmt: skip
    seconds = time.perf_counter() - started
    assert graded.returncode == 0, graded.stdout[-2000:] + graded.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "grading" / "grades.csv").open()))
    totals: dict = {}
    for row in rows:
        total = totals.setdefault((row["student"], row["assignment"]), [0.0, 0.0])
        total[0] += float(row["points"])
        total[1] += float(row["max_points"])
    for (student, chapter), (points, top) in sorted(totals.items()):
        print(f"--device {device} {student} {chapter}: {points:g}/{top:g}")
    print(f"--device {device}: {len(totals)} submissions in {seconds:.1f} s, unsafe={UNSAFE}")
    assert len(totals) == 2 * len(CHAPTERS)
    problems = [
        f"{row['student']} {row['test']}: {row['points']}/{row['max_points']} {row['status']}: "
        f"{row['message']}"
        for row in rows
        if (row["student"] == "solution") != (float(row["points"]) == float(row["max_points"]))
    ]
    assert not problems, "\n".join(problems)


def test_a_submission_is_held_to_its_gpu_memory(tmp_path):
    """A job that asks the GPU for more than the submission's memory fails that exercise alone,
    with the memory named, and leaves the GPU to its neighbours."""
    chapter = "ch04_one_training_step"
    limits = sandbox.Limits()
    hog = (
        f"_hog = torch.empty({limits.memory_mb + 1024} * 2**20, dtype=torch.uint8, device='cuda')\n"
    )

    def answers(chapter, solved):
        first = next(iter(solved))
        return {"greedy": {**solved, first: "import torch\n" + hog + solved[first]}}

    build_class(tmp_path, [chapter], answers)
    outcomes = run.grade([chapter], submitted=tmp_path / "submitted", grading=tmp_path / "grading",
                         limits=limits, progress=False, unsafe=UNSAFE, force=True)  # fmt: skip
    results = list(outcomes[("greedy", chapter)].values())
    assert results[0]["points"] == 0 and "memory" in results[0]["message"].lower(), results[0]
    assert all(r["points"] == r["max_points"] for r in results[1:]), results[1:]


def test_one_process_grades_runs_on_different_devices(tmp_path):
    """As a Dask worker serves one run after another: a process that has opened CUDA grades
    with ``--device cpu`` and then with ``auto``, and the solutions score full in both (the
    devices go to the workers; the grader's own process and environment are left alone)."""
    torch.zeros(1, device="cuda")
    chapters = ["ch09_production_loop", "ch10_scaling_one_device"]
    build_class(tmp_path, chapters, lambda chapter, solved: {"solution": solved})
    for device in ("cpu", "auto"):
        outcomes = run.grade(chapters, submitted=tmp_path / "submitted", device=device,
                             grading=tmp_path / f"grading-{device}", progress=False,
                             unsafe=UNSAFE, force=True)  # fmt: skip
        lost = [
            f"--device {device} {chapter} {cell}: {result['message']}"
            for (_, chapter), cells in outcomes.items()
            for cell, result in cells.items()
            if result["points"] != result["max_points"]
        ]
        assert not lost, "\n".join(lost)
