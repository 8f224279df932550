"""The committed release is exactly what `make release` builds, and gives nothing away."""

import json
import shutil

import nbformat
import pytest

from forge_course import release
from tests.conftest import CHAPTERS, REPO


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    """A release built from the sources into a temporary course root."""
    root = tmp_path_factory.mktemp("course")
    chapters = release.build_sources(REPO, root / "build" / "source")
    release.generate_release(root, chapters)
    return root


def test_every_chapter_source_is_released():
    released = sorted(p.name for p in (REPO / "notebooks").iterdir() if p.is_dir())
    assert released == CHAPTERS, "run `make release` after adding or renaming a chapter"


@pytest.mark.slow
def test_committed_release_is_byte_for_byte_up_to_date(rebuilt):
    for path in sorted(rebuilt.joinpath("notebooks").rglob("*.ipynb")):
        committed = REPO / path.relative_to(rebuilt)
        assert committed.exists(), f"{committed.name} is missing: run `make release`"
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed.relative_to(REPO)} is out of date with solutions/: run `make release`"
        )


@pytest.mark.slow
def test_the_build_is_reproducible(tmp_path, rebuilt):
    again = release.build_sources(REPO, tmp_path / "source")
    for chapter in again:
        first = rebuilt / "build" / "source" / chapter / f"{chapter}.ipynb"
        assert (
            tmp_path / "source" / chapter / f"{chapter}.ipynb"
        ).read_bytes() == first.read_bytes()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_has_no_solution_no_hidden_test_no_output(chapter):
    text = (REPO / "notebooks" / chapter / f"{chapter}.ipynb").read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "thorough=True"):
        assert marker not in text, f"{marker!r} leaked into the release of {chapter}"
    nb = nbformat.read(REPO / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
    nbformat.validate(nb)
    assert set(nb.metadata) == {"kernelspec", "language_info"}
    for cell in nb.cells:
        assert set(cell.metadata) <= {"nbgrader", "tags"}, f"volatile metadata in {cell.id}"
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_exercise_has_a_solution_cell_and_a_graded_test(chapter):
    nb = nbformat.read(REPO / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
    meta = [c.metadata["nbgrader"] for c in nb.cells if "nbgrader" in c.metadata]
    ids = [m["grade_id"] for m in meta]
    assert len(ids) == len(set(ids)), "grade ids must be unique"
    assert all(i.startswith(chapter[:4] + "_") for i in ids), "grade ids carry the chapter"
    solutions = [m for m in meta if m["solution"]]
    tests = [m for m in meta if m["grade"]]
    assert len(solutions) >= 3, "at least two code exercises and one question"
    assert len(tests) >= 3
    assert all(m["locked"] for m in tests), "learners must not edit test cells"
    for m in solutions:
        if m["grade_id"].endswith("questions"):
            continue
        assert f"{m['grade_id']}_tests" in ids, f"{m['grade_id']} has no test cell"


def test_index_lists_every_chapter_and_marks_the_rest_coming():
    from forge_course.chapters import CHAPTERS as TABLE

    text = json.loads((REPO / "notebooks" / "index.ipynb").read_text())["cells"][0]["source"]
    for ch in TABLE:
        assert ch.title in text
        if ch.id in CHAPTERS:
            assert f"({ch.id}/{ch.id}.ipynb)" in text
        else:
            assert f"{ch.title} (coming)" in text


def test_sources_keep_only_nbgrader_fields(tmp_path):
    source = tmp_path / "solutions" / "ch99_demo.py"
    source.parent.mkdir()
    shutil.copy(REPO / "solutions" / f"{CHAPTERS[0]}.py", source)
    release.build_sources(tmp_path, tmp_path / "out")
    nb = json.loads((tmp_path / "out" / "ch99_demo" / "ch99_demo.ipynb").read_text())
    assert "jupytext" not in json.dumps(nb)
    graded = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]
    assert graded and all(c["metadata"]["nbgrader"]["schema_version"] == 3 for c in graded)


def test_the_graded_release_has_no_answer_keys_and_differs_only_there(tmp_path):
    """`forge-course release --graded`: the self-study notebook without its answer keys."""
    chapter = "ch00_training_arithmetic"
    release.build_sources(REPO, tmp_path / "build" / "source", [chapter])
    handout = release.generate_release(tmp_path, [chapter], graded=True)
    assert handout == tmp_path / "build" / "graded"
    graded = nbformat.read(handout / chapter / f"{chapter}.ipynb", as_version=4)
    learner = nbformat.read(REPO / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
    keyed = [c.metadata["nbgrader"]["grade_id"] for c in learner.cells if "key={" in c.source]
    assert keyed == ["ch00_q_iterations", "ch00_q_updates", "ch00_q_scheduler"]
    assert "key=" not in json.dumps(graded)
    for mine, theirs in zip(graded.cells, learner.cells, strict=True):
        if mine.get("metadata", {}).get("nbgrader", {}).get("grade_id") not in keyed:
            assert mine == theirs


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_validate_does_not_call_a_keyed_question_cell_changed(chapter):
    """The release recomputes the checksum of each cell it gives a key, so nbgrader's Validate
    sees the learner's copy as it was handed out."""
    from nbgrader.validator import Validator

    nb = nbformat.read(REPO / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
    assert Validator()._get_changed_cells(nb) == []
