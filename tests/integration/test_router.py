"""Correlation end to end: epilog + poll + duplicate -> one RecoveryWorkflow; quarantine."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.worker import Worker

from tests.integration.support import (
    TASK_QUEUE,
    async_wait_for,
    start_control,
    submit,
    unique_cluster,
)
from trainmedic.activities.control import ControlOffenseLedger
from trainmedic.activities.quarantine import QuarantineActivities
from trainmedic.adapters.slurm import LocalRunner, SlurmCli
from trainmedic.config import Policy, Settings
from trainmedic.domain.incident import IncidentSignal
from trainmedic.lab import Lab, faults
from trainmedic.lab.agents import LabNodeHealthProbe
from trainmedic.lab.workload import nvml_state, prepare_nodes
from trainmedic.watchers.router import IncidentRouter, build_slurm_detection
from trainmedic.workflows.quarantine import NodeQuarantineWorkflow, ReleasePayload
from trainmedic.workflows.recovery import RecoveryWorkflow

MONITOR_POLICY = "version: it-monitor\nmode: {default: monitor}\n"
REPORT_CLI = [
    sys.executable,
    "-c",
    "import typer; from trainmedic.cli.report import register; app = typer.Typer(); "
    "register(app); app.callback()(lambda: None); app()",
    "report",
]

pytestmark = pytest.mark.integration


async def exists(client: Client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return False
    return True


async def test_epilog_poll_and_duplicate_make_one_incident(
    temporal_client: Client, controller: Worker, clean_lab: Lab, tmp_path: Path
) -> None:
    cluster = unique_cluster("rt")
    await start_control(temporal_client, cluster, MONITOR_POLICY)
    settings = Settings(
        cluster=cluster,
        temporal_task_queue=TASK_QUEUE,
        slurm_conf=clean_lab.slurm_conf,
        state_dir=tmp_path,
    )
    runner = LocalRunner(env=clean_lab.env())
    detection = build_slurm_detection(
        temporal_client, settings, SlurmCli(runner), runner=runner, interval=0.5
    )
    await detection.watcher.poll_once()
    stop = asyncio.Event()
    task = asyncio.create_task(detection.run(stop))
    try:
        job_id = submit(clean_lab, 1, body="sleep 2\nexit 3")
        incident = f"incident-{cluster}-{job_id}-1"
        # What Slurm's EpilogSlurmctld would run at the job's end.
        env = {
            **os.environ,
            "SLURM_JOB_ID": job_id,
            "SLURM_JOB_NODELIST": "gpu01",
            "SLURM_JOB_EXIT_CODE2": "3:0",
            "SLURM_RESTART_COUNT": "0",
            "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld",
            "TRAINMEDIC_STATE_DIR": str(tmp_path),
        }
        await async_wait_for(
            lambda: (
                "FAILED" in clean_lab.run_client(["scontrol", "-o", "show", "job", job_id]).stdout
            ),
            f"job {job_id} to fail",
            timeout=60,
        )
        done = await asyncio.to_thread(
            subprocess.run, REPORT_CLI, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        # A third report of the same failure, as the log watcher would send it.
        await detection.router.submit(
            IncidentSignal(source="log", kind="log_match", job_id=job_id, detail="exit 3")
        )
        handle = temporal_client.get_workflow_handle_for(RecoveryWorkflow.run, incident)

        async def sources() -> set[str]:
            try:
                status = await handle.query(RecoveryWorkflow.status)
            except RPCError:
                return set()
            return {s.source for s in status.signals}

        deadline = asyncio.get_running_loop().time() + 60
        while await sources() != {"slurm", "epilog", "log"}:
            assert asyncio.get_running_loop().time() < deadline, await sources()
            await asyncio.sleep(0.3)
        await asyncio.wait_for(handle.result(), 120)
        # A late duplicate after the incident closed opens nothing new.
        await detection.router.submit(
            IncidentSignal(source="epilog", kind="epilog", job_id=job_id, run=0)
        )
    finally:
        stop.set()
        await task
    assert not await exists(temporal_client, f"incident-{cluster}-{job_id}-2")
    count = 0
    async for _ in temporal_client.list_workflows(f"WorkflowId = '{incident}'"):
        count += 1
    assert count == 1
    description = await handle.describe()
    assert description.status == WorkflowExecutionStatus.COMPLETED


def drain(lab: Lab, node: str, reason: str) -> None:
    lab.run_client(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])


def node_state(lab: Lab, node: str) -> str:
    out = lab.run_client(["scontrol", "-o", "show", "node", node]).stdout
    return next(t for t in out.split() if t.startswith("State=")).removeprefix("State=")


async def quarantine_run(
    client: Client,
    lab: Lab,
    body: Callable[[IncidentRouter], object],
) -> None:
    """Quarantines on their own queue, checked by the lab's probe (the nodes' fake GPUs);
    the offense ledger is the cluster's ControlWorkflow on the session's controller."""
    cluster = unique_cluster("qt")
    queue = f"it-quarantine-{cluster}"
    prepare_nodes(lab)
    backend = SlurmCli(LocalRunner(env=lab.env()))
    activities = QuarantineActivities(
        backend,
        LabNodeHealthProbe(lambda n: nvml_state(lab, n)),
        ControlOffenseLedger(client, Policy(), TASK_QUEUE),
    )
    router = IncidentRouter(
        client,
        cluster,
        f"it-none-{cluster}",
        quarantine_task_queue=queue,
        quarantine_cooldown=timedelta(seconds=1),
    )
    async with Worker(
        client,
        task_queue=queue,
        workflows=[NodeQuarantineWorkflow],
        activities=[activities.assess, activities.check_health, activities.resume_node],
    ):
        await body(router)  # type: ignore[misc]


def node_down(node: str) -> IncidentSignal:
    return IncidentSignal(source="strigger", kind="node_down", nodes=[node])


async def test_quarantine_resumes_our_drain_and_leaves_an_admin_drain(
    temporal_client: Client, controller: Worker, clean_lab: Lab
) -> None:
    drain(clean_lab, "gpu03", "trainmedic incident-x-1-1: gpu_hardware: Xid 79")
    drain(clean_lab, "gpu04", "admin: bad fan")

    async def body(router: IncidentRouter) -> None:
        await router.submit(node_down("gpu03"))
        await router.submit(node_down("gpu04"))
        ours = temporal_client.get_workflow_handle_for(
            NodeQuarantineWorkflow.run, f"node-{router.cluster}-gpu03"
        )
        theirs = temporal_client.get_workflow_handle_for(
            NodeQuarantineWorkflow.run, f"node-{router.cluster}-gpu04"
        )
        resumed = await asyncio.wait_for(ours.result(), 60)
        left = await asyncio.wait_for(theirs.result(), 60)
        assert resumed.state == "resumed"
        assert resumed.checks[-1].healthy
        assert left.state == "left_alone"

    await quarantine_run(temporal_client, clean_lab, body)
    assert "DRAIN" not in node_state(clean_lab, "gpu03")
    assert "DRAIN" in node_state(clean_lab, "gpu04")


async def test_unhealthy_node_is_kept_out_until_released(
    temporal_client: Client, controller: Worker, clean_lab: Lab
) -> None:
    drain(clean_lab, "gpu02", "trainmedic incident-x-2-1: gpu_memory_ecc: ecc")
    prepare_nodes(clean_lab)
    # gpu02's GPU 1 has fallen off the bus: the health check fails.
    faults.update_nvml(clean_lab.root, "gpu02", 1, faults.Fault.XID79)

    async def body(router: IncidentRouter) -> None:
        await router.submit(node_down("gpu02"))
        handle = temporal_client.get_workflow_handle_for(
            NodeQuarantineWorkflow.run, f"node-{router.cluster}-gpu02"
        )

        async def state() -> str:
            try:
                return (await handle.query(NodeQuarantineWorkflow.status)).state
            except RPCError:
                return "not started"

        deadline = asyncio.get_running_loop().time() + 60
        while await state() != "rechecking":
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.3)
        assert "DRAIN" in node_state(clean_lab, "gpu02")
        # A release that names nobody (as the UI sends it without a payload) is refused.
        await handle.signal(NodeQuarantineWorkflow.release, ReleasePayload(by=" "))
        status = await handle.query(NodeQuarantineWorkflow.status)
        assert status.state == "rechecking" and status.released_by is None
        assert status.ignored and "say who releases" in status.ignored[0]
        await handle.signal(NodeQuarantineWorkflow.release, ReleasePayload(by="ops", comment="ok"))
        # After the release the next check still fails, but the operator's word counts.
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.state == "resumed"
        assert result.released_by is not None and result.released_by.by == "ops"
        assert not result.checks[-1].healthy

    try:
        await quarantine_run(temporal_client, clean_lab, body)
    finally:
        faults.write_json_atomic(
            nvml_state(clean_lab, "gpu02"), faults.default_nvml_state("gpu02", 8)
        )
    assert "DRAIN" not in node_state(clean_lab, "gpu02")
