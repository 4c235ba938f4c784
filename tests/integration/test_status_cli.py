"""`trainmedic status`, `recover` and `incidents cancel` against the real dev server and
the Slurm lab: what an operator types, what it answers, and its errors."""

from __future__ import annotations

import json

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.integration.support import (
    TASK_QUEUE,
    cli,
    effect_awaiting_approval,
    result_of,
    start_control,
    start_incident,
    submit_running,
    unique_cluster,
    xid79,
    xid79_incident,
)
from trainmedic.cli import incidents as incidents_cli
from trainmedic.cli.main import app as main_app
from trainmedic.domain import Outcome
from trainmedic.domain.incident import EffectStatus
from trainmedic.lab import Lab
from trainmedic.temporal.devserver import DevServer
from trainmedic.workflows.recovery import RecoveryWorkflow

pytestmark = pytest.mark.integration

AUTO = "version: it-status\nmode: {default: auto}\nverify: {timeout: 90s, poll_interval: 1s}\n"
APPROVE = "mode: {default: approve}\napproval: {timeout: 10m}\n"


async def test_status_shows_the_incident_its_times_and_the_goodput(
    clean_lab: Lab, temporal_client: Client, temporal_server: DevServer, controller: Worker
) -> None:
    address = ["--address", temporal_server.address]
    cluster = unique_cluster("sta")
    await start_control(temporal_client, cluster, AUTO)
    code, out, err = await cli(main_app, ["status", "--cluster", cluster, "--json", *address])
    assert code == 0, err
    before = json.loads(out)
    assert before["mode"] == "auto" and before["breaker_tripped_at"] is None
    assert before["open_incidents"] == [] and before["closed"] == 0

    job_id, placed = submit_running(clean_lab, 2)
    incident = await start_incident(temporal_client, cluster, job_id, xid79(placed[0]))
    result = await result_of(temporal_client, incident)
    assert result.outcome is Outcome.RECOVERED, result.summary
    times = result.times
    assert times.opened_at and times.acted_at and times.running_again_at
    assert times.opened_at <= times.acted_at <= times.running_again_at
    assert (times.down_s() or 0) > 0

    code, out, err = await cli(main_app, ["status", "--cluster", cluster, "--json", *address])
    assert code == 0, err
    after = json.loads(out)
    assert after["closed"] == 1 and after["outcomes"] == {"recovered": 1}
    assert [h["node"] for h in after["nodes_held_out"]] == [placed[0]]
    assert after["act_p50_s"] is not None and after["back_p50_s"] is not None
    [cost] = after["jobs"]
    assert cost["job_id"] == job_id and cost["incidents"] == 1
    assert cost["down_s"] == pytest.approx(times.down_s(), abs=0.01)
    # 69 s + 94 s for a person; trainmedic took seconds.
    assert 100 < after["saved_estimate_s"] < 163

    code, out, _ = await cli(main_app, ["status", "--cluster", cluster, *address])
    assert code == 0
    assert f"nodes held out: {placed[0]} ({incident})" in out
    assert "last 24h: 1 incidents closed: recovered 1" in out
    assert "time saved (estimate" in out

    code, out, err = await cli(incidents_cli.app, ["show", incident, "--json", *address])
    assert code == 0, err
    shown = json.loads(out)
    assert shown["outcome"] == "recovered" and shown["times"]["running_again_at"]
    code, out, _ = await cli(incidents_cli.app, ["show", incident, *address])
    assert "time: " in out and "failure to running again" in out
    code, out, _ = await cli(incidents_cli.app, ["list", "--cluster", cluster, "--json", *address])
    assert code == 0
    listed = [json.loads(line) for line in out.splitlines()]
    assert [row["incident_id"] for row in listed] == [incident]

    mode = ["mode", cluster, "approve", "--by", "erin", "--json", *address]
    code, out, err = await cli(incidents_cli.app, mode)
    assert code == 0, err
    assert json.loads(out) == {"cluster": cluster, "mode": "approve", "by": "erin"}

    code, _, err = await cli(main_app, ["status", "--cluster", "nosuch", *address])
    assert code == 2 and "has no control workflow" in err
    code, _, err = await cli(main_app, ["status", "--since", "soon", *address])
    assert code == 2 and "--since" in err


async def test_recover_opens_an_incident_by_hand(
    clean_lab: Lab, temporal_client: Client, temporal_server: DevServer, controller: Worker
) -> None:
    address = ["--address", temporal_server.address]
    cluster = unique_cluster("rec")
    await start_control(temporal_client, cluster, APPROVE)
    env = {
        "TRAINMEDIC_SLURM_CONF": str(clean_lab.slurm_conf),
        "TRAINMEDIC_TEMPORAL_TASK_QUEUE": TASK_QUEUE,
    }
    job_id, placed = submit_running(clean_lab, 2)
    args = ["recover", job_id, "--by", "carol", "--cluster", cluster, "--json", *address]
    code, out, err = await cli(main_app, [*args, "--suspect", placed[1]], env)
    assert code == 0, err
    opened = json.loads(out)
    # The run is read from Slurm: a job never requeued is in its first run.
    assert opened == {"incident_id": f"incident-{cluster}-{job_id}-1", "started": True}
    handle = temporal_client.get_workflow_handle_for(RecoveryWorkflow.run, opened["incident_id"])
    status = await handle.query(RecoveryWorkflow.status)
    [signal] = status.signals
    assert signal.source == "operator" and signal.nodes == [placed[1]]
    assert signal.evidence[0].node == placed[1] and "carol" in signal.evidence[0].text

    code, out, err = await cli(main_app, [*args, "--reason", "loss is NaN"], env)
    assert code == 0, err
    assert json.loads(out)["started"] is False, "a second report joins the open incident"

    for bad, why in (
        (["recover", "12;rm", "--by", "x", *address], "not a Slurm job id"),
        (["recover", job_id, "--by", "x", "--suspect", "gpu$(id)", *address], "--suspect"),
        (["recover", "999999", "--by", "x", "--cluster", cluster, *address], "unknown to Slurm"),
    ):
        code, _, err = await cli(main_app, bad, env)
        assert code == 2 and why in err, (bad, err)
    await handle.cancel()


async def test_cancel_an_incident_waiting_for_approval(
    clean_lab: Lab, temporal_client: Client, temporal_server: DevServer, controller: Worker
) -> None:
    address = ["--address", temporal_server.address]
    cluster = unique_cluster("can")
    incident, _, _ = await xid79_incident(temporal_client, clean_lab, cluster, APPROVE)
    handle = temporal_client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
    await effect_awaiting_approval(temporal_client, incident)

    cancel = ["cancel", incident, "--by", "dave", "--reason", "maintenance window", *address]
    code, out, err = await cli(incidents_cli.app, cancel)
    assert code == 0, err
    assert "cancellation requested (by dave)" in out
    result = await result_of(temporal_client, incident)
    assert result.outcome is Outcome.CANCELLED
    assert all(e.status is not EffectStatus.APPLIED for e in result.effects)
    history = await handle.fetch_history()
    requested = [
        e.workflow_execution_cancel_requested_event_attributes.cause
        for e in history.events
        if e.HasField("workflow_execution_cancel_requested_event_attributes")
    ]
    assert requested == ["cancelled by dave: maintenance window"]

    code, _, err = await cli(incidents_cli.app, cancel)
    assert code == 2 and "is finished (cancelled); nothing to cancel" in err
    code, _, err = await cli(incidents_cli.app, ["cancel", "incident-x-1-1", "--by", "d", *address])
    assert code == 2 and "no workflow 'incident-x-1-1'" in err
