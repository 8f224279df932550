"""The arena: race a training configuration to 90% validation accuracy, and keep a scoreboard.

`run_arena(config, seed)` trains a `Trainer` for the whole run the config plans, validating after
every optimizer step, and reports the first step at which validation accuracy reached the target
(or None), the final accuracy and the wall time. `config_problems` says whether a config is inside
the arena's search space and step budget. `Scoreboard` keeps the results in a JSON file next to
the notebook, written atomically so an interrupted save never leaves half a file.
`arena_view` puts it all behind a few widgets.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import display

from forge_course.reference.training import (
    DEFAULT_CONFIG,
    OPTIMIZERS,
    SCHEDULERS,
    complete_config,
    spiral_data,
    steps_per_epoch,
)
from forge_course.sims.display import PALETTE, show
from forge_course.sims.trainer import Trainer

__all__ = [
    "TARGET_ACCURACY",
    "BUDGET_STEPS",
    "SEARCH_SPACE",
    "ArenaResult",
    "Scoreboard",
    "arena_view",
    "budget_epochs",
    "config_problems",
    "draw_results",
    "planned_steps",
    "run_arena",
]

TARGET_ACCURACY = 0.9  # validation accuracy to reach
BUDGET_STEPS = 50  # optimizer steps a challenge run may plan
SCOREBOARD_FILE = "arena_scoreboard.json"

#: What an arena config may choose, and the allowed range of each number (inclusive).
SEARCH_SPACE = {
    "optimizer": OPTIMIZERS,
    "scheduler": SCHEDULERS,
    "lr": (1e-4, 1.0),
    "momentum": (0.0, 0.99),
    "weight_decay": (0.0, 0.1),
    "step_size": (1, 100),
    "gamma": (0.01, 1.0),
    "epochs": (1, 200),
    "batch_size": (8, 300),
    "dropout": (0.0, 0.5),
}


def planned_steps(config: dict) -> int:
    """Optimizer steps the config's run makes: epochs × batches per epoch."""
    config = complete_config(config)
    return config["epochs"] * steps_per_epoch(len(spiral_data()[0]), config["batch_size"])


def config_problems(config, budget: int | None = None) -> list[str]:
    """Why ``config`` cannot enter the arena, one sentence per problem ([] when it can).

    Args:
        config: a dict with some of the keys of `SEARCH_SPACE` (the rest keep their defaults).
            The seed is the arena's choice, not the config's.
        budget: the most optimizer steps the run may plan, or None for no limit.
    """
    if not isinstance(config, dict):
        return [f"the configuration should be a dict, but it is a {type(config).__name__}"]
    problems = []
    if "seed" in config:
        problems.append("remove 'seed': the arena chooses the seeds, so luck cannot help")
    for key in sorted(set(config) - set(SEARCH_SPACE) - {"seed"}):
        problems.append(f"{key!r} is not a setting; the settings are {list(SEARCH_SPACE)}")
    for key, allowed in SEARCH_SPACE.items():
        if key not in config:
            continue
        value = config[key]
        if isinstance(allowed[0], str):
            if value not in allowed:
                problems.append(f"{key} must be one of {list(allowed)}, not {value!r}")
            continue
        low, high = allowed
        whole = isinstance(low, int)
        kind = int if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            problems.append(
                f"{key} must be a {'whole number' if whole else 'number'}, not {value!r}"
            )
        elif not low <= value <= high:
            problems.append(f"{key} must be between {low:g} and {high:g}, not {value:g}")
    if not problems and budget is not None:
        steps = planned_steps(config)
        if steps > budget:
            full = {**DEFAULT_CONFIG, **config}
            per_epoch = steps // full["epochs"]
            problems.append(
                f"the run plans {full['epochs']} epochs × {per_epoch} steps = {steps} steps, "
                f"over the budget of {budget}"
            )
    return problems


@dataclass
class ArenaResult:
    """What one arena run did. ``curve`` holds the validation accuracy after every step."""

    config: dict
    seed: int
    steps_to_target: int | None
    final_accuracy: float
    best_accuracy: float
    total_steps: int
    wall_time_s: float
    device: str
    curve: list[float] = field(default_factory=list, repr=False)


def run_arena(
    config: dict, seed: int = 0, device="cpu", target: float = TARGET_ACCURACY, progress=None
) -> ArenaResult:
    """Train ``config`` (with ``seed``) for its whole run; report steps to ``target`` and more.

    ``steps_to_target`` is the first step after which validation accuracy was at least
    ``target``, counting from 1, or None if it never was. ``wall_time_s`` covers building the
    model and every step, validation included. ``progress(done, total)`` is called after each step.
    """
    start = time.perf_counter()
    trainer = Trainer({**config, "seed": seed}, device=device)
    trainer.run(progress=progress)
    wall = time.perf_counter() - start
    curve = trainer.history["val_accuracy"]
    reached = next((i + 1 for i, acc in enumerate(curve) if acc >= target), None)
    arena_config = {k: v for k, v in trainer.config.items() if k != "seed"}
    return ArenaResult(
        arena_config, seed, reached, curve[-1], max(curve), trainer.total_steps, wall,
        str(trainer.device), curve,
    )  # fmt: skip


def _rank(entry: dict) -> tuple:
    steps = entry["steps_to_target"]
    return (steps is None, steps or 0, -entry["final_accuracy"], entry["wall_time_s"])


class Scoreboard:
    """The best arena runs, kept in a JSON file (``arena_scoreboard.json`` in the working folder).

    Entries are ranked by steps to target (runs that never reached it last), then by final
    accuracy, then by wall time. Recording the same config and seed again replaces its entry:
    on the CPU the run is deterministic, so only the name and the wall time can change.
    """

    def __init__(self, path: str | os.PathLike = SCOREBOARD_FILE):
        self.path = Path(path)

    def entries(self) -> list[dict]:
        """Every recorded run, best first ([] when there is no file yet)."""
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return sorted(data["runs"], key=_rank)
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(
                f"{self.path} is not an arena scoreboard ({err}); move it away to start afresh."
            ) from err

    def record(self, result: ArenaResult, name: str) -> int:
        """Add ``result`` under ``name``; return its rank (1 is best)."""
        entry = {k: v for k, v in asdict(result).items() if k != "curve"}
        entry["name"] = name
        runs = [
            e for e in self.entries()
            if (e["config"], e["seed"]) != (entry["config"], entry["seed"])
        ]  # fmt: skip
        runs = sorted([*runs, entry], key=_rank)
        self._write({"target": TARGET_ACCURACY, "runs": runs})
        return runs.index(entry) + 1

    def _write(self, data: dict) -> None:
        # Write a temporary file next to the real one, then rename it over the old file: a
        # rename within one folder is atomic, so a reader sees the old board or the new one.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
        )
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def table(self, top: int = 10) -> str:
        """The best ``top`` entries as a text table."""
        lines = [
            f"{'#':>2}  {'name':<16} {'optimizer':<9} {'lr':>7} {'schedule':<9} {'batch':>5} "
            f"{'steps to 90%':>12} {'final acc':>9} {'time':>7}"
        ]
        for rank, e in enumerate(self.entries()[:top], start=1):
            c = e["config"]
            reached = "never" if e["steps_to_target"] is None else str(e["steps_to_target"])
            lines.append(
                f"{rank:>2}  {e['name'][:16]:<16} {c['optimizer']:<9} {c['lr']:>7.3g} "
                f"{c['scheduler']:<9} {c['batch_size']:>5} {reached:>12} "
                f"{e['final_accuracy']:>9.0%} {e['wall_time_s']:>6.2f}s"
            )
        return "\n".join(lines)


# ---------------------------------------------------------------- the view


def draw_results(results: list[tuple[str, ArenaResult]], ax=None):
    """Validation accuracy per step of each named run, with the target and each run's finish."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.8))
    colours = [PALETTE[c] for c in ("blue", "orange", "green", "vermillion", "purple", "sky")]
    for i, (name, result) in enumerate(results):
        colour = colours[i % len(colours)]
        steps = range(1, len(result.curve) + 1)
        reached = result.steps_to_target
        label = f"{name}: " + (f"90% at step {reached}" if reached else "never 90%")
        ax.plot(steps, result.curve, color=colour, lw=1.3, label=label)
        if reached:
            ax.plot(reached, result.curve[reached - 1], "o", color=colour)
    ax.axhline(TARGET_ACCURACY, color=PALETTE["grey"], ls="--", lw=1)
    ax.axvline(BUDGET_STEPS, color=PALETTE["black"], ls=":", lw=1)
    ax.set(
        xlabel="optimizer step", ylabel="validation accuracy", xscale="log",
        title="Arena: validation accuracy after every step (dotted: 50-step budget)",
    )  # fmt: skip
    ax.set_ylim(0.3, 1.02)
    ax.legend(fontsize=8, loc="lower right")
    return ax.figure


def arena_view(scoreboard: Scoreboard, device="cpu", shown: list | None = None) -> None:
    """Controls for an arena config, a Run button with a progress bar, the curves and the board.

    ``shown``: ``(name, ArenaResult)`` pairs already run, drawn first (and in the still picture).
    """
    import ipywidgets as widgets

    results = list(shown or [])
    optimizer = widgets.Dropdown(options=OPTIMIZERS, value="adam", description="optimizer")
    lr = widgets.FloatLogSlider(
        0.01, base=10, min=-4, max=0, description="lr", continuous_update=False
    )
    scheduler = widgets.Dropdown(options=SCHEDULERS, value="constant", description="schedule")
    batch = widgets.Dropdown(options=[8, 16, 32, 64, 100, 150, 300], value=32, description="batch")
    epochs = widgets.IntSlider(20, 1, 60, description="epochs")
    name = widgets.Text("my run", description="name")
    run_button = widgets.Button(description="Run", tooltip="train this config and score it")
    bar = widgets.IntProgress(0, 0, 1, description="progress")
    status = widgets.HTML()
    out = widgets.Output()

    def redraw():
        with out:
            out.clear_output(wait=True)
            if results:
                fig = draw_results(results[-6:])
                display(fig)
                plt.close(fig)
            print(scoreboard.table())

    def on_run(_):
        config = {
            "optimizer": optimizer.value, "lr": lr.value, "scheduler": scheduler.value,
            "batch_size": batch.value, "epochs": epochs.value,
        }  # fmt: skip
        problems = config_problems(config)
        if problems:
            status.value = "; ".join(problems)
            return

        def progress(done, total):
            bar.max, bar.value = total, done

        result = run_arena(config, device=device, progress=progress)
        rank = scoreboard.record(result, name.value)
        results.append((name.value, result))
        plan = planned_steps(config)
        budget_note = "" if plan <= BUDGET_STEPS else f" (plans {plan} steps: over the budget)"
        status.value = (
            f"{name.value}: steps to 90% {result.steps_to_target or 'never'}, final accuracy "
            f"{result.final_accuracy:.0%}, {result.wall_time_s:.2f} s; rank {rank}{budget_note}"
        )
        redraw()

    run_button.on_click(on_run)
    redraw()
    controls = widgets.VBox(
        [
            widgets.HBox([optimizer, lr, scheduler]),
            widgets.HBox([batch, epochs, name]),
            widgets.HBox([run_button, bar]),
            status,
        ]
    )
    if results:
        static = draw_results(results)
    else:
        static = plt.figure(figsize=(8, 1))
        static.suptitle("Arena: no runs yet")
    show(widgets.VBox([controls, out]), static)


def budget_epochs(batch_size: int, budget: int = BUDGET_STEPS) -> int:
    """The most epochs that fit ``budget`` steps at ``batch_size`` (at least 1)."""
    return max(1, budget // steps_per_epoch(len(spiral_data()[0]), batch_size))
