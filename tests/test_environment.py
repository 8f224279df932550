"""Binder's environment.yml keeps up with pyproject.toml."""

import re

import tomllib

from tests.conftest import REPO

CONDA_NAMES = {"torch": "pytorch"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def test_environment_lists_every_runtime_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = (REPO / "environment.yml").read_text().splitlines()
    listed = {_name(line.strip().lstrip("- ")) for line in lines if line.strip().startswith("- ")}
    for requirement in project["dependencies"]:
        name = _name(requirement)
        assert CONDA_NAMES.get(name, name) in listed, f"environment.yml lacks {name}"


def test_environment_installs_the_package_and_cpu_torch():
    assert "pytorch=2.*=cpu*" in (REPO / "environment.yml").read_text()
    assert "pip install --no-deps -e ." in (REPO / "postBuild").read_text()
