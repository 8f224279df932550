"""The capstone reference: the production loop is the plain loop plus lines; the doctor agrees."""

import difflib
import inspect
from pathlib import Path

import torch
from torch import nn

from forge_course.doctor import diagnose
from forge_course.reference import capstone
from forge_course.reference.checkpoint import latest_checkpoint, load_checkpoint
from tests.helpers.copied import copied


def _body(fn):
    lines = inspect.getsource(fn).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "model.to(device)")
    return lines[start:]


def test_the_production_loop_only_adds_lines_to_the_plain_loop():
    diff = [line for line in difflib.ndiff(_body(capstone.plain_fit), _body(capstone.fit))]
    assert not [line for line in diff if line.startswith("- ")]
    assert sum(line.startswith("  ") for line in diff) == len(_body(capstone.plain_fit))


def test_both_loops_get_a_clean_report_from_the_doctor():
    assert diagnose(capstone.plain_fit).ok
    assert diagnose(copied(capstone.fit)).ok


def _problem():
    torch.manual_seed(0)
    x, y = torch.randn(40, 3), torch.arange(40) % 2
    data = torch.utils.data.TensorDataset(x, y)
    train = torch.utils.data.DataLoader(data, batch_size=8)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), train


def test_fit_checkpoints_every_k_updates_and_logs_each_epoch(tmp_path: Path):
    model, optimizer, train = _problem()
    records = []
    copied(capstone.fit)(
        model, optimizer, nn.CrossEntropyLoss(), train, train, 3, "cpu",
        folder=tmp_path, every=4, patience=10, log=records.append,
    )  # fmt: skip
    # 5 batches × 3 epochs = 15 updates: checkpoints after updates 4, 8 and 12.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000004.pt", "step-00000008.pt", "step-00000012.pt"
    ]  # fmt: skip
    assert [r["step"] for r in records] == [5, 10, 15]
    restored, _, _ = _problem()
    opt = torch.optim.SGD(restored.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=15)
    assert load_checkpoint(latest_checkpoint(tmp_path), restored, opt, sched) == {"step": 12}


def test_fit_stops_early_when_validation_accuracy_stalls():
    model, _, train = _problem()
    records = []
    frozen = torch.optim.SGD(model.parameters(), lr=0.0)  # accuracy never changes
    copied(capstone.fit)(
        model, frozen, nn.CrossEntropyLoss(), train, train, 10, "cpu", patience=2,
        log=records.append,
    )  # fmt: skip
    assert len(records) == 3  # epoch 1 sets the best, epochs 2 and 3 fail to beat it


def test_smoke_test_returns_the_losses_of_plain_updates():
    model, _, train = _problem()
    x, y = next(iter(train))
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def make_model():
        fresh, _, _ = _problem()
        fresh.load_state_dict(state)
        return fresh

    losses, passed = copied(capstone.smoke_test)(
        make_model, lambda p: torch.optim.SGD(p, lr=0.5), nn.CrossEntropyLoss(), (x, y), steps=5
    )
    expected = []
    net = make_model()
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for _ in range(5):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        expected.append(loss.item())
    assert losses == expected and passed is (expected[-1] < expected[0]) and passed


def _table(text, prefix=""):
    return [line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix + "| ")]


def test_the_cheat_sheet_matches_the_reference_and_the_notebook(repo):
    sheet = (repo / "docs" / "cheat_sheet.md").read_text()
    diff = sheet.split("```diff\n")[1].split("```")[0].splitlines()
    strip = [line.replace("  # fmt: skip", "") for line in _body(capstone.fit)]
    assert [line[2:] for line in diff] == [line[4:] for line in strip]  # the body, dedented
    assert [line[0] for line in diff].count("+") == len(strip) - len(_body(capstone.plain_fit))
    notebook = (repo / "solutions" / "ch12_capstone.py").read_text()
    assert _table(sheet) == _table(notebook, prefix="# ")
