"""Scan speed of the attribution scanner vs `grep -E -f` over the same patterns.

Generates a synthetic training log (mostly benign Megatron/NCCL INFO output with
failures sprinkled in) into a temp dir, scans it with the full catalog in a child
process (to measure that process's peak RSS), runs `grep -E -c -f` over the catalog's
regexes translated to POSIX ERE, and removes the file. Both are single-threaded, so
MB/s is per core. Last line: one JSON object.

    .venv/bin/python bench/scan_speed.py            # 1 GB
    .venv/bin/python bench/scan_speed.py --quick    # 16 MB, under a minute

grep -E with the catalog's ~240 extended regexes is slow (about 1 MB/s here), so the
full 1 GB run spends most of its time in grep.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainmedic.catalog import load_catalog  # noqa: E402

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


def to_ere(regex: str) -> str | None:
    """Python regex -> GNU grep ERE, or None where ERE cannot say it."""
    if "(?!" in regex or "(?=" in regex:
        return None
    out = regex.replace("(?<![A-Za-z])", "")
    out = re.sub(r"\(\?P<\w+>", "(", out)
    out = out.replace("(?:", "(").replace(r"\d", "[0-9]")
    return out


CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from trainmedic.catalog import Matcher, Scanner, load_catalog
scanner = Scanner(Matcher(load_catalog()))
t = time.perf_counter()
hits = sum(1 for _ in scanner.scan_path({path!r}))
dt = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"s": dt, "hits": hits, "rss_mb": rss}}))
"""


def scan_child(path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=str(ROOT), path=str(path))],
        check=True,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def grep_once(patterns: Path, path: Path) -> tuple[float, int]:
    grep = shutil.which("grep") or "grep"
    t = time.perf_counter()
    out = subprocess.run(
        [grep, "-E", "-c", "-f", str(patterns), str(path)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    return time.perf_counter() - t, int(out.stdout.strip() or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MB, under a minute")
    parser.add_argument("--size-mb", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    size_mb = args.size_mb or (16 if args.quick else 1024)
    repeats = args.repeats or (2 if args.quick else 1)
    catalog = load_catalog()
    tmp = Path(tempfile.mkdtemp(prefix="tm-scan-"))
    try:
        log_path = tmp / "train.log"
        small_path = tmp / "small.log"
        print(f"generating {size_mb} MB synthetic log in {tmp} ...", flush=True)
        failures = generate(log_path, size_mb << 20)
        generate(small_path, max(1, size_mb // 16) << 20)
        real_mb = log_path.stat().st_size / (1 << 20)
        regexes = sorted(
            {e for r in catalog.rules for p in r.patterns if (e := to_ere(p.regex)) is not None}
        )
        patterns = tmp / "patterns.txt"
        patterns.write_text("\n".join(regexes) + "\n")
        print(f"{len(catalog.rules)} rules, {len(regexes)} ERE patterns for grep", flush=True)
        small = scan_child(small_path)
        print(
            f"small file ({small_path.stat().st_size >> 20} MB): peak RSS {small['rss_mb']:.0f} MB"
        )
        scan_s, grep_s = [], []
        hits = grep_hits = 0
        for n in range(repeats):
            res = scan_child(log_path)
            scan_s.append(res["s"])
            hits = int(res["hits"])
            peak = res["rss_mb"]
            print(
                f"run {n + 1}: scanner {real_mb / res['s']:.0f} MB/s, {hits} hit lines, "
                f"peak RSS {peak:.0f} MB",
                flush=True,
            )
            g, grep_hits = grep_once(patterns, log_path)
            grep_s.append(g)
            print(f"run {n + 1}: grep -E -f {real_mb / g:.0f} MB/s, {grep_hits} lines", flush=True)
        mb_per_s = real_mb / statistics.median(scan_s)
        grep_mb_per_s = real_mb / statistics.median(grep_s)
        print(
            json.dumps(
                {
                    "bench": "scan_speed",
                    "n": repeats,
                    "size_mb": round(real_mb, 1),
                    "rules": len(catalog.rules),
                    "failures_injected": failures,
                    "hit_lines": hits,
                    "grep_hit_lines": grep_hits,
                    "mb_per_s": round(mb_per_s, 1),
                    "grep_mb_per_s": round(grep_mb_per_s, 1),
                    "ratio_vs_grep": round(mb_per_s / grep_mb_per_s, 3),
                    "peak_rss_mb": round(peak, 1),
                    "small_file_peak_rss_mb": round(small["rss_mb"], 1),
                }
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
