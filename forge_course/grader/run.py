"""`forge-course grade`: grade a class in parallel, record every score once, resume after a kill.

Layout (nbgrader's): ``grading/submitted/<student>/<assignment>/<notebook>.ipynb``. For each
submission the grader writes, in order:

1. a ledger entry ``grading/forge/<assignment>/<digest of the id>.json`` (atomically, keyed by
   the notebook's SHA-256, the instructor's version, the grader's version and the seed, and
   signed with a key the sandbox never sees), so a restarted run skips what is done and loses
   nothing, and an entry forged or left by older tests is graded again;
2. the scores into nbgrader's gradebook (``nbgrader export`` and the Formgrader see them);
3. feedback ``grading/feedback/<student>/<assignment>/<assignment>.html``: each test's status
   and message, never the code of hidden tests;
4. nbgrader's autograded copy ``grading/autograded/<student>/<assignment>/``, each verdict as
   its test cell's output, for instructors who prefer ``nbgrader generate_feedback``'s pages;

and at the end ``grading/grades.csv`` with one row per test cell and its status.

Whatever goes wrong with one submission (an unreadable notebook, a folder name no tool can
hold, a crash of the grader's own code) becomes that student's status, and the run goes on.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import os
import random
import shutil
import tempfile
import threading
import traceback
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

import nbformat

from forge_course.grader import assignment as assignments
from forge_course.grader import sandbox
from forge_course.grader.ledger import (  # re-exported: the grader's names for them
    Ledger,
    discover,
    student_id,
)
from forge_course.grader.ledger import write_atomically as _write_atomically
from forge_course.grader.submission import (
    CellResult,
    as_dict,
    fingerprint,
    grade_notebook,
    read_notebook,
)
from forge_course.grader.text import clean_text, csv_text
from forge_course.release import REPO, build_sources, chapter_ids

PACKAGE = Path(__file__).resolve().parents[1]


class Stopped(Exception):
    """The run was stopped (Ctrl-C, SIGTERM): ``graded`` of ``total`` submissions are in the
    ledger, and a run without ``--force`` grades the rest."""

    def __init__(self, graded: int, total: int):
        super().__init__(f"stopped after {graded} of {total} submission(s)")
        self.graded, self.total = graded, total


class SandboxUnavailable(RuntimeError):
    """No sandbox on this machine, and the instructor did not say --unsafe."""


def grading_dir(course_root: Path = REPO) -> Path:
    return Path(os.environ.get("FORGE_GRADING_DIR", course_root / "grading"))


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


def _open_gradebook(grading: Path):
    """nbgrader's gradebook in ``grading``. A new one is created here: nbgrader would run the
    ``alembic`` command for its schema version, 5 s of imports, and fail where the
    environment's ``bin`` folder is not on PATH (a venv's Python run without activating it)."""
    from nbgrader.api import Base, Gradebook

    path = grading / "gradebook.db"
    if not path.exists():
        import sqlalchemy
        from alembic.config import Config
        from alembic.script import ScriptDirectory
        from nbgrader.dbutil import ALEMBIC_DIR

        config = Config()
        config.set_main_option("script_location", ALEMBIC_DIR)
        head = ScriptDirectory.from_config(config).get_current_head()
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = sqlalchemy.create_engine(f"sqlite:///{path}")
        with engine.begin() as db:
            Base.metadata.create_all(db)
            db.execute(
                sqlalchemy.text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
            )
            db.execute(
                sqlalchemy.text("INSERT INTO alembic_version VALUES (:head)"), {"head": head}
            )
        engine.dispose()
    return Gradebook(f"sqlite:///{path}")


def _ensure_in_gradebook(grading: Path, source_root: Path, assignment_id: str) -> None:
    """Put the assignment and its cells in the gradebook, without touching notebooks/."""
    from nbgrader.api import MissingEntry

    with _open_gradebook(grading) as gb:
        try:
            gb.find_notebook(assignment_id, assignment_id)
            return
        except MissingEntry:
            pass
    from forge_course.release import generate_release

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(source_root / assignment_id, Path(tmp) / "build" / "source" / assignment_id)
        with _env(FORGE_GRADING_DIR=str(grading)):
            generate_release(Path(tmp), [assignment_id])


def _record(grading: Path, assignment_id: str, student: str, results: dict[str, CellResult]):
    from nbgrader.api import MissingEntry

    with _open_gradebook(grading) as gb:
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


def _autograded(
    grading: Path, assignment_id: str, student: str, submitted: Path | None, results: dict
) -> None:
    """nbgrader's autograded copy, so ``nbgrader generate_feedback`` works on our verdicts: the
    instructor's notebook with the learner's answers in its solution cells (and nowhere else)
    and each verdict as a test's output (the feedback step clears hidden tests, as after
    ``nbgrader autograde``)."""
    source = nbformat.read(grading / "source" / assignment_id / f"{assignment_id}.ipynb", 4)
    answers = {}
    with contextlib.suppress(ValueError, OSError):  # a malformed submission keeps no answers
        answers = read_notebook(submitted) if submitted else {}
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id")
        if meta.get("solution") and not meta.get("grade") and grade_id in answers:
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


def versions(course_root: Path, assignment_id: str) -> dict[str, str]:
    """Digests of what a verdict depends on besides the notebook: the instructor's version of
    the assignment and the grader's code."""
    source = course_root / "solutions" / f"{assignment_id}.py"
    return {
        "instructor": hashlib.sha256(source.read_bytes()).hexdigest(),
        "grader": grader_version(),
    }


@functools.cache  # the code this process runs: read once, as it was imported
def grader_version() -> str:
    """A digest of the grader's code: checks, references, sandbox (the whole package)."""
    grader = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        grader.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return grader.hexdigest()


def _resolve_seed(grading: Path, seed: int | None, force: bool) -> int:
    """--seed, else FORGE_GRADING_SEED, else the seed of the run being resumed, else a new one."""
    saved = grading / "forge" / "seed"
    if seed is None and os.environ.get("FORGE_GRADING_SEED"):
        seed = int(os.environ["FORGE_GRADING_SEED"])
    if seed is None and not force:
        with contextlib.suppress(OSError, ValueError):
            seed = int(saved.read_text())
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    _write_atomically(saved, str(seed))
    return seed


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
    unsafe: bool = False,
    seed: int | None = None,
    device: str = "auto",
    cluster: str | None = None,
) -> dict[tuple[str, str], dict]:
    """Grade every submission; return ``{(student id, assignment): {cell: result dict}}``.

    With ``cluster`` (a Dask scheduler's address) the submissions are graded by the cluster's
    workers (`forge_course.grader.cluster`) and recorded here. Raises `SandboxUnavailable`
    where bubblewrap cannot run, unless ``unsafe``.
    """
    mode = sandbox.isolation()
    if mode != "bubblewrap" and not unsafe and cluster is None:
        raise SandboxUnavailable(sandbox.INSTALL_BWRAP)
    grading = (grading or grading_dir(course_root)).resolve()
    limits = limits or sandbox.Limits()
    submitted = (submitted or grading / "submitted").resolve()
    known = set(chapter_ids(course_root))
    work = [w for w in discover(submitted, assignment_ids) if w[1] in known]
    run_seed = _resolve_seed(grading, seed, force)
    # The cases are drawn here, for the devices the run may use. This process only names them
    # (FORGE_DEVICE): it never hides a GPU from itself, which a process that has opened CUDA
    # cannot undo; the workers are handed theirs (`sandbox.device_environment`).
    with (
        _env(FORGE_GRADING_SEED=str(run_seed), **sandbox.chosen_devices(device)),
        tempfile.TemporaryDirectory(prefix="forge-stage-") as stage_dir,
    ):
        if cluster is None:
            sandbox.stage(Path(stage_dir))
            graders = _Workers(limits, mode, Path(stage_dir), device)
        else:
            graders = _on_cluster(cluster, grading, limits, run_seed, device, unsafe)
            jobs = jobs or graders.threads()
        with contextlib.closing(graders):
            return _grade_class(work, course_root, grading, graders, run_seed, jobs, force,
                                progress)  # fmt: skip


def _on_cluster(address, grading, limits, seed, device, unsafe):
    from dataclasses import asdict

    from forge_course.grader.cluster import Cluster

    settings = {"seed": seed, "device": device, "limits": asdict(limits), "unsafe": unsafe,
                "grader": grader_version(), "run": uuid.uuid4().hex}  # fmt: skip
    return Cluster(address, settings, grading / "source")


def _grade_class(work, course_root, grading, graders, seed, jobs, force, progress):
    from sqlalchemy.exc import SAWarning

    # nbgrader's own models trigger a harmless autoflush warning when a submission is new. Set
    # once, before the threads: `warnings.catch_warnings` in one thread undoes another's.
    warnings.filterwarnings("ignore", category=SAWarning, module=r"nbgrader\.")
    source_root = grading / "source"
    graded = sorted({w[1] for w in work})
    build_sources(course_root, source_root, graded)
    loaded, keys = {}, {}
    for a in graded:
        _ensure_in_gradebook(grading, source_root, a)
        loaded[a] = assignments.load(a, source_root / a / f"{a}.ipynb")
        keys[a] = {**versions(course_root, a), "seed": seed}
    ledger = Ledger(grading / "forge")
    ids = {name: student_id(name) for name in {w[0] for w in work}}
    _write_id_map(grading, ids)
    shared = _shared_ids(ids)
    work = list({(ids[w[0]], w[1]): w for w in sorted(work)}.values())  # one per id: `shared`
    stopping = threading.Event()

    def one(name: str, assignment_id: str, folder: Path) -> tuple[str, str, dict, Path | None]:
        student = ids[name]
        path, key = None, None
        try:
            if student in shared:
                raise _Refused(shared[student])
            if folder.is_symlink() or folder.parent.is_symlink():
                raise _Refused("the submission folder is a symbolic link")
            path = assignments.find_notebook(folder, assignment_id)
            key = {**keys[assignment_id], "notebook": fingerprint(path) if path else "missing"}
            if not force and (saved := ledger.read(assignment_id, student, key)) is not None:
                return student, assignment_id, saved, path
            results = graders.grade(loaded[assignment_id], path, seed)
        except sandbox.SandboxError:
            raise  # the machine cannot grade anyone: stop once, with the sandbox's words
        except _Refused as why:
            key, results = (
                None,
                _everything(loaded[assignment_id], "malformed", f"Not graded: {why}."),
            )
        except Exception as err:  # noqa: BLE001  (one submission's failure stays its own)
            message = f"The grader failed on this submission: {_what_failed(err)}"
            results = _everything(loaded[assignment_id], "grader error", message)
        if stopping.is_set():  # the stop may have ended its jobs: the next run grades it
            raise _Abandoned
        if key is not None:  # recorded, so a resumed run does not stop on it again
            ledger.write(assignment_id, student, key, results)
        return student, assignment_id, results, path

    outcomes: dict[tuple[str, str], dict] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(work), unit="submission", desc="grading")
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        futures = [pool.submit(one, *w) for w in work]
        try:
            for future in as_completed(futures):
                student, assignment_id, results, path = future.result()
                try:
                    _record(
                        grading,
                        assignment_id,
                        student,
                        {c: CellResult(**r) for c, r in results.items()},
                    )
                    _feedback(grading, assignment_id, student, results)
                    _autograded(grading, assignment_id, student, path, results)
                except Exception as err:  # noqa: BLE001
                    message = f"The grader could not record this submission: {_what_failed(err)}"
                    results = _everything(loaded[assignment_id], "grader error", message)
                outcomes[(student, assignment_id)] = results
                if bar is not None:
                    bar.update()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the command line's handler)
            stopping.set()
            for future in futures:
                future.cancel()
            graders.stop()  # the jobs under way end now, not at their time limits
    if bar is not None:
        bar.close()
    if stopping.is_set():  # each submission whose thread returned is in the ledger
        kept = [f for f in futures if not f.cancelled() and f.exception() is None]
        raise Stopped(len(kept), len(work))
    _write_csv(grading / "grades.csv", outcomes, seed)
    return outcomes


class _Workers:
    """The run's warm workers (`sandbox.Session`): each grades one submission at a time, and
    one more starts when every one is busy, so there are as many as jobs run at once."""

    def __init__(self, limits: sandbox.Limits, mode: str | None, stage_dir: Path, device: str):
        devices = sandbox.device_environment(device)
        self.start = lambda: sandbox.Session(limits, mode, stage_dir, devices)
        self.idle: list[sandbox.Session] = []
        self.all: list[sandbox.Session] = []
        self.lock = threading.Lock()
        self.stopped = False

    @contextmanager
    def one(self):
        with self.lock:
            box = self.idle.pop() if self.idle else None
        if box is None:
            box = self.start()
            with self.lock:
                self.all.append(box)
        if self.stopped:  # made while the run stopped: `stop` did not see it
            box.interrupt()
        try:
            yield box
        finally:
            with self.lock:
                self.idle.append(box)

    def grade(self, assignment: assignments.Assignment, path: Path | None, seed: int) -> dict:
        with self.one() as box:
            return as_dict(grade_notebook(assignment, path, box, seed))

    def stop(self) -> None:
        """End every job under way now (from the run's thread, while others grade)."""
        with self.lock:
            self.stopped = True
            boxes = list(self.all)
        for box in boxes:
            box.interrupt()

    def close(self) -> None:
        for box in self.all:
            box.__exit__(None, None, None)


class _Abandoned(Exception):
    """A submission whose grading the run's stop cut short: not recorded."""


class _Refused(Exception):
    """A submission the grader will not open (its reason is shown to the student)."""


def _everything(assignment, status: str, message: str) -> dict:
    top = assignment.test_points
    return {c: as_dict({c: CellResult(status, 0.0, top[c], clean_text(message))})[c] for c in top}


def _what_failed(err: BaseException) -> str:
    frame = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    where = f" in {Path(frame[0].filename).name}:{frame[0].lineno}" if frame else ""
    return clean_text(f"{type(err).__name__}{where}: {err}", 500)


def _shared_ids(ids: dict[str, str]) -> dict[str, str]:
    """Why each id that several folders would be graded under is refused: two names equal after
    Unicode normalisation ("\u212aate" and "Kate"), or a folder named like another's hashed id.
    Graded, the later would replace the earlier; refused, the instructor renames one."""
    names: dict[str, list[str]] = {}
    for name, sid in ids.items():
        names.setdefault(sid, []).append(name)
    return {
        sid: "the folders "
        + " and ".join(clean_text(ascii(n), 100) for n in sorted(found))
        + f" would all be graded as the student {sid}, one replacing the other: rename all but one"
        for sid, found in names.items()
        if len(found) > 1
    }


def _write_id_map(grading: Path, ids: dict[str, str]) -> None:
    """Which folder each id stands for, where the folder's name was outside the rule."""
    renamed = {name: sid for name, sid in ids.items() if name != sid}
    rows = [["student_id", "folder_name"]]
    rows += [[sid, repr(name)] for name, sid in sorted(renamed.items(), key=lambda kv: kv[1])]
    _write_atomically(grading / "student_ids.csv", csv_text(rows))


def _write_csv(path: Path, outcomes: dict[tuple[str, str], dict], seed: int) -> None:
    rows = [["assignment", "student", "test", "status", "points", "max_points", "message", "seed"]]
    for (student, assignment_id), results in sorted(
        outcomes.items(), key=lambda kv: (kv[0][1], kv[0][0])
    ):
        for cell, r in results.items():
            first = r["message"].splitlines()[0] if r["message"] else ""
            rows.append([assignment_id, student, cell, r["status"], r["points"], r["max_points"],
                         first, seed])  # fmt: skip
    _write_atomically(path, csv_text(rows))
