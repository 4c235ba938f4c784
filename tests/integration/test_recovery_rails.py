"""Safety rails: the isolation breaker and the restart budget, on the real lab."""

from __future__ import annotations

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.integration.support import (
    job,
    node,
    result_of,
    running_on,
    start_control,
    start_incident,
    submit_running,
    unique_cluster,
    wait_for,
    xid79,
)
from trainmedic.config import parse_policy
from trainmedic.domain import Evidence, EvidenceSource, Mode, Outcome
from trainmedic.domain.control import SetModeRequest, SetPolicyRequest
from trainmedic.domain.incident import EffectStatus, IncidentSignal
from trainmedic.lab import Lab
from trainmedic.workflows.control import BREAKER, ControlWorkflow, control_workflow_id

pytestmark = pytest.mark.integration


async def test_breaker_drains_only_the_budget_then_drops_to_monitor(
    clean_lab: Lab, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("brk")
    await start_control(
        temporal_client,
        cluster,
        "version: it-breaker\nmode: {default: auto}\n"
        "rails: {max_isolated_fraction: 0.25, isolation_window: 1h}\n"
        "verify: {timeout: 60s, poll_interval: 1s}\n",
    )
    # Three single-node jobs on three different nodes, then each node "fails".
    jobs = [submit_running(clean_lab, 1, "--exclusive") for _ in range(3)]
    culprits = [placed[0] for _, placed in jobs]
    assert len(set(culprits)) == 3

    outcomes = []
    for n, (job_id, placed) in enumerate(jobs):
        incident = await start_incident(temporal_client, cluster, job_id, xid79(placed[0]), str(n))
        outcomes.append(await result_of(temporal_client, incident))

    assert [r.outcome for r in outcomes] == [
        Outcome.RECOVERED,
        Outcome.ESCALATED,
        Outcome.ESCALATED,
    ], [r.summary for r in outcomes]
    assert outcomes[1].effects[0].status is EffectStatus.BLOCKED
    assert "isolation budget spent: 1 of 1" in outcomes[1].summary
    assert "breaker open" in outcomes[2].summary
    assert {e.status for e in outcomes[2].effects} == {EffectStatus.WOULD_APPLY}
    drained = [name for name in culprits if "DRAIN" in node(clean_lab, name)["State"]]
    assert drained == [culprits[0]]
    # The jobs of the escalated incidents were not touched.
    for job_id, placed in jobs[1:]:
        assert running_on(clean_lab, job_id) == placed

    control = temporal_client.get_workflow_handle_for(
        ControlWorkflow.run, control_workflow_id(cluster)
    )
    state = await control.query(ControlWorkflow.current)
    assert state.mode is Mode.MONITOR
    assert state.changes[-1].by == BREAKER
    assert state.breaker_reason and "budget" in state.breaker_reason


def nccl_error(job_id: str) -> IncidentSignal:
    """The epilog's report of a failed run, with the NCCL line its log ended on (a
    matched line alone, while the job runs, would only be noted)."""
    return IncidentSignal(
        source="epilog",
        kind="epilog",
        job_id=job_id,
        evidence=[
            Evidence(
                source=EvidenceSource.LOG,
                text=(
                    "[rank3]: torch.distributed.DistBackendError: NCCL error in: "
                    "ProcessGroupNCCL.cpp:1970, remote process exited or there was a "
                    "network error, NCCL version 2.20.5"
                ),
            )
        ],
    )


async def test_restart_budget_stops_the_third_identical_failure(
    clean_lab: Lab, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("bud")
    await start_control(
        temporal_client,
        cluster,
        "version: it-budget\nmode: {default: auto}\nrails: {restart_budget: 2}\n"
        "verify: {timeout: 90s, poll_interval: 1s}\n",
    )
    job_id, _ = submit_running(clean_lab, 1)

    results = []
    for attempt in range(3):
        wait_for(lambda: running_on(clean_lab, job_id), f"job {job_id} running")
        incident = await start_incident(
            temporal_client, cluster, job_id, nccl_error(job_id), str(attempt)
        )
        results.append(await result_of(temporal_client, incident))

    assert [r.outcome for r in results] == [
        Outcome.RECOVERED,
        Outcome.RECOVERED,
        Outcome.ESCALATED,
    ], [r.summary for r in results]
    assert "restart budget spent" in results[2].summary
    assert results[2].effects[0].status is EffectStatus.BLOCKED
    assert job(clean_lab, job_id)["Restarts"] == "2"


async def test_policy_changes_and_mode_changes_are_audited(
    temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("pol")
    await start_control(temporal_client, cluster, "version: v1\nmode: {default: monitor}\n")
    control = temporal_client.get_workflow_handle_for(
        ControlWorkflow.run, control_workflow_id(cluster)
    )

    async def set_policy(text: str) -> Mode:
        state = await control.execute_update(
            ControlWorkflow.set_policy,
            SetPolicyRequest(policy=parse_policy(text), by="ops", reason="rollout"),
        )
        return state.mode

    # An edited default mode is an explicit choice: the cluster follows it.
    assert await set_policy("version: v2\nmode: {default: approve}\n") is Mode.APPROVE
    # An operator's own mode choice survives a policy change that leaves the default.
    await control.execute_update(
        ControlWorkflow.set_mode, SetModeRequest(mode=Mode.MONITOR, by="carol", reason="audit")
    )
    assert (
        await set_policy("version: v3\nmode: {default: approve}\nrails: {restart_budget: 1}\n")
        is Mode.MONITOR
    )
    state = await control.query(ControlWorkflow.current)
    assert [(c.by, c.mode, c.policy_version) for c in state.changes] == [
        ("trainmedic:start", Mode.MONITOR, "v1"),
        ("ops", Mode.APPROVE, "v2"),
        ("carol", Mode.MONITOR, "v2"),
        ("ops", Mode.MONITOR, "v3"),
    ]
    assert state.policy.rails.restart_budget == 1
