"""Activities of NodeQuarantineWorkflow: assess the node, check its health where it is,
and a guarded resume."""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from typing import Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trainmedic.adapters.slurm.errors import NoSuchNode, SlurmError
from trainmedic.adapters.slurm.protocol import SlurmBackend
from trainmedic.domain.activity_io import (
    Assessment,
    AssessRequest,
    HealthCheckRequest,
    ResumeRequest,
)
from trainmedic.domain.control import OffenseRequest, OffenseVerdict
from trainmedic.domain.health import HealthCheck, NodeHealthReport, NodeHealthRequest
from trainmedic.domain.slurm import EffectResult, SlurmNode, parse_our_reason
from trainmedic.health.probe import AgentUnreachable, NodeHealthProbe

# gres entries that are GPUs: "gpu:8", "gpu:h100:8(S:0-1)", "gpu:a100:4,gpu:h100:4".
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(?P<count>\d+)")


class OffenseLedger(Protocol):
    """Where a cluster's repeat offenders are counted (its ControlWorkflow)."""

    async def record(self, cluster: str, request: OffenseRequest) -> OffenseVerdict: ...


def gres_gpus(gres: str | None) -> int | None:
    """The node's GPU count from Slurm's gres; None when it names no GPUs."""
    if not gres:
        return None
    counts = [int(m["count"]) for m in _GPU_GRES.finditer(gres.replace(" ", ""))]
    return sum(counts) if counts else None


def parse_reason(reason: str | None) -> tuple[str | None, str | None]:
    """(incident id, category) from trainmedic's drain reason (`domain.slurm.is_ours`)."""
    return parse_our_reason(reason) or (None, None)


def _slurm_check(info: SlurmNode) -> HealthCheck:
    bad = info.is_down or info.not_responding
    return HealthCheck(
        name="slurm",
        ok=not bad,
        detail=(
            f"Slurm has it {info.state_text} ({info.reason or 'no reason'})"
            if bad
            else f"slurmd responds ({info.state_text})"
        ),
    )


class QuarantineActivities:
    def __init__(
        self, backend: SlurmBackend, probe: NodeHealthProbe, ledger: OffenseLedger
    ) -> None:
        self._backend = backend
        self._probe = probe
        self._ledger = ledger

    async def _node(self, node: str) -> SlurmNode:
        try:
            return await self._backend.get_node(node)
        except NoSuchNode as error:
            raise ApplicationError(
                f"{node} is unknown to Slurm", type="NoSuchNode", non_retryable=True
            ) from error
        except SlurmError as error:
            if error.retryable:
                raise
            raise ApplicationError(
                f"reading {node}: {error}", type=type(error).__name__, non_retryable=True
            ) from error

    @activity.defn(name="quarantine_assess")
    async def assess(self, request: AssessRequest) -> Assessment:
        """Is the node still out, by trainmedic's drain? If so, count this quarantine."""
        try:
            info = await self._node(request.node)
        except ApplicationError as error:
            if error.type != "NoSuchNode":
                raise
            # Removed from slurm.conf: nothing to hold out, nothing to resume.
            return Assessment(node=request.node, state="UNKNOWN", out=False, ours=False)
        out = info.is_out
        ours = out and info.is_ours
        incident, category = parse_reason(info.reason) if ours else (None, None)
        offense = None
        if ours and request.record:
            offense = await self._ledger.record(
                request.cluster,
                OffenseRequest(
                    node=request.node,
                    episode=request.episode,
                    incident_id=incident,
                    category=category,
                    reason=info.reason,
                ),
            )
        return Assessment(
            node=request.node,
            state=info.state_text,
            out=out,
            ours=ours,
            reason=info.reason,
            reason_user=info.reason_user,
            incident_id=incident,
            category=category,
            offense=offense,
        )

    @activity.defn(name="quarantine_check_health")
    async def check_health(self, request: HealthCheckRequest) -> NodeHealthReport:
        """Slurm's view (responding) and the node's own checks through the probe. An
        agent that gives no believable answer fails the `agent` check: the report says
        so, and the node stays out."""
        info = await self._node(request.node)
        slurm = _slurm_check(info)
        probe_request = NodeHealthRequest(
            node=request.node,
            nonce=secrets.token_hex(16),
            at=datetime.now(UTC),
            expected_gpus=gres_gpus(info.gres),
            ecc_baseline=request.ecc_baseline,
        )
        try:
            report = await self._probe.check(probe_request)
        except AgentUnreachable as error:
            activity.logger.warning("health of %s: %s", request.node, error)
            return NodeHealthReport.of(
                request.node,
                [slurm, HealthCheck(name="agent", ok=False, detail=str(error))],
                datetime.now(UTC),
                reachable=False,
            )
        return report.model_copy(
            update={"checks": [slurm, *report.checks], "healthy": report.healthy and slurm.ok}
        )

    @activity.defn(name="quarantine_resume_node")
    async def resume_node(self, request: ResumeRequest) -> EffectResult:
        """Resume only a node drained/downed by trainmedic (`is_ours`, checked on the read
        right before the resume) whose reason also contains the request's marker."""
        try:
            return await self._backend.resume_node(
                request.node,
                only_if_reason_contains=request.only_if_reason_contains,
                only_if_ours=True,
            )
        except SlurmError as error:
            if error.retryable:
                raise
            raise ApplicationError(
                f"resume {request.node}: {error}", type=type(error).__name__, non_retryable=True
            ) from error
