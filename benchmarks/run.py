"""`make bench`: the course's speed and memory on this machine, written to benchmarks/RESULTS.md.

Timings are medians over repeated runs, except where a chapter shows the fastest run (chapter
10's), and every ratio is taken within one run of this script, so a busy machine slows both
sides alike. `--quick` (under 2 minutes, for use while developing) runs each measurement once
or a few times, on the floor and chapter 04 only, grades one copy of each sample, skips the
crash replay, the compile claim, the sandbox limits (`benchmarks/limits.py`) and the set-up
timing, and writes benchmarks/quick.md instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import NamedTuple

import matplotlib.pyplot as plt
import nbformat
import torch
from nbclient import NotebookClient
from torch import nn

from forge_course.device import describe, pick_device
from forge_course.release import REPO, build_sources, chapter_ids, generate_release

MB = 2**20
CH = "ch04_one_training_step"  # the chapter the grading figures use
CHAPTER_SECONDS, CHAPTER_MB, COURSE_SECONDS = 60, 1536, 300
SETUP_SECONDS = 300  # "set-up takes minutes"


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


def bench_chapters(repeats: int, tmp: Path, chapters: list[str]) -> list[str]:
    build_sources(REPO, tmp / "source")
    floor_s, floor_mb = median_of(repeats, lambda: run_notebook(floor_notebook(tmp)))
    rows = [
        "| chapter | seconds | peak MB (kernel) | above the floor | budget (60 s, 1.5 GiB) |",
        "| --- | --- | --- | --- | --- |",
        f"| floor: kernel + `import torch, forge_course` | {floor_s:.1f} | {floor_mb:.0f} | | |",
    ]
    total = 0.0
    for chapter in chapters:
        path = tmp / "source" / chapter / f"{chapter}.ipynb"
        seconds, peak = median_of(repeats, lambda path=path: run_notebook(path))
        total += seconds
        ok = seconds <= CHAPTER_SECONDS and peak <= CHAPTER_MB
        rows.append(
            f"| {chapter} | {seconds:.1f} | {peak:.0f} | +{seconds - floor_s:.1f} s | "
            f"{'met' if ok else '**missed**'} |"
        )
    if chapters == chapter_ids(REPO):
        verdict = "met" if total <= COURSE_SECONDS else "**missed**"
        rows.append(f"| **whole course** | {total:.1f} | | | {verdict} (5 min) |")
    return rows


SAMPLE_SECONDS = 2.0  # stop timing a case after this long: a slow update needs few runs to show it


class Case(NamedTuple):
    """One update of a simulation engine, as a learner triggers it in the chapter's view."""

    engine: str  # its module in forge_course/sims
    update: str  # what is timed, at the defaults of the chapter in brackets
    budget_ms: float
    prepare: Callable[[], Callable[[], object]]  # builds what the view already holds (untimed)


def _ready(update: Callable[[], object]) -> Callable[[], Callable[[], object]]:
    """`Case.prepare` for an update that needs nothing built first."""
    return lambda: update


def _latency_ms(fn: Callable[[], object], repeats: int) -> tuple[float, int]:
    """(median ms, runs) of ``fn()``, after one warm-up call (imports, first allocations)."""
    fn()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < repeats and (
        not samples or time.perf_counter() - started < SAMPLE_SECONDS
    ):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), len(samples)


def simulation_cases(device: torch.device) -> list[Case]:
    """Every engine's update at the defaults its chapter uses, with the issue's budgets: 50 ms
    for a view, 20 ms for the simulator's step, and the arena's 5 s for a whole training run
    (the bug detector's new combination and the crash replay are runs too). What a learner
    waits for after a slider, the engine and its picture, is `benchmarks/redraws.py`."""
    from forge_course.data import build_vocabulary, encode, load_reviews, make_imbalanced
    from forge_course.sims import arena, crash_replay, pipeline, profile_explorer, tape, trainer
    from forge_course.sims import arithmetic_timeline as timeline
    from forge_course.sims import bug_detector as museum
    from forge_course.sims import memory_compute as checkpointing
    from forge_course.sims import module_explorer as explorer
    from forge_course.sims import pipeline_builder as builder
    from forge_course.sims import ring_allreduce as ring
    from forge_course.sims import sampler_view as sampler
    from forge_course.sims import step_through as step
    from forge_course.sims import train_vs_eval as modes

    def backward_press():  # ch01: x or w moved (a new recording), then "backward"
        recorder = tape.TapeRecorder("running example", x=2.0, w=3.0)

        def update():
            recorder.record("running example", 2.0, 3.0)
            recorder.backward()

        return update

    def composition():  # ch03: 900 dogs and 100 cats
        labels = make_imbalanced(900, 100, seed=0)[1]
        return partial(sampler.composition, labels, "random", 32, seed=0, epoch=0)

    def padding():  # ch03: the 164 reviews, batches of 8, bucket multiplier 5
        texts, _ = load_reviews()
        vocabulary = build_vocabulary(texts)
        lengths = [len(encode(text, vocabulary)) for text in texts]
        return lambda: [
            sampler.epoch_batches(lengths, 8, bucketed, multiplier=5) for bucketed in (False, True)
        ]

    def press():  # ch06: the view opens on two presses
        engine = modes.TrainVsEval(seed=0, p=0.5)
        engine.press(), engine.press()
        return engine.press

    bugs = {"eval_records_graph", "kept_graph"}  # ch07's starting state, 150 steps

    def new_combination():
        museum._CACHE.clear()  # a box ticked for the first time: no run is cached yet
        return museum.run(bugs)

    def simulator():  # ch08: the view starts 10 epochs into the default run
        run = trainer.Trainer(trainer.SIM_CONFIG, device=device)
        run.run(10 * run.batches_per_epoch)
        return run.step

    def replay():
        with tempfile.TemporaryDirectory() as folder:
            return crash_replay.replay(folder)

    stack = {"n_layers": 16, "width": 64, "batch": 64, "device": str(device), "repeats": 7}

    def segments_slider():  # ch10: the view measures every k once, up front
        checkpointing.measure_all(**stack)
        return partial(checkpointing.measure, 4, **stack)

    values = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [100.0, 200.0, 300.0]]  # ch11's RUNNING

    # ch13: a batch of 64 costs 64 × 0.3 ms of reads and about 0.7 ms of compute on 2 CPU cores
    workers_slider = partial(profile_explorer.simulate, 19.2, 0.7, 2, 2)
    ch00 = (10_000, 32, 3, 4)  # the running example: N, B, epochs, K
    target = str(device) if device.type != "cpu" else "meta"  # ch05's OTHER
    explore = partial(explorer.explore_preset, "MLP", "plain list", moved_to=target)
    plan = partial(pipeline.plan_epoch, 100, 16, shuffle=True, num_workers=2)
    stages = partial(step.step_through, [[0.5, -0.3], [0.2, 0.8]], [0.0, 0.0], [1.0, 2.0],
                     [1.0, 0.0], lr=0.01)  # fmt: skip
    adam = {"optimizer": "adam", "lr": 0.01, "scheduler": "constant", "batch_size": 32,
            "epochs": 20}  # fmt: skip
    return [
        Case("arithmetic_timeline", "timeline of N=10,000, B=32, 3 epochs, K=4 (ch00)", 50,
             _ready(partial(timeline.timeline, *ch00))),
        Case("tape", "record + backward of the running example (ch01)", 50,
             backward_press),
        Case("pipeline", "plan_epoch of N=100, B=16, shuffled, 2 workers (ch02)", 50, _ready(plan)),
        Case("sampler_view", "composition of a random sampler's epoch, B=32 (ch03)", 50,
             composition),
        Case("sampler_view", "padding: random and bucketed batches of 8 (ch03)", 50,
             padding),
        Case("step_through", "all six stages of the running example (ch04)", 50, _ready(stages)),
        Case("module_explorer", f"explore_preset: MLP, plain list, .to('{target}') (ch05)", 50,
             _ready(explore)),
        Case("train_vs_eval", "one press: two forwards, saved bytes counted (ch06)", 50,
             press),
        Case("bug_detector", "a new combination: 150 training steps, 2 bugs on (ch07)", 5000,
             _ready(new_combination)),
        Case("trainer", "one simulator step, 10 epochs in (ch08)", 20,
             simulator),
        Case("arena", "a 20-epoch run of the default Adam config, 200 steps (ch08)", 5000,
             _ready(partial(arena.run_arena, adam, device=device))),
        Case("pipeline_builder", "a click: build_loop + loop_html, all components (ch09)", 50,
             _ready(lambda: builder.loop_html(builder.build_loop(set(builder.COMPONENTS))))),
        Case("crash_replay", "replay: 3 processes forked from one, one killed at step 23, "
             "resumed (ch09)", 5000, _ready(replay)),
        Case("memory_compute", "slider: measure(k=4) from the view's cache (ch10)", 50,
             segments_slider),
        Case("ring_allreduce", "ring_allreduce_steps of 3 workers × 3 floats (ch11)", 50,
             _ready(partial(ring.ring_allreduce_steps, values))),
        Case("ring_allreduce", "memory_rows: 10⁹ parameters, 8 ranks (ch11)", 50,
             _ready(partial(ring.memory_rows, 1e9, 8))),
        Case("profile_explorer", "simulate: 12 steps, 2 workers, prefetch 2 (ch13)", 50,
             _ready(workers_slider)),
    ]  # fmt: skip


def bench_simulations(repeats: int, cases: list[Case] | None = None) -> list[str]:
    device = pick_device()
    plt.switch_backend("Agg")  # off-screen: an engine that draws must not open a window
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the chapters set: the models are tiny and the machine shared
    rows = [
        f"One update of each engine on {describe(device)}: median of up to {repeats} runs "
        f"(fewer when {SAMPLE_SECONDS:.0f} s is up) after a warm-up.",
        "",
        "| engine | one update at the chapter's defaults | median ms | runs | budget ms | |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    try:
        for case in cases if cases is not None else simulation_cases(device):
            ms, runs = _latency_ms(case.prepare(), repeats)
            verdict = "met" if ms <= case.budget_ms else "**missed**"
            rows.append(
                f"| {case.engine} | {case.update} | {ms:.2f} | {runs} | {case.budget_ms:g} | "
                f"{verdict} |"
            )
    finally:
        torch.set_num_threads(threads)
    return rows


def _sample_class(folder: Path, copies: int) -> int:
    """The sample submissions but the endless loop (its cost is each grader's time limit, not
    its speed), ``copies`` of each, under the assignment's exact name as nbgrader needs."""
    examples = REPO / "autograder" / "examples"
    count = 0
    for student in sorted(p for p in examples.iterdir() if p.is_dir() and p.name != "erin"):
        source = next(student.rglob("*.ipynb"))
        for copy in range(copies):
            target = folder / f"{student.name}-{copy}" / CH / f"{CH}.ipynb"
            target.parent.mkdir(parents=True)
            shutil.copy(source, target)
            count += 1
    return count


def _forge_grade(submitted: Path, grading: Path, jobs: int) -> float:
    """Seconds that ``forge-course grade`` takes on the class in ``submitted``, start-up
    included."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "forge_course.cli", "grade", "--submitted", str(submitted),
         "--jobs", str(jobs), "--force"],
        check=True, env={**os.environ, "FORGE_GRADING_DIR": str(grading)},
        capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - start


def bench_grading(tmp: Path, repeats: int, copies: int) -> list[str]:
    submitted = tmp / "class"
    n = _sample_class(submitted, copies)

    def forge(jobs: int) -> float:
        grading = tmp / f"forge-{jobs}"
        shutil.rmtree(grading, ignore_errors=True)
        return _forge_grade(submitted, grading, jobs)

    def nbgrader_serial() -> float:
        root = tmp / "nbgrader-course"
        shutil.rmtree(root, ignore_errors=True)
        build_sources(REPO, root / "build" / "source")
        generate_release(root, [CH])
        shutil.copytree(submitted, root / "grading" / "submitted")
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "nbgrader", "autograde", CH, "--force"],
            cwd=REPO / "autograder", capture_output=True,  # fails on the malformed one
            env={**os.environ, "FORGE_COURSE_ROOT": str(root)},
        )  # fmt: skip
        return time.perf_counter() - start

    jobs = os.cpu_count() or 1
    plain = statistics.median(nbgrader_serial() for _ in range(repeats))
    serial = statistics.median(forge(1) for _ in range(repeats))
    parallel = statistics.median(forge(jobs) for _ in range(repeats))
    return [
        f"Chapter 04: {n} submissions, {copies} cop{'y' if copies == 1 else 'ies'} of each sample "
        "in `autograder/examples/` "
        "(solved, blank, wrong, tampering, malformed; the endless loop left out, since it costs",
        "each grader its time limit: 60 s per exercise here, nbgrader's `Execute.timeout` of",
        "120 s per cell there). Times include each command's start-up.",
        "",
        "| grader | seconds per submission | speed-up over nbgrader |",
        "| --- | --- | --- |",
        f"| `nbgrader autograde` (serial, no isolation) | {plain / n:.2f} | 1.00× |",
        f"| `forge-course grade --jobs 1` (isolated) | {serial / n:.2f} | {plain / serial:.2f}× |",
        f"| `forge-course grade --jobs {jobs}` (isolated) | {parallel / n:.2f} | "
        f"{plain / parallel:.2f}× (parallel over serial: {serial / parallel:.2f}×) |",
    ]


def _large_class(folder: Path, size: int, wrong: int) -> None:
    """``size`` copies of the solved sample, the first ``wrong`` of them with one answer cell
    replaced by a typical wrong answer (`tests/answers/ch04.py`, each kind in turn)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("answers", REPO / "tests/answers/ch04.py")
    answers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(answers)
    kinds = [(cell, text) for cell, options in answers.WRONG.items() for text, _ in options]
    solved = nbformat.read(REPO / "autograder/examples/alice" / CH / f"{CH}.ipynb", 4)
    for i in range(size):
        nb = nbformat.from_dict(solved)
        if i < wrong:
            cell, text = kinds[i % len(kinds)]
            for c in nb.cells:
                if c.metadata.get("nbgrader", {}).get("grade_id") == cell:
                    c.source = text
        path = folder / f"student-{i:03d}" / CH / f"{CH}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)


def bench_large_class(tmp: Path, size: int) -> list[str]:
    """A whole class of chapter 04, graded once, all correct and with a tenth wrong."""
    jobs = os.cpu_count() or 1
    rows = []
    for name, wrong in (
        ("all correct", 0),
        (f"{size - size // 10} correct, {size // 10} wrong", size // 10),
    ):
        submitted, grading = tmp / f"large-{wrong}", tmp / f"large-{wrong}-grading"
        _large_class(submitted, size, wrong)
        seconds = _forge_grade(submitted, grading, jobs)
        verdict = "met" if seconds <= 300 else "missed"
        rows.append(f"| {name} | {seconds:.0f} s | {seconds / size:.2f} | {verdict} |")
        shutil.rmtree(submitted)
        shutil.rmtree(grading)
    return [
        f"A class of {size} chapter 04 submissions (the solved sample; the wrong ones of every "
        f"kind in `tests/answers/ch04.py`), graded once by `forge-course grade --jobs {jobs}` "
        "in the sandbox, start-up included. Budget: 5 minutes.",
        "",
        "| class | whole class | seconds per submission | |",
        "| --- | --- | --- | --- |",
        *rows,
    ]


def bench_setup(tmp: Path) -> list[str]:
    """`make setup` as a fresh clone runs it: a new venv, pip upgraded, the package and its tools,
    with pip's cache turned off so that every wheel is read and installed again."""
    venv = tmp / "venv"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([*pip, "--upgrade", "pip"], check=True, env=env)
    subprocess.run([*pip, "-c", str(REPO / "constraints.txt"), "-e", f"{REPO}[dev]"], check=True,
                   env=env)  # fmt: skip
    seconds = time.perf_counter() - start
    verdict = "met" if seconds <= SETUP_SECONDS else "**missed**"
    return [
        f"`make lab`'s set-up (`make setup`) into a new virtual environment: **{seconds:.0f} s** "
        f"(budget {SETUP_SECONDS // 60} minutes: {verdict}), "
        "with pip's cache off; the wheels come from this machine's local wheel folder and "
        "package index (no network), so a download over the internet adds its own time "
        "(the CPU build of torch is about 200 MB)."
    ]


# Chapter 10 stops its compile demo after 25 s to keep its own time; here the figure matters more.
COMPILE_SECONDS = 60
# A copy of chapter 10's torch.compile demo (a notebook cannot be imported), run as the chapter
# runs it: in a fresh process, so that a slow or failing compile cannot take this one down.
COMPILE_SCRIPT = """
import json, time, torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
block = lambda: nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
model = nn.Sequential(block(), block())
x = torch.randn(64, 64)

def fastest(fn, n=50):
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
    return min(times) * 1e3

with torch.no_grad():
    eager_ms = fastest(lambda: model(x))
    compiled = torch.compile(model)
    start = time.perf_counter()
    compiled(x)
    first_s = time.perf_counter() - start
    compiled_ms = fastest(lambda: compiled(x))
print(json.dumps(dict(first_s=first_s, eager_ms=eager_ms, compiled_ms=compiled_ms)))
"""


def _race(contestants: dict, rounds: int, device: torch.device) -> dict[str, list[float]]:
    """Milliseconds of each contestant in each round, after three warm-up rounds. A round runs
    them in turn, so a change in the machine's load hits all of them alike."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    samples = {name: [] for name in contestants}
    for round_ in range(-3, rounds):
        for name, fn in contestants.items():
            start = time.perf_counter()
            fn()
            sync()
            if round_ >= 0:
                samples[name].append((time.perf_counter() - start) * 1e3)
    return samples


def _compile_claim() -> str:
    try:
        run = subprocess.run(
            [sys.executable, "-c", COMPILE_SCRIPT],
            capture_output=True,
            text=True,
            timeout=COMPILE_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return f"the first compile did not finish within {COMPILE_SECONDS} s"
    if run.returncode != 0:
        return f"`torch.compile` failed: {run.stderr.strip().splitlines()[-1]}"
    r = json.loads(run.stdout.splitlines()[-1])
    return (
        f"eager {r['eager_ms']:.3f} ms vs compiled {r['compiled_ms']:.3f} ms: "
        f"{r['eager_ms'] / r['compiled_ms']:.2f}× the eager speed; first call {r['first_s']:.1f} s"
    )


def bench_claims(repeats: int, with_compile: bool) -> list[str]:
    """The figures chapters 06 and 10 show, measured with their models, inputs and thread count."""
    from forge_course.reference.amp import autocast_dtype
    from forge_course.reference.memory import saved_activation_bytes
    from forge_course.sims.memory_compute import make_blocks, measure

    device = pick_device()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as both chapters do
    rows = [
        f"Measured {datetime.date.today()} on {describe(device)}; each ratio within this run.",
        "",
        "| claim (chapter) | measured here |",
        "| --- | --- |",
    ]
    try:
        # 06's running example and one validation batch of 32; untrained, as the bytes depend
        # on shapes only.
        torch.manual_seed(0)
        layers = []
        for width_in in (2, 64):
            layers += [nn.Linear(width_in, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3)]
        model = nn.Sequential(*layers, nn.Linear(64, 2)).to(device)
        batch = torch.randn(32, 2, device=device)
        saved = []
        for name, train, context in (
            ("train mode", True, nullcontext), ("eval mode", False, nullcontext),
            ("eval under `no_grad`", False, torch.no_grad),
            ("eval under `inference_mode`", False, torch.inference_mode),
        ):  # fmt: skip
            with context():
                saved.append(f"{name} {saved_activation_bytes(model.train(train), batch):,}")
        rows.append(f"| bytes saved for backward, one batch of 32 (06) | {', '.join(saved)} |")

        # 06's wide network: 4 hidden layers of 128, eval mode, one forward per context.
        torch.manual_seed(0)
        layers = [nn.Linear(2, 128)]
        for _ in range(4):
            layers += [nn.BatchNorm1d(128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 128)]
        wide = nn.Sequential(*layers, nn.Linear(128, 2)).to(device).eval()

        def forward(context, x):
            with context():
                wide(x)

        contexts = {"grad on": nullcontext, "`no_grad`": torch.no_grad,
                    "`inference_mode`": torch.inference_mode}  # fmt: skip
        for size in (1, 256):
            x = torch.randn(size, 2, device=device)
            race = {name: partial(forward, c, x) for name, c in contexts.items()}
            ms = {
                name: statistics.median(t) for name, t in _race(race, 60 * repeats, device).items()
            }
            gap = 1 - ms["`inference_mode`"] / ms["`no_grad`"]
            rows.append(
                f"| one forward of the wide network, batch {size}, median of {60 * repeats} "
                f"interleaved rounds (06) | {', '.join(f'{k} {v:.3f} ms' for k, v in ms.items())}; "
                f"`inference_mode` {abs(gap):.1%} {'faster' if gap > 0 else 'slower'} than "
                "`no_grad` |"
            )

        # 10's deep running example: 16 blocks Linear(64, 256) → GELU → Linear(256, 64).
        low = autocast_dtype(device)
        stack = nn.Sequential(*make_blocks(16, 64, seed=0)).to(device)

        def step(x, amp):
            with torch.autocast(device.type, dtype=low, enabled=amp):
                loss = stack(x).float().square().mean()
            loss.backward()
            stack.zero_grad()

        for size in (64, 1024):
            x = torch.randn(size, 64, generator=torch.Generator().manual_seed(0)).to(device)
            kept = []
            for amp in (False, True):
                with torch.autocast(device.type, dtype=low, enabled=amp):
                    kept.append(saved_activation_bytes(stack, x) / MB)
            race = _race({amp: partial(step, x, amp) for amp in (False, True)}, 7 * repeats, device)
            full, half = min(race[False]), min(race[True])
            rows.append(
                f"| training step of the 16 blocks, batch {size}, float32 vs autocast "
                f"{str(low)[6:]}, fastest of {7 * repeats} (10) | {full:.2f} ms vs {half:.2f} ms: "
                f"{full / half:.2f}× the float32 speed; {kept[0]:.2f} vs {kept[1]:.2f} MiB kept "
                "for backward |"
            )

        # 10's slider: the plain stack against 4 checkpoint segments, batch 64.
        blocks = {"n_layers": 16, "width": 64, "batch": 64, "device": str(device), "repeats": 7}
        plain, four = measure(0, **blocks), measure(4, **blocks)
        rows.append(
            "| gradient checkpointing of the 16 blocks, batch 64, k = 4 segments (10) | kept "
            f"for backward: {plain.saved_bytes:,} bytes plain, {four.saved_bytes:,} with k = 4, "
            f"at worst {four.peak_bytes:,} during backward "
            f"({four.peak_bytes / plain.saved_bytes:.0%} of plain); "
            f"{four.ms_per_step / plain.ms_per_step:.2f}× the plain step's time |"
        )
    finally:
        torch.set_num_threads(threads)
    compiled = (
        _compile_claim()
        if with_compile
        else "not measured with `--quick`: the first compile takes 10–25 s"
    )
    rows.append(
        "| `torch.compile` of 2 blocks, forward under `no_grad`, batch 64, on the CPU in a "
        f"fresh process (10) | {compiled} |"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="under 2 minutes: fewer runs, chapter 04 only, into benchmarks/quick.md",
    )
    args = parser.parse_args(argv)
    # nbgrader runs `alembic` by name, here and in the graders: put this environment's tools
    # first on PATH, as `make` does, so that `.venv/bin/python benchmarks/run.py` works too.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
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
        chapters = [CH] if args.quick else chapter_ids(REPO)
        lines += ["## Chapters", ""] + bench_chapters(repeats, tmp, chapters) + [""]
        cases = simulation_cases(device)
        if args.quick:  # a Python importing torch, then three training runs: seconds
            cases = [case for case in cases if case.engine != "crash_replay"]
        lines += ["## Simulations", ""] + bench_simulations(3 if args.quick else 20, cases) + [""]
        from redraws import TITLE as REDRAWS_TITLE  # benchmarks/redraws.py, beside this script
        from redraws import bench_redraws

        lines += [REDRAWS_TITLE, ""] + bench_redraws(1 if args.quick else 2) + [""]
        lines += ["## Grading", ""] + bench_grading(tmp, repeats, 1 if args.quick else 2) + [""]
        if not args.quick:  # minutes
            lines += bench_large_class(tmp, 300) + [""]
        from report import TITLE as REPORT_TITLE  # benchmarks/report.py, beside this script
        from report import bench_report

        lines += [REPORT_TITLE, ""] + bench_report(repeats) + [""]
        lines += (
            ["## Claims the chapters measure", ""] + bench_claims(repeats, not args.quick) + [""]
        )
        if not args.quick:  # every chapter graded once more: minutes
            from limits import TITLE, bench_limits  # benchmarks/limits.py, beside this script

            lines += [TITLE, ""] + bench_limits() + [""]
            lines += ["## Set-up", ""] + bench_setup(tmp) + [""]
    out = REPO / "benchmarks" / ("quick.md" if args.quick else "RESULTS.md")
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
