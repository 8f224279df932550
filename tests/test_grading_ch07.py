"""Chapter 07's checks: correct answers in any style pass; each typical mistake is named."""

import math

import numpy as np
import pytest
import torch

from forge_course.grader import codec
from forge_course.grading import Mistake, ch07
from forge_course.reference import detectors
from tests.answers import ch07 as answers
from tests.conftest import REPO
from tests.helpers.copied import copied
from tests.test_grading_ch08 import (
    NEVER_IN_A_WORKER,
    forbidden_imports,
    modules_loaded_by,
    settings_source,
)


def answers_leak(name):
    """The ``graph_leaks`` an answer of `tests.answers.ch07` defines."""
    namespace = {}
    exec(compile(getattr(answers, name), f"<{name}>", "exec"), namespace)
    return namespace["graph_leaks"]


def test_the_settings_cell_imports_only_what_a_grading_worker_holds():
    assert forbidden_imports(settings_source(REPO / "solutions" / "ch07_bug_museum.py")) == []


def test_the_observer_imports_nothing_a_grading_worker_does_not_hold():
    loaded = modules_loaded_by("forge_course.observe.ch07")
    assert [m for m in loaded if m.startswith(NEVER_IN_A_WORKER)] == []


# ---------------------------------------------------------------- ch07_grad_norm


def loop_grad_norm(model):
    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += p.grad.detach().pow(2).sum().item()
    return math.sqrt(total)


def flat_grad_norm(model):
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    return torch.cat(grads).norm().item() if grads else 0.0


def clip_grad_norm(model):
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))


def numpy_grad_norm(model):
    squares = [np.square(p.grad.detach().cpu().double().numpy()).sum() for p in model.parameters()
               if p.grad is not None]  # fmt: skip
    return np.sqrt(np.sum(squares)) if squares else 0


GRAD_NORMS = [loop_grad_norm, flat_grad_norm, clip_grad_norm, numpy_grad_norm]


@pytest.mark.parametrize("answer", [*GRAD_NORMS, copied(detectors.grad_norm)])
def test_grad_norm_accepts_correct_answers_in_any_style(answer):
    ch07.check_grad_norm(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch07.GRAD_NORM_MISTAKES, ids=range(len(ch07.GRAD_NORM_MISTAKES))
)
def test_grad_norm_visible_cases_already_catch_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch07.check_grad_norm(wrong)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "message,wrong", ch07.GRAD_NORM_MISTAKES, ids=range(len(ch07.GRAD_NORM_MISTAKES))
)
def test_grad_norm_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch07.check_grad_norm(wrong, thorough=True)
    assert message in str(caught.value)


def state_dict_grad_norm(model):
    grads = [p.grad for p in model.state_dict(keep_vars=True).values() if p.grad is not None]
    return math.sqrt(sum(g.pow(2).sum().item() for g in grads))


def per_module_grad_norm(model):
    total = 0.0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.grad is not None:
                total += p.grad.pow(2).sum().item()
    return math.sqrt(total)


def unique_by_storage(model):
    seen, total = set(), 0.0
    for p in model.parameters():
        if p.grad is not None and p.grad.untyped_storage().data_ptr() not in seen:
            seen.add(p.grad.untyped_storage().data_ptr())
            total += p.grad.pow(2).sum().item()
    return math.sqrt(total)


def unique_by_value(model):
    norms = {round(p.grad.norm().item(), 6) for p in model.parameters() if p.grad is not None}
    return math.sqrt(sum(n * n for n in norms))


@pytest.mark.parametrize(
    "wrong,named",
    [
        (state_dict_grad_norm, "a weight shared by two layers was counted twice"),
        (per_module_grad_norm, "a weight shared by two layers was counted twice"),
        (unique_by_value, "gradients have the same value were counted once"),
    ],
)
def test_grad_norm_counts_each_parameter_once_by_identity(wrong, named):
    with pytest.raises(Mistake, match=named):
        ch07.check_grad_norm(wrong)


def test_grad_norm_de_duplicated_by_the_gradient_storage_is_right():
    ch07.check_grad_norm(unique_by_storage, thorough=True)


def test_grad_norm_that_trips_on_a_missing_gradient_is_told_why():
    def every_parameter(model):
        return math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters()))

    with pytest.raises(Mistake, match=r"raised AttributeError(.|\n)*has `.grad = None`"):
        ch07.check_grad_norm(every_parameter)

    def requires_grad_filter(model):
        trained = [p for p in model.parameters() if p.requires_grad]
        return math.sqrt(sum(p.grad.pow(2).sum().item() for p in trained))

    with pytest.raises(Mistake, match="test `p.grad is not None`, not `p.requires_grad`"):
        ch07.check_grad_norm(requires_grad_filter, thorough=True)

    def stacks(model):
        norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]
        return torch.stack(norms).norm().item()

    with pytest.raises(Mistake, match="the norm is then 0.0"):
        ch07.check_grad_norm(stacks, thorough=True)


def test_an_unwritten_grad_norm_says_so():
    def grad_norm(model):
        raise NotImplementedError()

    with pytest.raises(Mistake, match="not written yet"):
        ch07.check_grad_norm(grad_norm)


# ---------------------------------------------------------------- ch07_leak_check


def stack_graph_leaks(obj):
    count, todo = 0, [obj]
    while todo:
        item = todo.pop()
        if isinstance(item, torch.Tensor):
            count += item.grad_fn is not None
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    return count


def comprehension_graph_leaks(obj):
    if isinstance(obj, torch.Tensor):
        return 1 if obj.grad_fn else 0
    children = obj.values() if isinstance(obj, dict) else obj
    if not isinstance(children, (list, tuple, type({}.values()))):
        return 0
    return sum([comprehension_graph_leaks(c) for c in children])


@pytest.mark.parametrize(
    "answer", [stack_graph_leaks, comprehension_graph_leaks, copied(detectors.graph_leaks)]
)
def test_leak_check_accepts_correct_answers_in_any_style(answer):
    ch07.check_leak_check(answer, thorough=True)


@pytest.mark.parametrize("thorough", [False, True], ids=["visible", "hidden"])
@pytest.mark.parametrize("message,wrong", ch07.LEAK_MISTAKES, ids=range(len(ch07.LEAK_MISTAKES)))
def test_leak_check_names_each_known_mistake(message, wrong, thorough):
    with pytest.raises(Mistake) as caught:
        ch07.check_leak_check(wrong, thorough=thorough)
    assert message in str(caught.value)


def _leaks(obj, count, open_dict=dict.values, opened=(list, tuple)):
    """A graph_leaks that counts tensors with ``count(tensor) -> int``, opening what it is told."""
    if isinstance(obj, torch.Tensor):
        return count(obj)
    if isinstance(obj, dict):
        return sum(_leaks(v, count, open_dict, opened) for v in open_dict(obj))
    if isinstance(obj, opened):
        return sum(_leaks(v, count, open_dict, opened) for v in obj)
    return 0


def _once_by(key):
    def graph_leaks(obj):
        seen = set()

        def count(tensor):
            if tensor.grad_fn is None or key(tensor) in seen:
                return 0
            seen.add(key(tensor))
            return 1

        return _leaks(obj, count)

    return graph_leaks


def _in_a_list(obj):
    kept = []

    def count(tensor):
        if tensor.grad_fn is None or any(tensor is seen for seen in kept):
            return 0
        kept.append(tensor)
        return 1

    return _leaks(obj, count)


@pytest.mark.parametrize(
    "answer",
    [_once_by(id), _once_by(lambda t: t), _once_by(lambda t: t.data_ptr()),
     _once_by(lambda t: t.grad_fn), _in_a_list, answers_leak("LEAK_ONCE_EACH")],
    ids=["id", "set of tensors", "storage", "grad_fn", "is", "round-trip answer"],
)  # fmt: skip
def test_leak_check_counts_a_tensor_stored_twice_twice(answer):
    with pytest.raises(Mistake, match="a tensor stored twice counts twice"):
        ch07.check_leak_check(answer)


def _keys_and_values(obj):
    if isinstance(obj, torch.Tensor):
        return int(obj.grad_fn is not None)
    if isinstance(obj, dict):
        return sum(_keys_and_values(k) + _keys_and_values(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return sum(_keys_and_values(item) for item in obj)
    return 0


def test_leak_check_searches_dict_values_not_keys():
    with pytest.raises(Mistake, match="keys were searched as well as its values"):
        ch07.check_leak_check(_keys_and_values)


def _every_iterable_but_strings(obj):
    if isinstance(obj, torch.Tensor):
        return int(obj.grad_fn is not None)
    if isinstance(obj, dict):
        obj = obj.values()
    if isinstance(obj, (str, bytes)) or not hasattr(obj, "__iter__"):
        return 0
    return sum(_every_iterable_but_strings(item) for item in obj)


@pytest.mark.parametrize(
    "answer",
    [lambda obj: _leaks(obj, lambda t: int(t.grad_fn is not None),
                        opened=(list, tuple, set, frozenset)),
     _every_iterable_but_strings],
    ids=["sets too", "every iterable but strings"],
)  # fmt: skip
def test_leak_check_opens_only_lists_tuples_and_dicts(answer):
    with pytest.raises(Mistake, match="a set was searched"):
        ch07.check_leak_check(answer)


def test_visible_cases_cover_every_case_the_exercise_text_names():
    """An answer that fails a hidden case for a reason the exercise text states fails the
    visible tests too: every kind of model and object is in them."""
    assert {c["model"] for c in ch07.grad_norm_cases()} == set(ch07.GRAD_MODELS)
    assert {c["dtype"] for c in ch07.grad_norm_cases()} == {"float32", "float64"}
    assert [c["name"] for c in ch07.leak_cases()[: len(ch07.LEAK_CASES)]] == list(ch07.LEAK_CASES)

    def stacks(model):  # fails before any backward: torch.stack([])
        return torch.stack([p.grad.norm() for p in model.parameters()
                            if p.grad is not None]).norm().item()  # fmt: skip

    with pytest.raises(Mistake, match="the norm is then 0.0"):
        ch07.check_grad_norm(stacks)

    def requires_grad_filter(model):
        trained = [p for p in model.parameters() if p.requires_grad]
        return math.sqrt(sum(p.grad.pow(2).sum().item() for p in trained))

    with pytest.raises(Mistake, match="not `p.requires_grad`"):
        ch07.check_grad_norm(requires_grad_filter)

    with pytest.raises(Mistake, match=r"merely \*require\* grad"):
        ch07.check_leak_check(lambda obj: _leaks(obj, lambda t: int(t.requires_grad)))


def test_leak_check_explains_endless_recursion_into_strings():
    def every_iterable(obj):
        if isinstance(obj, torch.Tensor):
            return int(obj.grad_fn is not None)
        if isinstance(obj, dict):
            obj = obj.values()
        try:
            return sum(every_iterable(item) for item in obj)
        except TypeError:
            return 0

    with pytest.raises(Mistake, match="raised RecursionError(.|\n)*a string is iterable"):
        ch07.check_leak_check(every_iterable)


def test_calling_the_reference_does_not_score():
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch07.check_grad_norm(lambda model: detectors.grad_norm(model))
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch07.check_leak_check(detectors.graph_leaks)


def _through_the_codec(exercise, answer, thorough):
    """Judge ``answer`` as `forge-course grade` does: observed, sent as plain JSON, judged."""
    for case in exercise.cases(thorough):
        exercise.judge(case, codec.loads(codec.dumps(exercise.observe(answer, case))))


def test_observations_survive_the_trip_to_an_isolated_grader():
    assert [(e.grade_id, e.function) for e in ch07.EXERCISES] == [
        ("ch07_grad_norm", "grad_norm"), ("ch07_leak_check", "graph_leaks")
    ]  # fmt: skip
    for thorough in (False, True):
        _through_the_codec(ch07.GRAD_NORM, numpy_grad_norm, thorough)
        _through_the_codec(ch07.LEAK_CHECK, stack_graph_leaks, thorough)
    with pytest.raises(Mistake, match="sum of the per-parameter norms"):
        _through_the_codec(ch07.GRAD_NORM, ch07.GRAD_NORM_MISTAKES[0][1], False)
    with pytest.raises(Mistake, match="a tensor stored twice counts twice"):
        _through_the_codec(ch07.LEAK_CHECK, answers_leak("LEAK_ONCE_EACH"), False)


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    monkeypatch.setenv("FORGE_GRADING_SEED", "1")
    first = (ch07.grad_norm_cases(thorough=True), ch07.leak_cases(thorough=True))
    monkeypatch.setenv("FORGE_GRADING_SEED", "2")
    assert (ch07.grad_norm_cases(thorough=True), ch07.leak_cases(thorough=True)) != first
    assert ch07.grad_norm_cases() == ch07.grad_norm_cases()


# ---------------------------------------------------------------- ch07_mystery_loops

LOOPS = list("ABC")
RIGHT = {"A": "missing_zero_grad", "B": "none", "C": "graph_kept_alive"}
HINTS = {"A": "look at zero_grad", "B": "nothing wrong", "C": "look at the graphs"}


def test_labels_visible_check_is_about_the_form_only():
    ch07.check_labels({"A": "none", "B": "none", "C": "none"}, "ch07_mystery_loops", LOOPS)
    for answer, message in [
        (None, "No answer yet"),
        ([("A", "none")], "should be a dict"),
        ({"A": "none", "B": "none"}, r"no label for loop\(s\) \['C'\]"),
        ({"A": "none", "B": "none", "C": "none", "G": "none"}, "There is no loop 'G'"),
        ({"A": "none", "B": "zero_grad", "C": "none"}, "Loop B: 'zero_grad' is not one of"),
        ({"A": "none", "B": 3, "C": "none"}, "Loop B: 3 is not one of the codes"),
    ]:
        with pytest.raises(Mistake, match=message):
            ch07.check_labels(answer, "ch07_mystery_loops", LOOPS)


def test_labels_hidden_check_lists_every_wrong_loop_with_its_hint():
    ch07.check_labels({"a ": " MISSING_ZERO_GRAD", "b": "None", "C": "graph_kept_alive"},
                      "ch07_mystery_loops", LOOPS, correct=RIGHT, hints=HINTS)  # fmt: skip
    with pytest.raises(Mistake) as caught:
        ch07.check_labels({"A": "graph_kept_alive", "B": "none", "C": "missing_zero_grad"},
                          "ch07_mystery_loops", LOOPS, correct=RIGHT, hints=HINTS)  # fmt: skip
    message = str(caught.value)
    assert "1 of 3 loops labelled right" in message
    assert "Loop A: 'graph_kept_alive' is not right. look at zero_grad" in message
    assert "Loop C: 'missing_zero_grad' is not right. look at the graphs" in message
    assert "Loop B" not in message
