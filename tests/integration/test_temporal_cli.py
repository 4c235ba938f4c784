"""The plain `temporal` CLI can start and cancel incidents (docs/architecture.md "Contracts")."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.integration.support import (
    TASK_QUEUE,
    node,
    result_of,
    running_on,
    start_control,
    submit_running,
    unique_cluster,
    xid79,
)
from trainmedic.domain import Outcome
from trainmedic.lab import Lab
from trainmedic.temporal.devserver import DevServer, find_temporal_cli
from trainmedic.workflows.recovery import RecoveryWorkflow

pytestmark = pytest.mark.integration


def temporal(server: DevServer, *args: str) -> str:
    argv = [str(find_temporal_cli()), *args, "--address", server.address]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_start_from_the_temporal_cli(
    clean_lab: Lab, temporal_server: DevServer, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("cli")
    await start_control(temporal_client, cluster, "mode: {default: auto}\n")
    job_id, placed = submit_running(clean_lab, 2)
    incident = f"incident-{cluster}-{job_id}-1"
    payload = {
        "cluster": cluster,
        "job_id": job_id,
        "nodes": [placed[0]],
        "signal": json.loads(xid79(placed[0]).model_dump_json()),
    }
    temporal(
        temporal_server,
        "workflow",
        "start",
        "--type",
        "RecoveryWorkflow",
        "--task-queue",
        TASK_QUEUE,
        "--workflow-id",
        incident,
        "--input",
        json.dumps(payload),
    )
    result = await result_of(temporal_client, incident)
    assert result.outcome is Outcome.RECOVERED, result.summary
    assert placed[0] not in (running_on(clean_lab, job_id) or [placed[0]])


async def test_cancel_from_the_temporal_cli_leaves_slurm_consistent(
    clean_lab: Lab, temporal_server: DevServer, temporal_client: Client, controller: Worker
) -> None:
    cluster = unique_cluster("cnl")
    await start_control(
        temporal_client, cluster, "mode: {default: approve}\napproval: {timeout: 10m}\n"
    )
    job_id, placed = submit_running(clean_lab, 2)
    incident = f"incident-{cluster}-{job_id}-1"
    temporal(
        temporal_server,
        "workflow",
        "start",
        "--type",
        "RecoveryWorkflow",
        "--task-queue",
        TASK_QUEUE,
        "--workflow-id",
        incident,
        "--input",
        json.dumps(
            {
                "cluster": cluster,
                "job_id": job_id,
                "nodes": [placed[1]],
                "signal": json.loads(xid79(placed[1]).model_dump_json()),
            }
        ),
    )
    handle = temporal_client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
    for _ in range(200):
        if "waiting for approval" in (await handle.query(RecoveryWorkflow.status)).details:
            break
        await asyncio.sleep(0.2)
    temporal(temporal_server, "workflow", "cancel", "--workflow-id", incident)

    result = await result_of(temporal_client, incident)
    assert result.outcome is Outcome.CANCELLED
    assert "no effect was applied" in result.summary
    assert f"job {job_id} RUNNING" in result.summary
    assert f"node {placed[1]} " in result.summary
    assert "DRAIN" not in node(clean_lab, placed[1])["State"]
    assert running_on(clean_lab, job_id) == placed
