"""Chapter 05's checks: correct answers in any style pass; each typical mistake is named."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping, Sequence

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

from forge_course.grading import Mistake, ch05
from forge_course.reference import modules as ref
from tests.helpers.copied import copied

# ---------------------------------------------------------------- ch05_repair_model


class AppendMLP(nn.Module):
    """Head built first, hidden layers appended one by one: other init order, same names."""

    def __init__(self, sizes):
        super().__init__()
        self.head = nn.Linear(sizes[-2], sizes[-1])
        self.hidden = nn.ModuleList()
        for i in range(len(sizes) - 2):
            self.hidden.append(nn.Linear(sizes[i], sizes[i + 1]))

    def forward(self, x):
        for layer in self.hidden:
            x = layer(x).relu()
        return self.head(x)


class SequentialMLP(nn.Module):
    """An nn.Sequential of the Linear layers, iterated with a ReLU after each."""

    def __init__(self, sizes):
        super().__init__()
        pairs = list(zip(sizes, sizes[1:]))
        self.hidden = nn.Sequential(*[nn.Linear(a, b) for a, b in pairs[:-1]])
        self.head = nn.Linear(*pairs[-1])

    def forward(self, x):
        for layer in self.hidden:
            x = nn.functional.relu(layer(x))
        return self.head(x)


@pytest.mark.parametrize("answer", [AppendMLP, SequentialMLP])
def test_repair_model_accepts_correct_answers_in_any_style(answer):
    ch05.check_repair_model(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch05.REPAIR_MISTAKES, ids=range(6))
def test_repair_model_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch05.check_repair_model(wrong)
    assert message in str(caught.value)


def test_repair_model_explains_a_missing_super_init():
    class NoSuper(nn.Module):
        def __init__(self, sizes):
            self.hidden = nn.ModuleList([nn.Linear(2, 2)])

    with pytest.raises(Mistake, match="raised AttributeError.*before Module.__init__"):
        ch05.check_repair_model(NoSuper)


def test_repair_model_unanswered_says_not_written_yet():
    class Blank(nn.Module):
        def __init__(self, sizes):
            super().__init__()
            raise NotImplementedError()

    with pytest.raises(Mistake, match="not written yet"):
        ch05.check_repair_model(Blank)


# ---------------------------------------------------------------- ch05_activation_recorder


def recorder_with_exit_stack(model, x, layer_names):
    modules = dict(model.named_modules())
    outputs = {}

    def keep(name, module, inputs, output):
        outputs[name] = output.detach().clone()

    with contextlib.ExitStack() as stack:
        for name in layer_names:
            handle = modules[name].register_forward_hook(functools.partial(keep, name))
            stack.callback(handle.remove)
        model(x)
    return outputs


def recorder_under_no_grad_with_clone(model, x, layer_names):
    outputs, handles = {}, []
    try:
        for name in layer_names:
            module = model.get_submodule(name)
            handles.append(
                module.register_forward_hook(
                    lambda m, args, out, key=name: outputs.update({key: out.clone()})
                )
            )
        with torch.no_grad():
            model(x)
    finally:
        while handles:
            handles.pop().remove()
    return outputs


@pytest.mark.parametrize("answer", [recorder_with_exit_stack, recorder_under_no_grad_with_clone])
def test_activation_recorder_accepts_correct_answers_in_any_style(answer):
    ch05.check_activation_recorder(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch05.RECORDER_MISTAKES, ids=range(10))
def test_activation_recorder_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch05.check_activation_recorder(wrong, thorough=True)
    assert message in str(caught.value)


def test_a_leftover_global_hook_is_named_and_taken_away():
    def global_hook(model, x, layer_names):
        outputs = {}
        nn.modules.module.register_module_forward_hook(
            lambda m, i, out: outputs.update({n: out.detach().clone() for n in layer_names
                                              if model.get_submodule(n) is m})
        )  # fmt: skip
        model(x)
        return outputs

    before = len(nn.modules.module._global_forward_hooks)
    with pytest.raises(Mistake, match="global forward hooks left afterwards should be 0"):
        ch05.check_activation_recorder(global_hook)
    assert len(nn.modules.module._global_forward_hooks) == before


# ---------------------------------------------------------------- ch05_to_device


def to_device_abc(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {key: to_device_abc(value, device) for key, value in batch.items()}
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        items = [to_device_abc(value, device) for value in batch]
        if hasattr(batch, "_make"):
            return batch._make(items)
        return type(batch)(items)
    return batch


def to_device_pytree(batch, device):
    return pytree.tree_map(lambda v: v.to(device) if torch.is_tensor(v) else v, batch)


@pytest.mark.parametrize("answer", [copied(ref.to_device), to_device_abc, to_device_pytree])
def test_to_device_accepts_correct_answers_in_any_style(answer):
    ch05.check_to_device(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch05.TO_DEVICE_MISTAKES, ids=range(5))
def test_to_device_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch05.check_to_device(wrong)
    assert message in str(caught.value)


def test_recursing_into_strings_is_explained():
    def into_every_sequence(batch, device):
        if isinstance(batch, torch.Tensor):
            return batch.to(device)
        if isinstance(batch, dict):
            return {k: into_every_sequence(v, device) for k, v in batch.items()}
        if isinstance(batch, Sequence):
            items = [into_every_sequence(v, device) for v in batch]
            return batch._make(items) if hasattr(batch, "_make") else type(batch)(items)
        return batch

    with pytest.raises(Mistake, match="a str is a sequence"):
        ch05.check_to_device(into_every_sequence)


def test_moving_everything_without_looking_fails_with_the_error():
    with pytest.raises(Mistake, match="raised AttributeError"):
        ch05.check_to_device(lambda batch, device: {k: v.to(device) for k, v in batch.items()})


# ---------------------------------------------------------------- all exercises


def test_calling_the_reference_does_not_score():
    class Subclass(ref.MLP):
        pass

    for check, answer in [
        (ch05.check_repair_model, ref.MLP),
        (ch05.check_repair_model, Subclass),
        (ch05.check_activation_recorder, lambda *a: ref.record_activations(*a)),
        (ch05.check_to_device, ref.to_device),
        (ch05.check_decay_groups, ref.decay_groups),
        (ch05.check_decay_groups, lambda model, wd: ref.decay_groups(model, wd)),
    ]:
        with pytest.raises(Mistake, match="calls forge_course's reference"):
            check(answer)


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    for cases in (
        ch05.repair_model_cases,
        ch05.activation_recorder_cases,
        ch05.to_device_cases,
        ch05.decay_groups_cases,
    ):
        monkeypatch.setenv("FORGE_GRADING_SEED", "1")
        first = cases(thorough=True)
        monkeypatch.setenv("FORGE_GRADING_SEED", "2")
        assert cases(thorough=True) != first
        assert cases(thorough=False) == cases(thorough=False)


def test_the_learner_half_imports_nothing_that_holds_an_answer():
    import subprocess
    import sys

    code = (
        "import sys, forge_course.observe.ch05\n"
        "bad = [m for m in sys.modules if m.startswith(('forge_course.reference', "
        "'forge_course.grading', 'forge_course.sims', 'forge_course.doctor'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_recorder_that_calls_the_reference_only_when_the_forward_pass_fails_does_not_score():
    def falls_back_on_the_reference(model, x, layer_names):
        try:
            return recorder_with_exit_stack(model, x, layer_names)
        except RuntimeError:
            return ref.record_activations(model, x, layer_names)

    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch05.check_activation_recorder(falls_back_on_the_reference)


# ---------------------------------------------------------------- ch05_decay_groups


def decay_groups_by_modules(model, weight_decay):
    """Module by module, each parameter where it is filed, a set against ties."""
    seen, decay, no_decay = set(), [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            quiet = name == "bias" or isinstance(module, ref.NORM_TYPES)
            (no_decay if quiet else decay).append(param)
    return (
        {"params": decay, "weight_decay": weight_decay},
        {"params": iter(no_decay), "weight_decay": 0},
    )


def decay_groups_by_name_sets(model, weight_decay):
    """Names first, then the parameters: the no-decay set built from norm modules' names."""
    norms = {name for name, m in model.named_modules() if isinstance(m, ref.NORM_TYPES)}
    quiet = {
        name
        for name, _ in model.named_parameters()
        if name.endswith(".bias") or name.rpartition(".")[0] in norms
    }
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in trainable if n not in quiet], "weight_decay": weight_decay},
        {"params": [p for n, p in trainable if n in quiet], "weight_decay": 0.0},
    ]


@pytest.mark.parametrize(
    "answer", [copied(ref.decay_groups), decay_groups_by_modules, decay_groups_by_name_sets]
)
def test_decay_groups_accepts_correct_answers_in_any_style(answer):
    ch05.check_decay_groups(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch05.DECAY_MISTAKES, ids=range(5))
def test_decay_groups_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch05.check_decay_groups(wrong, thorough=True)
    assert message in str(caught.value)


def test_decay_groups_visible_check_catches_the_mistakes_the_chapters_model_shows():
    for _, wrong in ch05.DECAY_MISTAKES[:3]:
        with pytest.raises(Mistake):
            ch05.check_decay_groups(wrong)


def test_decay_groups_that_returns_copies_or_a_dict_is_told_so():
    def copies(model, weight_decay):
        groups = decay_groups_by_name_sets(model, weight_decay)
        return [{**g, "params": [p.detach().clone() for p in g["params"]]} for g in groups]

    with pytest.raises(Mistake, match="not one of the model's"):
        ch05.check_decay_groups(copies)
    with pytest.raises(Mistake, match="not a list of dicts"):
        ch05.check_decay_groups(lambda model, wd: {"decay": [], "no_decay": []})
