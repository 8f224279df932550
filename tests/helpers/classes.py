"""A class of submissions built from the chapters' own notebooks, for tests that grade one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import nbformat

from forge_course.release import build_sources, generate_release
from tests.conftest import REPO
from tests.test_autograde import _solutions, _submission


def build_class(root: Path, chapters: list[str], answers: Callable[[str, dict], dict]) -> Path:
    """Write ``root/submitted/<student>/<chapter>/<chapter>.ipynb`` for every student that
    ``answers(chapter, solved)`` names (its value: grade id -> answer cell source, the rest of
    the release left blank; ``solved`` holds the instructor's solution cells). Returns the
    ``submitted`` folder."""
    build_sources(REPO, root / "build" / "source")
    generate_release(root, chapters)
    for chapter in chapters:
        name = f"{chapter}.ipynb"
        source = nbformat.read(root / "build" / "source" / chapter / name, as_version=4)
        released = nbformat.read(root / "notebooks" / chapter / name, as_version=4)
        for student, cells in answers(chapter, _solutions(source)).items():
            path = root / "submitted" / student / chapter / name
            path.parent.mkdir(parents=True)
            nbformat.write(_submission(released, cells), path)
    return root / "submitted"
