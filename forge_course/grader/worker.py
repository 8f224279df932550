"""The isolated worker: run one exercise's answer and report what it observed, as plain data.

Started by `forge_course.grader.sandbox` in a fresh process (no network, limited memory, time
and processes, the grading files out of reach). It reads one job as JSON on stdin:

    {"prelude": "<the chapter's set-up cell, from the instructor's copy>",
     "answer": "<the learner's answer cell>",
     "exercise": {"module": "forge_course.grading.ch04", "index": 1},
     "cases": [<plain-data cases chosen by the grader>],
     "variables": ["grad_multiple", ...]}

and writes one JSON object per line to its private channel (the original stdout; the learner's
own prints go to stderr): ``{"ran": true}`` or ``{"error": ...}`` after the cells, then one
``{"case": i, "observation": ...}`` or ``{"case": i, "mistake": ...}`` per case, the requested
``{"variables": {...}}``, and ``{"done": true}``. The verdict is reached by the grader, never here.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def _channel():
    """Keep the real stdout for results; send everything else the process prints to stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def main() -> int:
    channel = _channel()
    job = json.loads(sys.stdin.read())

    from forge_course.grader.codec import to_plain
    from forge_course.grading.core import Mistake

    def send(message: dict) -> None:
        channel.write(json.dumps(message, allow_nan=False) + "\n")

    namespace: dict = {"__name__": "__main__"}
    try:
        exec(compile(job["prelude"], "<set-up cell>", "exec"), namespace)
        exec(compile(job["answer"], "<your answer cell>", "exec"), namespace)
    except BaseException as err:  # noqa: BLE001  (SystemExit included: report, do not obey)
        send({"error": f"{type(err).__name__}: {err}"})
    else:
        send({"ran": True})

    spec = job.get("exercise")
    if spec:
        module = importlib.import_module(spec["module"])
        exercise = module.EXERCISES[spec["index"]]
        fn = namespace.get(exercise.function)
        for i, case in enumerate(job["cases"]):
            try:
                send({"case": i, "observation": to_plain(exercise.observe(fn, case))})
            except Mistake as mistake:
                send({"case": i, "mistake": str(mistake)})
                break  # one failed case decides the exercise; the rest would only cost time
            except BaseException as err:  # noqa: BLE001
                send({"case": i, "mistake": f"[{exercise.grade_id}] {type(err).__name__}: {err}"})
                break
    names = job.get("variables", [])
    if names:
        send({"variables": {n: to_plain(namespace.get(n)) for n in names}})
    send({"done": True})
    channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
