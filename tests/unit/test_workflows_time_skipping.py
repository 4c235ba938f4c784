"""Workflow logic over hours, in seconds: the time-skipping test server.

Activities are stand-ins here (their real versions are tested against the lab); what is
under test is the workflow's own logic: approval timeouts and their fallbacks. (The
time-skipping server does not serve workflow updates, so ControlWorkflow's rails are
tested as pure functions in test_rails.py and on the real dev server.)
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from trainmedic.activities.notify import NotifyActivities
from trainmedic.adapters.notify.webhook import WebhookNotifier
from trainmedic.config import Policy, parse_policy
from trainmedic.domain import Action, Category, Diagnosis, Evidence, EvidenceSource, Outcome
from trainmedic.domain.activity_io import (
    ApplyEffectRequest,
    ConsistencyReport,
    ConsistencyRequest,
    ControlRef,
    EffectOutcome,
    Gathered,
    GatherRequest,
    ReserveIsolation,
    ReserveRestart,
    VerifyRequest,
    VerifyResult,
)
from trainmedic.domain.control import ControlState, IsolationGrant, RestartGrant
from trainmedic.domain.diagnosis import AttributionRequest
from trainmedic.domain.incident import (
    DecisionPayload,
    EffectStatus,
    IncidentInput,
    IncidentResult,
)
from trainmedic.domain.notify import Notification, NotifyEvent, NotifyResult
from trainmedic.domain.slurm import EffectResult, SlurmJob, SlurmNode
from trainmedic.domain.telemetry import OutcomeRecord, OutcomeRecorded
from trainmedic.telemetry import approval_waits

# -- RecoveryWorkflow with stand-in activities ---------------------------------------

JOB = SlurmJob(job_id="7", state="FAILED", partition="gpu", nodes=["gpu01", "gpu02"])
applied: list[str] = []
notified: list[Notification] = []
recorded: list[OutcomeRecord] = []


@dataclass
class Behaviour:
    """How the stand-in world answers (each test sets what it breaks)."""

    isolation_granted: bool = True
    failing_effect: str | None = None  # this effect id fails for good
    runs_again: bool = True
    held_by: str | None = None  # another incident reserved the culprit first
    webhook: str | None = None  # the real notify activity, posting here


world = Behaviour()


def make_activities(policy: Policy) -> list[object]:
    @activity.defn(name="control_snapshot")
    async def control_snapshot(ref: ControlRef) -> ControlState:
        return ControlState(cluster=ref.cluster, mode=policy.mode.default, policy=policy)

    @activity.defn(name="gather_evidence")
    async def gather_evidence(request: GatherRequest) -> Gathered:
        nodes = [SlurmNode(name=n, state="IDLE", partitions=["gpu"]) for n in JOB.nodes]
        return Gathered(job=JOB, nodes=nodes, partition_sizes={"gpu": 8})

    @activity.defn(name="attribute")
    async def attribute(request: AttributionRequest) -> Diagnosis:
        return Diagnosis(
            category=Category.GPU_HARDWARE,
            action=Action.DRAIN_AND_RESTART,
            culprit_nodes=["gpu02"],
            confidence=0.9,
            catalog_version="t",
            summary="Xid 79",
            evidence=[Evidence(source=EvidenceSource.KERNEL, text="NVRM: Xid 79", node="gpu02")],
        )

    @activity.defn(name="reserve_isolation")
    async def reserve_isolation(request: ReserveIsolation) -> IsolationGrant:
        if not world.isolation_granted:
            return IsolationGrant(
                granted=False, reason="isolation budget spent: 2 of 2", breaker_tripped=True
            )
        if world.held_by:
            reason = f"already held out (reserved by {world.held_by})"
            return IsolationGrant(granted=True, reason=reason, held_by=world.held_by)
        return IsolationGrant(granted=True, reason="ok")

    @activity.defn(name="confirm_isolation")
    async def confirm_isolation(request: ReserveIsolation) -> bool:
        return True

    @activity.defn(name="reserve_restart")
    async def reserve_restart(request: ReserveRestart) -> RestartGrant:
        return RestartGrant(granted=True, reason="ok")

    @activity.defn(name="notify")
    async def notify(notification: Notification) -> NotifyResult:
        notified.append(notification)
        return NotifyResult(delivered=True)

    @activity.defn(name="apply_effect")
    async def apply_effect(request: ApplyEffectRequest) -> EffectOutcome:
        if request.effect.id == world.failing_effect:
            raise ApplicationError("scontrol: Invalid job id specified", non_retryable=True)
        applied.append(request.effect.id)
        return EffectOutcome(
            status=EffectStatus.APPLIED,
            results=[EffectResult(command=["scontrol", "x"], changed=True, detail="done")],
        )

    @activity.defn(name="verify_job")
    async def verify_job(request: VerifyRequest) -> VerifyResult:
        if not world.runs_again:
            return VerifyResult(running=False, state="PENDING", detail="still PENDING (Resources)")
        return VerifyResult(running=True, state="RUNNING", nodes=["gpu01", "gpu03"])

    @activity.defn(name="check_consistency")
    async def check_consistency(request: ConsistencyRequest) -> ConsistencyReport:
        return ConsistencyReport(summary="node gpu02 IDLE+DRAIN (drained by this incident)")

    @activity.defn(name="record_outcome")
    async def record_outcome(record: OutcomeRecord) -> OutcomeRecorded:
        recorded.append(record)
        return OutcomeRecorded(recorded=True)

    if world.webhook:
        notify = NotifyActivities(WebhookNotifier(world.webhook, timeout=2)).notify  # type: ignore[assignment]
    return [
        control_snapshot,
        gather_evidence,
        attribute,
        reserve_isolation,
        confirm_isolation,
        reserve_restart,
        apply_effect,
        notify,
        verify_job,
        check_consistency,
        record_outcome,
    ]


async def run_incident_result(
    client: Client, policy_yaml: str, behaviour: Behaviour | None = None
) -> IncidentResult:
    from trainmedic.workflows.recovery import RecoveryWorkflow

    global world
    world = behaviour or Behaviour()
    policy = parse_policy(policy_yaml)
    queue = f"ts-{uuid.uuid4().hex[:6]}"
    applied.clear()
    notified.clear()
    recorded.clear()
    async with Worker(
        client, task_queue=queue, workflows=[RecoveryWorkflow], activities=make_activities(policy)
    ):
        return await client.execute_workflow(
            RecoveryWorkflow.run,
            IncidentInput(cluster="ts", job_id="7"),
            id=f"incident-ts-7-{queue}",
            task_queue=queue,
        )


async def run_incident(client: Client, policy_yaml: str) -> tuple[Outcome, list[str], list[str]]:
    result = await run_incident_result(client, policy_yaml)
    return result.outcome, list(applied), [d.by for d in result.decisions]


@pytest.mark.parametrize(
    ("fallback", "outcome", "effects"),
    [
        ("escalate", Outcome.ESCALATED, []),
        ("abandon", Outcome.ABANDONED, []),
        ("proceed", Outcome.RECOVERED, ["drain-gpu02", "requeue-7"]),
    ],
)
async def test_approval_timeout_fallbacks(
    time_skipping_env: WorkflowEnvironment, fallback: str, outcome: Outcome, effects: list[str]
) -> None:
    got, done, deciders = await run_incident(
        time_skipping_env.client,
        f"mode: {{default: approve}}\napproval: {{timeout: 30m, fallback: {fallback}}}",
    )
    assert got is outcome
    assert done == effects
    assert set(deciders) == {"trainmedic:timeout"}
    events = [n.event for n in notified]
    [asked] = [n for n in notified if n.event is NotifyEvent.APPROVAL_NEEDED][:1]
    assert "--action drain-gpu02" in asked.action_hint
    assert (NotifyEvent.ESCALATED in events) is (outcome is Outcome.ESCALATED)
    assert events.count(NotifyEvent.EFFECT_APPLIED) == len(effects)
    # The outcome went to record_outcome once, with each wait for a decision in it.
    [record] = recorded
    assert record.result.outcome is outcome and record.mode.value == "approve"
    waits = approval_waits(record.result)
    assert waits and {d for _, d, _ in waits} == {"timeout"}
    assert all(s == pytest.approx(1800, abs=5) for _, _, s in waits)


# -- recovery paths no lab test reaches (issue 9.10) --------------------------------------

AUTO = "mode: {default: auto}"


async def test_an_effect_that_fails_escalates_and_says_which(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    result = await run_incident_result(
        time_skipping_env.client, AUTO, Behaviour(failing_effect="requeue-7")
    )
    assert result.outcome is Outcome.ESCALATED
    assert "an effect failed" in result.summary and "Invalid job id" in result.summary
    assert [(e.id, e.status) for e in result.effects] == [
        ("drain-gpu02", EffectStatus.APPLIED),
        ("requeue-7", EffectStatus.FAILED),
    ]
    by_event = {n.event: n for n in notified}
    assert sorted(by_event) == [NotifyEvent.EFFECT_APPLIED, NotifyEvent.ESCALATED]
    escalated = by_event[NotifyEvent.ESCALATED]
    assert "Invalid job id" in escalated.summary and escalated.job_id == "7"


async def test_a_job_that_does_not_run_again_escalates(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    result = await run_incident_result(time_skipping_env.client, AUTO, Behaviour(runs_again=False))
    assert result.outcome is Outcome.ESCALATED
    assert "did not run again" in result.summary and "Resources" in result.summary


async def test_a_node_another_incident_drains_is_not_drained_twice(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    # Three jobs on one node fail together; their incidents race to the ledger. The
    # second must keep the node out of its job and leave the drain to the first.
    result = await run_incident_result(
        time_skipping_env.client, AUTO, Behaviour(held_by="incident-ts-9-1")
    )
    assert result.outcome is Outcome.RECOVERED, result.summary
    assert [(e.id, e.status) for e in result.effects] == [
        ("drain-gpu02", EffectStatus.ALREADY_TRUE),
        ("requeue-7", EffectStatus.APPLIED),
    ]
    assert "drained by incident-ts-9-1" in result.effects[0].note
    assert applied == ["requeue-7"]


async def test_effects_after_a_blocked_one_are_skipped_not_done(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    result = await run_incident_result(
        time_skipping_env.client, AUTO, Behaviour(isolation_granted=False)
    )
    assert result.outcome is Outcome.ESCALATED
    assert "a safety rail stopped recovery" in result.summary
    assert [(e.id, e.status) for e in result.effects] == [
        ("drain-gpu02", EffectStatus.BLOCKED),
        ("requeue-7", EffectStatus.SKIPPED),
    ]
    assert "an earlier effect was blocked" in result.effects[1].note
    assert applied == []
    # Notifications run beside each other: they may arrive in any order.
    by_event = {n.event: n for n in notified}
    assert sorted(by_event) == [NotifyEvent.BREAKER_TRIPPED, NotifyEvent.ESCALATED]
    tripped = by_event[NotifyEvent.BREAKER_TRIPPED].summary
    assert "monitor mode" in tripped and "budget spent" in tripped


async def test_cancel_after_an_applied_effect_says_what_was_done(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    from trainmedic.workflows.recovery import RecoveryWorkflow

    global world
    world = Behaviour()
    client = time_skipping_env.client
    policy = parse_policy("mode: {default: approve}\napproval: {timeout: 2h}")
    queue = f"ts-{uuid.uuid4().hex[:6]}"
    applied.clear()
    recorded.clear()
    async with Worker(
        client, task_queue=queue, workflows=[RecoveryWorkflow], activities=make_activities(policy)
    ):
        handle = await client.start_workflow(
            RecoveryWorkflow.run,
            IncidentInput(cluster="ts", job_id="7"),
            id=f"incident-ts-7-{queue}",
            task_queue=queue,
        )

        async def awaiting(effect_id: str) -> None:
            for _ in range(200):
                status = await handle.query(RecoveryWorkflow.status)
                if any(
                    e.id == effect_id and e.status is EffectStatus.AWAITING_APPROVAL
                    for e in status.effects
                ):
                    return
                await asyncio.sleep(0.05)
            pytest.fail(f"{effect_id} never awaited approval")

        await awaiting("drain-gpu02")
        await handle.signal(
            RecoveryWorkflow.approve, DecisionPayload(action="drain-gpu02", by="ops")
        )
        await awaiting("requeue-7")
        await handle.cancel()
        result = await handle.result()
    assert result.outcome is Outcome.CANCELLED
    assert applied == ["drain-gpu02"]
    assert "drain gpu02" in result.summary and "drained by this incident" in result.summary
    assert [(e.id, e.status) for e in result.effects] == [
        ("drain-gpu02", EffectStatus.APPLIED),
        ("requeue-7", EffectStatus.SKIPPED),
    ]
    # A cancelled incident is counted too, with the operator's approval wait.
    [record] = recorded
    assert record.result.outcome is Outcome.CANCELLED
    assert [(k, d) for k, d, _ in approval_waits(record.result)] == [("drain_node", "approved")]
