"""Chapter 03's checks: correct answers in any style pass; each typical mistake is named."""

import json
import math
import os
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DistributedSampler

from forge_course.grader import codec
from forge_course.grader.assignment import INSTALL_TAG
from forge_course.grading import Mistake, ch03
from forge_course.reference import sampling
from forge_course.release import source_notebook
from tests.answers import ch03 as answers
from tests.conftest import REPO
from tests.helpers.copied import copied

CHAPTER = REPO / "solutions" / "ch03_samplers_collation.py"

# --- ch03_inverse_frequency ---------------------------------------------------------------------


def counter_weights(labels):
    labels = torch.as_tensor(labels).tolist()
    counts = Counter(labels)
    return torch.tensor([1.0 / counts[v] for v in labels], dtype=torch.float64)


def bincount_weights(labels):
    labels = torch.as_tensor(labels).long()
    return 1.0 / torch.bincount(labels).double()[labels]


def numpy_weights(labels):
    labels = np.asarray(labels)
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return torch.from_numpy(1.0 / counts[inverse].astype(np.float64))


@pytest.mark.parametrize("answer", [counter_weights, bincount_weights, numpy_weights])
def test_inverse_frequency_accepts_correct_answers_in_any_style(answer):
    ch03.check_inverse_frequency(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong",
    ch03.INVERSE_FREQUENCY_MISTAKES,
    ids=range(len(ch03.INVERSE_FREQUENCY_MISTAKES)),
)
def test_inverse_frequency_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch03.check_inverse_frequency(wrong, thorough=True)
    assert message in str(caught.value)


def test_inverse_frequency_explains_ids_that_are_not_zero_to_k():
    def indexed_by_label(labels):
        labels = torch.as_tensor(labels).long()
        _, counts = torch.unique(labels, return_counts=True)
        return 1.0 / counts.double()[labels]

    ch03.check_inverse_frequency(indexed_by_label)  # the visible cases use ids 0..K-1
    with pytest.raises(
        Mistake, match=r"raised IndexError \(5 labels, a single class, given as an int64 tensor"
    ):
        ch03.check_inverse_frequency(indexed_by_label, thorough=True)


def test_inverse_frequency_unanswered_says_so():
    def blank(labels):
        raise NotImplementedError()

    with pytest.raises(Mistake, match=r"\[ch03_inverse_frequency\].*not written yet"):
        ch03.check_inverse_frequency(blank)


def test_inverse_frequency_cases_cover_every_input_type():
    cases = ch03.inverse_frequency_cases(thorough=True)
    assert {case["kind"] for case in cases} == set(ch03.KINDS)
    assert any(len(set(case["labels"])) == 1 for case in cases)


# --- ch03_shard_indices -------------------------------------------------------------------------


def loop_shards(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    order = list(range(dataset_size))
    if shuffle:
        generator = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(dataset_size, generator=generator).tolist()
    per_rank = dataset_size // world_size if drop_last else math.ceil(dataset_size / world_size)
    mine = []
    for position in range(rank, per_rank * world_size, world_size):
        mine.append(order[position % dataset_size])
    return mine


def tensor_shards(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
    generator = torch.Generator().manual_seed(seed + epoch)
    order = torch.arange(dataset_size)
    if shuffle:
        order = torch.randperm(dataset_size, generator=generator)
    per_rank = dataset_size // world_size if drop_last else -(-dataset_size // world_size)
    positions = torch.arange(per_rank) * world_size + rank
    return order[positions % max(dataset_size, 1)]  # no positions at all when N = 0


@pytest.mark.parametrize("answer", [copied(sampling.shard_indices), loop_shards, tensor_shards])
def test_shard_indices_accepts_correct_answers_in_any_style(answer, monkeypatch):
    for seed in ("1", "2"):
        monkeypatch.setenv("FORGE_GRADING_SEED", seed)
        ch03.check_shard_indices(answer, thorough=True)


@pytest.mark.parametrize("message,wrong", ch03.SHARD_MISTAKES, ids=range(len(ch03.SHARD_MISTAKES)))
def test_shard_indices_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch03.check_shard_indices(wrong, thorough=True)
    assert message in str(caught.value)


def test_the_visible_tests_catch_the_three_usual_mistakes():
    for wrong in (ch03._no_padding, ch03._ignores_epoch, ch03._blocks, ch03._ignores_drop_last):
        with pytest.raises(Mistake):
            ch03.check_shard_indices(wrong)


def test_shard_indices_may_not_iterate_the_real_sampler():
    def borrowed(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
        sampler = DistributedSampler(
            range(dataset_size), world_size, rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        sampler.set_epoch(epoch)
        return list(sampler)

    with pytest.raises(Mistake, match="torch's own `DistributedSampler`"):
        ch03.check_shard_indices(borrowed)
    # The sampler works again once the check is over.
    assert list(DistributedSampler(range(10), 3, 1, shuffle=False)) == [1, 4, 7, 0]


def test_a_reseeding_answer_leaves_the_global_generator_as_it_was():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with pytest.raises(Mistake, match="global"):
        ch03.check_shard_indices(ch03._global_seed)
    assert torch.equal(torch.rand(3), expected)


def test_an_answer_that_lifts_the_bar_on_the_sampler_is_not_graded():
    def unbarred(dataset_size, rank, world_size, shuffle=True, seed=0, epoch=0, drop_last=False):
        DistributedSampler.__iter__ = ch03._SAMPLER_ITER  # the original, found somewhere
        return ch03.distributed_sampler_indices(
            dataset_size, rank, world_size, shuffle, seed, epoch, drop_last
        )

    with pytest.raises(Mistake, match="tampered with the check's instruments"):
        ch03.check_shard_indices(unbarred)
    assert DistributedSampler.__iter__ is ch03._SAMPLER_ITER


def test_shard_indices_results_may_be_tuples_arrays_or_tensors():
    for convert in (tuple, np.array, torch.tensor):
        ch03.check_shard_indices(lambda *a, c=convert: c(copied(sampling.shard_indices)(*a)))


def test_shard_cases_include_the_edges_and_change_with_the_seed(monkeypatch):
    cases = ch03.shard_cases(thorough=True)
    assert any(c["n"] < c["world_size"] and not c["drop_last"] for c in cases)
    assert any(c["n"] == 0 for c in cases)
    assert any(c["drop_last"] and c["n"] % c["world_size"] for c in cases)
    monkeypatch.setenv("FORGE_GRADING_SEED", "1")
    first = ch03.shard_cases(thorough=True)
    monkeypatch.setenv("FORGE_GRADING_SEED", "2")
    assert ch03.shard_cases(thorough=True) != first
    assert ch03.shard_cases() == ch03.shard_cases()


# --- ch03_pad_collate ---------------------------------------------------------------------------


def loop_collate(batch, pad_value=0):
    longest = max(len(s) for s, _ in batch)
    rows, masks = [], []
    for sequence, _ in batch:
        filler = sequence.new_full((longest - len(sequence),), pad_value)
        rows.append(torch.cat([sequence, filler]))
        masks.append(torch.tensor([1] * len(sequence) + [0] * (longest - len(sequence))))
    return {
        "input_ids": torch.stack(rows),
        "attention_mask": torch.stack(masks).long(),
        "labels": torch.tensor([label for _, label in batch]),
    }


def pad_sequence_collate(batch, pad_value=0):
    sequences = [s for s, _ in batch]
    input_ids = pad_sequence(sequences, batch_first=True, padding_value=pad_value)
    lengths = torch.tensor([len(s) for s in sequences])
    mask = torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]
    return {"input_ids": input_ids, "attention_mask": mask.long(),
            "labels": torch.tensor([y for _, y in batch])}  # fmt: skip


@pytest.mark.parametrize(
    "answer", [copied(sampling.pad_collate), loop_collate, pad_sequence_collate]
)
def test_pad_collate_accepts_correct_answers_in_any_style(answer):
    ch03.check_pad_collate(answer, thorough=True)


def _defined(source, name):
    namespace = {"torch": torch}
    exec(source, namespace)
    return namespace[name]


@pytest.mark.parametrize("source", [answers.COLLATE_WARNS, answers.COLLATE_PAD_SEQUENCE])
def test_pad_collate_answers_that_warn_pass_with_nothing_on_stderr(source, capfd):
    # nbgrader gives 0 to a test cell that writes to stderr: warnings become notes on stdout.
    ch03.check_pad_collate(_defined(source, "pad_collate"), thorough=True)
    out, err = capfd.readouterr()
    assert err == ""
    if source is answers.COLLATE_WARNS:
        assert "Note: `pad_collate` warned: UserWarning" in out


def test_whatever_an_answer_writes_to_stderr_becomes_a_note(capfd):
    def noisy(batch, pad_value=0):
        print("printed to sys.stderr", file=sys.stderr)
        os.write(2, b"written to file descriptor 2\n")
        return pad_sequence_collate(batch, pad_value)

    ch03.check_pad_collate(noisy)
    out, err = capfd.readouterr()
    assert err == ""
    assert "printed to sys.stderr" in out and "written to file descriptor 2" in out


@pytest.mark.parametrize(
    "message,wrong", ch03.PAD_COLLATE_MISTAKES, ids=range(len(ch03.PAD_COLLATE_MISTAKES))
)
def test_pad_collate_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch03.check_pad_collate(wrong, thorough=True)
    assert message in str(caught.value)


def int32_labels_collate(batch, pad_value=0):
    return {**loop_collate(batch, pad_value), "labels": torch.tensor([y for _, y in batch]).int()}


def test_pad_collate_labels_are_int64_as_the_exercise_says():
    # The text once asked only for "a tensor of shape [B]", and the check wanted int64.
    with pytest.raises(Mistake, match=r"labels should be int64 \(torch.long\)"):
        ch03.check_pad_collate(int32_labels_collate)
    assert '`"labels"`: `[B]`, `torch.long` (int64)' in CHAPTER.read_text()


def test_pad_collate_returning_a_tuple_is_told_to_return_a_dict():
    def as_tuple(batch, pad_value=0):
        out = copied(sampling.pad_collate)(batch, pad_value)
        return out["input_ids"], out["attention_mask"], out["labels"]

    with pytest.raises(Mistake, match="should be a dict"):
        ch03.check_pad_collate(as_tuple)


def test_pad_collate_that_crashes_on_empty_sequences_names_the_case():
    def no_empty(batch, pad_value=0):
        if any(len(s) == 0 for s, _ in batch):
            raise RuntimeError("cannot pad an empty sequence")
        return copied(sampling.pad_collate)(batch, pad_value)

    for thorough in (False, True):  # the exercise names empty sequences: visible tests too
        with pytest.raises(Mistake, match=r"raised RuntimeError \(empty sequences"):
            ch03.check_pad_collate(no_empty, thorough=thorough)


# --- every exercise -----------------------------------------------------------------------------


def test_the_settings_cell_imports_no_reference_and_no_check():
    """The grading worker runs it before every answer: it holds what answers need, no more."""
    code = [c for c in source_notebook(CHAPTER).cells if c.cell_type == "code"]
    plain = [c for c in code if "nbgrader" not in c.metadata]
    settings = next(c.source for c in plain if INSTALL_TAG not in c.metadata.get("tags", []))
    assert "SEED = " in settings
    assert "forge_course.reference" not in settings and "forge_course.grading" not in settings


def test_calling_the_reference_does_not_score():
    checks = [
        (ch03.check_inverse_frequency, sampling.inverse_frequency_weights),
        (ch03.check_shard_indices, sampling.shard_indices),
        (ch03.check_pad_collate, sampling.pad_collate),
    ]
    for check, reference in checks:
        with pytest.raises(Mistake, match="calls forge_course's reference"):
            check(reference)
        with pytest.raises(Mistake, match="calls forge_course's reference"):
            check(lambda *args, r=reference, **kwargs: r(*args, **kwargs))


def test_the_reference_agrees_with_distributed_sampler_on_every_hidden_case():
    for case in ch03.shard_cases(thorough=True):
        assert ch03.observe_shard_indices(
            ch03.SHARD_INDICES.reference, case
        ) == ch03.observe_shard_indices(ch03.distributed_sampler_indices, case)


def test_every_record_judges_observations_that_crossed_the_process_boundary(monkeypatch):
    """What the isolated grader does: cases and observations as JSON, the verdict outside."""
    monkeypatch.setenv("FORGE_GRADING_SEED", "7")
    answers = {
        "inverse_frequency_weights": counter_weights,
        "shard_indices": loop_shards,
        "pad_collate": loop_collate,
    }
    for exercise in ch03.EXERCISES:
        cases = exercise.cases(False) + exercise.cases(True)
        assert cases or exercise is ch03.SHARD_INDICES_ON_THE_SAMPLER
        for case in cases:
            sent = json.loads(json.dumps(case))
            observed = exercise.observe(answers[exercise.function], sent)
            exercise.judge(case, codec.loads(codec.dumps(observed)))


def test_the_sampler_record_fails_on_its_own_with_its_label():
    with pytest.raises(Mistake, match="compared with torch's DistributedSampler"):
        ch03.SHARD_INDICES_ON_THE_SAMPLER.check(ch03._no_padding, thorough=True)
    ch03.SHARD_INDICES_ON_THE_SAMPLER.check(ch03._no_padding)  # no visible cases of its own
