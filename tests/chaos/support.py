"""What the chaos scenarios share: a controller per scenario, slurmctld's own record of
effects, and waiting without blocking the controller's loops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client

from tests.integration.support import async_wait_for, running_on, start_control, unique_cluster
from trainmedic.config import Settings
from trainmedic.domain.control import ControlState
from trainmedic.domain.incident import IncidentResult
from trainmedic.lab import Lab, faults
from trainmedic.lab.agents import in_process_agents
from trainmedic.workers.controller import slurm_backend
from trainmedic.workers.detection import Detection, build_detection
from trainmedic.workflows.control import ControlWorkflow, control_workflow_id
from trainmedic.workflows.recovery import RecoveryWorkflow

AUTO = (
    "version: chaos\nmode: {default: auto}\n"
    "rails: {max_isolated_fraction: 0.25, max_drains_per_hour: 10, restart_budget: 2}\n"
    "detect: {settle: 1s}\n"
    "verify: {timeout: 60s, poll_interval: 1s}\n"
)
CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "real" / "benign"


class SlurmctldLog:
    """slurmctld's own account of what was done, from the moment of construction."""

    def __init__(self, lab: Lab) -> None:
        self.path = lab.layout.slurmctld_log()
        self.offset = self.path.stat().st_size

    def lines(self) -> list[str]:
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            return handle.read().decode("utf-8", "replace").splitlines()

    def drains(self, node_name: str) -> int:
        """Drains trainmedic set on the node (its reason names trainmedic)."""
        return sum(
            1
            for line in self.lines()
            if f"node {node_name} reason set to" in line and "trainmedic" in line
        )

    def requeues(self, job_id: str) -> int:
        return sum(1 for line in self.lines() if f"Requeuing JobId={job_id}" in line)


@asynccontextmanager
async def controller_for(
    lab: Lab, client: Client, settings: Settings, policy: str = AUTO, prefix: str = "chaos"
) -> AsyncIterator[Detection]:
    """The controller's detection side for a cluster of its own (the worker is the
    session's `controller`), stopped, with its node quarantines, at the end."""
    cluster = unique_cluster(prefix)
    settings = settings.model_copy(update={"cluster": cluster})
    await start_control(client, cluster, policy)
    built = build_detection(
        client,
        settings,
        slurm_backend(settings),
        interval=1.0,
        hang_after=timedelta(minutes=5),
        agents=in_process_agents(lab),
        # Quarantines would resume drained nodes in the middle of later tests.
        quarantine_cooldown=timedelta(hours=1),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(built.run(stop))
    try:
        yield built
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        for workflow_id in set(built.router.started):
            if workflow_id.startswith("node-"):
                await client.get_workflow_handle(workflow_id).terminate("chaos test over")


def incidents(detection: Detection, job_id: str) -> list[str]:
    """The job's incidents, in run order."""
    mine = {i for i in detection.router.started if i.startswith("incident-") and f"-{job_id}-" in i}
    return sorted(mine, key=lambda i: int(i.rsplit("-", 1)[1]))


async def wait_incidents(
    detection: Detection, job_id: str, count: int, timeout: float = 120
) -> list[str]:
    return await async_wait_for(
        lambda: (
            incidents(detection, job_id) if len(incidents(detection, job_id)) >= count else None
        ),
        f"{count} incident(s) for job {job_id}",
        timeout=timeout,
    )


async def result(client: Client, incident_id: str, timeout: float = 180) -> IncidentResult:
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident_id)
    return await asyncio.wait_for(handle.result(), timeout)


async def control_state(client: Client, detection: Detection) -> ControlState:
    handle = client.get_workflow_handle_for(
        ControlWorkflow.run, control_workflow_id(detection.router.cluster)
    )
    return await handle.query(ControlWorkflow.current)


def xid79_on(lab: Lab, node_name: str) -> None:
    """What the kernel of `node_name` prints when a GPU falls off the bus."""
    faults.append_kernel(
        lab.root, node_name, faults.kernel_lines(faults.Fault.XID79, pid=4242, node=node_name)
    )


async def running(lab: Lab, job_id: str, detection: Detection | None = None) -> list[str]:
    """Wait (without blocking the controller's loops) until the job runs, and until the
    Slurm watcher has seen it there, as a controller that has been up a while has."""
    placed = await async_wait_for(lambda: running_on(lab, job_id), f"job {job_id} to run")
    if detection is not None:
        watcher = detection.slurm.watcher

        def seen() -> bool | None:
            view = watcher.view
            seen_job = view.jobs.get(job_id) if view else None
            return True if seen_job is not None and seen_job.state == "RUNNING" else None

        await async_wait_for(seen, f"the watcher to see job {job_id} run")
    return placed
