"""NodeQuarantineWorkflow's paths over hours, in seconds (the time-skipping server).

Activities are stand-ins (their real versions run against the lab and the dev server in
tests/integration/test_quarantine.py); under test is the workflow's logic: healthy ->
back; unhealthy -> re-checked with back-off, then a person; unreachable agent -> out;
repeat offender -> waits for a release; release by a person -> back; operator-drained
or already back -> left alone. The repeat-offender arithmetic is rails.record_offense
(tested below as a pure function; the real update runs on the dev server).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from trainmedic.config import Policy, QuarantinePolicy, parse_policy
from trainmedic.domain.activity_io import (
    Assessment,
    AssessRequest,
    HealthCheckRequest,
    ResumeRequest,
)
from trainmedic.domain.control import ControlState, OffenseRequest, OffenseVerdict
from trainmedic.domain.enums import Mode
from trainmedic.domain.health import HealthCheck, NodeHealthReport
from trainmedic.domain.incident import IncidentSignal
from trainmedic.domain.slurm import EffectResult
from trainmedic.workflows.quarantine import (
    NodeQuarantineWorkflow,
    QuarantineInput,
    QuarantineStatus,
    ReleasePayload,
)
from trainmedic.workflows.rails import record_offense

REASON = "trainmedic incident-c-7-1: gpu_hardware: Xid 79 on gpu02"


@dataclass
class World:
    """How the stand-in world answers. `health`: the reports, in order (the last one
    repeats); `offense_count`: quarantines of the node within the window, this one too."""

    reason: str | None = REASON
    out: bool = True
    health: list[NodeHealthReport] = field(default_factory=list)
    offense_count: int = 1
    policy: QuarantinePolicy = field(
        default_factory=lambda: QuarantinePolicy(
            recheck_after=timedelta(minutes=10), recheck_limit=3
        )
    )
    checks: list[HealthCheckRequest] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    # This many assess / health-check calls fail (Slurm unreachable).
    assess_fails: int = 0
    check_fails: int = 0
    assessed: int = 0


def healthy(node: str = "gpu02") -> NodeHealthReport:
    return NodeHealthReport.of(
        node,
        [HealthCheck(name="gpu_count", ok=True, detail="8 GPUs")],
        datetime.now(UTC),
        ecc_aggregate={"GPU-a": 0},
    )


def failing(node: str = "gpu02") -> NodeHealthReport:
    return NodeHealthReport.of(
        node,
        [HealthCheck(name="gpu_count", ok=False, detail="gpu 3 lost (fallen off the bus)")],
        datetime.now(UTC),
    )


def unreachable(node: str = "gpu02") -> NodeHealthReport:
    return NodeHealthReport.of(
        node,
        [HealthCheck(name="agent", ok=False, detail="gpu02's agent: connection refused")],
        datetime.now(UTC),
        reachable=False,
    )


def stand_ins(world: World) -> list[object]:
    @activity.defn(name="quarantine_assess")
    async def assess(request: AssessRequest) -> Assessment:
        world.assessed += 1
        if world.assess_fails > 0:
            world.assess_fails -= 1
            raise ApplicationError(
                "scontrol: Unable to contact slurm controller", non_retryable=True
            )
        ours = world.out and (world.reason or "").startswith("trainmedic")
        verdict = None
        if ours:
            limit = world.policy.repeat_offender_incidents
            verdict = OffenseVerdict(
                repeat=limit > 0 and world.offense_count >= limit,
                count=world.offense_count,
                limit=limit,
                window=world.policy.repeat_offender_window,
                policy=world.policy,
            )
        return Assessment(
            node=request.node,
            state="IDLE+DRAIN" if world.out else "IDLE",
            out=world.out,
            ours=ours,
            reason=world.reason,
            reason_user="ops" if not ours else None,
            incident_id="incident-c-7-1" if ours else None,
            category="gpu_hardware" if ours else None,
            offense=verdict,
        )

    @activity.defn(name="quarantine_check_health")
    async def check_health(request: HealthCheckRequest) -> NodeHealthReport:
        world.checks.append(request)
        if world.check_fails > 0:
            world.check_fails -= 1
            raise ApplicationError(
                "scontrol: Unable to contact slurm controller", non_retryable=True
            )
        index = min(len(world.checks), len(world.health)) - 1
        return world.health[index]

    @activity.defn(name="quarantine_resume_node")
    async def resume_node(request: ResumeRequest) -> EffectResult:
        world.resumed.append(request.node)
        return EffectResult(
            command=["scontrol", "update", f"NodeName={request.node}", "State=RESUME"],
            changed=True,
            detail=f"{request.node} resumed",
        )

    return [assess, check_health, resume_node]


@pytest.fixture
async def env(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[WorkflowEnvironment]:
    yield time_skipping_env


async def start(
    env: WorkflowEnvironment, queue: str
) -> WorkflowHandle[NodeQuarantineWorkflow, QuarantineStatus]:
    return await env.client.start_workflow(
        NodeQuarantineWorkflow.run,
        QuarantineInput(cluster="c", node="gpu02", cooldown=timedelta(minutes=10)),
        id=f"node-c-gpu02-{uuid.uuid4().hex[:6]}",
        task_queue=queue,
        start_signal="report",
        start_signal_args=[IncidentSignal(source="nvml", kind="xid", nodes=["gpu02"])],
    )


async def settle(
    env: WorkflowEnvironment,
    handle: WorkflowHandle[NodeQuarantineWorkflow, QuarantineStatus],
    state: str,
    limit: timedelta = timedelta(hours=6),
) -> QuarantineStatus:
    """Skip time (a minute at a time) until the workflow is in `state`."""
    waited = timedelta(0)
    while True:
        status = await handle.query(NodeQuarantineWorkflow.status)
        if status.state == state:
            return status
        assert waited < limit, f"never reached {state}: {status.state} - {status.details}"
        await env.sleep(60)
        waited += timedelta(minutes=1)


def worker(env: WorkflowEnvironment, world: World) -> tuple[Worker, str]:
    queue = f"q-{uuid.uuid4().hex[:6]}"
    return (
        Worker(
            env.client,
            task_queue=queue,
            workflows=[NodeQuarantineWorkflow],
            activities=stand_ins(world),
        ),
        queue,
    )


async def test_healthy_node_goes_back_after_the_cool_down(env: WorkflowEnvironment) -> None:
    world = World(health=[healthy()])
    w, queue = worker(env, world)
    async with w:
        handle = await start(env, queue)
        result = await handle.result()
    assert result.state == "resumed"
    assert world.resumed == ["gpu02"] and len(world.checks) == 1
    assert result.checks[-1].healthy
    assert result.cause is not None and result.cause.incident_id == "incident-c-7-1"


async def test_unhealthy_node_is_rechecked_then_a_person_is_asked(
    env: WorkflowEnvironment,
) -> None:
    world = World(health=[failing()])
    w, queue = worker(env, world)
    async with w:
        handle = await start(env, queue)
        status = await settle(env, handle, "rechecking")
        assert status.next_check_at is not None and status.failed_checks == 1
        assert "gpu 3 lost" in status.details
        status = await settle(env, handle, "waiting_for_person")
        # 10m, 20m, 40m between the checks; the 4th failure (limit 3) asks a person.
        assert len(world.checks) == 4
        assert status.waiting_for == "health_check"
        assert status.escalated and "failed 4 health checks" in status.escalated
        assert world.resumed == []
        # The baseline of the first reading goes with every later check.
        assert world.checks[-1].ecc_baseline == {}
        await handle.signal(NodeQuarantineWorkflow.release, ReleasePayload(by=" "))
        await env.sleep(60)
        assert (await handle.query(NodeQuarantineWorkflow.status)).state == "waiting_for_person"
        await handle.signal(
            NodeQuarantineWorkflow.release, ReleasePayload(by="alice", comment="reseated GPU 3")
        )
        result = await handle.result()
    assert result.state == "resumed" and world.resumed == ["gpu02"]
    assert result.released_by is not None
    assert (result.released_by.by, result.released_by.comment) == ("alice", "reseated GPU 3")
    assert result.released_by.at is not None
    assert result.ignored and "say who releases" in result.ignored[0]


async def test_a_node_that_heals_goes_back_on_a_recheck(env: WorkflowEnvironment) -> None:
    world = World(health=[failing(), failing(), healthy()])
    w, queue = worker(env, world)
    async with w:
        handle = await start(env, queue)
        result = await handle.result()
    assert result.state == "resumed" and len(world.checks) == 3
    assert result.failed_checks == 2


async def test_unreachable_agent_keeps_the_node_out(env: WorkflowEnvironment) -> None:
    world = World(health=[unreachable()])
    w, queue = worker(env, world)
    async with w:
        handle = await start(env, queue)
        status = await settle(env, handle, "rechecking")
        assert status.details.startswith("agent unreachable")
        status = await settle(env, handle, "waiting_for_person")
        assert status.checks[-1].reachable is False
        assert world.resumed == []
        await handle.terminate("test over")


async def test_repeat_offender_waits_for_a_person(env: WorkflowEnvironment) -> None:
    world = World(health=[healthy()], offense_count=3)
    w, queue = worker(env, world)
    async with w:
        handle = await start(env, queue)
        status = await settle(env, handle, "waiting_for_person")
        assert status.waiting_for == "repeat_offender"
        assert "repeat offender: 3 incidents within" in status.details
        await env.sleep(timedelta(days=2))
        status = await handle.query(NodeQuarantineWorkflow.status)
        assert status.state == "waiting_for_person"
        assert world.checks == [] and world.resumed == []  # healthy or not: it waits
        await handle.signal(NodeQuarantineWorkflow.release, ReleasePayload(by="bob"))
        result = await handle.result()
    assert result.state == "resumed" and world.resumed == ["gpu02"]
    assert len(world.checks) == 1  # the check still runs, and is recorded


async def test_a_node_someone_resumed_is_no_longer_held(env: WorkflowEnvironment) -> None:
    """Waiting for a person, the quarantine reads Slurm every recheck_max_interval: an
    operator's `scontrol update state=resume` ends it (left alone, nothing resumed)."""
    world = World(health=[healthy()], offense_count=3)
    w, queue = worker(env, world)
    async with w:
        handle = await start(env, queue)
        await settle(env, handle, "waiting_for_person")
        world.out = False
        await env.sleep(timedelta(hours=3))
        result = await handle.result()
    assert result.state == "left_alone" and "no longer held by trainmedic" in result.details
    assert world.resumed == [] and world.checks == []


async def test_slurm_unreachable_keeps_the_node_out_and_is_tried_again(
    env: WorkflowEnvironment,
) -> None:
    world = World(health=[failing(), healthy()], assess_fails=1, check_fails=1)
    w, queue = worker(env, world)
    async with w:
        handle = await start(env, queue)
        status = await settle(env, handle, "rechecking")
        assert "could not read the node in Slurm" in status.details
        assert world.resumed == []
        result = await handle.result()
    assert result.state == "resumed"
    first = result.checks[0]
    assert not first.healthy and "the check could not run" in first.checks[0].detail
    assert result.checks[-1].healthy and world.assessed == 2


@pytest.mark.parametrize(
    ("reason", "out", "says"),
    [
        ("admin: bad fan", True, "not trainmedic's drain"),
        ("trainmedic incident-c-7-1: gpu_hardware: x", False, "back in service already"),
    ],
)
async def test_operator_drained_or_already_back_is_left_alone(
    env: WorkflowEnvironment, reason: str, out: bool, says: str
) -> None:
    world = World(reason=reason, out=out, health=[healthy()])
    w, queue = worker(env, world)
    async with w:
        handle = await start(env, queue)
        result = await handle.result()
    assert result.state == "left_alone" and says in result.details
    assert world.resumed == [] and world.checks == []


async def test_a_new_report_restarts_the_cool_down(env: WorkflowEnvironment) -> None:
    world = World(health=[failing(), healthy()])
    w, queue = worker(env, world)
    async with w:
        handle = await start(env, queue)
        await settle(env, handle, "rechecking")
        await handle.signal(
            NodeQuarantineWorkflow.report,
            IncidentSignal(source="nvml", kind="xid", nodes=["gpu02"], detail="Xid 79 again"),
        )
        status = await settle(env, handle, "cooling_down")
        assert status.cooldown_until is not None
        result = await handle.result()
    assert result.state == "resumed" and len(result.signals) == 2


# -- the repeat-offender ledger (ControlWorkflow's update, as a pure function) ------------


def state(policy: str = "") -> ControlState:
    return ControlState(cluster="c", mode=Mode.AUTO, policy=parse_policy(policy))


def offense(node: str, episode: str) -> OffenseRequest:
    return OffenseRequest(node=node, episode=episode, incident_id=f"incident-{episode}")


def test_a_node_becomes_a_repeat_offender_at_k_quarantines_within_t() -> None:
    ledger = state()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    first = record_offense(ledger, offense("gpu02", "a"), now)
    assert (first.count, first.repeat, first.limit) == (1, False, 3)
    # The same quarantine again (a retried activity): counted once.
    assert record_offense(ledger, offense("gpu02", "a"), now).count == 1
    assert record_offense(ledger, offense("gpu03", "x"), now).count == 1
    assert not record_offense(ledger, offense("gpu02", "b"), now + timedelta(days=1)).repeat
    third = record_offense(ledger, offense("gpu02", "c"), now + timedelta(days=2))
    assert third.repeat and third.count == 3
    assert [o.incident_id for o in third.offenses] == ["incident-a", "incident-b", "incident-c"]


def test_offenses_older_than_the_window_do_not_count() -> None:
    ledger = state()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    record_offense(ledger, offense("gpu02", "a"), now)
    record_offense(ledger, offense("gpu02", "b"), now + timedelta(days=3))
    late = record_offense(ledger, offense("gpu02", "c"), now + timedelta(days=8))
    assert late.count == 2 and not late.repeat
    assert [o.episode for o in ledger.offenses] == ["b", "c"]


def test_the_rule_can_be_turned_off_or_tightened() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    off = state("quarantine: {repeat_offender_incidents: 0}")
    for episode in "abcde":
        verdict = record_offense(off, offense("gpu02", episode), now)
    assert verdict.count == 5 and not verdict.repeat
    tight = state("quarantine: {repeat_offender_incidents: 2, repeat_offender_window: 1d}")
    record_offense(tight, offense("gpu02", "a"), now)
    assert record_offense(tight, offense("gpu02", "b"), now + timedelta(hours=23)).repeat
    assert Policy().quarantine.repeat_offender_incidents == 3
