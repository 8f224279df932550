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
