"""The shared checking machinery: comparisons, and messages a learner can act on."""

import pytest
import torch

from forge_course.grading import Mistake, check_choice, check_number
from forge_course.grading.core import call_answer, explain, first_difference


def test_equal_observations_have_no_difference():
    obs = {"loss": 0.5, "params": {"w": torch.ones(3)}, "steps": [1, 2]}
    assert (
        first_difference(obs, {"loss": 0.5, "params": {"w": torch.ones(3)}, "steps": [1, 2]})
        is None
    )


def test_an_int_is_accepted_for_a_float_and_a_tuple_for_a_list():
    assert first_difference(3, 3.0) is None
    assert first_difference((1.0, 2.0), [1.0, 2.0]) is None


def test_a_tensor_is_not_a_float():
    diff = first_difference(torch.tensor(0.5), 0.5)
    assert "should be a Python float" in diff and "it is a tensor" in diff


@pytest.mark.parametrize("got,word", [
    (torch.ones(3, dtype=torch.float64), "dtype"),
    (torch.ones(4), "shape"),
    (torch.tensor([1.0, 1.0, 1.5]), "should be"),
])  # fmt: skip
def test_tensor_differences_name_what_differs(got, word):
    assert word in first_difference(got, torch.ones(3))


def test_large_tensors_point_at_the_worst_entry():
    want = torch.zeros(10, 10)
    got = want.clone()
    got[3, 7] = 1.0
    diff = first_difference(got, want)
    assert "1 of 100 entries" in diff and "[3, 7]" in diff


def test_tolerance_follows_dtype():
    assert first_difference(torch.tensor([1.0 + 1e-7]), torch.tensor([1.0])) is None
    assert first_difference(torch.tensor([1.0 + 1e-6], dtype=torch.float64),
                            torch.tensor([1.0], dtype=torch.float64)) is not None  # fmt: skip


def test_explain_names_the_matching_known_mistake():
    with pytest.raises(Mistake, match="Likely mistake: sign flipped"):
        explain("ex", {"a": 1.0, "b": -2.0}, {"a": 1.0, "b": 2.0},
                known_mistakes=[("doubled", lambda: {"a": 1.0, "b": 4.0}),
                                ("sign flipped", lambda: {"a": 1.0, "b": -2.0})])  # fmt: skip


def test_explain_falls_back_to_the_hint():
    with pytest.raises(Mistake, match=r"(?s)\[ex\] b should be 2.*Likely mistake: look again"):
        explain("ex", {"b": 3.0}, {"b": 2.0}, known_mistakes=[("x", lambda: {"b": 4.0})],
                hint="look again")  # fmt: skip


def test_call_answer_explains_an_unwritten_answer():
    def blank():
        raise NotImplementedError()

    with pytest.raises(Mistake, match="not written yet"):
        call_answer("ex", "blank", blank)


def test_call_answer_wraps_errors_with_the_case():
    with pytest.raises(Mistake, match=r"`f` raised ZeroDivisionError \(case 1\)"):
        call_answer("ex", "f", lambda: 1 / 0, case="case 1")


def test_call_answer_rejects_a_non_function():
    with pytest.raises(Mistake, match="should be a function"):
        call_answer("ex", "f", 42)


def test_check_choice():
    check_choice("C", "q", "abcd")
    check_choice("c", "q", "abcd", correct="c")
    with pytest.raises(Mistake, match="No answer yet"):
        check_choice(None, "q", "abcd")
    with pytest.raises(Mistake, match="one of"):
        check_choice("e", "q", "abcd")
    with pytest.raises(Mistake, match="not right. Because"):
        check_choice("a", "q", "abcd", correct="c", why_not={"a": "Because."})


def test_check_number():
    check_number(3, "q")
    check_number(3.0, "q", expected=3)
    with pytest.raises(Mistake, match="a number"):
        check_number("3", "q")
    with pytest.raises(Mistake, match="a number"):
        check_number(True, "q")
    with pytest.raises(Mistake, match="count the first"):
        check_number(2, "q", expected=3, hints={2: "count the first"})


# ---------------------------------------------------------------- a hint names a mistake it sees

REFERENCE = {"updates": 3, "loss": 0.5, "weights": [1.0, 2.0]}
REBUILT_MODEL = {"updates": 0, "loss": 0.9, "weights": [0.0, 0.0]}  # a mistake's observation


def test_one_shared_symptom_does_not_name_a_mistake():
    # No updates, like the rebuilt model, but the loss and weights say something else happened.
    got = {"updates": 0, "loss": 0.5, "weights": [1.0, 2.0]}
    with pytest.raises(Mistake) as caught:
        explain("ex", got, REFERENCE, known_mistakes=[("rebuilt", lambda: REBUILT_MODEL)],
                hint="the spec")  # fmt: skip
    assert "rebuilt" not in str(caught.value)
    assert "updates should be 3, but it is 0" in str(caught.value)


def test_every_part_of_a_mistake_seen_names_it_even_beside_another_slip():
    got = {**REBUILT_MODEL, "extra": 1}
    reference, mistake = {**REFERENCE, "extra": 0}, {**REBUILT_MODEL, "extra": 0}
    with pytest.raises(Mistake, match="Likely mistake: rebuilt; something else differs too"):
        explain("ex", got, reference, known_mistakes=[("rebuilt", lambda: mistake)])


def test_without_a_matching_mistake_every_difference_is_listed():
    got = {"updates": 2, "loss": 0.7, "weights": [1.0, 2.0]}
    with pytest.raises(Mistake, match=r"(?s)updates should be 3.*Also different: loss\."):
        explain("ex", got, REFERENCE, known_mistakes=[("rebuilt", lambda: REBUILT_MODEL)])


# ---------------------------------------------------------------- a check ends in a message


def _exercise(observe):
    from forge_course.grading.core import Exercise

    return Exercise(grade_id="ex", function="f", reference=lambda: 1.0,
                    cases=lambda thorough: [{"n": 1}], observe=observe)  # fmt: skip


def observe_then_backward(fn, case):
    out = call_answer("ex", "f", fn, torch.ones(2, requires_grad=True))
    out.sum().backward()  # fails where the answer left grad mode off
    return {"value": float(out.sum())}


def test_a_check_that_fails_on_what_the_answer_left_ends_in_a_message_and_puts_it_back():
    def leaves_grad_off(x):
        torch.set_grad_enabled(False)
        return x * 2

    with pytest.raises(Mistake, match=r"(?s)could not observe.*left grad mode on → off"):
        _exercise(observe_then_backward).check(leaves_grad_off)
    assert torch.is_grad_enabled()


def test_a_check_that_cannot_compare_what_came_back_ends_in_a_message():
    class Strange:
        def __eq__(self, other):
            raise RuntimeError("no comparing me")

    exercise = _exercise(lambda fn, case: {"value": Strange()})
    with pytest.raises(Mistake, match="could not compare what your answer produced"):
        exercise.check(lambda: None)


def test_a_judge_in_one_thread_draws_nothing_from_an_observation_in_another():
    """The grader judges submissions in threads. A judge that seeds and draws from torch's
    generator (the arena trains) must not reach a reference observed meanwhile, whose numbers
    (dropout's masks) come from that generator too: `judged` holds the clean room."""
    import threading
    import time

    from forge_course.grading.core import Exercise, clean_room

    class Seeding(Exercise):
        def judge(self, case, got):
            started.set()
            until = time.monotonic() + 0.3
            while time.monotonic() < until:
                torch.manual_seed(1)
                torch.rand(8)

    def draws(_):
        return torch.rand(4)

    def observe(fn, case):
        time.sleep(0.05)  # long enough for the other thread to reseed in between
        first = fn(case)
        time.sleep(0.05)
        return {"draws": torch.cat([first, fn(case)])}

    exercise = Seeding(grade_id="seeding", function="draws", reference=draws,
                       cases=lambda thorough: [{"n": 1}], observe=observe)  # fmt: skip
    with clean_room():
        alone = observe(draws, {"n": 1})
    started = threading.Event()
    judging = threading.Thread(target=exercise.judged, args=({"n": 1}, None))
    judging.start()
    started.wait()
    try:
        beside = exercise.expected({"n": 1})
    finally:
        judging.join()
    assert first_difference(beside, alone) is None


def test_nothing_but_judged_calls_a_judge():
    """`judged` is the only way in: a new caller of `judge` would judge outside the clean room."""
    import re
    from pathlib import Path

    import forge_course

    root = Path(forge_course.__file__).parent
    callers = {
        str(path.relative_to(root)): re.findall(r"\.judge\(", path.read_text(encoding="utf-8"))
        for path in root.rglob("*.py")
    }
    assert {path: calls for path, calls in callers.items() if calls} == {
        "grading/core.py": [".judge("]
    }
