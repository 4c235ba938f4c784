"""Node agent overhead: what one agent costs its node while nothing happens, and how
fast it answers the controller's probe.

Starts, in a temp dir, the controller's agent-channel receiver (in this process, a
recording sink: no Temporal needed) and two real agent processes
(`python -m trainmedic.workers.node_agent`) following a kernel log file and a fake
8-GPU NVML state (the lab's `nvml.json`; the real driver is not needed to measure the
agent's own work):

- the agent as deployed with the channel (`--controller`, a heartbeat every 2 s, its
  probe listener), and
- side by side, the baseline: the same agent without the channel (spool only), which is
  what the agent cost before the channel.

Then, after a warm-up, it samples both processes' CPU time from /proc/<pid>/stat over an
idle window (60 s, `--quick` 20 s) and their peak resident memory (VmHWM, which unlike
ru_maxrss does not carry over exec), and probes the channel agent `GET /v1/alive` the
way the controller does (`AgentProbe`, a fresh connection each time), 200 times
(`--quick` 50), one after another.

Keys: `idle_cpu_pct` (percent of one core), `rss_mb` (VmHWM), `probe_p50_ms`,
`probe_p95_ms`, `heartbeats` (taken by the receiver during the window), and the baseline
`spool_only_idle_cpu_pct`, `spool_only_rss_mb`. Goals (issue 11): idle under 1% of a
core and under 150 MB.

    .venv/bin/python bench/agent_overhead.py [--quick]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
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

from _common import pct, say  # noqa: E402

from trainmedic.channel.liveness import AgentProbe, AgentTable  # noqa: E402
from trainmedic.channel.receiver import AgentReceiver  # noqa: E402
from trainmedic.lab.faults import default_nvml_state, write_json_atomic  # noqa: E402
from trainmedic.watchers.base import ListSink  # noqa: E402

NODE = "gpu01"
HEARTBEAT_S = 2.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def agent(tmp: Path, name: str, extra: list[str]) -> subprocess.Popen[bytes]:
    node_dir = tmp / name
    node_dir.mkdir()
    (node_dir / "kern.log").touch()
    write_json_atomic(node_dir / "nvml.json", default_nvml_state(NODE, 8))
    argv = [
        sys.executable,
        "-m",
        "trainmedic.workers.node_agent",
        "--node",
        NODE,
        "--kernel",
        str(node_dir / "kern.log"),
        "--nvml",
        str(node_dir / "nvml.json"),
        "--spool",
        str(node_dir / "spool"),
        *extra,
    ]
    log = (node_dir / "agent.log").open("ab")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    key_file = tmp / "site.key"
    key_file.write_text("bench-site-key-" + "0" * 32)
    key_file.chmod(0o600)
    table = AgentTable()
    receiver = AgentReceiver(ListSink(), key_file.read_bytes().strip(), table, port=0)
    await receiver.start()
    channel = agent(
        tmp,
        "channel",
        [
            "--key-file",
            str(key_file),
            "--controller",
            receiver.address,
            "--heartbeat",
            str(HEARTBEAT_S),
            "--listen",
            "127.0.0.1:0",
        ],
    )
    spool_only = agent(tmp, "spool-only", [])
    try:
        deadline = time.monotonic() + 60
        while NODE not in table.agents:
            if time.monotonic() > deadline or channel.poll() is not None:
                raise RuntimeError("the channel agent never sent a heartbeat")
            await asyncio.sleep(0.1)
        warm = 5.0
        say(f"agents up (pids {channel.pid}, {spool_only.pid}); warming up {warm:g} s")
        await asyncio.sleep(warm)
        beats_before = receiver.accepted["heartbeat"]
        c0, s0, t0 = cpu_seconds(channel.pid), cpu_seconds(spool_only.pid), time.monotonic()
        say(f"idle window: {args.window:g} s")
        await asyncio.sleep(args.window)
        c1, s1, t1 = cpu_seconds(channel.pid), cpu_seconds(spool_only.pid), time.monotonic()
        beats = receiver.accepted["heartbeat"] - beats_before
        elapsed = t1 - t0
        idle = 100 * (c1 - c0) / elapsed
        idle_base = 100 * (s1 - s0) / elapsed
        say(f"idle CPU: channel agent {idle:.3f}% of a core, spool-only {idle_base:.3f}%")

        state = table.agents[NODE]
        probe = AgentProbe(timeout=2.0)
        times: list[float] = []
        for _ in range(args.probes):
            started = time.perf_counter()
            result = await probe.probe(state)
            if result.answered is not True:
                raise RuntimeError(f"probe failed: {result.detail}")
            times.append((time.perf_counter() - started) * 1000)
        say(
            f"probe: p50 {statistics.median(times):.2f} ms, p95 {pct(times, 95):.2f} ms "
            f"over {len(times)}"
        )
        rss, rss_base = peak_rss_mb(channel.pid), peak_rss_mb(spool_only.pid)
        say(f"peak RSS (VmHWM): channel agent {rss:.1f} MB, spool-only {rss_base:.1f} MB")
        return {
            "bench": "agent_overhead",
            "n": len(times),
            "idle_cpu_pct": round(idle, 3),
            "rss_mb": round(rss, 1),
            "probe_p50_ms": round(statistics.median(times), 3),
            "probe_p95_ms": round(pct(times, 95), 3),
            "heartbeats": beats,
            "heartbeat_interval_s": HEARTBEAT_S,
            "idle_window_s": round(elapsed, 1),
            "spool_only_idle_cpu_pct": round(idle_base, 3),
            "spool_only_rss_mb": round(rss_base, 1),
            "goal_idle_cpu_pct": 1.0,
            "goal_rss_mb": 150,
            "quick": args.quick,
        }
    finally:
        for proc in (channel, spool_only):
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await receiver.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 s window, 50 probes")
    parser.add_argument("--window", type=float, default=None, help="idle window, s (60)")
    parser.add_argument("--probes", type=int, default=None, help="probes (200)")
    args = parser.parse_args()
    args.window = args.window or (20.0 if args.quick else 60.0)
    args.probes = args.probes or (50 if args.quick else 200)
    tmp = Path(tempfile.mkdtemp(prefix="trainmedic-bench-agent-"))
    try:
        figures = asyncio.run(run(args, tmp))
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    verdict = "met" if figures["idle_cpu_pct"] < 1.0 and figures["rss_mb"] < 150 else "MISSED"
    say(f"goal: idle < 1% of a core and < 150 MB: {verdict}")
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
