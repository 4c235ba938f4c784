"""The Slurm watcher: poll jobs and nodes, diff against the last view, emit signals.

Every `interval` seconds it reads all jobs and nodes through a `ViewSource` (the Slurm
adapter's read model, `trainmedic.adapters.slurm.view`: `JsonSource` runs `squeue
--json` / `sinfo --json` on the lean path, `BackendSource` uses any `SlurmBackend`),
compares them with the previous view and submits one `IncidentSignal` per change that
matters (the kinds are the contract in notes/DESIGN: `job_failed`, `job_node_fail`,
`job_oom`, `job_timeout`, `job_preempted`, `job_requeued`, `job_held`, `job_cancelled`,
`node_down`, `node_not_responding`, `node_failed`, `node_drained_by_admin`). What a
state means is the adapter's and the domain's business; this module only diffs.

The loop never dies of Slurm: a failed read is logged, the previous view is kept and
the next try waits longer (doubling up to `max_backoff`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

from trainmedic.adapters.slurm.errors import NoSuchJob, SlurmError
from trainmedic.adapters.slurm.protocol import SlurmBackend
from trainmedic.adapters.slurm.view import (
    BackendSource,
    JobView,
    JsonSource,
    NodeView,
    SlurmView,
    ViewSource,
    lean_job,
    lean_node,
    parse_sinfo_lean,
    parse_squeue_lean,
)
from trainmedic.domain.diagnosis import Evidence
from trainmedic.domain.enums import EvidenceSource
from trainmedic.domain.incident import IncidentSignal
from trainmedic.watchers.base import SignalSink

__all__ = [  # the read model is re-exported for the watcher's users
    "CANCELLED_KIND",
    "FAILED_JOB_KINDS",
    "BackendSource",
    "JobView",
    "JsonSource",
    "NodeView",
    "SlurmView",
    "SlurmWatcher",
    "ViewSource",
    "diff_jobs",
    "diff_nodes",
    "diff_views",
    "end_kind",
    "lean_job",
    "lean_node",
    "parse_sinfo_lean",
    "parse_squeue_lean",
]

logger = logging.getLogger(__name__)

# A job that ends in one of these states failed; the kind names the way it failed.
FAILED_JOB_KINDS: dict[str, str] = {
    "FAILED": "job_failed",
    "NODE_FAIL": "job_node_fail",
    "BOOT_FAIL": "job_node_fail",
    "OUT_OF_MEMORY": "job_oom",
    "TIMEOUT": "job_timeout",
    "DEADLINE": "job_timeout",
    "PREEMPTED": "job_preempted",
}
# A job that ends CANCELLED was cancelled on purpose: by its owner, an admin, or trainmedic
# itself (a `stop`). That is no failure, and it is reported as a note (the router opens
# nothing for it). Slurm gives the failures that end a job early their own states
# (NODE_FAIL, PREEMPTED, TIMEOUT, above), so those never arrive as CANCELLED; should a
# CANCELLED job carry a reason that names a failure, it is reported as that failure.
CANCELLED_KIND = "job_cancelled"
CANCELLED_FAILURE_REASONS: dict[str, str] = {
    "NodeDown": "job_node_fail",
    "JobLaunchFailure": "job_node_fail",
    "Prolog": "job_node_fail",
    "SystemFailure": "job_failed",
    "TimeLimit": "job_timeout",
    "OutOfMemory": "job_oom",
}


# ----------------------------------------------------------------------------- diff


def _now() -> datetime:
    return datetime.now(UTC)


def _job_signal(
    kind: str, job: JobView, detail: str, run: int | None, at: datetime
) -> IncidentSignal:
    return IncidentSignal(
        source="slurm",
        kind=kind,
        job_id=job.job_id,
        nodes=job.node_names(),
        at=at,
        detail=detail,
        evidence=[Evidence(source=EvidenceSource.SLURM, text=job.render())],
        run=run,
    )


def _node_signal(
    kind: str, node: NodeView, detail: str, at: datetime, job: JobView | None = None
) -> IncidentSignal:
    return IncidentSignal(
        source="slurm",
        kind=kind,
        job_id=job.job_id if job else None,
        nodes=[node.name],
        at=at,
        detail=detail,
        evidence=[Evidence(source=EvidenceSource.SLURM, text=node.render(), node=node.name)],
        run=job.restarts if job else None,
    )


def end_kind(job: JobView) -> str | None:
    """The signal kind for a job that ended in `job.state`: a failure's, `job_cancelled`
    for a cancel on purpose, or None (completed, or not ended)."""
    if job.state == "CANCELLED":
        return CANCELLED_FAILURE_REASONS.get(job.reason or "", CANCELLED_KIND)
    return FAILED_JOB_KINDS.get(job.state)


def _cancelled(
    job: JobView, before: JobView | None, detail: str, at: datetime
) -> IncidentSignal | None:
    """The note for a cancelled job that ran; a pending job cancelled is nobody's news."""
    if not job.nodes and before is not None and before.active:
        job = replace(job, nodes=before.nodes)  # the record may no longer name its nodes
    if not job.nodes:
        return None
    return _job_signal(
        CANCELLED_KIND,
        job,
        f"{detail}: by its owner, an admin or trainmedic; noted, not a failure",
        job.restarts,
        at,
    )


def diff_jobs(
    prev: Mapping[str, JobView], cur: Mapping[str, JobView], at: datetime
) -> tuple[list[IncidentSignal], list[JobView]]:
    """Signals for job changes, and the jobs that left squeue while active (the caller
    asks Slurm about those once)."""
    signals: list[IncidentSignal] = []
    for job_id, job in cur.items():
        before = prev.get(job_id)
        if before is not None and before.state == job.state and before.restarts == job.restarts:
            if job.held and not before.held:
                signals.append(
                    _job_signal("job_held", job, f"held: {job.reason}", job.restarts, at)
                )
            continue  # the common case: nothing changed
        kind = end_kind(job)
        if kind == CANCELLED_KIND and (before is None or before.state != job.state):
            was = "ended" if before is None else f"{before.state} ->"
            note = _cancelled(job, before, f"job {job_id} {was} CANCELLED", at)
            if note is not None:
                signals.append(note)
        elif kind is not None and (before is None or before.state != job.state):
            signals.append(
                _job_signal(
                    kind,
                    job,
                    f"job {job_id} {'ended' if before is None else before.state + ' ->'} "
                    f"{job.state} ({job.reason or 'no reason'})",
                    job.restarts,
                    at,
                )
            )
        if before is None:
            continue
        if job.restarts > before.restarts:
            signals.append(
                _job_signal(
                    "job_requeued",
                    job,
                    f"job {job_id} requeued: restart count {before.restarts} -> {job.restarts}"
                    f" ({job.reason or 'no reason'})",
                    before.restarts,
                    at,
                )
            )
        if job.held and not before.held:
            signals.append(_job_signal("job_held", job, f"held: {job.reason}", before.restarts, at))
    vanished = [job for job_id, job in prev.items() if job.active and job_id not in cur]
    return signals, vanished


def diff_nodes(prev: SlurmView, cur: Mapping[str, NodeView], at: datetime) -> list[IncidentSignal]:
    signals: list[IncidentSignal] = []
    went_down: list[NodeView] = []
    for name, node in cur.items():
        before = prev.nodes.get(name)
        if before is None or before == node:
            continue
        if node.marked_down and not before.marked_down:
            if node.is_ours:
                continue  # we set it down ourselves
            went_down.append(node)
        elif node.is_failing and not before.is_failing and not node.is_ours:
            signals.append(_node_signal("node_failed", node, f"{name} set FAIL: {node.reason}", at))
        elif node.not_responding and not before.not_responding:
            signals.append(_node_signal("node_not_responding", node, f"{name} not responding", at))
        if node.drain_flag and not before.drain_flag and not node.is_ours:
            by = f" by {node.reason_user}" if node.reason_user else ""
            signals.append(
                _node_signal(
                    "node_drained_by_admin",
                    node,
                    f"{name} drained{by}: {node.reason or 'no reason'} (respected, not fought)",
                    at,
                )
            )
    if went_down:
        holders = prev.jobs_on(n.name for n in went_down)
        for node in went_down:
            detail = f"{node.name} DOWN: {node.reason or 'no reason'}"
            for job in holders.get(node.name, []):
                signals.append(_node_signal("node_down", node, detail, at, job))
            signals.append(_node_signal("node_down", node, detail, at))
    return signals


def diff_views(prev: SlurmView, cur: SlurmView, at: datetime | None = None) -> list[IncidentSignal]:
    """Every signal between two views, except for jobs that vanished (see SlurmWatcher)."""
    at = at or _now()
    signals, _ = diff_jobs(prev.jobs, cur.jobs, at)
    signals.extend(diff_nodes(prev, cur.nodes, at))
    return signals


# ----------------------------------------------------------------------------- watcher


class SlurmWatcher:
    """Polls Slurm and submits signals into `sink`. Also answers `job_run(job_id)` (the
    restart count in the latest view) for the incident router."""

    def __init__(
        self,
        backend: SlurmBackend,
        sink: SignalSink,
        interval: float = 2.0,
        *,
        cluster: str,
        source: ViewSource | None = None,
        max_backoff: float = 60.0,
        # A job that left squeue while RUNNING is looked up once; beyond this age of the
        # previous view (Slurm unreachable for long), it may simply have completed and
        # been purged after MinJobAge (default 300 s): log it, do not open incidents.
        stale_after: float = 240.0,
        max_lookups: int = 50,
    ) -> None:
        self.backend = backend
        self.sink = sink
        self.interval = interval
        self.cluster = cluster
        self.source: ViewSource = source or BackendSource(backend)
        self.max_backoff = max_backoff
        self.stale_after = stale_after
        self.max_lookups = max_lookups
        self.view: SlurmView | None = None
        self.cycles = 0
        self.failures = 0  # consecutive failed reads
        self.last_cycle_s: float | None = None
        # A controller that takes detection over from another (the lease) reports, in
        # its first view, the failed jobs Slurm still lists: some may have ended while
        # nobody watched. Those already handled map to closed incidents and open nothing.
        self.catch_up_ended = False

    # -- lookups for the router --------------------------------------------------

    def job_run(self, job_id: str) -> int | None:
        job = self.view.jobs.get(job_id) if self.view else None
        return job.restarts if job else None

    def node_count(self) -> int:
        return len(self.view.nodes) if self.view else 0

    # -- one cycle ---------------------------------------------------------------

    async def poll_once(self) -> list[IncidentSignal]:
        """Read, diff, submit. Raises SlurmError when the read fails (view kept)."""
        started = time.perf_counter()
        cur = await self.source.read()
        prev, self.view = self.view, cur
        self.cycles += 1
        if prev is None:
            self.last_cycle_s = time.perf_counter() - started
            logger.info(
                "slurm watcher: first view, %d jobs, %d nodes", len(cur.jobs), len(cur.nodes)
            )
            if not self.catch_up_ended:
                return []
            ended, _ = diff_jobs({}, cur.jobs, _now())
            caught = [s for s in ended if s.kind != CANCELLED_KIND]
            if caught:
                logger.info(
                    "slurm watcher: taking over, %d failed job(s) still listed: %s",
                    len(caught),
                    ", ".join(sorted({s.job_id or "?" for s in caught})[:20]),
                )
            for signal in caught:
                await self._submit(signal)
            return caught
        at = _now()
        signals, vanished = diff_jobs(prev.jobs, cur.jobs, at)
        signals.extend(diff_nodes(prev, cur.nodes, at))
        self.last_cycle_s = time.perf_counter() - started
        if vanished:
            signals.extend(await self._vanished(vanished, cur.read_at - prev.read_at, at))
        for signal in signals:
            await self._submit(signal)
        return signals

    async def _vanished(
        self, jobs: list[JobView], gap: float, at: datetime
    ) -> list[IncidentSignal]:
        if gap > self.stale_after:
            logger.warning(
                "%d jobs left squeue during a %.0f s gap in our view; their ends are unknown "
                "(maybe completed and purged): %s",
                len(jobs),
                gap,
                ", ".join(j.job_id for j in jobs[:20]),
            )
            return []
        signals: list[IncidentSignal] = []
        for index, job in enumerate(jobs):
            if index >= self.max_lookups:
                logger.warning("%d more vanished jobs not looked up", len(jobs) - index)
                break
            try:
                final = JobView.from_job(await self.backend.get_job(job.job_id))
            except NoSuchJob:
                final = None
            except SlurmError as error:
                logger.warning("job %s left squeue; lookup failed: %s", job.job_id, error)
                final = None
            if final is not None:
                kind = end_kind(final)
                if kind == CANCELLED_KIND:
                    detail = (
                        f"job {job.job_id} {job.state} -> CANCELLED (seen after it left squeue)"
                    )
                    note = _cancelled(final, job, detail, at)
                    if note is not None:
                        signals.append(note)
                elif kind is not None:
                    signals.append(
                        _job_signal(
                            kind,
                            final if final.nodes else job,
                            f"job {job.job_id} {job.state} -> {final.state} (seen after it "
                            "left squeue)",
                            final.restarts,
                            at,
                        )
                    )
                continue
            signals.append(
                _job_signal(
                    "job_failed",
                    job,
                    f"job {job.job_id} left Slurm's view while {job.state}; final state unknown",
                    job.restarts,
                    at,
                )
            )
        return signals

    async def _submit(self, signal: IncidentSignal) -> None:
        try:
            await self.sink.submit(signal)
        except Exception:  # a sink bug must not stop detection
            logger.exception("signal sink failed on %s for %s", signal.kind, signal.job_id)

    # -- the loop ----------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        logger.info("slurm watcher for %s every %.1f s", self.cluster, self.interval)
        while not stop.is_set():
            delay = self.interval
            try:
                await self.poll_once()
                if self.failures:
                    logger.info("slurm answers again after %d failed reads", self.failures)
                self.failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as error:  # never crash the loop; keep the last view
                self.failures += 1
                delay = min(self.max_backoff, self.interval * 2 ** min(self.failures, 10))
                log = logger.warning if isinstance(error, SlurmError) else logger.exception
                log(
                    "slurm read failed (%d in a row), next try in %.0f s: %s",
                    self.failures,
                    delay,
                    error,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
