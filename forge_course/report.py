"""`forge-course report`: what a graded class got wrong, one self-contained page per chapter.

Read after `forge-course grade`, from its signed ledger (`run.read_ledger`: an entry whose
signature fails never reaches a report), or, read-only, from nbgrader's gradebook for a class
graded by plain ``nbgrader autograde``. The gradebook holds scores only: statuses and mistakes
are then marked "not available", never guessed from the points.

Writes ``grading/report/<chapter>.html`` (figures embedded as PNG: no server, no network),
``<chapter>-questions.csv`` (one row per exercise), ``<chapter>-mistakes.csv`` (one row per
mistake and exercise) and ``<chapter>-students.csv`` (one row per student, one column per
exercise: the layout of an LMS's grade import).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import csv
import datetime
import html
import io
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

NOT_AVAILABLE = "not available"
STATUSES = [
    "graded",
    "wrong",
    "timeout",
    "resource limit",
    "crashed",
    "tampered",
    "malformed",
    "missing",
    "grader error",
]
BY_HAND = {"tampered", "grader error"}  # statuses an instructor must read for themselves
WEAK_DISCRIMINATION = 0.2  # below this, an exercise hardly separates strong from weak students
ALMOST_NOBODY, ALMOST_EVERYBODY = 0.1, 0.9  # shares at full marks that tell little
SOMETHING_ELSE = "; something else differs too"


@dataclass
class Student:
    id: str
    results: dict[str, dict]  # test cell -> {status, points, max_points, message}


@dataclass
class Exercise:
    name: str
    max_points: float
    points: list[float]
    statuses: Counter
    mistakes: Counter = field(default_factory=Counter)  # named mistake -> students
    unnamed: Counter = field(default_factory=Counter)  # a message's first line -> students
    examples: dict[str, str] = field(default_factory=dict)  # mistake -> one student's message
    discrimination: float | None = None

    @property
    def mean(self) -> float:
        return statistics.fmean(self.points)

    def share(self, value: float) -> float:
        return sum(p == value for p in self.points) / len(self.points)

    def flag(self) -> str:
        full = self.share(self.max_points)
        if full <= ALMOST_NOBODY:
            return "almost nobody solves it"
        if full >= ALMOST_EVERYBODY:
            return "almost everybody solves it"
        if self.discrimination is None or self.discrimination < WEAK_DISCRIMINATION:
            return "does not separate strong from weak students"
        return ""


@dataclass
class Class:
    assignment: str
    source: str  # "ledger" or "gradebook"
    students: list[Student]
    unverified: list[str]  # submissions without a genuine, current ledger entry
    run: dict[str, str]


def discrimination(item: list[float], totals: list[float]) -> float | None:
    """The corrected item–total correlation: Pearson's r between an exercise's points and the
    rest of each student's chapter total (the total less this exercise), so an exercise is not
    correlated with itself. None where either side never varies (r is undefined there)."""
    rest = [t - i for i, t in zip(item, totals, strict=True)]
    if len(item) < 2:
        return None
    mean_item, mean_rest = statistics.fmean(item), statistics.fmean(rest)
    cov = sum((i - mean_item) * (r - mean_rest) for i, r in zip(item, rest))
    var_item = sum((i - mean_item) ** 2 for i in item)
    var_rest = sum((r - mean_rest) ** 2 for r in rest)
    if var_item == 0 or var_rest == 0:
        return None
    return cov / math.sqrt(var_item * var_rest)


def named_mistake(message: str, hint: str = "") -> str | None:
    """The mistake a failure's message names, or None where the check could not name one (its
    generic ``hint`` is a suggestion, not a diagnosis)."""
    if "Likely mistake: " in message:
        named = message.split("Likely mistake: ", 1)[1].strip().removesuffix(SOMETHING_ELSE)
        generic = hint and (named == hint or (named.endswith("…") and hint.startswith(named[:-1])))
        return None if generic else named
    first = message.splitlines()[0] if message else ""
    slip = re.match(r".* is not right[:.] (.+)", first)  # check_number's hints, check_choice's
    return slip.group(1).strip() if slip else None


def _hints(assignment: str) -> dict[str, str]:
    """Each test cell's generic hint, read from the chapter's checks without importing them
    (they import PyTorch: seconds): the ``hint=`` of each ``Exercise(grade_id=..., ...)`` in
    ``forge_course/grading/chNN.py``. ``ch04_train_step_tests`` checks ``ch04_train_step``."""
    path = Path(__file__).parent / "grading" / f"{assignment[:4]}.py"
    if not path.exists():
        return {}
    hints = {}
    for call in ast.walk(ast.parse(path.read_text())):
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Exercise":
            words = {k.arg: k.value for k in call.keywords}
            if all(isinstance(words.get(k), ast.Constant) for k in ("grade_id", "hint")):
                hints[f"{words['grade_id'].value}_tests"] = words["hint"].value
    return hints


def from_ledger(assignment: str, grading: Path, submitted: Path | None) -> Class:
    from forge_course.grader import ledger

    records = {r["student"]: r for r in ledger.read_ledger(grading / "forge", assignment)}
    unverified = []
    if submitted is not None and submitted.is_dir():
        for name, _, _ in ledger.discover(submitted, [assignment]):
            if ledger.student_id(name) not in records:
                unverified.append(ledger.student_id(name))
    keys = [r["key"] for r in records.values()]
    seed_file = grading / "forge" / "seed"
    finished = grading / "grades.csv"
    run_info = {
        "instructor version": _one_of(k.get("instructor", "")[:12] for k in keys),
        "grader version": _one_of(k.get("grader", "")[:12] for k in keys),
        "seed": _one_of(str(k.get("seed", "")) for k in keys)
        or (seed_file.read_text().strip() if seed_file.exists() else ""),
        "finished": _mtime(finished) if finished.exists() else NOT_AVAILABLE,
        "--jobs and time taken": "not recorded by forge-course grade",
    }
    students = [Student(s, records[s]["results"]) for s in sorted(records)]
    return Class(assignment, "ledger", students, sorted(unverified), run_info)


def from_gradebook(assignment: str, gradebook: Path) -> Class:
    """The scores nbgrader's gradebook holds, opened read-only with SQLite itself (nbgrader's
    own `Gradebook` runs the ``alembic`` command first: seconds, and it may write)."""
    import sqlite3

    # A grade's score as nbgrader counts it (`nbgrader.api.Grade.score`): the manual score if
    # an instructor gave one, else the automatic one, plus any extra credit.
    query = """
        SELECT sa.student_id, cell.name,
               COALESCE(g.manual_score, g.auto_score) + COALESCE(g.extra_credit, 0), gc.max_score
        FROM grade g
        JOIN submitted_notebook sn ON g.notebook_id = sn.id
        JOIN submitted_assignment sa ON sn.assignment_id = sa.id
        JOIN assignment a ON sa.assignment_id = a.id
        JOIN base_cell cell ON g.cell_id = cell.id
        JOIN grade_cells gc ON gc.id = cell.id
        WHERE a.name = ? ORDER BY sa.student_id, cell.rowid"""
    found: dict[str, dict] = {}
    if gradebook.exists():
        with contextlib.closing(sqlite3.connect(f"{gradebook.as_uri()}?mode=ro", uri=True)) as db:
            for student, cell, score, top in db.execute(query, (assignment,)):
                found.setdefault(student, {})[cell] = {
                    "status": NOT_AVAILABLE,
                    "points": score or 0.0,
                    "max_points": top,
                    "message": "",
                }
    run_info = {
        "graded by": "nbgrader autograde (its gradebook)",
        "gradebook changed": _mtime(gradebook) if gradebook.exists() else NOT_AVAILABLE,
        "instructor version, grader version, seed, --jobs, time taken": NOT_AVAILABLE,
    }
    students = [Student(s, results) for s, results in sorted(found.items())]
    return Class(assignment, "gradebook", students, [], run_info)


def _one_of(values) -> str:
    found = sorted(set(values))
    return found[0] if len(found) == 1 else ", ".join(found)


def _mtime(path: Path) -> str:
    when = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def exercises(cls: Class) -> list[Exercise]:
    """Per-exercise figures of the students who have a result (in the notebook's order)."""
    names = list(dict.fromkeys(c for s in cls.students for c in s.results))
    totals = [sum(r["points"] for r in s.results.values()) for s in cls.students]
    hints = _hints(cls.assignment) if cls.source == "ledger" else {}
    found = []
    for name in names:
        rows = [s.results.get(name) for s in cls.students]
        ex = Exercise(
            name,
            max(r["max_points"] for r in rows if r),
            [r["points"] if r else 0.0 for r in rows],
            Counter(r["status"] if r else "missing" for r in rows),
        )
        ex.discrimination = discrimination(ex.points, totals)
        for r in rows:
            if not r or r["status"] in ("graded", NOT_AVAILABLE):
                continue
            mistake = named_mistake(r["message"], hints.get(name, ""))
            if mistake is not None:
                ex.mistakes[mistake] += 1
            elif r["status"] == "wrong":
                mistake = (r["message"].splitlines() or [""])[0]
                ex.unnamed[mistake] += 1
            else:
                continue
            ex.examples.setdefault(mistake, r["message"])
        found.append(ex)
    return found


def by_hand(cls: Class) -> list[tuple[str, str]]:
    """(student, why) for the submissions an instructor must look at themselves."""
    found = [(s, "no genuine ledger entry for the notebook submitted") for s in cls.unverified]
    for s in cls.students:
        statuses = {r["status"] for r in s.results.values()}
        why = sorted(statuses & BY_HAND)
        if statuses == {"timeout"}:
            why.append("every exercise timed out")
        if why:
            found.append((s.id, ", ".join(why)))
    return found


# --- the CSV files ------------------------------------------------------------------------


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # as `forge_course.grader.export`'s


def csv_text(rows: list[list]) -> str:
    """Every field quoted, and text a spreadsheet would run as a formula led by ``'``: as
    `forge_course.grader.export.csv_text` writes (which imports nbgrader: seconds)."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for row in rows:
        writer.writerow([v if type(v) in (int, float) else _safe(str(v)) for v in row])
    return out.getvalue()


def _safe(text: str) -> str:
    text = text.replace("\r", " ").replace("\n", " ")
    return "'" + text if text.startswith(FORMULA_START) else text


def _r(x: float | None) -> float | str:
    return "" if x is None else round(x, 4)


def questions_csv(cls: Class, found: list[Exercise]) -> list[list]:
    status_columns = STATUSES if cls.source == "ledger" else []
    rows = [
        [
            "exercise",
            "max_points",
            "students",
            "mean",
            "median",
            "share_zero",
            "share_full",
            "discrimination",
            "flag",
            *status_columns,
            "named_mistakes",
            "unnamed_failures",
        ]
    ]
    for ex in found:
        statuses = [ex.statuses[s] for s in status_columns]
        mistakes = [sum(ex.mistakes.values()), sum(ex.unnamed.values())]
        rows.append(
            [
                ex.name,
                ex.max_points,
                len(ex.points),
                _r(ex.mean),
                _r(statistics.median(ex.points)),
                _r(ex.share(0.0)),
                _r(ex.share(ex.max_points)),
                _r(ex.discrimination),
                ex.flag(),
                *statuses,
                *(mistakes if cls.source == "ledger" else [NOT_AVAILABLE] * 2),
            ]
        )
    return rows


def mistakes_csv(cls: Class, found: list[Exercise]) -> list[list]:
    rows = [["exercise", "mistake", "named", "students", "share", "example_feedback"]]
    n = len(cls.students)
    for ex in found:
        for named, counter in ((True, ex.mistakes), (False, ex.unnamed)):
            for mistake, count in counter.most_common():
                rows.append(
                    [
                        ex.name,
                        mistake,
                        "yes" if named else "no",
                        count,
                        _r(count / n),
                        ex.examples[mistake],
                    ]
                )
    return rows


def students_csv(cls: Class, found: list[Exercise]) -> list[list]:
    """One row per student: the id, then one column per exercise, then the chapter's total."""
    rows = [["student_id", *(ex.name for ex in found), f"{cls.assignment} total"]]
    for s in cls.students:
        points = [s.results[ex.name]["points"] if ex.name in s.results else 0.0 for ex in found]
        rows.append([s.id, *points, sum(points)])
    return rows


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


def page(
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


def summary(found: list[Exercise]) -> list[str]:
    """What an instructor reads first: the three lowest means, the three commonest mistakes."""
    lowest = sorted(found, key=lambda ex: ex.mean / ex.max_points if ex.max_points else 1)[:3]
    lines = [
        "Lowest means: "
        + "; ".join(f"{ex.name} {ex.mean:.2f} of {ex.max_points:g}" for ex in lowest)
    ]
    common = Counter({(ex.name, m): c for ex in found for m, c in ex.mistakes.items()})
    if common:
        lines += ["Most frequent named mistakes:"] + [
            f"  {count} × {name}: {mistake}" for (name, mistake), count in common.most_common(3)
        ]
    elif any(ex.statuses[NOT_AVAILABLE] for ex in found):
        lines.append(f"Named mistakes: {NOT_AVAILABLE} (nbgrader's gradebook does not keep them).")
    else:
        lines.append("No named mistakes: no wrong answer the checks could name.")
    return lines


def report(
    assignment: str, grading: Path, submitted: Path | None = None, gradebook: bool = False
) -> tuple[Path, list[str]]:
    """Write the chapter's page and CSV files; return the page's path and the summary."""
    if gradebook or not (grading / "forge" / assignment).is_dir():
        cls = from_gradebook(assignment, grading / "gradebook.db")
    else:
        cls = from_ledger(assignment, grading, submitted)
    out = grading / "report"
    out.mkdir(parents=True, exist_ok=True)
    found = exercises(cls)
    if not found:
        lines = [f"{assignment}: no graded submission to report on."]
        (out / f"{assignment}.html").write_text(
            f"<!DOCTYPE html><html lang='en'><meta charset='utf-8'><title>{assignment}</title>"
            f"<p>{html.escape(lines[0])}</p></html>\n"
        )
        return out / f"{assignment}.html", lines
    (out / f"{assignment}-questions.csv").write_text(csv_text(questions_csv(cls, found)))
    (out / f"{assignment}-mistakes.csv").write_text(csv_text(mistakes_csv(cls, found)))
    (out / f"{assignment}-students.csv").write_text(csv_text(students_csv(cls, found)))
    (out / f"{assignment}.html").write_text(page(cls, found, figures(cls, found), grading))
    return out / f"{assignment}.html", summary(found)
