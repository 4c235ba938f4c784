"""Log watcher at scale: 2,000 job log files written at training rates, followed live.

Three processes, so each is measured alone: a *writer* appends realistic trainer output
(Megatron-style iteration lines, NCCL INFO, warnings) to 1,000 jobs' stdout+stderr at a
few lines per second per file, with catalog failures sprinkled in (each tagged with an
id and its write time), a few giant lines and binary junk, some requeue overwrites and a
rotation, and some jobs that stop progressing (hangs). The *watcher* child runs
`LogWatcher.run` on all 2,000 paths (many not created yet when it starts) and reports its
own CPU time (`time.process_time`, all its threads), bytes read and signals. Side by side
in the same child, the one-shot catalog `Scanner` reads the same files afterwards: the
cost of following live vs. scanning once.

    .venv/bin/python bench/watch_logs.py            # 120 s of writing
    .venv/bin/python bench/watch_logs.py --quick    # 20 s, under a minute

`bench_logs(quick)` returns the figures (keys prefixed `log_`) for bench/watch_scale.py.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOBS = 1000  # x (stdout, stderr) = 2,000 files
IDLE_S = 5.0
TASKS_PER_NODE = 8
FAILURES = [
    "[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered",
    "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "Mar 12 10:19:03 gpu{n:04d} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen "
    "off the bus.",
    "[rank{r}]:[E ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600100 "
    "milliseconds before timing out.",
]
_TAG = re.compile(r"inj=(\d+) t=([\d.]+)")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def paths_of(folder: Path, job: int) -> tuple[Path, Path]:
    return folder / f"train-{job}.out", folder / f"train-{job}.err"


def nodes_of(job: int) -> list[str]:
    return [f"gpu{(job * 4 + k) % 10000:04d}" for k in range(4)]


# ------------------------------------------------------------------------------ writer


def _benign_out(rng: random.Random, job: int, step: int) -> str:
    rank = rng.randrange(32)
    return (
        f"[rank{rank}]: iteration {step:>8}/ 500000 | consumed samples: {step * 1024:>12} | "
        f"elapsed time per iteration (ms): {700 + rng.random() * 99:.1f} | learning rate: "
        f"2.{step % 997:03d}E-04 | global batch size: 1024 | lm loss: {2 + rng.random():.6E} | "
        "loss scale: 1.0 | grad norm: 0.271 | number of skipped iterations: 0 |\n"
    )


def _benign_err(rng: random.Random, job: int, step: int) -> str:
    node = nodes_of(job)[rng.randrange(4)]
    if rng.random() < 0.7:
        return (
            f"{node}:{4000 + step % 64}:{4100 + step % 64} [{step % 8}] NCCL INFO Channel "
            f"{step % 32:02d}/0 : {step % 8}[{step % 8}] -> {(step + 1) % 8}[{(step + 1) % 8}] "
            "via P2P/IPC/read\n"
        )
    return (
        f"[rank{rng.randrange(32)}]: /opt/conda/lib/python3.11/site-packages/torch/utils/data/"
        "dataloader.py:557: UserWarning: This DataLoader will create 16 worker processes.\n"
    )


def writer(folder: Path, seconds: float, seed: int) -> None:
    """Append output to every job's files at a few lines/s each; write a manifest."""
    rng = random.Random(seed)
    fds: dict[Path, int] = {}

    def fd(path: Path) -> int:
        if path not in fds:
            fds[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return fds[path]

    steps = dict.fromkeys(range(JOBS), 0)
    late = set(rng.sample(range(JOBS), JOBS // 10))  # start writing only after a while
    stalled: dict[int, float] = {}  # job -> when it stopped progressing
    injections: list[dict[str, Any]] = []
    events: list[str] = []
    rate = 2.0  # lines per second per file
    tick = 0.1
    started = time.monotonic()
    next_failure = started + 1.0
    failure_every = max(0.5, seconds / 40)
    n_ticks = 0
    while (now := time.monotonic()) - started < seconds:
        n_ticks += 1
        elapsed = now - started
        active = [j for j in range(JOBS) if (j not in late or elapsed > 3) and j not in stalled]
        picks = rng.sample(active, min(len(active), int(rate * tick * len(active) * 2) // 2))
        for job in picks:
            out, err = paths_of(folder, job)
            steps[job] += 1
            os.write(fd(out), _benign_out(rng, job, steps[job]).encode())
            if rng.random() < 0.5:
                os.write(fd(err), _benign_err(rng, job, steps[job]).encode())
        if now >= next_failure and elapsed < seconds - 3:
            next_failure = now + failure_every
            job = rng.choice(active)
            ident = len(injections)
            line = FAILURES[ident % len(FAILURES)].format(r=rng.randrange(32), n=job % 10000)
            target = paths_of(folder, job)[ident % 2]
            os.write(fd(target), f"{line} inj={ident} t={time.time():.6f}\n".encode())
            injections.append({"id": ident, "job": job, "file": str(target)})
        if n_ticks == 30:  # odd output: giant lines, binary junk
            os.write(fd(paths_of(folder, 1)[0]), b"A" * (3 << 20) + b"\n")
            os.write(fd(paths_of(folder, 2)[1]), os.urandom(1 << 20))
            events.append("giant line + 1 MB of binary junk")
        if n_ticks == 60:  # requeue that overwrites, and a rotation
            out = paths_of(folder, 3)[0]
            os.ftruncate(fd(out), 0)
            os.rename(paths_of(folder, 4)[0], f"{paths_of(folder, 4)[0]}.1")
            os.close(fds.pop(paths_of(folder, 4)[0]))
            events.append("overwrite of job 3, rotation of job 4")
        if n_ticks == 40:  # a few jobs hang (stop progressing; still running)
            for job in rng.sample([j for j in range(10, JOBS) if steps[j] > 0], 5):
                stalled[job] = time.time()
            events.append(f"stalled jobs {sorted(stalled)}")
        time.sleep(max(0.0, tick - (time.monotonic() - now)))
    for handle in fds.values():
        os.close(handle)
    manifest = {
        "injections": injections,
        "stalled": sorted(stalled),
        "events": events,
        "lines": sum(steps.values()),
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))


# ----------------------------------------------------------------------------- watcher


async def _watch(folder: Path, seconds: float, hang_after: float) -> dict[str, Any]:
    from trainmedic.catalog import Matcher, Scanner, load_catalog
    from trainmedic.domain.incident import IncidentSignal
    from trainmedic.watchers.logs import LogWatchConfig, LogWatcher
    from trainmedic.watchers.progress import ProgressConfig

    received: list[dict[str, Any]] = []

    class Sink:
        async def submit(self, signal: IncidentSignal) -> None:
            now = time.time()
            tags = [m.groups() for e in signal.evidence if (m := _TAG.search(e.text))]
            received.append(
                {
                    "kind": signal.kind,
                    "job": signal.job_id,
                    "lag_s": [now - float(t) for _, t in tags],
                    "ids": [int(i) for i, _ in tags],
                }
            )

    matcher = Matcher(load_catalog())
    config = LogWatchConfig(progress=ProgressConfig(hang_after=timedelta(seconds=hang_after)))
    watcher = LogWatcher(Sink(), cluster="bench", matcher=matcher, config=config)
    for job in range(JOBS):
        watcher.watch(
            str(job),
            [str(p) for p in paths_of(folder, job)],
            nodelist=nodes_of(job),
            tasks_per_node=TASKS_PER_NODE,
            run=0,
        )
    stop = asyncio.Event()
    cpu0, wall0 = time.process_time(), time.monotonic()
    task = asyncio.create_task(watcher.run(stop))
    windows: list[float] = []
    last_cpu, last_bytes = cpu0, 0
    next_window = wall0 + 5
    # Until the writer says it is done (its manifest appears), or `seconds` as a backstop.
    while not (folder / "manifest.json").exists() and time.monotonic() - wall0 < seconds:
        await asyncio.sleep(0.2)
        if time.monotonic() < next_window:
            continue
        next_window += 5
        cpu, read = time.process_time(), watcher.stats.bytes_read
        if read - last_bytes > 100_000:
            windows.append((cpu - last_cpu) / ((read - last_bytes) / 1e6))
        last_cpu, last_bytes = cpu, read
        log(
            f"  watcher: {time.monotonic() - wall0:5.1f} s, {read / 1e6:7.1f} MB, "
            f"{watcher.stats.files_present} files present, {len(received)} signals"
        )
    cpu_busy = time.process_time() - cpu0
    busy_s = time.monotonic() - wall0
    busy_bytes = watcher.stats.bytes_read
    # The writer is done, as if every job finished: from here on silence is not a hang.
    watcher.config = watcher.config.model_copy(
        update={"progress": ProgressConfig(hang_after=timedelta(days=1))}
    )
    # What following 2,000 quiet files costs (a stat per file per cycle).
    await asyncio.sleep(1.0)
    idle0 = time.process_time()
    await asyncio.sleep(IDLE_S)
    idle_cpu = time.process_time() - idle0
    stop.set()
    await task
    stats = watcher.stats.model_dump()
    # Baseline, same process, same files: one pass of the catalog scanner.
    scanner = Scanner(matcher)
    base0 = time.process_time()
    for path in sorted(folder.glob("train-*")):
        for _ in scanner.scan_path(path):
            pass
    base_cpu = time.process_time() - base0
    return {
        "cpu_s": cpu_busy,
        "busy_s": busy_s,
        "bytes": busy_bytes,
        "windows_cpu_s_per_mb": windows,
        "idle_cpu_s": idle_cpu,
        "idle_s": IDLE_S,
        "stats": stats,
        "received": received,
        "baseline_cpu_s": base_cpu,
        "baseline_bytes": scanner.bytes_scanned,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# ------------------------------------------------------------------------------ driver


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_logs(quick: bool) -> dict[str, Any]:
    """Run writer + watcher children; figures with keys prefixed `log_`."""
    seconds = 20.0 if quick else 120.0
    hang_after = 4.0 if quick else 10.0
    folder = Path(tempfile.mkdtemp(prefix="tm-watch-logs-"))
    me = str(Path(__file__).resolve())
    try:
        log(f"logs: {JOBS * 2} files in {folder}, {seconds:.0f} s of writing")
        watcher = subprocess.Popen(
            [sys.executable, me, "--watcher", str(folder), str(seconds + 30), str(hang_after)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)  # the watcher follows the paths before any exists
        subprocess.run(
            [sys.executable, me, "--writer", str(folder), str(seconds), "7"],
            check=True,
            timeout=seconds + 120,
        )
        out, _ = watcher.communicate(timeout=seconds + 300)
        if watcher.returncode != 0:
            raise RuntimeError(f"watcher child failed ({watcher.returncode})")
        result = json.loads(out.strip().splitlines()[-1])
        manifest = json.loads((folder / "manifest.json").read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    log(f"logs: writer events: {manifest['events']}")
    injected = {i["id"]: i for i in manifest["injections"]}
    lags: dict[int, float] = {}
    for item in result["received"]:
        for ident, lag in zip(item["ids"], item["lag_s"], strict=True):
            lags.setdefault(ident, lag)
    hangs = {item["job"] for item in result["received"] if item["kind"] == "hang"}
    stalled = {str(j) for j in manifest["stalled"]}
    mb = result["bytes"] / 1e6
    lag_values = list(lags.values())
    stats = result["stats"]
    figures: dict[str, Any] = {
        "log_files": JOBS * 2,
        "log_mb": round(mb, 2),
        "log_mb_per_s_written": round(mb / seconds, 3),
        "log_lines": stats["lines"],
        "log_cpu_s": round(result["cpu_s"], 3),
        "log_cpu_s_per_mb": round(result["cpu_s"] / mb, 4) if mb else None,
        "log_cpu_s_per_mb_window_median": (
            round(statistics.median(result["windows_cpu_s_per_mb"]), 4)
            if result["windows_cpu_s_per_mb"]
            else None
        ),
        "log_cpu_pct_while_writing": round(100 * result["cpu_s"] / result["busy_s"], 1),
        "log_idle_cpu_pct": round(100 * result["idle_cpu_s"] / result["idle_s"], 1),
        "log_scan_baseline_cpu_s_per_mb": round(
            result["baseline_cpu_s"] / (result["baseline_bytes"] / 1e6), 4
        ),
        "log_peak_rss_mb": round(result["peak_rss_mb"], 1),
        "log_hang_after_s": hang_after,
        "log_failures_injected": len(injected),
        "log_failures_detected": len(set(lags) & set(injected)),
        "log_detect_p50_s": round(statistics.median(lag_values), 3) if lag_values else None,
        "log_detect_p95_s": _pct(lag_values, 0.95),
        "log_hangs_injected": len(stalled),
        "log_hangs_detected": len(hangs & stalled),
        "log_hang_false_positives": len(hangs - stalled),
        "log_signals": len(result["received"]),
        "log_resets": stats["resets"],
        "log_long_lines": stats["long_lines"],
    }
    if figures["log_detect_p95_s"] is not None:
        figures["log_detect_p95_s"] = round(figures["log_detect_p95_s"], 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 s of writing (< 1 min)")
    parser.add_argument("--writer", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--watcher", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        folder, seconds, seed = args.writer
        writer(Path(folder), float(seconds), int(seed))
        return
    if args.watcher:
        folder, seconds, hang_after = args.watcher
        result = asyncio.run(_watch(Path(folder), float(seconds), float(hang_after)))
        print(json.dumps(result))
        return
    figures = bench_logs(args.quick)
    print(
        json.dumps(
            {
                "bench": "watch_logs",
                "n": figures["log_failures_injected"],
                "quick": args.quick,
                **figures,
                "peak_rss_mb": figures["log_peak_rss_mb"],
            }
        )
    )


if __name__ == "__main__":
    main()
