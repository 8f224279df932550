"""The rules that turn the doctor's chart into findings: one function per code.

Each rule returns the evidence for its finding, or None. The rules are written so that a correct
loop (plain, with gradient accumulation that steps on the last partial group, with a per-batch
scheduler and clipping) triggers none of them. Words used below:

- a *training forward* is one that backward later ran through (its graph got a gradient);
- a *validation forward* is one made while the validation loader had yielded the latest batch;
- an *update* is one `optimizer.step()`, by any optimizer, including one `fit` builds itself.

A rule that concludes something from what never happened ("no gradient ever arrived") only
applies when `fit` finished: a run cut short by an exception proves nothing by absence.
"""

from __future__ import annotations

from collections.abc import Callable

from forge_course.doctor.instruments import Chart
from forge_course.doctor.report import CODES, Finding

Rule = Callable[[Chart, bool], str | None]

# A plain loop holds the graph of the batch it is working on, and a `previous_loss = loss` may
# hold one more; more graphs than this from earlier batches alive at once means a collection.
OLD_GRAPHS_TOLERATED = 1


def missing_zero_grad(chart: Chart, finished: bool) -> str | None:
    """Backward added into a `.grad` that still held a gradient some update had already applied.

    Intended accumulation adds into gradients that no update has used yet, so it does not count.
    The norms in the evidence are those each update applied (after any clipping).
    """
    if not chart.reused_at:
        return None
    norms = chart.grad_norms
    return (
        f"from update {min(chart.reused_at)} on, {len(chart.reused_at)} of {len(norms)} updates "
        f"applied old gradients again; the gradient norm went from {norms[0]:.3g} at update 1 to "
        f"{norms[-1]:.3g} at update {len(norms)}"
    )


def no_eval_mode(chart: Chart, finished: bool) -> str | None:
    """A validation forward ran while a Dropout module was in train mode."""
    val = [r for r in chart.forwards if r.phase == "val"]
    bad = [r for r in val if any(r.dropout_active)]
    if not bad:
        return None
    return f"{len(bad)} of {len(val)} validation forwards ran with Dropout active"


def train_mode_not_restored(chart: Chart, finished: bool) -> str | None:
    """A training forward ran while a Dropout module was in eval mode."""
    train = [r for r in chart.forwards if r.backpropagated]
    bad = [r for r in train if not all(r.dropout_active)]
    if not bad:
        return None
    first = bad[0].epoch
    return f"{len(bad)} of {len(train)} training forwards ran with Dropout off, from epoch {first}"


def grad_enabled_in_eval(chart: Chart, finished: bool) -> str | None:
    """A validation forward ran with autograd recording."""
    val = [r for r in chart.forwards if r.phase == "val"]
    bad = [r for r in val if r.grad_enabled]
    if not bad:
        return None
    return f"{len(bad)} of {len(val)} validation forwards recorded a graph"


def graph_kept_alive(chart: Chart, finished: bool) -> str | None:
    """More than `OLD_GRAPHS_TOLERATED` graphs from two or more batches ago were alive at once.

    Checked each time a loader hands out a batch, against that loader's earlier batches, and once
    more after `fit` returns, on everything still alive (a returned list of losses).
    """
    count, when = chart.old_graphs
    if count <= OLD_GRAPHS_TOLERATED:
        return None
    return f"{when}, the graphs of {count} earlier forwards were still alive"


def stale_optimizer(chart: Chart, finished: bool) -> str | None:
    """A parameter received non-zero gradients, yet no optimizer that stepped ever held it.

    The optimizer the doctor hands over holds every parameter, so this can only come from the
    loop: a module added or swapped in after that optimizer was built (a new head), or an
    optimizer `fit` builds over part of a model it still backpropagates through. Frozen
    parameters (`requires_grad=False`) get no gradient and are left out. An optimizer that `fit`
    builds itself over the whole model is fine: every step of every optimizer counts.
    """
    names = chart.never_stepped()
    if not finished or not names or _nothing_applied(chart):
        return None  # with no update at all, `no_learning` says it
    return f"{', '.join(names)} received gradients, but none of the {chart.steps} updates held them"


def _nothing_applied(chart: Chart) -> bool:
    return not any(norm > 0 for norm in chart.grad_norms)


def no_learning(chart: Chart, finished: bool) -> str | None:
    """In a finished run, no update applied a non-zero gradient.

    Three ways to get there, told apart in the evidence: no gradient ever arrives (no backward,
    a forward under `no_grad`, a detached output), gradients arrive but are zeroed before each
    step, or no optimizer step runs at all.
    """
    if not finished or not _nothing_applied(chart):
        return None
    if not any(chart.backwards.values()):
        train = sum(r.phase == "train" for r in chart.forwards)
        return f"{train} forwards on training batches, but not one non-zero gradient"
    if chart.steps == 0:
        return "gradients arrived, but no optimizer step ran"
    return f"gradients arrived, but all {chart.steps} updates found `.grad` empty"


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

    Only parameters some optimizer steps are considered, so a stale optimizer is not mistaken for
    this. At the end of a finished run, unapplied gradients left in `.grad` count as well: the
    last epoch's tail was dropped.
    """
    parts = []
    if chart.leaks:
        most = max(chart.leaks.values())
        parts.append(
            f"{len(chart.leaks)} epoch(s) began with the gradients of up to {most} backward "
            "pass(es) from the end of the epoch before still in .grad"
        )
    pending = chart.unapplied_backwards() if finished else 0
    if pending:
        parts.append(f"the run ended with {pending} backward pass(es) never applied")
    return "; ".join(parts) or None


RULES: dict[str, Rule] = {
    "missing_zero_grad": missing_zero_grad,
    "no_eval_mode": no_eval_mode,
    "train_mode_not_restored": train_mode_not_restored,
    "grad_enabled_in_eval": grad_enabled_in_eval,
    "graph_kept_alive": graph_kept_alive,
    "stale_optimizer": stale_optimizer,
    "no_learning": no_learning,
    "softmax_before_cross_entropy": softmax_before_cross_entropy,
    "wrong_device": wrong_device,
    "scheduler_before_optimizer": scheduler_before_optimizer,
    "accumulation_tail_leak": accumulation_tail_leak,
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
    return findings
