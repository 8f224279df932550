"""Answer keys: a question's visible test tells right from wrong without holding the answer.

A key holds salted digests of the normalised right answer and of each known wrong answer (with
the teaching message for it), never the answers themselves. The release writes one into each
question's visible test cell of a self-study notebook (`forge_course.answer_keys`), computed
from the same ``expected``/``hints`` (``correct``/``why_not``) the hidden tests use, so the
notebook and the grader give the same verdict and the same message.

Numbers are compared after rounding to as many significant digits as the tolerance allows
(``rel_tol=1e-9``: 9 digits), so 196, 196.0 and ``numpy.int64(196)`` agree; the hidden test's
``math.isclose`` can differ from it only for an answer within one rounding step of the
tolerance's edge. Letters are compared stripped and lower-cased.
"""

from __future__ import annotations

import hashlib
import math

SALT = "forge-course answer key 1"


def normal_number(value: float, rel_tol: float = 1e-9) -> str:
    """``value`` rounded to the significant digits ``rel_tol`` resolves, as text."""
    digits = max(1, min(15, round(-math.log10(rel_tol))))
    text = format(float(value), f".{digits}g")
    return "0" if text == "-0" else text


def normal_choice(letter: str) -> str:
    return letter.strip().lower()


def digest(grade_id: str, normal: str) -> str:
    """The salted digest of a normalised answer; the question's id is part of the salt, so two
    questions with the same answer have different digests."""
    return hashlib.sha256(f"{SALT}\0{grade_id}\0{normal}".encode()).hexdigest()[:16]


def number_key(
    grade_id: str, expected: float, *, rel_tol: float = 1e-9, hints: dict | None = None
) -> dict:
    """The key of a numeric question, from the arguments of its hidden ``check_number``."""
    return {
        "right": digest(grade_id, normal_number(expected, rel_tol)),
        "rel_tol": rel_tol,
        "hints": {
            digest(grade_id, normal_number(value, rel_tol)): slip
            for value, slip in (hints or {}).items()
        },
    }


def choice_key(grade_id: str, correct: str, why_not: dict | None = None) -> dict:
    """The key of a multiple-choice question, from the arguments of its hidden ``check_choice``."""
    return {
        "right": digest(grade_id, normal_choice(correct)),
        "hints": {digest(grade_id, normal_choice(c)): why for c, why in (why_not or {}).items()},
    }


def judge_number(key: dict, grade_id: str, answer: float) -> str | None:
    """None if ``answer`` is right, else the hidden test's message for it."""
    found = digest(grade_id, normal_number(answer, key.get("rel_tol", 1e-9)))
    if found == key["right"]:
        return None
    slip = key["hints"].get(found)
    return f"{answer} is not right: {slip}" if slip else f"{answer} is not right."


def judge_choice(key: dict, grade_id: str, answer: str) -> str | None:
    """None if ``answer`` is right, else the hidden test's message for it."""
    found = digest(grade_id, normal_choice(answer))
    if found == key["right"]:
        return None
    return f"{answer!r} is not right. {key['hints'].get(found, '')}".strip()


def labels_key(grade_id: str, correct: dict[str, str], hints: dict | None = None) -> dict:
    """The key of a labelling exercise (one code per item), from its hidden ``check_labels``:
    one digest per item, salted with the item's name too."""
    return {
        "right": {
            item: digest(f"{grade_id}:{item}", normal_choice(code))
            for item, code in correct.items()
        },
        "hints": dict(hints or {}),
    }


def wrongly_labelled(key: dict, grade_id: str, labels: dict[str, str]) -> list[str]:
    """The items of ``labels`` whose code is not the right one, in the key's order."""
    return [
        item
        for item, right in key["right"].items()
        if digest(f"{grade_id}:{item}", normal_choice(labels[item])) != right
    ]
