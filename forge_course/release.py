"""Build the learner notebooks from the instructor sources, byte for byte reproducibly.

    solutions/chNN_slug.py            jupytext percent format, nbgrader metadata on cells
      -> build/source/chNN_slug/chNN_slug.ipynb      nbgrader source notebook (solutions in)
      -> build/release/chNN_slug/chNN_slug.ipynb     nbgrader's release (solutions and hidden
                                                     tests stripped)
      -> notebooks/chNN_slug/chNN_slug.ipynb         the same, cleaned: what learners open
    forge_course/chapters.py -> notebooks/index.ipynb

Sources write only what matters on a cell (``nbgrader={"grade_id": ..., "solution": true}``);
the build fills in nbgrader's other fields, gives every cell a stable id (jupytext would draw
random ones), and drops volatile metadata so a rebuild of unchanged sources changes no byte.
nbgrader writes its release into ``build/release`` (its ``release_directory``), never into
``notebooks/``: the Formgrader's "Generate" button runs nbgrader alone, without the cleaning, and
would otherwise rewrite the committed notebooks with volatile metadata. Only this build copies a
cleaned release into ``notebooks/``.

It also adds what Colab needs (`forge_course.colab`): an "Open in Colab" badge under each
chapter's title, and the install cell before its first code cell.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import nbformat

from forge_course import colab
from forge_course.chapters import CHAPTERS

REPO = Path(__file__).resolve().parent.parent
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def chapter_ids(repo: Path = REPO) -> list[str]:
    """The chapters that have a source in ``solutions/``, in order."""
    return sorted(p.stem for p in (repo / "solutions").glob("ch[0-9][0-9]_*.py"))


def _nbgrader_fields(meta: dict, chapter: str, index: int) -> dict:
    """nbgrader's full cell metadata from the few fields a source writes."""
    grade = bool(meta.get("grade", False))
    solution = bool(meta.get("solution", False))
    fields = {
        "grade": grade,
        "grade_id": meta.get("grade_id") or f"{chapter}_cell{index:02d}",
        "locked": bool(meta.get("locked", not solution)),
        "schema_version": 3,
        "solution": solution,
        "task": bool(meta.get("task", False)),
    }
    if grade:
        fields["points"] = meta.get("points", 1)
    return fields


def source_notebook(source: Path) -> nbformat.NotebookNode:
    """The nbgrader source notebook for one ``solutions/chNN_slug.py`` file."""
    import jupytext

    chapter = source.stem
    nb = jupytext.read(source, fmt="py:percent")
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader")
        cell.metadata = {}
        if meta is not None:
            cell.metadata["nbgrader"] = _nbgrader_fields(meta, chapter, index)
            cell.id = cell.metadata["nbgrader"]["grade_id"]
            # Unanswered exercises raise; the tag lets "Run All" go on past them (JupyterLab,
            # nbclient), so the rest of the chapter still runs in a fresh copy.
            cell.metadata["tags"] = ["raises-exception"]
        else:
            digest = hashlib.sha1(f"{chapter}:{index}".encode()).hexdigest()[:8]
            cell.id = f"{chapter[:4]}-{index:02d}-{digest}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    _add_colab(nb, chapter)
    nb.metadata = {
        "kernelspec": KERNELSPEC,
        "language_info": {"name": "python"},
    }
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


def _add_colab(nb: nbformat.NotebookNode, chapter: str) -> None:
    """The Colab badge under the chapter's title; the install cell before its first code cell.

    Added after the cell ids are drawn, so the chapter's own cells keep theirs.
    """
    url = colab.repository_url()
    title = nb.cells[0]
    if title.cell_type != "markdown":
        raise ValueError(f"{chapter} must open with a markdown cell: its title and objectives")
    title.source = colab.with_badge(
        title.source, colab.colab_badge(url, f"notebooks/{chapter}/{chapter}.ipynb")
    )
    first_code = next(i for i, cell in enumerate(nb.cells) if cell.cell_type == "code")
    nb.cells.insert(first_code, colab.install_cell(colab.release_requirement()))


def write_notebook(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write with sorted keys and a final newline, so equal notebooks are equal files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")


def clean_release(path: Path, out: Path, keyed: dict[str, str] | None = None) -> None:
    """Write nbgrader's release ``path`` to ``out`` without what nbgrader adds that varies
    between runs; keep every cell's nbgrader metadata.

    ``keyed`` replaces the source of question test cells by grade id (the self-study cells
    with their answer keys, `forge_course.answer_keys`); their checksum is recomputed, so
    nbgrader's Validate does not call them changed.
    """
    from nbgrader.utils import compute_checksum

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in ("nbgrader", "tags")}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if keyed and grade_id in keyed:
            cell.source = keyed[grade_id]
            if "checksum" in cell.metadata["nbgrader"]:
                cell.metadata["nbgrader"]["checksum"] = compute_checksum(cell)
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    write_notebook(nb, out)


def index_notebook(written: list[str]) -> nbformat.NotebookNode:
    """The course index: every chapter with one line, its time, and whether it is ready."""
    lines = [
        "# forge-course: the PyTorch training loop, in depth",
        "",
        "Open a chapter, run it top to bottom (each runs in under a minute on a laptop CPU), "
        "then do its exercises. Check your work with the **Validate** button or "
        "`forge-course check <notebook>` in a terminal. The Colab badges open a chapter on Google "
        "Colab, where its first code cell installs the course package.",
        "",
        "| # | chapter | what you will learn | time | Colab |",
        "| --- | --- | --- | --- | --- |",
    ]
    url = colab.repository_url()
    for ch in CHAPTERS:
        number = ch.id[2:4]
        if ch.id in written:
            link = f"[{ch.title}]({ch.id}/{ch.id}.ipynb)"
            badge = colab.colab_badge(url, f"notebooks/{ch.id}/{ch.id}.ipynb")
            lines.append(f"| {number} | {link} | {ch.summary} | {ch.minutes} min | {badge} |")
        else:
            lines.append(f"| {number} | {ch.title} (coming) | {ch.summary} | | |")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("\n".join(lines))]
    nb.cells[0].id = "course-index"
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    return nb


def build_sources(
    repo: Path = REPO, out: Path | None = None, chapters: list[str] | None = None
) -> list[str]:
    """Convert ``solutions/<chapter>.py`` into ``<out>/<chapter>/<chapter>.ipynb`` for each of
    ``chapters`` (every chapter by default)."""
    out = out or repo / "build" / "source"
    chapters = chapter_ids(repo) if chapters is None else chapters
    for chapter in chapters:
        nb = source_notebook(repo / "solutions" / f"{chapter}.py")
        write_notebook(nb, out / chapter / f"{chapter}.ipynb")
    return chapters


def generate_release(course_root: Path, chapters: list[str], graded: bool = False) -> Path:
    """Run nbgrader's generate_assignment for each chapter of the course rooted at ``course_root``.

    The course root must hold ``build/source``; nbgrader releases into ``build/release``, and
    each chapter's cleaned release lands in ``notebooks`` (self-study: each question's visible
    test holds its answer key) or, with ``graded``, in ``build/graded`` (no key: the question
    cells reveal nothing). Each chapter is also registered in the course's gradebook, so the
    Formgrader lists it and ``nbgrader autograde`` finds it. Returns the folder written.
    """
    from forge_course import answer_keys

    handout = course_root / ("build/graded" if graded else "notebooks")
    import os

    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    previous = os.environ.get("FORGE_COURSE_ROOT")
    os.environ["FORGE_COURSE_ROOT"] = str(course_root)
    try:
        config = PyFileConfigLoader("nbgrader_config.py", str(REPO / "autograder")).load_config()
        api = NbGraderAPI(config=config)
        for chapter in chapters:
            result = api.generate_assignment(chapter, force=True, create=True)
            if not result["success"]:
                raise RuntimeError(f"nbgrader could not release {chapter}:\n{result.get('error')}")
            name = f"{chapter}/{chapter}.ipynb"
            released = course_root / "build" / "release" / name
            keyed = None
            if not graded:
                keyed = answer_keys.keyed_cells(
                    nbformat.read(course_root / "build" / "source" / name, as_version=4),
                    nbformat.read(released, as_version=4),
                )
            clean_release(released, handout / name, keyed)
    finally:
        if previous is None:
            os.environ.pop("FORGE_COURSE_ROOT", None)
        else:
            os.environ["FORGE_COURSE_ROOT"] = previous
    write_notebook(index_notebook(chapters), handout / "index.ipynb")
    return handout


def release(repo: Path = REPO, graded: bool = False) -> list[str]:
    """`make release`: rebuild ``build/source``, ``notebooks`` and the README's badges; with
    ``graded`` (`make release-graded`), ``build/graded`` instead of ``notebooks``."""
    chapters = build_sources(repo)
    generate_release(repo, chapters, graded=graded)
    if not graded:
        colab.update_readme(repo)
    return chapters
