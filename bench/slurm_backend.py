"""Slurm backends side by side: Slurm's commands (`SlurmCli`) vs libslurm (`PySlurmBackend`).

Both talk to the same lab on Slurm 25.11 (the only release PyPI's pyslurm builds for;
deploy/lab/build-slurm.sh), in the same run, alternating call by call:

- reads: one watcher-style read (all jobs + all nodes: `list_jobs` + `list_nodes`), and
  `get_job` / `get_node`, with a queue of held jobs in the lab (`--jobs`, default 300,
  quick 50) so the job list is not trivially small;
- effects: a job comment set (re-read + update, `set_comment` with a new text each time)
  and a node drain + resume, each one effect as the controller makes it (re-read first);
- the watcher's cycle (read + diff) the way each backend is polled: the command-line
  backend's JSON fast path (`JsonSource`: squeue/sinfo --json, lean parse) and pyslurm
  through the backend (`BackendSource`). At the lab's size: each emulated node is a
  slurmd process (at most 99), so 12,500 nodes is not something this lab can emulate;
  bench/watch_scale.py measures the JSON path at 12,500 nodes with synthetic output.

Needs root, munge, the Slurm 25.11 build and pyslurm: run from the main venv it re-runs
itself in .venv-pyslurm (`make test-pyslurm` makes it); where those are missing it says
so and prints the JSON with `skipped` (exit 0), so `make bench-quick` still passes.

Usage: .venv/bin/python bench/slurm_backend.py [--quick] [-n N] [--jobs J]
Last line: one JSON object (medians in ms; `ratio_read` = cli_read_ms / pyslurm_read_ms).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import say, sigterm_as_interrupt  # noqa: E402
from trainmedic.config import default_state_dir  # noqa: E402

SLURM_VERSION = "25.11.7"
PYSLURM_VENV = ROOT / ".venv-pyslurm"
LAB_NODES = 4


def slurm_prefix() -> Path:
    given = os.environ.get("TRAINMEDIC_SLURM_PREFIX")
    if given:
        return Path(given)
    state = os.environ.get("TRAINMEDIC_STATE_DIR")
    return (Path(state) if state else default_state_dir()) / "slurm" / SLURM_VERSION


def skipped(reason: str) -> int:
    say(f"skipped: {reason}")
    print(json.dumps({"bench": "slurm_backend", "n": 0, "skipped": reason}))
    return 0


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm lab needs root"
    prefix = slurm_prefix()
    if not (prefix / ".trainmedic-build-complete").is_file():
        return f"no Slurm {SLURM_VERSION} build in {prefix} (make test-pyslurm builds it)"
    return None


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await fn()
    return (time.perf_counter() - started) * 1000


def med(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3)


async def measure(lab: Any, n: int, jobs: int) -> dict[str, Any]:
    from trainmedic.adapters.slurm import LocalRunner, SlurmCli
    from trainmedic.adapters.slurm.pyslurm_backend import PySlurmBackend
    from trainmedic.watchers.slurm import BackendSource, JsonSource, diff_views

    runner = LocalRunner(env=lab.env_overrides())
    cli = SlurmCli(runner, timeout=30)
    pys = PySlurmBackend.open(lab.slurm_conf, timeout=30)
    backends = {"cli": cli, "pyslurm": pys}
    sources = {"cli": JsonSource(runner, timeout=30), "pyslurm": BackendSource(pys)}
    try:
        say(f"Slurm {await pys.version()} (pyslurm) = {await cli.version()} (commands)")
        say(f"queueing {jobs} held jobs and one running job")
        script = lab.layout.jobs / "bench.sh"
        lab.layout.jobs.mkdir(parents=True, exist_ok=True)
        script.write_text("#!/bin/bash\nsleep 3600\n")
        common = ["sbatch", "--parsable", "-D", str(lab.layout.jobs), "-o", "/dev/null"]
        for _ in range(jobs):
            lab.run_client([*common, "--hold", str(script)])
        running = lab.run_client([*common, "-N", "1", str(script)]).stdout.strip()
        while not (await cli.get_job(running)).is_running:
            await asyncio.sleep(0.2)
        node = "gpu04"
        same = {
            name: (len(await b.list_jobs()), len(await b.list_nodes()))
            for name, b in backends.items()
        }
        say(f"both backends see (jobs, nodes): {same}")

        times: dict[str, list[float]] = {}

        def add(key: str, value: float) -> None:
            times.setdefault(key, []).append(value)

        for i in range(n):
            for name, b in backends.items():  # alternate: same conditions for both
                add(
                    f"{name}_read",
                    await timed(lambda b=b: asyncio.gather(b.list_jobs(), b.list_nodes())),
                )
                add(f"{name}_get_job", await timed(lambda b=b: b.get_job(running)))
                add(f"{name}_get_node", await timed(lambda b=b: b.get_node(node)))
                note = f"bench {name} {i}"
                add(f"{name}_comment", await timed(lambda b=b, t=note: b.set_comment(running, t)))
                add(f"{name}_drain", await timed(lambda b=b: b.drain_node(node, "bench drain")))
                add(f"{name}_resume", await timed(lambda b=b: b.resume_node(node)))
                source = sources[name]
                prev = await source.read()
                started = time.perf_counter()
                diff_views(prev, await source.read())
                add(f"{name}_watch", (time.perf_counter() - started) * 1000)
            if (i + 1) % max(1, n // 5) == 0:
                say(
                    f"  {i + 1}/{n}: read cli {med(times['cli_read'])} ms,"
                    f" pyslurm {med(times['pyslurm_read'])} ms"
                )
        figures: dict[str, Any] = {}
        for name in backends:
            effects = times[f"{name}_comment"] + times[f"{name}_drain"] + times[f"{name}_resume"]
            figures[f"{name}_read_ms"] = med(times[f"{name}_read"])
            figures[f"{name}_read_p95_ms"] = p95(times[f"{name}_read"])
            figures[f"{name}_effect_ms"] = med(effects)
            figures[f"{name}_effect_p95_ms"] = p95(effects)
            figures[f"{name}_get_job_ms"] = med(times[f"{name}_get_job"])
            figures[f"{name}_get_node_ms"] = med(times[f"{name}_get_node"])
            figures[f"{name}_comment_ms"] = med(times[f"{name}_comment"])
            figures[f"{name}_drain_ms"] = med(times[f"{name}_drain"])
            figures[f"{name}_resume_ms"] = med(times[f"{name}_resume"])
            figures[f"{name}_watch_cycle_ms"] = med(times[f"{name}_watch"])
        figures["ratio_read"] = round(figures["cli_read_ms"] / figures["pyslurm_read_ms"], 2)
        figures["ratio_effect"] = round(figures["cli_effect_ms"] / figures["pyslurm_effect_ms"], 2)
        figures["ratio_watch_cycle"] = round(
            figures["cli_watch_cycle_ms"] / figures["pyslurm_watch_cycle_ms"], 2
        )
        figures["jobs"], figures["nodes"] = same["pyslurm"]
        say(
            "watcher cycle at 12,500 nodes: not emulated (the lab runs one slurmd per node,"
            " at most 99); bench/watch_scale.py has the JSON path at that size"
        )
        return figures
    finally:
        pys.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, under a minute")
    parser.add_argument("-n", type=int, default=None, help="repeats (default 30, quick 8)")
    parser.add_argument("--jobs", type=int, default=None, help="held jobs (300, quick 50)")
    args = parser.parse_args()
    n = args.n or (8 if args.quick else 30)
    jobs = args.jobs if args.jobs is not None else (50 if args.quick else 300)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    reason = unavailable()
    if reason is not None:
        return skipped(reason)
    if importlib.util.find_spec("pyslurm") is None:
        python = PYSLURM_VENV / "bin" / "python"
        if python.exists() and os.environ.get("TRAINMEDIC_BENCH_REEXEC") != "1":
            say(f"pyslurm is not in this venv; re-running in {PYSLURM_VENV.name}")
            os.environ["TRAINMEDIC_BENCH_REEXEC"] = "1"
            os.execv(str(python), [str(python), __file__, *sys.argv[1:]])
        return skipped(f"pyslurm is not installed here nor in {PYSLURM_VENV} (make test-pyslurm)")

    from trainmedic.lab import Lab, find_free_port_base

    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="trainmedic-bench-"))
    lab = Lab(
        tmp / "lab", port_base=find_free_port_base(LAB_NODES + 2), slurm_prefix=slurm_prefix()
    )
    began = time.monotonic()
    try:
        say(f"starting a {LAB_NODES}-node lab on Slurm {SLURM_VERSION} ({slurm_prefix()})")
        lab.up(nodes=LAB_NODES, gpus=8)
        say(f"ready after {time.monotonic() - began:.1f} s; {n} rounds, both backends")
        figures = asyncio.run(measure(lab, n, jobs))
    except KeyboardInterrupt:
        say("interrupted; cleaning up")
        return 130
    finally:
        lab.down()
        shutil.rmtree(tmp, ignore_errors=True)
    figures.update(
        {"quick": args.quick, "wall_s": round(time.monotonic() - began, 1)},
    )
    print(json.dumps({"bench": "slurm_backend", "n": n, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
