"""The rules that turn the doctor's chart into findings: one function per code.

Each rule returns the evidence for its finding, or None. Words used below:

- a *training forward* is one that backward later ran through (its graph got a gradient);
- a *validation forward* is one on validation examples (see `sources`) that no backward used,
  however the loop got its batch (only an input matching no example is judged by the loader
  that yielded last);
- an *update* is one `optimizer.step()` by any optimizer (one `fit` builds itself included, and
  LBFGS's `step(closure)`), or a hand-written change of the parameters (``p -= lr * p.grad``)
  made while gradients were waiting in `.grad`;
- the run has ``epochs`` epochs of ``len(train_loader)`` batches (2 and 7 by default).

A rule that concludes something from what never happened ("no gradient ever arrived") only
applies when `fit` finished: a run cut short by an exception proves nothing by absence. Where two
findings would name one mistake twice, the more precise one is kept (`SUPPRESSES`).
"""

from __future__ import annotations

from collections.abc import Callable

from forge_course.doctor.instruments import Chart
from forge_course.doctor.report import CODES, Finding
from forge_course.doctor.sources import BOTH, TRAIN, VAL

Rule = Callable[[Chart, bool], str | None]

# A loop may keep one old graph on purpose (the first loss, for a log line); more graphs from
# two or more updates back alive at once means a collection that grows with the run.
OLD_GRAPHS_TOLERATED = 1


def _first(records) -> str:
    first = records[0]
    return f"the first at forward {first.index}" + (f", epoch {first.epoch}" if first.epoch else "")


def loaders_not_iterated(chart: Chart, finished: bool) -> str | None:
    """A finished run drew no batch from either given loader and fed the model none of their
    examples, so there was nothing to examine."""
    if not finished or chart.batches or any(r.source is not None for r in chart.forwards):
        return None
    return (
        f"`fit` returned after {len(chart.forwards)} forward(s) and {len(chart.updates)} "
        "update(s), none of them on a batch from `train_loader` or `val_loader`"
    )


def missing_zero_grad(chart: Chart, finished: bool) -> str | None:
    """Backward added into a `.grad` that still held a gradient some update had already applied.

    Intended accumulation adds into gradients that no update has used yet, so it does not count.
    The norms in the evidence are those in `.grad` at each update (after any clipping).
    """
    if not chart.reused_at:
        return None
    norms = chart.grad_norms
    return (
        f"from update {min(chart.reused_at)} on, {len(chart.reused_at)} of {len(norms)} updates "
        f"applied old gradients again; the gradient norm went from {norms[0]:.3g} at update 1 to "
        f"{norms[-1]:.3g} at update {len(norms)}"
    )


def trains_on_validation(chart: Chart, finished: bool) -> str | None:
    """A training forward's batch held validation examples."""
    train = [r for r in chart.forwards if r.training]
    bad = [r for r in train if r.source in (VAL, BOTH)]
    if not bad:
        return None
    return (
        f"{len(bad)} of {len(train)} training forwards were on batches with validation "
        f"examples, {_first(bad)}"
    )


def no_eval_mode(chart: Chart, finished: bool) -> str | None:
    """A validation forward ran while a Dropout module was in train mode."""
    val = [r for r in chart.forwards if r.validation]
    bad = [r for r in val if any(r.dropout_active)]
    if not bad:
        return None
    return f"{len(bad)} of {len(val)} validation forwards ran with Dropout active, {_first(bad)}"


def train_mode_not_restored(chart: Chart, finished: bool) -> str | None:
    """A training forward ran while a Dropout module was in eval mode."""
    train = [r for r in chart.forwards if r.training]
    bad = [r for r in train if not all(r.dropout_active)]
    if not bad:
        return None
    return f"{len(bad)} of {len(train)} training forwards ran with Dropout off, {_first(bad)}"


def grad_enabled_in_eval(chart: Chart, finished: bool) -> str | None:
    """A validation forward recorded a graph: autograd was on and something required gradients.

    Parameters switched to ``requires_grad=False`` record nothing, so they do not count.
    """
    val = [r for r in chart.forwards if r.validation]
    bad = [r for r in val if r.grad_enabled and r.graph is not None]
    if not bad:
        return None
    return f"{len(bad)} of {len(val)} validation forwards recorded a graph, {_first(bad)}"


def graph_kept_alive(chart: Chart, finished: bool) -> str | None:
    """More than `OLD_GRAPHS_TOLERATED` graphs were alive at once two or more updates after
    backward used them (or after they were made, if no backward did).

    Checked before every forward and once more after `fit` returns, so a returned list of losses
    counts. A loss kept one update longer (``previous = loss``) and the graphs of micro-batches
    waiting for one backward (accumulation by summing losses) are younger than that.
    """
    count, when = chart.old_graphs
    if count <= OLD_GRAPHS_TOLERATED:
        return None
    return f"{when}, the graphs of {count} forwards from two or more updates earlier were alive"


def stale_optimizer(chart: Chart, finished: bool) -> str | None:
    """A parameter received non-zero gradients, yet no update ever held it.

    The optimizer the doctor hands over holds every parameter, so this can only come from the
    loop: a module added or swapped in after that optimizer was built (a new head), or an
    optimizer `fit` builds over part of a model it still backpropagates through. Frozen
    parameters (`requires_grad=False`) get no gradient and are left out.
    """
    names = chart.never_stepped()
    if not finished or not names or not chart.updates:
        return None  # with no update at all, `no_learning` says it
    return (
        f"{', '.join(names)} received gradients, but none of the {len(chart.updates)} "
        "updates held them"
    )


def _nothing_applied(chart: Chart) -> bool:
    return not any(u.applied for u in chart.updates)


def _only_unheld_gradients(chart: Chart) -> bool:
    """Updates were made, but every parameter that got a gradient was outside all of them (an
    optimizer over a copy of the model): `stale_optimizer` names that cause."""
    got = [key for key, count in chart.backwards.items() if count]
    return bool(chart.updates and got) and all(not chart.covered[key] for key in got)


def no_learning(chart: Chart, finished: bool) -> str | None:
    """In a finished run, no update applied a non-zero gradient.

    Three ways to get there, told apart in the evidence: no gradient ever arrives (no backward,
    a forward under `no_grad`, a detached output), gradients arrive but are cleared before each
    update, or no update is made at all. When updates were made but none held a parameter that
    got gradients, `stale_optimizer` says so instead.
    """
    if not finished or not _nothing_applied(chart) or _only_unheld_gradients(chart):
        return None
    if not any(chart.backwards.values()):
        train = sum(r.source == TRAIN for r in chart.forwards)
        return f"{train} forwards on training batches, but not one non-zero gradient"
    if not chart.updates:
        return "gradients arrived, but no update was made (no `optimizer.step()`)"
    cleared = f" (the gradients of {chart.discarded} backward passes were cleared unapplied)"
    return f"gradients arrived, but all {len(chart.updates)} updates found `.grad` empty" + (
        cleared if chart.discarded else ""
    )


def step_once_per_epoch(chart: Chart, finished: bool) -> str | None:
    """A finished run made at most one update per epoch, each after a whole epoch's batches.

    "A whole epoch's batches" is two or more training forwards since the update before, on as
    many examples as the training set holds, whatever the batch size: accumulation over part of
    an epoch is not mistaken for this, and neither is full-batch gradient descent (one forward
    on the whole set per update). LBFGS's `step(closure)` is left out: a closure may run a whole
    epoch (full-batch LBFGS).
    """
    updates = chart.updates
    training = [r for r in chart.forwards if r.training]
    # Training forwards, and their examples, before each update and after the one before it.
    before = [[r for r in training if r.updates_before == n] for n in range(len(updates))]
    if (
        not finished
        or not 1 <= len(updates) <= chart.epochs
        or any(len(group) < 2 for group in before)
        or any(sum(r.examples for r in group) < chart.examples_per_epoch for group in before)
        or any(u.kind == "closure" for u in updates)
        or _nothing_applied(chart)
    ):
        return None
    fewest = min(len(group) for group in before)
    cleared = (
        f"; the gradients of {chart.discarded} of them were cleared before any update applied them"
        if chart.discarded
        else ""
    )
    return (
        f"{len(updates)} update(s) in {chart.epochs} epochs, each after {fewest} or more "
        "training batches" + cleared
    )


def accumulation_unscaled(chart: Chart, finished: bool) -> str | None:
    """An update applied the gradients of two or more losses, each backpropagated at full weight.

    A loss divided by the number of micro-batches (or weighted by its share of the examples)
    reaches backward with a weight below 1, so correct accumulation does not count. Only the
    `loss_fn` the doctor hands over is watched.
    """
    bad = [
        (number, len(u.loss_weights))
        for number, u in enumerate(chart.updates, start=1)
        if u.kind != "closure"
        and len(u.loss_weights) >= 2
        and all(abs(w - 1) < 1e-6 for w in u.loss_weights)
    ]
    if not bad:
        return None
    most = max(n for _, n in bad)
    return (
        f"{len(bad)} of {len(chart.updates)} updates each summed the gradients of up to {most} "
        f"undivided losses, so they were up to {most} times too large; the first was update "
        f"{bad[0][0]}"
    )


def optimizer_rebuilt(chart: Chart, finished: bool) -> str | None:
    """Two or more optimizers of the same class updated the same parameters, one after another."""
    groups: dict[tuple, list] = {}
    for record in chart.optimizers.values():
        key = (type(record.optimizer).__name__, record.params)
        groups.setdefault(key, []).append(record)
    (name, _), records = max(groups.items(), key=lambda item: len(item[1]), default=(("", 0), []))
    if len(records) < 2:
        return None
    starts = [r.first_update for r in records]
    shown = ", ".join(map(str, starts[:6])) + (", ..." if len(starts) > 6 else "")
    return (
        f"{len(records)} different {name} optimizers updated the same parameters; a new one "
        f"took over at updates {shown}"
    )


def scheduler_wrong_rate(chart: Chart, finished: bool) -> str | None:
    """A scheduler sized in epochs was stepped per batch, or one sized in batches per epoch.

    How often it was stepped: *per batch* when more than ``epochs`` times, or more than once in
    one pass over the training loader; *per epoch* when a finished run stepped it at least once
    and at most once per epoch. What its length (see `schedulers`) says:

    - stepped per batch, it was sized in epochs if its length is at most ``epochs``, if it is a
      whole schedule that was stepped past its end, or if it is a decay period shorter than one
      epoch's ``len(train_loader)`` batches;
    - stepped per epoch, it was sized in batches if its length is a multiple of
      ``len(train_loader)`` and at least the run's ``epochs * len(train_loader)`` batches.

    Any other length could be meant either way, so it is left alone.
    """
    epochs, batches = chart.epochs, chart.batches_per_epoch
    problems = []
    for record in chart.schedulers.records.values():
        if record.length is None:
            continue
        calls = len(record.epochs_of_steps)
        per_batch = calls > epochs or (chart.epoch > 0 and record.steps_in_one_epoch() > 1)
        per_epoch = finished and not per_batch and calls >= 1
        name = f"{record.name}({record.length_label})"
        lr = ""
        if record.first_lr is not None and record.last_lr is not None:
            lr = f"; the learning rate went from {record.first_lr:.3g} to {record.last_lr:.3g}"
        if per_batch and record.length <= epochs:
            reason = f"its length {record.length} is at most the {epochs} epochs"
        elif per_batch and record.kind == "whole" and calls > record.length:
            reason = f"it was stepped past the end of its schedule ({record.length} steps)"
        elif per_batch and record.kind == "period" and record.length < batches:
            reason = f"its period {record.length} is shorter than an epoch ({batches} batches)"
        elif per_epoch and record.length % batches == 0 and record.length >= epochs * batches:
            problems.append(
                f"{name} counts batches ({record.length} = {record.length // batches} × "
                f"{batches} batches) but was stepped once per epoch, so it went through "
                f"{calls} of its {record.length} steps{lr}"
            )
            continue
        else:
            continue
        problems.append(
            f"{name} counts epochs ({reason}) but was stepped after batches, {calls} times{lr}"
        )
    return "; ".join(problems) or None


def softmax_before_cross_entropy(chart: Chart, finished: bool) -> str | None:
    """The loss received rows that are all non-negative and sum to 1.

    `log_softmax` output fed to `CrossEntropyLoss` is not flagged: log-softmax of log-softmax is
    the same log-softmax, so loss and gradients are unchanged (the call is redundant, not wrong).
    """
    if not chart.probability_calls:
        return None
    return f"{chart.probability_calls} of {chart.loss_calls} loss calls received rows summing to 1"


def wrong_device(chart: Chart, finished: bool) -> str | None:
    """A model input, a weight, or the loss's input or target was not on the requested device.

    The doctor hands over the model on the CPU, so a loop that forgets `.to(device)` for both the
    model and the batches trains on the CPU without an error: the silent form of this bug. On a
    machine with only a CPU, the tests show it by asking for ``device="meta"``, which such a loop
    never reaches (meta tensors have shapes but no values, so only the buggy loop can run there).
    """
    if not chart.off_device:
        return None
    where = ", ".join(f"{what} ({n}×)" for what, n in chart.off_device.items())
    return f"asked for {chart.device}, found {where}"


def scheduler_before_optimizer(chart: Chart, finished: bool) -> str | None:
    """torch warned that a scheduler stepped before its optimizer's first step."""
    if not chart.early_scheduler_steps:
        return None
    n = chart.early_scheduler_steps
    return f"torch warned that {n} scheduler(s) stepped before their optimizer's first step"


def accumulation_tail_leak(chart: Chart, finished: bool) -> str | None:
    """Gradients left after an epoch's last update were still in `.grad` when the next epoch began.

    Only parameters some update holds are considered, so a stale optimizer is not mistaken for
    this. At the end of a finished run in which updates did apply gradients, unapplied gradients
    left in `.grad` count as well: the last epoch's tail was dropped.
    """
    parts = []
    if chart.leaks:
        most = max(chart.leaks.values())
        first = min(chart.leaks)
        parts.append(
            f"{len(chart.leaks)} epoch(s) began with the gradients of up to {most} backward "
            f"pass(es) from the end of the epoch before still in .grad (the first: epoch {first})"
        )
    pending = chart.unapplied_backwards() if finished and not _nothing_applied(chart) else 0
    if pending:
        parts.append(f"the run ended with {pending} backward pass(es) never applied")
    return "; ".join(parts) or None


RULES: dict[str, Rule] = {
    "loaders_not_iterated": loaders_not_iterated,
    "missing_zero_grad": missing_zero_grad,
    "trains_on_validation": trains_on_validation,
    "no_eval_mode": no_eval_mode,
    "train_mode_not_restored": train_mode_not_restored,
    "grad_enabled_in_eval": grad_enabled_in_eval,
    "graph_kept_alive": graph_kept_alive,
    "stale_optimizer": stale_optimizer,
    "no_learning": no_learning,
    "step_once_per_epoch": step_once_per_epoch,
    "accumulation_unscaled": accumulation_unscaled,
    "optimizer_rebuilt": optimizer_rebuilt,
    "scheduler_wrong_rate": scheduler_wrong_rate,
    "softmax_before_cross_entropy": softmax_before_cross_entropy,
    "wrong_device": wrong_device,
    "scheduler_before_optimizer": scheduler_before_optimizer,
    "accumulation_tail_leak": accumulation_tail_leak,
}

# When the first code is found, the second names the same mistake less precisely: a loop that
# never touched the loaders learned nothing from them, and a step once per epoch sums the
# epoch's undivided losses.
SUPPRESSES = {
    "loaders_not_iterated": ("no_learning",),
    "step_once_per_epoch": ("accumulation_unscaled",),
}


def read_chart(chart: Chart, error: BaseException | None = None) -> list[Finding]:
    """The findings a chart shows, in the order of `CODES`; `error` is what `fit` raised, if any."""
    findings = []
    if error is not None:
        first_line = (str(error).splitlines() or [""])[0]
        evidence = f"{type(error).__name__}: {first_line}"
        findings.append(Finding("fit_raised", CODES["fit_raised"], evidence))
    for code, rule in RULES.items():
        evidence = rule(chart, error is None)
        if evidence:
            findings.append(Finding(code, CODES[code], evidence))
    found = {f.code for f in findings}
    hidden = {other for code in found for other in SUPPRESSES.get(code, ())}
    ordered = sorted(findings, key=lambda f: list(CODES).index(f.code))
    return [f for f in ordered if f.code not in hidden]
