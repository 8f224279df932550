"""The step reference against FACTS.md's hand numbers and torch's autograd and optimizers."""

import copy
import itertools

import pytest
import torch

from forge_course.device import available_devices, tolerance
from forge_course.reference import step

EXAMPLE = dict(W=[[0.5, -0.3], [0.2, 0.8]], b=[0.0, 0.0], x=[1.0, 2.0], t=[1.0, 0.0], lr=0.01)


def test_hand_step_reproduces_facts_numbers():
    out = step.hand_step(**EXAMPLE)
    expected = {
        "y": [-0.1, 1.8],
        "loss": 2.225,
        "dL_dy": [-1.1, 1.8],
        "dL_dW": [[-1.1, -2.2], [1.8, 3.6]],
        "dL_db": [-1.1, 1.8],
        "W_new": [[0.511, -0.278], [0.182, 0.764]],
        "b_new": [0.011, -0.018],
    }
    for key, value in expected.items():
        torch.testing.assert_close(torch.tensor(out[key]), torch.tensor(value), rtol=0, atol=1e-12)
    y_new, loss_new = step.evaluate_linear(out["W_new"], out["b_new"], EXAMPLE["x"], EXAMPLE["t"])
    torch.testing.assert_close(torch.tensor(y_new), torch.tensor([-0.034, 1.692]))
    assert loss_new == pytest.approx(1.96601, abs=1e-12)


@pytest.mark.parametrize("m,n", [(1, 1), (3, 2), (4, 5)])
def test_hand_step_matches_autograd(m, n):
    gen = torch.Generator().manual_seed(m * 10 + n)
    W, b = (
        torch.randn(m, n, generator=gen, dtype=torch.float64),
        torch.randn(m, generator=gen).double(),
    )
    x, t = torch.randn(n, generator=gen).double(), torch.randn(m, generator=gen).double()
    out = step.hand_step(W.tolist(), b.tolist(), x.tolist(), t.tolist(), 0.1)
    W.requires_grad_(), b.requires_grad_()
    y = W @ x + b
    y.retain_grad()
    loss = torch.nn.functional.mse_loss(y, t)
    loss.backward()
    torch.testing.assert_close(torch.tensor(out["loss"]).double(), loss.detach())
    torch.testing.assert_close(torch.tensor(out["dL_dy"]).double(), y.grad)
    torch.testing.assert_close(torch.tensor(out["dL_dW"]).double(), W.grad)
    torch.testing.assert_close(torch.tensor(out["dL_db"]).double(), b.grad)
    torch.testing.assert_close(torch.tensor(out["W_new"]).double(), (W - 0.1 * W.grad).detach())


@pytest.mark.parametrize("lr", [0.1, 1 / 6, 0.3, 1 / 3, 0.34, 0.5])
def test_the_running_example_overshoots_past_lr_one_third(lr):
    # Each error is multiplied by 1 - lr·(|x|² + 1) = 1 - 6·lr, so the loss by its square.
    out = step.hand_step(**{**EXAMPLE, "lr": lr})
    _, loss_new = step.evaluate_linear(out["W_new"], out["b_new"], EXAMPLE["x"], EXAMPLE["t"])
    assert loss_new == pytest.approx(2.225 * (1 - 6 * lr) ** 2, abs=1e-12)
    if lr != 1 / 3:
        assert (loss_new > out["loss"]) == (lr > 1 / 3)


def test_a_loss_kept_after_backward_holds_no_saved_tensors():
    from forge_course.sims.train_vs_eval import LiveGraphMemory

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    memory = LiveGraphMemory()
    with memory:
        loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1] * 2))
    assert memory.live_bytes() > 0
    loss.backward()
    assert loss.grad_fn is not None and memory.live_bytes() == 0  # kept, yet nothing held


def _idle_drift(make_opt, set_to_none):
    # A parameter with a gradient in the first step only: how far later steps move it.
    used, idle = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = make_opt([used, idle])
    for i in range(4):
        opt.zero_grad(set_to_none=set_to_none)
        ((used**2).sum() + ((idle**2).sum() if i == 0 else 0)).backward()
        opt.step()
        if i == 0:
            after_first = idle.detach().clone()
    return (idle.detach() - after_first).norm().item()


@pytest.mark.parametrize("make_opt,moves_on_zeros", [
    (lambda p: torch.optim.SGD(p, lr=0.1), False),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), True),
    (lambda p: torch.optim.AdamW(p, lr=0.1), True),
], ids=["sgd", "momentum", "adamw"])  # fmt: skip
def test_zeroed_gradients_move_a_parameter_that_none_leaves_alone(make_opt, moves_on_zeros):
    assert _idle_drift(make_opt, set_to_none=True) == 0
    assert (_idle_drift(make_opt, set_to_none=False) > 0) == moves_on_zeros


@pytest.mark.parametrize("order", list(itertools.permutations(["zero_grad", "backward", "step"])))
@pytest.mark.parametrize("left_out", [None, "zero_grad", "backward", "step"])
def test_misordered_or_missing_step_lines_raise_nothing(order, left_out):
    # Chapter 04: these mistakes are silent as long as backward() comes after the loss.
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        loss = net(torch.randn(4, 2)).pow(2).mean()
        lines = {
            "zero_grad": optimizer.zero_grad,
            "backward": loss.backward,
            "step": optimizer.step,
        }
        for name in order:
            if name != left_out:
                lines[name]()


@pytest.mark.parametrize("device", available_devices(), ids=str)
@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=0.01),
], ids=["momentum", "adam"])  # fmt: skip
def test_train_step_equals_the_five_lines(device, make_opt):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    model = model.to(device)
    twin = copy.deepcopy(model)
    opt, twin_opt = make_opt(model.parameters()), make_opt(twin.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(3):
        x, y = torch.randn(4, 3, device=device), torch.randint(0, 2, (4,), device=device)
        returned = step.train_step(model, opt, loss_fn, x, y)
        twin_opt.zero_grad()
        loss = loss_fn(twin(x), y)
        loss.backward()
        twin_opt.step()
        assert type(returned) is float
        assert returned == loss.item()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, **tolerance(p.dtype, device))


def test_reference_refuses_to_run_inside_learner_code():
    from forge_course.reference.guard import ReferenceCalled, learner_code

    with learner_code(), pytest.raises(ReferenceCalled, match="write it yourself"):
        step.hand_step(**EXAMPLE)
    assert step.hand_step(**EXAMPLE)["loss"] == pytest.approx(2.225)
