"""RecoveryWorkflow against the real dev server and the real Slurm lab."""

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
from trainmedic.audit import decode_payload
from trainmedic.domain import Action, Category, Outcome
from trainmedic.domain.incident import EffectStatus, IncidentSignal
from trainmedic.lab import Lab
from trainmedic.workflows.control import ControlWorkflow, control_workflow_id

pytestmark = pytest.mark.integration

AUTO = "version: it-auto\nmode: {default: auto}\nverify: {timeout: 90s, poll_interval: 1s}\n"
MONITOR = "version: it-monitor\nmode: {default: monitor}\n"


async def test_auto_xid79_drains_culprit_and_requeues_elsewhere(
    clean_lab: Lab, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("auto")
    await start_control(temporal_client, cluster, AUTO)
    job_id, placed = submit_running(clean_lab, 2)
    culprit = placed[0]

    incident = await start_incident(temporal_client, cluster, job_id, xid79(culprit))
    result = await result_of(temporal_client, incident)

    assert result.outcome is Outcome.RECOVERED, result.summary
    assert result.diagnosis is not None
    assert result.diagnosis.category is Category.GPU_HARDWARE
    assert result.diagnosis.action is Action.DRAIN_AND_RESTART
    assert result.diagnosis.culprit_nodes == [culprit]
    drained = node(clean_lab, culprit)
    assert "DRAIN" in drained["State"]
    assert incident in drained["Reason"]
    now_on = running_on(clean_lab, job_id)
    assert now_on and culprit not in now_on and len(now_on) == 2
    assert int(job(clean_lab, job_id)["Restarts"]) == 1
    assert culprit in job(clean_lab, job_id)["ExcNodeList"]
    assert [e.status for e in result.effects] == [EffectStatus.APPLIED, EffectStatus.APPLIED]
    assert result.effects[0].results[0].command[:2] == ["scontrol", "update"]


async def test_monitor_changes_nothing_and_records_advice(
    clean_lab: Lab, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("mon")
    await start_control(temporal_client, cluster, MONITOR)
    job_id, placed = submit_running(clean_lab, 2)
    culprit = placed[1]

    incident = await start_incident(temporal_client, cluster, job_id, xid79(culprit))
    result = await result_of(temporal_client, incident)

    assert result.outcome is Outcome.RECOMMENDED
    assert {e.status for e in result.effects} == {EffectStatus.WOULD_APPLY}
    assert [e.id for e in result.effects] == [f"drain-{culprit}", f"requeue-{job_id}"]
    assert "DRAIN" not in node(clean_lab, culprit)["State"]
    assert running_on(clean_lab, job_id) == placed
    assert int(job(clean_lab, job_id)["Restarts"]) == 0
    # The advice is in the history, not only in the result.
    history = await temporal_client.get_workflow_handle(incident).fetch_history()
    memos = [
        decode_payload(
            event.workflow_properties_modified_event_attributes.upserted_memo.fields[key]
        )
        for event in history.events
        if event.HasField("workflow_properties_modified_event_attributes")
        for key in event.workflow_properties_modified_event_attributes.upserted_memo.fields
        if key == "effects"
    ]
    assert memos, "no effect record in the history"
    assert [(e["id"], e["status"]) for e in memos[-1]] == [
        (f"drain-{culprit}", "would_apply"),
        (f"requeue-{job_id}", "would_apply"),
    ]


async def test_auto_node_death_under_a_two_node_job(
    clean_lab: Lab, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("death")
    await start_control(temporal_client, cluster, AUTO)
    job_id, placed = submit_running(clean_lab, 2)
    dead = placed[1]

    clean_lab.kill_node(dead)  # slurmd, its step daemons and the job's processes
    # What the Slurm watcher reports once slurmctld gives up on the node.
    wait_for(lambda: "DOWN" in node(clean_lab, dead)["State"], f"{dead} DOWN", timeout=120)
    signal = IncidentSignal(source="slurm", kind="node_down", job_id=job_id, nodes=[dead])
    incident = await start_incident(temporal_client, cluster, job_id, signal)
    result = await result_of(temporal_client, incident)

    assert result.outcome is Outcome.RECOVERED, result.summary
    assert result.diagnosis is not None
    assert result.diagnosis.category is Category.NODE_DOWN
    assert result.diagnosis.culprit_nodes == [dead]
    # Slurm already took the dead node out: that is already true, nothing is drained
    # over it and no isolation budget is spent (issue 9.2); the job still moves away.
    drain, requeue = result.effects
    assert drain.status is EffectStatus.ALREADY_TRUE, drain
    assert "already out of service" in drain.note
    assert requeue.status is EffectStatus.APPLIED
    assert "DRAIN" not in node(clean_lab, dead)["State"]
    control = await temporal_client.get_workflow_handle_for(
        ControlWorkflow.run, control_workflow_id(cluster)
    ).query(ControlWorkflow.current)
    assert control.isolations == [] and control.breaker_tripped_at is None
    now_on = running_on(clean_lab, job_id)
    assert now_on and dead not in now_on and len(now_on) == 2
    assert dead in job(clean_lab, job_id)["ExcNodeList"]


async def test_a_node_an_operator_drained_is_left_alone(
    clean_lab: Lab, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("admin")
    await start_control(temporal_client, cluster, AUTO)
    job_id, placed = submit_running(clean_lab, 2)
    culprit = placed[0]
    clean_lab.run_client(
        ["scontrol", "update", f"NodeName={culprit}", "State=DRAIN", "Reason=bob: DIMM swap"]
    )

    incident = await start_incident(temporal_client, cluster, job_id, xid79(culprit))
    result = await result_of(temporal_client, incident)

    drain, requeue = result.effects
    assert drain.status is EffectStatus.ALREADY_TRUE
    assert "already out of service" in drain.note and "DIMM swap" in drain.note
    assert node(clean_lab, culprit)["Reason"].startswith("bob: DIMM swap")
    # The job still moves away from the suspect node.
    assert requeue.status is EffectStatus.APPLIED
    assert result.outcome is Outcome.RECOVERED, result.summary
    assert culprit not in (running_on(clean_lab, job_id) or [culprit])
