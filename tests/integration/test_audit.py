"""Audit export and the incidents CLI against the real dev server and the Slurm lab.

One approve-mode incident: the CLI's wrong decisions are refused with the workflow's
own message, an approval arrives the way the Temporal UI sends it (the `approve` signal,
a JSON payload, no identity), and the export shows who approved, the exact Slurm argv
and its result, the evidence and the outcome; a mode change shows on the control side.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payloads, WorkflowExecution
from temporalio.api.workflowservice.v1 import SignalWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.integration.support import (
    cli,
    effect_awaiting_approval,
    node,
    result_of,
    unique_cluster,
    xid79_incident,
)
from trainmedic.audit import AuditRecord, export
from trainmedic.cli import audit as audit_cli
from trainmedic.cli import incidents as incidents_cli
from trainmedic.domain import Outcome
from trainmedic.lab import Lab
from trainmedic.temporal.devserver import DevServer
from trainmedic.workflows.control import control_workflow_id

pytestmark = pytest.mark.integration

APPROVE = (
    "version: it-approve\nmode: {default: approve}\n"
    "approval: {timeout: 10m, fallback: escalate}\n"
    "verify: {timeout: 90s, poll_interval: 1s}\n"
)
UI_PAYLOAD = {"action": "all", "by": "alice@ui", "comment": "Xid 79, drain it"}


async def signal_like_the_ui(client: Client, workflow_id: str, name: str, payload: dict) -> None:
    """What the UI's "Send a Signal" does: one JSON payload, and no identity at all."""
    encoded = client.data_converter.payload_converter.to_payloads([payload])
    await client.workflow_service.signal_workflow_execution(
        SignalWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id),
            signal_name=name,
            input=Payloads(payloads=encoded),
            identity="",
        )
    )


async def collect(records: AsyncIterator[AuditRecord]) -> list[AuditRecord]:
    return [record async for record in records]


async def test_approved_incident_is_fully_audited(
    clean_lab: Lab,
    temporal_client: Client,
    temporal_server: DevServer,
    controller: Worker,
    tmp_path: Path,
) -> None:
    address = ["--address", temporal_server.address]
    cluster = unique_cluster("aud")
    incident, job_id, culprit = await xid79_incident(temporal_client, clean_lab, cluster, APPROVE)
    assert await effect_awaiting_approval(temporal_client, incident) == f"drain-{culprit}"

    # Wrong decisions through the CLI are refused by the workflow's validator.
    code, _, err = await cli(
        incidents_cli.app, ["approve", incident, "--action", "nope", "--by", "bob", *address]
    )
    assert code == 2
    assert "unknown action 'nope'" in err and f"drain-{culprit}" in err
    # A blank name is refused by the CLI itself now, before anything reaches Temporal.
    code, _, err = await cli(incidents_cli.app, ["reject", incident, "--by", "  ", *address])
    assert code == 2
    assert "--by" in err and "audit trail" in err
    code, out, _ = await cli(incidents_cli.app, ["show", incident, *address])
    assert code == 0
    assert "awaiting_approval" in out and f"drain-{culprit}" in out

    await signal_like_the_ui(temporal_client, incident, "approve", UI_PAYLOAD)
    result = await result_of(temporal_client, incident)
    assert result.outcome is Outcome.RECOVERED, result.summary
    assert "DRAIN" in node(clean_lab, culprit)["State"]

    # The list (from visibility, which lags a little) shows it with its outcome.
    for _ in range(50):
        code, out, err = await cli(incidents_cli.app, ["list", "--cluster", cluster, *address])
        if code == 0 and "recovered" in out:
            break
        await asyncio.sleep(0.2)
    assert code == 0, err
    assert incident in out and "gpu_hardware" in out and "recovered" in out

    # A decision after the end is refused too, with the workflow's reason.
    code, _, err = await cli(incidents_cli.app, ["approve", incident, "--by", "bob", *address])
    assert code == 2
    assert "finished" in err and "recovered" in err

    code, out, _ = await cli(
        incidents_cli.app,
        ["mode", cluster, "monitor", "--by", "carol", "--reason", "maintenance", *address],
    )
    assert code == 0, out
    assert "mode monitor" in out

    records = await collect(export(temporal_client, incident=incident))
    kinds = [r.kind for r in records]
    assert kinds[0] == "incident_started"
    assert kinds[-1] == "outcome"

    decision = next(r for r in records if r.kind == "decision")
    assert decision.who == "alice@ui"
    assert decision.identity is None
    assert decision.unverified_identity is True
    assert decision.via == "signal" and decision.approve is True
    assert decision.comment == UI_PAYLOAD["comment"]
    assert decision.stage == "gate"
    assert decision.effect_id and f"drain-{culprit}" in decision.effect_id

    # The lab's controller has no webhook: each notification says so in the trail.
    notes = [r for r in records if r.kind == "notification"]
    assert notes and all(r.status == "not sent" for r in notes)
    assert "approval_needed: no notifier configured" in [r.detail for r in notes]

    diagnosis = next(r for r in records if r.kind == "diagnosis")
    assert diagnosis.category == "gpu_hardware"
    assert diagnosis.culprit_nodes == [culprit]
    assert any("fallen off the bus" in line for line in diagnosis.evidence)
    assert diagnosis.rule_ids and diagnosis.catalog_version

    drain = next(
        r for r in records if r.kind == "effect_applied" and r.effect_id == f"drain-{culprit}"
    )
    assert drain.status == "applied"
    assert drain.commands[0][:3] == ["scontrol", "update", f"NodeName={culprit}"]
    assert "State=DRAIN" in drain.commands[0]
    assert drain.results[0].changed is True
    assert drain.results[0].after and "DRAIN" in drain.results[0].after
    assert drain.policy_version == "it-approve"
    assert drain.stage == "isolate"

    requeue = next(
        r for r in records if r.kind == "effect_applied" and r.effect_id == f"requeue-{job_id}"
    )
    assert any(c[:2] == ["scontrol", "requeuehold"] for c in requeue.commands)
    assert {r.kind for r in records} >= {"effect_planned", "reservation"}

    verification = next(r for r in records if r.kind == "verification")
    assert verification.status == "running"
    outcome = records[-1]
    assert outcome.status == "recovered" and outcome.stage == "done"
    assert job_id in outcome.detail

    # The control side: the CLI's mode change, with the update's identity.
    control = await collect(export(temporal_client, incident=control_workflow_id(cluster)))
    change = [r for r in control if r.kind == "mode_change" and r.who == "carol"]
    assert len(change) == 1
    assert change[0].detail == "mode monitor: maintenance"
    assert change[0].identity and change[0].unverified_identity is False
    assert change[0].mode == "monitor"
    reservations = [r for r in control if r.kind == "reservation"]
    assert {r.incident for r in reservations} == {incident}

    # The CLI writes the same records as JSON Lines.
    target = tmp_path / "audit.jsonl"
    code, _, err = await cli(
        audit_cli.app, ["export", "--incident", incident, "--output", str(target), *address]
    )
    assert code == 0, err
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [line["kind"] for line in lines] == kinds
    assert f"exported {len(lines)} records from 1 workflows" in err


async def test_export_errors_are_clean(temporal_server: DevServer) -> None:
    code, _, err = await cli(
        audit_cli.app, ["export", "--since", "yesterday", "--address", temporal_server.address]
    )
    assert code == 2
    assert "--since 'yesterday'" in err
    code, _, err = await cli(
        audit_cli.app,
        ["export", "--incident", "incident-nowhere-1-1", "--address", temporal_server.address],
    )
    assert code == 2
    assert "no workflow 'incident-nowhere-1-1'" in err
    code, _, err = await cli(incidents_cli.app, ["show", "nope", "--address", "127.0.0.1:1"])
    assert code == 2
    assert "cannot reach Temporal at 127.0.0.1:1" in err
