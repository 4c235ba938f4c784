"""The embedded Temporal dev server: reuse, refusal of foreign ports, and durability."""

from __future__ import annotations

import asyncio
import socket
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from trainmedic import procs
from trainmedic.errors import ServiceError
from trainmedic.temporal.client import connect_plain, missing_search_attributes
from trainmedic.temporal.devserver import DevServer

pytestmark = pytest.mark.integration


@workflow.defn(sandboxed=False)
class WaitForGoWorkflow:
    """Waits for one signal; stands in for an incident waiting on an approval."""

    def __init__(self) -> None:
        self._go: str | None = None

    @workflow.signal
    def go(self, who: str) -> None:
        self._go = who

    @workflow.run
    async def run(self, label: str) -> str:
        await workflow.wait_condition(lambda: self._go is not None)
        return f"{label} approved by {self._go}"


async def test_search_attributes_registered(temporal_client: Client) -> None:
    assert await missing_search_attributes(temporal_client) == []


def test_start_reuses_running_server(temporal_server: DevServer) -> None:
    pid = temporal_server.pid()
    again = temporal_server.start()
    assert again.pid == pid and again.serving


def test_refuses_port_held_by_someone_else(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        server = DevServer(tmp_path, port=port, ui_port=procs.free_port())
        with pytest.raises(ServiceError, match=f"port {port}.*held by"):
            server.start(timeout_s=5)
        assert server.pid() is None


async def test_waiting_workflow_survives_kill_9(tmp_path: Path) -> None:
    server = DevServer(tmp_path / "durable", port=procs.free_port(), ui_port=procs.free_port())
    server.start(timeout_s=90)
    try:
        client = await connect_plain(server.address)
        workflow_id = f"durable-{uuid.uuid4().hex[:8]}"
        handle = await client.start_workflow(
            WaitForGoWorkflow.run, "drain gpu02", id=workflow_id, task_queue="durable"
        )
        async with Worker(client, task_queue="durable", workflows=[WaitForGoWorkflow]):
            # Let the first workflow task complete so the wait is in the history.
            for _ in range(100):
                history = [event async for event in handle.fetch_history_events()]
                if len(history) >= 4:
                    break
                await asyncio.sleep(0.1)

        old_pid = server.pid()
        server.kill_hard()
        assert server.pid() is None
        server.start(timeout_s=90)
        assert server.pid() != old_pid

        client = await connect_plain(server.address)
        handle = client.get_workflow_handle(workflow_id)
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        async with Worker(client, task_queue="durable", workflows=[WaitForGoWorkflow]):
            await handle.signal(WaitForGoWorkflow.go, "alice")
            result = await asyncio.wait_for(handle.result(), timeout=timedelta(seconds=60).seconds)
        assert result == "drain gpu02 approved by alice"
    finally:
        server.stop()
    assert server.pid() is None
