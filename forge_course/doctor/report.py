"""The doctor's report: findings with stable codes, as text, as HTML and as plain data."""

from __future__ import annotations

import html
import re
import textwrap
from dataclasses import asdict, dataclass, field

# Every code the doctor can report, in report order, with its one-sentence explanation.
CODES: dict[str, str] = {
    "fit_raised": (
        "`fit` raised an exception, so the run stopped early and only what happened before it is "
        "reported."
    ),
    "loaders_not_iterated": (
        "`fit` never drew a batch from `train_loader` or `val_loader`, and the model never saw "
        "their examples, so there was nothing to examine: train on the loaders `fit` is given."
    ),
    "missing_zero_grad": (
        "`.grad` still held gradients that an earlier update had already applied, so every update "
        "used the running sum of all past gradients: call `optimizer.zero_grad()` once per update."
    ),
    "trains_on_validation": (
        "The model was trained on validation examples, so the validation numbers no longer "
        "measure anything unseen: backpropagate only losses of training batches, and keep "
        "`val_loader` for evaluation."
    ),
    "no_eval_mode": (
        "Validation ran with the model in train mode, so Dropout kept dropping units and the "
        "validation numbers are noisy: call `model.eval()` before validating."
    ),
    "train_mode_not_restored": (
        "Training ran with the model in eval mode (Dropout off), usually because validation "
        "switched it to eval and nothing switched it back. After validating, put each module's "
        "mode back as it was (chapter 06), or call `model.train()` at the start of every epoch."
    ),
    "grad_enabled_in_eval": (
        "Validation recorded an autograd graph, storing activations for a backward pass that never "
        "comes: wrap it in `torch.no_grad()` or `torch.inference_mode()`."
    ),
    "graph_kept_alive": (
        "Tensors that carry their autograd graph were kept across batches (a list of losses, "
        "`total += loss`), so memory grows with every step: keep `loss.item()` or `loss.detach()`."
    ),
    "stale_optimizer": (
        "Some parameters receive gradients but no optimizer step ever updates them, most likely "
        "because they were created after the optimizer: build it once the model is final."
    ),
    "no_learning": (
        "No update ever applied a non-zero gradient, so nothing was learned: check that "
        "`loss.backward()` runs on an output that is not detached or computed under "
        "`torch.no_grad()`, and that `optimizer.step()` follows it with no `zero_grad()` between."
    ),
    "step_once_per_epoch": (
        "`optimizer.step()` ran once per epoch instead of once per batch (it sits after the "
        "batch loop), so the model made a single update from a whole epoch's gradients: move "
        "`optimizer.step()` (and `zero_grad()`) into the batch loop."
    ),
    "accumulation_unscaled": (
        "Gradients of several batches were summed into one update without dividing each loss by "
        "the number of batches summed, so each update was that many times too large: divide the "
        "loss by the accumulation steps (the last group's size for a short last group)."
    ),
    "optimizer_rebuilt": (
        "A new optimizer was built during training (every epoch or every batch), so its state "
        "(momentum, Adam's running averages) started from zero each time: build the optimizer "
        "once, before the epoch loop."
    ),
    "scheduler_wrong_rate": (
        "A learning-rate scheduler was stepped at the wrong rate: its schedule is sized in epochs "
        "but it was stepped after every batch, or sized in batches but stepped once per epoch. "
        "Step it as often as its length counts (or size it in the unit you step it in)."
    ),
    "softmax_before_cross_entropy": (
        "The loss received probabilities, but `CrossEntropyLoss` applies log-softmax itself and "
        "expects raw scores (logits): pass the model's output to it unchanged."
    ),
    "wrong_device": (
        "Tensors were not on the device the loop was asked to use: move the model and every batch "
        "with `.to(device)`."
    ),
    "scheduler_before_optimizer": (
        "A learning-rate scheduler stepped before the first `optimizer.step()`, which skips the "
        "first value of its schedule: call `scheduler.step()` after `optimizer.step()`."
    ),
    "accumulation_tail_leak": (
        "The last, partial accumulation group of an epoch is never stepped, so its gradients stay "
        "in `.grad` and leak into the next epoch's first update: also step at the end of the epoch."
    ),
}


@dataclass(frozen=True)
class Finding:
    """One diagnosis: a stable `code`, its explanation, and what the doctor saw in this run."""

    code: str
    message: str
    evidence: str


@dataclass
class Report:
    """The findings of one examination, in the order of `CODES`, and what the doctor observed.

    `seen` counts what the instruments saw (training and validation forwards, optimizer steps,
    epochs), so an empty report can be told apart from a loop the doctor could not watch.
    """

    findings: list[Finding]
    seen: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the doctor found nothing."""
        return not self.findings

    @property
    def codes(self) -> list[str]:
        """The finding codes, in report order."""
        return [f.code for f in self.findings]

    def to_dict(self) -> dict:
        """Plain, JSON-able data: ``ok``, ``findings`` (code, message, evidence) and ``seen``."""
        return {
            "ok": self.ok,
            "findings": [asdict(f) for f in self.findings],
            "seen": dict(self.seen),
        }

    def _headline(self) -> str:
        n = len(self.findings)
        verdict = "no findings" if n == 0 else f"{n} finding" + ("s" if n > 1 else "")
        seen = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in self.seen.items())
        return f"Loop doctor: {verdict}" + (f" ({seen})" if seen else "")

    def __str__(self) -> str:
        width = max([len(c) for c in self.codes], default=0) + 2
        indent = " " * (width + 2)
        wrap = textwrap.TextWrapper(100, subsequent_indent=indent, break_on_hyphens=False)
        lines = [self._headline()]
        for f in self.findings:
            wrap.initial_indent = f"  {f.code:<{width}}"
            lines.append(wrap.fill(f.message))
            wrap.initial_indent = indent
            lines.append(wrap.fill(f"seen: {f.evidence}"))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td><code>{f.code}</code></td><td>{_html(f.message)}</td>"
            f"<td>{_html(f.evidence)}</td></tr>"
            for f in self.findings
        )
        table = (
            "<table><thead><tr><th>code</th><th>finding</th><th>seen</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            if rows
            else ""
        )
        return f"<p><b>{html.escape(self._headline())}</b></p>{table}"


def _html(text: str) -> str:
    """Escape `text` for HTML and show its `backquoted` parts as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
