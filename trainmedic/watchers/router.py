"""The incident router: every watcher's `SignalSink`; turns signals into incidents.

One failure is usually reported several times (the Slurm poll, the epilog, the log
watcher, the node agent). The router maps each signal to an incident key and does a
signal-with-start on it, so all reports of one failure land in one RecoveryWorkflow:

- job signals -> `incident-<cluster>-<job>-<run+1>` (run: the Slurm restart count of the
  run that failed, from the signal or else from the latest Slurm view). Reports of one
  run within `window` go to the incident opened for it; a signal that carries no run
  goes to the job's open incident. A failure of a *later* run is a new incident, however
  soon it comes (docs/architecture.md "Incident identity": the restart budget counts those);
- `log_match` (a catalog line in a job's own output) opens nothing by itself: real jobs
  print warnings by the hundred while they run fine, so a matched line is evidence for
  an incident of the same run that Slurm, the epilog, a hang or a node agent opened,
  and is otherwise noted. Its progress marker is remembered and handed to the job's
  next incident, so the restart budget can tell progress, and so is `run_started` (where
  a requeued job's new run begins in its log files), so attribution reads only the
  failed run's lines. `node_evidence`, a node agent's finding that leaves the node fit,
  handed to each job on the node (workers/detection.py NodeFanout), waits the same way;
- node-only signals (a node down with no job on it) -> one NodeQuarantineWorkflow per
  node, `node-<cluster>-<node>`;
- `node_drained_by_admin`, `job_requeued`, `job_held`, `job_cancelled`,
  `node_not_responding` are noted (logged, kept in `noted`) and open nothing: an admin's
  drain is respected, a requeue, hold or cancel is the scheduler, the owner or
  trainmedic acting, and not responding precedes DOWN;
- a storm (more than `storm_threshold` distinct nodes failing within `window`) stops
  per-job incidents: signals go to one `incident-<cluster>-storm-<n>` RecoveryWorkflow
  (no job, all the nodes) that escalates, instead of hundreds of uncoordinated ones.

Closed incident + late report of the same run: REJECT_DUPLICATE makes the start fail;
the router logs it and opens nothing (that run's failure was handled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from trainmedic.adapters.slurm.protocol import CommandRunner, SlurmBackend
from trainmedic.adapters.slurm.runner import LocalRunner
from trainmedic.config import Settings
from trainmedic.domain.incident import NODE_EVIDENCE, IncidentInput, IncidentSignal
from trainmedic.errors import DeliveryError
from trainmedic.watchers.base import SignalSink
from trainmedic.watchers.epilog import EpilogSpool, spool_dir
from trainmedic.watchers.slurm import JsonSource, SlurmWatcher
from trainmedic.watchers.spoolfile import spool_policy
from trainmedic.workflows.quarantine import (
    NodeQuarantineWorkflow,
    QuarantineInput,
    quarantine_workflow_id,
)
from trainmedic.workflows.recovery import STORM_SUBJECT, RecoveryWorkflow, incident_workflow_id

logger = logging.getLogger(__name__)

JobRunLookup = Callable[[str], int | None]

NOTED_KINDS = frozenset(
    {"node_drained_by_admin", "job_requeued", "job_held", "job_cancelled", "node_not_responding"}
)
# A line in the job's own output, where a run's output starts, or a node finding that
# leaves the job's node fit: evidence for an incident, never the reason to open one.
EVIDENCE_ONLY_KINDS = frozenset({"log_match", "run_started", NODE_EVIDENCE})
_WAITING_PER_JOB = 8  # evidence-only reports kept per job until its incident opens
# How long a node's finding that left the node fit stays evidence for the failure of a
# job that ran there: past a default NCCL timeout (30 min) and the teardown, a kernel OOM
# kill or an Xid says nothing more of this job (on a shared node it may well have been
# another job's) and must not decide its next failure.
NODE_EVIDENCE_HORIZON = timedelta(minutes=40)
# Signals that say a node itself failed: they count toward a storm.
NODE_FAILURE_KINDS = frozenset({"node_down", "node_failed"})


class StartsWorkflows(Protocol):
    """The slice of `temporalio.client.Client` the router uses (a fake in unit tests)."""

    async def start_workflow(self, workflow: Any, arg: Any = ..., **kwargs: Any) -> Any: ...


@dataclass(slots=True)
class _Open:
    incident_id: str
    run: int
    opened_at: float


@dataclass(slots=True)
class _Storm:
    incident_id: str
    started_at: float
    nodes: set[str]


class IncidentRouter:
    def __init__(
        self,
        client: StartsWorkflows,
        cluster: str,
        task_queue: str,
        *,
        window: timedelta = timedelta(seconds=60),
        storm_threshold: int | None = None,
        node_count: Callable[[], int] | None = None,
        run_lookup: JobRunLookup | None = None,
        quarantine_task_queue: str | None = None,
        quarantine_cooldown: timedelta = timedelta(minutes=10),
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        node_evidence_horizon: timedelta = NODE_EVIDENCE_HORIZON,
    ) -> None:
        self.client = client
        self.cluster = cluster
        self.task_queue = task_queue
        self.window = window.total_seconds()
        self.storm_threshold = storm_threshold
        self.node_count = node_count
        self.run_lookup = run_lookup
        self.quarantine_task_queue = quarantine_task_queue or task_queue
        self.quarantine_cooldown = quarantine_cooldown
        self.clock = clock
        self.wall_clock = wall_clock
        self.node_evidence_horizon = node_evidence_horizon.total_seconds()
        self.open: dict[str, _Open] = {}  # job id -> its latest run's incident (window)
        # job id -> (run, incident) of the latest run that had one, past the window too: a
        # node's finding that arrives late still reaches that run's incident.
        self.opened: dict[str, tuple[int, str]] = {}
        self.progress: dict[str, str] = {}  # job id -> last progress marker reported
        # job id -> (run, where that run's output starts in each log file)
        self.log_from: dict[str, tuple[int | None, dict[str, int]]] = {}
        # job id -> the last evidence-only reports with no incident yet: a failing job's
        # traceback is usually read before Slurm's poll sees it end; its incident gets
        # them when it opens (same run only).
        self.waiting: dict[str, deque[IncidentSignal]] = {}
        # The same for node findings, apart: a job's own log lines, one per watcher cycle
        # while its ranks wait out a collective timeout, must not push out the one kernel
        # line that explains the failure (logs can be read again at attribution; a
        # node's kernel ring cannot).
        self.node_waiting: dict[str, deque[IncidentSignal]] = {}
        self.node_failures: dict[str, float] = {}  # node -> last failure seen
        self.storm: _Storm | None = None
        self.noted: deque[IncidentSignal] = deque(maxlen=1000)
        self.started: list[str] = []  # workflow ids this router started or signalled
        self.rejected: list[str] = []  # closed incidents a late duplicate hit

    # ------------------------------------------------------------------ SignalSink

    async def submit(self, signal: IncidentSignal) -> None:
        """Route one signal. A closed incident's late duplicate is noted here; any
        other failure to reach Temporal raises DeliveryError, so a spool keeps its file."""
        try:
            await self._route(signal)
        except (DeliveryError, asyncio.CancelledError):
            raise
        except Exception as error:
            logger.warning(
                "router: could not deliver %s for %s: %s",
                signal.kind,
                signal.job_id or ",".join(signal.nodes),
                error,
            )
            raise DeliveryError(
                f"could not deliver {signal.kind} for "
                f"{signal.job_id or ','.join(signal.nodes)}: {error}"
            ) from error

    # ------------------------------------------------------------------ routing

    def threshold(self) -> int:
        if self.storm_threshold is not None:
            return self.storm_threshold
        nodes = self.node_count() if self.node_count else 0
        return max(3, math.ceil(0.1 * nodes))

    def _prune(self, now: float) -> None:
        horizon = now - self.window
        for job_id in [j for j, o in self.open.items() if o.opened_at < horizon]:
            del self.open[job_id]
        for node in [n for n, at in self.node_failures.items() if at < horizon]:
            del self.node_failures[node]
        if self.storm is not None and len(self.node_failures) <= self.threshold():
            logger.warning(
                "router: storm %s over (%d nodes failed in the last %.0f s)",
                self.storm.incident_id,
                len(self.node_failures),
                self.window,
            )
            self.storm = None

    def _check_storm(self, now: float) -> None:
        failed = len(self.node_failures)
        if self.storm is None and failed > self.threshold():
            storm_id = incident_workflow_id(self.cluster, STORM_SUBJECT, int(self.wall_clock()))
            self.storm = _Storm(storm_id, now, set(self.node_failures))
            logger.error(
                "router: STORM - %d nodes failed within %.0f s (threshold %d): %s; one "
                "incident %s instead of one per job",
                failed,
                self.window,
                self.threshold(),
                ", ".join(sorted(self.node_failures)[:50]),
                storm_id,
            )
        elif self.storm is not None:
            self.storm.nodes.update(self.node_failures)

    async def _route(self, signal: IncidentSignal) -> None:
        now = self.clock()
        self._prune(now)
        if signal.kind in NODE_FAILURE_KINDS:
            for node in signal.nodes:
                self.node_failures[node] = now
            self._check_storm(now)
        if signal.kind in NOTED_KINDS:
            self.noted.append(signal)
            logger.info(
                "router: noted %s (job %s, nodes %s): %s",
                signal.kind,
                signal.job_id,
                ",".join(signal.nodes),
                signal.detail,
            )
            return
        if signal.job_id:
            await self._route_job(signal, signal.job_id, now)
        elif signal.nodes:
            if self.storm is not None:
                await self._to_storm(signal)
                return
            for node in signal.nodes:
                await self._to_quarantine(signal, node)
        else:
            logger.warning("router: dropped %s signal with neither job nor node", signal.kind)

    async def _route_job(self, signal: IncidentSignal, job_id: str, now: float) -> None:
        if signal.progress:
            self.progress[job_id] = signal.progress
            if len(self.progress) > 20_000:  # bounded: drop the oldest job's marker
                del self.progress[next(iter(self.progress))]
        if signal.log_from and signal.run is not None:
            self.log_from[job_id] = (signal.run, dict(signal.log_from))
            if len(self.log_from) > 20_000:
                del self.log_from[next(iter(self.log_from))]
        current = self.open.get(job_id)
        if current is not None and signal.run in (None, current.run):
            await self._to_incident(signal, current.incident_id, job_id)
            return
        if signal.kind == NODE_EVIDENCE:
            await self._hold_node_evidence(signal, job_id)
            return
        if signal.kind in EVIDENCE_ONLY_KINDS:
            self.noted.append(signal)
            self._keep_waiting(self.waiting, signal, job_id)
            return
        if self.storm is not None:
            await self._to_storm(signal)
            return
        run = signal.run
        if run is None and self.run_lookup is not None:
            run = self.run_lookup(job_id)
        run = run or 0
        incident_id = incident_workflow_id(self.cluster, job_id, run + 1)
        self.open[job_id] = _Open(incident_id, run, now)
        self.opened[job_id] = (run, incident_id)
        if len(self.opened) > 20_000:
            del self.opened[next(iter(self.opened))]
        if signal.progress is None and job_id in self.progress:
            signal = signal.model_copy(update={"progress": self.progress[job_id]})
        known = self.log_from.get(job_id)
        if not signal.log_from and known is not None and known[0] == run:
            signal = signal.model_copy(update={"log_from": known[1]})
        await self._to_incident(signal, incident_id, job_id)
        for earlier in self.waiting.pop(job_id, ()):
            if earlier.run in (None, run):
                await self._to_incident(earlier, incident_id, job_id)
        for finding in self.node_waiting.pop(job_id, ()):
            if finding.run in (None, run) and self._recent(finding):
                await self._to_incident(finding, incident_id, job_id)

    async def _hold_node_evidence(self, signal: IncidentSignal, job_id: str) -> None:
        """A node's finding that left the node fit, for a job on it whose run has no
        incident in its window: to that run's incident if it had one (late, past the
        window; a closed one refuses it), else kept (once: a resend after a delivery
        failure is the same finding) until the run's failure opens one."""
        self.noted.append(signal)
        if not self._recent(signal):
            logger.info("router: noted %s for job %s, too old to count", signal.kind, job_id)
            return
        opened = self.opened.get(job_id)
        if opened is not None and signal.run is not None and opened[0] == signal.run:
            await self._to_incident(signal, opened[1], job_id)
            return
        self._keep_waiting(self.node_waiting, signal, job_id, once=True)

    @staticmethod
    def _keep_waiting(
        store: dict[str, deque[IncidentSignal]],
        signal: IncidentSignal,
        job_id: str,
        *,
        once: bool = False,
    ) -> None:
        """Keep `signal` for the job's next incident: the last few per job, for at most
        20,000 jobs (the oldest job's go first); `once`: not again if already kept."""
        held = store.setdefault(job_id, deque(maxlen=_WAITING_PER_JOB))
        if not (once and signal in held):
            held.append(signal)
        if len(store) > 20_000:
            del store[next(iter(store))]
        logger.info(
            "router: noted %s for job %s (no failure reported for run %s): %s",
            signal.kind,
            job_id,
            signal.run if signal.run is not None else "?",
            signal.detail,
        )

    def _recent(self, signal: IncidentSignal) -> bool:
        """Within the node-evidence horizon (a finding without a time counts as now)."""
        if signal.at is None:
            return True
        return self.wall_clock() - signal.at.timestamp() <= self.node_evidence_horizon

    async def _to_incident(self, signal: IncidentSignal, incident_id: str, job_id: str) -> None:
        await self._signal_with_start(
            incident_id,
            # The start signal delivers `signal` (input.signal would record it twice).
            IncidentInput(cluster=self.cluster, job_id=job_id, nodes=list(signal.nodes)),
            signal,
        )

    async def _to_storm(self, signal: IncidentSignal) -> None:
        storm = self.storm
        if storm is None:
            return
        await self._signal_with_start(
            storm.incident_id,
            IncidentInput(cluster=self.cluster, job_id=None, nodes=sorted(storm.nodes)),
            signal,
        )

    async def _to_quarantine(self, signal: IncidentSignal, node: str) -> None:
        workflow_id = quarantine_workflow_id(self.cluster, node)
        # A finished quarantine may be followed by a new one for the node's next failure.
        await self.client.start_workflow(
            NodeQuarantineWorkflow.run,
            QuarantineInput(cluster=self.cluster, node=node, cooldown=self.quarantine_cooldown),
            id=workflow_id,
            task_queue=self.quarantine_task_queue,
            start_signal="report",
            start_signal_args=[signal],
        )
        self.started.append(workflow_id)
        logger.info("router: %s %s -> %s", signal.kind, node, workflow_id)

    async def _signal_with_start(
        self, incident_id: str, request: IncidentInput, signal: IncidentSignal
    ) -> None:
        try:
            await self.client.start_workflow(
                RecoveryWorkflow.run,
                request,
                id=incident_id,
                task_queue=self.task_queue,
                start_signal="report",
                start_signal_args=[signal],
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            self.rejected.append(incident_id)
            logger.info(
                "router: %s from %s for %s: incident %s already closed; not reopened",
                signal.kind,
                signal.source,
                signal.job_id or ",".join(signal.nodes),
                incident_id,
            )
            return
        self.started.append(incident_id)
        logger.info(
            "router: %s from %s (job %s) -> %s",
            signal.kind,
            signal.source,
            signal.job_id,
            incident_id,
        )


class HeldSignals:
    """A SignalSink for watchers that cannot keep a report themselves (the Slurm poll, the
    log tails, in-process node agents): a signal Temporal did not take is held, in
    order, and delivered when Temporal answers again, instead of being lost.

    Spools do not need this: they keep their file until the router has the report.
    Bounded: past `limit` held signals the oldest are dropped, with an error logged,
    since a controller that cannot reach Temporal for that long has a person on it.
    """

    def __init__(self, sink: SignalSink, *, limit: int = 10_000, retry: float = 2.0) -> None:
        self.sink = sink
        self.limit = limit
        self.retry = retry
        self.held: deque[IncidentSignal] = deque()
        self.dropped = 0

    async def submit(self, signal: IncidentSignal) -> None:
        if self.held:  # behind the ones already waiting: reports keep their order
            self._hold(signal)
            return
        try:
            await self.sink.submit(signal)
        except DeliveryError as error:
            logger.warning("holding signals until Temporal answers again: %s", error)
            self._hold(signal)

    def _hold(self, signal: IncidentSignal) -> None:
        if len(self.held) >= self.limit:
            self.held.popleft()
            self.dropped += 1
            logger.error(
                "%d signals held for Temporal; dropped the oldest (%d dropped so far)",
                self.limit,
                self.dropped,
            )
        self.held.append(signal)

    async def flush(self) -> int:
        """Deliver what is held, oldest first; stops at the first failure. Returns the
        number delivered."""
        delivered = 0
        while self.held:
            try:
                await self.sink.submit(self.held[0])
            except DeliveryError:
                break
            self.held.popleft()
            delivered += 1
        if delivered:
            logger.info("delivered %d held signal(s); %d still held", delivered, len(self.held))
        return delivered

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.held:
                await self.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.retry)


# ----------------------------------------------------------------------------- wiring


@dataclass
class SlurmDetection:
    """The Slurm watcher, the epilog/strigger spool and the router, wired together.

    `held` sits in front of the router for watchers that have no spool of their own, so
    their reports survive a Temporal outage; the spool keeps its files instead."""

    router: IncidentRouter
    watcher: SlurmWatcher
    spool: EpilogSpool
    held: HeldSignals

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(self.watcher.run(stop), self.spool.run(stop), self.held.run(stop))


def build_slurm_detection(
    client: StartsWorkflows,
    settings: Settings,
    backend: SlurmBackend,
    *,
    runner: CommandRunner | None = None,
    interval: float = 2.0,
    window: timedelta = timedelta(seconds=60),
    storm_threshold: int | None = None,
    quarantine_task_queue: str | None = None,
    quarantine_cooldown: timedelta = timedelta(minutes=10),
    spool_folder: Path | None = None,
) -> SlurmDetection:
    """`runner` given: the watcher reads squeue/sinfo JSON itself (the fast path);
    otherwise through `backend`."""
    router = IncidentRouter(
        client,
        settings.cluster,
        settings.temporal_task_queue,
        window=window,
        storm_threshold=storm_threshold,
        quarantine_task_queue=quarantine_task_queue,
        quarantine_cooldown=quarantine_cooldown,
    )
    # With SLURM_ACCESS=pyslurm the watcher polls through the backend (libslurm in this
    # process), not squeue/sinfo JSON: that is the point of choosing it.
    source = (
        JsonSource(runner, timeout=settings.slurm_command_timeout.total_seconds())
        if runner is not None and settings.slurm_access != "pyslurm"
        else None
    )
    held = HeldSignals(router)
    watcher = SlurmWatcher(backend, held, interval, cluster=settings.cluster, source=source)
    router.run_lookup = watcher.job_run
    router.node_count = watcher.node_count
    spool = EpilogSpool(
        spool_folder or spool_dir(settings.state_dir),
        router,
        backend=backend,
        # Written on this host by slurmctld's epilog: the owner check is the guard.
        policy=spool_policy(settings, signed=False),
    )
    return SlurmDetection(router=router, watcher=watcher, spool=spool, held=held)


def local_runner(settings: Settings) -> CommandRunner:
    """The runner of Slurm's commands, pointed at the configured slurm.conf: local
    subprocesses, or in ssh mode this process's one `SshRunner` (the runner under both
    the controller's SlurmBackend and the watcher's JSON fast path, so they share one
    verified connection)."""
    if settings.slurm_access == "ssh":
        from trainmedic.adapters.slurm.ssh import ssh_runner

        return ssh_runner(settings)
    env = {"SLURM_CONF": str(settings.slurm_conf)} if settings.slurm_conf else {}
    return LocalRunner(env=env, bin_dir=settings.slurm_bin_dir)
