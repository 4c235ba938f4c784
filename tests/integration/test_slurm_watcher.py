"""The Slurm watcher against the real lab: a failed job and a dead node are noticed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from tests.integration.support import async_wait_for, running_on, submit, unique_cluster, wait_for
from trainmedic.activities.control import ControlOffenseLedger
from trainmedic.activities.quarantine import QuarantineActivities
from trainmedic.adapters.slurm import LocalRunner, SlurmCli
from trainmedic.config import Policy
from trainmedic.domain.incident import IncidentSignal
from trainmedic.lab import Lab
from trainmedic.lab.agents import LabNodeHealthProbe
from trainmedic.lab.workload import nvml_state
from trainmedic.watchers.base import ListSink
from trainmedic.watchers.router import IncidentRouter
from trainmedic.watchers.slurm import JsonSource, SlurmWatcher
from trainmedic.workflows.quarantine import NodeQuarantineWorkflow


@asynccontextmanager
async def watching(lab: Lab, sink: object) -> AsyncIterator[SlurmWatcher]:
    runner = LocalRunner(env=lab.env())
    watcher = SlurmWatcher(
        SlurmCli(runner),
        sink,
        0.5,
        cluster="it",
        source=JsonSource(runner),  # type: ignore[arg-type]
    )
    await watcher.poll_once()  # the first view, before anything happens
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        yield watcher
    finally:
        stop.set()
        await task


pytestmark = pytest.mark.integration


def find(sink: ListSink, kind: str, job_id: str | None) -> list[IncidentSignal]:
    return [s for s in sink.signals if s.kind == kind and s.job_id == job_id]


async def test_failed_job_is_noticed(clean_lab: Lab) -> None:
    sink = ListSink()
    async with watching(clean_lab, sink):
        job_id = submit(clean_lab, 1, body="sleep 2\nexit 3")
        found = await async_wait_for(
            lambda: find(sink, "job_failed", job_id), f"job_failed for {job_id}", timeout=60
        )
    assert len(found) == 1
    signal = found[0]
    assert signal.run == 0
    assert signal.nodes
    assert "exit_code=3" in signal.evidence[0].text
    assert [s.kind for s in sink.signals if s.job_id == job_id] == ["job_failed"]


class Tee:
    def __init__(self, *sinks: object) -> None:
        self.sinks = sinks

    async def submit(self, signal: IncidentSignal) -> None:
        for sink in self.sinks:
            await sink.submit(signal)  # type: ignore[attr-defined]


async def test_node_death_gives_a_signal_per_job_and_one_quarantine(
    clean_lab: Lab, temporal_client: Client
) -> None:
    node = "gpu02"
    jobs = [submit(clean_lab, 1, "-w", node) for _ in range(2)]
    for job_id in jobs:
        wait_for(lambda job_id=job_id: running_on(clean_lab, job_id), f"job {job_id} to run")
    cluster = unique_cluster("sw")
    queue = f"it-quarantine-{cluster}"
    # Recovery incidents go to a queue without workers: this test counts them only.
    router = IncidentRouter(
        temporal_client,
        cluster,
        f"it-none-{cluster}",
        storm_threshold=10,
        quarantine_task_queue=queue,
        quarantine_cooldown=timedelta(hours=1),
    )
    sink = ListSink()
    backend = SlurmCli(LocalRunner(env=clean_lab.env()))
    # The quarantine cools down for an hour: its activities never run here.
    activities = QuarantineActivities(
        backend,
        LabNodeHealthProbe(lambda n: nvml_state(clean_lab, n)),
        ControlOffenseLedger(temporal_client, Policy(), queue),
    )
    worker = Worker(
        temporal_client,
        task_queue=queue,
        workflows=[NodeQuarantineWorkflow],
        activities=[activities.assess, activities.check_health, activities.resume_node],
    )
    started: list[str] = []
    try:
        async with worker, watching(clean_lab, Tee(sink, router)):
            clean_lab.kill_node(node)
            await async_wait_for(lambda: find(sink, "node_down", None), f"{node} down", timeout=120)
            await asyncio.sleep(1)  # let the same cycle's other signals through
            started = list(router.started)
            per_job = {s.job_id: s.run for s in sink.signals if s.kind == "node_down" and s.job_id}
            assert per_job == dict.fromkeys(jobs, 0)
            assert len(find(sink, "node_down", None)) == 1
            assert sorted(set(started)) == sorted(
                [f"incident-{cluster}-{j}-1" for j in jobs] + [f"node-{cluster}-{node}"]
            )
            quarantine = temporal_client.get_workflow_handle_for(
                NodeQuarantineWorkflow.run, f"node-{cluster}-{node}"
            )
            status = await quarantine.query(NodeQuarantineWorkflow.status)
            assert status.state == "cooling_down"
            assert [s.kind for s in status.signals] == ["node_down"]
    finally:
        for workflow_id in set(started):
            handle = temporal_client.get_workflow_handle(workflow_id)
            described = await handle.describe()
            if described.status == WorkflowExecutionStatus.RUNNING:
                await handle.terminate("test over")
