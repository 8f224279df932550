"""Chapter 00's checks: correct answers in any style pass; each typical mistake is named."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from forge_course.grading import Mistake, ch00
from forge_course.reference import arithmetic, schedule
from tests.answers import ch00 as answers
from tests.helpers.copied import copied

SOLUTION = Path(__file__).resolve().parent.parent / "solutions" / "ch00_training_arithmetic.py"


def defined(source: str, name: str):
    """What an answer cell defines under ``name``, as the notebook's kernel would see it."""
    namespace: dict = {}
    exec(source, namespace)
    return namespace[name]


def loop_counting_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    """Counts by walking the indices, as a learner who distrusts formulas might."""
    sizes, start = [], 0
    while start < dataset_size:
        size = min(batch_size, dataset_size - start)
        if size == batch_size or not drop_last:
            sizes.append(size)
        start += batch_size
    updates = sum(1 for i in range(len(sizes)) if (i + 1) % accum_steps == 0 or i + 1 == len(sizes))
    return {
        "iters_per_epoch": len(sizes),
        "last_batch_size": sizes[-1] if sizes else 0,
        "micro_steps": len(sizes) * epochs,
        "updates_per_epoch": updates,
        "total_updates": updates * epochs,
        "effective_batch_size": batch_size * accum_steps,
        "examples_seen": sum(sizes) * epochs,
    }


def numpy_arithmetic(dataset_size, batch_size, epochs, accum_steps=1, drop_last=False):
    """NumPy integers everywhere: accepted as whole numbers."""
    n, b = np.int64(dataset_size), np.int64(batch_size)
    iters = n // b if drop_last else -(-n // b)
    last = (b if iters else np.int64(0)) if drop_last else n - (iters - 1) * b
    per_epoch = -(-iters // accum_steps)
    return {
        "iters_per_epoch": iters,
        "last_batch_size": last,
        "micro_steps": iters * epochs,
        "updates_per_epoch": per_epoch,
        "total_updates": per_epoch * epochs,
        "effective_batch_size": b * accum_steps,
        "examples_seen": (iters * b if drop_last else n) * epochs,
    }


@pytest.mark.parametrize(
    "answer",
    [copied(arithmetic.training_arithmetic), loop_counting_arithmetic, numpy_arithmetic],
)
def test_training_arithmetic_accepts_correct_answers_in_any_style(answer):
    ch00.check_training_arithmetic(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch00.ARITHMETIC_MISTAKES, ids=range(len(ch00.ARITHMETIC_MISTAKES))
)
def test_training_arithmetic_names_each_known_mistake(message, wrong):
    # Thorough: N < B with drop_last, the only case where a last batch of B is wrong, is hidden.
    with pytest.raises(Mistake) as caught:
        ch00.check_training_arithmetic(wrong, thorough=True)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "source,phrase",
    [
        (source, said["ch00_training_arithmetic_tests"])
        for source, said in answers.WRONG["ch00_training_arithmetic"]
    ],
)
def test_training_arithmetic_wrong_answers_get_their_message(source, phrase):
    with pytest.raises(Mistake) as caught:
        ch00.check_training_arithmetic(defined(source, "training_arithmetic"), thorough=True)
    assert phrase in str(caught.value)
    assert "something else differs too" not in str(caught.value)


def test_float_counts_are_not_whole_numbers():
    def floats(*args):
        return {k: float(v) for k, v in copied(arithmetic.training_arithmetic)(*args).items()}

    with pytest.raises(Mistake, match=r"iters_per_epoch should be an int \(313\), but it is a"):
        ch00.check_training_arithmetic(floats)


def test_a_missing_key_and_a_wrong_type_are_reported():
    def no_effective(*args):
        out = copied(arithmetic.training_arithmetic)(*args)
        del out["effective_batch_size"]
        return out

    with pytest.raises(Mistake, match=r"missing the key\(s\) \['effective_batch_size'\]"):
        ch00.check_training_arithmetic(no_effective)
    with pytest.raises(Mistake, match="should return a dict with the keys"):
        ch00.check_training_arithmetic(lambda *args: [313, 16])


def test_an_unwritten_answer_says_so():
    def blank(*args):
        raise NotImplementedError()

    for check in (ch00.check_training_arithmetic, ch00.check_update_schedule):
        with pytest.raises(Mistake, match="not written yet"):
            check(blank)


def test_the_dataloader_record_fails_on_its_own_and_says_where_it_counted():
    naive = ch00.ARITHMETIC_MISTAKES[0][1]
    assert ch00.TRAINING_ARITHMETIC_ON_A_DATALOADER.cases(False) == []
    with pytest.raises(Mistake, match="counted on a real DataLoader") as caught:
        ch00.TRAINING_ARITHMETIC_ON_A_DATALOADER.check(naive, thorough=True)
    assert "Likely mistake: updates_per_epoch counts only full groups" in str(caught.value)
    with pytest.raises(Mistake, match="listed from a real DataLoader"):
        ch00.UPDATE_SCHEDULE_ON_A_DATALOADER.check(ch00.SCHEDULE_MISTAKES[0][1], thorough=True)


def test_references_agree_with_the_dataloader_on_every_hidden_case():
    for case in ch00.training_arithmetic_cases(thorough=True):
        args = [case[k] for k in ("dataset_size", "batch_size", "epochs", "accum_steps")]
        want = ch00.count_on_a_dataloader(*args, case["drop_last"])
        assert arithmetic.training_arithmetic(*args, case["drop_last"]) == want, case
    for case in ch00.update_schedule_cases(thorough=True):
        args = [case[k] for k in ("dataset_size", "batch_size", "accum_steps", "drop_last")]
        assert schedule.update_schedule(*args) == ch00.schedule_on_a_dataloader(*args), case


def comprehension_schedule(dataset_size, batch_size, accum_steps, drop_last=False):
    count = dataset_size // batch_size if drop_last else math.ceil(dataset_size / batch_size)
    return [
        (
            min(batch_size, dataset_size - i * batch_size),
            (i + 1) % accum_steps == 0 or i == count - 1,
        )
        for i in range(count)
    ]


def generator_schedule(dataset_size, batch_size, accum_steps, drop_last=False):
    left, in_group = dataset_size, 0
    while left >= batch_size or (left > 0 and not drop_last):
        size = min(left, batch_size)
        left -= size
        in_group += 1
        last = left < batch_size and (left == 0 or drop_last)
        yield [size, in_group == accum_steps or last]
        if in_group == accum_steps:
            in_group = 0


def numpy_schedule(dataset_size, batch_size, accum_steps, drop_last=False):
    starts = np.arange(0, dataset_size, batch_size)
    sizes = np.minimum(batch_size, dataset_size - starts)
    if drop_last:
        sizes = sizes[sizes == batch_size]
    position = np.arange(1, len(sizes) + 1)
    return list(zip(sizes, (position % accum_steps == 0) | (position == len(sizes))))


@pytest.mark.parametrize(
    "answer",
    [
        copied(schedule.update_schedule),
        comprehension_schedule,
        generator_schedule,
        numpy_schedule,
    ],
)
def test_update_schedule_accepts_correct_answers_in_any_style(answer):
    ch00.check_update_schedule(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch00.SCHEDULE_MISTAKES, ids=range(len(ch00.SCHEDULE_MISTAKES))
)
def test_update_schedule_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch00.check_update_schedule(wrong)
    assert message in str(caught.value)


def test_update_schedule_explains_a_malformed_result():
    with pytest.raises(Mistake, match="should return a list of"):
        ch00.check_update_schedule(lambda *args: {"sizes": [16]})
    with pytest.raises(Mistake, match=r"Item 0 is \(16.0, False\)"):
        ch00.check_update_schedule(lambda *args: [(16.0, False)])
    with pytest.raises(Mistake, match=r"Item 0 is 16"):
        ch00.check_update_schedule(lambda *args: [16, 16])


def test_the_naive_loop_is_reported_by_its_count_of_updates():
    with pytest.raises(Mistake) as caught:
        ch00.check_update_schedule(ch00.SCHEDULE_MISTAKES[0][1])
    first_line = str(caught.value).splitlines()[0]
    assert "the number of optimizer updates should be 2, but it is 1" in first_line
    assert "N=100, B=16, K=4" in first_line


def test_calling_the_reference_does_not_score():
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch00.check_training_arithmetic(arithmetic.training_arithmetic)
    with pytest.raises(Mistake, match="calls forge_course's reference"):
        ch00.check_update_schedule(lambda *args: schedule.update_schedule(*args))


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    monkeypatch.setenv("FORGE_GRADING_SEED", "1")
    first = (ch00.training_arithmetic_cases(True), ch00.update_schedule_cases(True))
    monkeypatch.setenv("FORGE_GRADING_SEED", "2")
    second = (ch00.training_arithmetic_cases(True), ch00.update_schedule_cases(True))
    assert first[0] != second[0] and first[1] != second[1]
    assert ch00.training_arithmetic_cases(False) == ch00.training_arithmetic_cases(False)


def test_observations_are_plain_data():
    for exercise in ch00.EXERCISES:
        for case in exercise.cases(True):
            json.dumps(case)
            json.dumps(exercise.observe(exercise.reference, case))


# ---------------------------------------------------------------- the most common slip: N // B


@pytest.mark.parametrize(
    "check,source,name",
    [
        (ch00.check_training_arithmetic, answers.ARITHMETIC_FLOOR, "training_arithmetic"),
        (ch00.check_training_arithmetic, answers.ARITHMETIC_FLOOR_UPDATES, "training_arithmetic"),
        (ch00.check_update_schedule, answers.SCHEDULE_FLOOR_COUNT, "update_schedule"),
    ],
    ids=["micro-batches", "updates", "schedule"],
)
def test_rounding_down_gets_a_named_hint_in_every_exercise(check, source, name):
    with pytest.raises(Mistake) as caught:
        check(defined(source, name))
    assert "Likely mistake: `N // B` rounds down" in str(
        caught.value
    ) or "Likely mistake: `N // (B·K)` rounds down" in str(caught.value)


# ---------------------------------------------------------------- questions


def run_question_cell(grade_id: str, **answers) -> None:
    """Run a question's test cell of the solution, visible and hidden tests, on ``answers``."""
    text = SOLUTION.read_text()
    start = text.index(f'# %% nbgrader={{"grade_id": "{grade_id}"')
    end = text.find("\n# %%", start + 1)
    exec(compile(text[start:end], grade_id, "exec"), dict(answers))


@pytest.mark.parametrize(
    "number", [np.int64, np.int32, np.uint16, np.float64, np.float32, int, float]
)
def test_questions_take_numpy_numbers_like_python_numbers(number):
    run_question_cell("ch00_q_iterations", q_iterations=number(196))
    run_question_cell("ch00_q_updates", q_updates=number(790))
    run_question_cell("ch00_q_scheduler", q_scheduler=np.str_("b"))


@pytest.mark.parametrize(
    "grade_id,answer",
    [
        ("ch00_q_iterations", 195),
        ("ch00_q_iterations", np.int64(195)),
        ("ch00_q_updates", 780),
        ("ch00_q_updates", 3120),
        ("ch00_q_updates", 781),
        ("ch00_q_updates", 78),
    ],
)
def test_questions_name_rounding_down(grade_id, answer):
    name = {"ch00_q_iterations": "q_iterations", "ch00_q_updates": "q_updates"}[grade_id]
    with pytest.raises(Mistake, match="rounds down"):
        run_question_cell(grade_id, **{name: answer})


def test_questions_still_refuse_what_is_not_a_number():
    for answer in (True, np.bool_(True), "196", np.array([196])):
        with pytest.raises(Mistake, match="should be a number"):
            run_question_cell("ch00_q_iterations", q_iterations=answer)
