"""Chapter 01's checks: correct answers in any style pass; each typical mistake is named."""

import pytest
import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

from forge_course.grader import codec
from forge_course.grading import Mistake, ch01
from forge_course.grading.core import explain
from forge_course.reference import autograd_tape as ref
from tests.answers import ch01 as answers
from tests.helpers.copied import copied


def defined(source: str, name: str):
    """What an answer cell defines under ``name``, as the notebook's kernel would see it."""
    namespace = {"torch": torch}
    exec(source, namespace)
    return namespace[name]


def unanswered(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- ch01_graph_walk


@pytest.mark.parametrize("answer", [
    copied(ref.graph_nodes),
    defined(answers.GRAPH_WALK_LIST_AS_QUEUE, "graph_nodes"),
    lambda t: tuple(copied(ref.graph_nodes)(t)),  # a tuple is accepted for a list
])  # fmt: skip
def test_graph_walk_accepts_correct_answers_in_any_style(answer):
    ch01.check_graph_walk(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch01.GRAPH_WALK_MISTAKES, ids=range(len(ch01.GRAPH_WALK_MISTAKES))
)
def test_graph_walk_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch01.check_graph_walk(wrong)
    assert message in str(caught.value)


@pytest.mark.parametrize("source,phrase", [
    (answers.GRAPH_WALK_NO_SEEN_SET, "is listed twice"),
    (answers.GRAPH_WALK_RECURSIVE, "the order is depth-first"),
    (answers.GRAPH_WALK_NO_NONE_CHECK, "Skip `None` wherever it appears"),
    (answers.GRAPH_WALK_REVERSED_INPUTS, "inputs are queued in reverse"),
    (answers.GRAPH_WALK_STACK, "from the end of a stack"),
])  # fmt: skip
def test_graph_walk_wrong_answers_get_their_message(source, phrase):
    with pytest.raises(Mistake, match="ch01_graph_walk") as caught:
        ch01.check_graph_walk(defined(source, "graph_nodes"))
    assert phrase in str(caught.value)


def test_graph_walk_tells_a_stack_from_reversed_inputs_on_the_first_case():
    # Both list the running example's names alike; the graph walked with it tells them apart.
    case = ch01.graph_walk_cases()[0]
    stack, reversed_inputs = (
        ch01.observe_graph_walk(defined(source, "graph_nodes"), case)
        for source in (answers.GRAPH_WALK_STACK, answers.GRAPH_WALK_REVERSED_INPUTS)
    )
    assert stack["the result"] == reversed_inputs["the result"]
    assert stack != reversed_inputs


def test_graph_walk_explains_walking_the_tensor_and_returning_nodes():
    def from_tensor(tensor):
        return [type(n).__name__ for n, _ in tensor.next_functions]

    with pytest.raises(Mistake, match="the tensor itself is not a node"):
        ch01.check_graph_walk(from_tensor)

    def nodes_not_names(tensor):
        return [] if tensor.grad_fn is None else [tensor.grad_fn]

    with pytest.raises(Mistake, match=r"type\(node\).__name__"):
        ch01.check_graph_walk(nodes_not_names)


# ---------------------------------------------------------------- ch01_logsumexp


class ExpMinusLse(torch.autograd.Function):
    """The softmax as exp(x − lse): stable, but it inherits lse's rounding (6e-5 near 1000)."""

    @staticmethod
    def forward(ctx, x, dim):
        m = x.amax(dim, keepdim=True)
        out = (m + (x - m).exp().sum(dim, keepdim=True).log()).squeeze(dim)
        ctx.save_for_backward(x, out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x, out = ctx.saved_tensors
        return (x - out.unsqueeze(ctx.dim)).exp() * grad_output.unsqueeze(ctx.dim), None


@pytest.mark.parametrize("answer", [
    copied(ref.LogSumExp),
    defined(answers.LOGSUMEXP_SOFTMAX_AND_MAX, "LogSumExp"),
    ExpMinusLse,
])  # fmt: skip
def test_logsumexp_accepts_correct_answers_in_any_style(answer):
    ch01.check_logsumexp(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch01.LOGSUMEXP_MISTAKES, ids=range(len(ch01.LOGSUMEXP_MISTAKES))
)
def test_logsumexp_names_each_known_mistake(message, wrong):
    # The hidden cases are needed for some (rows far apart, a square batch).
    with pytest.raises(Mistake) as caught:
        ch01.check_logsumexp(wrong, thorough=True)
    assert message in str(caught.value) or "unsqueeze(dim)" in str(caught.value)


@pytest.mark.parametrize("source,phrase", [
    (answers.LOGSUMEXP_NAIVE, "Subtract the maximum m before `exp`"),
    (answers.LOGSUMEXP_IGNORES_UPSTREAM, "`backward` ignores `grad_output`"),
    (answers.LOGSUMEXP_NO_UNSQUEEZE, "grad_output.unsqueeze(dim)"),
    (answers.LOGSUMEXP_DATA_AND_BACK, "writes into `x` (through `.data`, or in place)"),
])  # fmt: skip
def test_logsumexp_wrong_answers_fail_the_visible_tests_with_their_message(source, phrase):
    with pytest.raises(Mistake) as caught:
        ch01.check_logsumexp(defined(source, "LogSumExp"))
    assert phrase in str(caught.value)


def test_logsumexp_square_batch_catches_the_missing_unsqueeze_silently_broadcasting():
    wrong = defined(answers.LOGSUMEXP_NO_UNSQUEEZE, "LogSumExp")
    case = {
        "shape": [4, 4],
        "dim": -1,
        "offset": [0.0],
        "dtype": "float64",
        "device": "cpu",
        "seed": 3,
    }
    got = ch01.observe_logsumexp(wrong, case)  # no error: (4, 4) * (4,) broadcasts
    with pytest.raises(Mistake, match="broadcasts it along the wrong axis"):
        explain(
            "ch01_logsumexp",
            got,
            ch01.observe_logsumexp(copied(ref.LogSumExp), case),
            known_mistakes=[
                (m, lambda w=w: ch01.observe_logsumexp(w, case)) for m, w in ch01.LOGSUMEXP_MISTAKES
            ],
        )


def test_logsumexp_says_whether_forward_or_backward_raised():
    # The same broadcasting error: in forward it is the maximum, in backward grad_output.
    with pytest.raises(Mistake) as caught:
        ch01.check_logsumexp(defined(answers.LOGSUMEXP_FORWARD_NO_KEEPDIM, "LogSumExp"))
    assert "must match the size of tensor" in str(caught.value)
    assert "`x.amax(dim)` without `keepdim=True`" in str(caught.value)
    assert "grad_output" not in str(caught.value)

    def backward(ctx, grad_output):  # grad_output broadcast along the wrong axis: 3 against 4
        return ctx.saved_tensors[1] * grad_output.unsqueeze(0), None

    with pytest.raises(Mistake) as caught:
        ch01.check_logsumexp(ch01._lse_function(ch01._forward_stable, backward))
    assert "must match the size of tensor" in str(caught.value)
    assert "`grad_output` has the summed dimension removed" in str(caught.value)


def test_logsumexp_explains_the_usual_crashes():
    def forward(ctx, x, dim):
        ctx.dim = dim
        ctx.save_for_backward(x)
        return torch.logsumexp(x, dim, keepdim=True)

    def backward(ctx, grad_output):
        return torch.softmax(ctx.saved_tensors[0], ctx.dim) * grad_output

    keeps_dim = ch01._lse_function(forward, lambda ctx, g: (backward(ctx, g), None))
    with pytest.raises(Mistake, match="removes the summed dimension"):
        ch01.check_logsumexp(keeps_dim)
    no_none = ch01._lse_function(
        ch01._forward_stable, lambda ctx, g: ch01._backward_softmax(ctx, g)[0]
    )
    with pytest.raises(Mistake, match=r"return grad_x, None"):
        ch01.check_logsumexp(no_none)
    with pytest.raises(Mistake, match="derived from torch.autograd.Function"):
        ch01.check_logsumexp(lambda x, dim: torch.logsumexp(x, dim))


class AppliesTorchLogSumExp(torch.autograd.Function):
    """A Function in name only: its `apply` is torch.logsumexp, so its own methods never run."""

    apply = staticmethod(torch.logsumexp)
    forward = staticmethod(ch01._forward_stable)
    backward = staticmethod(ch01._backward_softmax)


@pytest.mark.parametrize(
    "answer",
    [
        defined(answers.LOGSUMEXP_NOT_A_FUNCTION, "LogSumExp"),
        AppliesTorchLogSumExp,
    ],
    ids=["a class whose apply is torch.logsumexp", "apply overridden"],
)
def test_logsumexp_must_be_a_function_of_ones_own(answer):
    # A Function whose apply is torch.logsumexp is named for what it runs: torch's own.
    phrase = "should run a `torch.autograd.Function` of your own|does the work the exercise asks"
    with pytest.raises(Mistake, match=phrase):
        ch01.check_logsumexp(answer)


def _forward_through(route):
    def forward(ctx, x, dim):
        ctx.save_for_backward(x, torch.softmax(x, dim))
        ctx.dim = dim
        return route(x, dim)

    return ch01._lse_function(forward, ch01._backward_softmax)


@pytest.mark.parametrize(
    "answer",
    [
        defined(answers.LOGSUMEXP_CALLS_TORCH, "LogSumExp"),
        defined(answers.LOGSUMEXP_BACKWARD_CALLS_TORCH, "LogSumExp"),
        _forward_through(lambda x, dim: x.logsumexp(dim)),
        _forward_through(lambda x, dim: torch.special.logsumexp(x, dim)),
        _forward_through(lambda x, dim: torch.ops.aten.logsumexp(x, [dim])),
    ],
    ids=["forward", "backward", "Tensor.logsumexp", "torch.special", "torch.ops.aten"],
)
def test_logsumexp_must_not_call_torch_logsumexp(answer):
    with pytest.raises(Mistake) as caught:
        ch01.check_logsumexp(answer)
    assert "call `torch.logsumexp` in neither `forward` nor `backward`" in str(caught.value)


def test_logsumexp_must_not_take_the_watch_away():
    class Hides(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def forward(ctx, x, dim):
        Hides().__enter__()  # left on, on top of the check's watch
        return ch01._forward_stable(ctx, x, dim)

    with pytest.raises(Mistake, match="took away the check's instrument"):
        ch01.check_logsumexp(ch01._lse_function(forward, ch01._backward_softmax))
    assert _get_current_function_mode_stack() == []  # the check tidied up after it


class ShiftsInPlace(torch.autograd.Function):
    """Right value and gradient, and the caller's logits shifted by their maximum."""

    @staticmethod
    def forward(ctx, x, dim):
        m = x.amax(dim, keepdim=True)
        x -= m
        total = x.exp().sum(dim, keepdim=True)
        ctx.save_for_backward(x.exp() / total)
        ctx.dim = dim
        return (m + total.log()).squeeze(dim)

    @staticmethod
    def backward(ctx, grad_output):
        return ctx.saved_tensors[0] * grad_output.unsqueeze(ctx.dim), None


def test_logsumexp_must_leave_the_logits_alone():
    with pytest.raises(Mistake, match="the logits after the call should be") as caught:
        ch01.check_logsumexp(ShiftsInPlace)
    assert "`forward` changes `x` in place" in str(caught.value)


def test_logsumexp_thorough_runs_gradcheck_in_float64_only():
    cases = ch01.logsumexp_cases(thorough=True)
    seen = [ch01.observe_logsumexp(copied(ref.LogSumExp), c) for c in cases]
    for case, obs in zip(cases, seen):
        has_gradcheck = case["dtype"] == "float64" and "shape" in case
        assert ("passes gradcheck" in obs) == has_gradcheck
        if has_gradcheck:
            assert obs["passes gradcheck"] is True
        assert torch.isfinite(obs["value"]).all() and torch.isfinite(obs["gradient"]).all()


# ---------------------------------------------------------------- ch01_straight_through


@pytest.mark.parametrize("answer", [
    copied(ref.RoundSTE).apply,
    defined(answers.STE_DETACH_TRICK, "round_ste"),
    lambda x: torch.round(x).detach() + x - x.detach(),
])  # fmt: skip
def test_straight_through_accepts_correct_answers_in_any_style(answer):
    ch01.check_straight_through(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong",
    ch01.STRAIGHT_THROUGH_MISTAKES,
    ids=range(len(ch01.STRAIGHT_THROUGH_MISTAKES)),
)
def test_straight_through_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch01.check_straight_through(wrong)
    assert message in str(caught.value)


@pytest.mark.parametrize("source,phrase", [
    (answers.STE_PLAIN_ROUND, "the gradient is all zeros"),
    (answers.STE_DETACHED, "cut off from the graph"),
    (answers.STE_ONES, "returns ones instead of `grad_output`"),
])  # fmt: skip
def test_straight_through_wrong_answers_get_their_message(source, phrase):
    with pytest.raises(Mistake) as caught:
        ch01.check_straight_through(defined(source, "round_ste"))
    assert phrase in str(caught.value)


def test_straight_through_must_leave_x_alone():
    # Rounding x itself through .data gives the right value and gradient, and a changed caller.
    with pytest.raises(Mistake, match="x after the call differs") as caught:
        ch01.check_straight_through(defined(answers.STE_DATA_IN_PLACE, "round_ste"))
    assert "rounds the caller's `x` in place (through `.data`)" in str(caught.value)


def test_straight_through_must_keep_the_callers_graph():
    # Restarting the graph at x (a new leaf) rounds correctly, but no gradient reaches x.
    def restarts(x):
        fresh = x.detach().requires_grad_()
        return fresh + (torch.round(fresh) - fresh).detach()

    with pytest.raises(Mistake, match="gradient should be a tensor .*, but it is None"):
        ch01.check_straight_through(restarts)


# ---------------------------------------------------------------- all exercises


def test_unanswered_exercises_say_so():
    for check in (ch01.check_graph_walk, ch01.check_straight_through):
        with pytest.raises(Mistake, match="not written yet"):
            check(unanswered)
    blank = ch01._lse_function(unanswered, unanswered)
    with pytest.raises(Mistake, match="not written yet"):
        ch01.check_logsumexp(blank)


def test_calling_the_reference_does_not_score():
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch01.check_graph_walk(ref.graph_nodes)
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch01.check_logsumexp(ref.LogSumExp)
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch01.check_straight_through(lambda x: ref.round_ste(x))
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch01.check_graph_walk(lambda t: [type(n).__name__ for n in ref.recorded_graph(t).nodes])


def test_observations_are_plain_data():
    plain = (str, bool, int, float, list, torch.Tensor, type(None))
    for case in ch01.graph_walk_cases()[:2]:  # the first walks a second graph too: two lists
        seen = ch01.observe_graph_walk(copied(ref.graph_nodes), case)
        lists = seen.values() if isinstance(seen, dict) else [seen]
        assert all(isinstance(v, str) for listed in lists for v in listed)
    for obs in (
        ch01.observe_logsumexp(copied(ref.LogSumExp), ch01.logsumexp_cases()[1]),
        ch01.observe_straight_through(copied(ref.RoundSTE).apply, ch01.straight_through_cases()[0]),
    ):
        assert all(isinstance(v, plain) for v in obs.values())
        assert all(v.grad_fn is None for v in obs.values() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("exercise", ch01.EXERCISES, ids=lambda e: e.grade_id)
def test_the_reference_passes_through_the_graders_codec(exercise):
    # What a grading worker sends back is plain data; judged in the grader's process, it passes.
    for case in exercise.cases(False) + exercise.cases(True):
        sent = codec.dumps(exercise.expected(case))
        exercise.judge(case, codec.loads(sent))


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    for cases in (ch01.graph_walk_cases, ch01.logsumexp_cases, ch01.straight_through_cases):
        monkeypatch.setenv("FORGE_GRADING_SEED", "1")
        first = cases(thorough=True)
        monkeypatch.setenv("FORGE_GRADING_SEED", "2")
        assert cases(thorough=True) != first
        assert cases(thorough=False) == cases(thorough=False)


def test_straight_through_refuses_writing_into_x_even_when_it_is_put_back():
    # x.data = ... swaps x's memory rather than writing into it: caught by x's values instead.
    with pytest.raises(Mistake, match="writes into the caller's `x`|x after the call"):
        ch01.check_straight_through(defined(answers.STE_DATA_AND_BACK, "round_ste"))

    def rounds_and_restores(x):
        saved = x.detach().clone()
        x.data.round_()
        out = x + 0
        x.data.copy_(saved)
        return out

    with pytest.raises(Mistake, match="writes into the caller's `x`"):
        ch01.check_straight_through(rounds_and_restores)
