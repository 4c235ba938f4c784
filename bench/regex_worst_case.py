"""Worst-case cost of every catalog pattern on hostile lines.

A job's log is its owner's input: one line of up to 64 KiB (the scanner's cut) that
starts like a rule's trigger and then fails to match must not stall attribution, since a
scan's deadline is checked between blocks, not inside one regex search. For each pattern
and each of its triggers this builds lines of 60,000 repetitions of characters that feed
backtracking (digits, slashes, dots, quotes, blanks, words), with the trigger in front of
them or behind them (directly or across a blank: an unanchored pattern backtracks over
what precedes its literal), plus a line of the trigger repeated, and times a search on
each with the engine the matcher uses for that pattern (RE2, or `re` for the few that
RE2 cannot express), and prints the slowest of each engine. A catastrophic pattern shows
up as seconds; a linear one stays in the low milliseconds. `--re` times every pattern on
`re`, as before the matcher moved them to RE2: the figure RE2 saves.

    .venv/bin/python bench/regex_worst_case.py
"""

from __future__ import annotations

import argparse
import json
import time

from trainmedic.catalog import load_catalog
from trainmedic.catalog.matcher import LinePattern, linear_regex

FILLERS = ("1", "/", "a/", " ", "a", "0.", '"', ":", "a1", "\t")
REPEAT = 60_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--re", action="store_true", help="time every pattern on re")
    args = parser.parse_args()
    catalog = load_catalog()
    timings: list[tuple[float, str, str, str, str]] = []
    for rule in catalog.rules:
        for pattern in rule.patterns:
            linear = (
                None if args.re else linear_regex(pattern.regex, ignore_case=pattern.ignore_case)
            )
            regex: LinePattern = linear or pattern.compiled()
            engine = "re2" if linear is not None else "re"
            for trigger in pattern.triggers or [""]:
                # The trigger itself, over and over: a pattern that scans on from every
                # occurrence (`.*` after its literal) is quadratic in the line (review 25:
                # 66 s on Python's re).
                repeated = f"{trigger} " * (REPEAT // (len(trigger) + 1))
                start = time.perf_counter()
                regex.search(repeated)
                spent = time.perf_counter() - start
                timings.append((spent, engine, rule.id, trigger, "<trigger repeated>"))
                for filler in FILLERS:
                    for joint in ("", " "):
                        for line in (
                            f"{trigger}{joint}{filler * REPEAT}!",
                            f"{filler * REPEAT}{joint}{trigger}!",
                        ):
                            start = time.perf_counter()
                            regex.search(line)
                            spent = time.perf_counter() - start
                            timings.append((spent, engine, rule.id, trigger, filler))
    timings.sort(reverse=True)
    summary: dict[str, object] = {
        "bench": "regex_worst_case",
        "patterns_x_lines": len(timings),
        "line_chars": REPEAT,
        "total_s": round(sum(t[0] for t in timings), 2),
    }
    for engine in ("re2", "re"):
        mine = [t for t in timings if t[1] == engine]
        if not mine:
            continue
        print(f"slowest on {engine}:")
        for seconds, _, rule_id, trigger, filler in mine[:5]:
            print(f"{seconds * 1000:8.1f} ms  {rule_id}  trigger={trigger!r} filler={filler!r}")
        summary[f"{engine}_patterns"] = len({(t[2], t[3]) for t in mine})
        summary[f"{engine}_worst_ms"] = round(mine[0][0] * 1000, 2)
        summary[f"{engine}_worst_rule"] = mine[0][2]
        summary[f"{engine}_total_s"] = round(sum(t[0] for t in mine), 2)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
