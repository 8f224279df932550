"""The report's page: one self-contained HTML file, its figures embedded as PNG (no server, no
network), in the course's colour-blind-safe palette, every axis labelled."""

from __future__ import annotations

import base64
import html
import io
import statistics
from pathlib import Path

from forge_course.report.results import NOT_AVAILABLE, STATUSES, Class, Exercise, by_hand, summary

# --- the page ---------------------------------------------------------------------------


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)  # fixed margins: a tight box draws it twice
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f"data:image/png;base64,{data}"


def figures(cls: Class, found: list[Exercise]) -> list[tuple[str, str]]:
    """(alt text, PNG data URL): the class's totals, then each exercise's points."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from forge_course.sims.display import PALETTE

    totals = [sum(r["points"] for r in s.results.values()) for s in cls.students]
    top = sum(ex.max_points for ex in found)
    fig = Figure(figsize=(6, 2.8))
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.2, top=0.88)
    ax = fig.add_subplot()
    ax.hist(totals, bins=max(1, int(top)) + 1, range=(-0.5, top + 0.5), color=PALETTE["blue"])
    ax.set_xlabel(f"chapter score (points out of {top:g})")
    ax.set_ylabel("students")
    ax.set_title("Scores of the class")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    shown = [("Histogram of the class's chapter scores", _png(fig))]
    fig = Figure(figsize=(2.6 * len(found), 2.6))
    fig.subplots_adjust(left=0.6 / len(found), right=0.98, bottom=0.2, top=0.88, wspace=0.45)
    for i, ex in enumerate(found):
        ax = fig.add_subplot(1, len(found), i + 1)
        full = [p == ex.max_points for p in ex.points]
        ax.hist(
            [
                [p for p, f in zip(ex.points, full) if f],
                [p for p, f in zip(ex.points, full) if not f],
            ],
            bins=max(1, int(ex.max_points)) + 1,
            range=(-0.5, ex.max_points + 0.5),
            stacked=True,
            color=[PALETTE["green"], PALETTE["vermillion"]],
        )
        ax.set_xlabel(f"points (of {ex.max_points:g})")
        ax.set_ylabel("students")
        ax.set_title(ex.name, fontsize=8)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # students are counted whole
    shown.append(
        ("Histogram of each exercise's points: full marks green, less vermillion", _png(fig))
    )
    return shown


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{c if isinstance(c, _Html) else html.escape(str(c))}</td>" for c in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


class _Html(str):
    """Text already written as HTML (a link), not to be escaped again."""


def _percent(x: float) -> str:
    return f"{100 * x:.0f}%"


def render(
    cls: Class, found: list[Exercise], shown: list[tuple[str, str]], grading: Path | None = None
) -> str:
    """The HTML page; feedback pages are linked where they exist under ``grading``."""
    title = f"{cls.assignment}: what the class got wrong"
    n = len(cls.students)
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{n} student(s) with a verified result, read from the {cls.source}.</p>",
    ]
    parts += ["<h2>First look</h2>", *[f"<p>{html.escape(line)}</p>" for line in summary(found)]]
    parts += [f"<img src='{src}' alt='{html.escape(alt)}'>" for alt, src in shown]
    parts += [
        "<h2>Exercises</h2>",
        _table(
            [
                "exercise",
                "points",
                "students",
                "mean",
                "median",
                "at zero",
                "at full marks",
                "discrimination",
                "flag",
            ],
            [
                [
                    ex.name,
                    f"{ex.max_points:g}",
                    len(ex.points),
                    f"{ex.mean:.2f}",
                    f"{statistics.median(ex.points):g}",
                    _percent(ex.share(0.0)),
                    _percent(ex.share(ex.max_points)),
                    "not defined (no spread)"
                    if ex.discrimination is None
                    else f"{ex.discrimination:.2f}",
                    ex.flag(),
                ]
                for ex in found
            ],
        ),
    ]
    parts.append(
        "<p>Discrimination is the correlation between an exercise's points and the rest of the "
        "chapter's score: near 0 (or negative), strong and weak students do about as well.</p>"
    )
    if cls.source == "gradebook":
        parts.append(
            f"<h2>Statuses and mistakes</h2><p>{NOT_AVAILABLE}: nbgrader's gradebook "
            "keeps scores, not the reason for a zero or the mistake made.</p>"
        )
    else:
        parts += [
            "<h2>Statuses</h2>",
            _table(
                ["exercise", *STATUSES],
                [[ex.name, *(ex.statuses[s] for s in STATUSES)] for ex in found],
            ),
        ]
        parts += ["<h2>Mistakes</h2>", *_mistakes(found, n)]
        parts += ["<h2>To look at by hand</h2>", _by_hand(cls, grading)]
    parts += ["<h2>The grading run</h2>", _table(["", ""], [[k, v] for k, v in cls.run.items()])]
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:75em}td,th{padding:.3em .5em;"
        "border:1px solid #ccc;vertical-align:top;text-align:left}table{border-collapse:"
        "collapse;margin:1em 0}img{max-width:100%;display:block;margin:1em 0}"
        "pre{white-space:pre-wrap;margin:0}"
    )
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{style}</style></head><body>"
        + "".join(parts)
        + "</body></html>\n"
    )


def _mistakes(found: list[Exercise], n: int) -> list[str]:
    parts = []
    for ex in found:
        if not ex.mistakes and not ex.unnamed:
            continue
        rows = [
            [
                m,
                "named" if named else "not named (first line)",
                c,
                _percent(c / n),
                _Html(
                    f"<details><summary>feedback</summary><pre>"
                    f"{html.escape(ex.examples[m])}</pre></details>"
                ),
            ]
            for named, counter in ((True, ex.mistakes), (False, ex.unnamed))
            for m, c in counter.most_common()
        ]
        parts += [
            f"<h3>{html.escape(ex.name)}</h3>",
            _table(["mistake", "", "students", "of the class", "what they saw"], rows),
        ]
    return parts or ["<p>No wrong answers: nobody made a mistake the checks could see.</p>"]


def _by_hand(cls: Class, grading: Path | None) -> str:
    rows = []
    for student, why in by_hand(cls):
        feedback = Path("feedback", student, cls.assignment, f"{cls.assignment}.html")
        cell = html.escape(student)
        if grading is None or (grading / feedback).is_file():
            cell = f"<a href='../{html.escape(feedback.as_posix())}'>{cell}</a>"
        rows.append([_Html(cell), why])
    return _table(["student", "why"], rows) if rows else "<p>None.</p>"
