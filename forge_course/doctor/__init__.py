"""The loop doctor: run a training loop under instrumentation and name the silent bugs it shows.

Most training bugs do not crash: a missing `zero_grad()`, validation in train mode, a list of
loss tensors that keeps every step's autograd nodes alive. The doctor hands a learner's training
function a small, seeded problem, watches the run (forward and gradient hooks, every optimizer
step, the loaders, the loss), and reports each bug it sees with a stable code, a one-sentence
explanation and the evidence from this run::

    from forge_course.doctor import diagnose

    # fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)
    report = diagnose(fit)
    report.codes  # e.g. ["missing_zero_grad"]; report.ok is True when there is none

From a shell: ``forge-course doctor path/to/script.py:fit`` or
``python -m forge_course.doctor path/to/script.py:fit``.

Modules: `patient` (the model and data), `sources` (which data set a batch came from),
`schedulers` (how often each scheduler steps), `instruments` (what is watched), `findings` (the
rule for every code), `report` (codes, messages, output), `examine` (`diagnose`), `cli` (`main`).

A forward counts as validation or training by its input's rows, not by the loader that yielded
last, so loops that cache batches on the device, build their own DataLoader over the datasets,
interleave the loaders or draw batches through generators are read correctly.
`tests/doctor_corpus/` holds the labelled loops that measure this (see the README).

Limits: the doctor sees the model's forwards through module hooks, so a loop that calls
`model.forward(x)` directly hides its forwards (gradients and updates are still seen). The
softmax and accumulation checks watch the `loss_fn` it hands over, not a loss the loop builds
itself. An input whose values the loop changes (normalised, cast to half precision) matches no
example, so validation checks skip it. A scheduler's rate is judged only when its length ties it
to the run's epochs or batches (see `schedulers`).
"""

from forge_course.doctor.cli import main
from forge_course.doctor.examine import diagnose
from forge_course.doctor.report import CODES, Finding, Report

__all__ = ["CODES", "Finding", "Report", "diagnose", "main"]
