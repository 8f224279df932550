"""Scores from a campaign's results and the reviewed equivalents; `benchmarks/VALIDITY.md`.

A mutant is *killed* when the exercise's test cell failed on it: the check's `Mistake`, another
exception, a timeout or a crash (a learner's test cell fails in each case, so each counts). It
is *equivalent* when it is listed, with the reason, in ``mutation/equivalent/chNN.toml``: no
check faithful to the exercise's text could tell it from the solution. Every other mutant the
test cell passes is a *survivor*: a wrong answer the check accepts.

    score = killed / (mutants - equivalent)
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mutmut brings the `toml` package there
    import toml as tomllib

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "mutation"
EQUIVALENT = REPO / "mutation" / "equivalent"
VALIDITY = REPO / "benchmarks" / "VALIDITY.md"
KILLED = ("mistake", "error", "timeout", "crashed")
GOAL = 0.95


def equivalents(chapter: str) -> dict[str, str]:
    """The reviewed equivalent mutants of ``chapter``: key -> reason."""
    path = EQUIVALENT / f"{chapter}.toml"
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text())["equivalent"]
    return {entry["key"]: entry["reason"] for entry in entries}


def score(exercise: dict, equivalent: dict[str, str]) -> dict:
    """Counts for one exercise's results, and its survivors."""
    mutants = exercise["mutants"]
    status = Counter(m["status"] for m in mutants)
    same = [m for m in mutants if m["key"] in equivalent]
    survivors = [m for m in mutants if m["status"] == "survived" and m["key"] not in equivalent]
    killed = sum(status[s] for s in KILLED)
    judged = len(mutants) - len(same)
    return {
        "mutants": len(mutants),
        "killed": killed,
        "by": {s: status[s] for s in KILLED},
        "survived": len(survivors),
        "equivalent": len(same),
        "equivalent_but_killed": [m["key"] for m in same if m["status"] in KILLED],
        "not_run": status["not run"],
        "score": killed / judged if judged else 1.0,
        "survivors": survivors,
    }


def load_results() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("ch*.json"))}


def _cell(text: str) -> str:
    if not text:
        return "(deleted)"
    text = text.replace("\n", " ⏎ ")
    if len(text) > 150:  # a moved block: its first lines say which it is
        text = text[:147] + "…"
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def render(results: dict[str, dict], chapters: list[str], total_seconds: float | None) -> str:
    lines = [
        "# Validity: mutation scores of every exercise's check",
        "",
        'Written by `make mutate` (`python -m mutation`; `make mutate CHAPTERS="ch04 ch06"`',
        "for some chapters). Each mutant is the solution's answer cell with one learner-like",
        "mistake (`mutation/operators.py`). It runs after the chapter's settings cell, then the",
        "exercise's test cell runs, hidden tests included, with `FORGE_GRADING_SEED` fixed.",
        "Killed: the test cell failed (the check's message, another exception, a timeout or a",
        "crash; the columns say which). Equivalent: reviewed, with the reason, in",
        "`mutation/equivalent/chNN.toml`. Score = killed / (mutants − equivalent); the goal is",
        f"at least {GOAL:.0%} for every exercise.",
        "",
    ]
    total = sum(result["seconds"] for result in results.values())
    lines += [f"The chapters' run times add up to {total / 60:.0f} min (table below)."]
    if total_seconds is not None:
        lines += [f"The last run, `python -m mutation {' '.join(chapters)}`, took "
                  f"{total_seconds / 60:.1f} min."]  # fmt: skip
    lines += [""]
    lines += [
        "| exercise | mutants | killed | by message / error / timeout / crash | survived "
        "| equivalent | score |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    survivors, notes = [], []
    for chapter, result in results.items():
        equivalent = equivalents(chapter)
        for exercise, data in result["exercises"].items():
            baseline = data["baseline"] or {"status": "not run"}
            if baseline["status"] != "survived":
                why = f"solution: {baseline['status']} {baseline.get('detail', '')[:80]}"
                lines.append(f"| {exercise} | {len(data['mutants'])} | – | {why} | – | – | – |")
                continue
            s = score(data, equivalent)
            by = " / ".join(str(s["by"][k]) for k in KILLED)
            mark = "" if s["score"] >= GOAL else " ✗"
            lines.append(
                f"| {exercise} | {s['mutants']} | {s['killed']} | {by} | {s['survived']} "
                f"| {s['equivalent']} | {s['score']:.0%}{mark} |"
            )
            for m in s["survivors"]:
                survivors.append(f"| {exercise} | {m['operator']} | {m['line']} "
                                 f"| {_cell(m['before'])} | {_cell(m['after'])} |")  # fmt: skip
            notes += [
                f"- {k}: listed as equivalent, but killed" for k in s["equivalent_but_killed"]
            ]
            if s["not_run"]:
                notes.append(f"- {exercise}: {s['not_run']} mutants not run")
    lines += ["", "## Where each chapter was measured", ""]
    lines += ["| chapter | date | machine | torch | parallel children | run time |",
              "| --- | --- | --- | --- | ---: | ---: |"]  # fmt: skip
    for chapter, result in results.items():
        lines.append(f"| {chapter} | {result['date']} | {result['machine']} | {result['torch']} "
                     f"| {result['jobs']} | {result['seconds'] / 60:.1f} min |")  # fmt: skip
    lines += ["", "## Survivors: wrong answers the checks accept", ""]
    lines += ["Line numbers count from the answer cell's first line.", ""]
    lines += ["| exercise | operator | line | solution | mutant |",
              "| --- | --- | ---: | --- | --- |"]  # fmt: skip
    lines += survivors or ["| – | – | – | – | – |"]
    if notes:
        lines += ["", "## Notes", "", *notes]
    return "\n".join(lines) + "\n"


def write(results: dict[str, dict], chapters: list[str], total_seconds: float | None) -> None:
    VALIDITY.write_text(render(results, chapters, total_seconds))
