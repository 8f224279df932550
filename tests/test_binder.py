"""Binder builds the course from `binder/` (repo2docker reads that folder alone when it exists).

`binder/requirements.txt` and `binder/runtime.txt` rather than a conda `environment.yml`: pip's
index can be checked from here and conda-forge's cannot, and conda-forge's newest nbgrader
(0.9.5) is older than the course needs. The tests read what repo2docker reads: the files parse,
every requirement names a version that PyPI has, the course package installs on top of them
with `--no-deps` (as `binder/postBuild` does), and `binder/start` gives Jupyter the course's
settings.

Checked by reasoning, not here: PyTorch's CPU index (the `--extra-index-url` line) cannot be
reached from this machine. Its `torch==2.13.0` is the CPU build `2.13.0+cpu`, the same build
as the wheel this suite runs on; PyPI's `2.13.0`, which the test does find, is the CUDA build.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

BINDER = REPO / "binder"
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
CERTS = Path("/etc/ssl/certs/ca-certificates.crt")


def requirements() -> list[Requirement]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    specs = [line.split("#")[0].strip() for line in lines]
    options = [s for s in specs if s.startswith("-")]
    assert options == [CPU_INDEX], f"unexpected pip options in requirements.txt: {options}"
    return [Requirement(s) for s in specs if s and not s.startswith("-")]


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_binder_lists_every_runtime_dependency_and_lab_tools():
    listed = {canonicalize_name(r.name) for r in requirements()}
    wanted = [Requirement(r).name for r in project()["dependencies"]] + ["jupyterlab", "nbgrader"]
    assert {canonicalize_name(n) for n in wanted} <= listed


def test_binder_torch_is_the_tested_cpu_build():
    torch = next(r for r in requirements() if r.name == "torch")
    pinned = (REPO / "constraints.txt").read_text()
    assert f"torch{torch.specifier}" in pinned.split(), "binder's torch differs from make's"


def test_binder_python_is_one_the_package_accepts():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)", runtime)
    assert match, f"runtime.txt must read python-X.Y, not {runtime!r}"
    assert SpecifierSet(project()["requires-python"]).contains(match[1] + ".0")


def pypi_versions(name: str) -> list[Version]:
    """The versions PyPI itself lists (--isolated: no local wheel folder or mirror)."""
    cert = ["--cert", str(CERTS)] if CERTS.exists() else []
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", *cert, "index", "versions", name],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    found = re.search(r"Available versions: (.*)", done.stdout)
    assert found, f"PyPI did not answer for {name}:\n{done.stdout}{done.stderr}"
    return [Version(v) for v in found[1].split(", ")]


@pytest.mark.slow
def test_every_binder_requirement_has_a_version_on_pypi():
    missing = []
    for requirement in requirements():
        versions = pypi_versions(requirement.name)
        if not any(requirement.specifier.contains(v) for v in versions):
            missing.append(str(requirement))
    assert not missing, f"PyPI has no version for: {missing}"


@pytest.mark.slow
def test_post_build_installs_the_package_with_no_deps(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    subprocess.run(
        [str(BINDER / "postBuild")], cwd=REPO, env=env, check=True, capture_output=True, timeout=600
    )
    script = (
        "import importlib.metadata as m, json; "
        "print(json.dumps([m.version('forge-course'), m.requires('forge-course')]))"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script], env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    version, requires = json.loads(out)
    assert version == project()["version"]
    needed = {canonicalize_name(Requirement(r).name) for r in requires if "extra ==" not in r}
    assert needed <= {canonicalize_name(r.name) for r in requirements()}


def test_start_applies_the_course_jupyter_settings():
    script = (
        "import json; from jupyter_core.paths import jupyter_config_path; "
        "from jupyterlab_server.config import get_static_page_config; "
        "print(json.dumps([jupyter_config_path(), "
        "get_static_page_config(level='all').get('disabledExtensions', {})]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_CONFIG_PATH"}
    done = subprocess.run(
        [str(BINDER / "start"), sys.executable, "-c", script],
        cwd="/", env=env, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    paths, disabled = json.loads(done.stdout)
    assert str(REPO / "autograder") in paths, "nbgrader's config and the Lab's page config"
    assert disabled.get("@jupyterlab/apputils-extension:announcements"), "the news prompt"
    assert disabled.get("@jupyter/nbgrader:create-assignment"), "instructor panels for learners"
    assert disabled.get("@jupyter/nbgrader:menu"), "the Formgrader menu for learners"
    assert not disabled.get("@jupyter/nbgrader:validate-assignment"), "learners validate"


def test_start_becomes_the_command_it_is_given():
    """exec, not a child: Binder's signals must reach Jupyter itself."""
    command = [str(BINDER / "start"), "sh", "-c", "echo $$ $JUPYTER_CONFIG_PATH"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as started:
        pid, config_path = started.communicate(timeout=60)[0].split()
    assert int(pid) == started.pid
    assert config_path.split(":")[:2] == [str(REPO / "autograder" / "learner"),
                                          str(REPO / "autograder")]  # fmt: skip
