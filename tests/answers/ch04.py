"""Answers that chapter 04's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook.
"""

HAND_STEP_NO_MEAN = """
def hand_step(W, b, x, t, lr):
    y = [sum(w * xj for w, xj in zip(row, x)) + bi for row, bi in zip(W, b)]
    loss = sum((yi - ti) ** 2 for yi, ti in zip(y, t)) / len(t)
    dy = [2 * (yi - ti) for yi, ti in zip(y, t)]
    dW = [[g * xj for xj in x] for g in dy]
    return {"y": y, "loss": loss, "dL_dy": dy, "dL_dW": dW, "dL_db": dy,
            "W_new": [[w - lr * g for w, g in zip(r, gr)] for r, gr in zip(W, dW)],
            "b_new": [bi - lr * g for bi, g in zip(b, dy)]}
"""

HAND_STEP_WRONG_SIGN = """
import numpy as np

def hand_step(W, b, x, t, lr):
    W, b, x, t = map(np.array, (W, b, x, t))
    y = W @ x + b
    dy = 2 * (y - t) / len(t)
    return {"y": y, "loss": np.mean((y - t) ** 2), "dL_dy": dy, "dL_dW": np.outer(dy, x),
            "dL_db": dy, "W_new": W + lr * np.outer(dy, x), "b_new": b + lr * dy}
"""

HAND_STEP_NUMPY = """
import numpy as np

def hand_step(W, b, x, t, lr):
    W, b, x, t = (np.asarray(a, dtype=np.float64) for a in (W, b, x, t))
    y = W.dot(x) + b
    grad_y = (y - t) * 2.0 / y.shape[0]
    grad_W = grad_y[:, None] * x[None, :]
    return dict(y=y, loss=float(((y - t) ** 2).mean()), dL_dy=grad_y, dL_dW=grad_W,
                dL_db=grad_y.copy(), W_new=W - lr * grad_W, b_new=b - lr * grad_y)
"""

HAND_STEP_ENABLE_GRAD = """
import torch

def hand_step(W, b, x, t, lr):
    with torch.enable_grad():
        W = torch.tensor(W, requires_grad=True)
        b = torch.tensor(b, requires_grad=True)
        y = W @ torch.tensor(x) + b
        y.retain_grad()
        loss = ((y - torch.tensor(t)) ** 2).mean()
        loss.backward()
    return {"y": y.tolist(), "loss": loss.item(), "dL_dy": y.grad.tolist(),
            "dL_dW": W.grad.tolist(), "dL_db": b.grad.tolist(),
            "W_new": (W - lr * W.grad).tolist(), "b_new": (b - lr * b.grad).tolist()}
"""

TRAIN_STEP_NO_ZERO_GRAD = """
def train_step(model, optimizer, loss_fn, x, y):
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
"""

# With a cross-entropy loss, torch's kernel refuses the integer targets as the output: a
# NotImplementedError of torch's own, which is no unwritten answer.
TRAIN_STEP_SWAPPED_LOSS = """
def train_step(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = loss_fn(y, model(x))
    loss.backward()
    optimizer.step()
    return loss.item()
"""

TRAIN_STEP_STEP_FIRST = """
def train_step(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    optimizer.step()
    loss.backward()
    return loss.item()
"""

TRAIN_STEP_RETURNS_TENSOR = """
def train_step(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss
"""

TRAIN_STEP_EVAL_MODE = """
def train_step(model, optimizer, loss_fn, x, y):
    model.eval()
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    model.train()
    return loss.item()
"""

TRAIN_STEP_CALLS_FORWARD = """
def train_step(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = loss_fn(model.forward(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
"""

TRAIN_STEP_ZERO_GRAD_LAST = """
def train_step(model, optimizer, loss_fn, x, y):
    prediction = model(x)
    loss = loss_fn(prediction, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch04_hand_step": [
        (HAND_STEP_NO_MEAN, {"ch04_hand_step_tests": "Without the 1/m"}),
        (HAND_STEP_WRONG_SIGN, {"ch04_hand_step_tests": "SGD moves *against* the gradient"}),
        (HAND_STEP_ENABLE_GRAD, {"ch04_hand_step_tests": "used autograd"}),
    ],
    "ch04_train_step": [
        (TRAIN_STEP_NO_ZERO_GRAD, {"ch04_train_step_tests": "`optimizer.zero_grad()` is missing"}),
        (TRAIN_STEP_STEP_FIRST, {"ch04_train_step_tests": "the parameters never move"}),
        (TRAIN_STEP_RETURNS_TENSOR, {"ch04_train_step_tests": "Return `loss.item()`"}),
        (TRAIN_STEP_EVAL_MODE, {"ch04_train_step_tests": "the forward ran in eval mode"}),
        (TRAIN_STEP_CALLS_FORWARD, {"ch04_train_step_tests": "skips the model's hooks"}),
        (TRAIN_STEP_SWAPPED_LOSS, {"ch04_train_step_tests": "takes the output first"}),
    ],
    "ch04_questions": [
        (
            "grad_multiple = 2\nsoftmax_answer = 'a'\n",
            {
                "ch04_q_grad_multiple": "count the first backward too",
                "ch04_q_softmax": "accepts any real numbers",
            },
        ),
        (
            "grad_multiple = 1\nsoftmax_answer = 'b'\n",
            {
                "ch04_q_grad_multiple": "it does not replace it",
                "ch04_q_softmax": "is not the identity",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch04_hand_step": HAND_STEP_NUMPY,
    "ch04_train_step": TRAIN_STEP_ZERO_GRAD_LAST,
    "ch04_questions": "grad_multiple = 3.0\nsoftmax_answer = 'C'\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch04_hand_step": "from forge_course.reference.step import hand_step\n",
    "ch04_train_step": (
        "import forge_course.reference.step as ref\n\n"
        "def train_step(*args):\n    return ref.train_step(*args)\n"
    ),
}
