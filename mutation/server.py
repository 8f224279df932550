"""Runs one chapter's mutants: a process that imports torch once and forks one child per mutant.

``python -m mutation.server JOB.json`` reads the chapter's settings cell, and for each exercise
its test cell, its solution and its mutants; it prints one JSON line per run. Each child does
what a notebook's kernel does for a learner who wrote the mutant: the settings cell, the answer
cell, then the exercise's test cell, visible and hidden tests alike (so every thorough case and
every device the check knows), in a fresh ``__main__`` module. The verdict:

* ``survived``: the test cell ran to the end;
* ``mistake``: the check raised its `Mistake` (killed, with the message the learner would read);
* ``error``: the answer cell itself failed, or the check ended in another exception (killed; an
  exception other than a `Mistake` from the test cell is worth a look: a check should explain);
* ``timeout``: past the time limit (killed: a learner's notebook would hang);
* ``crashed``: the child died without a verdict, killed by a signal or by exiting (killed).

The solution runs first, in a child like the others: it must pass, and its time sets the limit
of its mutants. Without an accelerator, that child also hands its reference observations back
(`forge_course.grading.core._EXPECTED`) so that the mutants, forked after, reuse them instead
of observing the reference again. With CUDA nothing runs in this process before the forks:
a child cannot use CUDA once its parent has.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pickle
import resource
import signal
import sys
import tempfile
import time
import traceback
import types

PR_SET_CHILD_SUBREAPER = 36  # orphans of a mutant's processes come back to us, to be ended


def _session(pid: int) -> list[int]:
    """The processes of the session ``pid`` leads (a child calls setsid first)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == pid:
            members.append(int(entry))
    return members


def _end(pid: int) -> None:
    for member in _session(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def _run_in_child(job: dict, source: str, tests: str, out: str, export: str | None) -> None:
    """The child's body: run the cells as a kernel would, write the verdict to ``out``."""
    from forge_course.grading.core import _EXPECTED, Mistake

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    verdict: dict = {"status": "survived", "detail": ""}
    start = time.monotonic()
    try:
        exec(compile(job["settings"], "<settings cell>", "exec"), main.__dict__)
    except BaseException as err:  # noqa: BLE001
        verdict = {"status": "setup", "detail": f"settings cell: {type(err).__name__}: {err}"}
    else:
        try:
            exec(compile(source, "<answer cell>", "exec"), main.__dict__)
        except BaseException as err:  # noqa: BLE001
            verdict = {"status": "error", "detail": f"answer cell: {type(err).__name__}: {err}"}
        else:
            try:
                exec(compile(tests, "<test cell>", "exec"), main.__dict__)
            except Mistake as err:
                verdict = {"status": "mistake", "detail": str(err)}
            except BaseException as err:  # noqa: BLE001
                where = traceback.extract_tb(err.__traceback__)[-1]
                verdict = {
                    "status": "error",
                    "detail": f"test cell: {type(err).__name__}: {err} "
                    f"({os.path.basename(where.filename)}:{where.lineno})",
                }
    verdict["seconds"] = round(time.monotonic() - start, 2)
    verdict["detail"] = verdict["detail"][:600]
    if export and verdict["status"] == "survived":
        with open(export, "wb") as file:
            pickle.dump(_cpu_only(_EXPECTED), file)
    with open(out + ".part", "w") as file:
        json.dump(verdict, file)
    os.replace(out + ".part", out)


def _cpu_only(cache: dict) -> dict:
    """The entries of the reference cache that hold no tensor off the CPU."""
    import torch

    def on_cpu(value) -> bool:
        if isinstance(value, torch.Tensor):
            return value.device.type == "cpu"
        if isinstance(value, dict):
            return all(on_cpu(v) for v in value.values())
        if isinstance(value, list | tuple):
            return all(on_cpu(v) for v in value)
        return True

    kept = {}
    for key, value in cache.items():
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001  (what cannot travel is observed again by each child)
            continue
        if on_cpu(value):
            kept[key] = value
    return kept


def _fork(job: dict, source: str, tests: str, folder: str, name: str, export: str | None):
    out, log = os.path.join(folder, name + ".json"), os.path.join(folder, name + ".log")
    pid = os.fork()
    if pid:
        return pid, out, log
    try:
        os.setsid()
        # A folder of its own: whatever a mutant writes to relative paths stays out of the repo.
        os.makedirs(os.path.join(folder, name + ".cwd"))
        os.chdir(os.path.join(folder, name + ".cwd"))
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        if job["memory_gib"]:
            limit = int(job["memory_gib"] * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        _run_in_child(job, source, tests, out, export)
    finally:
        os._exit(0)


def _verdict(out: str, log: str, status: int) -> dict:
    if os.path.exists(out):
        with open(out) as file:
            return json.load(file)
    how = (
        f"signal {os.WTERMSIG(status)}"
        if os.WIFSIGNALED(status)
        else f"exit code {os.WEXITSTATUS(status)}"
    )
    tail = ""
    if os.path.exists(log):
        with open(log, errors="replace") as file:
            tail = file.read()[-300:]
    return {"status": "crashed", "detail": f"ended by {how} without a verdict. {tail}".strip()}


def _run_all(job: dict, exercise: dict, runs: list[tuple[str, str]], limit: float, folder: str):
    """Run ``runs`` (key, source) at most ``job['jobs']`` at a time; yield (key, verdict)."""
    pending, running = list(runs), {}
    while pending or running:
        while pending and len(running) < job["jobs"]:
            key, source = pending.pop(0)
            name = f"m{len(pending)}_{abs(hash(key))}"
            pid, out, log = _fork(job, source, exercise["tests"], folder, name, None)
            running[pid] = (key, out, log, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for child, (key, _out, _log, started) in list(running.items()):
                if now - started > limit:
                    _end(child)
                    os.kill(child, signal.SIGKILL)
                    os.waitpid(child, 0)
                    del running[child]
                    detail = f"no verdict within {limit:.0f} s"
                    yield key, {"status": "timeout", "detail": detail, "seconds": limit}
            time.sleep(0.05)
            continue
        if pid not in running:
            continue  # an orphan of an earlier mutant, reaped
        key, out, log, started = running.pop(pid)
        _end(pid)
        verdict = _verdict(out, log, status)
        verdict.setdefault("seconds", round(time.monotonic() - started, 2))
        yield key, verdict


def _preload(sources: list[str]) -> None:
    """Import what the cells import, and what torch loads lazily on the first optimizer: once
    here, not in every child. Imports only: no cell runs in this process."""
    import ast
    import importlib

    names = ["torch._dynamo", "forge_course.grading.core"]
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.append(node.module)
                names += [f"{node.module}.{alias.name}" for alias in node.names]
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  (``from m import function``: not a module)
            continue


def serve(job: dict) -> None:
    import forge_course.grading.core as core

    _preload([job["settings"], *(e["tests"] for e in job["exercises"])])

    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    emit = lambda record: print(json.dumps(record), flush=True)
    with tempfile.TemporaryDirectory(prefix="forge-mutate-") as folder:
        for exercise in job["exercises"]:
            export = os.path.join(folder, "expected.pickle") if job["warm"] else None
            pid, out, log = _fork(job, exercise["original"], exercise["tests"], folder,
                                  exercise["id"], export)  # fmt: skip
            started = time.monotonic()
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() - started > job["baseline_limit"]:
                    _end(pid)
                    os.kill(pid, signal.SIGKILL)
                    _, status = os.waitpid(pid, 0)
                    break
                time.sleep(0.05)
            _end(pid)
            baseline = _verdict(out, log, status)
            baseline.setdefault("seconds", round(time.monotonic() - started, 2))
            emit({"exercise": exercise["id"], "baseline": baseline})  # "survived": it passes
            if baseline["status"] != "survived":
                continue
            if export and os.path.exists(export):
                with open(export, "rb") as file:
                    core._EXPECTED.update(pickle.load(file))
                os.unlink(export)
            limit = max(job["limit_floor"], job["limit_factor"] * baseline["seconds"])
            runs = [(m["key"], m["source"]) for m in exercise["mutants"]]
            for key, verdict in _run_all(job, exercise, runs, limit, folder):
                emit({"exercise": exercise["id"], "key": key, **verdict})


def main(argv: list[str]) -> int:
    with open(argv[0]) as file:
        job = json.load(file)
    import torch  # noqa: F401  (once, here: every child inherits it)

    serve(job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
