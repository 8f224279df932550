"""``python -m mutation [CHAPTER ...]``: mutation-test the chapters' checks, write VALIDITY.md.

Results go to ``benchmarks/mutation/chNN.json`` (one file per chapter, so a run of some
chapters keeps the others' results), and `benchmarks/VALIDITY.md` is written from all of them.
``--list`` prints the mutants without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from mutation import campaign, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutation", description=__doc__)
    parser.add_argument("chapters", nargs="*", help="chapter ids such as ch04 (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="mutants at a time")
    parser.add_argument("--exercise", help="only this exercise (e.g. ch04_train_step)")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    args = parser.parse_args(argv)
    chapters = args.chapters or campaign.chapter_ids()
    gpu = False if args.list else campaign.accelerated()
    started = time.monotonic()
    for chapter_id in chapters:
        chapter = campaign.load_chapter(chapter_id)
        found = campaign.chapter_mutants(chapter)
        if args.exercise:
            found = {e: m for e, m in found.items() if e == args.exercise}
            if not found:
                continue
        if args.list:
            for mutants in found.values():
                for m in mutants:
                    print(f"{m.key}  line {m.line}: {m.before!r} -> {m.after!r}")
            continue
        counts = ", ".join(f"{e} {len(m)}" for e, m in found.items())
        print(f"{chapter_id}: {counts} mutants", flush=True)
        result = campaign.run_chapter(
            chapter, found, jobs=args.jobs, gpu=gpu, progress=lambda line: print(line, flush=True)
        )
        path = report.RESULTS / f"{chapter_id}.json"
        if args.exercise and path.exists():  # one exercise: keep the chapter's other results
            kept = json.loads(path.read_text())
            kept["exercises"].update(result["exercises"])
            result = {**result, "exercises": kept["exercises"]}
        report.RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        equivalent = report.equivalents(chapter_id)
        for exercise, data in result["exercises"].items():
            if exercise in found and data["baseline"] and data["baseline"]["status"] == "survived":
                s = report.score(data, equivalent)
                print(f"  {exercise}: {s['killed']}/{s['mutants'] - s['equivalent']} killed "
                      f"({s['score']:.0%}), {s['survived']} survived, "
                      f"{s['equivalent']} equivalent", flush=True)  # fmt: skip
            elif exercise in found:
                print(f"  {exercise}: the solution itself fails its check: {data['baseline']}")
    if not args.list:
        elapsed = time.monotonic() - started
        report.write(report.load_results(), chapters, elapsed)
        print(f"wrote {report.VALIDITY.relative_to(report.REPO)} ({elapsed / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
