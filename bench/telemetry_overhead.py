"""Telemetry overhead: the action latency of one recovery with tracing + metrics on vs off,
side by side in one run, against the real lab.

Sets up its own Temporal dev server and 4-node Slurm lab on free ports in a temp dir and
runs two controller workers in-process, on two task queues and two clusters, on one
connection to Temporal:

* **on**: the client and its worker carry Temporal's TracingInterceptor on an SDK tracer
  provider with a batch span processor (as `setup_telemetry` builds for OTLP; the
  exporter counts the spans and drops them), and `record_outcome` records into an SDK
  meter provider with the Prometheus endpoint on a free port (scraped once per incident,
  as Prometheus would, and checked at the end);
* **off**: no interceptor, and `record_outcome` records into the no-op meter (what a
  controller with `metrics_address` and `otlp_endpoint` empty does).

Each incident is an Xid 79 report about one idle node (no job) in auto mode with no
settle window: the RecoveryWorkflow snapshots the control state, gathers evidence,
attributes, reserves the isolation and drains the node. Action latency is the
incident's own figure (IncidentTimes.act_s: its start to the drain applied), the one
`trainmedic_action_seconds` reports. Incidents alternate on/off (ABBA order), the
node is resumed between them. `overhead_pct` is the median of the paired differences
(each "on" incident minus the "off" one beside it) over the "off" median: drifts in the
machine's load cancel out; `overhead_unpaired_pct` compares the two sides' medians, and
`off_spread_pct` says how much "off" alone varies (the resolution of either figure).
`tracing_cpu_pct_of_action` is a bound independent of the machine's load: the CPU time
of one span (`span_cpu_us`, measured after the run) times the spans of an incident,
over the action latency.
Last line: one JSON object.

    .venv/bin/python bench/telemetry_overhead.py            # 20 incidents per side
    .venv/bin/python bench/telemetry_overhead.py --quick    # 6 per side, under a minute
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import pct, run_on_lab, say, wait_lab_idle, xid79  # noqa: E402
from opentelemetry.metrics import NoOpMeter  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.opentelemetry import TracingInterceptor  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from trainmedic.activities.control import ensure_control  # noqa: E402
from trainmedic.activities.telemetry import TelemetryActivities  # noqa: E402
from trainmedic.config import Settings, parse_policy  # noqa: E402
from trainmedic.domain.incident import EffectStatus, IncidentInput  # noqa: E402
from trainmedic.lab import Lab  # noqa: E402
from trainmedic.lab.workload import lab_nodes  # noqa: E402
from trainmedic.telemetry import Telemetry, setup_telemetry  # noqa: E402
from trainmedic.temporal.client import open_client  # noqa: E402
from trainmedic.temporal.devserver import DevServer  # noqa: E402
from trainmedic.workers.controller import WORKFLOWS, build_activities  # noqa: E402
from trainmedic.workflows.recovery import RecoveryWorkflow  # noqa: E402

LAB_NODES = 4
# Auto mode, no settle window (it would only add the same 2 s to both sides), rails
# wide enough that every drain is granted (the rails are not what this measures).
POLICY = """
version: bench-telemetry
mode: {default: auto}
detect: {settle: 0s}
rails: {max_isolated_fraction: 1.0, isolation_window: 1s, max_drains_per_hour: 10000,
        restart_budget: 100}
"""
SIDES = ("on", "off")


class CountingExporter(SpanExporter):
    """Takes every span the batch processor hands over, counts it, drops it."""

    def __init__(self) -> None:
        self.spans = 0
        self.names: set[str] = set()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        self.names.update(s.name for s in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def span_cost_us(tracer: Any, k: int = 5000) -> float:
    """CPU per span as the interceptor makes them: start, attributes, the context put in
    a Temporal header (inject + payload), end into the batch processor."""
    interceptor = TracingInterceptor(tracer)
    began = time.perf_counter()
    for _ in range(k):
        with tracer.start_as_current_span(
            "RunActivity:apply_effect",
            attributes={"temporalWorkflowID": "incident-bench-1", "temporalRunID": "r"},
        ):
            carrier: dict[str, str] = {}
            interceptor.text_map_propagator.inject(carrier)
            interceptor.payload_converter.to_payloads([carrier])
    return (time.perf_counter() - began) / k * 1e6


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
    return text


class Side:
    """One controller: its client, settings and worker."""

    def __init__(self, name: str, client: Client, settings: Settings, meter: Any) -> None:
        self.name = name
        self.client = client
        self.settings = settings
        activities = [
            a
            for a in build_activities(client, settings, parse_policy(POLICY))
            if getattr(a, "__name__", "") != "record_outcome"
        ]
        activities.append(TelemetryActivities(meter).record_outcome)
        # As build_worker builds it (the interceptors, if any, come from the client; every
        # activity is async, so no executor).
        self.worker = Worker(
            client,
            task_queue=settings.temporal_task_queue,
            workflows=list(WORKFLOWS),
            activities=activities,
        )
        self.act_s: list[float] = []


async def one_incident(side: Side, lab: Lab, node: str, index: int) -> float:
    cluster = side.settings.cluster
    incident = f"incident-{cluster}-{node}-{uuid.uuid4().hex[:6]}"
    try:
        handle = await side.client.start_workflow(
            RecoveryWorkflow.run,
            IncidentInput(cluster=cluster, nodes=[node], signal=xid79(node)),
            id=incident,
            task_queue=side.settings.temporal_task_queue,
        )
        result = await asyncio.wait_for(handle.result(), 120)
    finally:
        lab.run_client(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    drains = [e for e in result.effects if e.status is EffectStatus.APPLIED]
    act_s = result.times.act_s()
    if not drains or act_s is None:
        raise RuntimeError(f"{incident}: no effect applied ({result.outcome}: {result.summary})")
    label = "warm-up" if index < 0 else f"incident {index + 1}"
    say(f"{label} ({side.name:>3}): drained {node}; action latency {act_s:.3f} s")
    return act_s


class Progress:
    def __init__(self) -> None:
        self.sides: dict[str, list[float]] = {name: [] for name in SIDES}
        self.spans = 0
        self.span_names: set[str] = set()
        self.incidents_scraped = 0.0
        self.span_cost_us = 0.0
        self.error: BaseException | None = None
        self.finished = threading.Event()


async def bench(server: DevServer, lab: Lab, state: Path, n: int, progress: Progress) -> None:
    base = await open_client(server.address, "default", tracing=False)
    exporter = CountingExporter()
    stamp = uuid.uuid4().hex[:4]

    def settings(name: str, **extra: Any) -> Settings:
        return Settings(
            cluster=f"tel{name}{stamp}",
            temporal_address=server.address,
            temporal_task_queue=f"trainmedic-bench-tel-{name}",
            slurm_conf=lab.slurm_conf,
            state_dir=state,
            **extra,
        )

    on_settings = settings("on", metrics_address="127.0.0.1:0", otlp_endpoint="")
    telemetry: Telemetry = setup_telemetry(
        on_settings, install_global=False, span_exporters=[exporter]
    )
    assert telemetry.tracer_provider is not None and telemetry.metrics_url
    config = base.config()
    config["interceptors"] = [
        TracingInterceptor(telemetry.tracer_provider.get_tracer("trainmedic"))
    ]
    traced = Client(**config)
    sides = {
        "on": Side("on", traced, on_settings, telemetry.meter()),
        "off": Side("off", base, settings("off", metrics_address=""), NoOpMeter("off")),
    }
    policy = parse_policy(POLICY)
    nodes = lab_nodes(lab)
    try:
        async with sides["on"].worker, sides["off"].worker:
            for side in sides.values():
                await ensure_control(
                    side.client, side.settings.cluster, policy, side.settings.temporal_task_queue
                )
            # One warm-up incident per side (first-use costs: imports, caches, sandbox).
            for side in sides.values():
                await wait_lab_idle(lab, LAB_NODES, 60)
                await one_incident(side, lab, nodes[0], -1)
            index = 0
            for pair in range(n):
                order = SIDES if pair % 2 == 0 else SIDES[::-1]  # ABBA: no order bias
                for name in order:
                    node = nodes[index % len(nodes)]
                    await wait_lab_idle(lab, LAB_NODES, 60)
                    progress.sides[name].append(await one_incident(sides[name], lab, node, index))
                    if name == "on":  # Prometheus scrapes the controller now and then
                        await asyncio.to_thread(scrape, telemetry.metrics_url)
                    index += 1
            text = await asyncio.to_thread(scrape, telemetry.metrics_url)
            assert telemetry.tracer_provider.force_flush(10_000)
            progress.spans = exporter.spans
            progress.span_cost_us = span_cost_us(telemetry.tracer_provider.get_tracer("cost"))
            progress.span_names = exporter.names
            progress.incidents_scraped = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("trainmedic_incidents_total{")
            )
    except BaseException as error:
        progress.error = error
        raise
    finally:
        progress.finished.set()
        telemetry.shutdown()


def summary(progress: Progress, n: int, quick: bool, wall_s: float) -> dict[str, Any]:
    on, off = progress.sides["on"], progress.sides["off"]
    on_p50, off_p50 = statistics.median(on), statistics.median(off)
    # Paired: each "on" incident against the "off" one beside it in the ABBA order, so
    # that the machine's load drifting during the run (other work on shared cores) cancels
    # out; the difference of the two sides' medians is given beside it.
    paired = [a - b for a, b in zip(on, off, strict=True)]
    spans_per_incident = progress.spans / (len(on) + 1)  # the warm-up is traced too
    tracing_ms = progress.span_cost_us * spans_per_incident / 1000
    return {
        "bench": "telemetry_overhead",
        "n": len(on) + len(off),
        "per_side": n,
        "quick": quick,
        "overhead_pct": round(statistics.median(paired) / off_p50 * 100, 2),
        "overhead_unpaired_pct": round((on_p50 - off_p50) / off_p50 * 100, 2),
        # The resolution: how much "off" incidents alone vary (interquartile range).
        "off_spread_pct": round((pct(off, 75) - pct(off, 25)) / off_p50 * 100, 2),
        "action_on_p50_s": round(on_p50, 4),
        "action_off_p50_s": round(off_p50, 4),
        "action_on_p95_s": round(pct(on, 95), 4),
        "action_off_p95_s": round(pct(off, 95), 4),
        "overhead_paired_p50_ms": round(statistics.median(paired) * 1000, 2),
        # Warm-up incident included (it is traced and recorded too).
        "spans_exported": progress.spans,
        "spans_per_incident": round(spans_per_incident, 1),
        # A bound that does not depend on the machine's load: the CPU of every span of an
        # incident (those after its action included), over the action latency.
        "span_cpu_us": round(progress.span_cost_us, 1),
        "tracing_cpu_per_incident_ms": round(tracing_ms, 3),
        "tracing_cpu_pct_of_action": round(tracing_ms / 1000 / off_p50 * 100, 2),
        "incidents_on_endpoint": int(progress.incidents_scraped),
        "wall_s": round(wall_s, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 incidents per side")
    parser.add_argument("-n", type=int, default=None, help="incidents per side (20; quick 6)")
    args = parser.parse_args()
    n = args.n or (6 if args.quick else 20)
    # Its one warning (no site key for node agents' health answers) is not about this.
    logging.getLogger("trainmedic.workers.controller").setLevel(logging.ERROR)
    progress = Progress()
    lab_run = run_on_lab(
        lambda server, lab, state: bench(server, lab, state, n, progress),
        progress,
        f"{n} incidents per side, tracing + metrics on vs off, alternating",
        nodes=LAB_NODES,
    )
    failed = lab_run.failure(progress, progress.sides["off"])
    if failed is not None:
        return failed
    figures = summary(progress, n, args.quick, lab_run.wall_s())
    say(
        f"action latency p50: on {figures['action_on_p50_s']:.3f} s, off "
        f"{figures['action_off_p50_s']:.3f} s; overhead (paired) "
        f"{figures['overhead_pct']:+.2f}%, difference of medians "
        f"{figures['overhead_unpaired_pct']:+.2f}% (off alone varies by "
        f"{figures['off_spread_pct']:.1f}%); {figures['spans_per_incident']} spans per "
        f"incident at {figures['span_cpu_us']:.0f} us each: at most "
        f"{figures['tracing_cpu_pct_of_action']:.2f}% of the action latency in CPU; "
        f"{figures['incidents_on_endpoint']} incidents on the endpoint"
    )
    print(json.dumps(figures), flush=True)
    return lab_run.exit()


if __name__ == "__main__":
    sys.exit(main())
