"""`make bench`: the course's speed and memory on this machine, written to benchmarks/RESULTS.md.

Every figure is a median over repeated runs, and every ratio is taken within one run of this
script, so a busy machine slows both sides alike. `--quick` runs each measurement once and
skips the set-up timing (under two minutes while developing).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

from forge_course.device import describe, pick_device
from forge_course.release import REPO, build_sources, chapter_ids, generate_release

MB = 2**20
CHAPTER_SECONDS, CHAPTER_MB, COURSE_SECONDS = 60, 1536, 300


def _kernel_peak_mb(client: NotebookClient) -> float:
    """The kernel's peak resident memory (Linux VmHWM), read just before it shuts down."""
    pid = client.km.provisioner.process.pid
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_notebook(path: Path) -> tuple[float, float]:
    """(seconds, peak MB) of executing a notebook top to bottom in a fresh kernel."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        seconds = time.perf_counter() - start
        peak = _kernel_peak_mb(client)
    return seconds, peak


def floor_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import torch\nimport forge_course\nimport matplotlib.pyplot")
    ]
    path = folder / "floor.ipynb"
    nbformat.write(nb, path)
    return path


def median_of(repeats: int, measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    runs = [measure() for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), max(r[1] for r in runs)


def bench_chapters(repeats: int, tmp: Path) -> list[str]:
    build_sources(REPO, tmp / "source")
    floor_s, floor_mb = median_of(repeats, lambda: run_notebook(floor_notebook(tmp)))
    rows = [
        "| chapter | seconds | peak MB (kernel) | above the floor | budget (60 s, 1.5 GiB) |",
        "| --- | --- | --- | --- | --- |",
        f"| floor: kernel + `import torch, forge_course` | {floor_s:.1f} | {floor_mb:.0f} | | |",
    ]
    total = 0.0
    for chapter in chapter_ids(REPO):
        path = tmp / "source" / chapter / f"{chapter}.ipynb"
        seconds, peak = median_of(repeats, lambda path=path: run_notebook(path))
        total += seconds
        ok = seconds <= CHAPTER_SECONDS and peak <= CHAPTER_MB
        rows.append(
            f"| {chapter} | {seconds:.1f} | {peak:.0f} | +{seconds - floor_s:.1f} s | "
            f"{'met' if ok else '**missed**'} |"
        )
    verdict = "met" if total <= COURSE_SECONDS else "**missed**"
    rows.append(f"| **whole course** | {total:.1f} | | | {verdict} (5 min) |")
    return rows


def _latency_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: imports, first allocations
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def simulation_cases() -> list[tuple[str, Callable[[], object], float]]:
    """(name, one update at default settings, budget in ms) for each simulation engine."""
    from forge_course.sims import step_through

    example = dict(W=[[0.5, -0.3], [0.2, 0.8]], b=[0.0, 0.0], x=[1.0, 2.0], t=[1.0, 0.0])
    return [
        ("step_through (ch04): all six stages", lambda: step_through.step_through(**example), 50)
    ]


def bench_simulations(repeats: int) -> list[str]:
    rows = [
        "| engine: one update at default settings | median ms | budget ms | |",
        "| --- | --- | --- | --- |",
    ]
    torch.set_num_threads(1)
    for name, fn, budget in simulation_cases():
        ms = _latency_ms(fn, repeats)
        rows.append(f"| {name} | {ms:.2f} | {budget} | {'met' if ms <= budget else '**missed**'} |")
    return rows


def bench_grading(tmp: Path, repeats: int) -> list[str]:
    examples = REPO / "autograder" / "examples"
    students = sorted(p.name for p in examples.iterdir() if p.is_dir())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def forge(jobs: int) -> float:
        grading = tmp / f"forge-{jobs}"
        shutil.rmtree(grading, ignore_errors=True)
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "forge_course.cli",
                "grade",
                "--submitted",
                str(examples),
                "--jobs",
                str(jobs),
                "--force",
            ],
            check=True,
            env={**env, "FORGE_GRADING_DIR": str(grading)},
            capture_output=True,
        )
        return time.perf_counter() - start

    def nbgrader_serial() -> float:
        root = tmp / "nbgrader-course"
        shutil.rmtree(root, ignore_errors=True)
        build_sources(REPO, root / "build" / "source")
        generate_release(root, ["ch04_one_training_step"])
        for student in students:
            target = root / "grading" / "submitted" / student
            shutil.copytree(examples / student, target)
            for nb in target.rglob("*.ipynb"):  # plain nbgrader needs the exact name
                nb.rename(nb.with_name("ch04_one_training_step.ipynb"))
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "nbgrader", "autograde", "ch04_one_training_step", "--force"],
            cwd=REPO / "autograder",
            capture_output=True,
            env={**env, "FORGE_COURSE_ROOT": str(root)},
        )
        return time.perf_counter() - start

    jobs = os.cpu_count() or 1
    serial = statistics.median(forge(1) for _ in range(repeats))
    parallel = statistics.median(forge(jobs) for _ in range(repeats))
    plain = statistics.median(nbgrader_serial() for _ in range(repeats))
    n = len(students)
    return [
        f"Chapter 04, the {n} sample submissions of `autograder/examples/` (one loops until its",
        "time limit, one is malformed, one tampers).",
        "",
        "| grader | seconds per submission | |",
        "| --- | --- | --- |",
        f"| `nbgrader autograde` (serial, no isolation) | {plain / n:.1f} | baseline |",
        f"| `forge-course grade --jobs 1` (isolated) | {serial / n:.1f} | {plain / serial:.2f}× |",
        f"| `forge-course grade --jobs {jobs}` (isolated) | {parallel / n:.1f} | "
        f"{plain / parallel:.2f}× (parallel over serial: {serial / parallel:.2f}×) |",
    ]


def bench_setup(tmp: Path) -> list[str]:
    venv = tmp / "venv"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "-c",
            str(REPO / "constraints.txt"),
            "-e",
            f"{REPO}[dev]",
        ],
        check=True,
    )
    seconds = time.perf_counter() - start
    return [
        f"`make lab`'s set-up into a new virtual environment: **{seconds:.0f} s** (packages "
        "from this machine's local wheel folder and package index, pip's cache as it was)."
    ]


def bench_claims(repeats: int) -> list[str]:
    from forge_course.reference.memory import saved_activation_bytes

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[m for _ in range(8) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())]
    )
    x = torch.randn(128, 256)
    with_grad = saved_activation_bytes(model, x)
    with torch.no_grad():
        no_grad = saved_activation_bytes(model, x)

    def timed(context) -> float:
        def step():
            with context():
                model(x)

        return _latency_ms(step, repeats * 10)

    t_nograd, t_inference = timed(torch.no_grad), timed(torch.inference_mode)
    bf16 = _latency_ms(lambda: _amp_step(model, x, torch.bfloat16), repeats * 5)
    fp32 = _latency_ms(lambda: _amp_step(model, x, None), repeats * 5)
    return [
        "| claim (chapter) | measured here |",
        "| --- | --- |",
        "| bytes saved for backward by a 16-layer MLP, batch 128 (06) | "
        f"{with_grad / MB:.1f} MB with grad, {no_grad / MB:.1f} MB under `no_grad` |",
        f"| forward under `no_grad` vs `inference_mode` (06) | {t_nograd:.2f} ms vs "
        f"{t_inference:.2f} ms ({(t_nograd / t_inference - 1) * 100:+.0f}%) |",
        f"| one training step, fp32 vs bf16 autocast (10) | {fp32:.2f} ms vs {bf16:.2f} ms "
        f"({fp32 / bf16:.2f}× speed-up; below 1 means slower) |",
    ]


def _amp_step(model: torch.nn.Module, x: torch.Tensor, dtype) -> None:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        loss = model(x).float().pow(2).mean()
    loss.backward()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one run each, no set-up timing")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else 3
    device = pick_device()
    quick = " BENCH_ARGS=--quick" if args.quick else ""
    lines = [
        "# Benchmarks",
        "",
        f"Measured {datetime.date.today()} on {describe(device)}, {os.cpu_count()} cores, "
        f"Python {sys.version.split()[0]}, by `make bench{quick}` "
        f"(medians of {repeats} run(s)). Shared machines vary by about ±30%.",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lines += ["## Chapters", ""] + bench_chapters(repeats, tmp) + [""]
        lines += ["## Simulations", ""] + bench_simulations(20) + [""]
        lines += ["## Grading", ""] + bench_grading(tmp, repeats) + [""]
        lines += ["## Claims the chapters measure", ""] + bench_claims(repeats) + [""]
        if not args.quick:
            lines += ["## Set-up", ""] + bench_setup(tmp) + [""]
    out = REPO / "benchmarks" / "RESULTS.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
