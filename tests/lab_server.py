"""Start `make lab` on a free loopback port for a test, and stop it with everything it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

TOKEN = "forge-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


@contextmanager
def lab(repo: Path, state: Path):
    """Yield the base URL of a JupyterLab started by `make lab`, its state kept under ``state``."""
    port = free_port()
    args = f"--no-browser --IdentityProvider.token={TOKEN} --LabApp.workspaces_dir={state}"
    settings = state / "settings"
    # Render every cell (no virtual scrolling), so a test can see every output of a notebook.
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text('{"windowingMode": "none"}')
    # Never write a test's outputs back into the committed notebooks.
    docmanager = settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    docmanager.parent.mkdir(parents=True, exist_ok=True)
    docmanager.write_text('{"autosave": false}')
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(state / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
    }
    server = subprocess.Popen(
        ["make", "--no-print-directory", "lab", f"LAB_PORT={port}", f"LAB_ARGS={args}"],
        cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                get(f"{base}/lab")  # the Lab extension answers last
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"make lab exited:\n{server.stdout.read()}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError("JupyterLab did not answer within 90 s") from None
                time.sleep(0.5)
        yield base
    finally:
        stop(server)


def stop(server: subprocess.Popen) -> None:
    """End make, JupyterLab and its kernels: the whole process group they share."""
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
