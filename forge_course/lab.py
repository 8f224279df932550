"""`forge-course lab`: open the course in JupyterLab, with the course's settings, on any system.

`make lab` calls this command, so a clone with `make` and a pip-only set-up (Windows has no
`make`) open the same Lab: the course index as the first page, the course's folder as Lab's
root, loopback only, and ``JUPYTER_CONFIG_PATH`` set to ``autograder/``, where nbgrader's Lab
extensions find the course's config and Lab reads ``labconfig`` (no "get Jupyter news?" prompt
for every new learner). A learner's Lab reads ``autograder/learner/`` first: nbgrader's Validate
without the instructor's panels, which ``--instructor`` brings back. Containers often run as
root, which Jupyter refuses unless told it is intended, so ``allow_root`` is set there and only
there.

What a learner can fix is checked before Jupyter starts, and said in one line without a
traceback: a Python or a torch older than the package asks for, JupyterLab missing, the
notebooks missing (an installed package without its clone), the port taken, no web browser.
The messages are plain ASCII (but for the paths they quote), so a Windows console in any code
page can print them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import secrets
import socket
import subprocess
import sys
import sysconfig
import webbrowser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

# In a clone, the package sits in the course's folder; installed from an index, it does not.
COURSE = Path(__file__).resolve().parent.parent
INDEX = "notebooks/index.ipynb"
HOST = "127.0.0.1"
DEFAULT_PORT = 8888
DISTRIBUTION = "forge-course"


class CannotStart(Exception):
    """Something the learner can fix; the message says how, in one line."""


def pip_command(arguments: str) -> str:
    """How to run pip with this Python, as a learner can paste it into their shell."""
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):  # outside the current folder: the full path
        python = python.relative_to(Path.cwd())
    if " " not in str(python):
        return f"{python} -m pip {arguments}"
    # PowerShell runs a quoted path only after its call operator.
    return f'{"& " if os.name == "nt" else ""}"{python}" -m pip {arguments}'


def check_python(requires_python: str, version: str | None = None) -> None:
    version = version or platform.python_version()
    if not SpecifierSet(requires_python).contains(version, prereleases=True):
        raise CannotStart(
            f"forge-course needs Python {requires_python} and this is Python {version}: "
            f"make the venv again with a newer Python."
        )


def check_torch(requirements: list[str], installed: str | None) -> None:
    wanted = next((Requirement(r) for r in requirements if Requirement(r).name == "torch"), None)
    if wanted is None:
        return
    if installed is None or not wanted.specifier.contains(installed, prereleases=True):
        have = f"torch {installed}" if installed else "no torch"
        upgrade = pip_command(f'install --upgrade "{wanted}"')
        raise CannotStart(f"forge-course needs {wanted} and this Python has {have}: run {upgrade}")


def check_package() -> None:
    """The running Python has forge-course installed, new enough in what it depends on."""
    try:
        metadata = importlib.metadata.metadata(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise CannotStart(
            f"forge_course is not installed in this Python: run "
            f"{pip_command('install -c constraints.txt -e . jupyterlab')} in the course's folder."
        ) from None
    check_python(metadata["Requires-Python"] or "")
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    check_torch(importlib.metadata.requires(DISTRIBUTION) or [], torch_version)


def check_jupyterlab() -> None:
    if importlib.util.find_spec("jupyterlab") is None:
        raise CannotStart(f"JupyterLab is not installed: run {pip_command('install jupyterlab')}")


def check_course(course: Path) -> None:
    if not (course / INDEX).is_file():
        urls = importlib.metadata.metadata(DISTRIBUTION).get_all("Project-URL") or []
        repository = next((u.split(",", 1)[1].strip() for u in urls if "," in u), "the course")
        raise CannotStart(
            f"The notebooks are not next to this installation ({course}): clone {repository}, "
            f"then follow its README's set-up in that folder."
        )


def port_is_free(port: int) -> bool:
    """Whether Jupyter could listen on ``port`` (binding it as Jupyter does)."""
    with socket.socket() as probe:
        if os.name != "nt":  # as Tornado: a closed connection's TIME_WAIT does not block a port
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def check_port(port: int) -> None:
    if not port_is_free(port):
        free = next((p for p in range(port + 1, min(port + 100, 65536)) if port_is_free(p)), 0)
        suggestion = f"forge-course lab --port {free}" if free else "forge-course lab --port N"
        raise CannotStart(
            f"Port {port} is in use (another JupyterLab?): stop that one or run {suggestion}"
        )


def browser_found() -> bool:
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def jupyter_arguments(course: Path, port: int, open_browser: bool, extra: list[str]) -> list[str]:
    """JupyterLab's command-line arguments for the course; ``extra`` comes last and wins."""
    arguments = [
        f"--ServerApp.ip={HOST}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",  # the port was checked: never drift to another silently
        f"--ServerApp.root_dir={course}",
        f"--LabApp.default_url=/lab/tree/{INDEX}",
    ]
    if getattr(os, "geteuid", lambda: -1)() == 0:
        arguments.append("--ServerApp.allow_root=True")
    if not open_browser:
        arguments.append("--no-browser")
    return arguments + extra


def jupyter_environment(course: Path, instructor: bool = False) -> dict[str, str]:
    # A learner's Lab reads autograder/learner first: nbgrader's Validate, not the instructor's
    # panels (the first folder of the path wins where two set the same thing).
    config = [course / "autograder"] if instructor else [course / "autograder" / "learner",
                                                          course / "autograder"]  # fmt: skip
    # The venv's scripts first, as activating it would: Lab's terminals and `!pip` use them.
    scripts = sysconfig.get_path("scripts")
    return {
        **os.environ,
        "JUPYTER_CONFIG_PATH": os.pathsep.join(str(folder) for folder in config),
        "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")]),
    }


def launch(command: list[str], env: dict[str, str]) -> int:
    """Run JupyterLab until it stops; return its exit status."""
    sys.stdout.flush()
    if os.name == "posix":  # become Jupyter: signals and the terminal go straight to it
        os.execve(command[0], command, env)
    with subprocess.Popen(command, env=env) as server:
        while True:
            try:
                return server.wait()
            except KeyboardInterrupt:
                continue  # Jupyter got the same Ctrl+C and asks whether to stop


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="forge-course lab",
        allow_abbrev=False,
        description="Open the course in JupyterLab. Other arguments go to JupyterLab.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default: %(default)s")
    parser.add_argument(
        "--instructor",
        action="store_true",
        help="nbgrader's instructor tools too (Formgrader, Create Assignment)",
    )
    parser.add_argument(
        "--no-browser",
        action="store_true",
        help="do not open a browser (JupyterLab prints the address)",
    )
    return parser.parse_known_args(argv)


def trust_unrun_notebooks(course: Path) -> None:
    """Sign the course's notebooks that hold no output, as ``jupyter trust`` would.

    Jupyter shows a notebook's outputs as they are only where this user signed it. A chapter as
    released has no output to distrust, yet unsigned, Lab marks it "not trusted" in its status
    bar and the server logs a warning for each one opened. A notebook with outputs (a learner's
    own work: Jupyter signs what it saves from Lab) is left as it is.
    """
    import nbformat
    from nbformat.sign import NotebookNotary

    notary = NotebookNotary()
    try:
        for path in sorted((course / "notebooks").rglob("*.ipynb")):
            try:
                nb = nbformat.read(path, as_version=4)
            except (OSError, ValueError):  # not a notebook Jupyter could open either
                continue
            if not any(cell.get("outputs") for cell in nb.cells):
                notary.sign(nb)
    finally:
        notary.store.close()


def main(argv: list[str], course: Path = COURSE) -> int:
    args, extra = parse(argv)
    try:
        check_package()
        check_jupyterlab()
        check_course(course)
        check_port(args.port)
    except CannotStart as problem:
        print(f"forge-course lab: {problem}", file=sys.stderr)
        return 2
    env = jupyter_environment(course, args.instructor)
    trust_unrun_notebooks(course)
    open_browser = not args.no_browser
    if open_browser and not browser_found():
        open_browser = False
        address = f"http://{HOST}:{args.port}/lab/tree/{INDEX}"
        if not any("token" in argument.lower() for argument in extra):
            env["JUPYTER_TOKEN"] = env.get("JUPYTER_TOKEN") or secrets.token_hex(24)
            address += f"?token={env['JUPYTER_TOKEN']}"
        print(f"forge-course lab: no web browser found: open {address} in one.", flush=True)
    arguments = jupyter_arguments(course, args.port, open_browser, extra)
    return launch([sys.executable, "-m", "jupyterlab", *arguments], env)
