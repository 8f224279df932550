"""`make lab`'s set-up installs the PyTorch a learner's machine should have.

On Linux without an NVIDIA driver, PyPI's `torch==2.13.0` is the CUDA build, several GB with
NVIDIA's libraries; PyTorch's CPU-only index has `2.13.0+cpu` (192 MB), which pip prefers when
that index is added, because a local version label sorts after the bare version. The Makefile
adds the index only there, and only after looking for a wheel already on the machine (pip's
find-links, as here), which it installs without asking any index. The commands are the ones
`make -n setup` prints, so these tests read the Makefile as make does.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def _path_without_nvidia_smi(folder: Path, path: str) -> Path:
    """One folder of links to every program on ``path`` except nvidia-smi."""
    folder.mkdir(exist_ok=True)
    for directory in path.split(os.pathsep):
        for program in Path(directory).glob("*") if Path(directory).is_dir() else ():
            link = folder / program.name
            if program.name != "nvidia-smi" and not link.exists() and os.access(program, os.X_OK):
                link.symlink_to(program)
    return folder


def torch_commands(tmp_path: Path, nvidia: bool) -> tuple[list[str], list[str]]:
    """The set-up's two ways to install torch: (local wheel only, from the indexes)."""
    path = os.environ["PATH"]
    if nvidia:  # a machine with NVIDIA's driver has nvidia-smi on PATH
        fake = tmp_path / "nvidia"
        fake.mkdir(exist_ok=True)
        (fake / "nvidia-smi").write_text("#!/bin/sh\n")
        (fake / "nvidia-smi").chmod(0o755)
        path = f"{fake}{os.pathsep}{path}"
    elif shutil.which("nvidia-smi"):  # on a GPU machine: everything on PATH but the driver's tool
        path = str(_path_without_nvidia_smi(tmp_path / "no-nvidia", path))
    printed = subprocess.run(
        ["make", "-n", "setup", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO, env={**os.environ, "PATH": path}, capture_output=True, text=True, check=True,
    ).stdout.replace("\\\n", " ")  # fmt: skip
    line = next(line for line in printed.splitlines() if " torch" in line and "--no-index" in line)
    local, _, indexes = line.partition("||")
    return shlex.split(local.replace("2>/dev/null", "")), shlex.split(indexes)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Makefile asks uname")
def test_cpu_index_only_on_linux_without_an_nvidia_driver(tmp_path):
    local, indexes = torch_commands(tmp_path, nvidia=False)
    assert CPU_INDEX in " ".join(indexes)
    assert "--no-index" in local and "download.pytorch.org" not in " ".join(local)
    _, with_gpu = torch_commands(tmp_path, nvidia=True)
    assert "download.pytorch.org" not in " ".join(with_gpu)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/opt/wheels").is_dir(), reason="no local wheel folder here")
def test_a_local_wheel_is_installed_without_any_index(tmp_path):
    local, _ = torch_commands(tmp_path, nvidia=False)
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    report = tmp_path / "report.json"
    subprocess.run(
        [*local, "--dry-run", "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    (chosen,) = json.loads(report.read_text())["install"]
    assert chosen["metadata"]["version"] == "2.13.0+cpu"
    assert chosen["download_info"]["url"].startswith("file://")
