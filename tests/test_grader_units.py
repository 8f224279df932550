"""The grader's parts that need no worker: the data codec, the tamper scan, notebook matching."""

import math
import os

import pytest
import torch

from forge_course.grader import codec, sandbox, tamper
from forge_course.grader.assignment import canonical, find_notebook
from forge_course.grading.core import first_difference


@pytest.mark.parametrize("value", [
    None, True, 3, 2.5, "text", [1, [2.0, "x"]], (1, 2), {"a": {"b": [1.0]}},
    float("nan"), float("inf"), -float("inf"),
    torch.arange(6, dtype=torch.float64).reshape(2, 3), torch.tensor([1.5, float("nan")]),
    torch.tensor([1.1, 2.2], dtype=torch.bfloat16), torch.tensor([1, 2], dtype=torch.int64),
    torch.tensor(True), torch.zeros(0, 3),
])  # fmt: skip
def test_plain_values_survive_the_trip_exactly(value):
    back = codec.loads(codec.dumps(value))
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(back)
    else:
        assert first_difference(back, value) is None
    if isinstance(value, torch.Tensor):
        assert back.dtype == value.dtype and back.shape == value.shape
        assert torch.equal(back.nan_to_num(7.0), value.nan_to_num(7.0))


class AlwaysEqual:
    def __eq__(self, other):
        return True


class Sneaky(torch.Tensor):
    pass


@pytest.mark.parametrize("value", [AlwaysEqual(), torch.ones(2).as_subclass(Sneaky),
                                   torch.nn.Parameter(torch.ones(2)), {1: "int key"}])  # fmt: skip
def test_anything_but_plain_data_arrives_as_a_description(value):
    back = codec.loads(codec.dumps(value))
    assert isinstance(back, codec.Unsupported)
    assert first_difference(back, 1.0) is not None


@pytest.mark.parametrize("source,reason", [
    ("from forge_course.reference.step import train_step", "imports forge_course"),
    ("import forge_course.reference as r", "imports forge_course"),
    ("get_ipython().input_transformers_post.append(f)", "get_ipython"),
    ("import torch\ntorch.allclose = lambda *a, **k: True", "patches `torch.allclose`"),
    ("import torch\ntorch.testing.assert_close = print", "patches `torch.testing.assert_close`"),
    ("import numpy as np\nnp.allclose = lambda *a: True", "patches `np.allclose`"),
    ("import torch\nsetattr(torch, 'equal', lambda a, b: True)", "patches `torch`"),
    ("import torch\ntorch.Tensor.__eq__ = lambda s, o: True", "patches `torch.Tensor.__eq__`"),
    ("import sys\nsys.settrace(lambda *a: None)", "trace hook"),
    ("import os\nos._exit(0)", "ends the interpreter"),
    ("exit()", "ends the interpreter"),
    ("import os\nos.fork()", "starts processes"),
    ("import subprocess", "starts processes"),
    ("import socket\nsocket.create_connection(('1.2.3.4', 80))", "network"),
    ("import builtins\nbuiltins.print = None", "built-in"),
    ("__builtins__.len = None", "__builtins__"),
    ("x = __import__('forge_course')", "imports modules by name"),
    ("import importlib", "imports modules by name"),
    ("eval('1 + 1')", "runs code built at run time"),
    ("import os\nflag = os.environ.get('NBGRADER_EXECUTION')", "grader's"),
    ("open('../../gradebook.db').read()", "grader's files"),
    ("import sys\nsys.modules['torch'] = None", "sys.modules"),
    ("import torch\nclass T(torch.Tensor):\n    pass", "subclasses torch.Tensor"),
    ("class A:\n    def __torch_function__(cls, *a):\n        pass", "__torch_function__"),
    ("import ctypes", "memory"),
    ("import signal", "signals"),
    ("import gc\ngc.get_objects()", "memory"),
])  # fmt: skip
def test_tampering_is_named(source, reason):
    found = tamper.findings(source)
    assert found and reason in " ".join(found), found


@pytest.mark.parametrize("source", [
    "import torch\nimport numpy as np\n\ndef f(x):\n    return np.mean(x)",
    "import torch\ntorch.backends.cudnn.deterministic = True",
    "import os\nos.environ['PYTHONHASHSEED'] = '0'",
    "import csv\n\ndef load(path):\n    with open(path) as f:\n        return list(csv.reader(f))",
    "class Op(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
    "        return x",
    "def f(model):\n    model.weight = None",
    "x = (",  # a syntax error is the learner's mistake, reported when it runs
])  # fmt: skip
def test_ordinary_answers_are_not_flagged(source):
    assert tamper.findings(source) == []


@pytest.mark.parametrize("name", [
    "ch04_one_training_step", "Copy of ch04_one_training_step", "ch04_one_training_step (1)",
    "Copy of ch04_one_training_step (2)", "ch04_one_training_step-Copy1",
])  # fmt: skip
def test_renamed_downloads_match_their_assignment(name):
    assert canonical(name) == "ch04_one_training_step"


def test_find_notebook_prefers_the_matching_name(tmp_path):
    (tmp_path / "notes.ipynb").write_text("{}")
    (tmp_path / "Copy of ch04_one_training_step (1).ipynb").write_text("{}")
    assert find_notebook(tmp_path, "ch04_one_training_step").name.startswith("Copy of")
    (tmp_path / "Copy of ch04_one_training_step (1).ipynb").unlink()
    assert find_notebook(tmp_path, "ch04_one_training_step").name == "notes.ipynb"
    (tmp_path / "other.ipynb").write_text("{}")
    assert find_notebook(tmp_path, "ch04_one_training_step") is None


def test_ordinary_torch_use_does_not_look_like_a_patch():
    """Pickling a tensor (torch.save) caches ``__slotnames__`` on the class: not a patch."""
    import copy
    import io

    import torch._dynamo  # noqa: F401  (as the worker does: importing it wraps torch.manual_seed)

    from forge_course.grader import worker

    before = worker._watched()

    def replaced():
        return worker._replaced(before, worker._watched())

    model = torch.nn.Linear(2, 2)
    torch.save({"model": model.state_dict(), "rng": torch.get_rng_state()}, io.BytesIO())
    copy.deepcopy(torch.optim.SGD(model.parameters(), lr=0.1))
    assert replaced() == []
    torch.Tensor.tolist, saved = (lambda self: []), torch.Tensor.tolist
    try:
        assert replaced() == ["torch.Tensor.__dict__ keys"]  # shadows TensorBase's
    finally:
        torch.Tensor.tolist = saved


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda"])
def test_the_runs_devices_reach_the_workers_and_not_the_grader(monkeypatch, device):
    """--device is handed to each worker's environment; the grader's own stays as it was (one
    process may serve runs with different devices, and cannot hide a GPU it has opened)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # an administrator's choice of GPU
    monkeypatch.delenv("FORGE_DEVICE", raising=False)
    before = dict(os.environ)
    env = sandbox._environment("/home/x", sandbox.device_environment(device))
    assert dict(os.environ) == before
    expected = {"auto": ("", "1"), "cpu": ("cpu", ""), "cuda": ("cuda", "1")}[device]
    assert (env.get("FORGE_DEVICE", ""), env["CUDA_VISIBLE_DEVICES"]) == expected


@pytest.mark.parametrize("source", ["a" + "[0]" * 45000, "f" + "()" * 100000, "-" * 10**6 + "1"])
def test_a_cell_the_parser_gives_up_on_is_named_unreadable_not_a_crash(source):
    """Nesting past the parser's depth or memory: one reason, never RecursionError or
    MemoryError, which would make the whole submission a grader error."""
    with pytest.raises(tamper.Unreadable, match="Python cannot read this cell"):
        tamper.findings(source)
