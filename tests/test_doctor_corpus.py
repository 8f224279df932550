"""The loop doctor on its labelled corpus: loops written the way other people write them.

Each file in `tests/doctor_corpus/` defines one `fit` and says, in an ``# expect:`` line, the
exact codes the doctor must report (``none`` for a correct loop). The first test asserts every
label, one test per loop; the last measures recall and precision over the whole corpus.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

from forge_course.doctor import CODES, diagnose

CORPUS = Path(__file__).parent / "doctor_corpus"
RECALL_GOAL = 0.90
PRECISION_GOAL = 0.95


@dataclass(frozen=True)
class Loop:
    """One corpus file: its `fit`, the codes it must get, and the device the doctor asks for."""

    name: str
    path: Path
    expected: frozenset[str]
    device: str | None

    @property
    def correct(self) -> bool:
        return not self.expected


def _header(path: Path, key: str) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return None


def _load(path: Path) -> Loop:
    expect = _header(path, "expect")
    assert expect is not None, f"{path.name} has no '# expect:' line"
    codes = frozenset() if expect == "none" else frozenset(c.strip() for c in expect.split(","))
    return Loop(path.stem, path, codes, _header(path, "device"))


LOOPS = [_load(path) for path in sorted(CORPUS.glob("*.py"))]


@functools.cache
def findings_of(name: str) -> frozenset[str]:
    """The codes the doctor reports for one loop (each loop is examined once per session)."""
    loop = next(loop for loop in LOOPS if loop.name == name)
    spec = importlib.util.spec_from_file_location(f"_doctor_corpus_{name}", loop.path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return frozenset(diagnose(module.fit, device=loop.device).codes)


def scores(loops: list[Loop]) -> dict[str, float]:
    """Recall and precision over (loop, code) pairs, and the correct loops that got a finding."""
    hits = missed = wrong = 0
    flagged = []
    for loop in loops:
        found = findings_of(loop.name)
        hits += len(found & loop.expected)
        missed += len(loop.expected - found)
        wrong += len(found - loop.expected)
        if loop.correct and found:
            flagged.append(loop.name)
    return {
        "recall": hits / (hits + missed),
        "precision": hits / (hits + wrong) if hits + wrong else 1.0,
        "findings": hits + wrong,
        "bugs": hits + missed,
        "flagged_correct_loops": flagged,
    }


def test_the_corpus_is_large_varied_and_covers_every_code():
    correct = [loop for loop in LOOPS if loop.correct]
    assert len(LOOPS) >= 40 and len(correct) >= 15 and len(LOOPS) - len(correct) >= 25
    labelled = set().union(*(loop.expected for loop in LOOPS))
    assert labelled == set(CODES), (
        f"no such code: {labelled - set(CODES)}, unused: {set(CODES) - labelled}"
    )
    assert all(loop.name.startswith("ok_" if loop.correct else "bug_") for loop in LOOPS)


@pytest.mark.parametrize("loop", LOOPS, ids=[loop.name for loop in LOOPS])
def test_the_doctor_reports_exactly_the_labelled_codes(loop):
    found = findings_of(loop.name)
    assert found == loop.expected, (
        f"{loop.name}: missed {sorted(loop.expected - found)}, "
        f"wrongly reported {sorted(found - loop.expected)}"
    )


def test_recall_and_precision_meet_the_goal():
    measured = scores(LOOPS)
    assert measured["flagged_correct_loops"] == []
    assert measured["recall"] >= RECALL_GOAL, measured
    assert measured["precision"] >= PRECISION_GOAL, measured
