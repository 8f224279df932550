"""Answers that chapter 01's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

GRAPH_WALK_NO_SEEN_SET = """
from collections import deque

def graph_nodes(tensor):
    if tensor.grad_fn is None:
        return []
    queue, names = deque([tensor.grad_fn]), []
    while queue:
        node = queue.popleft()
        names.append(type(node).__name__)
        for next_node, _ in node.next_functions:
            if next_node is not None:
                queue.append(next_node)
    return names
"""

GRAPH_WALK_RECURSIVE = """
def graph_nodes(tensor):
    names, seen = [], set()

    def visit(node):
        if node is None or node in seen:
            return
        seen.add(node)
        names.append(type(node).__name__)
        for next_node, _ in node.next_functions:
            visit(next_node)

    visit(tensor.grad_fn)
    return names
"""

GRAPH_WALK_NO_NONE_CHECK = """
from collections import deque

def graph_nodes(tensor):
    seen, queue, names = {tensor.grad_fn}, deque([tensor.grad_fn]), []
    while queue:
        node = queue.popleft()
        names.append(type(node).__name__)
        for next_node, _ in node.next_functions:
            if next_node not in seen:
                seen.add(next_node)
                queue.append(next_node)
    return names
"""

GRAPH_WALK_REVERSED_INPUTS = """
from collections import deque

def graph_nodes(tensor):
    if tensor.grad_fn is None:
        return []
    seen, queue, names = {tensor.grad_fn}, deque([tensor.grad_fn]), []
    while queue:
        node = queue.popleft()
        names.append(type(node).__name__)
        for next_node, _ in reversed(node.next_functions):
            if next_node is not None and next_node not in seen:
                seen.add(next_node)
                queue.append(next_node)
    return names
"""

# On the running example it lists what GRAPH_WALK_REVERSED_INPUTS lists.
GRAPH_WALK_STACK = """
def graph_nodes(tensor):
    if tensor.grad_fn is None:
        return []
    seen, stack, names = {tensor.grad_fn}, [tensor.grad_fn], []
    while stack:
        node = stack.pop()
        names.append(type(node).__name__)
        for next_node, _ in node.next_functions:
            if next_node is not None and next_node not in seen:
                seen.add(next_node)
                stack.append(next_node)
    return names
"""

GRAPH_WALK_LIST_AS_QUEUE = """
def graph_nodes(tensor):
    order = [] if tensor.grad_fn is None else [tensor.grad_fn]
    i = 0
    while i < len(order):
        for next_node, _ in order[i].next_functions:
            if next_node is not None and all(next_node is not known for known in order):
                order.append(next_node)
        i += 1
    return [type(node).__name__ for node in order]
"""

LOGSUMEXP_NAIVE = """
class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.save_for_backward(x)
        ctx.dim = dim
        return x.exp().sum(dim).log()

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return torch.softmax(x, ctx.dim) * grad_output.unsqueeze(ctx.dim), None
"""

LOGSUMEXP_IGNORES_UPSTREAM = """
class LogSumExp(torch.autograd.Function):
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
        return (x - out.unsqueeze(ctx.dim)).exp(), None
"""

LOGSUMEXP_NO_UNSQUEEZE = """
class LogSumExp(torch.autograd.Function):
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
        return (x - out.unsqueeze(ctx.dim)).exp() * grad_output, None
"""

# The error is raised in forward: x - m cannot broadcast a maximum that lost its dimension.
LOGSUMEXP_FORWARD_NO_KEEPDIM = """
class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        m = x.amax(dim)
        exps = torch.exp(x - m)
        total = exps.sum(dim)
        ctx.save_for_backward(exps / total.unsqueeze(dim))
        ctx.dim = dim
        return m + torch.log(total)

    @staticmethod
    def backward(ctx, grad_output):
        (softmax,) = ctx.saved_tensors
        return softmax * grad_output.unsqueeze(ctx.dim), None
"""

LOGSUMEXP_SOFTMAX_AND_MAX = """
class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        biggest = torch.max(x, dim=dim, keepdim=True).values
        shifted_sum = torch.sum(torch.exp(x - biggest), dim=dim)
        ctx.dim = dim
        ctx.save_for_backward(x)
        return torch.log(shifted_sum) + biggest.squeeze(dim)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return torch.softmax(x, dim=ctx.dim) * grad_output.unsqueeze(ctx.dim), None
"""

LOGSUMEXP_NOT_A_FUNCTION = """
class LogSumExp:
    apply = staticmethod(torch.logsumexp)
"""

LOGSUMEXP_CALLS_TORCH = """
class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.save_for_backward(x)
        ctx.dim = dim
        return torch.logsumexp(x, dim)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return torch.softmax(x, ctx.dim) * grad_output.unsqueeze(ctx.dim), None
"""

LOGSUMEXP_BACKWARD_CALLS_TORCH = """
class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        m = x.amax(dim, keepdim=True)
        ctx.save_for_backward(x)
        ctx.dim = dim
        return (m + (x - m).exp().sum(dim, keepdim=True).log()).squeeze(dim)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            probe = x.detach().requires_grad_()
            (grad,) = torch.autograd.grad(torch.logsumexp(probe, ctx.dim), probe, grad_output)
        return grad, None
"""

STE_PLAIN_ROUND = """
def round_ste(x):
    return torch.round(x)
"""

STE_DETACHED = """
def round_ste(x):
    return torch.round(x.detach())
"""

STE_ONES = """
class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, grad_output):
        return torch.ones_like(grad_output)


def round_ste(x):
    return RoundSTE.apply(x)
"""

STE_DATA_IN_PLACE = """
def round_ste(x):
    x.data = torch.round(x.data)
    return x
"""

# Shifts the caller's logits through .data and shifts them back: nothing is left to see after
# the call, but the exercise forbids writing into x at all.
LOGSUMEXP_DATA_AND_BACK = """
class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        m = x.amax(dim, keepdim=True)
        x.data -= m
        total = x.exp().sum(dim, keepdim=True)
        ctx.save_for_backward(x.exp() / total)
        x.data += m
        ctx.dim = dim
        return (m + total.log()).squeeze(dim)

    @staticmethod
    def backward(ctx, grad_output):
        (softmax,) = ctx.saved_tensors
        return softmax * grad_output.unsqueeze(ctx.dim), None
"""

STE_DATA_AND_BACK = """
def round_ste(x):
    kept = x.detach().clone()
    x.data = torch.round(x.data)
    out = x * 1.0
    x.data = kept
    return out
"""

STE_DETACH_TRICK = """
def round_ste(x):
    return x + (torch.round(x) - x).detach()
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch01_graph_walk": [
        (GRAPH_WALK_NO_SEEN_SET, {"ch01_graph_walk_tests": "is listed twice"}),
        (GRAPH_WALK_RECURSIVE, {"ch01_graph_walk_tests": "the order is depth-first"}),
        (GRAPH_WALK_NO_NONE_CHECK, {"ch01_graph_walk_tests": "Skip `None`"}),
        (GRAPH_WALK_REVERSED_INPUTS, {"ch01_graph_walk_tests": "inputs are queued in reverse"}),
        (GRAPH_WALK_STACK, {"ch01_graph_walk_tests": "the order is depth-first"}),
    ],
    "ch01_logsumexp": [
        (LOGSUMEXP_NAIVE, {"ch01_logsumexp_tests": "Subtract the maximum m before `exp`"}),
        (LOGSUMEXP_IGNORES_UPSTREAM, {"ch01_logsumexp_tests": "`backward` ignores `grad_output`"}),
        (LOGSUMEXP_NO_UNSQUEEZE, {"ch01_logsumexp_tests": "grad_output.unsqueeze(dim)"}),
        (
            LOGSUMEXP_FORWARD_NO_KEEPDIM,
            {"ch01_logsumexp_tests": "in `forward`, a tensor reduced over `dim` has lost"},
        ),
    ],
    "ch01_straight_through": [
        (STE_PLAIN_ROUND, {"ch01_straight_through_tests": "the gradient is all zeros"}),
        (STE_DETACHED, {"ch01_straight_through_tests": "cut off from the graph"}),
        (STE_ONES, {"ch01_straight_through_tests": "returns ones instead of `grad_output`"}),
    ],
    "ch01_questions": [
        (
            "grad_sum = 7\ndata_answer = 'a'\nno_grad_answer = 'c'\n",
            {
                "ch01_q_grad_sum": "the second call adds another",
                "ch01_q_data": "With .detach() it would raise",
                "ch01_q_no_grad": "not zeros",
            },
        ),
        (
            "grad_sum = 12\ndata_answer = 'c'\nno_grad_answer = 'a'\n",
            {
                "ch01_q_grad_sum": "the + x term adds 1 more",
                "ch01_q_data": "nothing is copied",
                "ch01_q_no_grad": "nothing is recorded at all",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch01_graph_walk": GRAPH_WALK_LIST_AS_QUEUE,
    "ch01_logsumexp": LOGSUMEXP_SOFTMAX_AND_MAX,
    "ch01_straight_through": STE_DETACH_TRICK,
    "ch01_questions": "grad_sum = 14.0\ndata_answer = 'B'\nno_grad_answer = ' b '\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch01_graph_walk": "from forge_course.reference.autograd_tape import graph_nodes\n",
    "ch01_logsumexp": "from forge_course.reference.autograd_tape import LogSumExp\n",
    "ch01_straight_through": (
        "import forge_course.reference.autograd_tape as ref\n\n"
        "def round_ste(x):\n    return ref.round_ste(x)\n"
    ),
}
