"""Watcher scale: Slurm poll-parse-diff at 12,500 nodes / 20,000 jobs, and the log watcher
following 2,000 files.

Slurm part: synthetic `squeue --json` / `sinfo --json` in Slurm 22.05's real format
(records cloned from tests/data/slurm/22.05, with ids, node lists and states varied) are
served by stand-in `squeue`/`sinfo` executables through the real `LocalRunner`
subprocess path. Each cycle reads both, parses and diffs against the previous view
with a realistic amount of change (jobs failing, requeued, a node down, an admin
drain). Every mode runs in its own child process so that its peak RSS is its own:

- `cycle_s`: what the watcher uses (`JsonSource`, lean parse; msgspec when installed);
- `cycle_stdlib_s`: the same lean parse with the standard library's json;
- `cycle_models_s`: the baseline, `BackendSource` over `SlurmCli` (full pydantic models).

Log part (`bench/watch_logs.py`, run from here through its `bench_logs`): 2,000 job log
files written at training rates in one process, `LogWatcher` following them in another;
its keys are prefixed `log_` (`log_cpu_s_per_mb`: the watcher's CPU seconds per MB
written, `log_peak_rss_mb`, detection lag, hangs). `peak_rss_mb` stays the Slurm part's.

Usage: .venv/bin/python bench/watch_scale.py [--quick]. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import resource
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

from trainmedic.domain.hostlist import compress  # noqa: E402

SAMPLES = ROOT / "tests" / "data" / "slurm" / "22.05"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- synthetic


def _templates() -> tuple[dict[str, Any], dict[str, Any]]:
    jobs = json.loads((SAMPLES / "squeue_mixed.json").read_text())["jobs"]
    nodes = json.loads((SAMPLES / "sinfo_drain_down.json").read_text())["nodes"]
    job = next(j for j in jobs if j["job_state"] == "RUNNING")
    node = next(n for n in nodes if n["state"] in ("mixed", "allocated", "idle"))
    return job, node


class Cluster:
    """A mutable synthetic cluster; `render()` gives squeue/sinfo JSON text."""

    def __init__(self, n_nodes: int, n_jobs: int, seed: int = 5) -> None:
        self.rng = random.Random(seed)
        self.job_tpl, self.node_tpl = _templates()
        self.names = [f"gpu{i:05d}" for i in range(n_nodes)]
        self.node_state: dict[str, tuple[str, list[str], str]] = {
            n: ("allocated", [], "") for n in self.names
        }
        self.jobs: dict[int, dict[str, Any]] = {}
        self.next_id = 100_000
        cursor = 0
        running = int(n_jobs * 0.7)
        for i in range(n_jobs):
            if i < running:
                width = self.rng.choice((1, 1, 1, 2, 4, 8))
                start = cursor % n_nodes
                cursor += max(1, width // 2)
                placed = self.names[start : start + width]
                self._add(placed, "RUNNING")
            else:
                self._add([], "PENDING")

    def _add(self, placed: list[str], state: str) -> None:
        self.jobs[self.next_id] = {
            "nodes": compress(placed) if placed else "",
            "state": state,
            "restarts": 0,
            "reason": "None" if state == "RUNNING" else "Priority",
            "exit": 0,
        }
        self.next_id += 1

    def churn(self) -> None:
        """One poll interval's worth of change on a big cluster."""
        running = [j for j, v in self.jobs.items() if v["state"] == "RUNNING"]
        for job_id in self.rng.sample(running, 20):
            self.jobs[job_id].update(state="FAILED", reason="NonZeroExitCode", exit=256)
        for job_id in self.rng.sample(running, 5):
            job = self.jobs[job_id]
            if job["state"] == "RUNNING":
                job.update(state="PENDING", restarts=job["restarts"] + 1, reason="BeginTime")
        for _ in range(10):
            self._add([], "PENDING")
        down = self.rng.choice(self.names)
        self.node_state[down] = ("down", ["NOT_RESPONDING"], "Not responding")
        drained = self.rng.choice(self.names)
        self.node_state[drained] = ("mixed", ["DRAIN"], "admin: bad fan")

    def render(self) -> tuple[str, str]:
        jobs = []
        for job_id, v in self.jobs.items():
            raw = copy.copy(self.job_tpl)
            raw.update(
                job_id=job_id,
                nodes=v["nodes"],
                job_state=v["state"],
                restart_cnt=v["restarts"],
                state_reason=v["reason"],
                exit_code=v["exit"],
                name=f"train-{job_id}",
                batch_host=v["nodes"].split(",")[0].split("[")[0] if v["nodes"] else "",
            )
            jobs.append(raw)
        nodes = []
        for name in self.names:
            state, flags, reason = self.node_state[name]
            raw = copy.copy(self.node_tpl)
            raw.update(name=name, state=state, state_flags=flags, reason=reason)
            nodes.append(raw)
        meta = {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}}
        squeue = json.dumps({"meta": meta, "errors": [], "jobs": jobs})
        sinfo = json.dumps({"meta": meta, "errors": [], "nodes": nodes})
        return squeue, sinfo


def write_variants(folder: Path, n_nodes: int, n_jobs: int, cycles: int) -> float:
    cluster = Cluster(n_nodes, n_jobs)
    size = 0.0
    for index in range(cycles + 1):  # the first is the starting view
        if index:
            cluster.churn()
        squeue, sinfo = cluster.render()
        (folder / f"squeue-{index}.json").write_text(squeue)
        (folder / f"sinfo-{index}.json").write_text(sinfo)
        size = (len(squeue) + len(sinfo)) / 1e6
    for tool in ("squeue", "sinfo"):
        script = folder / "bin" / tool
        script.parent.mkdir(exist_ok=True)
        script.write_text(f'#!/bin/sh\nexec cat "{folder}/current-{tool}.json"\n')
        script.chmod(0o755)
    return size


# ----------------------------------------------------------------------------- child


async def _child(folder: Path, mode: str, cycles: int) -> dict[str, Any]:
    from trainmedic.adapters.slurm import LocalRunner, SlurmCli
    from trainmedic.watchers import slurm as sw
    from trainmedic.watchers.base import ListSink

    runner = LocalRunner(bin_dir=folder / "bin")
    backend = SlurmCli(runner, timeout=120)
    source: sw.ViewSource
    if mode == "models":
        source = sw.BackendSource(backend)
    else:
        # "stdlib": the same lean path reading with json, the baseline msgspec is for.
        source = sw.JsonSource(runner, timeout=120, use_msgspec=mode != "stdlib")
    sink = ListSink()
    watcher = sw.SlurmWatcher(backend, sink, cluster="bench", source=source)
    times: list[float] = []
    for index in range(cycles + 1):
        for tool in ("squeue", "sinfo"):
            link = folder / f"current-{tool}.json"
            tmp = folder / f".{tool}.link"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(folder / f"{tool}-{index}.json")
            os.replace(tmp, link)
        started = time.perf_counter()
        await watcher.poll_once()
        elapsed = time.perf_counter() - started
        if index:
            times.append(elapsed)
            log(f"  {mode} cycle {index}: {elapsed:.3f} s, {len(sink.signals)} signals so far")
    kinds: dict[str, int] = {}
    for signal in sink.signals:
        kinds[signal.kind] = kinds.get(signal.kind, 0) + 1
    return {
        "median_s": statistics.median(times),
        "p95_s": sorted(times)[max(0, round(0.95 * len(times)) - 1)],
        "peak_rss_mb": peak_rss_mb(),
        "signals": len(sink.signals),
        "kinds": kinds,
        "msgspec": mode == "lean",
    }


def peak_rss_mb() -> float:
    """This process's own peak RSS. Not getrusage's ru_maxrss: on Linux that carries over
    exec, so a child started by a big parent reports at least the parent's size. VmHWM is
    the high-water mark of this process image alone."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_child(folder: Path, mode: str, cycles: int) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", str(folder), mode, str(cycles)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"child {mode} failed ({done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ----------------------------------------------------------------------------- parts


def bench_slurm(quick: bool) -> dict[str, Any]:
    n_nodes, n_jobs = 12_500, 20_000
    cycles = 3 if quick else 10
    baseline_cycles = 2 if quick else 3
    folder = Path(tempfile.mkdtemp(prefix="tm-watch-scale-"))
    try:
        log(f"slurm: generating {cycles + 1} views of {n_nodes} nodes / {n_jobs} jobs ...")
        size_mb = write_variants(folder, n_nodes, n_jobs, cycles)
        log(f"slurm: {size_mb:.1f} MB of JSON per cycle")
        lean = _run_child(folder, "lean", cycles)
        stdlib = _run_child(folder, "stdlib", baseline_cycles) if lean["msgspec"] else lean
        models = _run_child(folder, "models", baseline_cycles)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    expected_per_cycle = lean["kinds"]
    log(f"slurm: signals by kind over {cycles} cycles: {expected_per_cycle}")
    return {
        "slurm_nodes": n_nodes,
        "slurm_jobs": n_jobs,
        "slurm_json_mb": round(size_mb, 1),
        "cycle_s": round(lean["median_s"], 3),
        "cycle_p95_s": round(lean["p95_s"], 3),
        "peak_rss_mb": round(lean["peak_rss_mb"], 1),
        "cycle_stdlib_s": round(stdlib["median_s"], 3),
        "peak_rss_stdlib_mb": round(stdlib["peak_rss_mb"], 1),
        "cycle_models_s": round(models["median_s"], 3),
        "peak_rss_models_mb": round(models["peak_rss_mb"], 1),
        "msgspec": lean["msgspec"],
        "slurm_signals_per_cycle": round(lean["signals"] / cycles, 1),
        "n": cycles,
    }


def bench_logs(quick: bool) -> dict[str, Any]:
    """The log-watcher part: bench/watch_logs.py's figures (keys prefixed `log_`)."""
    # A sibling script, not a package module: import it by path.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from watch_logs import bench_logs as run_logs

    figures: dict[str, Any] = run_logs(quick)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cycles (< 1 min)")
    parser.add_argument(
        "--child", nargs=3, metavar=("DIR", "MODE", "CYCLES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        folder, mode, cycles = args.child
        print(json.dumps(asyncio.run(_child(Path(folder), mode, int(cycles)))))
        return
    figures: dict[str, Any] = {"bench": "watch_scale", "quick": args.quick}
    # Logs first: this process grows while it generates the Slurm views, and the log
    # part's children (which read their peak with ru_maxrss) would inherit that figure.
    logs = bench_logs(args.quick)
    slurm = bench_slurm(args.quick)
    # Keys are flat; `n` (cycles) and `peak_rss_mb` are the Slurm part's (the log part's
    # keys are all prefixed `log_`, so nothing of the Slurm part is overwritten).
    figures.update(logs)
    figures.update(slurm)
    missing = [k for k in ("cycle_s", "peak_rss_mb", "log_cpu_s_per_mb") if figures.get(k) is None]
    if missing:
        log(f"missing figures: {', '.join(missing)}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
