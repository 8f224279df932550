"""Text every writer downstream accepts, and CSV that a spreadsheet reads as data.

Student ids come from folder names and messages from answers, so a field may hold lone
surrogates or control characters, begin with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
return, or hold a newline and commas. Opened in a spreadsheet, the second is run as a formula;
written unquoted, the third adds rows. Every CSV the course writes goes through `csv_text`.
Imports nothing heavy: `forge-course report` uses it without nbgrader or PyTorch.
"""

from __future__ import annotations

import csv
import io
import unicodedata

MAX_MESSAGE = 2000  # characters of a message kept in the ledger, feedback and CSV
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def clean_text(text: object, limit: int = MAX_MESSAGE) -> str:
    """``text`` as valid, printable Unicode of at most ``limit`` characters: lone surrogates and
    control characters (but newline and tab) replaced, so no writer downstream can fail on it."""
    text = str(text).encode("utf-8", "replace").decode("utf-8")
    text = "".join(
        c if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cs") else "\ufffd"
        for c in text[: limit + 1]
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def spreadsheet_safe(value: object) -> str:
    """One line of text, with a leading ``'`` where a spreadsheet would read a formula."""
    text = clean_text(value, 500).replace("\r", " ").replace("\n", " ")
    return "'" + text if text.startswith(FORMULA_START) else text


def csv_text(rows: list[list]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for row in rows:
        writer.writerow([v if type(v) in (int, float) else spreadsheet_safe(v) for v in row])
    return out.getvalue()
