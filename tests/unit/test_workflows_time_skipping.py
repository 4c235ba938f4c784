"""Workflow logic over hours, in seconds: the time-skipping test server.

Activities are stand-ins here (their real versions are tested against the lab); what is
under test is the workflow's own logic: approval timeouts and their fallbacks. (The
time-skipping server does not serve workflow updates, so ControlWorkflow's rails are
tested as pure functions in test_rails.py and on the real dev server.)
"""

from __future__ import annotations

import uuid

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from trainmedic.config import Policy, parse_policy
from trainmedic.domain import Action, Category, Diagnosis, Outcome
from trainmedic.domain.activity_io import (
    ApplyEffectRequest,
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
from trainmedic.domain.incident import EffectStatus, IncidentInput
from trainmedic.domain.slurm import EffectResult, SlurmJob, SlurmNode

# -- RecoveryWorkflow with stand-in activities ---------------------------------------

JOB = SlurmJob(job_id="7", state="FAILED", partition="gpu", nodes=["gpu01", "gpu02"])
applied: list[str] = []


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
        )

    @activity.defn(name="reserve_isolation")
    async def reserve_isolation(request: ReserveIsolation) -> IsolationGrant:
        return IsolationGrant(granted=True, reason="ok")

    @activity.defn(name="reserve_restart")
    async def reserve_restart(request: ReserveRestart) -> RestartGrant:
        return RestartGrant(granted=True, reason="ok")

    @activity.defn(name="apply_effect")
    async def apply_effect(request: ApplyEffectRequest) -> EffectOutcome:
        applied.append(request.effect.id)
        return EffectOutcome(
            status=EffectStatus.APPLIED,
            results=[EffectResult(command=["scontrol", "x"], changed=True, detail="done")],
        )

    @activity.defn(name="verify_job")
    async def verify_job(request: VerifyRequest) -> VerifyResult:
        return VerifyResult(running=True, state="RUNNING", nodes=["gpu01", "gpu03"])

    return [
        control_snapshot,
        gather_evidence,
        attribute,
        reserve_isolation,
        reserve_restart,
        apply_effect,
        verify_job,
    ]


async def run_incident(client: Client, policy_yaml: str) -> tuple[Outcome, list[str], list[str]]:
    from trainmedic.workflows.recovery import RecoveryWorkflow

    policy = parse_policy(policy_yaml)
    queue = f"ts-{uuid.uuid4().hex[:6]}"
    applied.clear()
    async with Worker(
        client, task_queue=queue, workflows=[RecoveryWorkflow], activities=make_activities(policy)
    ):
        result = await client.execute_workflow(
            RecoveryWorkflow.run,
            IncidentInput(cluster="ts", job_id="7"),
            id=f"incident-ts-7-{queue}",
            task_queue=queue,
        )
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
