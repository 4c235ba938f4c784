"""Approve mode: waiting, the UI's signal payload, rejection, refused decisions, crash."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.worker import Worker

from tests.integration.support import (
    job,
    node,
    result_of,
    running_on,
    start_incident,
    submit_running,
    unique_cluster,
    xid79,
)
from trainmedic.activities.control import ensure_control
from trainmedic.config import parse_policy
from trainmedic.domain import Outcome
from trainmedic.domain.incident import DecisionPayload, EffectStatus, IncidentStatus
from trainmedic.lab import Lab
from trainmedic.temporal.devserver import DevServer
from trainmedic.workflows.recovery import RecoveryWorkflow

pytestmark = pytest.mark.integration

APPROVE = (
    "version: it-approve\nmode: {default: approve}\napproval: {timeout: 10m}\n"
    "verify: {timeout: 90s, poll_interval: 1s}\n"
)


async def awaiting(handle: WorkflowHandle, effect_id: str) -> IncidentStatus:
    async def probe() -> IncidentStatus | None:
        status = await handle.query(RecoveryWorkflow.status)
        for effect in status.effects:
            if effect.id == effect_id and effect.status is EffectStatus.AWAITING_APPROVAL:
                return status
        return None

    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        found = await probe()
        if found:
            return found
        await asyncio.sleep(0.3)
    pytest.fail(f"{effect_id} never awaited approval")


async def test_ui_signal_approves_and_incident_proceeds(
    clean_lab: Lab, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("appr")
    await ensure_control(temporal_client, cluster, parse_policy(APPROVE), "trainmedic-it")
    job_id, placed = submit_running(clean_lab, 2)
    culprit = placed[0]
    incident = await start_incident(temporal_client, cluster, job_id, xid79(culprit))
    handle = temporal_client.get_workflow_handle(incident)

    status = await awaiting(handle, f"drain-{culprit}")
    assert "waiting for approval to drain" in status.details
    assert "DRAIN" not in node(clean_lab, culprit)["State"]  # nothing before approval

    # Exactly what the Temporal UI sends: a signal named approve with one JSON object.
    await handle.signal("approve", {"action": "all", "by": "alice", "comment": "Xid 79, go"})
    result = await result_of(temporal_client, incident)

    assert result.outcome is Outcome.RECOVERED, result.summary
    assert [d.by for d in result.decisions] == ["alice"]
    assert result.decisions[0].effect_ids == [f"drain-{culprit}", f"requeue-{job_id}"]
    assert incident in node(clean_lab, culprit)["Reason"]
    assert culprit not in (running_on(clean_lab, job_id) or [culprit])


async def test_reject_leaves_slurm_untouched(
    clean_lab: Lab, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("rej")
    await ensure_control(temporal_client, cluster, parse_policy(APPROVE), "trainmedic-it")
    job_id, placed = submit_running(clean_lab, 2)
    culprit = placed[1]
    incident = await start_incident(temporal_client, cluster, job_id, xid79(culprit))
    handle = temporal_client.get_workflow_handle(incident)
    await awaiting(handle, f"drain-{culprit}")

    await handle.signal(
        RecoveryWorkflow.reject, DecisionPayload(action="all", by="bob", comment="known flaky")
    )
    result = await result_of(temporal_client, incident)

    assert result.outcome is Outcome.REJECTED
    assert {e.status for e in result.effects} == {EffectStatus.REJECTED}
    assert "DRAIN" not in node(clean_lab, culprit)["State"]
    assert running_on(clean_lab, job_id) == placed
    assert job(clean_lab, job_id)["Restarts"] == "0"


async def test_invalid_decisions_are_refused_with_a_message(
    clean_lab: Lab, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("bad")
    await ensure_control(temporal_client, cluster, parse_policy(APPROVE), "trainmedic-it")
    job_id, placed = submit_running(clean_lab, 2)
    culprit = placed[0]
    incident = await start_incident(temporal_client, cluster, job_id, xid79(culprit))
    handle = temporal_client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
    await awaiting(handle, f"drain-{culprit}")

    async def refused(payload: DecisionPayload) -> str:
        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await handle.execute_update(RecoveryWorkflow.decide, payload)
        return str(caught.value.cause)

    assert "unknown action 'reboot-gpu99'" in await refused(
        DecisionPayload(action="reboot-gpu99", by="carol", decision="approve")
    )
    assert "say 'decision'" in await refused(DecisionPayload(action="all", by="carol"))
    assert "say who decides" in await refused(
        DecisionPayload(action=f"drain-{culprit}", decision="approve")
    )
    accepted = await handle.execute_update(
        RecoveryWorkflow.decide,
        DecisionPayload(action=f"drain-{culprit}", by="carol", decision="reject"),
    )
    assert accepted.decisions[-1].by == "carol"
    assert "already decided (rejected)" in await refused(
        DecisionPayload(action=f"drain-{culprit}", by="dave", decision="approve")
    )
    # A refused update leaves no trace in the history; a refused signal is recorded.
    history = await handle.fetch_history()
    assert "reboot-gpu99" not in history.to_json()
    await handle.signal(RecoveryWorkflow.approve, DecisionPayload(action="nope", by="eve"))
    for _ in range(100):
        ignored = (await handle.query(RecoveryWorkflow.status)).ignored
        if ignored:
            break
        await asyncio.sleep(0.2)
    assert len(ignored) == 1 and "unknown action 'nope'" in ignored[0]

    await handle.cancel()
    result = await result_of(temporal_client, incident)
    assert result.outcome is Outcome.CANCELLED
    assert "no effect was applied" in result.summary


def _worker_process(
    server: DevServer, lab: Lab, cluster: str, queue: str, policy: Path
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TRAINMEDIC_CLUSTER": cluster,
        "TRAINMEDIC_TEMPORAL_ADDRESS": server.address,
        "TRAINMEDIC_TEMPORAL_TASK_QUEUE": queue,
        "TRAINMEDIC_SLURM_CONF": str(lab.slurm_conf),
        "TRAINMEDIC_POLICY_FILE": str(policy),
        "TRAINMEDIC_STATE_DIR": str(lab.root / "worker-state"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "trainmedic.cli.main", "worker", "--no-detect"], env=env
    )


@pytest.mark.parametrize(
    "boundary", ["before the drain", "between drain and requeue", "while verifying"]
)
async def test_worker_killed_at_each_stage_boundary(
    clean_lab: Lab,
    temporal_server: DevServer,
    temporal_client: Client,
    tmp_path: Path,
    boundary: str,
) -> None:
    """SIGKILL of the controller's worker where an incident waits or works between its
    effects: the new worker goes on from the history, no effect repeated or skipped."""
    cluster = unique_cluster("crash")
    queue = f"crash-{cluster}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(APPROVE)
    job_id, placed = submit_running(clean_lab, 2)
    culprit = placed[0]

    worker = _worker_process(temporal_server, clean_lab, cluster, queue, policy)

    def crash() -> subprocess.Popen[bytes]:
        worker.kill()  # SIGKILL: no goodbye
        worker.wait(timeout=30)
        return _worker_process(temporal_server, clean_lab, cluster, queue, policy)

    try:
        from trainmedic.domain.incident import IncidentInput

        incident = f"incident-{cluster}-{job_id}-1"
        await temporal_client.start_workflow(
            RecoveryWorkflow.run,
            IncidentInput(cluster=cluster, job_id=job_id, nodes=[culprit], signal=xid79(culprit)),
            id=incident,
            task_queue=queue,
        )
        handle = temporal_client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
        await awaiting(handle, f"drain-{culprit}")
        if boundary == "before the drain":
            worker = crash()
        await handle.execute_update(
            RecoveryWorkflow.decide,
            DecisionPayload(action=f"drain-{culprit}", by="ops", decision="approve"),
        )
        await awaiting(handle, f"requeue-{job_id}")
        assert "DRAIN" in node(clean_lab, culprit)["State"]
        if boundary == "between drain and requeue":
            worker = crash()
        await handle.execute_update(
            RecoveryWorkflow.decide,
            DecisionPayload(action=f"requeue-{job_id}", by="ops", decision="approve"),
        )
        if boundary == "while verifying":
            for _ in range(300):
                status = await handle.query(RecoveryWorkflow.status)
                if status.stage.value == "verify":
                    break
                await asyncio.sleep(0.05)
            worker = crash()  # verify heartbeats: a new attempt starts within 30 s
        result = await result_of(temporal_client, incident)
    finally:
        worker.terminate()
        worker.wait(timeout=30)

    assert result.outcome is Outcome.RECOVERED, result.summary
    ctld_log = (clean_lab.root / "log" / "slurmctld.log").read_text()
    drains = [
        line
        for line in ctld_log.splitlines()
        if f"node {culprit} reason set to" in line and incident in line
    ]
    assert len(drains) == 1, drains
    assert ctld_log.count(f"Requeuing JobId={job_id}") == 1
    assert job(clean_lab, job_id)["Restarts"] == "1"
