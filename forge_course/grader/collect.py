"""`nbgrader zip_collect` for the downloads of Canvas, Moodle and Blackboard.

An LMS's "download all submissions" zip names each file after its student (Canvas:
``doejane_late_12345_67890_ch04_one_training_step.ipynb``; Moodle: a folder
``Jane Doe_1234567_assignsubmission_file/``; Blackboard:
``Chapter 4_jdoe_attempt_2026-11-20-14-03-12_ch04_one_training_step.ipynb``). nbgrader's own
collector takes one regular expression, in which a group cannot be named twice, so this one
tries a list of them, one per LMS (``c.LmsCollector.patterns`` in
``autograder/nbgrader_config.py``), on each file's path inside the download. Then it makes what
it found usable by the tools downstream:

* the student id keeps to the grader's rule (letters, digits, ``.``, ``_``, ``-``): a name such as
  Moodle's "José Núñez" becomes ``jose.nunez``, so nbgrader and ``forge-course grade`` file the
  student under the same id. Names that differ only in accents, case or punctuation ("José
  Núñez", "Jose Nunez", "JOSE NUNEZ") would share that id: the first one collected keeps it,
  and each other is refused with an error naming both, never filed over the first;
* the notebook gets its released name back when the LMS or a browser changed it (Canvas's
  ``-1`` for a second upload, "Copy of", " (1)"), or ``nbgrader autograde`` would not find it;
* Blackboard's time stamp is written as one nbgrader reads.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path, PurePath

from nbgrader.plugins import FileNameCollectorPlugin
from traitlets import Dict, Unicode

from forge_course.grader.assignment import canonical
from forge_course.grader.run import student_id as graded_id

CANVAS_RESUBMISSION = re.compile(r"-\d+$")
BLACKBOARD_TIME = re.compile(r"(\d{4}-\d\d-\d\d)-(\d\d)-(\d\d)-(\d\d)")


def plain_id(name: str) -> str:
    """A student id within the grader's rule, from a name as an LMS writes it.

    Accents are dropped, runs of other characters become one ``.``, and letters are lower-cased:
    "José Núñez" -> ``jose.nunez``. A name with no Latin letter or digit is kept as it is (the
    grader then files it under a hashed id, listed in ``student_ids.csv``).
    """
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    plain = re.sub(r"[^A-Za-z0-9_-]+", ".", ascii_name).strip(".-_").lower()
    return graded_id(plain) if plain else name


def notebook_name(file_id: str, released: list[str]) -> str:
    """The released notebook ``file_id`` stands for, or ``file_id`` when none does."""
    path = PurePath(file_id)
    stem = canonical(CANVAS_RESUBMISSION.sub("", path.stem))
    return next((name for name in released if canonical(PurePath(name).stem) == stem), path.name)


class LmsCollector(FileNameCollectorPlugin):
    """Collects every submission of a Canvas, Moodle or Blackboard download."""

    patterns = Dict(
        value_trait=Unicode(),
        help="LMS name -> a regular expression with the groups student_id and file_id (and "
        "optionally timestamp), matched against the whole path of a file inside the download.",
    ).tag(config=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._names: dict[str, str] = {}  # id -> the first name filed under it

    def _inside_download(self, submitted_file: str) -> str:
        """The file's path inside the extracted downloads, with ``/`` between folders."""
        path = Path(submitted_file)
        app = self.parent
        extracted = Path(app._format_collect_path(app.extracted_directory)) if app else None
        if extracted is not None and path.is_relative_to(extracted):
            path = path.relative_to(extracted)
        return path.as_posix()

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
        inside = self._inside_download(submitted_file)
        for lms, pattern in self.patterns.items():
            match = re.fullmatch(pattern, inside)
            if match is None:
                continue
            found = match.groupdict()
            self.log.info("%s: %s is %s's", lms, inside, found["student_id"])
            student = plain_id(found["student_id"])
            first = self._names.setdefault(student, found["student_id"])
            if first != found["student_id"]:
                self.log.error(
                    "%r and %r would both be filed as the student %s, one replacing the other: "
                    "%s is not collected. Rename one of them in the download and collect again.",
                    first, found["student_id"], student, inside,
                )  # fmt: skip
                return None
            info = {
                "student_id": student,
                "file_id": notebook_name(found["file_id"], self._released()),
            }
            if found.get("timestamp"):
                info["timestamp"] = BLACKBOARD_TIME.sub(r"\1 \2:\3:\4", found["timestamp"])
            return info
        self.log.warning("No LMS's file names match %s: not collected", inside)
        return None
