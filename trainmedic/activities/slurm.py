"""Recovery activities that read and change Slurm, through a `SlurmBackend`."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Protocol, runtime_checkable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trainmedic.activities.errors import slurm_call
from trainmedic.adapters.slurm.errors import NoSuchJob, NoSuchNode, SlurmError
from trainmedic.adapters.slurm.protocol import SlurmBackend
from trainmedic.domain.activity_io import (
    ApplyEffectRequest,
    ConsistencyReport,
    ConsistencyRequest,
    EffectOutcome,
    Gathered,
    GatherRequest,
    VerifyRequest,
    VerifyResult,
)
from trainmedic.domain.enums import Category
from trainmedic.domain.incident import EffectKind, EffectStatus, PlannedEffect
from trainmedic.domain.slurm import EffectResult, SlurmJob, SlurmNode, is_ours, parse_our_reason


class SlurmActivities:
    def __init__(self, backend: SlurmBackend) -> None:
        self._slurm = backend

    # -- detect -----------------------------------------------------------------------

    @activity.defn(name="gather_evidence")
    async def gather_evidence(self, request: GatherRequest) -> Gathered:
        """The job, its nodes and the reported nodes, partition sizes, log paths."""
        problems: list[str] = []
        job: SlurmJob | None = None
        if request.job_id:
            try:
                job = await slurm_call(self._slurm.get_job(request.job_id))
            except Exception as error:  # an unknown job is evidence too, not a crash
                if not _is_missing(error):
                    raise
                problems.append(f"job {request.job_id} is unknown to Slurm")
        all_nodes = await slurm_call(self._slurm.list_nodes())
        by_name = {node.name: node for node in all_nodes}
        wanted = [*(job.nodes if job else []), *request.nodes]
        nodes: list[SlurmNode] = []
        for name in dict.fromkeys(wanted):
            if name in by_name:
                nodes.append(by_name[name])
            else:
                problems.append(f"node {name} is unknown to Slurm")
        sizes: Counter[str] = Counter()
        for node in all_nodes:
            for partition in node.partitions:
                sizes[partition] += 1
        logs = [p for p in (job.stdout_path, job.stderr_path) if p] if job else []
        return Gathered(
            job=job,
            nodes=nodes,
            partition_sizes=dict(sizes),
            log_paths=list(dict.fromkeys(logs)),
            problems=problems,
        )

    # -- isolate / act ---------------------------------------------------------------

    @activity.defn(name="apply_effect")
    async def apply_effect(self, request: ApplyEffectRequest) -> EffectOutcome:
        """Re-read the world, then do the effect only if it is still needed and still ours
        to do. Safe to retry: a second attempt finds the first one's result."""
        effect = request.effect
        activity.logger.info("%s: applying %s", request.incident_id, effect.describe())
        match effect.kind:
            case EffectKind.DRAIN_NODE:
                return await self._drain(effect)
            case EffectKind.REQUEUE_JOB | EffectKind.REQUEUE_EXCLUDING:
                return await self._requeue(request.incident_id, effect)
            case EffectKind.CANCEL_JOB:
                return await self._cancel(effect)

    async def _drain(self, effect: PlannedEffect) -> EffectOutcome:
        node = await slurm_call(self._slurm.get_node(_target(effect.node, effect)))
        if node.drain_flag and not is_ours(node.reason):
            return EffectOutcome(
                status=EffectStatus.SKIPPED,
                note=(
                    f"{node.name} was drained by someone else (reason: {node.reason!r}); "
                    "left as it is, and kept out of the job"
                ),
            )
        if (
            _isolates_dead_node(effect)
            and not node.is_down
            and isinstance(self._slurm, MarksNodesDown)
        ):
            # A dead node cannot drain: its jobs would stay COMPLETING until Slurm's
            # SlurmdTimeout (minutes). DOWN is Slurm's own verdict, given now.
            result = await slurm_call(self._slurm.down_node(node.name, effect.reason))
            status = EffectStatus.APPLIED if result.changed else EffectStatus.ALREADY_TRUE
            return EffectOutcome(status=status, note=result.detail, results=[result])
        if node.drain_flag:
            return EffectOutcome(
                status=EffectStatus.ALREADY_TRUE,
                note=f"{node.name} already drained by trainmedic ({node.reason})",
            )
        result = await slurm_call(self._slurm.drain_node(node.name, effect.reason))
        status = EffectStatus.APPLIED if result.changed else EffectStatus.ALREADY_TRUE
        return EffectOutcome(status=status, note=result.detail, results=[result])

    async def _annotate(self, job: SlurmJob, incident_id: str, reason: str) -> list[EffectResult]:
        """Say in the job's comment why trainmedic touched it (best effort).

        A job's comment is the user's too: ours goes only over nothing or over ours.
        Slurm refuses comments on a finished job, so callers try again after a requeue.
        """
        if job.comment and not is_ours(job.comment):
            return []
        if incident_id in job.comment:
            return []
        try:
            return [await slurm_call(self._slurm.set_comment(job.job_id, reason))]
        except Exception as error:  # the comment is a courtesy; never fail the effect on it
            activity.logger.debug("job %s not annotated yet: %s", job.job_id, error)
            return []

    async def _requeue(self, incident_id: str, effect: PlannedEffect) -> EffectOutcome:
        job = await slurm_call(self._slurm.get_job(_target(effect.job_id, effect)))
        excluded = set(effect.exclude)
        if effect.seen_restarts is not None and job.restarts > effect.seen_restarts:
            on_bad = excluded & set(job.nodes)
            if not on_bad:
                return EffectOutcome(
                    status=EffectStatus.ALREADY_TRUE,
                    note=(
                        f"job {job.job_id} was already restarted (restart count "
                        f"{effect.seen_restarts} -> {job.restarts}); now {job.state} "
                        f"on {','.join(job.nodes) or 'no nodes yet'}"
                    ),
                )
        if job.is_running and excluded and not (excluded & set(job.nodes)):
            return EffectOutcome(
                status=EffectStatus.ALREADY_TRUE,
                note=f"job {job.job_id} already runs away from {','.join(sorted(excluded))}",
            )
        # Annotated first where Slurm allows it (a held job left by a crash then names
        # us), else right after the requeue, when the job is pending again.
        results = await self._annotate(job, incident_id, effect.reason)
        annotated = bool(results)
        if effect.kind is EffectKind.REQUEUE_EXCLUDING:
            results += await slurm_call(self._slurm.requeue_excluding(job.job_id, effect.exclude))
        else:
            results.append(await slurm_call(self._slurm.requeue(job.job_id)))
        if not annotated:
            requeued = await slurm_call(self._slurm.get_job(job.job_id))
            results += await self._annotate(requeued, incident_id, effect.reason)
        changed = any(r.changed for r in results)
        return EffectOutcome(
            status=EffectStatus.APPLIED if changed else EffectStatus.ALREADY_TRUE,
            note="; ".join(r.detail for r in results),
            results=results,
        )

    async def _cancel(self, effect: PlannedEffect) -> EffectOutcome:
        job = await slurm_call(self._slurm.get_job(_target(effect.job_id, effect)))
        results = await self._annotate(job, effect.reason.split(":")[0], effect.reason)
        result = await slurm_call(self._slurm.cancel(job.job_id))
        results.append(result)
        return EffectOutcome(
            status=EffectStatus.APPLIED if result.changed else EffectStatus.ALREADY_TRUE,
            note=result.detail,
            results=results,
        )

    # -- verify ---------------------------------------------------------------------

    @activity.defn(name="verify_job")
    async def verify_job(self, request: VerifyRequest) -> VerifyResult:
        """Wait until the job runs on nodes other than the culprits (heartbeating)."""
        deadline = time.monotonic() + request.timeout_s
        avoid = set(request.avoid_nodes)
        job = await slurm_call(self._slurm.get_job(request.job_id))
        while True:
            activity.heartbeat(job.state)
            if job.is_running and not (avoid & set(job.nodes)):
                return VerifyResult(running=True, state=job.state, nodes=job.nodes)
            if job.is_finished:
                return VerifyResult(
                    running=False,
                    state=job.state,
                    nodes=job.nodes,
                    detail=f"job ended again ({job.state}, {job.state_reason})",
                )
            if time.monotonic() >= deadline:
                return VerifyResult(
                    running=False,
                    state=job.state,
                    nodes=job.nodes,
                    detail=f"still {job.state} ({job.state_reason})",
                )
            await asyncio.sleep(request.poll_s)
            job = await slurm_call(self._slurm.get_job(request.job_id))

    # -- cancellation ---------------------------------------------------------------

    @activity.defn(name="check_consistency")
    async def check_consistency(self, request: ConsistencyRequest) -> ConsistencyReport:
        """After a cancel: release a job our requeue left held, and describe the state."""
        parts: list[str] = []
        results: list[EffectResult] = []
        if request.job_id:
            try:
                job = await slurm_call(self._slurm.get_job(request.job_id))
            except Exception as error:
                if not _is_missing(error):
                    raise
                parts.append(f"job {request.job_id} unknown to Slurm")
            else:
                if job.is_held and request.incident_id in job.comment:
                    result = await slurm_call(self._slurm.release(job.job_id))
                    results.append(result)
                    parts.append(f"job {job.job_id} was held by this incident: released")
                    job = await slurm_call(self._slurm.get_job(job.job_id))
                where = f" on {','.join(job.nodes)}" if job.nodes else ""
                parts.append(f"job {job.job_id} {job.state}{where}")
        for name in request.nodes:
            try:
                node = await slurm_call(self._slurm.get_node(name))
            except Exception as error:
                if not _is_missing(error):
                    raise
                parts.append(f"node {name} unknown")
                continue
            mine = (
                " (drained by this incident)" if request.incident_id in (node.reason or "") else ""
            )
            parts.append(f"node {name} {node.state_text}{mine}")
        return ConsistencyReport(summary="; ".join(parts) or "nothing to check", results=results)


@runtime_checkable
class MarksNodesDown(Protocol):
    """A backend that can mark a dead node DOWN (the CLI backend; others may not yet)."""

    async def down_node(self, name: str, reason: str) -> EffectResult: ...


def _isolates_dead_node(effect: PlannedEffect) -> bool:
    """The isolation of a node_down culprit: the node is dead, not merely suspect (the
    reason is `planning.slurm_reason`: "trainmedic <incident>: <category>: ...")."""
    ours = parse_our_reason(effect.reason)
    return ours is not None and ours[1] == Category.NODE_DOWN.value


def _target(value: str | None, effect: PlannedEffect) -> str:
    """The node or job an effect names; an effect without one is a bug, not a retry."""
    if not value:
        raise ApplicationError(
            f"effect {effect.id} ({effect.kind.value}) names no target",
            type="MalformedEffect",
            non_retryable=True,
        )
    return value


def _is_missing(error: BaseException) -> bool:
    cause = error.__cause__ if not isinstance(error, SlurmError) else error
    return isinstance(cause, NoSuchJob | NoSuchNode)
