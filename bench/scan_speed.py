"""Scan speed of the attribution scanner vs grep over the same patterns, same file.

Generates a synthetic training log (mostly benign Megatron/NCCL INFO output with
failures sprinkled in) into a temp dir and scans it with the full catalog in a child
process (to read that process's peak RSS, VmHWM), then runs, side by side:

- `grep -E -c -f` over the catalog's regexes translated to POSIX ERE, in the C
  locale: the issue's baseline (`grep_mb_per_s`, `ratio_vs_grep`). grep in a UTF-8
  locale is ~200x slower on these patterns; that figure is given as context
  (`grep_utf8_mb_per_s`, on the small file only, to keep the run short).
- the scanner itself with the `re` fallback prefilter, i.e. without google-re2
  (`re_prefilter_mb_per_s`, small file only).
- `grep -F -c -f` over the catalog's trigger literals, in the C locale: what a pure
  literal prefilter costs in grep (`grep_literal_mb_per_s`), the fair bar for the
  scanner's own first pass.

Everything is single-threaded, so MB/s is per core. A second file 1/16 the size is
scanned too, to show peak memory does not grow with the file. Last line: one JSON
object.

    .venv/bin/python bench/scan_speed.py            # 1 GB
    .venv/bin/python bench/scan_speed.py --quick    # 16 MB, under a minute
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainmedic.catalog import Catalog, load_catalog  # noqa: E402

FAILURES = [
    "[rank{r}]:[E ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600100 "
    "milliseconds before timing out.",
    "Mar 12 10:19:03 gpu0{n} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off "
    "the bus.",
    "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "slurmstepd: error: Detected 1 oom_kill event in StepId=5.0. Some of the step tasks have "
    "been OOM Killed.",
    "[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered",
]


def benign(rng: random.Random, i: int) -> str:
    kind = i % 10
    if kind < 7:
        return (
            f"[rank{i % 64}]: iteration {i:>8}/ 500000 | consumed samples: {i * 1024:>12} | "
            f"elapsed time per iteration (ms): {700 + rng.random() * 99:.1f} | learning rate: "
            f"2.{i % 997:03d}E-04 | global batch size: 1024 | lm loss: {2 + rng.random():.6E} | "
            "loss scale: 1.0 | grad norm: 0.271 | number of skipped iterations: 0 | number of "
            "nan iterations: 0 |"
        )
    if kind < 9:
        return (
            f"gpu0{i % 8}:{4000 + i % 64}:{4100 + i % 64} [{i % 8}] NCCL INFO "
            f"Channel {i % 32:02d}/0 : {i % 64}[{i % 8}] -> "
            f"{(i + 1) % 64}[{(i + 1) % 8}] via P2P/CUMEM/read"
        )
    return f"validation error rate: 0.{i % 1000:03d} | eval loss {1 + rng.random():.4f}"


def generate(path: Path, size: int) -> int:
    rng = random.Random(7)
    written = failures = 0
    i = 0
    with open(path, "w", encoding="utf-8") as handle:
        buf: list[str] = []
        while written < size:
            if i % 20011 == 0:
                line = FAILURES[failures % len(FAILURES)].format(r=i % 64, n=i % 4 + 1)
                failures += 1
            else:
                line = benign(rng, i)
            buf.append(line)
            written += len(line) + 1
            i += 1
            if len(buf) >= 10000:
                handle.write("\n".join(buf) + "\n")
                buf = []
        if buf:
            handle.write("\n".join(buf) + "\n")
    return failures


def _fold_case(ere: str) -> str:
    """`ere` with every letter matching either case (grep has no per-pattern -i)."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(ere):
        ch = ere[i]
        if ch == "\\" and i + 1 < len(ere):
            out.append(ere[i : i + 2])
            i += 2
            continue
        if in_class:
            out.append(ch + ch.swapcase() if ch.isalpha() else ch)
            in_class = ch != "]"
        elif ch == "[":
            out.append(ch)
            in_class = True
        else:
            out.append(f"[{ch.lower()}{ch.upper()}]" if ch.isalpha() else ch)
        i += 1
    return "".join(out)


def to_ere(regex: str, ignore_case: bool = False) -> str | None:
    """Python regex -> GNU grep ERE, or None where ERE cannot say it."""
    if "(?!" in regex or "(?=" in regex:
        return None
    out = regex.replace("(?<![A-Za-z])", "")
    out = re.sub(r"\(\?P<\w+>", "(", out)
    out = out.replace("(?:", "(").replace(r"\d", "[0-9]").replace("*?", "*")
    return _fold_case(out) if ignore_case else out


def trigger_literals(catalog: Catalog) -> list[str]:
    """The prefilter's literals for grep -F: case-insensitive ones in three spellings."""
    literals = {"Xid"} if catalog.xid_rules else set()
    for rule in catalog.rules:
        if rule.xid is not None:
            continue
        for pattern in rule.patterns:
            for trigger in pattern.triggers:
                if pattern.ignore_case:
                    low = trigger.lower()
                    literals.update({low, low.upper(), low.capitalize()})
                else:
                    literals.add(trigger)
    return sorted(literals)


CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
from trainmedic.catalog import Matcher, Scanner, load_catalog
matcher = Matcher(load_catalog(), use_re2={use_re2!r})
scanner = Scanner(matcher)
t = time.perf_counter()
hits = sum(1 for _ in scanner.scan_path({path!r}))
dt = time.perf_counter() - t
# VmHWM, not ru_maxrss: the latter keeps the parent's peak across fork + exec.
with open("/proc/self/status") as status:
    hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
engine = type(matcher.prefilter).__module__.split(".")[0]
print(json.dumps({{"s": dt, "hits": hits, "rss_mb": hwm / 1024, "prefilter": engine}}))
"""


def scan_child(path: Path, use_re2: bool = True) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=str(ROOT), path=str(path), use_re2=use_re2)],
        check=True,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def grep_once(flags: list[str], patterns: Path, path: Path, locale: str = "C") -> tuple[float, int]:
    """Seconds and matching-line count of one `grep <flags> -c -f patterns path`."""
    grep = shutil.which("grep") or "grep"
    env = {**os.environ, "LC_ALL": locale}
    t = time.perf_counter()
    out = subprocess.run(
        [grep, *flags, "-c", "-f", str(patterns), str(path)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
        env=env,
    )
    dt = time.perf_counter() - t
    if out.returncode > 1:
        raise RuntimeError(f"grep {flags} failed: {out.stderr.strip()}")
    return dt, int(out.stdout.strip() or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MB, under a minute")
    parser.add_argument("--size-mb", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size_mb = args.size_mb or (16 if args.quick else 1024)
    repeats = args.repeats
    catalog = load_catalog()
    tmp = Path(tempfile.mkdtemp(prefix="tm-scan-"))
    try:
        log_path = tmp / "train.log"
        small_path = tmp / "small.log"
        print(f"generating {size_mb} MB synthetic log in {tmp} ...", flush=True)
        failures = generate(log_path, size_mb << 20)
        generate(small_path, max(1, size_mb // 16) << 20)
        real_mb = log_path.stat().st_size / (1 << 20)
        small_mb = small_path.stat().st_size / (1 << 20)
        all_patterns = [p for r in catalog.rules for p in r.patterns]
        regexes = sorted(
            {e for p in all_patterns if (e := to_ere(p.regex, p.ignore_case)) is not None}
        )
        skipped = len({p.regex for p in all_patterns}) - len(regexes)
        patterns = tmp / "patterns.txt"
        patterns.write_text("\n".join(regexes) + "\n")
        literals = trigger_literals(catalog)
        literal_file = tmp / "triggers.txt"
        literal_file.write_text("\n".join(literals) + "\n")
        print(
            f"{len(catalog.rules)} rules, {len(regexes)} ERE patterns for grep -E "
            f"({skipped} not expressible in ERE), {len(literals)} literals for grep -F",
            flush=True,
        )
        small = scan_child(small_path)
        print(f"small file ({small_mb:.0f} MB): peak RSS {small['rss_mb']:.0f} MB", flush=True)
        plain = scan_child(small_path, use_re2=False)
        print(f"small file: scanner with the re prefilter {small_mb / plain['s']:.1f} MB/s")
        utf8_s, _ = grep_once(["-E"], patterns, small_path, locale="C.UTF-8")
        print(f"small file: grep -E -f in C.UTF-8 {small_mb / utf8_s:.1f} MB/s", flush=True)
        scan_s: list[float] = []
        grep_s: list[float] = []
        literal_s: list[float] = []
        hits = grep_hits = literal_hits = 0
        peak = 0.0
        for n in range(repeats):
            res = scan_child(log_path)
            scan_s.append(res["s"])
            hits = int(res["hits"])
            peak = max(peak, res["rss_mb"])
            print(
                f"run {n + 1}: scanner ({res['prefilter']} prefilter) "
                f"{real_mb / res['s']:.0f} MB/s, {hits} hit lines, peak RSS {res['rss_mb']:.0f} MB",
                flush=True,
            )
            g, grep_hits = grep_once(["-E"], patterns, log_path)
            grep_s.append(g)
            print(f"run {n + 1}: grep -E -f {real_mb / g:.0f} MB/s, {grep_hits} lines", flush=True)
            g, literal_hits = grep_once(["-F"], literal_file, log_path)
            literal_s.append(g)
            print(
                f"run {n + 1}: grep -F -f {real_mb / g:.0f} MB/s, {literal_hits} lines", flush=True
            )
        mb_per_s = real_mb / statistics.median(scan_s)
        grep_mb_per_s = real_mb / statistics.median(grep_s)
        literal_mb_per_s = real_mb / statistics.median(literal_s)
        print(
            json.dumps(
                {
                    "bench": "scan_speed",
                    "n": repeats,
                    "size_mb": round(real_mb, 1),
                    "rules": len(catalog.rules),
                    "prefilter": res["prefilter"],
                    "failures_injected": failures,
                    "hit_lines": hits,
                    "grep_patterns": len(regexes),
                    "grep_patterns_skipped": skipped,
                    "grep_hit_lines": grep_hits,
                    "grep_literal_hit_lines": literal_hits,
                    "mb_per_s": round(mb_per_s, 1),
                    "grep_mb_per_s": round(grep_mb_per_s, 1),
                    "ratio_vs_grep": round(mb_per_s / grep_mb_per_s, 3),
                    "grep_literal_mb_per_s": round(literal_mb_per_s, 1),
                    "ratio_vs_grep_literal": round(mb_per_s / literal_mb_per_s, 3),
                    "grep_utf8_mb_per_s": round(small_mb / utf8_s, 2),
                    "re_prefilter_mb_per_s": round(small_mb / plain["s"], 1),
                    "peak_rss_mb": round(peak, 1),
                    "small_size_mb": round(small_mb, 1),
                    "small_file_peak_rss_mb": round(small["rss_mb"], 1),
                }
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
