"""Worst-case cost of every catalog pattern on hostile lines.

A job's log is its owner's input: one line of up to 64 KiB (the scanner's cut) that
starts like a rule's trigger and then fails to match must not stall attribution, since a
scan's deadline is checked between blocks, not inside one regex search. For each pattern
and each of its triggers this builds lines of 60,000 repetitions of characters that feed
backtracking (digits, slashes, dots, quotes, blanks, words), with the trigger in front of
them or behind them (directly or across a blank: an unanchored pattern backtracks over
what precedes its literal), times `re.search` on each, and prints the slowest. A
catastrophic pattern shows up as seconds; a linear one stays in the low milliseconds.

    .venv/bin/python bench/regex_worst_case.py
"""

from __future__ import annotations

import json
import time

from trainmedic.catalog import load_catalog

FILLERS = ("1", "/", "a/", " ", "a", "0.", '"', ":", "a1", "\t")
REPEAT = 60_000


def main() -> int:
    catalog = load_catalog()
    timings: list[tuple[float, str, str, str]] = []
    for rule in catalog.rules:
        for pattern in rule.patterns:
            regex = pattern.compiled()
            for trigger in pattern.triggers or [""]:
                for filler in FILLERS:
                    for joint in ("", " "):
                        for line in (
                            f"{trigger}{joint}{filler * REPEAT}!",
                            f"{filler * REPEAT}{joint}{trigger}!",
                        ):
                            start = time.perf_counter()
                            regex.search(line)
                            spent = time.perf_counter() - start
                            timings.append((spent, rule.id, trigger, filler))
    timings.sort(reverse=True)
    for seconds, rule_id, trigger, filler in timings[:5]:
        print(f"{seconds * 1000:8.1f} ms  {rule_id}  trigger={trigger!r} filler={filler!r}")
    worst = timings[0]
    print(
        json.dumps(
            {
                "bench": "regex_worst_case",
                "patterns_x_lines": len(timings),
                "line_chars": REPEAT,
                "worst_ms": round(worst[0] * 1000, 2),
                "worst_rule": worst[1],
                "total_s": round(sum(t[0] for t in timings), 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
