"""`forge-course grade --cluster ADDRESS`: the grading on a Dask cluster, the records here.

A class too large for one machine is graded by the workers of a Dask distributed cluster
(``pip install 'forge-course[cluster]'`` on every machine). The split of work follows the trust
boundary: a Dask worker only turns (the instructor's source notebook, one submission, the run's
settings) into results, in the same sandbox as a local run, one warm sandbox per Dask thread;
the process that started the run keeps everything that is recorded (ledger, gradebook,
feedback, CSV), so each student is recorded exactly once and a stopped run resumes as a local
one does. When a Dask worker dies, the scheduler gives its submission to another worker; the
submission is recorded once, when its results arrive.

Every machine must run the same grader code: the run compares a digest of each worker's
``forge_course`` package with its own, before it starts and with every submission.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path

from forge_course.grader import assignment as assignments
from forge_course.grader import sandbox
from forge_course.grader.submission import MAX_NOTEBOOK_BYTES, as_dict, grade_notebook

INSTALL = "pip install 'forge-course[cluster]'"


class ClusterUnusable(sandbox.SandboxError):
    """The cluster cannot grade this run (unreachable, no workers, other code, no sandbox)."""


def _describe_worker() -> dict:
    """What the run must know of a worker before it sends it a submission."""
    from forge_course.grader.run import grader_version

    return {"grader": grader_version(), "isolation": sandbox.isolation()}


class Cluster:
    """The run's side: a client of the scheduler at ``address``; `grade` blocks one thread."""

    def __init__(self, address: str, settings: dict, source_root: Path):
        try:
            from distributed import Client
        except ModuleNotFoundError as err:
            raise ClusterUnusable(f"--cluster needs Dask's distributed: {INSTALL}") from err
        try:
            self.client = Client(address, timeout="10s")
        except OSError as err:
            raise ClusterUnusable(f"no Dask scheduler answers at {address}: {err}") from err
        self.settings, self.source_root = settings, source_root
        self._check_workers()

    def _check_workers(self) -> None:
        described = self.client.run(_describe_worker)
        if not described:
            raise ClusterUnusable("the Dask cluster has no workers")
        for worker, facts in described.items():
            if facts["grader"] != self.settings["grader"]:
                raise ClusterUnusable(
                    f"the Dask worker {worker} runs other grader code than this machine: "
                    "install the same forge-course commit everywhere"
                )
            if facts["isolation"] != "bubblewrap" and not self.settings["unsafe"]:
                raise ClusterUnusable(
                    f"the Dask worker {worker} cannot run bubblewrap: {sandbox.INSTALL_BWRAP}"
                )

    def threads(self) -> int:
        """Submissions the cluster grades at once: one per Dask thread."""
        return sum(self.client.nthreads().values())

    def grade(self, assignment: assignments.Assignment, path: Path | None, seed: int) -> dict:
        source = (self.source_root / assignment.id / f"{assignment.id}.ipynb").read_text("utf-8")
        notebook = None
        if path is not None:  # one byte over the bound is enough for the worker to refuse it
            with path.open("rb") as f:
                notebook = f.read(MAX_NOTEBOOK_BYTES + 1)
        future = self.client.submit(
            grade_remotely, assignment.id, source, notebook, self.settings, pure=False
        )
        return future.result()

    def stop(self) -> None:
        """The run is stopping: its submissions under way are given up, and graded by the
        next run. Dask cannot end a running task, so each worker ends the task's jobs itself."""
        with contextlib.suppress(Exception):  # a worker gone, or the scheduler with it
            self.client.run(stop_remotely, self.settings["run"])
        self.client.close()

    def close(self) -> None:
        self.client.close()


# The Dask worker's side: state kept across the run's submissions, in each worker process.
_lock = threading.Lock()
_state: dict = {"settings": None, "workers": None, "assignments": {}, "folder": None}


def stop_remotely(run: str) -> None:
    """On each Dask worker, for the stopping run ``run``: end its jobs under way. The next run
    (another id in its settings) starts fresh sessions."""
    with _lock:
        _state["stopped"] = run  # and a submission of it that arrives later is not graded
        settings, workers = _state["settings"], _state["workers"]
    if settings is not None and settings.get("run") == run and workers is not None:
        workers.stop()


def grade_remotely(assignment_id: str, source: str, notebook: bytes | None, settings: dict):
    """Results of one submission as plain data, graded in this worker's warm sandboxes."""
    from forge_course.grader.run import _Workers, grader_version

    if grader_version() != settings["grader"]:
        raise ClusterUnusable("this Dask worker runs other grader code than the run")
    with _lock:
        if _state.get("stopped") == settings["run"]:
            raise RuntimeError("the run was stopped")
        if _state["folder"] is None:  # on a Dask worker only: the run's side never grades here
            _state["folder"] = tempfile.TemporaryDirectory(prefix="forge-cluster-")
        scratch = _state["folder"].name
        if _state["settings"] != settings:  # a new run: its seed, devices and limits
            if _state["workers"] is not None:
                _state["workers"].close()
            os.environ["FORGE_GRADING_SEED"] = str(settings["seed"])
            # This process serves one run after another: each names its own devices.
            own = _state.setdefault("own_device", os.environ.get("FORGE_DEVICE"))
            chosen = sandbox.chosen_devices(settings["device"]).get("FORGE_DEVICE", own)
            if chosen:
                os.environ["FORGE_DEVICE"] = chosen
            else:
                os.environ.pop("FORGE_DEVICE", None)
            limits = sandbox.Limits(**settings["limits"])
            stage_dir = Path(tempfile.mkdtemp(dir=scratch))
            sandbox.stage(stage_dir)
            workers = _Workers(limits, None, stage_dir, settings["device"])
            _state.update(settings=settings, workers=workers)
        workers = _state["workers"]
        key = (assignment_id, source)
        if key not in _state["assignments"]:
            folder = Path(tempfile.mkdtemp(dir=scratch))
            (folder / f"{assignment_id}.ipynb").write_text(source, encoding="utf-8")
            loaded = assignments.load(assignment_id, folder / f"{assignment_id}.ipynb")
            _state["assignments"][key] = loaded
        loaded = _state["assignments"][key]
    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        path = None
        if notebook is not None:
            path = Path(folder) / f"{assignment_id}.ipynb"
            path.write_bytes(notebook)
        with workers.one() as box:
            return as_dict(grade_notebook(loaded, path, box, settings["seed"]))
