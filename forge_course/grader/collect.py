"""`nbgrader zip_collect` for the downloads of Canvas, Moodle and Blackboard.

An LMS's "download all submissions" zip names each file after its student (Canvas:
``doejane_late_12345_67890_ch04_one_training_step.ipynb``; Moodle: a folder
``Jane Doe_1234567_assignsubmission_file/``; Blackboard:
``Chapter 4_jdoe_attempt_2026-11-20-14-03-12_ch04_one_training_step.ipynb``). nbgrader's own
collector takes one regular expression, in which a group cannot be named twice, so this one
tries a list of them, one per LMS (``c.LmsCollector.patterns`` in
``autograder/nbgrader_config.py``). Part of each name is the student's own (what they called
their file, what they put in a zip, even their display name), so the collector reads the whole
download before it answers for any file, and never lets that part speak for someone else:

* a pattern reads one name in a file's path, a folder or the file; the first name from the top
  that an LMS's pattern reads is the one the LMS wrote, and everything below it is that
  student's (a folder named like another student's inside it is just a folder);
* every entry in one folder of a download comes from one LMS: the first whose pattern reads all
  of them reads each of them (so a Canvas file named like a Blackboard attempt stays Canvas's);
  a name that the pattern marks ``ambiguous``, or that two LMSes read as different students,
  is refused;
* the student id keeps to the grader's rule (letters, digits, ``.``, ``_``, ``-``): a name such as
  Moodle's "José Núñez" becomes ``jose.nunez``, so nbgrader and ``forge-course grade`` file the
  student under the same id. Two students who would share an id (two "Carol King"s, told apart
  by Moodle's participant number, or "José Núñez" and "Jose Nunez") are both refused, never
  filed over each other;
* a notebook the same student handed in twice, with no newer attempt to tell which counts, is
  refused; nbgrader would otherwise stop the whole class's collection at it;
* the notebook gets its released name back when the LMS or a browser changed it (Canvas's
  ``-1`` for a second upload, "Copy of", " (1)"), or ``nbgrader autograde`` would not find it;
* Blackboard's time stamp is written as one nbgrader reads.

Each refusal is logged as an error naming the files and why, and nbgrader lists them as
skipped; every other student is collected. `LmsExtractor` likewise keeps an archive a student
uploaded that cannot be unpacked from stopping the collection.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import unicodedata
import zipfile
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePath

from nbgrader.plugins import ExtractorPlugin, FileNameCollectorPlugin
from nbgrader.utils import unzip
from traitlets import Dict, Int, Unicode

from forge_course.grader.assignment import canonical
from forge_course.grader.run import student_id as graded_id

CANVAS_RESUBMISSION = re.compile(r"-\d+$")
BLACKBOARD_TIME = re.compile(r"(\d{4}-\d\d-\d\d)-(\d\d)-(\d\d)-(\d\d)")
ARCHIVES = [".zip", ".gz"]  # what nbgrader unpacks (ExtractorPlugin.zip_ext)


def plain_id(name: str) -> str:
    """A student id within the grader's rule, from a name as an LMS writes it.

    Accents are dropped, runs of other characters become one ``.``, and letters are lower-cased:
    "José Núñez" -> ``jose.nunez``. A name with no Latin letter or digit is kept as it is (the
    grader then files it under a hashed id, listed in ``student_ids.csv``), unless it is a path
    step such as ``..``.
    """
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    plain = re.sub(r"[^A-Za-z0-9_-]+", ".", ascii_name).strip(".-_").lower()
    if plain:
        return graded_id(plain)
    return graded_id(name) if name.strip(". ") == "" else name


def notebook_name(file_id: str, released: list[str]) -> str:
    """The released notebook ``file_id`` stands for, or ``file_id`` when none does."""
    path = PurePath(file_id)
    stem = canonical(CANVAS_RESUBMISSION.sub("", path.stem))
    return next((name for name in released if canonical(PurePath(name).stem) == stem), path.name)


def archive_folder(name: str, zip_ext: list[str] = ARCHIVES) -> str | None:
    """The folder nbgrader unpacks the archive ``name`` into, or None if it is no archive."""
    stem, ext = os.path.splitext(name)
    if ext not in zip_ext:
        return None
    inner, inner_ext = os.path.splitext(stem)
    return inner if inner_ext == ".tar" else stem


@dataclass
class Entry:
    """The name an LMS wrote for one student's submission, and who it says they are."""

    path: str  # inside the download
    lms: str
    found: dict  # the pattern's groups

    @property
    def student(self) -> tuple[str, str | None]:
        """The student as the LMS knows them: name or id, and Moodle's participant number."""
        return self.found["student_id"], self.found.get("participant")


class LmsCollector(FileNameCollectorPlugin):
    """Collects every submission of a Canvas, Moodle or Blackboard download."""

    patterns = Dict(
        value_trait=Unicode(),
        help="LMS name -> a regular expression that reads one name in a file's path inside the "
        "download: a folder that holds a student's files (groups student_id and optionally "
        "participant), or a file (also file_id, optionally timestamp); a file pattern also "
        "reads the folder an uploaded archive is unpacked into. A group named ambiguous that "
        "takes part in the match refuses the file.",
    ).tag(config=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._collected: dict[str, dict | None] | None = None

    def _extracted(self) -> Path | None:
        app = self.parent
        return Path(app._format_collect_path(app.extracted_directory)) if app else None

    def _inside_download(self, submitted_file: str) -> str:
        """The file's path inside the extracted downloads, with ``/`` between folders."""
        path = Path(submitted_file)
        extracted = self._extracted()
        if extracted is not None and path.is_relative_to(extracted):
            path = path.relative_to(extracted)
        return path.as_posix()

    def _download(self) -> list[str]:
        """Every file of the extracted downloads, by its path inside them."""
        extracted = self._extracted()
        if extracted is None:
            return []
        return [
            self._inside_download(os.path.join(root, name))
            for root, _, names in os.walk(extracted)
            for name in names
        ]

    def _released(self) -> list[str]:
        app = self.parent
        if app is None:
            return []
        folder = Path(app.coursedir.format_path(app.coursedir.release_directory, ".", ""))
        folder = folder / app.coursedir.assignment_id
        return sorted(p.name for p in folder.glob("*.ipynb"))

    def collect(self, submitted_file: str) -> dict | None:
        if Path(submitted_file).suffix not in self.valid_ext:
            return None
        if self._collected is None:
            self._collected = self.read_download(self._download())
        return self._collected.get(self._inside_download(submitted_file))

    def _readings(
        self, parts: list[str], unpacked: set[str], patterns: dict[str, re.Pattern]
    ) -> tuple[int, dict] | None:
        """The depth of the first name in ``parts`` that an LMS wrote, and each LMS's reading.

        A pattern with a ``file_id`` reads a file, or the folder an archive was unpacked into;
        one without reads any other folder.
        """
        for depth, name in enumerate(parts):
            is_file = depth == len(parts) - 1
            is_upload = "/".join(parts[: depth + 1]) in unpacked
            readings = {}
            for lms, pattern in patterns.items():
                if (is_file or is_upload) if "file_id" in pattern.groupindex else not is_file:
                    match = pattern.fullmatch(name)
                    if match is not None:
                        readings[lms] = match.groupdict()
            if readings:
                return depth, readings
        return None

    def read_download(self, paths: list[str]) -> dict[str, dict | None]:
        """What to collect for each file of a download: nbgrader's dict, or None.

        Args:
            paths: every file of the extracted downloads, by its path inside them.
        """
        patterns = {lms: re.compile(pattern) for lms, pattern in self.patterns.items()}
        unpacked = {
            str(PurePath(p).with_name(folder))
            for p in paths
            if (folder := archive_folder(PurePath(p).name)) is not None
        }
        notebooks = sorted(p for p in set(paths) if PurePath(p).suffix in self.valid_ext)
        found: dict[str, tuple[str, dict]] = {}  # notebook -> its entry's path, readings
        folders: dict[str, dict[str, dict]] = defaultdict(dict)  # folder -> entry -> readings
        for notebook in notebooks:
            parts = notebook.split("/")
            read = self._readings(parts, unpacked, patterns)
            if read is None:
                self.log.warning("No LMS's file names match %s: not collected", notebook)
                continue
            depth, readings = read
            entry = "/".join(parts[: depth + 1])
            found[notebook] = entry, readings
            folders["/".join(parts[:depth])][entry] = readings

        entries: dict[str, Entry | None] = {}
        for entries_here in folders.values():
            whole = [lms for lms in self.patterns if all(lms in r for r in entries_here.values())]
            for path, readings in entries_here.items():
                entries[path] = self._entry(path, {lms: readings[lms] for lms in whole or readings})

        collected: dict[str, dict | None] = dict.fromkeys(notebooks)
        submitted: dict[str, list[tuple[str, Entry, dict]]] = defaultdict(list)
        for notebook, (path, _) in found.items():
            entry = entries[path]
            if entry is None:
                continue
            info = self._info(notebook, entry)
            if info is not None:
                submitted[info["student_id"]].append((notebook, entry, info))
        for student, handed_in in submitted.items():
            for notebook, entry, info in self._fileable(student, handed_in):
                self.log.info("%s: %s is %s's", entry.lms, notebook, entry.student[0])
                collected[notebook] = info
        return collected

    def _entry(self, path: str, readings: dict[str, dict]) -> Entry | None:
        """The one reading of an entry, or None (logged) when it has none or several."""
        lms, found = next(iter(readings.items()))
        students = {plain_id(r["student_id"]) for r in readings.values()}
        if len(students) > 1 or found.get("ambiguous") is not None:
            self.log.error(
                "%s could name more than one student (%s): nothing in it is collected. Find "
                "whose it is in the LMS and file it by hand.",
                path, ", ".join(sorted(students)) if len(students) > 1 else lms,
            )  # fmt: skip
            return None
        return Entry(path, lms, found)

    def _info(self, notebook: str, entry: Entry) -> dict | None:
        """nbgrader's dict for one notebook of ``entry``, or None (logged)."""
        own_name = entry.path == notebook and entry.found.get("file_id")
        info = {
            "student_id": plain_id(entry.found["student_id"]),
            "file_id": notebook_name(own_name or PurePath(notebook).name, self._released()),
        }
        if entry.found.get("timestamp"):
            stamp = BLACKBOARD_TIME.sub(r"\1 \2:\3:\4", entry.found["timestamp"])
            try:
                datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
            except ValueError:
                self.log.error("%s: no such time as %s: not collected", notebook, stamp)
                return None
            info["timestamp"] = stamp
        return info

    def _fileable(self, student: str, handed_in: list[tuple[str, Entry, dict]]) -> list:
        """What of ``handed_in`` can be filed as ``student``'s; each refusal is logged."""
        people = sorted({entry.student for _, entry, _ in handed_in}, key=str)
        if len(people) > 1:
            named = [f"{name!r}" + (f" (participant {n})" if n else "") for name, n in people]
            self.log.error(
                "%s and %s would each be filed as the student %s, one replacing another: none "
                "of them is collected (%s). Rename all but one in the download and collect again.",
                ", ".join(named[:-1]), named[-1], student, ", ".join(n for n, _, _ in handed_in),
            )  # fmt: skip
            return []
        by_notebook = defaultdict(list)
        for notebook, _, info in handed_in:
            by_notebook[info["file_id"]].append((info.get("timestamp"), notebook))
        refused = set()
        for file_id, copies in by_notebook.items():
            stamps = [stamp for stamp, _ in copies]
            newest = None if None in stamps else max(stamps)
            if len(copies) > 1 and (newest is None or stamps.count(newest) > 1):
                self.log.error(
                    "%s handed in %d files that are each %s, none newer than the others (%s): "
                    "none is collected. Keep the one that counts in the download and collect "
                    "again.",
                    student, len(copies), file_id, ", ".join(n for _, n in copies),
                )  # fmt: skip
                refused.add(file_id)
        return [item for item in handed_in if item[2]["file_id"] not in refused]


class LmsExtractor(ExtractorPlugin):
    """nbgrader's extractor, except for the archives students uploaded inside a download.

    nbgrader unpacks those too, and stops the whole collection at the first one it cannot (a
    ``notes.gz`` that is no tar, a broken zip, a zip next to a file of its folder's name) and
    unpacks archives inside archives without end. Here each is unpacked once, into a folder of
    its own name as nbgrader does, unless that name is taken, the archive is broken or it
    unpacks to more than ``upload_limit_mb``: then it is left packed, with a warning.
    """

    upload_limit_mb = Int(
        200, help="The most an archive a student uploaded may unpack to, in MB."
    ).tag(config=True)

    def extract(self, archive_path: str, extracted_path: str) -> None:
        downloads = []
        for root, _, names in os.walk(archive_path):
            into = Path(extracted_path) / Path(root).relative_to(archive_path)
            into.mkdir(parents=True, exist_ok=True)
            for name in sorted(names):
                folder = archive_folder(name, self.zip_ext)
                if folder is None:
                    shutil.copy(Path(root) / name, into / name)
                    continue
                self.log.info("Extracting from: %s", Path(root) / name)
                unzip(
                    str(Path(root) / name), str(into), zip_ext=self.zip_ext, create_own_folder=True
                )
                downloads.append(into / folder)
        for download in downloads:
            uploads = [
                Path(root) / name
                for root, _, names in os.walk(download)
                for name in names
                if archive_folder(name, self.zip_ext)
            ]
            for upload in sorted(uploads):
                self._unpack_upload(upload)

    def _unpack_upload(self, upload: Path) -> None:
        into = upload.parent / archive_folder(upload.name, self.zip_ext)
        if into.exists():
            self.log.warning("%s is not unpacked: %s is there already", upload, into.name)
            return
        try:
            if zipfile.is_zipfile(upload):
                with zipfile.ZipFile(upload) as archive:
                    size = sum(m.file_size for m in archive.infolist())
            else:
                with tarfile.open(upload) as archive:
                    size = sum(m.size for m in archive.getmembers())
            if size > self.upload_limit_mb * 1_000_000:
                self.log.warning("%s is not unpacked: it holds %d MB", upload, size // 1_000_000)
                return
            unzip(str(upload), str(upload.parent), zip_ext=self.zip_ext, create_own_folder=True)
        except Exception as error:  # noqa: BLE001 (whatever a student's file holds, go on)
            shutil.rmtree(into, ignore_errors=True)
            self.log.warning("%s is not unpacked (%s): nothing in it is collected", upload, error)
