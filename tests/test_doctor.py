"""The loop doctor: each silent bug is named by its own code, and correct loops get a clean report.

Every loop below has the signature the doctor calls:
``fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)``. The buggy ones are
the correct plain loop with one thing changed, marked ``# BUG``.
"""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from forge_course.device import available_devices
from forge_course.doctor import CODES, Finding, Report, diagnose, main
from forge_course.doctor.schedulers import SchedulerLog, watching_schedulers
from forge_course.doctor.sources import BOTH, TRAIN, UNREADABLE, VAL, Sources

# -- helpers shared by the loops -------------------------------------------------------------


def evaluate(model, loss_fn, loader, device):
    """Mean validation loss, done right: eval mode, no graph, train mode restored."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            total += loss_fn(model(x), y).item() * len(y)
            count += len(y)
    model.train()
    return total / count


# -- three correct loops, written differently ------------------------------------------------


def fit_plain(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    history = []
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        history.append(evaluate(model, loss_fn, val_loader, device))
    return history


def fit_accumulate(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    """Accumulates 3 micro-batches per update, steps on the last partial group, zeroes in place."""
    accumulate = 3
    n = len(train_loader)
    model = model.to(device)
    for _ in range(epochs):
        model.train()
        model.zero_grad(set_to_none=False)
        for i, (x, y) in enumerate(train_loader):
            group_start = i - i % accumulate
            group_size = min(accumulate, n - group_start)
            loss = loss_fn(model(x.to(device)), y.to(device)) / group_size
            loss.backward()
            if (i + 1) % accumulate == 0 or i + 1 == n:
                optimizer.step()
                model.zero_grad(set_to_none=False)
        model.eval()
        with torch.inference_mode():
            correct = sum(
                (model(x.to(device)).argmax(1) == y.to(device)).sum().item() for x, y in val_loader
            )
    return correct


def _train_one_epoch(model, optimizer, scheduler, loss_fn, loader, device, running):
    model.train()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        scheduler.step()
        running.append(loss.detach())


def fit_scheduled(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    """Its own AdamW, a per-batch OneCycleLR after each step, clipping, a separate evaluate."""
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=1e-2, total_steps=epochs * len(train_loader)
    )
    running = []
    for _ in range(epochs):
        _train_one_epoch(model, optimizer, scheduler, loss_fn, train_loader, device, running)
        val_loss = evaluate(model, loss_fn, val_loader, device)
    return {"train": torch.stack(running).mean().item(), "val": val_loss}


def fit_inline(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    """Validation inline, ReduceLROnPlateau, and the best model kept as a deep copy and saved."""
    model = model.to(device)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
    best, best_loss, loss = None, float("inf"), None
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            previous = loss  # holds one older graph, which the doctor tolerates
            out = model(x)
            loss = loss_fn(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        val_loss = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                out = model(x.to(device))
                val_loss += loss_fn(out, y.to(device)).item()
        scheduler.step(val_loss)
        if val_loss < best_loss:
            best_loss, best = val_loss, copy.deepcopy(model)
    torch.save(best, io.BytesIO())
    return best, previous


CORRECT = [fit_plain, fit_accumulate, fit_scheduled, fit_inline]


# -- one loop per bug --------------------------------------------------------------------------


def fit_no_zero_grad(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)  # BUG: no optimizer.zero_grad() anywhere
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
        evaluate(model, loss_fn, val_loader, device)


def fit_no_eval(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():  # BUG: no model.eval()
            for x, y in val_loader:
                loss_fn(model(x.to(device)), y.to(device)).item()


def fit_no_train_again(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    model.train()  # BUG: only once, before the first epoch
    for _ in range(epochs):
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                loss_fn(model(x.to(device)), y.to(device)).item()


def fit_eval_with_grad(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
        for x, y in val_loader:  # BUG: no torch.no_grad()
            loss_fn(model(x.to(device)), y.to(device)).item()


def fit_total_loss(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        total = 0.0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss  # BUG: keeps every batch's graph alive
        evaluate(model, loss_fn, val_loader, device)


def fit_losses_returned(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    losses = []
    for _ in range(epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            losses.append(loss)  # BUG: should be loss.item()
    return losses


def fit_new_head(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.head = nn.Linear(model.head.in_features, 3)  # BUG: after `optimizer` was built
    fit_plain(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)


def fit_head_only_optimizer(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)  # BUG: body is not frozen
    fit_plain(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)


def fit_no_backward(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device))  # BUG: no .backward()
            optimizer.step()
        evaluate(model, loss_fn, val_loader, device)


def fit_under_no_grad(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            with torch.no_grad():  # BUG: the forward records no graph...
                out = model(x.to(device))
            loss = loss_fn(out, y.to(device)).requires_grad_()  # ...and this silences the error
            loss.backward()
            optimizer.step()
        evaluate(model, loss_fn, val_loader, device)


def fit_zero_between(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        for x, y in train_loader:
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.zero_grad()  # BUG: wipes the gradients the next line was to apply
            optimizer.step()
        evaluate(model, loss_fn, val_loader, device)


def fit_softmax(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(torch.softmax(model(x), dim=1), y)  # BUG: CrossEntropyLoss wants logits
            loss.backward()
            optimizer.step()
        evaluate(model, loss_fn, val_loader, device)


def fit_ignores_device(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    for _ in range(epochs):  # BUG: neither the model nor the batches go to `device`
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        evaluate(model, loss_fn, val_loader, "cpu")


def fit_scheduler_first(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(epochs):
        scheduler.step()  # BUG: before this epoch's optimizer steps
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        evaluate(model, loss_fn, val_loader, device)


def fit_accumulate_no_tail(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    accumulate = 3
    model.to(device)
    for _ in range(epochs):
        model.train()
        for i, (x, y) in enumerate(train_loader):
            loss = loss_fn(model(x.to(device)), y.to(device)) / accumulate
            loss.backward()
            if (i + 1) % accumulate == 0:  # BUG: 7 batches, so the 7th is never stepped
                optimizer.step()
                optimizer.zero_grad()
        evaluate(model, loss_fn, val_loader, device)


def fit_step_after_loop(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        for x, y in train_loader:
            loss_fn(model(x.to(device)), y.to(device)).backward()
        optimizer.step()  # BUG: after the batch loop, so once per epoch
        evaluate(model, loss_fn, val_loader, device)


def fit_accumulate_unscaled(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for i, (x, y) in enumerate(train_loader):
            loss_fn(model(x.to(device)), y.to(device)).backward()  # BUG: not divided by 2
            if i % 2 == 1 or i + 1 == len(train_loader):
                optimizer.step()
                optimizer.zero_grad()
        evaluate(model, loss_fn, val_loader, device)


def fit_new_optimizer_each_epoch(model, optimizer, loss_fn, train_loader, val_loader, epochs, dev):
    for _ in range(epochs):
        optimizer = torch.optim.Adam(model.parameters())  # BUG: its state is lost every epoch
        fit_plain(model, optimizer, loss_fn, train_loader, val_loader, 1, dev)


def fit_steplr_per_batch(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=epochs, gamma=0.1)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            scheduler.step()  # BUG: step_size counts epochs
        evaluate(model, loss_fn, val_loader, device)


def fit_trains_on_validation(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    fit_plain(model, optimizer, loss_fn, val_loader, val_loader, epochs, device)  # BUG


def fit_does_nothing(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    return model  # BUG: never trains


# (code expected, loop, device to ask for). The device bug needs a device the loop fails to use;
# on a CPU-only machine that is "meta": a loop that moves nothing trains on the CPU instead,
# which is the silent form of the bug (everything left on the CPU while a GPU was asked for).
BUGGY = [
    ("missing_zero_grad", fit_no_zero_grad, None),
    ("no_eval_mode", fit_no_eval, None),
    ("train_mode_not_restored", fit_no_train_again, None),
    ("grad_enabled_in_eval", fit_eval_with_grad, None),
    ("graph_kept_alive", fit_total_loss, None),
    ("graph_kept_alive", fit_losses_returned, None),
    ("stale_optimizer", fit_new_head, None),
    ("stale_optimizer", fit_head_only_optimizer, None),
    ("no_learning", fit_no_backward, None),
    ("no_learning", fit_under_no_grad, None),
    ("no_learning", fit_zero_between, None),
    ("softmax_before_cross_entropy", fit_softmax, None),
    ("wrong_device", fit_ignores_device, "meta"),
    ("scheduler_before_optimizer", fit_scheduler_first, None),
    ("accumulation_tail_leak", fit_accumulate_no_tail, None),
    ("step_once_per_epoch", fit_step_after_loop, None),
    ("accumulation_unscaled", fit_accumulate_unscaled, None),
    ("optimizer_rebuilt", fit_new_optimizer_each_epoch, None),
    ("scheduler_wrong_rate", fit_steplr_per_batch, None),
    ("trains_on_validation", fit_trains_on_validation, None),
    ("loaders_not_iterated", fit_does_nothing, None),
]


# -- the doctor ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "fit", "device"), BUGGY, ids=[f"{c}-{f.__name__}" for c, f, _ in BUGGY]
)
def test_each_bug_is_named_by_its_code_alone(code, fit, device):
    report = diagnose(fit, device=device)
    assert report.codes == [code], f"expected only {code} for {fit.__name__}, got:\n{report}"


def test_every_code_has_a_buggy_loop():
    assert {code for code, _, _ in BUGGY} | {"fit_raised"} == set(CODES)


@pytest.mark.parametrize("device", available_devices(), ids=str)
@pytest.mark.parametrize("fit", CORRECT, ids=lambda f: f.__name__)
def test_correct_loops_get_no_finding(fit, device):
    report = diagnose(fit, device=device)
    assert report.ok, f"{fit.__name__} is correct, but the doctor reported:\n{report}"
    assert report.seen["training_forwards"] == 2 * 7
    assert report.seen["validation_forwards"] == 2 * 3


def test_evidence_names_what_was_seen():
    by_code = {f.code: f for f in diagnose(fit_new_head).findings}
    assert "head.weight" in by_code["stale_optimizer"].evidence
    leak = diagnose(fit_accumulate_no_tail).findings[0].evidence
    assert "1 epoch(s) began with the gradients of up to 1 backward pass(es)" in leak
    assert "not one non-zero gradient" in diagnose(fit_no_backward).findings[0].evidence
    assert "updates found `.grad` empty" in diagnose(fit_zero_between).findings[0].evidence


def test_evidence_says_where_each_new_mistake_was_seen():
    def evidence(fit):
        return " ".join(f.evidence for f in diagnose(fit).findings)

    assert "training forwards were on batches with validation examples, the first at forward 1" in (
        evidence(fit_trains_on_validation)
    )
    assert "StepLR(step_size=2) counts epochs" in evidence(fit_steplr_per_batch)
    assert "stepped after batches, 14 times" in evidence(fit_steplr_per_batch)
    assert "2 different Adam optimizers" in evidence(fit_new_optimizer_each_epoch)
    assert "each after 7 or more training batches" in evidence(fit_step_after_loop)
    assert "up to 2 undivided losses" in evidence(fit_accumulate_unscaled)
    assert "none of them on a batch from `train_loader` or `val_loader`" in evidence(
        fit_does_nothing
    )


def test_sources_find_a_batch_however_the_loop_derived_it():
    train, val = torch.arange(12.0).reshape(4, 3), -torch.arange(1.0, 7.0).reshape(2, 3)
    sources = Sources(train, val)
    batch = train[:2].clone()
    sources.remember((batch, torch.tensor([0, 1])), "train")
    assert sources.of(batch) == TRAIN
    assert sources.of(train[[3, 1]].double()) == TRAIN  # indexed, cast without loss
    assert sources.of(val[1]) == VAL  # one example
    assert sources.of(torch.cat([train[:1], val])) == BOTH
    assert sources.of(train[:2] * 2) is None  # values changed: no longer an example
    assert sources.of(torch.zeros(2, 3, device="meta")) == UNREADABLE


def test_schedulers_are_watched_from_their_first_step_not_their_construction():
    log = SchedulerLog()
    optimizer = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=1.0)
    with watching_schedulers(lambda scheduler: log.stepped(scheduler, epoch=1)):
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        for _ in range(3):
            optimizer.step()
            scheduler.step()
    log.finish()
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1).step()  # after the block: unseen
    (record,) = log.records.values()
    assert (record.name, record.length, record.kind) == ("StepLR", 3, "period")
    assert record.epochs_of_steps == [1, 1, 1]
    assert (record.first_lr, record.last_lr) == (1.0, 0.5)


def test_a_loop_that_raises_is_reported_not_propagated():
    def fit_crashes(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
        for x, _ in train_loader:
            model(x)
            raise ValueError("shapes do not match\nsecond line")

    report = diagnose(fit_crashes, device="cpu")
    assert report.codes == ["fit_raised"]
    assert report.findings[0].evidence == "ValueError: shapes do not match"


def test_diagnose_is_deterministic_and_leaves_no_trace():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = diagnose(fit_no_zero_grad).to_dict()
    assert torch.equal(torch.get_rng_state(), state)
    assert diagnose(fit_no_zero_grad).to_dict() == first
    # The optimizer hooks are gone: stepping elsewhere afterwards is not recorded anywhere.
    model = nn.Linear(2, 1)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert diagnose(fit_plain).ok


def test_other_warnings_from_the_loop_are_still_shown():
    def fit_warns(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
        import warnings

        warnings.warn("from the loop", UserWarning, stacklevel=1)
        fit_plain(model, optimizer, loss_fn, train_loader, val_loader, epochs, device)

    with pytest.warns(UserWarning, match="from the loop"):
        assert diagnose(fit_warns).ok


# -- the report ------------------------------------------------------------------------------


def test_report_as_text_html_and_data():
    finding = Finding("no_eval_mode", CODES["no_eval_mode"], "3 of 3 <validation> forwards")
    report = Report([finding], {"updates": 14, "epochs": 2})
    assert not report.ok and report.codes == ["no_eval_mode"]
    text = str(report)
    assert text.splitlines()[0] == "Loop doctor: 1 finding (updates: 14, epochs: 2)"
    assert "no_eval_mode" in text and "seen: 3 of 3 <validation> forwards" in text
    page = report._repr_html_()
    assert "&lt;validation&gt;" in page and "<code>model.eval()</code>" in page
    data = json.loads(json.dumps(report.to_dict()))
    assert data == {
        "ok": False,
        "findings": [
            {"code": "no_eval_mode", "message": CODES["no_eval_mode"], "evidence": finding.evidence}
        ],
        "seen": {"updates": 14, "epochs": 2},
    }
    clean = Report([], {"updates": 14})
    assert clean.ok and str(clean) == "Loop doctor: no findings (updates: 14)"


# -- the command line ------------------------------------------------------------------------

SCRIPT = """
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))


def fit_without_zero_grad(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    for _ in range(epochs):
        for x, y in train_loader:
            loss_fn(model(x), y).backward()
            optimizer.step()


if __name__ == "__main__":
    raise SystemExit("the doctor must not run this block")
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


def test_cli_exit_codes(script, capsys):
    assert main([str(script), "--device", "cpu"]) == 0
    assert "Loop doctor: no findings" in capsys.readouterr().out
    assert main([f"{script}:fit_without_zero_grad", "--epochs", "1", "--device", "cpu"]) == 1
    assert "missing_zero_grad" in capsys.readouterr().out
    assert main([f"{script}:nothing_here"]) == 2
    assert "defines no function 'nothing_here'" in capsys.readouterr().err


@pytest.mark.slow
def test_python_dash_m(script, repo):
    done = subprocess.run(
        [sys.executable, "-m", "forge_course.doctor", f"{script}:fit_without_zero_grad"],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "missing_zero_grad" in done.stdout
