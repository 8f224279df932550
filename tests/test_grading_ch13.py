"""Chapter 13's checks: correct answers in any style pass; each typical mistake is named."""

import pytest
import torch

from forge_course.grading import Mistake, ch13
from forge_course.observe.ch13 import profile_table
from forge_course.reference import profiling
from tests.answers import ch13 as answers
from tests.helpers.copied import copied


def _defined(source: str, name: str):
    scope = {"torch": torch}
    exec(source, scope)
    return scope[name]


def sorting_bottleneck(averages, phases):
    """Correct, written differently: sort the phases' rows, ties broken by the phases' order."""
    return _defined(answers.BOTTLENECK_SORTED, "bottleneck")(averages, phases)


@pytest.mark.parametrize("answer", [copied(profiling.bottleneck), sorting_bottleneck])
def test_bottleneck_accepts_correct_answers(answer):
    ch13.check_bottleneck(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch13.BOTTLENECK_MISTAKES, ids=range(len(ch13.BOTTLENECK_MISTAKES))
)
def test_bottleneck_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch13.check_bottleneck(wrong)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "source,named",
    [
        (answers.BOTTLENECK_SELF_TIME, "ranked by self time"),
        (answers.BOTTLENECK_LAST_ROW, "only one row of a phase was counted"),
        (answers.BOTTLENECK_PER_CALL, "time per call"),
        (answers.BOTTLENECK_OVER_ALL_ROWS, "sum of every row"),
        (answers.BOTTLENECK_LAST_ON_TIE, "two phases tie for the most time"),
        (answers.BOTTLENECK_TABLE_ORDER, "two phases tie for the most time"),
        (answers.BOTTLENECK_LARGEST_ROW, "`ProfilerStep\\*` is a whole step"),
    ],
)
def test_bottleneck_names_the_mistakes_as_a_learner_writes_them(source, named):
    with pytest.raises(Mistake, match=named):
        ch13.check_bottleneck(_defined(source, "bottleneck"))


def test_bottleneck_must_return_a_pair():
    with pytest.raises(Mistake, match=r"should return a pair \(phase name, share\)"):
        ch13.check_bottleneck(lambda averages, phases: "data")


def test_bottleneck_tables_are_real_profiler_rows_in_an_order_set_by_the_seed():
    case = ch13.bottleneck_cases()[0]
    table = profile_table(case)
    assert type(table).__name__ == "EventList"
    assert {type(row).__name__ for row in table} == {"FunctionEventAvg"}
    forward = next(row for row in table if row.key == "forward")
    assert forward.cpu_time == forward.cpu_time_total / forward.count  # torch's own property
    keys = [row.key for row in table]
    assert keys == [row.key for row in profile_table(case)]
    assert keys != [row.key for row in profile_table({**case, "seed": case["seed"] + 1})]


def test_the_reference_reads_a_real_profile():
    from torch.profiler import profile, record_function

    with profiling.quiet_profiler(), profile() as prof:
        with record_function("slow"):
            torch.randn(200, 200) @ torch.randn(200, 200)
            torch.randn(200, 200) @ torch.randn(200, 200)
        with record_function("fast"):
            torch.zeros(2)
    name, share = profiling.bottleneck(prof.key_averages(), ["fast", "slow"])
    assert name == "slow" and 0.5 < share <= 1.0


def list_preload(dataset):
    """Correct, written differently: a plain list of pairs is a dataset to a DataLoader."""
    return _defined(answers.PRELOAD_LIST, "preload")(dataset)


def iterated_preload(dataset):
    """Correct, written differently: iterate over the dataset (its IndexError ends the loop)."""
    return _defined(answers.PRELOAD_ITERATED, "preload")(dataset)


@pytest.mark.parametrize(
    "answer", [copied(profiling.preload), list_preload, iterated_preload, lambda d: list(d)]
)
def test_preload_accepts_correct_answers(answer):
    ch13.check_preload(answer, thorough=True)


@pytest.mark.parametrize("source", [answers.PRELOAD_LAZY_CACHE, answers.PRELOAD_LRU_CACHE])
def test_preload_that_decodes_on_first_use_is_told_so(source):
    """A lazy cache gives the right batches, but calls dataset[i] after preload returns."""
    with pytest.raises(Mistake, match=r"decoded on first use \(a lazy cache\)"):
        ch13.check_preload(_defined(source, "preload"), thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch13.PRELOAD_MISTAKES, ids=range(len(ch13.PRELOAD_MISTAKES))
)
def test_preload_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch13.check_preload(wrong)
    assert message in str(caught.value)


def test_preload_that_returns_something_no_loader_reads_is_told_so():
    with pytest.raises(Mistake, match="a DataLoader could not read what `preload` returned"):
        ch13.check_preload(lambda dataset: 42)


@pytest.mark.parametrize("check", [ch13.check_bottleneck, ch13.check_preload])
def test_a_blank_answer_is_told_it_is_not_written_yet(check):
    def blank(*args):
        raise NotImplementedError()

    with pytest.raises(Mistake, match="is not written yet"):
        check(blank)


def test_calling_the_reference_does_not_score():
    cases = [
        (ch13.check_bottleneck, lambda *a: profiling.bottleneck(*a)),
        (ch13.check_preload, lambda *a: profiling.preload(*a)),
    ]
    for check, answer in cases:
        with pytest.raises(Mistake, match="calls forge_course's reference"):
            check(answer)


def test_exercises_are_listed_for_the_isolated_grader():
    assert [e.grade_id for e in ch13.EXERCISES] == ["ch13_bottleneck", "ch13_preload"]


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    for cases in (ch13.bottleneck_cases, ch13.preload_cases):
        monkeypatch.setenv("FORGE_GRADING_SEED", "1")
        first = cases(thorough=True)
        monkeypatch.setenv("FORGE_GRADING_SEED", "2")
        assert cases(thorough=True) != first
        assert cases(thorough=False) == cases(thorough=False)


def test_observations_survive_the_trip_from_a_grading_worker():
    """The worker sends plain JSON; the grader judges what arrives, as it arrives."""
    from forge_course.grader.codec import dumps, loads

    for exercise, case in [
        (ch13.BOTTLENECK, ch13.bottleneck_cases()[1]),
        (ch13.PRELOAD, ch13.preload_cases()[0]),
    ]:
        exercise.judge(case, loads(dumps(exercise.observe(exercise.reference, case))))
