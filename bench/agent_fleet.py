"""Agent fleet: 12,500 simulated node agents against one controller receiver, on this
machine.

One process is the controller's side exactly as it runs in the controller: the agent
channel's receiver (`AgentReceiver`: signature, replay window, rate limit, last-seen
table) and the node-death detector (`NodeDeathDetector`, silence 6 s, with the
production probe: a TCP connect to slurmd's port 6818 on the address the node's
heartbeats come from). Its findings sink records instead of calling Temporal.

A few asyncio processes are the fleet. Every simulated node has an address of its own
on the loopback (127.1.x.y), a "slurmd" listening on port 6818 there, and one
keep-alive connection to the receiver from that address, over which it sends a signed
heartbeat every 2 s (random phase), exactly as the real agent does (same wire code,
its own derived key). After a warm-up the bench measures for a window (60 s, `--quick`
20 s) and, spread over it, kills some nodes (50, `--quick` 10): the node's heartbeats
stop and its slurmd listener closes, as when a machine dies.

Keys: `agents`; `controller_cpu_pct` (the controller process's CPU over the window, in
percent of one core: everything it does for 12,500 agents); `heartbeats_per_s` (taken);
`heartbeat_lag_p95_s` (at the controller: how much later than its interval a heartbeat
arrived after the same agent's previous one; p50 and max beside); `request_p95_ms` (the
agents' round trip); `death_detect_p50_s`/`_p95_s`/`_max_s` (a node killed -> the
controller's verdict: silence + probes), `deaths` and `deaths_missed`; `rejected`
(requests refused: should be 0). Goal (issue 11): death detected within 15 s.

    .venv/bin/python bench/agent_fleet.py [--quick] [--agents 12500] [--procs 4]

Needs ~3 open files per simulated agent (ulimit -n is checked). Last line: one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import pct, say  # noqa: E402

from trainmedic.channel import wire  # noqa: E402
from trainmedic.channel.liveness import AgentTable, NodeDeathDetector, slurmd_probe  # noqa: E402
from trainmedic.channel.receiver import AgentReceiver  # noqa: E402
from trainmedic.domain.incident import IncidentSignal  # noqa: E402

SITE_KEY = b"agent-fleet-bench-site-key-0123456789"
HEARTBEAT_S = 2.0
SLURMD_PORT = 6818
SILENCE_S = 6.0


def node_name(index: int) -> str:
    return f"n{index:05d}"


def node_ip(index: int) -> str:
    return f"127.1.{index // 250}.{index % 250 + 1}"


# ------------------------------------------------------------------------ controller


class Verdicts:
    """The findings sink: when each node was called dead (wall clock)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    async def submit(self, signal: IncidentSignal) -> None:
        for node in signal.nodes:
            self.at.setdefault(node, time.time())


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def controller() -> None:
    table = AgentTable()
    verdicts = Verdicts()
    # Each agent sends 0.5 request/s; the default rate limit (10/s) is far above.
    receiver = AgentReceiver(verdicts, SITE_KEY, table, host="127.0.0.1", port=0)
    await receiver.start()
    detector = NodeDeathDetector(
        table,
        verdicts,
        jobs_on=lambda node: ["1"],  # every node runs a job
        probes=[slurmd_probe(SLURMD_PORT, timeout=1.0)],
        silence=SILENCE_S,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(detector.run(stop))
    print(f"port {receiver.port}", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    cpu0 = wall0 = 0.0
    beats0 = 0
    while line := (await reader.readline()).decode().strip():
        if line == "go":
            table.gaps.clear()
            cpu0, wall0, beats0 = cpu_self(), time.monotonic(), receiver.accepted["heartbeat"]
            print("going", flush=True)
        elif line == "stop":
            break
    cpu1, wall1 = cpu_self(), time.monotonic()
    beats = receiver.accepted["heartbeat"] - beats0
    gaps = list(table.gaps)
    stop.set()
    await task
    await receiver.close()
    print(
        json.dumps(
            {
                "cpu_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0),
                "window_s": wall1 - wall0,
                "heartbeats": beats,
                "agents": len(table.agents),
                "gap_p50_s": statistics.median(gaps) if gaps else None,
                "gap_p95_s": pct(gaps, 95) if gaps else None,
                "gap_max_s": max(gaps) if gaps else None,
                "verdicts": verdicts.at,
                "rejected": dict(receiver.rejected),
                "notes": len(table.notes),
                "counters": table.counters,
            }
        ),
        flush=True,
    )


# ----------------------------------------------------------------------------- fleet


class Stats:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: list[str] = []


class SimNode(asyncio.Protocol):
    """One simulated agent: a slurmd listener on its own address, and a keep-alive
    connection from that address beating every 2 s (a Protocol and a timer, not a task:
    3,000 of them share one process)."""

    def __init__(self, index: int, address: tuple[str, int], stats: Stats) -> None:
        self.index = index
        self.name = node_name(index)
        self.ip = node_ip(index)
        self.address = address
        self.stats = stats
        self.key = wire.node_key(SITE_KEY, self.name)
        self.listener: socket.socket | None = None
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.alive = True
        self.last_stamp = 0.0
        self.seq = 0
        self.sent_at = 0.0
        self.next_at = 0.0

    async def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.ip, SLURMD_PORT))
        listener.listen(64)  # never accepted: a connect succeeds, as slurmd's would
        self.listener = listener
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: self, *self.address, local_addr=(self.ip, 0))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.alive:
            self.stats.errors.append(f"{self.name}: connection lost ({exc!r})")
            self.alive = False

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if len(self.buffer) < end + 4 + length:
                return
            del self.buffer[: end + 4 + length]
            self.stats.latencies.append(time.perf_counter() - self.sent_at)
            if head[9:12] != b"200":
                self.stats.errors.append(f"{self.name}: {head[:40]!r}")

    def beat(self) -> None:
        if not self.alive or self.transport is None:
            return
        self.seq += 1
        body = json.dumps(
            {"node": self.name, "agent": "sim", "seq": self.seq, "interval": HEARTBEAT_S},
            separators=(",", ":"),
        ).encode()
        stamp = max(time.time(), self.last_stamp + 1e-6)
        self.last_stamp = stamp
        headers = wire.signed_headers(self.key, wire.HEARTBEAT_PATH, self.name, stamp, body)
        self.sent_at = time.perf_counter()
        self.transport.write(wire.request_bytes("c", wire.HEARTBEAT_PATH, body, headers))
        loop = asyncio.get_running_loop()
        self.next_at += HEARTBEAT_S
        loop.call_at(max(loop.time(), self.next_at), self.beat)

    def kill(self) -> float:
        self.alive = False
        if self.listener is not None:
            self.listener.close()
        if self.transport is not None:
            self.transport.close()
        return time.time()


async def fleet(first: int, count: int, address: tuple[str, int], seed: int) -> None:
    rng = random.Random(seed)
    stats = Stats()
    nodes = [SimNode(i, address, stats) for i in range(first, first + count)]
    for start in range(0, len(nodes), 200):
        await asyncio.gather(*(n.start() for n in nodes[start : start + 200]))
    loop = asyncio.get_running_loop()
    for node in nodes:  # a random phase each, then every 2 s
        node.next_at = loop.time() + rng.uniform(0, HEARTBEAT_S)
        loop.call_at(node.next_at, node.beat)
    print("ready", flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    kills: dict[str, float] = {}
    while line := (await reader.readline()).decode().strip():
        if line == "go":
            stats.latencies.clear()
        elif line.startswith("kill "):
            node = nodes[int(line.split()[1]) - first]
            kills[node.name] = node.kill()
        elif line == "stop":
            break
    for node in nodes:
        node.alive = False
    print(
        json.dumps(
            {
                "kills": kills,
                "latencies": stats.latencies[-20000:],
                "errors": stats.errors[:20],
                "error_count": len(stats.errors),
            }
        ),
        flush=True,
    )


# ------------------------------------------------------------------------------ main


def spawn(role: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *role],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def tell(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def expect(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(prefix):
        raise RuntimeError(f"expected {prefix!r} from a child, got {line!r}")
    return line.strip()


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    per_proc = 3 * args.agents // args.procs + 200
    if per_proc > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, per_proc * 2), hard))
    began = time.monotonic()
    load_before = os.getloadavg()[0]  # other work on this machine shares its cores
    ctl = spawn(["--role", "controller"])
    sims: list[subprocess.Popen[str]] = []
    try:
        port = int(expect(ctl, "port").split()[1])
        share = -(-args.agents // args.procs)
        for p in range(args.procs):
            first, count = p * share, min(share, args.agents - p * share)
            if count <= 0:
                break
            sims.append(
                spawn(
                    [
                        "--role",
                        "fleet",
                        "--first",
                        str(first),
                        "--count",
                        str(count),
                        "--port",
                        str(port),
                        "--seed",
                        str(args.seed + p),
                    ]
                )
            )
        for sim in sims:
            expect(sim, "ready")
        say(
            f"{args.agents} agents connected from {len(sims)} processes in "
            f"{time.monotonic() - began:.1f} s; warming up {args.warmup:g} s"
        )
        time.sleep(args.warmup)
        tell(ctl, "go")
        expect(ctl, "going")
        for sim in sims:
            tell(sim, "go")
        rng = random.Random(args.seed)
        victims = rng.sample(range(args.agents), args.deaths)
        # Deaths over the first part of the window: each has >= 15 s left to be seen.
        span = max(1.0, args.window - 16)
        times = sorted(rng.uniform(0, span) for _ in victims)
        started = time.monotonic()
        for victim, at in zip(victims, times, strict=True):
            time.sleep(max(0.0, started + at - time.monotonic()))
            tell(sims[victim // share], f"kill {victim}")
        left = args.window - (time.monotonic() - started)
        say(f"{args.deaths} nodes killed; measuring {max(0.0, left):.0f} s more")
        time.sleep(max(0.0, left))
        # The fleet first: a controller that closes first would fail their requests.
        for sim in sims:
            tell(sim, "stop")
        results = []
        for sim in sims:
            assert sim.stdout is not None
            results.append(json.loads(sim.stdout.readline()))
        tell(ctl, "stop")
        assert ctl.stdout is not None
        control = json.loads(ctl.stdout.readline())
    finally:
        for proc in [ctl, *sims]:
            with contextlib.suppress(Exception):
                proc.stdin.close()  # type: ignore[union-attr]
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    kills = {node: at for r in results for node, at in r["kills"].items()}
    detect = [control["verdicts"][n] - at for n, at in kills.items() if n in control["verdicts"]]
    false = [n for n in control["verdicts"] if n not in kills]
    latencies = [x for r in results for x in r["latencies"]]
    errors = sum(r["error_count"] for r in results)
    out: dict[str, Any] = {
        "bench": "agent_fleet",
        "n": len(detect),
        "agents": control["agents"],
        "controller_cpu_pct": round(control["cpu_pct"], 1),
        "heartbeats_per_s": round(control["heartbeats"] / control["window_s"], 1),
        "heartbeat_lag_p50_s": round(control["gap_p50_s"], 3),
        "heartbeat_lag_p95_s": round(control["gap_p95_s"], 3),
        "heartbeat_lag_max_s": round(control["gap_max_s"], 3),
        "request_p95_ms": round(1000 * pct(latencies, 95), 2) if latencies else None,
        "death_detect_p50_s": round(statistics.median(detect), 2) if detect else None,
        "death_detect_p95_s": round(pct(detect, 95), 2) if detect else None,
        "death_detect_max_s": round(max(detect), 2) if detect else None,
        "deaths": len(kills),
        "deaths_missed": len(kills) - len(detect),
        "false_deaths": len(false),
        "agent_errors": errors,
        "agent_error_examples": [e for r in results for e in r["errors"]][:3],
        "rejected": sum(control["rejected"].values()),
        "mass_silence_holds": control["counters"].get("mass_silence", 0),
        "loadavg_1m_before": round(load_before, 2),
        "heartbeat_interval_s": HEARTBEAT_S,
        "silence_s": SILENCE_S,
        "fleet_procs": len(sims),
        "window_s": round(control["window_s"], 1),
        "quick": args.quick,
        "wall_s": round(time.monotonic() - began, 1),
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["main", "controller", "fleet"], default="main")
    parser.add_argument("--quick", action="store_true", help="20 s window, 10 deaths")
    parser.add_argument("--agents", type=int, default=12_500)
    parser.add_argument("--procs", type=int, default=4, help="fleet processes")
    parser.add_argument("--window", type=float, default=None, help="seconds measured (60)")
    parser.add_argument("--deaths", type=int, default=None, help="nodes killed (50)")
    parser.add_argument("--warmup", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.role == "controller":
        asyncio.run(controller())
        return 0
    if args.role == "fleet":
        asyncio.run(fleet(args.first, args.count, ("127.0.0.1", args.port), args.seed))
        return 0
    args.window = args.window or (20.0 if args.quick else 60.0)
    args.deaths = args.deaths if args.deaths is not None else (10 if args.quick else 50)
    say(
        f"agent fleet: {args.agents} simulated agents (heartbeat every {HEARTBEAT_S:g} s) in "
        f"{args.procs} processes against one receiver; window {args.window:g} s, "
        f"{args.deaths} node deaths"
    )
    figures = orchestrate(args)
    say(
        f"controller CPU {figures['controller_cpu_pct']}% of a core for "
        f"{figures['heartbeats_per_s']} heartbeats/s; heartbeat lag p95 "
        f"{figures['heartbeat_lag_p95_s']} s; death detected p95 "
        f"{figures['death_detect_p95_s']} s ({figures['deaths_missed']} missed, "
        f"{figures['false_deaths']} false)"
    )
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
