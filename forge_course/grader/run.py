"""`forge-course grade`: grade a class in parallel, record every score once, resume after a kill.

Layout (nbgrader's): ``grading/submitted/<student>/<assignment>/<notebook>.ipynb``. For each
submission the grader writes, in order:

1. a ledger entry ``grading/forge/<assignment>/<student>.json`` (atomically, with the
   notebook's SHA-256), so a restarted run skips what is done and loses nothing;
2. the scores into nbgrader's gradebook (``nbgrader export`` and the Formgrader see them);
3. feedback ``grading/feedback/<student>/<assignment>/<assignment>.html``: each test's status
   and message, never the code of hidden tests;
4. nbgrader's autograded copy ``grading/autograded/<student>/<assignment>/``, each verdict as
   its test cell's output, for instructors who prefer ``nbgrader generate_feedback``'s pages;

and at the end ``grading/grades.csv`` with one row per test cell and its status.
"""

from __future__ import annotations

import contextlib
import csv
import html
import json
import os
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

import nbformat

from forge_course.grader import assignment as assignments
from forge_course.grader import sandbox
from forge_course.grader.submission import CellResult, as_dict, fingerprint, grade_notebook
from forge_course.release import REPO, build_sources, chapter_ids


def grading_dir(course_root: Path = REPO) -> Path:
    return Path(os.environ.get("FORGE_GRADING_DIR", course_root / "grading"))


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f.name, path)


@contextmanager
def _env(**values: str):
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _ensure_in_gradebook(course_root: Path, grading: Path, assignment_id: str) -> None:
    """Put the assignment and its cells in the gradebook, without touching notebooks/."""
    from nbgrader.api import Gradebook, MissingEntry

    db = f"sqlite:///{grading / 'gradebook.db'}"
    with Gradebook(db) as gb:
        try:
            gb.find_notebook(assignment_id, assignment_id)
            return
        except MissingEntry:
            pass
    from forge_course.release import generate_release

    with tempfile.TemporaryDirectory() as tmp:
        build_sources(course_root, Path(tmp) / "build" / "source")
        with _env(FORGE_GRADING_DIR=str(grading)):
            generate_release(Path(tmp), [assignment_id])


def _record(grading: Path, assignment_id: str, student: str, results: dict[str, CellResult]):
    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy.exc import SAWarning

    with Gradebook(f"sqlite:///{grading / 'gradebook.db'}") as gb, warnings.catch_warnings():
        # nbgrader's own models trigger a harmless autoflush warning when a submission is new.
        warnings.simplefilter("ignore", SAWarning)
        gb.update_or_create_student(student)
        try:
            gb.find_submission(assignment_id, student)
        except MissingEntry:
            gb.add_submission(assignment_id, student)
        notebook = gb.find_submission_notebook(assignment_id, assignment_id, student)
        for grade in notebook.grades:
            result = results.get(grade.name)
            grade.auto_score = result.points if result else 0.0
        gb.db.commit()


def _feedback(grading: Path, assignment_id: str, student: str, results: dict) -> None:
    rows = []
    for cell, r in results.items():
        message = html.escape(r["message"]).replace("\n", "<br>")
        rows.append(
            f"<tr class='{r['status'].replace(' ', '-')}'><td>{html.escape(cell)}</td>"
            f"<td>{html.escape(r['status'])}</td><td>{r['points']:g} / {r['max_points']:g}</td>"
            f"<td>{message}</td></tr>"
        )
    earned = sum(r["points"] for r in results.values())
    total = sum(r["max_points"] for r in results.values())
    page = (
        f"<!DOCTYPE html><html lang='en'><meta charset='utf-8'>"
        f"<title>{html.escape(assignment_id)}: feedback for {html.escape(student)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:.4em;border:1px solid #ccc;"
        "vertical-align:top}.graded td:nth-child(2){color:#009E73}"
        "td:nth-child(2){color:#D55E00}</style>"
        f"<h1>{html.escape(assignment_id)}</h1><p>{html.escape(student)}: "
        f"<b>{earned:g} of {total:g} points</b></p>"
        "<table><tr><th>test</th><th>status</th><th>points</th><th>what to look at</th></tr>"
        + "".join(rows)
        + "</table></html>\n"
    )
    path = grading / "feedback" / student / assignment_id / f"{assignment_id}.html"
    _write_atomically(path, page)


def hidden_paths(course_root: Path, grading: Path) -> list[Path]:
    """What no submission may read: solutions, built sources with hidden tests, the tests, and
    the grading workspace (gradebook, other submissions, ledger, feedback)."""
    return [course_root / "solutions", course_root / "build", course_root / "tests", grading]


def _autograded(
    grading: Path, assignment_id: str, student: str, submitted: Path | None, results: dict
) -> None:
    """nbgrader's autograded copy, so ``nbgrader generate_feedback`` works on our verdicts: the
    instructor's notebook with the learner's answers in it and each verdict as a test's output
    (the feedback step clears hidden tests, as after ``nbgrader autograde``)."""
    source = nbformat.read(grading / "source" / assignment_id / f"{assignment_id}.ipynb", 4)
    answers = {}
    with contextlib.suppress(Exception):  # a malformed submission keeps no answers
        for cell in nbformat.read(submitted, as_version=4).cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution") and meta.get("grade_id"):
                answers[meta["grade_id"]] = cell.get("source", "")
    for cell in source.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            verdict = results.get(grade_id)
            if verdict and verdict["status"] != "graded":
                text = verdict["message"] or verdict["status"]
                cell.outputs = [nbformat.v4.new_output(
                    "error", ename=verdict["status"].capitalize(), evalue=text,
                    traceback=[f"{verdict['status']}: {text}"])]  # fmt: skip
    path = grading / "autograded" / student / assignment_id / f"{assignment_id}.ipynb"
    _write_atomically(path, nbformat.writes(source))


def discover(submitted: Path, only: list[str] | None) -> list[tuple[str, str, Path]]:
    """(student, assignment, folder) for every submission folder."""
    found = []
    for student in sorted(p for p in submitted.iterdir() if p.is_dir()):
        for folder in sorted(p for p in student.iterdir() if p.is_dir()):
            if only is None or folder.name in only:
                found.append((student.name, folder.name, folder))
    return found


def grade(
    assignment_ids: list[str] | None = None,
    *,
    course_root: Path = REPO,
    submitted: Path | None = None,
    jobs: int | None = None,
    limits: sandbox.Limits | None = None,
    force: bool = False,
    progress: bool = True,
    grading: Path | None = None,
) -> dict[tuple[str, str], dict]:
    """Grade every submission; return ``{(student, assignment): {cell: result dict}}``."""
    grading = grading or grading_dir(course_root)
    limits = limits or sandbox.Limits()
    submitted = submitted or grading / "submitted"
    known = set(chapter_ids(course_root))
    work = [w for w in discover(submitted, assignment_ids) if w[1] in known]
    source_root = grading / "source"
    build_sources(course_root, source_root)
    loaded = {}
    for a in sorted({w[1] for w in work}):
        _ensure_in_gradebook(course_root, grading, a)
        loaded[a] = assignments.load(a, source_root / a / f"{a}.ipynb")
    hidden = hidden_paths(course_root, grading) + [submitted]  # the class's notebooks too

    paths = {(s, a): assignments.find_notebook(folder, a) for s, a, folder in work}

    def one(student: str, assignment_id: str, folder: Path) -> tuple[str, str, dict, str]:
        path = paths[(student, assignment_id)]
        digest = fingerprint(path) if path else "missing"
        ledger = grading / "forge" / assignment_id / f"{student}.json"
        if not force and ledger.exists():
            saved = json.loads(ledger.read_text())
            if saved.get("sha256") == digest:
                return student, assignment_id, saved["results"], "resumed"
        results = as_dict(grade_notebook(loaded[assignment_id], path, limits, hidden))
        record = {"sha256": digest, "notebook": path.name if path else None, "results": results}
        _write_atomically(ledger, json.dumps(record, indent=1))
        return student, assignment_id, results, "graded"

    outcomes: dict[tuple[str, str], dict] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(work), unit="submission", desc="grading")
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        futures = [pool.submit(one, *w) for w in work]
        for future in as_completed(futures):
            student, assignment_id, results, _ = future.result()
            as_results = {c: CellResult(**r) for c, r in results.items()}
            _record(grading, assignment_id, student, as_results)
            _feedback(grading, assignment_id, student, results)
            _autograded(grading, assignment_id, student, paths.get((student, assignment_id)),
                        results)  # fmt: skip
            outcomes[(student, assignment_id)] = results
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    _write_csv(grading / "grades.csv", outcomes)
    return outcomes


def _write_csv(path: Path, outcomes: dict[tuple[str, str], dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["assignment", "student", "test", "status", "points", "max_points", "message"]
        )
        for (student, assignment_id), results in sorted(
            outcomes.items(), key=lambda kv: (kv[0][1], kv[0][0])
        ):
            for cell, r in results.items():
                writer.writerow(
                    [
                        assignment_id,
                        student,
                        cell,
                        r["status"],
                        r["points"],
                        r["max_points"],
                        r["message"].splitlines()[0] if r["message"] else "",
                    ]
                )
