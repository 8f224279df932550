"""The package on every Python from 3.10 to 3.13 installed here (pyenv's), without torch.

The suite itself runs on 3.11, the one Python the local torch wheel is built for. Here, for each
other Python too: a venv with the package installed from one wheel with `--no-deps`, plus
`packaging` (which `forge-course lab` uses) and pytest, runs `tests/torchless/` (the parts that
need no torch). A Python that is not installed is skipped, and says so.
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from tests.conftest import REPO

PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
MINORS = ["3.10", "3.11", "3.12", "3.13"]


def interpreter(minor: str) -> Path | None:
    found = sorted(PYENV.glob(f"{minor}.*/bin/python{minor}"))
    return found[-1] if found else None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (built,) = out.glob("forge_course-*.whl")
    return built


@pytest.mark.slow
@pytest.mark.parametrize("minor", MINORS)
def test_the_torchless_parts_on(minor, wheel, tmp_path):
    python = interpreter(minor)
    if python is None:
        pytest.skip(f"Python {minor} is not installed here")
    venv = tmp_path / "venv"
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True, capture_output=True, timeout=600)
    subprocess.run([*pip, "packaging", "pytest"], check=True, capture_output=True, timeout=600)
    # From an empty folder, so the installed package is imported, not the checkout's.
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "--noconftest", "-p", "no:cacheprovider",
         "--import-mode=importlib", "-q", str(REPO / "tests" / "torchless")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed" in done.stdout and "torch" not in os.listdir(
        venv / "lib" / f"python{minor}" / "site-packages"
    )


@pytest.mark.slow
def test_the_wheel_carries_its_license(wheel):
    with zipfile.ZipFile(wheel) as built:
        names = built.namelist()
        metadata = next(built.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        licence = next(built.read(n).decode() for n in names if n.endswith("/licenses/LICENSE"))
    assert "License-Expression: MIT" in metadata.splitlines()
    assert "Copyright (c) 2026 forge-course contributors" in licence


def test_the_citation_names_this_version_and_licence():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    citation = (REPO / "CITATION.cff").read_text().splitlines()
    assert f"version: {project['version']}" in citation
    assert f"license: {project['license']}" in citation
