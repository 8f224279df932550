"""Chapter 08's checks: correct answers in any style pass; each typical mistake is named."""

import ast
import contextlib
import functools
import io
import math
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch import nn

from forge_course.grader import codec
from forge_course.grader.assignment import INSTALL_TAG
from forge_course.grading import Mistake, ch08
from forge_course.observe import ch08 as observe_ch08
from forge_course.reference import training
from forge_course.release import source_notebook
from tests.answers import ch08 as answers
from tests.conftest import REPO
from tests.helpers.copied import copied

CHAPTER = REPO / "solutions" / "ch08_training_arena.py"
#: What a settings cell may import: the grading worker holds nothing else of forge_course.
SETTINGS_MAY_IMPORT = ("forge_course.device", "forge_course.data", "forge_course.sims.display")
#: What the learner half of a check may never import.
NEVER_IN_A_WORKER = tuple(
    f"forge_course.{name}" for name in ("reference", "grading", "sims", "doctor")
)


def settings_source(chapter) -> str:
    """The chapter's settings cell: the first plain code cell, past a Colab install cell."""
    cells = [c for c in source_notebook(chapter).cells if c.cell_type == "code"]
    return next(c.source for c in cells if "nbgrader" not in c.metadata
                and INSTALL_TAG not in c.metadata.get("tags", []))  # fmt: skip


def forbidden_imports(source: str) -> list[str]:
    """The forge_course modules ``source`` imports that a grading worker does not hold."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] if node.module != "forge_course" else [
                f"forge_course.{a.name}" for a in node.names if a.name not in
                ("pick_device", "available_devices", "tolerance")
            ]  # fmt: skip
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [
            name for name in names
            if name.split(".")[0] == "forge_course"
            and not any(name == ok or name.startswith(ok + ".") for ok in SETTINGS_MAY_IMPORT)
        ]  # fmt: skip
    return found


@functools.cache
def _settings() -> dict:
    """The names the settings cell defines, as the grader's worker runs it before an answer."""
    namespace = {"__name__": "__main__"}
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(io.StringIO()), torch.random.fork_rng():
        exec(compile(settings_source(CHAPTER), "<settings>", "exec"), namespace)
    torch.set_num_threads(threads)
    return namespace


def _define(source: str, name: str):
    """The function ``name`` defined by an answer cell, run after the notebook's first cell."""
    namespace = dict(_settings())
    exec(compile(source, "<answer>", "exec"), namespace)
    return namespace[name]


def test_the_settings_cell_imports_only_what_a_grading_worker_holds():
    assert forbidden_imports(settings_source(CHAPTER)) == []


def test_the_settings_cells_pieces_are_the_references():
    """spiral_data, make_model and steps_per_epoch are defined in the settings cell (the grader
    runs answers after it alone); they must build exactly what the reference's fit builds."""
    ours = _settings()
    for mine, theirs in zip(ours["spiral_data"](), training.spiral_data()):
        assert torch.equal(mine, theirs)
    for config in ({**training.DEFAULT_CONFIG, "dropout": 0.2}, {"seed": 7, "dropout": 0.0}):
        with torch.random.fork_rng():
            mine, after_mine = ours["make_model"](config), torch.rand(3)  # dropout's next draws
            theirs, after_theirs = training.make_model(config), torch.rand(3)
        assert repr(mine) == repr(theirs) and torch.equal(after_mine, after_theirs)
        for a, b in zip(mine.state_dict().values(), theirs.state_dict().values(), strict=True):
            assert torch.equal(a, b)
    for n, size in [(300, 32), (300, 300), (300, 7), (1, 5)]:
        assert ours["steps_per_epoch"](n, size) == training.steps_per_epoch(n, size)


def modules_loaded_by(module: str) -> list[str]:
    """The forge_course modules that importing ``module`` loads, in a fresh interpreter."""
    code = (f"import sys, {module}; "
            "print(*sorted(m for m in sys.modules if m.startswith('forge_course')))")  # fmt: skip
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout.split()  # fmt: skip


def test_the_observer_imports_nothing_a_grading_worker_does_not_hold():
    loaded = modules_loaded_by("forge_course.observe.ch08")
    assert [m for m in loaded if m.startswith(NEVER_IN_A_WORKER)] == []


@pytest.mark.parametrize(
    "answer",
    [
        copied(training.fit),
        ch08.flawed_fit(),
        _define(answers._FIT, "fit"),
        _define(answers.FIT_OTHER_STYLE, "fit"),
    ],
    ids=["reference", "flawless", "plain", "other style"],
)
def test_fit_accepts_correct_answers_in_any_style(answer):
    ch08.check_fit(answer, thorough=True)


@pytest.mark.parametrize("flaw", list(ch08.FIT_MISTAKES))
def test_fit_names_each_known_mistake(flaw):
    with pytest.raises(Mistake) as caught:
        ch08.check_fit(ch08.flawed_fit(flaw), thorough=True)
    assert ch08.FIT_MISTAKES[flaw] in str(caught.value)


@pytest.mark.parametrize(
    "flaw",
    ["onecycle_per_epoch", "epoch_schedules_per_batch", "no_eval", "train_mode_once",
     "unweighted_loss", "adamw_default", "cycle_momentum", "no_zero_grad", "dataloader",
     "scheduler_first", "validation_graph"],
)  # fmt: skip
def test_the_visible_cases_already_catch_the_common_mistakes(flaw):
    with pytest.raises(Mistake, match="Likely mistake"):
        ch08.check_fit(ch08.flawed_fit(flaw))


@pytest.mark.parametrize(
    "source,phrase",
    [
        (answers.FIT_ONECYCLE_PER_EPOCH, "never leaves its warm-up"),
        (answers.FIT_NO_EVAL, "call `model.eval()`"),
        (answers.FIT_UNWEIGHTED, "the mean of the batch means"),
        (answers.FIT_ADAMW_DEFAULT, "its default of 0.01"),
        (answers.FIT_VALIDATION_WITH_GRAD, "ran with autograd on"),
        (answers.FIT_SCHEDULER_FIRST, "runs before `optimizer.step()`"),
    ],
)
@pytest.mark.parametrize("thorough", [False, True], ids=["visible", "hidden"])
def test_the_round_trips_wrong_answers_are_named(source, phrase, thorough):
    with pytest.raises(Mistake, match="Likely mistake") as caught:
        ch08.check_fit(_define(source, "fit"), thorough)
    assert phrase in str(caught.value)


def _named(message: str) -> list[str]:
    return [flaw for flaw, text in ch08.FIT_MISTAKES.items() if text in message]


@pytest.mark.parametrize(
    "flaws,where",
    [
        (("epoch_schedules_per_batch", "unweighted_loss"), "the learning rates differ"),
        (("epoch_schedules_per_batch", "no_eval"), "the learning rates differ"),
        (("unweighted_loss", "no_zero_grad"), "epoch 1's training loss already differs"),
        (("no_eval", "unweighted_loss"), "between epochs"),
        (("train_mode_once", "same_order"), "between epochs"),
    ],
)
def test_a_mistake_is_named_only_when_it_reproduces_the_whole_history(flaws, where):
    """Two slips share some numbers with each one alone, never all: neither is named as *the*
    likely mistake; the message says which numbers differ, from where, and where to look."""
    with pytest.raises(Mistake) as caught:
        ch08.check_fit(ch08.flawed_fit(*flaws))
    message = str(caught.value)
    assert "Likely mistake" not in message and _named(message) == []
    assert "What differs from the reference's run:" in message and where in message


@pytest.mark.parametrize(
    "old,new,where",
    [
        ("optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=wd)",
         "optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)",
         "settings (momentum, weight decay)"),
        ("optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=wd)",
         "optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=wd * lr)",
         "settings (momentum, weight decay)"),
        ('history["train_loss"].append(total / n)',
         'history["train_loss"].append(total / (batches * size))',
         "points at how the epoch's loss is added up"),
        ('total_steps=config["epochs"] * steps_per_epoch(n, size)',
         'total_steps=config["epochs"] * steps_per_epoch(n, size) + 1',
         "the learning rates differ"),
        ("(model(X_val).argmax(dim=1) == y_val)", "(model(X_train).argmax(dim=1) == y_train)",
         "only the validation differs"),
    ],
    ids=["adamw without decay", "adamw decay times lr", "loss over full batches",
         "onecycle one step long", "accuracy on the training set"],
)  # fmt: skip
def test_a_near_miss_of_a_known_mistake_is_not_named_but_described(old, new, where):
    """AdamW without decay is not AdamW with its default decay: no known mistake is named, and
    the message points at what the numbers show."""
    assert old in answers._FIT
    with pytest.raises(Mistake) as caught:
        ch08.check_fit(_define(answers._FIT.replace(old, new), "fit"))
    message = str(caught.value)
    assert "Likely mistake" not in message and _named(message) == []
    assert where in message


_VALIDATION = """        with torch.no_grad():
            accuracy = (model(X_val).argmax(dim=1) == y_val).float().mean().item()
"""
_IN_HALVES = """            accuracy = sum(
                (model(X_val[i : i + 50]).argmax(dim=1) == y_val[i : i + 50]).sum().item()
                for i in (0, 50)
            ) / len(y_val)
"""


def test_validation_without_a_graph_may_be_written_any_way():
    """Grad mode off by hand, or validation in two halves under no_grad: no graph, full marks."""
    by_hand = answers._FIT.replace(
        _VALIDATION,
        "        torch.set_grad_enabled(False)\n"
        "        accuracy = (model(X_val).argmax(dim=1) == y_val).float().mean().item()\n"
        "        torch.set_grad_enabled(True)\n",
    )
    halves = answers._FIT.replace(_VALIDATION, "        with torch.no_grad():\n" + _IN_HALVES)
    for source in (by_hand, halves):
        assert source != answers._FIT
        ch08.check_fit(_define(source, "fit"))


def test_validation_that_records_a_graph_is_caught_also_when_the_history_agrees():
    """Validating in halves with autograd on matches no known mistake exactly: still caught,
    and the message says which forwards recorded a graph."""
    halves = answers._FIT.replace(_VALIDATION, "        if True:\n" + _IN_HALVES)
    with pytest.raises(Mistake) as caught:
        ch08.check_fit(_define(halves, "fit"))
    message = str(caught.value)
    assert "validation forward passes with autograd on should be 0, but it is 6" in message
    assert "validation: 6 forward pass(es) over X_val ran with autograd on" in message


def test_a_scheduler_stepped_first_is_named_with_another_slip_too():
    """Stepped before its optimizer, and cycling the momentum as well: no known mistake
    reproduces the run, and the message still names the order."""
    with pytest.raises(Mistake) as caught:
        ch08.check_fit(ch08.flawed_fit("scheduler_first", "cycle_momentum"))
    message = str(caught.value)
    assert "Likely mistake" not in message
    assert "`scheduler.step()` runs before `optimizer.step()`" in message


def test_what_another_thread_trains_meanwhile_is_not_observed():
    """The grader observes references while other threads train (the arena's runs): their
    steps and their forwards over the validation rows, with autograd on, are not the run's."""
    X_val = training.spiral_data()[2]
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.123)
    stop, steps = threading.Event(), []

    def train_beside():
        while not stop.is_set():
            optimizer.zero_grad()
            model(X_val).sum().backward()
            optimizer.step()
            steps.append(1)

    case = ch08.fit_cases(False)[0]
    beside = threading.Thread(target=train_beside)
    beside.start()
    try:
        while not steps:
            time.sleep(0.001)
        before = len(steps)
        seen = ch08.FIT.observe(copied(training.fit), case)
        during = len(steps) - before
    finally:
        stop.set()
        beside.join()
    assert during > 0  # the other thread did train meanwhile
    assert seen[observe_ch08.VALIDATION_GRAD] == 0
    assert torch.equal(seen[observe_ch08.STEP_LR], seen["lr"])


def test_what_differs_says_from_which_step_and_epoch():
    with pytest.raises(Mistake) as caught:
        ch08.check_fit(ch08.flawed_fit("epoch_schedules_per_batch", "no_eval"))
    message = str(caught.value)
    assert "lr: the same before step 2 (epoch 1, batch 2); at step 2 (epoch 1, batch 2)" in message
    assert "train_loss: at epoch 1 it should be" in message


def _returning(history_of):
    def fit(config, device="cpu"):
        return history_of(copied(training.fit)(config, device), config)

    return fit


@pytest.mark.parametrize(
    "change,phrase",
    [
        (lambda h, c: list(h.values()), "should return a dict"),
        (lambda h, c: {k: v for k, v in h.items() if k != "lr"}, "missing the key(s) ['lr']"),
        (lambda h, c: {**h, "train_loss": torch.tensor(h["train_loss"])}, "should be a list"),
        (lambda h, c: {**h, "train_loss": [torch.tensor(v) for v in h["train_loss"]]},
         "is a tensor, not a float"),
        (lambda h, c: {**h, "lr": h["lr"][:: len(h["lr"]) // c["epochs"]]},
         "should have 15: one per optimizer step"),
        (lambda h, c: {**h, "val_accuracy": [str(v) for v in h["val_accuracy"]]},
         "should be a float"),
    ],
)  # fmt: skip
def test_fit_says_what_is_wrong_with_the_history_itself(change, phrase):
    with pytest.raises(Mistake) as caught:
        ch08.check_fit(_returning(change))
    assert phrase in str(caught.value)


def test_extra_history_keys_are_allowed():
    ch08.check_fit(_returning(lambda h, c: {**h, "val_loss": [0.0] * c["epochs"]}))


def test_an_unwritten_fit_says_so():
    def fit(config, device="cpu"):
        raise NotImplementedError()

    with pytest.raises(Mistake, match="not written yet"):
        ch08.check_fit(fit)


def test_calling_the_reference_or_the_simulator_does_not_score():
    from forge_course.sims.trainer import Trainer

    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch08.check_fit(lambda config, device="cpu": training.fit(config, device))

    def through_the_simulator(config, device="cpu"):
        trainer = Trainer(config, device=device)
        trainer.run()
        return {"train_loss": [], "val_accuracy": [], "lr": trainer.history["lr"]}

    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch08.check_fit(through_the_simulator)


def test_observations_survive_the_trip_to_an_isolated_grader():
    """The grader observes in a worker, sends plain JSON, and judges in its own process."""
    for exercise, answer in (
        (ch08.FIT, copied(training.fit)),
        (ch08.ARENA_CONFIG, _define(answers.ARENA_ADAMW, "make_arena_config")),
    ):
        for case in exercise.cases(False) + exercise.cases(True):
            sent = codec.loads(codec.dumps(exercise.observe(answer, case)))
            exercise.judge(case, sent)
    with pytest.raises(Mistake, match="its default of 0.01"):
        for case in ch08.FIT.cases(False):
            observed = ch08.FIT.observe(_define(answers.FIT_ADAMW_DEFAULT, "fit"), case)
            ch08.FIT.judge(case, codec.loads(codec.dumps(observed)))
    assert [e.grade_id for e in ch08.EXERCISES] == ["ch08_fit", "ch08_arena_config"]
    assert [e.function for e in ch08.EXERCISES] == ["fit", "make_arena_config"]


def test_hidden_cases_cover_every_optimizer_and_schedule_and_follow_the_seed(monkeypatch):
    monkeypatch.setenv("FORGE_GRADING_SEED", "1")
    first = ch08.fit_cases(thorough=True)
    pairs = {(c["optimizer"], c["scheduler"]) for c in first}
    assert pairs == {(o, s) for o in training.OPTIMIZERS for s in training.SCHEDULERS}
    assert any(c["dropout"] > 0 for c in first) and all(
        c["batch_size"] in (32, 64, 128, 200) for c in first
    )
    seeds = ch08.arena_cases(thorough=True)
    monkeypatch.setenv("FORGE_GRADING_SEED", "2")
    assert ch08.fit_cases(thorough=True) != first and ch08.arena_cases(thorough=True) != seeds
    assert ch08.fit_cases(thorough=False) == ch08.fit_cases(thorough=False)
    assert len({c["seed"] for c in seeds}) == 3 and seeds[0] == {"seed": 0}


# ---------------------------------------------------------------- ch08_arena_config


@pytest.mark.parametrize(
    "config",
    [
        {"optimizer": "adam", "lr": 0.05, "batch_size": 300, "epochs": 50},
        {"optimizer": "adamw", "lr": 0.05, "weight_decay": 0.01, "batch_size": 300, "epochs": 50},
    ],
)
def test_arena_config_accepts_configs_that_reach_the_target(config):
    results = ch08.check_arena_config(lambda: dict(config), thorough=True)
    assert len(results) == 3 and all(r.steps_to_target <= 50 for r in results)


@pytest.mark.parametrize(
    "config,phrase",
    [
        ({"optimizer": "adam", "lr": 0.01, "batch_size": 32, "epochs": 20}, "over the budget"),
        ({"optimizer": "rmsprop"}, "optimizer must be one of"),
        ({"lr": 3.0, "batch_size": 300, "epochs": 50}, "lr must be between"),
        ({"seed": 7, "batch_size": 300, "epochs": 50}, "remove 'seed'"),
        ({"optimizer": "sgd", "lr": 0.5, "batch_size": 300, "epochs": 50}, "SGD needs far more"),
        ({"lr": 1.0, "batch_size": 300, "epochs": 50}, "too large"),
        ({"lr": 0.002, "batch_size": 300, "epochs": 50}, "too small"),
        ({"lr": 0.01, "batch_size": 32, "epochs": 5}, "a larger batch"),
        ({"lr": 0.05, "batch_size": 300, "epochs": 10}, "plans only 10 steps"),
        ("adam", "should be a dict"),
    ],
)
def test_arena_config_names_what_went_wrong(config, phrase):
    with pytest.raises(Mistake) as caught:
        ch08.check_arena_config(lambda: config)
    assert phrase in str(caught.value)


def test_a_config_that_only_works_on_a_lucky_seed_is_caught():
    lucky = {"optimizer": "adam", "lr": 0.1, "batch_size": 32, "epochs": 5}
    assert ch08.ARENA_CONFIG.judge({"seed": 0}, lucky).steps_to_target is not None
    with pytest.raises(Mistake, match="reaches 90% with seed 0 but not with seed 3"):
        ch08.ARENA_CONFIG.judge({"seed": 3}, lucky)


def test_an_unwritten_arena_config_says_so():
    def make_arena_config():
        raise NotImplementedError()

    with pytest.raises(Mistake, match="not written yet"):
        ch08.check_arena_config(make_arena_config)


def test_searching_with_the_arena_inside_the_answer_does_not_score():
    caller = _define(answers.REFERENCE_CALLER["ch08_arena_config"], "make_arena_config")
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch08.check_arena_config(caller)


# ---------------------------------------------------------------- the questions' answers


def test_steplr_question_counts_three_changes_with_torch():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    used = []
    for _ in range(12):
        used += [optimizer.param_groups[0]["lr"]] * 10
        optimizer.step()
        scheduler.step()
    changes = sum(a != b for a, b in zip(used, used[1:]))
    assert changes == 3 and optimizer.param_groups[0]["lr"] == 0.1 * 0.5**4


def test_adam_question_first_step_is_the_learning_rate():
    w = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    optimizer = torch.optim.Adam([w], lr=0.01)
    w.grad = torch.tensor([250.0], dtype=torch.float64)
    optimizer.step()
    assert math.isclose(-w.item(), 0.01, rel_tol=1e-9)
    without_correction = 0.01 * (0.1 * 250) / math.sqrt(0.001 * 250**2)
    assert math.isclose(without_correction, 0.0316227766, rel_tol=1e-9)


def test_every_grading_run_has_a_decaying_adamw_case(monkeypatch):
    """Adam and AdamW differ only through weight decay: a run whose AdamW cases all had none
    would pass `adamw_is_adam` (about one run in 81 had none)."""
    for seed in range(300):
        monkeypatch.setenv("FORGE_GRADING_SEED", str(seed))
        adamw = [c for c in ch08.fit_cases(thorough=True) if c["optimizer"] == "adamw"]
        assert adamw and all(c["weight_decay"] > 0 for c in adamw), seed
