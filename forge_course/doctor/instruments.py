"""What the doctor watches while a training loop runs.

A `Chart` is attached to the patient for the length of one run (`Chart.attached`). It records:

- every forward pass of the model: which loader gave the latest batch, whether autograd was
  recording, whether Dropout was active, where the input and the weights lived, whether backward
  later ran through it, and how long its graph stayed alive;
- every gradient that backward adds into a parameter's `.grad`, and what `.grad` held before;
- every optimizer step, by any optimizer, and which parameters it covered;
- what the loss function receives;
- torch's own warning when a learning-rate scheduler steps before its optimizer.

The chart only observes; `findings` turns its records into diagnoses.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DataLoader

# torch warns with this wording (unchanged since 1.1) when `scheduler.step()` comes first.
SCHEDULER_WARNING = "`lr_scheduler.step()` before `optimizer.step()`"


@dataclass
class ForwardRecord:
    """One forward pass of the patient, as the doctor saw it."""

    phase: str | None  # "train" or "val": the loader that yielded the latest batch
    epoch: int  # passes over the training loader started so far
    batch: int  # batches that loader has yielded so far, over all its passes
    grad_enabled: bool  # was autograd recording a graph?
    dropout_active: tuple[bool, ...]  # `training` flag of each Dropout module
    backpropagated: bool = False  # did a backward pass run through this forward's output?
    graph: weakref.ref | None = None  # alive exactly as long as the output's graph


class _GraphTag:
    """A hook hung on a forward's output node, to learn when backward reaches it and when it dies.

    An autograd node holds its hooks, and the node lives as long as anything refers to it: the
    output, a loss computed from it, or a running total built from that loss. So a weak reference
    to the tag goes dead exactly when the graph is freed.
    """

    __slots__ = ("record", "__weakref__")

    def __init__(self, record: ForwardRecord) -> None:
        self.record = record

    def __call__(self, grad_outputs: tuple[torch.Tensor, ...]) -> None:
        self.record.backpropagated = True


class WatchedLoader(DataLoader):
    """A DataLoader that tells the chart when a pass starts and when each batch is handed out.

    It stays a real `DataLoader` (length, dataset, batch size): a loop cannot tell the difference.
    """

    def __init__(self, dataset, *, chart: Chart, phase: str, **kwargs) -> None:
        super().__init__(dataset, **kwargs)
        self.chart = chart
        self.phase = phase

    def __iter__(self):
        self.chart.pass_started(self.phase)
        for batch in super().__iter__():
            self.chart.batch_yielded(self.phase)
            yield batch


def _do_nothing(*args) -> None:
    return None


def _inert_hook():
    return _do_nothing


class _Hook:
    """A chart method used as a module hook, safe to copy and to save with the model.

    `copy.deepcopy(model)` (a best-model snapshot) would otherwise deep-copy the whole chart; here
    the copy shares the hook, so the doctor watches it too. `torch.save(model)` stores a hook that
    does nothing. Once the run is over the hook does nothing either.
    """

    def __init__(self, chart: Chart, method) -> None:
        self.chart = chart
        self.method = method

    def __call__(self, *args):
        return self.method(*args) if self.chart.watching else None

    def __deepcopy__(self, memo: dict) -> _Hook:
        return self

    def __reduce__(self):
        return (_inert_hook, ())


def _is_empty(grad: torch.Tensor | None) -> bool:
    return grad is None or not bool(grad.any())


def _on_device(actual: torch.device, wanted: torch.device) -> bool:
    # "cuda" asks for the current GPU, which tensors report as "cuda:0".
    return actual.type == wanted.type and wanted.index in (None, actual.index)


class Chart:
    """Records of one run of a training loop on the patient. See the module docstring."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.watching = False
        self.phase: str | None = None
        self.epoch = 0
        self.batches: Counter[str] = Counter()  # phase -> batches yielded so far
        self.forwards: list[ForwardRecord] = []
        self.off_device: Counter[str] = Counter()  # "model input on cpu" -> times seen
        self.loss_calls = 0
        self.probability_calls = 0  # loss calls whose input rows were probabilities
        self.early_scheduler_steps = 0
        self.steps = 0
        self.grad_norms: list[float] = []  # norm of the gradient each optimizer step applied
        self.reused_at: set[int] = set()  # updates whose .grad still held an applied gradient
        self.leaks: dict[int, int] = {}  # epoch -> backward passes left over from the one before
        self.params: dict[int, tuple[str, nn.Parameter]] = {}  # id -> (name, parameter)
        self.covered: Counter[int] = Counter()  # id -> optimizer steps that held the parameter
        self.backwards: Counter[int] = Counter()  # id -> non-zero gradients received
        # id -> the backward passes currently summed in .grad: (epoch, covering steps at the time)
        self.in_grad: dict[int, list[tuple[int, int]]] = {}
        self.old_graphs = (0, "")  # most graphs of earlier batches alive at once, and when
        self._alive: list[ForwardRecord] = []
        self._handles: list = []

    # -- loaders -----------------------------------------------------------------------------

    def pass_started(self, phase: str) -> None:
        if phase == "train":
            self.epoch += 1

    def batch_yielded(self, phase: str) -> None:
        self.phase = phase
        self.batches[phase] += 1
        # The loop now holds at most the graph of this loader's previous batch; older ones
        # should be gone. Ages count per loader: a training loss that stays in its variable
        # while validation runs is not growing anything.
        n = self.batches[phase]
        old = self._count_alive(lambda r: r.phase == phase and r.batch <= n - 2)
        loader = "training" if phase == "train" else "validation"
        self._note_old_graphs(old, f"at {loader} batch {n}")

    def after_fit(self) -> None:
        """Count the graphs still alive once `fit` has returned: its result holds them."""
        self._note_old_graphs(self._count_alive(lambda r: True), "after `fit` returned")

    def _count_alive(self, counts: Callable[[ForwardRecord], bool]) -> int:
        self._alive = [r for r in self._alive if r.graph is not None and r.graph() is not None]
        return sum(1 for r in self._alive if counts(r))

    def _note_old_graphs(self, count: int, when: str) -> None:
        if count > self.old_graphs[0]:
            self.old_graphs = (count, when)

    # -- model ---------------------------------------------------------------------------------

    def _watch(self, model: nn.Module) -> None:
        # Checked at every forward, so a head swapped in by the loop is watched as well.
        for name, param in model.named_parameters():
            if param.requires_grad and id(param) not in self.params:
                self.params[id(param)] = (name, param)
                self._handles.append(param.register_hook(functools.partial(self._on_grad, param)))

    def _check_device(self, what: str, tensor: torch.Tensor) -> None:
        if not _on_device(tensor.device, self.device):
            self.off_device[f"{what} on {tensor.device}"] += 1

    def _before_forward(self, model: nn.Module, args: tuple) -> None:
        self._watch(model)
        for arg in args:
            if isinstance(arg, torch.Tensor):
                self._check_device("model input", arg)
        for param in model.parameters():
            self._check_device("weights", param)
        dropout = tuple(m.training for m in model.modules() if isinstance(m, nn.Dropout))
        self.forwards.append(
            ForwardRecord(
                self.phase,
                self.epoch,
                self.batches[self.phase],
                torch.is_grad_enabled(),
                dropout,
            )
        )

    def _after_forward(self, model: nn.Module, args: tuple, output) -> None:
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            record = self.forwards[-1]
            tag = _GraphTag(record)
            output.grad_fn.register_prehook(tag)
            record.graph = weakref.ref(tag)
            self._alive.append(record)

    # -- gradients and optimizer steps ---------------------------------------------------------

    def _on_grad(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        # A tensor hook on a parameter runs before backward adds `grad` into `param.grad`, so
        # `param.grad` still shows what the loop left there.
        key = id(param)
        held = self.in_grad.setdefault(key, [])
        if _is_empty(param.grad):
            held.clear()
        elif any(steps < self.covered[key] for _, steps in held):
            self.reused_at.add(self.steps + 1)
        elif self.covered[key] and any(epoch < self.epoch for epoch, _ in held):
            leftover = sum(epoch < self.epoch for epoch, _ in held)
            self.leaks[self.epoch] = max(self.leaks.get(self.epoch, 0), leftover)
        if bool(grad.any()):
            held.append((self.epoch, self.covered[key]))
            self.backwards[key] += 1

    def _before_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self.steps += 1
        squares = 0.0
        for group in optimizer.param_groups:
            for param in group["params"]:
                self.covered[id(param)] += 1
                if param.grad is not None:
                    squares += float(param.grad.detach().pow(2).sum())
        self.grad_norms.append(squares**0.5)

    def unapplied_backwards(self) -> int:
        """Most backward passes summed in a stepped parameter's `.grad` since its last step."""
        worst = 0
        for key, (_, param) in self.params.items():
            if self.covered[key] and not _is_empty(param.grad):
                pending = sum(steps == self.covered[key] for _, steps in self.in_grad.get(key, []))
                worst = max(worst, pending)
        return worst

    def never_stepped(self) -> list[str]:
        """Names of parameters that received gradients but were in no optimizer that stepped."""
        return [
            name
            for key, (name, _) in self.params.items()
            if self.backwards[key] and not self.covered[key]
        ]

    # -- loss ----------------------------------------------------------------------------------

    def _before_loss(self, loss_fn: nn.Module, args: tuple) -> None:
        self.loss_calls += 1
        for what, arg in zip(("loss input", "loss target"), args, strict=False):
            if isinstance(arg, torch.Tensor):
                self._check_device(what, arg)
        scores = args[0].detach() if args and isinstance(args[0], torch.Tensor) else None
        if scores is not None and scores.dim() >= 2 and scores.is_floating_point():
            # Logits are unconstrained; rows that are all >= 0 and sum to 1 went through softmax.
            sums = scores.sum(dim=1)
            if bool((scores >= 0).all()) and torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
                self.probability_calls += 1

    # -- attaching -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def attached(self, model: nn.Module, loss_fn: nn.Module) -> Iterator[Chart]:
        """Watch `model`, `loss_fn`, every optimizer step and torch's warnings inside the block.

        Everything is detached on the way out, and warnings other than the scheduler one are
        shown again, so the loop's own warnings are not swallowed.
        """
        self._watch(model)
        self._handles += [
            model.register_forward_pre_hook(_Hook(self, self._before_forward)),
            model.register_forward_hook(_Hook(self, self._after_forward)),
            loss_fn.register_forward_pre_hook(_Hook(self, self._before_loss)),
            register_optimizer_step_pre_hook(self._before_step),
        ]
        self.watching = True
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield self
            finally:
                self.watching = False
                for handle in self._handles:
                    handle.remove()
                self._handles.clear()
        shown: dict = {}  # shared registry: a warning raised on every batch is shown once
        for w in caught:
            if SCHEDULER_WARNING in str(w.message):
                self.early_scheduler_steps += 1
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, registry=shown)
