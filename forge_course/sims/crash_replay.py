"""Crash-and-resume replay: real training processes, one killed with SIGKILL, one resuming it.

Run as ``python -m forge_course.sims.crash_replay FOLDER [--kill-at K]``, one Python imports
torch and the course once, then starts three training processes from itself (forked on Linux:
a process's start is mostly importing torch, about 2.4 s here, half of it `torch._dynamo`, which
the first optimizer imports; started by spawn elsewhere). Each trains chapter 09's running example
(an MLP on the 2-D spiral) with the reference checkpointing from scratch, appending one
``step loss`` line per step to its ``losses-TAG.txt`` (the loss as a float hex, so nothing is
lost in printing):

- ``uninterrupted/losses-run.txt``: 50 steps, nothing happens to it;
- ``crashed/losses-killed.txt``: at the same time, a process that sends itself SIGKILL during
  step K, after backward and before the optimizer step: nothing gets to clean up, exactly as
  when a machine is pre-empted;
- ``crashed/losses-resumed.txt``: once that one is dead, a new process that starts from the
  newest checkpoint it left.

Every random generator matters in this run, so a resume that forgot one would show: the sampler
shuffles (its own generator), dropout draws from torch's, each batch is scaled by a factor from
Python's ``random`` and jittered by NumPy. AdamW's moments and a per-epoch StepLR make the
optimizer and scheduler states matter too.

`replay` runs that command and returns the losses; `draw_replay` lays the curves over each
other.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from forge_course.data import make_spiral, train_val_split
from forge_course.reference.checkpoint import (
    ResumableSampler,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

SEED = 0
BATCH = 32  # 300 training points: 10 steps per epoch, the last batch holds 12
EPOCHS = 5  # 50 steps
EVERY = 4  # optimizer steps between checkpoints
KILL_AT = 23  # the step during which the default replay is killed (epoch 2, its 3rd step)
# As uncatchable as SIGKILL: Windows has none, and its os.kill(pid, SIGTERM) is TerminateProcess.
KILL = getattr(signal, "SIGKILL", signal.SIGTERM)
KILLED = -KILL if os.name == "posix" else KILL  # the killed process's exit code


def build(seed: int = SEED):
    """Model, optimizer, scheduler, sampler and loader, every generator seeded."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    X, y = make_spiral(n_per_class=200, seed=seed)
    x_train, y_train, _, _ = train_val_split(X, y, val_fraction=0.25, seed=seed)
    model = nn.Sequential(
        nn.Linear(2, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 32), nn.ReLU(),
        nn.Linear(32, 2),
    )  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
    sampler = ResumableSampler(len(x_train), seed=seed)
    # Its own generator: every iter(loader) draws a seed, and a resumed epoch starts one more.
    loader = DataLoader(
        TensorDataset(x_train, y_train), BATCH, sampler=sampler, generator=torch.Generator()
    )
    return model, optimizer, scheduler, sampler, loader


def train(folder: Path, log, kill_at: int | None = None, resume: bool = False) -> None:
    """Train EPOCHS epochs, checkpointing every EVERY steps into `folder`; log each loss."""
    model, optimizer, scheduler, sampler, loader = build()
    start_epoch, step = 0, 0
    last = latest_checkpoint(folder) if resume else None
    if last is not None:
        counters = load_checkpoint(last, model, optimizer, scheduler, sampler=sampler)
        start_epoch, step = counters["epoch"], counters["step"]
    for epoch in range(start_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            step += 1
            x = x * random.uniform(0.95, 1.05)
            x = x + torch.from_numpy(np.random.normal(0.0, 0.01, tuple(x.shape))).float()
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            log.write(f"{step} {loss.item().hex()}\n")
            log.flush()
            if step == kill_at:
                os.kill(os.getpid(), KILL)
            optimizer.step()
            if step % EVERY == 0:
                save_checkpoint(
                    checkpoint_path(folder, step), model, optimizer, scheduler,
                    sampler=sampler, epoch=epoch, step=step,
                )  # fmt: skip
        scheduler.step()


def read_losses(path: Path) -> dict[int, float]:
    """``{step: loss}`` from a log; a step logged twice keeps its last value."""
    losses = {}
    for line in Path(path).read_text().splitlines():
        step, value = line.split()
        losses[int(step)] = float.fromhex(value)
    return losses


def _run(folder: Path, tag: str, kill_at: int | None = None, resume: bool = False) -> None:
    """One training process: `train`, logging into ``folder/losses-<tag>.txt``."""
    torch.set_num_threads(1)  # every process adds up in the same order
    with open(folder / f"losses-{tag}.txt", "a") as log:
        train(folder, log, kill_at=kill_at, resume=resume)


def launch(folder: Path, kill_at: int = KILL_AT) -> dict:
    """The three processes of the replay; what the killed run left, for `replay`."""
    straight, crashed = folder / "uninterrupted", folder / "crashed"
    straight.mkdir(parents=True)
    crashed.mkdir(parents=True)
    build()  # imports everything a run needs, once, before the processes start
    # Fork on Linux only: macOS can fork, but its system libraries are not safe to use in a
    # forked child (hence spawn, its default); Windows cannot.
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")

    def finish(*processes) -> list[int]:
        for process in processes:
            process.join()
        return [process.exitcode for process in processes]

    first = context.Process(target=_run, args=(straight, "run"))
    second = context.Process(target=_run, args=(crashed, "killed", kill_at))
    first.start()
    second.start()
    codes = finish(first, second)
    if codes != [0, KILLED]:
        raise RuntimeError(f"the training processes ended with exit codes {codes}")
    checkpoints, newest = (
        sorted(p.name for p in crashed.glob("step-*.pt")),
        latest_checkpoint(crashed),
    )
    # Only now, with the killed run dead, does a new process look for its checkpoint.
    third = context.Process(target=_run, args=(crashed, "resumed", None, True))
    third.start()
    if finish(third) != [0]:
        raise RuntimeError(f"the resumed process ended with exit code {third.exitcode}")
    return {
        "returncode": codes[1],
        "resumed_from": int(newest.name[5:13]),
        "checkpoints": checkpoints,
    }


def replay(folder: str | os.PathLike, kill_at: int = KILL_AT, timeout: float = 120) -> dict:
    """Run the replay's command: the uninterrupted and the killed process at once, then the
    resume of the killed one.

    Returns:
        ``uninterrupted``, ``killed`` and ``resumed``: ``{step: loss}`` of each process;
        ``returncode``: the killed process's (``-9`` for SIGKILL on POSIX);
        ``resumed_from``: the step of the checkpoint the resume loaded;
        ``checkpoints``: the checkpoint files the killed run left, by name.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "forge_course.sims.crash_replay", str(folder),
               "--kill-at", str(kill_at)]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if ran.returncode != 0:
        raise RuntimeError(f"the replay failed:\n{ran.stderr}")
    return {
        "uninterrupted": read_losses(folder / "uninterrupted" / "losses-run.txt"),
        "killed": read_losses(folder / "crashed" / "losses-killed.txt"),
        "resumed": read_losses(folder / "crashed" / "losses-resumed.txt"),
        **json.loads((folder / "replay.json").read_text()),
    }


def draw_replay(result: dict, kill_at: int = KILL_AT):
    """The uninterrupted curve, the killed run, and the resumed run laid over them."""
    import matplotlib.pyplot as plt

    from forge_course.sims.display import PALETTE

    fig, ax = plt.subplots(figsize=(9, 3.6))
    straight, killed, resumed = result["uninterrupted"], result["killed"], result["resumed"]
    ax.plot(list(straight), list(straight.values()), color=PALETTE["grey"], lw=5, alpha=0.6,
            label="uninterrupted process")  # fmt: skip
    ax.plot(list(killed), list(killed.values()), color=PALETTE["vermillion"], marker=".",
            label=f"killed process (SIGKILL during step {kill_at})")  # fmt: skip
    ax.plot(list(resumed), list(resumed.values()), color=PALETTE["blue"], ls="--",
            label=f"resumed process (from step {result['resumed_from']})")  # fmt: skip
    ax.axvline(kill_at, color=PALETTE["vermillion"], lw=0.8, ls=":")
    ax.axvline(result["resumed_from"], color=PALETTE["blue"], lw=0.8, ls=":")
    ax.set(xlabel="optimizer step", ylabel="training loss (cross-entropy, one batch)",
           title="Killed, resumed from the last checkpoint: the curves coincide")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the runs write (it must be empty)")
    parser.add_argument("--kill-at", type=int, default=KILL_AT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    summary = launch(args.folder, args.kill_at)
    (args.folder / "replay.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
