"""Telemetry after a real incident: the controller's Prometheus endpoint, scraped over
HTTP, shows the incident and its timings; one trace runs from the client's start
through the workflow to its activities; the watcher gauges read a real detection.

The worker here is this test's own (build_activities on a task queue of its own, with
record_outcome on a meter provider with a Prometheus endpoint on a free port), so the
figures are this incident's alone and no process-wide provider is installed.
"""

from __future__ import annotations

import asyncio
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import Worker

from tests.integration.support import job, result_of, submit_running, unique_cluster, xid79
from trainmedic.activities.control import ensure_control
from trainmedic.activities.telemetry import TelemetryActivities
from trainmedic.config import Policy, Settings, parse_policy
from trainmedic.domain import Category, Outcome
from trainmedic.domain.incident import EffectStatus, IncidentInput, IncidentResult
from trainmedic.lab import Lab
from trainmedic.telemetry import PROMETHEUS_SERIES, Telemetry, setup_telemetry
from trainmedic.workers.controller import WORKFLOWS, build_activities
from trainmedic.workflows.recovery import RecoveryWorkflow

pytestmark = pytest.mark.integration

AUTO = "version: it-tel\nmode: {default: auto}\nverify: {timeout: 90s, poll_interval: 1s}\n"


def scrape(url: str) -> dict[str, list[Any]]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list[Any]], name: str, **labels: str) -> float | None:
    found = [
        s.value
        for s in samples.get(name, [])
        if all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


@dataclass
class Controller:
    client: Client  # traced into `spans`
    settings: Settings
    telemetry: Telemetry
    spans: InMemorySpanExporter

    @property
    def url(self) -> str:
        assert self.telemetry.metrics_url
        return self.telemetry.metrics_url


@pytest.fixture
async def traced_controller(slurm_lab: Lab, temporal_client: Client) -> AsyncIterator[Controller]:
    queue = f"tm-telemetry-{uuid.uuid4().hex[:6]}"
    settings = Settings(
        cluster=unique_cluster("tel"),
        temporal_address=temporal_client.service_client.config.target_host,
        temporal_task_queue=queue,
        slurm_conf=slurm_lab.slurm_conf,
        state_dir=slurm_lab.root / "state",
        metrics_address="127.0.0.1:0",
        otlp_endpoint="",
    )
    telemetry = setup_telemetry(settings, install_global=False)
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    # The session's client, with a tracer of this test's own (the same connection).
    config = temporal_client.config()
    config["interceptors"] = [TracingInterceptor(tracer_provider.get_tracer("it"))]
    client = Client(**config)
    activities = [
        a
        for a in build_activities(client, settings, Policy())
        if getattr(a, "__name__", "") != "record_outcome"
    ]
    activities.append(TelemetryActivities(telemetry.meter()).record_outcome)
    worker = Worker(client, task_queue=queue, workflows=list(WORKFLOWS), activities=activities)
    try:
        async with worker:
            yield Controller(client, settings, telemetry, spans)
    finally:
        telemetry.shutdown()
        tracer_provider.shutdown()


async def run_xid79(controller: Controller, lab: Lab) -> tuple[str, IncidentResult]:
    client, settings = controller.client, controller.settings
    await ensure_control(client, settings.cluster, parse_policy(AUTO), settings.temporal_task_queue)
    job_id, placed = submit_running(lab, 2)
    signal = xid79(placed[0]).model_copy(update={"at": datetime.now(UTC)})
    incident = f"incident-{settings.cluster}-{job_id}-1"
    await client.start_workflow(
        RecoveryWorkflow.run,
        IncidentInput(cluster=settings.cluster, job_id=job_id, nodes=signal.nodes, signal=signal),
        id=incident,
        task_queue=settings.temporal_task_queue,
    )
    return job_id, await result_of(client, incident)


async def test_the_endpoint_shows_a_lab_incident_and_its_timings(
    clean_lab: Lab, traced_controller: Controller
) -> None:
    job_id, result = await run_xid79(traced_controller, clean_lab)
    assert result.outcome is Outcome.RECOVERED, result.summary
    assert int(job(clean_lab, job_id)["Restarts"]) == 1
    times = result.times
    detect_s, act_s, down_s = times.detect_s(), times.act_s(), times.down_s()
    assert detect_s is not None and act_s is not None and down_s is not None

    # record_outcome ran before the workflow closed: the scrape has it now.
    samples = await asyncio.to_thread(scrape, traced_controller.url)

    cluster = traced_controller.settings.cluster
    assert {n for n in samples if n.startswith("trainmedic_")} <= PROMETHEUS_SERIES
    incident = {"cluster": cluster, "category": Category.GPU_HARDWARE.value}
    assert (
        value(samples, "trainmedic_incidents_total", **incident, outcome="recovered", mode="auto")
        == 1
    )
    for name, seconds in (
        ("trainmedic_detection_seconds", detect_s),
        ("trainmedic_action_seconds", act_s),
        ("trainmedic_time_to_running_seconds", down_s),
    ):
        assert value(samples, f"{name}_count", **incident) == 1, name
        assert value(samples, f"{name}_sum", **incident) == pytest.approx(seconds, abs=1e-3)
        # The histogram's buckets: at most its +Inf holds it, from some bound on.
        assert value(samples, f"{name}_bucket", **incident, le="+Inf") == 1
    assert 0 < act_s < 120 and act_s < down_s
    for effect in result.effects:
        assert effect.status is EffectStatus.APPLIED
        assert (
            value(
                samples,
                "trainmedic_effects_total",
                cluster=cluster,
                kind=effect.kind.value,
                status="applied",
            )
            == 1
        )
    assert value(samples, "trainmedic_breaker_trips_total", cluster=cluster) is None

    # One trace: the client's start, the workflow, its activities (record_outcome too).
    finished = traced_controller.spans.get_finished_spans()
    names = {span.name for span in finished}
    assert "StartWorkflow:RecoveryWorkflow" in names
    assert "RunWorkflow:RecoveryWorkflow" in names
    for activity in ("gather_evidence", "attribute", "apply_effect", "record_outcome"):
        assert f"RunActivity:{activity}" in names, names
    [start] = [s for s in finished if s.name == "StartWorkflow:RecoveryWorkflow"]
    assert start.context is not None
    trace_id = start.context.trace_id
    applied = [s for s in finished if s.name == "RunActivity:apply_effect"]
    assert applied and all(s.context and s.context.trace_id == trace_id for s in applied)


async def test_the_watcher_gauges_read_a_real_detection(
    slurm_lab: Lab, traced_controller: Controller
) -> None:
    from trainmedic.adapters.slurm import SlurmCli
    from trainmedic.watchers.router import local_runner
    from trainmedic.workers.detection import build_detection

    settings = traced_controller.settings
    backend = SlurmCli(local_runner(settings), timeout=30)
    detection = build_detection(traced_controller.client, settings, backend)
    traced_controller.telemetry.watch(detection)
    await detection.slurm.watcher.poll_once()
    await detection.logs.poll_and_submit()

    samples = await asyncio.to_thread(scrape, traced_controller.url)

    slurm = value(samples, "trainmedic_watcher_cycle_seconds", watcher="slurm")
    logs = value(samples, "trainmedic_watcher_cycle_seconds", watcher="logs")
    assert slurm is not None and 0 < slurm < 30
    assert logs is not None and 0 <= logs < 30
    assert value(samples, "trainmedic_spool_pending_files", spool="epilog") == 0
    assert value(samples, "trainmedic_spool_pending_files", spool="signals") == 0
