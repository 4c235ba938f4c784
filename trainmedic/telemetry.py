"""OpenTelemetry for the controller process: metrics (Prometheus endpoint, OTLP) and traces.

One place sets it up (`setup_telemetry`, from Settings: `metrics_address`,
`otlp_endpoint`); everything else asks the OpenTelemetry API for a meter or tracer and
gets a no-op one where telemetry is off.

    Prometheus   GET http://<metrics_address>/metrics  (the controller; default
                 127.0.0.1:9464, "" = off)
    OTLP/HTTP    <otlp_endpoint>/v1/metrics every 15 s, <otlp_endpoint>/v1/traces
                 ("" = off; OTEL_EXPORTER_OTLP_HEADERS etc. are honoured by the exporter)

Traces: Temporal's TracingInterceptor on every client (`temporal.client.open_client`)
and so on the workers built from it (`workers.controller.build_worker`): a watcher's
signal-with-start, the workflow and each activity form one trace.

Metrics (INSTRUMENTS below; the Grafana dashboard in deploy/grafana/ queries only these):
what an incident yields is recorded by the `record_outcome` activity from its result
(never inside workflow code: a replay would record it again); watcher cycle times and
spool depths are observable gauges read from the watchers at collection time.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from trainmedic.domain.incident import IncidentResult
from trainmedic.domain.telemetry import OutcomeRecord

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from temporalio.contrib.opentelemetry import TracingInterceptor

    from trainmedic.config import Settings

logger = logging.getLogger(__name__)

METER_NAME = "trainmedic"
SERVICE_NAME = "trainmedic-controller"
OTLP_EXPORT_INTERVAL_MS = 15_000

# Seconds, from a watcher's sub-second detection to an approval that waits for hours.
SECONDS_BUCKETS: Sequence[float] = (
    0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600,
)  # fmt: skip

Kind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True)
class InstrumentSpec:
    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[str, ...] = ()

    def prometheus_series(self) -> frozenset[str]:
        """The series names the Prometheus endpoint shows for this instrument."""
        match self.kind:
            case "counter":
                return frozenset({f"{self.name}_total"})
            case "histogram":
                return frozenset(f"{self.name}_{s}" for s in ("bucket", "sum", "count"))
            case "gauge":
                return frozenset({self.name})


DETECTION = InstrumentSpec(
    "trainmedic_detection_seconds",
    "histogram",
    "s",
    "Detection time: the failure's first report to its incident's start.",
    ("cluster", "category"),
)
ACTION = InstrumentSpec(
    "trainmedic_action_seconds",
    "histogram",
    "s",
    "Action latency: the incident's start to its first effect applied.",
    ("cluster", "category", "action"),
)
RUNNING_AGAIN = InstrumentSpec(
    "trainmedic_time_to_running_seconds",
    "histogram",
    "s",
    "Time to running again: the failure's first report to the job seen running again.",
    ("cluster", "category"),
)
INCIDENTS = InstrumentSpec(
    "trainmedic_incidents",
    "counter",
    "{incident}",
    "Incidents finished, by category and outcome.",
    ("cluster", "category", "outcome", "mode"),
)
EFFECTS = InstrumentSpec(
    "trainmedic_effects",
    "counter",
    "{effect}",
    "Effects planned by incidents, by kind and final status.",
    ("cluster", "kind", "status"),
)
APPROVAL_WAIT = InstrumentSpec(
    "trainmedic_approval_wait_seconds",
    "histogram",
    "s",
    "How long an effect waited for an operator's decision (or the timeout).",
    ("cluster", "kind", "decision"),
)
BREAKER_TRIPS = InstrumentSpec(
    "trainmedic_breaker_trips",
    "counter",
    "{trip}",
    "Safety-rail breaker trips (the cluster fell back to monitor mode).",
    ("cluster",),
)
WATCHER_CYCLE = InstrumentSpec(
    "trainmedic_watcher_cycle_seconds",
    "gauge",
    "s",
    "Duration of the watcher's last cycle (slurm: read + diff; logs: one pass).",
    ("watcher",),
)
SPOOL_PENDING = InstrumentSpec(
    "trainmedic_spool_pending_files",
    "gauge",
    "{file}",
    "Files waiting in a spool (epilog/strigger reports, node-agent signals).",
    ("spool",),
)

INSTRUMENTS: tuple[InstrumentSpec, ...] = (
    DETECTION,
    ACTION,
    RUNNING_AGAIN,
    INCIDENTS,
    EFFECTS,
    APPROVAL_WAIT,
    BREAKER_TRIPS,
    WATCHER_CYCLE,
    SPOOL_PENDING,
)
INSTRUMENT_NAMES = frozenset(spec.name for spec in INSTRUMENTS)
PROMETHEUS_SERIES = frozenset(name for spec in INSTRUMENTS for name in spec.prometheus_series())


# ----------------------------------------------------------------------------- outcomes


def approval_waits(result: IncidentResult) -> list[tuple[str, str, float]]:
    """(effect kind, decision, seconds) for each effect that waited for an operator."""
    waits: list[tuple[str, str, float]] = []
    for effect in result.effects:
        if effect.awaiting_since is None:
            continue
        decision = next((d for d in result.decisions if effect.id in d.effect_ids), None)
        if decision is None or decision.at is None:
            continue
        if decision.via == "timeout":
            verdict = "timeout"
        else:
            verdict = "approved" if decision.approve else "rejected"
        seconds = max(0.0, (decision.at - effect.awaiting_since).total_seconds())
        waits.append((effect.kind.value, verdict, seconds))
    return waits


class OutcomeInstruments:
    """The counters and histograms an incident's result feeds, on one meter."""

    # Incidents recorded lately: a retried activity must not count one twice.
    REMEMBER = 10_000

    def __init__(self, meter: Meter) -> None:
        def histogram(spec: InstrumentSpec) -> metrics.Histogram:
            return meter.create_histogram(
                spec.name,
                unit=spec.unit,
                description=spec.description,
                explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
            )

        def counter(spec: InstrumentSpec) -> metrics.Counter:
            return meter.create_counter(spec.name, unit=spec.unit, description=spec.description)

        self.detection = histogram(DETECTION)
        self.action = histogram(ACTION)
        self.running_again = histogram(RUNNING_AGAIN)
        self.approval_wait = histogram(APPROVAL_WAIT)
        self.incidents = counter(INCIDENTS)
        self.effects = counter(EFFECTS)
        self.breaker_trips = counter(BREAKER_TRIPS)
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, record: OutcomeRecord) -> list[str] | None:
        """Record one finished incident; the instruments touched, or None when this
        incident was recorded already."""
        result = record.result
        with self._lock:
            if result.incident_id in self._seen:
                return None
            self._seen[result.incident_id] = None
            while len(self._seen) > self.REMEMBER:
                self._seen.popitem(last=False)
        diagnosis = result.diagnosis
        category = diagnosis.category.value if diagnosis else "unknown"
        action = diagnosis.action.value if diagnosis else "unknown"
        cluster = {"cluster": record.cluster}
        touched = [INCIDENTS.name]
        self.incidents.add(
            1,
            {
                **cluster,
                "category": category,
                "outcome": result.outcome.value,
                "mode": record.mode.value,
            },
        )
        times = result.times
        timed: list[tuple[metrics.Histogram, InstrumentSpec, float | None, dict[str, str]]] = [
            (self.detection, DETECTION, times.detect_s(), {"category": category}),
            (self.action, ACTION, times.act_s(), {"category": category, "action": action}),
            (
                self.running_again,
                RUNNING_AGAIN,
                # The failure to running again (the time the job was down), only for a
                # job seen running again: an incident without a restart has no such time.
                times.down_s() if times.running_again_at else None,
                {"category": category},
            ),
        ]
        for histogram, spec, seconds, labels in timed:
            if seconds is not None:
                histogram.record(seconds, {**cluster, **labels})
                touched.append(spec.name)
        for effect in result.effects:
            self.effects.add(
                1, {**cluster, "kind": effect.kind.value, "status": effect.status.value}
            )
        if result.effects:
            touched.append(EFFECTS.name)
        for kind, decision, seconds in approval_waits(result):
            self.approval_wait.record(seconds, {**cluster, "kind": kind, "decision": decision})
            if APPROVAL_WAIT.name not in touched:
                touched.append(APPROVAL_WAIT.name)
        if record.breaker_tripped:
            self.breaker_trips.add(1, cluster)
            touched.append(BREAKER_TRIPS.name)
        return touched


# ------------------------------------------------------------------------------- gauges


@dataclass
class DetectionGauges:
    """Watcher cycle times and spool depths, read when the metrics are collected (a
    Prometheus scrape or an OTLP export), from the watchers' own figures."""

    cycle_s: dict[str, Callable[[], float | None]] = field(default_factory=dict)
    pending: dict[str, Callable[[], int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, meter: Meter) -> None:
        meter.create_observable_gauge(
            WATCHER_CYCLE.name,
            callbacks=[self._cycles],
            unit=WATCHER_CYCLE.unit,
            description=WATCHER_CYCLE.description,
        )
        meter.create_observable_gauge(
            SPOOL_PENDING.name,
            callbacks=[self._pending],
            unit=SPOOL_PENDING.unit,
            description=SPOOL_PENDING.description,
        )

    def watch(
        self,
        cycle_s: dict[str, Callable[[], float | None]] | None = None,
        pending: dict[str, Callable[[], int]] | None = None,
    ) -> None:
        with self._lock:
            self.cycle_s.update(cycle_s or {})
            self.pending.update(pending or {})

    def _cycles(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            readers = list(self.cycle_s.items())
        out = []
        for watcher, read in readers:
            value = read()
            if value is not None:
                out.append(Observation(value, {"watcher": watcher}))
        return out

    def _pending(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            readers = list(self.pending.items())
        out = []
        for spool, count in readers:
            try:
                out.append(Observation(count(), {"spool": spool}))
            except OSError as error:  # a scrape must not fail over one unreadable folder
                logger.debug("spool %s not counted: %s", spool, error)
        return out


def detection_sources(
    detection: Any,
) -> tuple[dict[str, Callable[[], float | None]], dict[str, Callable[[], int]]]:
    """The readers of a `workers.detection.Detection`: its Slurm and log watchers'
    last cycle times, its epilog spool's and node-agent signal spools' files."""
    slurm = detection.slurm
    logs = detection.logs
    spools = list(detection.spools)
    cycles: dict[str, Callable[[], float | None]] = {
        "slurm": lambda: slurm.watcher.last_cycle_s,
        "logs": lambda: logs.last_cycle_s,
    }
    pending: dict[str, Callable[[], int]] = {
        "epilog": lambda: len(slurm.spool.spool.names()),
        "signals": lambda: sum(len(s.spool.names()) for s in spools),
    }
    return cycles, pending


# -------------------------------------------------------------------------------- setup


def tracing_interceptor() -> TracingInterceptor:
    """Temporal's OpenTelemetry interceptor (client, workflows, activities), on the
    global tracer: a no-op until a TracerProvider is set."""
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return TracingInterceptor()


def is_tracing(interceptor: object) -> bool:
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return isinstance(interceptor, TracingInterceptor)


@dataclass
class Telemetry:
    """What `setup_telemetry` built. Off (no providers) when the settings say so."""

    meter_provider: MeterProvider | None = None
    tracer_provider: TracerProvider | None = None
    metrics_address: str | None = None  # host:port actually bound
    _server: Any = None
    _gauges: DetectionGauges | None = None

    @property
    def metrics_url(self) -> str | None:
        return f"http://{self.metrics_address}/metrics" if self.metrics_address else None

    def meter(self) -> Meter:
        provider = self.meter_provider
        return (provider or metrics.get_meter_provider()).get_meter(METER_NAME)

    def watch(self, detection: Any) -> None:
        """Report `detection`'s watcher cycle times and spool depths (gauges)."""
        if self.meter_provider is None:
            return
        if self._gauges is None:
            self._gauges = DetectionGauges()
            self._gauges.register(self.meter())
        self._gauges.watch(*detection_sources(detection))

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.meter_provider is not None:
            self.meter_provider.shutdown()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()


_process: list[Telemetry] = []
_process_lock = threading.Lock()


def _serve_prometheus(address: str, reader_registry: Any) -> tuple[Any, str]:
    from prometheus_client import start_http_server

    host, _, port = address.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=reader_registry)
    bound = server.server_address
    return server, f"{host}:{bound[1]}"


def setup_telemetry(
    settings: Settings,
    *,
    install_global: bool = True,
    metric_readers: Sequence[MetricReader] = (),
    span_exporters: Sequence[SpanExporter] = (),
) -> Telemetry:
    """Metrics and traces for this process, as the settings say.

    `install_global`: make the providers the process's OpenTelemetry providers (what the
    TracingInterceptor and the record_outcome activity use); done once per process, a
    second call returns the first one's Telemetry. Tests and benchmarks pass False and
    use the providers they get back. `metric_readers`/`span_exporters` add to the
    configured ones (tests, benchmarks).

    A metrics port already taken is logged, not fatal: telemetry never stops recovery.
    """
    if install_global:
        with _process_lock:
            if _process:
                return _process[0]
            telemetry = _build(settings, metric_readers, span_exporters)
            if telemetry.meter_provider is not None:
                metrics.set_meter_provider(telemetry.meter_provider)
            if telemetry.tracer_provider is not None:
                trace.set_tracer_provider(telemetry.tracer_provider)
            _process.append(telemetry)
            return telemetry
    return _build(settings, metric_readers, span_exporters)


def _build(
    settings: Settings,
    extra_readers: Sequence[MetricReader],
    span_exporters: Sequence[SpanExporter],
) -> Telemetry:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create(
        {
            "service.name": SERVICE_NAME,
            "service.instance.id": f"{os.uname().nodename}:{os.getpid()}",
            "trainmedic.cluster": settings.cluster,
        }
    )
    telemetry = Telemetry()
    readers: list[MetricReader] = list(extra_readers)
    if settings.metrics_address:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry

        # Its own registry: nothing but these metrics (and no second reader's) on it.
        registry = CollectorRegistry(auto_describe=True)
        try:
            server, bound = _serve_prometheus(settings.metrics_address, registry)
        except OSError as error:
            logger.error(
                "metrics endpoint not started on %s (TRAINMEDIC_METRICS_ADDRESS): %s",
                settings.metrics_address,
                error,
            )
        else:
            readers.append(PrometheusMetricReader(registry=registry))
            telemetry._server = server
            telemetry.metrics_address = bound
            logger.info("metrics on http://%s/metrics", bound)
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(
            PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=f"{settings.otlp_endpoint}/v1/metrics"),
                export_interval_millis=OTLP_EXPORT_INTERVAL_MS,
            )
        )
    if readers:
        telemetry.meter_provider = MeterProvider(metric_readers=readers, resource=resource)
    exporters: list[SpanExporter] = list(span_exporters)
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporters.append(OTLPSpanExporter(endpoint=f"{settings.otlp_endpoint}/v1/traces"))
        logger.info("metrics and traces to %s (OTLP/HTTP)", settings.otlp_endpoint)
    if exporters:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        telemetry.tracer_provider = TracerProvider(resource=resource)
        for exporter in exporters:
            # Batched, off the event loop: a slow collector never holds an activity up.
            telemetry.tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    return telemetry


def process_telemetry() -> Telemetry | None:
    """The Telemetry `setup_telemetry` installed in this process, if any."""
    return _process[0] if _process else None
