"""The grader's signed ledger, and the ids students are graded under: what `forge-course grade`
records and what its readers (`forge-course report`) trust.

Kept apart from `run` so that a reader imports only the standard library: `run` imports
nbformat, nbgrader and PyTorch, which take seconds to load.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
import unicodedata
from pathlib import Path

SAFE_ID = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8", newline=""
    ) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f.name, path)


def student_id(folder_name: str) -> str:
    """The id a student folder is graded under.

    The rule: letters, digits, ``.``, ``_`` and ``-``, at most 64 characters, not beginning
    with ``-`` or ``.`` (after Unicode NFC normalisation). A name outside the rule gets
    ``student-`` and 16 hex digits of its SHA-256 (its own, so no two names share one); the
    run's ``student_ids.csv`` maps it back to the folder's name.
    """
    name = unicodedata.normalize("NFC", folder_name) if folder_name.isprintable() else folder_name
    if 0 < len(name) <= 64 and set(name) <= SAFE_ID and name[0] not in "-.":
        return name
    raw = folder_name.encode("utf-8", "surrogateescape")
    return "student-" + hashlib.sha256(raw).hexdigest()[:16]


def discover(submitted: Path, only: list[str] | None) -> list[tuple[str, str, Path]]:
    """(folder name, assignment, folder) for every submission folder, symbolic links included
    (they are refused when graded, under the student's own id)."""
    found = []
    for student in sorted(submitted.iterdir(), key=lambda p: p.name):
        if not (student.is_dir() or student.is_symlink()):
            continue
        if student.is_symlink():
            found += [(student.name, a, student) for a in only or []]
            continue
        for folder in sorted(student.iterdir(), key=lambda p: p.name):
            if (folder.is_dir() or folder.is_symlink()) and (only is None or folder.name in only):
                found.append((student.name, folder.name, folder))
    return found


class Ledger:
    """One signed entry per (assignment, student): what a resumed run may keep."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        key = folder / ".key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        self._key = key.read_text().strip().encode()

    def path(self, assignment_id: str, student: str) -> Path:
        name = hashlib.sha256(student.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        return self.folder / assignment_id / f"{name}.json"

    def _sign(self, record: dict) -> str:
        body = json.dumps(record, sort_keys=True, ensure_ascii=True).encode()
        return hmac.new(self._key, body, hashlib.sha256).hexdigest()

    def read(self, assignment_id: str, student: str, key: dict) -> dict | None:
        """The saved results if the entry is genuine and was made under ``key``."""
        try:
            saved = json.loads(self.path(assignment_id, student).read_text())
            record, signature = saved["record"], saved["signature"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None
        if not isinstance(signature, str) or not hmac.compare_digest(signature, self._sign(record)):
            return None
        if record.get("key") != key or record.get("student") != student:
            return None
        return record.get("results")

    def records(self, assignment_id: str) -> list[dict]:
        """Every genuine entry of ``assignment_id`` (student, key, results), whatever its key:
        what a reader such as `forge-course report` may trust."""
        found = []
        for path in sorted((self.folder / assignment_id).glob("*.json")):
            try:
                saved = json.loads(path.read_text())
                record, signature = saved["record"], saved["signature"]
                genuine = hmac.compare_digest(signature, self._sign(record))
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                continue
            # Under its own student's name only: a genuine entry copied to another is refused.
            if (
                genuine
                and isinstance(record, dict)
                and path == self.path(assignment_id, str(record.get("student")))
            ):
                found.append(record)
        return found

    def write(self, assignment_id: str, student: str, key: dict, results: dict) -> None:
        record = {"student": student, "key": key, "results": results}
        text = json.dumps({"record": record, "signature": self._sign(record)}, indent=1)
        write_atomically(self.path(assignment_id, student), text)


def read_ledger(folder: Path, assignment_id: str) -> list[dict]:
    """`Ledger.records` of the ledger in ``folder``, without creating one where there is none."""
    return Ledger(folder).records(assignment_id) if (folder / ".key").exists() else []
