"""A control group per sandbox, where the machine lets the grader make one.

Resource limits (rlimits) bound each process, but the process limit counts every process of the
user, and root is exempt from it; a control group bounds the sandbox as a whole: at most
``pids`` processes and ``memory_mb`` of memory for everything the submission starts. Version 1
(one hierarchy per controller) and version 2 (one hierarchy) are both tried, below the grader's
own group. Where no hierarchy is writable, `make` returns None and the rlimits remain.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
# (v1 controller folder, file, v2 file): the same limit under both versions' names
LIMITS = {
    "pids": ("pids", "pids.max", "pids.max"),
    "memory": ("memory", "memory.limit_in_bytes", "memory.max"),
    "cpu": ("cpuacct", None, None),
}  # fmt: skip  (CPU time is only accounted)


def _own_paths() -> dict[str, str]:
    """This process's group in each hierarchy: {"pids": "/a/b", "": "/c"} ("" is version 2)."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _make_one(kind: str, value: str, own: dict[str, str], name: str) -> Path | None:
    folder, v1_file, v2_file = LIMITS[kind]
    candidates = []
    if folder in own:
        candidates.append((ROOT / folder / own[folder].lstrip("/") / name, v1_file))
    if "" in own:
        candidates.append((ROOT / own[""].lstrip("/") / name, v2_file))
    for group, file in candidates:
        existed = group.is_dir()  # version 2: one group for every controller
        try:
            group.mkdir(exist_ok=True)
        except OSError:
            continue
        try:
            if file:
                (group / file).write_text(value)
            return group
        except OSError:
            if not existed:
                group.rmdir()
    return None


def make(pids: int, memory_mb: int) -> list[Path]:
    """New groups limiting processes and memory; empty where the machine does not allow it."""
    try:
        own = _own_paths()
    except OSError:
        return []
    name = f"forge-sandbox-{uuid.uuid4().hex[:12]}"
    wanted = {"pids": str(pids), "memory": str(memory_mb * 2**20), "cpu": ""}
    made = [_make_one(kind, value, own, name) for kind, value in wanted.items()]
    return list(dict.fromkeys(group for group in made if group is not None))


def join(groups: list[Path]) -> None:
    """Move the calling process into ``groups`` (called in the sandbox before it starts)."""
    for group in groups:
        (group / "cgroup.procs").write_text("0")


def kill(groups: list[Path], rounds: int = 50) -> None:
    """SIGKILL every process in ``groups``: what a submission started escapes its process group
    with ``setsid``, never its control group. Version 2's ``cgroup.kill`` does it at once;
    elsewhere the members are killed until none is left (a fork may race one round)."""
    for group in groups:
        with contextlib.suppress(OSError):
            (group / "cgroup.kill").write_text("1")
            continue
        for _ in range(rounds):
            try:
                pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)


def remove(groups: list[Path], wait: float = 5.0) -> None:
    """Delete the groups once every process in them has ended (killed processes take a moment
    to leave, so an empty-looking group can still be busy)."""
    deadline = time.monotonic() + wait
    for group in groups:
        while group.exists():
            try:
                group.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)


def limit_hits(groups: list[Path]) -> int:
    """How often a process or memory limit of ``groups`` has refused or killed something."""
    hits = 0
    for group in groups:
        for file, key in (("pids.events", "max"), ("memory.events", "max")):
            with contextlib.suppress(OSError, ValueError):
                for line in (group / file).read_text().splitlines():
                    name, count = line.split()
                    hits += int(count) if name == key else 0
        with contextlib.suppress(OSError, ValueError):
            hits += int((group / "memory.failcnt").read_text())
    return hits


def cpu_seconds(groups: list[Path]) -> float | None:
    """CPU time used by everything in ``groups`` (None where no group accounts it)."""
    for group in groups:
        with contextlib.suppress(OSError, ValueError):
            return int((group / "cpuacct.usage").read_text()) / 1e9
        with contextlib.suppress(OSError, ValueError, StopIteration):
            stat = (group / "cpu.stat").read_text().splitlines()
            return int(next(v for k, v in map(str.split, stat) if k == "usage_usec")) / 1e6
    return None


def memory_peak_mb(groups: list[Path]) -> float | None:
    """The most memory ``groups`` have held since they were made, in MB (None where no group
    records it: version 2 before Linux 5.19)."""
    for group in groups:
        for file in ("memory.max_usage_in_bytes", "memory.peak"):  # version 1, version 2
            with contextlib.suppress(OSError, ValueError):
                return int((group / file).read_text()) / 2**20
    return None
