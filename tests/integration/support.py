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
from temporalio.client import Client

from trainmedic.activities.control import ensure_control
from trainmedic.config import Policy, parse_policy
from trainmedic.domain import Evidence, EvidenceSource
from trainmedic.domain.hostlist import expand
from trainmedic.domain.incident import IncidentInput, IncidentResult, IncidentSignal
from trainmedic.lab import Lab
from trainmedic.lab.lab import parse_scontrol_records
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


def xid79(node_name: str) -> IncidentSignal:
    """What the node agent would report: the kernel's Xid 79 line on that node."""
    return IncidentSignal(
        source="nvml",
        kind="xid",
        nodes=[node_name],
        detail="Xid 79 on GPU 3",
        evidence=[
            Evidence(
                source=EvidenceSource.KERNEL,
                node=node_name,
                gpu=3,
                text=(
                    "NVRM: Xid (PCI:0000:3b:00): 79, pid=20211, name=python, "
                    "GPU has fallen off the bus."
                ),
            )
        ],
    )


def unique_cluster(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


async def start_control(client: Client, cluster: str, policy_yaml: str) -> Policy:
    policy = parse_policy(policy_yaml)
    await ensure_control(client, cluster, policy, TASK_QUEUE)
    return policy


async def start_incident(
    client: Client,
    cluster: str,
    job_id: str | None,
    signal: IncidentSignal,
    suffix: str = "1",
) -> str:
    incident_id = f"incident-{cluster}-{job_id or signal.nodes[0]}-{suffix}"
    await client.start_workflow(
        RecoveryWorkflow.run,
        IncidentInput(cluster=cluster, job_id=job_id, nodes=signal.nodes, signal=signal),
        id=incident_id,
        task_queue=TASK_QUEUE,
    )
    return incident_id


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
