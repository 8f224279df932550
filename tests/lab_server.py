"""Start the course's JupyterLab for a test, and stop it with everything it started.

Two ways in: `make lab` in the repository (a developer's clone), and the README's pip-only
set-up run as written, in a copy of the course with a fresh venv and no `make` on ``PATH``
(a learner's laptop, Windows included: the README's PowerShell block must say the same).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from forge_course.ports import free_port
from tests.conftest import REPO

TOKEN = "forge-test-token"
LEARNER_HEADING = "### On your own computer"


def get(url: str, method: str = "GET") -> bytes:
    request = urllib.request.Request(
        url, headers={"Authorization": f"token {TOKEN}"}, method=method
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def shut_down_kernels(base: str) -> None:
    """End every kernel the Lab runs, as a learner closing a chapter would: an idle kernel left
    running holds its memory and wakes for its widgets while the next chapter runs."""
    for kernel in json.loads(get(f"{base}/api/kernels")):
        get(f"{base}/api/kernels/{kernel['id']}", method="DELETE")


def readme_commands(language: str, readme: Path = REPO / "README.md") -> list[str]:
    """The commands of the first ``language`` block under the README's learner set-up."""
    text = readme.read_text(encoding="utf-8")
    section = text[text.index(LEARNER_HEADING) :]
    block = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert block, f"no {language} block under {LEARNER_HEADING!r} in README.md"
    lines = [line.strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def pip_only_course(root: Path) -> Path:
    """A copy of the course set up with the README's first Linux/macOS command, as written.

    ``PATH`` holds ``python3`` alone (this interpreter's base Python: the local torch wheel is
    built for it), so nothing else a developer has, `make` included, can be used by accident.
    """
    course, bin_dir = root / "course", root / "bin"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        if (REPO / name).is_file():  # a file deleted in the work tree is not part of a clone
            (course / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, course / name)
    bin_dir.mkdir()
    base_python = (
        Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    )
    (bin_dir / "python3").symlink_to(base_python)
    assert shutil.which("make", path=str(bin_dir)) is None
    subprocess.run(
        ["/bin/bash", "-c", readme_commands("bash")[0]], cwd=course,
        env=learner_environment(bin_dir), check=True, stdout=subprocess.DEVNULL, timeout=1200,
    )  # fmt: skip
    return course


def shared_pip_only_course(tmp_path_factory) -> Path:
    """`pip_only_course`, set up once per test run even where xdist workers both need it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return pip_only_course(tmp_path_factory.mktemp("pip-only"))
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent / "pip-only"  # the run's, shared by its workers
    with FileLock(f"{root}.lock"):
        if not (root / "ready").exists():
            shutil.rmtree(root, ignore_errors=True)  # a set-up that failed half-way
            root.mkdir()
            pip_only_course(root)
            (root / "ready").touch()
    return root / "course"


def learner_environment(bin_dir: Path) -> dict[str, str]:
    # pip's settings (this machine's local index and wheels) stay; the tools a developer has go.
    return {**os.environ, "PATH": str(bin_dir)}


def readme_lab(port: int, args: str) -> list[str]:
    """The README's second Linux/macOS command, as written, on ``port`` with Jupyter arguments."""
    return ["/bin/bash", "-c", f"exec {readme_commands('bash')[1]} --port {port} {args}"]


def pip_only_lab(course: Path, state: Path):
    """`lab` run by the README's `forge-course lab` in a `pip_only_course`, ``PATH`` as there."""
    return lab(course, state, readme_lab, learner_environment(course.parent / "bin"))


def make_lab(port: int, args: str) -> list[str]:
    return ["make", "--no-print-directory", "lab", f"LAB_PORT={port}", f"LAB_ARGS={args}"]


@contextmanager
def lab(
    course: Path,
    state: Path,
    start: Callable[[int, str], list[str]] = make_lab,
    env: dict[str, str] | None = None,
):
    """Yield the base URL of a JupyterLab that ``start(port, jupyter_args)`` runs in ``course``.

    Its state (settings, workspaces, runtime files) is kept under ``state``; its token is
    `TOKEN`, given the way a learner's environment would (``JUPYTER_TOKEN``).
    """
    port = free_port()
    args = f"--no-browser --LabApp.workspaces_dir={shlex.quote(str(state))}"
    settings = state / "settings"
    # Render every cell (no virtual scrolling), so a test can see every output of a notebook.
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text('{"windowingMode": "none"}')
    # Never write a test's outputs back into the notebooks.
    docmanager = settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    docmanager.parent.mkdir(parents=True, exist_ok=True)
    docmanager.write_text('{"autosave": false}')
    env = {
        **(env or os.environ),
        "JUPYTER_TOKEN": TOKEN,
        "JUPYTER_RUNTIME_DIR": str(state / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
    }
    log = state / "lab.log"  # a file, not a pipe: nobody reads while the Lab writes
    with log.open("w") as output:
        server = subprocess.Popen(
            start(port, args), cwd=course, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                get(f"{base}/lab")  # the Lab extension answers last
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"the Lab exited:\n{log.read_text()}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError("JupyterLab did not answer within 120 s") from None
                time.sleep(0.5)
        yield base
    finally:
        stop(server)


def stop(server: subprocess.Popen) -> None:
    """End the Lab and its kernels (and make, where it started them): their process group."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
