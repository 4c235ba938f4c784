"""trainmedic.telemetry: what an incident's result records, the Prometheus endpoint, OTLP
export, the watcher gauges, and the Grafana dashboard's queries."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import urllib.request
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from trainmedic.activities.telemetry import TelemetryActivities
from trainmedic.config import Settings
from trainmedic.domain import Action, Category, Diagnosis, Mode, Outcome
from trainmedic.domain.incident import (
    Decision,
    EffectKind,
    EffectStatus,
    IncidentResult,
    IncidentTimes,
    PlannedEffect,
)
from trainmedic.domain.telemetry import OutcomeRecord
from trainmedic.telemetry import (
    INSTRUMENT_NAMES,
    INSTRUMENTS,
    PROMETHEUS_SERIES,
    DetectionGauges,
    setup_telemetry,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "trainmedic.json"
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def scripted_result(incident_id: str = "incident-lab-42-1") -> IncidentResult:
    """Xid 79 in approve mode: failed at 0 s, opened at 1.5 s, the drain approved after a
    60 s wait and applied at 70 s, the job running again at 100 s."""
    drain = PlannedEffect(
        id="drain-gpu02",
        kind=EffectKind.DRAIN_NODE,
        node="gpu02",
        reason="r",
        mode=Mode.APPROVE,
        status=EffectStatus.APPLIED,
        awaiting_since=at(5),
        applied_at=at(70),
    )
    requeue = PlannedEffect(
        id="requeue-42",
        kind=EffectKind.REQUEUE_EXCLUDING,
        job_id="42",
        exclude=["gpu02"],
        reason="r",
        mode=Mode.APPROVE,
        status=EffectStatus.APPLIED,
        awaiting_since=at(71),
        applied_at=at(80),
    )
    return IncidentResult(
        incident_id=incident_id,
        outcome=Outcome.RECOVERED,
        summary="job 42 runs again",
        diagnosis=Diagnosis(
            category=Category.GPU_HARDWARE,
            action=Action.DRAIN_AND_RESTART,
            culprit_nodes=["gpu02"],
            confidence=0.9,
            catalog_version="t",
        ),
        effects=[drain, requeue],
        decisions=[
            Decision(
                action="drain-gpu02", approve=True, by="ops", at=at(65), effect_ids=["drain-gpu02"]
            ),
            Decision(
                action="requeue-42",
                approve=True,
                by="trainmedic:timeout",
                via="timeout",
                at=at(79),
                effect_ids=["requeue-42"],
            ),
        ],
        times=IncidentTimes(
            failed_at=at(0), opened_at=at(1.5), acted_at=at(70), running_again_at=at(100)
        ),
    )


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


async def test_record_outcome_counts_the_incident_and_its_timings() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    acts = TelemetryActivities(provider.get_meter("test"))
    record = OutcomeRecord(cluster="lab", mode=Mode.APPROVE, result=scripted_result())

    answer = await acts.record_outcome(record)

    assert answer.recorded
    got = points(reader)
    [incident] = got["trainmedic_incidents"]
    assert incident.value == 1
    assert dict(incident.attributes) == {
        "cluster": "lab",
        "category": "gpu_hardware",
        "outcome": "recovered",
        "mode": "approve",
    }
    [detect] = got["trainmedic_detection_seconds"]
    assert (detect.count, detect.sum) == (1, pytest.approx(1.5))
    assert dict(detect.attributes) == {"cluster": "lab", "category": "gpu_hardware"}
    [act] = got["trainmedic_action_seconds"]
    assert (act.count, act.sum) == (1, pytest.approx(68.5))
    assert act.attributes["action"] == "drain_and_restart"
    [down] = got["trainmedic_time_to_running_seconds"]
    assert (down.count, down.sum) == (1, pytest.approx(100.0))
    # Seconds buckets, not the SDK's default (milliseconds-sized) ones.
    assert 1 in detect.explicit_bounds and 3600 in detect.explicit_bounds
    effects = {
        (p.attributes["kind"], p.attributes["status"]): p.value for p in got["trainmedic_effects"]
    }
    assert effects == {("drain_node", "applied"): 1, ("requeue_excluding", "applied"): 1}
    waits = {
        p.attributes["decision"]: (p.count, p.sum) for p in got["trainmedic_approval_wait_seconds"]
    }
    assert waits == {"approved": (1, pytest.approx(60.0)), "timeout": (1, pytest.approx(8.0))}
    assert "trainmedic_breaker_trips" not in got
    assert set(answer.instruments) <= INSTRUMENT_NAMES
    provider.shutdown()


async def test_a_retried_record_counts_once_and_a_breaker_trip_counts() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    acts = TelemetryActivities(provider.get_meter("test"))
    result = scripted_result().model_copy(
        update={"outcome": Outcome.ESCALATED, "times": IncidentTimes(opened_at=at(0))}
    )
    record = OutcomeRecord(cluster="c1", mode=Mode.AUTO, result=result, breaker_tripped=True)

    first = await acts.record_outcome(record)
    again = await acts.record_outcome(record)

    assert first.recorded and not again.recorded
    got = points(reader)
    assert [p.value for p in got["trainmedic_incidents"]] == [1]
    assert [(dict(p.attributes), p.value) for p in got["trainmedic_breaker_trips"]] == [
        ({"cluster": "c1"}, 1)
    ]
    # No report time, no effect applied, not running again: no timing was made up.
    for name in ("detection", "action", "time_to_running"):
        assert f"trainmedic_{name}_seconds" not in got
    provider.shutdown()


async def test_an_incident_without_a_diagnosis_is_unknown() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    acts = TelemetryActivities(provider.get_meter("test"))
    result = IncidentResult(incident_id="incident-x-1-1", outcome=Outcome.CANCELLED, summary="")
    await acts.record_outcome(OutcomeRecord(cluster="x", mode=Mode.MONITOR, result=result))
    [incident] = points(reader)["trainmedic_incidents"]
    assert incident.attributes["category"] == "unknown"
    assert incident.attributes["outcome"] == "cancelled"
    provider.shutdown()


async def test_without_telemetry_the_activity_records_into_nothing() -> None:
    # No provider set up: the process's no-op meter; the activity still answers.
    answer = await TelemetryActivities().record_outcome(
        OutcomeRecord(cluster="lab", mode=Mode.AUTO, result=scripted_result("incident-n-1-1"))
    )
    assert answer.recorded


# --------------------------------------------------------------------------- endpoints


def scrape(url: str) -> dict[str, list[Any]]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


async def test_the_prometheus_endpoint_serves_the_instruments_under_their_names() -> None:
    settings = Settings(metrics_address="127.0.0.1:0", otlp_endpoint="")
    telemetry = setup_telemetry(settings, install_global=False)
    try:
        assert telemetry.metrics_url and telemetry.meter_provider is not None
        assert telemetry.tracer_provider is None  # traces go to OTLP only
        acts = TelemetryActivities(telemetry.meter())
        await acts.record_outcome(
            OutcomeRecord(
                cluster="lab", mode=Mode.APPROVE, result=scripted_result(), breaker_tripped=True
            )
        )
        gauges = DetectionGauges()
        gauges.register(telemetry.meter())
        gauges.watch({"slurm": lambda: 0.25, "logs": lambda: None}, {"epilog": lambda: 3})

        samples = await asyncio.to_thread(scrape, telemetry.metrics_url)
    finally:
        telemetry.shutdown()
    ours = {name for name in samples if name.startswith("trainmedic_")}
    # Every series shown is one the instruments list says (the dashboard relies on it),
    # and every instrument is shown.
    assert ours <= PROMETHEUS_SERIES
    assert ours == PROMETHEUS_SERIES
    [incident] = samples["trainmedic_incidents_total"]
    assert incident.value == 1 and incident.labels["outcome"] == "recovered"
    [count] = samples["trainmedic_detection_seconds_count"]
    assert count.value == 1
    assert [s.value for s in samples["trainmedic_watcher_cycle_seconds"]] == [0.25]
    [pending] = samples["trainmedic_spool_pending_files"]
    assert (pending.labels["spool"], pending.value) == ("epilog", 3)


def test_a_taken_metrics_port_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    first = setup_telemetry(Settings(metrics_address="127.0.0.1:0"), install_global=False)
    try:
        assert first.metrics_address is not None
        second = setup_telemetry(
            Settings(metrics_address=first.metrics_address), install_global=False
        )
        assert second.metrics_address is None and second.meter_provider is None
        assert "metrics endpoint not started" in caplog.text
    finally:
        first.shutdown()


class _Collector(BaseHTTPRequestHandler):
    posts: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        type(self).posts.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_otlp_exports_metrics_and_traces_to_the_collector() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Collector.posts = []
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/"
        settings = Settings(metrics_address="", otlp_endpoint=endpoint)
        assert settings.otlp_endpoint == endpoint.rstrip("/")
        telemetry = setup_telemetry(settings, install_global=False)
        assert telemetry.meter_provider is not None and telemetry.tracer_provider is not None
        telemetry.meter().create_counter("trainmedic_incidents").add(1, {"cluster": "o"})
        with telemetry.tracer_provider.get_tracer("test").start_as_current_span("apply"):
            pass
        assert telemetry.meter_provider.force_flush(5_000)
        assert telemetry.tracer_provider.force_flush(5_000)
        telemetry.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    assert {"/v1/metrics", "/v1/traces"} <= set(_Collector.posts)


def test_telemetry_settings_are_checked() -> None:
    assert Settings().metrics_address == "127.0.0.1:9464"
    assert Settings().otlp_endpoint == ""
    assert Settings(metrics_address="").metrics_address == ""
    with pytest.raises(ValidationError, match="metrics_address"):
        Settings(metrics_address="9464")
    with pytest.raises(ValidationError, match="otlp_endpoint"):
        Settings(otlp_endpoint="collector:4318")


def test_off_builds_nothing() -> None:
    telemetry = setup_telemetry(
        Settings(metrics_address="", otlp_endpoint=""), install_global=False
    )
    assert telemetry.meter_provider is None and telemetry.tracer_provider is None
    telemetry.watch(SimpleNamespace())  # nothing to report to: not even looked at
    telemetry.shutdown()


def test_gauges_read_a_detection_s_watchers_and_spools(tmp_path: Path) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    telemetry = setup_telemetry(Settings(metrics_address=""), install_global=False)
    telemetry.meter_provider = provider
    names = SimpleNamespace(names=lambda: ["a.json", "b.json"])
    detection = SimpleNamespace(
        slurm=SimpleNamespace(
            watcher=SimpleNamespace(last_cycle_s=0.5), spool=SimpleNamespace(spool=names)
        ),
        logs=SimpleNamespace(last_cycle_s=None),  # no cycle yet: not reported
        spools=[SimpleNamespace(spool=SimpleNamespace(names=lambda: ["c.json"]))],
    )
    telemetry.watch(detection)
    got = points(reader)
    assert {p.attributes["watcher"]: p.value for p in got["trainmedic_watcher_cycle_seconds"]} == {
        "slurm": 0.5
    }
    assert {p.attributes["spool"]: p.value for p in got["trainmedic_spool_pending_files"]} == {
        "epilog": 2,
        "signals": 1,
    }
    provider.shutdown()


# --------------------------------------------------------------------------- dashboard


def test_the_dashboard_queries_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert exprs
    queried = {name for expr in exprs for name in re.findall(r"\btrainmedic_[a-z_]+", expr)}
    queried |= set(
        re.findall(
            r"\btrainmedic_[a-z_]+",
            json.dumps(dashboard["templating"]),
        )
    )
    assert queried <= PROMETHEUS_SERIES, queried - PROMETHEUS_SERIES
    # ... and shows every instrument somewhere.
    for spec in INSTRUMENTS:
        assert queried & spec.prometheus_series(), f"no panel shows {spec.name}"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
