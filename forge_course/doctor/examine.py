"""`diagnose`: run a training function on the doctor's patient, under its instruments."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from forge_course.device import pick_device
from forge_course.doctor import patient
from forge_course.doctor.findings import read_chart
from forge_course.doctor.instruments import Chart, WatchedLoader
from forge_course.doctor.report import Report
from forge_course.doctor.sources import Sources

Fit = Callable[..., object]


def diagnose(fit: Fit, *, epochs: int = 2, device: torch.device | str | None = None) -> Report:
    """Run `fit` once on a small seeded problem and name the silent bugs the run shows.

    The doctor builds the patient (a tiny MLP with Dropout, 7 training and 3 validation batches,
    see `patient`), calls ``fit(model, optimizer, loss_fn, train_loader, val_loader, epochs,
    device)`` with its instruments attached, and reads the chart (rules in `findings`). The run
    is seeded and the global random state is restored afterwards, so a report is reproducible and
    diagnosing leaves no trace.

    Args:
        fit: the training function to examine. It receives the model on the CPU, as a freshly
            built model is, so it must move it to `device` itself; `optimizer` is SGD over all the
            model's parameters (`fit` may build its own instead); `loss_fn` is
            `nn.CrossEntropyLoss()`. What `fit` returns is only checked for graphs it keeps alive.
        epochs: passed on to `fit`. Two is the least that shows what happens between epochs.
        device: the device `fit` is asked to train on; `pick_device()` when None.

    Returns:
        A `Report`. If `fit` raises, the report holds a `fit_raised` finding with the error, plus
        whatever the run showed before it.
    """
    wanted = torch.device(device) if device is not None else pick_device()
    threads = torch.get_num_threads()
    # The patient is tiny: extra threads only add hand-offs, which on a busy machine cost tens of
    # milliseconds per operation. One thread keeps an examination fast and its timing steady.
    torch.set_num_threads(1)
    try:
        report = _examine(fit, epochs, wanted)
    finally:
        torch.set_num_threads(threads)
    return report


def _examine(fit: Fit, epochs: int, wanted: torch.device) -> Report:
    error = None
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        torch.manual_seed(patient.SEED)
        train_set, val_set = patient.make_datasets(torch.Generator().manual_seed(patient.SEED))
        sources = Sources(train_set.tensors[0], val_set.tensors[0])
        chart = Chart(wanted, sources, epochs, patient.batches_per_epoch(), patient.N_TRAIN)
        model = patient.PatientNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=patient.LEARNING_RATE)
        loss_fn = nn.CrossEntropyLoss()
        train_loader = WatchedLoader(
            train_set,
            chart=chart,
            phase="train",
            batch_size=patient.BATCH_SIZE,
            shuffle=True,
            generator=torch.Generator().manual_seed(patient.SEED),
        )
        val_loader = WatchedLoader(val_set, chart=chart, phase="val", batch_size=patient.BATCH_SIZE)
        with chart.attached(model, loss_fn):
            try:
                result = fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, wanted)
                chart.after_fit()
                del result
            except Exception as exc:  # a crashing loop is a finding, not a crash of the doctor
                error = exc
    seen = {
        "training_forwards": sum(r.backpropagated for r in chart.forwards),
        "validation_forwards": sum(r.validation for r in chart.forwards),
        "updates": len(chart.updates),
        "epochs": len({r.epoch for r in chart.forwards if r.backpropagated}),
    }
    return Report(read_chart(chart, error), seen)
