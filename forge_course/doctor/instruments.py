"""What the doctor watches while a training loop runs.

A `Chart` is attached to the patient for the length of one run (`Chart.attached`). It records:

- every forward pass of the model: where its input came from (`sources`), whether autograd was
  recording, whether Dropout was active, where the input and the weights lived, whether backward
  later ran through it, and how long its graph stayed alive;
- every gradient that backward adds into a parameter's `.grad`, what `.grad` held before, and
  how much weight the loss it came from had in that backward pass;
- every update: each `optimizer.step()` by any optimizer (including the ones `fit` builds, and
  LBFGS's `step(closure)`), and each change of a parameter's values outside an optimizer while
  gradients were waiting in `.grad` (a hand-written SGD update);
- every learning-rate scheduler step (`schedulers`), what the loss function receives, and
  torch's own warning when a scheduler steps before its optimizer.

The chart only observes; `findings` turns its records into diagnoses.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.data import DataLoader

from forge_course.doctor.schedulers import SchedulerLog, watching_schedulers
from forge_course.doctor.sources import UNREADABLE, VAL, Sources

# torch warns with this wording (unchanged since 1.1) when `scheduler.step()` comes first.
SCHEDULER_WARNING = "`lr_scheduler.step()` before `optimizer.step()`"


@dataclass
class ForwardRecord:
    """One forward pass of the patient, as the doctor saw it."""

    source: str | None  # sources.TRAIN, VAL or BOTH: the data set its input rows came from
    phase: str | None  # the given loader that yielded last, for inputs matching no example
    epoch: int  # passes over the training loader started so far
    index: int  # forwards so far, this one included
    examples: int  # rows in its input (1 for an input without a batch dimension)
    grad_enabled: bool  # was autograd recording a graph?
    dropout_active: tuple[bool, ...]  # `training` flag of each Dropout module
    updates_before: int  # updates made before this forward
    backpropagated: bool = False  # did a backward pass run through this forward's output?
    updates_before_backward: int = 0  # updates made before backward reached it
    graph: weakref.ref | None = None  # alive exactly as long as the output's graph

    @property
    def training(self) -> bool:
        return self.backpropagated

    @property
    def validation(self) -> bool:
        """A forward on validation examples that no backward pass used.

        An input that matches no example (normalised by the loop, say) counts as validation when
        the validation loader yielded last: the best guess left.
        """
        from_val = self.source == VAL or (self.source is None and self.phase == VAL)
        return from_val and not self.backpropagated

    def age(self, updates: int) -> int:
        """Updates made since backward used this forward (or since it ran, if none did)."""
        since = self.updates_before_backward if self.backpropagated else self.updates_before
        return updates - since


@dataclass
class UpdateRecord:
    """One update of the parameters."""

    kind: str  # "step" (optimizer.step()), "closure" (a step that ran the model) or "manual"
    norm: float  # norm of the gradient in `.grad` when it was made (after any clipping)
    applied: bool  # did it find a non-zero gradient to apply?
    reapplied: bool  # were all the gradients it found already applied by an earlier update?
    loss_weights: list[float] = field(default_factory=list)  # weight of each loss since the last


@dataclass
class OptimizerRecord:
    """An optimizer that stepped, kept alive for the run so that its id stays its own."""

    optimizer: torch.optim.Optimizer
    params: frozenset[int]
    first_update: int  # number of the first update it made (1-based)


class _GraphTag:
    """A hook hung on a forward's output node, to learn when backward reaches it and when it dies.

    An autograd node holds its hooks, and the node lives as long as anything refers to it: the
    output, a loss computed from it, or a running total built from that loss. So a weak reference
    to the tag goes dead exactly when the graph is freed.
    """

    __slots__ = ("chart", "record", "__weakref__")

    def __init__(self, chart: Chart, record: ForwardRecord) -> None:
        self.chart = chart
        self.record = record

    def __call__(self, grad_outputs: tuple[torch.Tensor, ...]) -> None:
        if not self.record.backpropagated:
            self.record.backpropagated = True
            self.record.updates_before_backward = len(self.chart.updates)


class _LossTag:
    """A hook on a loss value's node: the gradient reaching it is the loss's weight in backward.

    ``(loss / 3).backward()`` gives 1/3; ``loss.backward()`` gives 1.
    """

    __slots__ = ("chart",)

    def __init__(self, chart: Chart) -> None:
        self.chart = chart

    def __call__(self, grad_outputs: tuple[torch.Tensor, ...]) -> None:
        grad = grad_outputs[0] if grad_outputs else None
        if isinstance(grad, torch.Tensor) and grad.numel() == 1 and grad.device.type != "meta":
            self.chart.loss_weights.append(float(grad))


class WatchedLoader(DataLoader):
    """A DataLoader that tells the chart when a pass starts and which batches it hands out.

    It stays a real `DataLoader` (length, dataset, batch size): a loop cannot tell the difference.
    """

    def __init__(self, dataset, *, chart: Chart, phase: str, **kwargs) -> None:
        super().__init__(dataset, **kwargs)
        self.chart = chart
        self.phase = phase

    def __iter__(self):
        self.chart.pass_started(self.phase)
        for batch in super().__iter__():
            self.chart.batch_yielded(self.phase, batch)
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


def _examples(args: tuple) -> int:
    inputs = [arg for arg in args if isinstance(arg, torch.Tensor)]
    return inputs[0].shape[0] if inputs and inputs[0].dim() > 1 else 1


def _norm(params) -> float:
    squares = 0.0
    for param in params:
        if param.grad is not None and param.grad.device.type != "meta":
            squares += float(param.grad.detach().float().pow(2).sum())
    return math.sqrt(squares)


class Chart:
    """Records of one run of a training loop on the patient. See the module docstring."""

    def __init__(
        self,
        device: torch.device,
        sources: Sources,
        epochs: int,
        batches_per_epoch: int,
        examples_per_epoch: int,
    ) -> None:
        self.device = device
        self.sources = sources
        self.epochs = epochs  # the epochs `fit` was asked for
        self.batches_per_epoch = batches_per_epoch  # len(train_loader)
        self.examples_per_epoch = examples_per_epoch  # len(train_loader.dataset)
        self.watching = False
        self.phase: str | None = None  # the given loader that yielded last
        self.epoch = 0
        self.batches: Counter[str] = Counter()  # phase -> batches yielded so far
        self.forwards: list[ForwardRecord] = []
        self.off_device: Counter[str] = Counter()  # "model input on cpu" -> times seen
        self.loss_calls = 0
        self.probability_calls = 0  # loss calls whose input rows were probabilities
        self.loss_weights: list[float] = []  # weights of the losses backpropagated since an update
        self.early_scheduler_steps = 0
        self.schedulers = SchedulerLog()
        self.updates: list[UpdateRecord] = []
        self.optimizers: dict[int, OptimizerRecord] = {}
        self.reused_at: set[int] = set()  # updates whose .grad still held an applied gradient
        self.discarded = 0  # gradients cleared from .grad before any update applied them
        self.leaks: dict[int, int] = {}  # epoch -> backward passes left over from the one before
        self.params: dict[int, tuple[str, nn.Parameter]] = {}  # id -> (name, parameter)
        self.covered: Counter[int] = Counter()  # id -> updates that held the parameter
        self.backwards: Counter[int] = Counter()  # id -> non-zero gradients received
        # id -> the backward passes currently summed in .grad: (epoch, covering updates then)
        self.in_grad: dict[int, list[tuple[int, int]]] = {}
        self.old_graphs = (0, "")  # most graphs kept from two updates back at once, and when
        self._versions: dict[int, int] = {}  # id -> parameter version after the last update
        self._step: list[bool] = []  # inside an optimizer step: [did it run the model?]
        self._alive: list[ForwardRecord] = []
        self._handles: list = []

    @property
    def grad_norms(self) -> list[float]:
        return [u.norm for u in self.updates]

    # -- loaders -----------------------------------------------------------------------------

    def pass_started(self, phase: str) -> None:
        if phase == "train":
            self.epoch += 1

    def batch_yielded(self, phase: str, batch) -> None:
        self.phase = phase
        self.batches[phase] += 1
        self.sources.remember(batch, phase)

    def after_fit(self) -> None:
        """Catch a last hand-written update, and count the graphs `fit`'s result keeps alive."""
        self._check_manual_update()
        self._note_old_graphs("after `fit` returned")

    def _note_old_graphs(self, when: str) -> None:
        self._alive = [r for r in self._alive if r.graph is not None and r.graph() is not None]
        updates = len(self.updates)
        count = sum(1 for r in self._alive if r.age(updates) >= 2)
        if count > self.old_graphs[0]:
            self.old_graphs = (count, when)

    # -- model ---------------------------------------------------------------------------------

    def _watch(self, model: nn.Module) -> None:
        # Checked at every forward, so a head swapped in by the loop is watched as well.
        for name, param in model.named_parameters():
            if param.requires_grad and id(param) not in self.params:
                self.params[id(param)] = (name, param)
                self._versions[id(param)] = param._version
                self._handles.append(param.register_hook(functools.partial(self._on_grad, param)))

    def _check_device(self, what: str, tensor: torch.Tensor) -> None:
        if not _on_device(tensor.device, self.device):
            self.off_device[f"{what} on {tensor.device}"] += 1

    def _source(self, args: tuple) -> str | None:
        inputs = [arg for arg in args if isinstance(arg, torch.Tensor)]
        source = self.sources.of(inputs[0]) if inputs else None
        return None if source == UNREADABLE else source

    def _before_forward(self, model: nn.Module, args: tuple) -> None:
        self._watch(model)
        if not self._step:
            self._check_manual_update()
        else:
            self._step[-1] = True
        for arg in args:
            if isinstance(arg, torch.Tensor):
                self._check_device("model input", arg)
        for param in model.parameters():
            self._check_device("weights", param)
        self._note_old_graphs(f"at forward {len(self.forwards) + 1}")
        dropout = tuple(m.training for m in model.modules() if isinstance(m, nn.Dropout))
        self.forwards.append(
            ForwardRecord(
                self._source(args),
                self.phase,
                self.epoch,
                len(self.forwards) + 1,
                _examples(args),
                torch.is_grad_enabled(),
                dropout,
                len(self.updates),
            )
        )

    def _after_forward(self, model: nn.Module, args: tuple, output) -> None:
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            record = self.forwards[-1]
            tag = _GraphTag(self, record)
            output.grad_fn.register_prehook(tag)
            record.graph = weakref.ref(tag)
            self._alive.append(record)

    # -- gradients and updates -----------------------------------------------------------------

    def _on_grad(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        # A tensor hook on a parameter runs before backward adds `grad` into `param.grad`, so
        # `param.grad` still shows what the loop left there.
        key = id(param)
        held = self.in_grad.setdefault(key, [])
        if _is_empty(param.grad):
            self.discarded += sum(steps == self.covered[key] for _, steps in held)
            held.clear()
        elif any(steps < self.covered[key] for _, steps in held):
            self.reused_at.add(len(self.updates) + 1)
        elif self.covered[key] and any(epoch < self.epoch for epoch, _ in held):
            leftover = sum(epoch < self.epoch for epoch, _ in held)
            self.leaks[self.epoch] = max(self.leaks.get(self.epoch, 0), leftover)
        if bool(grad.any()):
            # Inside a step (LBFGS's closure), the step in progress applies this gradient.
            held.append((self.epoch, self.covered[key] - (1 if self._step else 0)))
            self.backwards[key] += 1
            if self._step:
                self.updates[-1].applied = True

    def _pending(self, key: int) -> int:
        """Backward passes summed in a parameter's `.grad` that no update has applied yet."""
        return sum(steps == self.covered[key] for _, steps in self.in_grad.get(key, []))

    def _record_update(self, kind: str, params: list[nn.Parameter]) -> None:
        norm = _norm(params)
        # A step applies what is in `.grad` now; a hand-written update is only seen afterwards,
        # when `.grad` may already be cleared, so it counts the gradients that were waiting.
        pending = any(self._pending(id(p)) for p in params)
        applied = norm > 0 if kind == "step" else pending
        reapplied = applied and not pending
        self.updates.append(UpdateRecord(kind, norm, applied, reapplied, self.loss_weights))
        self.loss_weights = []
        for param in params:
            self.covered[id(param)] += 1

    def _check_manual_update(self) -> None:
        """A parameter whose values changed outside an optimizer while gradients waited in its
        `.grad` was updated by hand (``p -= lr * p.grad``): count that as an update."""
        changed = []
        for key, (_, param) in self.params.items():
            if param._version != self._versions.get(key):
                self._versions[key] = param._version
                if self._pending(key):
                    changed.append(param)
        if changed:
            self._record_update("manual", changed)

    def _before_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self._check_manual_update()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if id(optimizer) not in self.optimizers:
            ids = frozenset(id(p) for p in params)
            self.optimizers[id(optimizer)] = OptimizerRecord(optimizer, ids, len(self.updates) + 1)
        self._record_update("step", params)
        self._step.append(False)

    def _after_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        if self._step and self._step.pop():
            self.updates[-1].kind = "closure"
            self.loss_weights = []  # the closure's losses belong to the step that ran them
        elif self.updates[-1].reapplied:
            # `step()` twice for one backward: the second applies the same gradients again.
            # (LBFGS's closure refills `.grad` inside the step, so closures are left out.)
            self.reused_at.add(len(self.updates))
        for key, (_, param) in self.params.items():
            self._versions[key] = param._version

    def unapplied_backwards(self) -> int:
        """Most backward passes summed in an updated parameter's `.grad` since its last update."""
        worst = 0
        for key, (_, param) in self.params.items():
            if self.covered[key] and not _is_empty(param.grad):
                worst = max(worst, self._pending(key))
        return worst

    def never_stepped(self) -> list[str]:
        """Names of parameters that received gradients but were in no update."""
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
        if (
            scores is not None
            and scores.dim() >= 2
            and scores.is_floating_point()
            and scores.device.type != "meta"
        ):
            # Logits are unconstrained; rows that are all >= 0 and sum to 1 went through softmax.
            sums = scores.float().sum(dim=1)
            if bool((scores >= 0).all()) and torch.allclose(sums, torch.ones_like(sums), atol=1e-2):
                self.probability_calls += 1

    def _after_loss(self, loss_fn: nn.Module, args: tuple, output) -> None:
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            output.grad_fn.register_prehook(_LossTag(self))

    # -- attaching -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def attached(self, model: nn.Module, loss_fn: nn.Module) -> Iterator[Chart]:
        """Watch `model`, `loss_fn`, every optimizer and scheduler step and torch's warnings
        inside the block.

        Everything is detached on the way out, and warnings other than the scheduler one are
        shown again, so the loop's own warnings are not swallowed.
        """
        self._watch(model)
        self._handles += [
            model.register_forward_pre_hook(_Hook(self, self._before_forward)),
            model.register_forward_hook(_Hook(self, self._after_forward)),
            loss_fn.register_forward_pre_hook(_Hook(self, self._before_loss)),
            loss_fn.register_forward_hook(_Hook(self, self._after_loss)),
            register_optimizer_step_pre_hook(self._before_step),
            register_optimizer_step_post_hook(self._after_step),
        ]
        self.watching = True
        with (
            warnings.catch_warnings(record=True) as caught,
            watching_schedulers(lambda scheduler: self.schedulers.stepped(scheduler, self.epoch)),
        ):
            warnings.simplefilter("always")
            try:
                yield self
            finally:
                self.watching = False
                self.schedulers.finish()
                for handle in self._handles:
                    handle.remove()
                self._handles.clear()
        shown: dict = {}  # shared registry: a warning raised on every batch is shown once
        for w in caught:
            if SCHEDULER_WARNING in str(w.message):
                self.early_scheduler_steps += 1
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, registry=shown)
