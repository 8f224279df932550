"""The table of contents: one line per chapter, shared by the index notebook and the README."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chapter:
    id: str
    title: str
    summary: str
    minutes: int  # time to work through it, exercises included


CHAPTERS = [
    Chapter(
        "ch00_training_arithmetic",
        "Vocabulary and training arithmetic",
        "Batches, steps, epochs and accumulation, counted exactly.",
        30,
    ),
    Chapter(
        "ch01_autograd_tape",
        "Tensors and the autograd tape",
        "How backward finds every gradient, written by hand, and when it refuses.",
        55,
    ),
    Chapter(
        "ch02_datasets_dataloaders",
        "Datasets and DataLoaders",
        "From a CSV file to batches, with workers that neither repeat nor copy each other.",
        45,
    ),
    Chapter(
        "ch03_samplers_collation",
        "Shuffling, samplers and collation",
        "Who decides the order of examples, and how ragged ones become a batch.",
        40,
    ),
    Chapter(
        "ch04_one_training_step",
        "Anatomy of one training step",
        "zero_grad, forward, loss, backward, step: by hand, then in PyTorch.",
        45,
    ),
    Chapter(
        "ch05_modules_devices",
        "nn.Module and devices",
        "What a module registers and moves, hooks, initialisation, tied and frozen weights.",
        60,
    ),
    Chapter(
        "ch06_evaluation_loop",
        "The evaluation loop",
        "eval() and no_grad() are two switches: what each one does, measured.",
        35,
    ),
    Chapter(
        "ch07_bug_museum",
        "Bug museum: silent training failures",
        "Loops that run without error and learn the wrong thing.",
        50,
    ),
    Chapter(
        "ch08_training_arena",
        "Training simulator and arena",
        "Optimizers and schedules on a spiral, against the clock.",
        40,
    ),
    Chapter(
        "ch09_production_loop",
        "The production loop",
        "Checkpoints that resume bit for bit, seeding, logging.",
        50,
    ),
    Chapter(
        "ch10_scaling_one_device",
        "Scaling on one device",
        "Accumulation, mixed precision, checkpointing and compile, measured.",
        50,
    ),
    Chapter(
        "ch11_distributed",
        "Distributed training",
        "All-reduce by hand, DDP with real processes, restarts, checkpoints and FSDP2.",
        70,
    ),
    Chapter(
        "ch12_capstone",
        "Cheat sheet and capstone",
        "The whole loop on one page, and a script that passes the loop doctor.",
        60,
    ),
    Chapter(
        "ch13_profiling",
        "Profiling: where the time and the memory go",
        "torch.profiler on the running example: a slow input pipeline found, fixed and measured.",
        45,
    ),
]
