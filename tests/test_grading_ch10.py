"""Chapter 10's checks: correct answers in any style pass; each typical mistake is named."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from forge_course.grading import Mistake, ch10
from forge_course.grading.core import first_difference
from forge_course.observe import ch10 as observe_ch10
from forge_course.reference import accumulation, amp, checkpointing
from tests.helpers.copied import copied


def one_backward_accumulate(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    """Correct, written differently: zero_grad last, a weighted sum, the weights as n_i / N."""
    total = sum(x.shape[0] for x, _ in micro_batches)
    mean = 0.0
    for x, y in micro_batches:
        share = x.shape[0] / total
        loss = loss_fn(model(x), y)
        (share * loss).backward()
        mean += share * float(loss)
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return mean


@pytest.mark.parametrize("answer", [copied(accumulation.accumulate_step), one_backward_accumulate])
def test_accumulate_accepts_correct_answers(answer):
    ch10.check_accumulate_step(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch10.ACCUMULATE_MISTAKES, ids=range(len(ch10.ACCUMULATE_MISTAKES))
)
def test_accumulate_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch10.check_accumulate_step(wrong)
    assert message in str(caught.value)


def amp_with_defaults(model, optimizer, loss_fn, x, y, scaler=None):
    """Correct, written differently: autocast's own default dtype per device, set_to_none."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type):
        out = model(x)
        loss = loss_fn(out, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return float(loss.detach())


@pytest.mark.parametrize("answer", [copied(amp.amp_train_step), amp_with_defaults])
def test_amp_accepts_correct_answers(answer):
    ch10.check_amp_step(answer, thorough=True)


def accumulate_in_eval_mode(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    model.eval()  # "to make the micro-batches deterministic"
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    mean = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model(x), y) * len(x) / total
        loss.backward()
        mean += loss.item()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    model.train()
    return mean


def accumulate_calling_forward(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    mean = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model.forward(x), y) * len(x) / total
        loss.backward()
        mean += loss.item()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return mean


def amp_calling_forward(model, optimizer, loss_fn, x, y, scaler=None):
    optimizer.zero_grad()
    dtype = torch.bfloat16 if x.device.type == "cpu" else torch.float16
    with torch.autocast(x.device.type, dtype=dtype):
        loss = loss_fn(model.forward(x), y)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return loss.item()


@pytest.mark.parametrize(
    "check,wrong,named",
    [
        (ch10.check_accumulate_step, accumulate_in_eval_mode, "ran in eval mode"),
        (ch10.check_accumulate_step, accumulate_calling_forward, "skips the model's hooks"),
        (ch10.check_amp_step, amp_calling_forward, "skips the model's hooks"),
    ],
)
def test_steps_in_eval_mode_or_without_hooks_are_named(check, wrong, named):
    with pytest.raises(Mistake, match=named):
        check(wrong)


@pytest.mark.parametrize("message,wrong", ch10.AMP_MISTAKES, ids=range(len(ch10.AMP_MISTAKES)))
def test_amp_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch10.check_amp_step(wrong, thorough=True)
    assert message in str(caught.value)


def test_amp_without_scaler_update_fails_with_torchs_own_words():
    def no_update(model, optimizer, loss_fn, x, y, scaler=None):
        optimizer.zero_grad()
        with torch.autocast(x.device.type, dtype=copied(amp.autocast_dtype)(x.device)):
            loss = loss_fn(model(x), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
        return loss.item()

    for thorough in (False, True):  # the visible cases pass a scaler on the CPU too
        with pytest.raises(Mistake, match=r"step\(\) has already been called since the last"):
            ch10.check_amp_step(no_update, thorough=thorough)


def generic_checkpointed(layers, x, segments):
    """Correct, written differently: torch.tensor_split's bounds and nn.Sequential segments."""
    layers = list(layers)
    for indices in torch.arange(len(layers)).tensor_split(segments):
        segment = torch.nn.Sequential(*(layers[i] for i in indices.tolist()))
        x = checkpoint(segment, x, use_reentrant=False)
    return x


@pytest.mark.parametrize(
    "answer", [copied(checkpointing.checkpointed_forward), generic_checkpointed]
)
def test_checkpointed_forward_accepts_correct_answers(answer):
    ch10.check_checkpointed_forward(answer, thorough=True)


@pytest.mark.parametrize(
    "message,wrong", ch10.CHECKPOINT_MISTAKES, ids=range(len(ch10.CHECKPOINT_MISTAKES))
)
def test_checkpointed_forward_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch10.check_checkpointed_forward(wrong)
    assert message in str(caught.value)


def test_checkpointed_forward_must_return_a_tensor():
    with pytest.raises(Mistake, match="the output should be a tensor"):
        ch10.check_checkpointed_forward(lambda layers, x, segments: None)


def test_calling_the_reference_does_not_score():
    cases = [
        (ch10.check_accumulate_step, lambda *a: accumulation.accumulate_step(*a)),
        (ch10.check_amp_step, lambda *a: amp.amp_train_step(*a)),
        (ch10.check_checkpointed_forward, lambda *a: checkpointing.checkpointed_forward(*a)),
    ]
    for check, answer in cases:
        with pytest.raises(Mistake, match="calls forge_course's reference"):
            check(answer)


def test_exercises_are_listed_for_the_isolated_grader():
    assert [e.grade_id for e in ch10.EXERCISES] == [
        "ch10_accumulate_step",
        "ch10_amp_step",
        "ch10_checkpointed_forward",
    ]


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    monkeypatch.setenv("FORGE_GRADING_SEED", "1")
    first = ch10.accumulate_cases(thorough=True)
    monkeypatch.setenv("FORGE_GRADING_SEED", "2")
    assert ch10.accumulate_cases(thorough=True) != first
    assert ch10.accumulate_cases(thorough=False) == ch10.accumulate_cases(thorough=False)


def concatenating_accumulate(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    """No accumulation at all: one forward on all the micro-batches at once."""
    optimizer.zero_grad()
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    loss = loss_fn(model(x), y)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def test_accumulate_must_run_one_forward_per_micro_batch():
    with pytest.raises(Mistake, match="concatenated into one batch for a single forward pass"):
        ch10.check_accumulate_step(concatenating_accumulate)


def test_accumulate_notices_a_forged_record_of_the_forward_passes():
    def forging(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
        loss = concatenating_accumulate(model, optimizer, loss_fn, micro_batches, max_grad_norm)
        model[-1].seen = [(len(x), "torch.float32") for x, _ in micro_batches]
        return loss

    with pytest.raises(Mistake, match="instrument"):
        ch10.check_accumulate_step(forging)


def forwards_then_backwards(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
    """One forward per micro-batch and one backward each, but every forward first: every
    micro-batch's graph stays alive until the backwards, as with one backward over the sum."""
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    losses = [loss_fn(model(x), y) * len(x) / total for x, y in micro_batches]
    for loss in losses:
        loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return sum(loss.item() for loss in losses)


def test_accumulate_must_run_each_backward_before_the_next_forward():
    with pytest.raises(Mistake, match="forward ran before the first backward") as caught:
        ch10.check_accumulate_step(forwards_then_backwards)
    assert "'forward, forward, forward, forward, backward, backward" in str(caught.value)


def test_accumulate_notices_a_forged_record_of_the_passes():
    def forging(model, optimizer, loss_fn, micro_batches, max_grad_norm=None):
        loss = forwards_then_backwards(model, optimizer, loss_fn, micro_batches, max_grad_norm)
        model[-1].passes = ["forward", "backward"] * len(micro_batches)
        return loss

    with pytest.raises(Mistake, match="instrument"):
        ch10.check_accumulate_step(forging)


def cpu_autocast_everywhere(model, optimizer, loss_fn, x, y, scaler=None):
    """Right on the CPU only: autocast's device type is written in, not taken from `x`."""
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return loss.item()


def test_amp_device_type_must_come_from_the_input_even_without_a_gpu():
    ch10.check_amp_step(cpu_autocast_everywhere)  # the visible case is on the CPU
    with pytest.raises(Mistake, match="entered for the CPU whatever the input's device"):
        ch10.check_amp_step(cpu_autocast_everywhere, thorough=True)


def bfloat16_where_supported(model, optimizer, loss_fn, x, y, scaler=None):
    """Correct: bfloat16 on a GPU that supports it (no scaler needed, a given one still used)."""
    kind = x.device.type
    gpu_bf16 = kind == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    dtype = torch.bfloat16 if kind == "cpu" or gpu_bf16 else torch.float16
    optimizer.zero_grad()
    with torch.autocast(kind, dtype=dtype):
        loss = loss_fn(model(x), y)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return loss.item()


def test_the_bfloat16_reference_is_the_reference_where_bfloat16_is_the_default():
    """The second reference a bfloat16 answer on a GPU is compared with: on the CPU, where
    bfloat16 is autocast's type anyway, it observes what the reference does."""
    from functools import partial

    for case in ch10.amp_cases():
        in_bfloat16 = partial(ch10.AMP.reference, dtype=torch.bfloat16)
        got = ch10.AMP.expected_of(in_bfloat16, case, "bfloat16")
        assert first_difference(got, ch10.AMP.expected(case)) is None


def test_amp_accepts_bfloat16_on_a_gpu_that_runs_it():
    """On a GPU with bfloat16 (measured on an H200: AdamW's first steps had flipped a weight's
    update against the float16 reference), a bfloat16 answer is compared with the reference
    run in bfloat16; on the CPU, where that is the default, nothing is changed."""
    ch10.check_amp_step(bfloat16_where_supported, thorough=True)
    case = {"device": "cpu", "optimizer": "momentum", "scaler": "given", "seed": 0}
    want = {"the dtype of the model's output in call 1": "torch.float16"}
    got = {"the dtype of the model's output in call 1": "torch.bfloat16"}
    assert ch10._bfloat16_on_a_gpu(got, want, case) == got


def plain_forward_under_own_hooks(layers, x, segments):
    """Checkpoints nothing, and hides what it keeps from any outer saved-tensor hook."""
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        for layer in layers:
            x = layer(x)
    return x


def plain_forward_that_reruns_in_backward(layers, x, segments):
    """Checkpoints nothing, keeps everything, and runs each block again during backward."""
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        out = x
        for layer in layers:
            out = layer(out)
    if out.requires_grad:

        def rerun(grad):
            with torch.no_grad():
                h = x
                for layer in layers:
                    h = layer(h)
            return grad

        out.register_hook(rerun)
    return out


@pytest.mark.parametrize("answer", [plain_forward_under_own_hooks,
                                    plain_forward_that_reruns_in_backward])  # fmt: skip
def test_checkpointed_forward_sees_through_the_answers_own_saved_tensor_hooks(answer):
    with pytest.raises(Mistake, match=r"saved_tensors_hooks`? of the answer's own"):
        ch10.check_checkpointed_forward(answer)


def plain_forward_under_a_hook_claiming_to_be_checkpointings(layers, x, segments):
    """Checkpoints nothing; its hook says it is torch.utils.checkpoint's, and each block runs
    again during backward, without grad, for the count alone."""

    def pack(tensor):
        return tensor

    pack.__module__ = "torch.utils.checkpoint"
    inputs = []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        for layer in layers:
            inputs.append(x)
            x = layer(x)
    if x.requires_grad:

        def rerun(grad):
            with torch.no_grad():
                for layer, h in zip(layers, inputs):
                    layer(h)
            return grad

        x.register_hook(rerun)
    return x


def test_recomputation_for_show_does_not_give_the_recomputed_gradients():
    # It fakes the recomputation the "nothing is checkpointed" mistake lacks, so that mistake is
    # not named (a hint names a mistake only where the answer shows all of it): what differs is.
    with pytest.raises(Mistake, match=r"the gradient of block 0's 0.weight differs"):
        ch10.check_checkpointed_forward(plain_forward_under_a_hook_claiming_to_be_checkpointings)


def test_checkpointed_forward_counts_the_recomputation():
    def rerun_nothing(layers, x, segments):
        # Checkpoints every segment but the last, as checkpoint_sequential does.
        layers = list(layers)
        *head, last = checkpointing.segment_sizes(len(layers), segments)
        start = 0
        for size in head:
            x = checkpoint(torch.nn.Sequential(*layers[start : start + size]), x,
                           use_reentrant=False)  # fmt: skip
            start += size
        for layer in layers[start:]:
            x = layer(x)
        return x

    with pytest.raises(Mistake, match="the last segment is not checkpointed"):
        ch10.check_checkpointed_forward(rerun_nothing)


def test_observations_survive_the_trip_from_a_grading_worker():
    """The worker sends plain JSON; the grader judges what arrives, as it arrives."""
    from forge_course.grader.codec import dumps, loads

    stand_in = next(c for c in ch10.amp_cases(thorough=True) if c.get("claims"))
    for exercise, case in [
        (ch10.ACCUMULATE, ch10.accumulate_cases()[1]),
        (ch10.AMP, ch10.amp_cases()[0]),
        (ch10.AMP, stand_in),
        (ch10.CHECKPOINTED, ch10.checkpoint_cases()[0]),
    ]:
        exercise.judge(case, loads(dumps(exercise.observe(exercise.reference, case))))


def test_segments_are_read_from_the_order_of_recomputation():
    assert observe_ch10.segments_rerun([8, 9, 6, 7, 3, 4, 5, 0, 1, 2]) == (
        "[0, 1, 2] [3, 4, 5] [6, 7] [8, 9]"
    )
    assert observe_ch10.segments_rerun([3, 2, 1, 0]) == "[0] [1] [2] [3]"
    assert observe_ch10.segments_rerun([4, 5, 4, 5, 4, 5]) == "[4, 5] [4, 5] [4, 5]"
    assert observe_ch10.segments_rerun([]) == ""


def rounded_bounds(layers, x, segments):
    """Sizes that differ by at most one, but not longer first: 10 in 4 give 2, 3, 3, 2."""
    layers = list(layers)
    bounds = [round(i * len(layers) / segments) for i in range(segments + 1)]
    for a, b in zip(bounds, bounds[1:]):
        x = checkpoint(torch.nn.Sequential(*layers[a:b]), x, use_reentrant=False)
    return x


def test_checkpointed_forward_compares_the_segments_with_the_reference():
    with pytest.raises(Mistake) as caught:
        ch10.check_checkpointed_forward(rounded_bounds)
    said = str(caught.value)
    want, got = "'[0, 1, 2] [3, 4, 5] [6, 7] [8, 9]'", "'[0, 1] [2, 3, 4] [5, 6, 7] [8, 9]'"
    assert f"should be {want}, but it is {got}" in said
    assert "longer first" in said


def late_bound_bounds(layers, x, segments):
    """Reads `start` and `size` when backward recomputes: every recomputation runs nothing."""
    layers = list(layers)
    base, extra = divmod(len(layers), segments)
    start = 0
    for i in range(segments):
        size = base + (1 if i < extra else 0)

        def run_group(h):
            return torch.nn.Sequential(*layers[start : start + size])(h)  # noqa: B023

        x = checkpoint(run_group, x, use_reentrant=False)
        start += size
    return x


def test_a_recomputation_unlike_the_forward_names_late_binding():
    with pytest.raises(Mistake, match="A different number of tensors was saved") as caught:
        ch10.check_checkpointed_forward(late_bound_bounds)
    assert "reads the loop's variables" in str(caught.value)
