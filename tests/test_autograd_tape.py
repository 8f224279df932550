"""The autograd-tape reference against torch's own machinery: the engine, logsumexp, gradcheck."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge_course.device import available_devices, tolerance
from forge_course.reference import autograd_tape as tape
from forge_course.reference.guard import ReferenceCalled, learner_code

DEVICES = available_devices()


def running_example():
    x = torch.tensor(2.0, requires_grad=True)
    w = torch.tensor(3.0, requires_grad=True)
    return (w * x + x) ** 2, x, w


def test_graph_nodes_of_the_running_example():
    loss, x, w = running_example()
    assert tape.graph_nodes(loss) == [
        "PowBackward0", "AddBackward0", "MulBackward0", "AccumulateGrad", "AccumulateGrad",
    ]  # fmt: skip
    graph = tape.recorded_graph(loss)
    # Add feeds Mul and x's accumulator; Mul feeds w's and the same accumulator of x.
    assert graph.inputs == [[1], [2, 3], [4, 3], [], []]
    assert graph.nodes[3].variable is x and graph.nodes[4].variable is w


def test_nothing_recorded_means_no_nodes():
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        y = x * 2
    assert tape.graph_nodes(x) == [] and tape.graph_nodes(y) == []


def test_every_tensor_that_needs_no_gradient_is_a_leaf_with_no_nodes():
    # Results of operations included: the docstring's "a leaf, made by hand or needing none".
    result = torch.ones(3) * 2
    assert result.is_leaf and result.grad_fn is None and tape.graph_nodes(result) == []
    assert not (torch.ones(3, requires_grad=True) * 2).is_leaf


def test_the_number_in_a_next_functions_pair_is_which_output_not_which_input():
    first, second = torch.tensor([1.0, 2.0], requires_grad=True).unbind()
    # Input 0 of the product is unbind's output 1, input 1 its output 0.
    assert [number for _, number in (second * first).grad_fn.next_functions] == [1, 0]
    x, w = torch.tensor(2.0, requires_grad=True), torch.tensor(3.0, requires_grad=True)
    # One-output producers give 0 at every input position, the second one included.
    assert [number for _, number in (w * x + x).grad_fn.next_functions] == [0, 0]


def graphs():
    a, b, c = (torch.randn(3, requires_grad=True) for _ in range(3))
    h = a.sigmoid()
    layer = torch.nn.Linear(3, 2)
    s, t = b.unbind()[:2]
    yield "shared", (h * h + h).sum()
    yield "products", (a * b + c * a).sum()
    yield "layer", layer(torch.relu(a)).mean()
    yield "unbind", s * t + s
    yield "constants", (a * 2 + torch.ones(3)).sum()
    yield "function", tape.LogSumExp.apply(torch.stack([a, b]), -1).sum() * c.sum()


@pytest.mark.parametrize("name,out", list(graphs()))
def test_the_walk_finds_exactly_the_nodes_the_engine_runs(name, out):
    # Torch's own engine is the judge: hook every node found, run backward, and check that each
    # found node ran exactly once and that the leaves reached are the ones that got a gradient.
    graph = tape.recorded_graph(out)
    ran = []
    for node in graph.nodes:
        node.register_hook(lambda grad_in, grad_out, node=node: ran.append(node))
    out.backward()
    assert len(ran) == len(graph.nodes) == len(set(ran))
    assert set(ran) == set(graph.nodes)
    # Each edge points to a node that appears later (breadth-first order has parents first).
    assert all(j > i for i, feeds in enumerate(graph.inputs) for j in feeds)
    reached = [n.variable for n in graph.nodes if type(n).__name__ == "AccumulateGrad"]
    assert all(leaf.grad is not None for leaf in reached)


def test_breadth_first_lists_a_nodes_inputs_before_theirs():
    a, b, c, d = (torch.tensor(float(v), requires_grad=True) for v in range(1, 5))
    assert (
        tape.graph_nodes(a * b + c * d)
        == ["AddBackward0", "MulBackward0", "MulBackward0"] + ["AccumulateGrad"] * 4
    )


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize(
    "shape,dim", [((5,), 0), ((3, 4), -1), ((3, 4), 0), ((2, 3, 5), 1), ((4, 4), 1)]
)
def test_logsumexp_equals_torch_and_its_gradient_is_the_softmax(device, shape, dim):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=gen) * 3).to(device).requires_grad_()
    out = tape.LogSumExp.apply(x, dim)
    torch.testing.assert_close(out, torch.logsumexp(x, dim), **tolerance(x.dtype, device))
    upstream = torch.rand(out.shape, generator=gen).to(device)
    out.backward(upstream)
    expected = torch.softmax(x.detach(), dim) * upstream.unsqueeze(dim)
    torch.testing.assert_close(x.grad, expected, **tolerance(x.dtype, device))


@pytest.mark.parametrize("shape,dim", [((6,), 0), ((3, 4), 1), ((2, 3, 4), -2)])
@pytest.mark.parametrize("offset", [0.0, 1000.0, -1000.0])
def test_logsumexp_passes_gradcheck_in_float64(shape, dim, offset):
    x = (torch.randn(shape, dtype=torch.float64) + offset).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: tape.LogSumExp.apply(t, dim), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logsumexp_stays_finite_where_the_naive_formula_overflows(dtype):
    x = torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1002.0]], dtype=dtype)
    naive = x.exp().sum(-1).log()
    assert naive[0].isinf() and naive[1].isinf()  # exp(1000) = inf; log(0) = -inf
    x.requires_grad_()
    out = tape.LogSumExp.apply(x, -1)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(out, torch.logsumexp(x, -1))
    torch.testing.assert_close(x.grad, torch.softmax(x.detach(), -1))
    # The hand calculation of chapter 01: 1000 + log(1 + e⁻¹ + e⁻²) = 1000.40760596...
    assert out[0].item() == pytest.approx(
        1000.4076059644444, abs=1e-4 if dtype == torch.float32 else 1e-12
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=8),
    st.floats(0.1, 10.0),
)
def test_logsumexp_matches_torch_for_any_logits(values, upstream):
    x = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    out = tape.LogSumExp.apply(x, 0)
    (out * upstream).backward()
    torch.testing.assert_close(out, torch.logsumexp(x, 0))
    torch.testing.assert_close(x.grad, torch.softmax(x.detach(), 0) * upstream)


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_ste_rounds_like_torch_and_passes_the_gradient_through(device, dtype):
    if device.type == "mps" and dtype == torch.float64:
        pytest.skip("MPS has no float64")
    leaf = torch.tensor([-2.5, -1.5, -0.6, -0.5, 0.4, 0.5, 1.5, 2.5, 2.7], dtype=dtype)
    leaf = leaf.to(device).requires_grad_()
    x = 3 * leaf  # not a leaf: the gradient has to continue past round_ste
    out = tape.round_ste(x)
    assert torch.equal(out, torch.round(x))  # halves go to the even neighbour, exactly as torch
    upstream = torch.arange(1.0, 10.0, dtype=dtype, device=device)
    out.backward(upstream)
    assert torch.equal(leaf.grad, 3 * upstream)
    # The same as the detach formulation of the straight-through estimator.
    twin = leaf.detach().clone().requires_grad_()
    y = 3 * twin
    (y + (torch.round(y) - y).detach()).backward(upstream)
    assert torch.equal(twin.grad, leaf.grad)


def test_autograd_own_round_has_a_zero_gradient():
    x = torch.tensor([0.3, 1.7], requires_grad=True)
    torch.round(x).sum().backward()
    assert torch.equal(x.grad, torch.zeros(2))


def test_references_refuse_to_run_inside_learner_code():
    loss, x, _ = running_example()
    with learner_code():
        for call in (
            lambda: tape.graph_nodes(loss),
            lambda: tape.recorded_graph(loss),
            lambda: tape.LogSumExp.apply(x.detach().expand(3).clone().requires_grad_(), 0),
            lambda: tape.round_ste(x),
            lambda: tape.RoundSTE.apply(x),
        ):
            with pytest.raises(ReferenceCalled, match="write it yourself"):
                call()
    assert tape.graph_nodes(loss)[0] == "PowBackward0"
