"""Two controllers for availability on the lab: both run workers on one task queue, one
runs detection under the lease; killing it hands detection over, and a job that failed
while nobody watched is still reported, once."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import timedelta

import pytest
from temporalio.client import Client

from tests.integration.support import job, submit
from trainmedic.config import Policy, Settings
from trainmedic.lab import Lab
from trainmedic.temporal.client import connect
from trainmedic.workers.controller import run_controller
from trainmedic.workflows.lease import LeaseWorkflow, lease_workflow_id

pytestmark = pytest.mark.integration

TTL = timedelta(seconds=8)


@pytest.mark.timeout(300)
async def test_killing_the_leader_hands_detection_over_and_loses_no_failure(
    clean_lab: Lab, temporal_client: Client, controller_settings: Settings
) -> None:
    cluster = f"ha{uuid.uuid4().hex[:6]}"
    base = controller_settings.model_copy(
        update={
            "cluster": cluster,
            "temporal_task_queue": f"ha-{cluster}",
            "lease_ttl": TTL,
        }
    )
    lease = temporal_client.get_workflow_handle_for(LeaseWorkflow.run, lease_workflow_id(cluster))

    async def holder() -> str | None:
        with contextlib.suppress(Exception):
            return (await lease.query(LeaseWorkflow.current)).holder
        return None

    stops = {name: asyncio.Event() for name in ("ctl-a", "ctl-b")}
    # Two controllers are two processes with a connection each (the SDK allows one worker
    # per task queue and client).
    clients = {
        "ctl-a": temporal_client,
        "ctl-b": await connect(controller_settings),
    }

    def start(name: str) -> asyncio.Task[None]:
        settings = base.model_copy(update={"controller_id": name})
        return asyncio.create_task(
            run_controller(clients[name], settings, Policy(), stops[name], lab=clean_lab)
        )

    leader = start("ctl-a")
    standby = start("ctl-b")
    try:
        first = None
        for _ in range(300):
            first = await holder()
            if first:
                break
            for task in (leader, standby):
                if task.done():
                    task.result()  # a controller that died says why
            await asyncio.sleep(0.2)
        assert first in ("ctl-a", "ctl-b")
        tasks = {"ctl-a": leader, "ctl-b": standby}
        other = "ctl-b" if first == "ctl-a" else "ctl-a"

        # A job that fails a few seconds from now, while nobody will be watching.
        job_id = submit(clean_lab, 1, body="sleep 4; exit 3")
        for _ in range(200):
            if job(clean_lab, job_id).get("JobState") == "RUNNING":
                break
            await asyncio.sleep(0.2)
        # The leader dies: its task is cancelled, nothing is released.
        tasks[first].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[first]

        for _ in range(300):
            if await holder() == other:
                break
            await asyncio.sleep(0.2)
        assert await holder() == other

        prefix = f"incident-{cluster}-{job_id}-"
        found: list[str] = []
        for _ in range(300):
            found = [
                w.id
                async for w in temporal_client.list_workflows(
                    f'WorkflowType = "RecoveryWorkflow" AND TmCluster = "{cluster}"'
                )
                if w.id.startswith(prefix)
            ]
            if found:
                break
            await asyncio.sleep(0.3)
        assert found == [f"{prefix}1"], found
        state = await lease.query(LeaseWorkflow.current)
        assert [(h.holder, h.why) for h in state.handovers] == [
            (first, "first"),
            (other, "expired"),
        ]
    finally:
        for event in stops.values():
            event.set()
        for task in (leader, standby):
            if not task.done():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 60)
