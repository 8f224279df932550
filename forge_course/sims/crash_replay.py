"""Crash-and-resume replay: a real training process, killed with SIGKILL and resumed.

Run as ``python -m forge_course.sims.crash_replay FOLDER --tag TAG [--kill-at K] [--resume]``,
it trains chapter 09's running example (an MLP on the 2-D spiral) with the reference
checkpointing, appending one ``step loss`` line per step to ``FOLDER/losses-TAG.txt`` (the loss
as a float hex, so nothing is lost in printing). With ``--kill-at K`` the process sends itself
SIGKILL during step K, after backward and before the optimizer step: nothing gets to clean up,
exactly as when a machine is pre-empted. With ``--resume`` it starts from the newest checkpoint
in FOLDER; with ``--wait`` as well, it first imports and builds everything, then waits for a line
on its standard input before it looks for that checkpoint.

Every random generator matters in this run, so a resume that forgot one would show: the sampler
shuffles (its own generator), dropout draws from torch's, each batch is scaled by a factor from
Python's ``random`` and jittered by NumPy. AdamW's moments and a per-epoch StepLR make the
optimizer and scheduler states matter too.

`replay` runs an uninterrupted process and a killed one side by side, then the resume, and
returns the losses; `draw_replay` lays the curves over each other. The resuming process is
started with the other two and waits: a process's start is mostly importing torch (about 2.4 s
here, half of it `torch._dynamo`, which the first optimizer imports), so a resume started only
after the kill would double the replay's time.
"""

from __future__ import annotations

import argparse
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


def train(
    folder: Path, log, kill_at: int | None = None, resume: bool = False, ready=lambda: None
) -> None:
    """Train EPOCHS epochs, checkpointing every EVERY steps into `folder`; log each loss.

    ``ready()`` is called once everything is built, before a resume looks for its checkpoint.
    """
    model, optimizer, scheduler, sampler, loader = build()
    ready()
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
                os.kill(os.getpid(), signal.SIGKILL)
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


def _command(folder: Path, tag: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "forge_course.sims.crash_replay", str(folder), "--tag", tag,
            *extra]  # fmt: skip


def replay(folder: str | os.PathLike, kill_at: int = KILL_AT, timeout: float = 120) -> dict:
    """Run the uninterrupted and the killed process at once, then resume the killed one.

    Returns:
        ``uninterrupted``, ``killed`` and ``resumed``: ``{step: loss}`` of each process;
        ``returncode``: the killed process's (``-9`` for SIGKILL on POSIX);
        ``resumed_from``: the step of the checkpoint the resume loaded;
        ``checkpoints``: the checkpoint files the killed run left, by name.
    """
    folder = Path(folder)
    straight, crashed = folder / "uninterrupted", folder / "crashed"
    straight.mkdir(parents=True)
    crashed.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}

    def start(folder_: Path, tag: str, *extra: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(
            _command(folder_, tag, *extra), env=env, stderr=subprocess.PIPE, text=True, **kwargs
        )

    straight_run = start(straight, "run")
    killed_run = start(crashed, "killed", "--kill-at", str(kill_at))
    resume = start(crashed, "resumed", "--resume", "--wait", stdin=subprocess.PIPE)
    try:
        codes = [_finish(straight_run, timeout), _finish(killed_run, timeout)]
        checkpoints = sorted(p.name for p in crashed.glob("step-*.pt"))
        resumed_from = int(latest_checkpoint(crashed).name[5:13])
        # Only now, with the killed run dead, may the resume look for its checkpoint.
        _finish(resume, timeout, allowed=(0,), line="the killed run is dead\n")
    finally:
        for process in (straight_run, killed_run, resume):
            process.kill()  # a no-op for a process that has ended
    return {
        "uninterrupted": read_losses(straight / "losses-run.txt"),
        "killed": read_losses(crashed / "losses-killed.txt"),
        "resumed": read_losses(crashed / "losses-resumed.txt"),
        "returncode": codes[1],
        "resumed_from": resumed_from,
        "checkpoints": checkpoints,
    }


def _finish(
    process: subprocess.Popen, timeout: float, allowed=(0, -signal.SIGKILL), line=None
) -> int:
    """Send ``line`` to ``process`` if given and wait for it; its exit code, or its error output
    if it failed otherwise."""
    _, err = process.communicate(line, timeout=timeout)
    if process.returncode not in allowed:
        raise RuntimeError(f"the training process failed:\n{err}")
    return process.returncode


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
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tag", default="run", help="names the log: losses-<tag>.txt")
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--wait", action="store_true", help="start on a line of standard input")
    args = parser.parse_args()
    torch.set_num_threads(1)  # every process adds up in the same order
    with open(args.folder / f"losses-{args.tag}.txt", "a") as log:
        train(args.folder, log, kill_at=args.kill_at, resume=args.resume,
              ready=sys.stdin.readline if args.wait else lambda: None)  # fmt: skip


if __name__ == "__main__":
    main()
