"""`make lab` serves JupyterLab with the course index and the chapters, over real HTTP."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.conftest import CHAPTERS, REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


@pytest.mark.slow
def test_make_lab_serves_the_index_and_every_chapter(tmp_path):
    port, token = _free_port(), "forge-test-token"
    args = f"--no-browser --IdentityProvider.token={token} --LabApp.workspaces_dir={tmp_path}"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    server = subprocess.Popen(
        ["make", "--no-print-directory", "lab", f"LAB_PORT={port}", f"LAB_ARGS={args}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                page = _get(f"{base}/lab", token).decode()
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "JupyterLab did not answer within 90 s"
                time.sleep(0.5)
        assert "JupyterLab" in page
        index = json.loads(_get(f"{base}/api/contents/notebooks/index.ipynb", token))
        assert index["type"] == "notebook"
        for chapter in CHAPTERS:
            path = f"notebooks/{chapter}/{chapter}.ipynb"
            model = json.loads(_get(f"{base}/api/contents/{path}", token))
            assert model["content"]["cells"], f"{path} is empty"
    finally:
        _stop(server)


def _stop(server: subprocess.Popen) -> None:
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
