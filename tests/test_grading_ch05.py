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


def recorder_that_puts_every_mode_back(model, x, layer_names):
    """Switches to eval mode and autograd off for its pass, and puts both back as it found them."""
    outputs, handles = {}, []
    modes = {module: module.training for module in model.modules()}
    grad = torch.is_grad_enabled()
    try:
        for name in layer_names:
            handles.append(
                model.get_submodule(name).register_forward_hook(
                    lambda m, args, out, key=name: outputs.__setitem__(key, out.detach().clone())
                )
            )
        model.eval()
        torch.set_grad_enabled(False)
        model(x)
    finally:
        torch.set_grad_enabled(grad)
        for module, training in modes.items():
            module.train(training)
        for handle in handles:
            handle.remove()
    return outputs


def recorder_whose_hook_returns_the_output_itself(model, x, layer_names):
    """Returning the output unchanged replaces it with itself: nothing changes."""
    outputs, handles = {}, []

    def hook(name):
        def keep(module, args, out):
            outputs[name] = out.detach().clone()
            return out

        return keep

    try:
        for name in layer_names:
            handles.append(model.get_submodule(name).register_forward_hook(hook(name)))
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return outputs


@pytest.mark.parametrize(
    "answer",
    [
        recorder_with_exit_stack,
        recorder_under_no_grad_with_clone,
        recorder_that_puts_every_mode_back,
        recorder_whose_hook_returns_the_output_itself,
    ],
)
def test_activation_recorder_accepts_correct_answers_in_any_style(answer):
    ch05.check_activation_recorder(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch05.RECORDER_MISTAKES, ids=range(len(ch05.RECORDER_MISTAKES))
)
def test_activation_recorder_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch05.check_activation_recorder(wrong, thorough=True)
    assert message in str(caught.value)


def test_a_hook_that_returns_its_copy_is_named_even_where_no_value_shows_it():
    """`setdefault` in a lambda returns the copy, which replaces the module's output: named on
    the in-place ReLU's model, and also on the residual one, where every value agrees."""

    def returns_from_a_lambda(model, x, layer_names):
        recorded, handles = {}, []
        try:
            for name in layer_names:
                handles.append(
                    model.get_submodule(name).register_forward_hook(
                        lambda m, i, out, name=name: recorded.setdefault(name, out.detach().clone())
                    )
                )
            with torch.no_grad():
                model(x)
        finally:
            for handle in handles:
                handle.remove()
        return recorded

    message = next(m for m, wrong in ch05.RECORDER_MISTAKES if wrong is ch05._hook_returns_copy)
    with pytest.raises(Mistake) as caught:
        ch05.check_activation_recorder(returns_from_a_lambda)
    assert message in str(caught.value)
    case = {"model": "shared", "names": ["embed", "head"], "seed": 0, "device": "cpu"}
    with pytest.raises(Mistake) as caught:
        ch05.ACTIVATION_RECORDER.judge(
            case, ch05.ACTIVATION_RECORDER.observe(returns_from_a_lambda, case)
        )
    assert "output a hook replaced with its return value should be '[]'" in str(caught.value)
    assert message in str(caught.value)


def _records_then(change):
    """A correct recorder that also makes ``change(model)`` and does not undo it."""

    def record(model, x, layer_names):
        change(model)
        return recorder_with_exit_stack(model, x, layer_names)

    return record


@pytest.mark.parametrize(
    "change,phrase",
    [
        (lambda model: model.eval(), "the model's mode: train → eval"),
        (lambda model: torch.set_grad_enabled(False), "grad mode: on → off"),
        (lambda model: model.requires_grad_(False), "requires_grad: True → False"),
    ],
)
def test_a_recorder_that_leaves_a_setting_changed_is_told_what(change, phrase):
    with pytest.raises(Mistake) as caught:
        ch05.check_activation_recorder(_records_then(change))
    assert phrase in str(caught.value) and "a recorder only looks" in str(caught.value)
    assert torch.is_grad_enabled()  # put back, so that the notebook's later cells have autograd


def test_a_recorder_that_ends_in_train_mode_changes_the_callers_eval_block():
    """`model.train(was_training)` puts the top module back, not a block the caller froze."""

    def back_to_train(model, x, layer_names):
        was_training = model.training
        model.eval()
        try:
            return recorder_with_exit_stack(model, x, layer_names)
        finally:
            model.train(was_training)

    ch05.check_activation_recorder(back_to_train)  # the visible model is in one mode
    with pytest.raises(Mistake, match=r"model\[encoder.2\]'s mode: eval → train"):
        ch05.check_activation_recorder(back_to_train, thorough=True)


def test_a_recorder_that_puts_grad_mode_back_only_when_nothing_raised_is_caught():
    def no_finally(model, x, layer_names):
        torch.set_grad_enabled(False)
        outputs = recorder_with_exit_stack(model, x, layer_names)
        torch.set_grad_enabled(True)
        return outputs

    with pytest.raises(Mistake, match="left something changed behind it when the forward pass"):
        ch05.check_activation_recorder(no_finally)
    assert torch.is_grad_enabled()


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


@pytest.mark.parametrize(
    "message,wrong", ch05.TO_DEVICE_MISTAKES, ids=range(len(ch05.TO_DEVICE_MISTAKES))
)
def test_to_device_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch05.check_to_device(wrong)
    assert message in str(caught.value)


def test_to_device_that_detaches_or_moves_under_no_grad_is_named():
    """The visible batch holds a tensor that requires grad: moved, it stays in the graph."""

    def under_no_grad(batch, device):
        with torch.no_grad():
            return to_device_abc(batch, device)

    message = next(m for m, wrong in ch05.TO_DEVICE_MISTAKES if wrong is ch05._detached)
    with pytest.raises(Mistake) as caught:
        ch05.check_to_device(under_no_grad)
    assert message in str(caught.value) and "requires grad" in str(caught.value)

    def detached_then_made_a_leaf(batch, device):
        return pytree.tree_map(
            lambda v: v.detach().to(device).requires_grad_(v.requires_grad)
            if torch.is_tensor(v) else v,
            batch,
        )  # fmt: skip

    with pytest.raises(Mistake, match="cut off from the tensor passed in"):
        ch05.check_to_device(detached_then_made_a_leaf)


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
