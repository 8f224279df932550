"""How a failed check looks in a notebook: the exercise, what is wrong, and the learner's code.

A check that fails raises `Mistake` from deep inside the course's checking code, and IPython's
usual traceback walks through every frame of it, quoting the course's source, before the one
line that matters. IPython asks an exception for its own traceback (`_render_traceback_`), and
`Mistake` answers with `render`: the message (it starts with the exercise id, then what was
expected, what came back and the likely mistake), and, when the learner's own code raised the
error behind it, the lines of their code it passed through, as a teaching assistant would
show it. The error is still an error (the cell fails, nbgrader counts it), with a shorter
traceback.
"""

from __future__ import annotations

import builtins
import sysconfig
import traceback
from pathlib import Path

# The course's package, Python's standard library and every installed library.
_NOT_YOURS = {Path(__file__).resolve().parent.parent}
_NOT_YOURS |= {Path(p).resolve() for k, p in sysconfig.get_paths().items() if "lib" in k}
RED, BOLD, RESET = "\x1b[31m", "\x1b[1m", "\x1b[0m"


def learner_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``error``'s traceback that run the learner's code: notebook cells and
    their own files, not the course's package, Python's or an installed library's."""
    frames = traceback.extract_tb(error.__traceback__)
    return [f for f in frames if not any(_inside(f.filename, p) for p in _NOT_YOURS)]


def _inside(filename: str, folder: Path) -> bool:
    return Path(filename).resolve().is_relative_to(folder)


def render(mistake: BaseException) -> list[str]:
    """The lines shown for a failed check: the message, then where the learner's code raised
    the error behind it (if it did)."""
    first, _, rest = str(mistake).partition("\n")
    lines = [f"{RED}{BOLD}Check failed{RESET} {first}", *rest.splitlines()]
    cause = mistake.__cause__
    frames = learner_frames(cause) if cause is not None else []
    if frames:
        lines.append(f"{BOLD}Where it happened in your code:{RESET}")
        for frame in frames:
            lines.append(f"  {_cell_name(frame.filename)}, line {frame.lineno}, in {frame.name}")
            if frame.line:
                lines.append(f"    {frame.line.strip()}")
        lines.append(f"{type(cause).__name__}: {cause}")
    return lines


def _cell_name(filename: str) -> str:
    """IPython's name for a notebook cell's code ("Cell In[3]"); a file's own name otherwise.
    (IPython puts `get_ipython` among the builtins while it runs code.)"""
    shell = getattr(builtins, "get_ipython", lambda: None)()
    name = getattr(getattr(shell, "compile", None), "format_code_name", lambda _: None)(filename)
    return " ".join(name) if name else filename
