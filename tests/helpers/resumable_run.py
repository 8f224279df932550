"""A small training run that checkpoints, can be killed mid-step, and resumes: for test_checkpoint.

Everything random in it matters, so a resume that forgets any state shows up in the losses:
the sampler shuffles, dropout draws from torch's generator, the inputs are scaled by a factor from
Python's `random` and jittered with NumPy noise. SGD has momentum and StepLR decays the rate once
per epoch, so the optimizer and scheduler states matter too.

Run as a script (``python tests/helpers/resumable_run.py FOLDER [--kill-at K] [--resume]``) it
appends ``step loss`` lines (loss as a float hex, exact) to FOLDER/losses-<tag>.txt and writes the
final weights to FOLDER/final.pt. With ``--kill-at K`` it sends itself SIGKILL during step K,
after backward and before the optimizer step, so nothing gets a chance to clean up.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from forge_course.reference.checkpoint import (
    ResumableSampler,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

DATA_SIZE = 96  # examples
BATCH = 8  # examples per step: 12 steps per epoch
EPOCHS = 4  # 48 steps in all
EVERY = 4  # steps between checkpoints: some fall mid-epoch, some on an epoch's last step
SEED = 0


def build(seed: int = SEED):
    """Model, optimizer, scheduler, sampler and loader, all from one seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(DATA_SIZE, 6, generator=data)
    y = x[:, :3].sum(dim=1, keepdim=True) + 0.1 * torch.randn(DATA_SIZE, 1, generator=data)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    sampler = ResumableSampler(DATA_SIZE, seed=seed, shuffle=True)
    # Its own generator: otherwise every iter(loader) draws a worker seed from torch's global
    # generator, and a run resumed mid-epoch would draw once more than the original.
    loader = DataLoader(
        TensorDataset(x, y), batch_size=BATCH, sampler=sampler, generator=torch.Generator()
    )
    return model, optimizer, scheduler, sampler, loader


def train(
    folder: str | os.PathLike,
    on_step: Callable[[int, float], None],
    kill_at: int | None = None,
    resume: bool = False,
) -> nn.Module:
    """Train for EPOCHS epochs, checkpointing into `folder`; report each step's loss to `on_step`.

    With ``resume=True`` the run continues from the newest loadable checkpoint in `folder`.
    """
    folder = Path(folder)
    model, optimizer, scheduler, sampler, loader = build()
    first_epoch, step = 0, 0
    last = latest_checkpoint(folder) if resume else None
    if last is not None:
        counters = load_checkpoint(last, model, optimizer, scheduler, sampler=sampler)
        first_epoch, step = counters["epoch"], counters["step"]

    for epoch in range(first_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            step += 1
            noise = torch.from_numpy(np.random.normal(0.0, 0.05, x.shape)).float()
            x = x * random.uniform(0.9, 1.1) + noise
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            on_step(step, loss.item())
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.step()
            if step % EVERY == 0:
                save_checkpoint(
                    checkpoint_path(folder, step),
                    model,
                    optimizer,
                    scheduler,
                    sampler=sampler,
                    epoch=epoch,
                    step=step,
                )
        scheduler.step()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tag", default="run", help="names the loss log: losses-<tag>.txt")
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    # One thread, so every run does its arithmetic in the same order.
    torch.set_num_threads(1)
    with open(args.folder / f"losses-{args.tag}.txt", "a") as log:

        def write(step: int, loss: float) -> None:
            log.write(f"{step} {loss.hex()}\n")
            log.flush()

        model = train(args.folder, write, kill_at=args.kill_at, resume=args.resume)
    torch.save(model.state_dict(), args.folder / "final.pt")


if __name__ == "__main__":
    main()
