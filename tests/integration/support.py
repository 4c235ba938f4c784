"""Helpers for integration tests that drive the recovery loop against the Slurm lab."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import typer
from temporalio.client import Client
from typer.testing import CliRunner

from trainmedic.activities.control import ensure_control
from trainmedic.adapters.slurm import SlurmBackend
from trainmedic.config import Policy, Settings, parse_policy
from trainmedic.domain import Action, Outcome
from trainmedic.domain.hostlist import expand
from trainmedic.domain.incident import (
    EffectStatus,
    IncidentInput,
    IncidentResult,
    IncidentSignal,
)
from trainmedic.lab import Lab, faults
from trainmedic.lab.lab import parse_scontrol_records
from trainmedic.workers.controller import build_worker
from trainmedic.workflows.recovery import RecoveryWorkflow

T = TypeVar("T")
TASK_QUEUE = "trainmedic-it"


def wait_for(
    probe: Callable[[], T | None],
    what: str,
    timeout: float = 90.0,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll until probe returns something truthy; fail naming what never happened (and,
    with `explain`, what the world looked like then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            context = f"\n{explain()}" if explain else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{context}")
        time.sleep(0.3)


async def async_wait_for(probe: Callable[[], T | None], what: str, timeout: float = 90.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(probe)
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.3)


def job(lab: Lab, job_id: str) -> dict[str, str]:
    return parse_scontrol_records(lab.run_client(["scontrol", "-o", "show", "job", job_id]).stdout)[
        0
    ]


def node(lab: Lab, name: str) -> dict[str, str]:
    out = lab.run_client(["scontrol", "-o", "show", "node", name]).stdout
    return parse_scontrol_records(out)[0]


def running_on(lab: Lab, job_id: str) -> list[str] | None:
    info = job(lab, job_id)
    if info["JobState"] != "RUNNING":
        return None
    return expand(info["NodeList"])


def submit(lab: Lab, nodes: int = 2, *extra: str, body: str = "srun sleep 600") -> str:
    jobs = lab.layout.jobs
    jobs.mkdir(parents=True, exist_ok=True)
    script = jobs / f"train-{uuid.uuid4().hex[:6]}.sh"
    script.write_text(f"#!/bin/bash\n{body}\n")
    out = lab.run_client(
        [
            "sbatch",
            "--parsable",
            "-N",
            str(nodes),
            "-D",
            str(jobs),
            "-o",
            f"{jobs}/%j.out",
            *extra,
            str(script),
        ]
    ).stdout
    return out.strip().split(";")[0]


def submit_running(lab: Lab, nodes: int = 2, *extra: str) -> tuple[str, list[str]]:
    job_id = submit(lab, nodes, *extra)
    placed = wait_for(lambda: running_on(lab, job_id), f"job {job_id} to run")
    return job_id, placed


def unique_cluster(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


async def start_control(
    client: Client, cluster: str, policy_yaml: str, task_queue: str = TASK_QUEUE
) -> Policy:
    policy = parse_policy(policy_yaml)
    await ensure_control(client, cluster, policy, task_queue)
    return policy


async def start_incident(
    client: Client,
    cluster: str,
    job_id: str | None,
    signal: IncidentSignal,
    suffix: str = "1",
    task_queue: str = TASK_QUEUE,
) -> str:
    incident_id = f"incident-{cluster}-{job_id or signal.nodes[0]}-{suffix}"
    await client.start_workflow(
        RecoveryWorkflow.run,
        IncidentInput(cluster=cluster, job_id=job_id, nodes=signal.nodes, signal=signal),
        id=incident_id,
        task_queue=task_queue,
    )
    return incident_id


async def xid79_incident(
    client: Client, lab: Lab, cluster: str, policy_yaml: str, task_queue: str = TASK_QUEUE
) -> tuple[str, str, str]:
    """The cluster's control workflow on `policy_yaml`, a 2-node job running, and an
    incident for Xid 79 on its first node. Returns (incident id, job id, that node)."""
    await start_control(client, cluster, policy_yaml, task_queue)
    job_id, placed = submit_running(lab, 2)
    culprit = placed[0]
    incident = await start_incident(client, cluster, job_id, xid79(culprit), task_queue=task_queue)
    return incident, job_id, culprit


async def xid79_recovery(
    client: Client,
    lab: Lab,
    settings: Settings,
    backend: SlurmBackend,
    cluster: str,
    policy_yaml: str,
) -> tuple[str, str, str, IncidentResult]:
    """`xid79_incident` to its end, with a worker of `settings` on `backend` (on the
    settings' task queue). Returns (incident id, job id, culprit, result)."""
    queue = settings.temporal_task_queue
    async with build_worker(client, settings, Policy(), backend=backend):
        incident, job_id, culprit = await xid79_incident(client, lab, cluster, policy_yaml, queue)
        result = await result_of(client, incident)
    return incident, job_id, culprit, result


async def effect_awaiting_approval(client: Client, incident: str, timeout: float = 90.0) -> str:
    """The id of the effect the incident waits on, once it waits for an approval."""
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
    deadline = time.monotonic() + timeout
    while True:
        status = await handle.query(RecoveryWorkflow.status)
        waiting = [e for e in status.effects if e.status is EffectStatus.AWAITING_APPROVAL]
        if waiting:
            return waiting[0].id
        if time.monotonic() > deadline:
            pytest.fail(f"{incident} never waited for an approval")
        await asyncio.sleep(0.3)


async def cli(
    app: typer.Typer, args: list[str], env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run a typer app in a thread (it calls asyncio.run itself): (code, stdout, stderr)."""
    result = await asyncio.to_thread(CliRunner().invoke, app, args, env=env)
    return result.exit_code, result.stdout, result.stderr


def assert_drained_and_requeued_elsewhere(
    lab: Lab, incident: str, job_id: str, culprit: str, result: IncidentResult
) -> None:
    """Recovered in auto mode: the culprit drained (the reason names the incident), the
    job requeued once, excluding it, and running on two other nodes."""
    assert result.outcome is Outcome.RECOVERED, result.summary
    assert result.diagnosis is not None
    assert result.diagnosis.action is Action.DRAIN_AND_RESTART
    assert result.diagnosis.culprit_nodes == [culprit]
    assert [e.status for e in result.effects] == [EffectStatus.APPLIED, EffectStatus.APPLIED]
    drained = node(lab, culprit)
    assert "DRAIN" in drained["State"] and incident in drained["Reason"]
    now_on = running_on(lab, job_id)
    assert now_on and culprit not in now_on and len(now_on) == 2
    assert int(job(lab, job_id)["Restarts"]) == 1
    assert culprit in job(lab, job_id)["ExcNodeList"]


async def result_of(client: Client, incident_id: str, timeout: float = 180) -> IncidentResult:
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident_id)
    result = await asyncio.wait_for(handle.result(), timeout)
    await record_history(client, incident_id)
    return result


async def record_history(client: Client, workflow_id: str, name: str | None = None) -> None:
    """With TRAINMEDIC_RECORD_HISTORIES=DIR, keep histories for the replay tests.

    Files are named by `name` or else by the test's cluster prefix (auto, mon, appr, ...),
    so a rerun refreshes the same set: tests/replay/histories/README.md says how.
    """
    target = os.environ.get("TRAINMEDIC_RECORD_HISTORIES")
    if not target:
        return
    cluster = workflow_id.split("-")[1]
    folder = Path(target)
    folder.mkdir(parents=True, exist_ok=True)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    if name is None:
        name = cluster[:-6]  # unique_cluster adds six hex digits
        suffix = workflow_id.rsplit("-", 1)[1]
        name = f"{name}-{suffix}"
        control = await client.get_workflow_handle(f"control-{cluster}").fetch_history()
        (folder / f"control-{cluster[:-6]}.json").write_text(control.to_json())
    (folder / f"recovery-{name}.json").write_text(history.to_json())


def xid79(node_name: str) -> IncidentSignal:
    """What the node agent would report: the kernel's Xid 79 line on that node (GPU 3)."""
    return faults.xid79_signal(node_name, gpu=3, pid=20211)
