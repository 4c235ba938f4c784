"""`trainmedic setup temporal` on a namespace that starts without trainmedic's search
attributes, as a production Temporal does: the worker refuses to start, setup registers
them (and says so again, idempotently), then the worker starts. All as real processes
against a dev server of its own, started without `--search-attribute`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.service import RPCError

from trainmedic import procs
from trainmedic.temporal.client import INDEXED_TYPES, connect_plain, missing_search_attributes
from trainmedic.temporal.devserver import DevServer
from trainmedic.temporal.search_attributes import REQUIRED
from trainmedic.workflows.control import ControlWorkflow, control_workflow_id

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    server = DevServer(
        tmp_path_factory.mktemp("bare-temporal"),
        port=procs.free_port(),
        ui_port=procs.free_port(),
        search_attributes=False,
    )
    server.start(timeout_s=90)
    yield server
    server.stop()


def trainmedic(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainmedic.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def cli_env(tmp_path: Path, server: DevServer, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEDIC_")}
    env.update(
        {
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "COLUMNS": "400",
            "TRAINMEDIC_TEMPORAL_ADDRESS": server.address,
            "TRAINMEDIC_CLUSTER": f"setup-{uuid.uuid4().hex[:6]}",
            "TRAINMEDIC_TEMPORAL_TASK_QUEUE": f"setup-{uuid.uuid4().hex[:6]}",
        }
    )
    env.update(extra)
    return env


async def test_worker_refuses_then_setup_registers_then_the_worker_starts(
    bare_server: DevServer, tmp_path: Path
) -> None:
    env = cli_env(tmp_path, bare_server)
    client = await connect_plain(bare_server.address)
    assert len(await missing_search_attributes(client)) == len(REQUIRED)

    refused = await asyncio.to_thread(trainmedic, "worker", "--no-detect", env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    said = " ".join(refused.stderr.split())
    assert "lacks trainmedic's search attributes" in said and "TmNodes (KeywordList)" in said
    assert "trainmedic setup temporal" in said

    first = await asyncio.to_thread(trainmedic, "setup", "temporal", env=env)
    assert first.returncode == 0, first.stderr
    assert f"registered {len(REQUIRED)} search attribute(s) on namespace 'default'" in first.stdout
    assert "added" in first.stdout and "TmNodes (KeywordList)" in first.stdout
    assert await missing_search_attributes(client) == []

    again = await asyncio.to_thread(trainmedic, "setup", "temporal", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("  already present  Tm") == len(REQUIRED)
    assert "nothing to do" in again.stdout

    # Now the worker starts: it serves the cluster's ControlWorkflow (started at worker
    # start-up and answered by it), then stops cleanly on Ctrl-C.
    worker = subprocess.Popen(
        [sys.executable, "-m", "trainmedic.cli.main", "worker", "--no-detect"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        handle = client.get_workflow_handle_for(
            ControlWorkflow.run, control_workflow_id(env["TRAINMEDIC_CLUSTER"])
        )
        deadline = time.monotonic() + 60
        state = None
        while state is None and time.monotonic() < deadline:
            assert worker.poll() is None, worker.communicate()[0]
            try:
                state = await handle.query(
                    ControlWorkflow.current, rpc_timeout=timedelta(seconds=5)
                )
            except RPCError:
                await asyncio.sleep(0.5)
        assert state is not None, "the worker never served the ControlWorkflow"
    finally:
        worker.send_signal(signal.SIGINT)
        output, _ = await asyncio.to_thread(worker.communicate, timeout=60)
    assert worker.returncode == 0, output
    assert "controller worker stopped" in output


async def test_setup_refuses_an_attribute_of_another_type(
    bare_server: DevServer, tmp_path: Path
) -> None:
    namespace = f"conflict-{uuid.uuid4().hex[:6]}"
    client = await connect_plain(bare_server.address)
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    # The new namespace reaches the server's cache within a few seconds.
    deadline = time.monotonic() + 30
    while True:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=namespace, search_attributes={"TmOutcome": INDEXED_TYPES["Text"]}
                )
            )
            break
        except RPCError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    env = cli_env(tmp_path, bare_server, TRAINMEDIC_TEMPORAL_NAMESPACE=namespace)
    result = await asyncio.to_thread(trainmedic, "setup", "temporal", env=env)
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stderr
    said = " ".join(result.stderr.split())
    assert "TmOutcome is Text, trainmedic needs Keyword" in said
    assert f"namespace '{namespace}'" in said
    # Nothing half-done: the other attributes were not added either.
    other = await connect_plain(bare_server.address, namespace=namespace)
    assert len(await missing_search_attributes(other)) == len(REQUIRED)


async def test_setup_names_a_namespace_that_does_not_exist(
    bare_server: DevServer, tmp_path: Path
) -> None:
    env = cli_env(tmp_path, bare_server, TRAINMEDIC_TEMPORAL_NAMESPACE="no-such-namespace")
    result = await asyncio.to_thread(trainmedic, "setup", "temporal", env=env)
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stderr
    said = " ".join(result.stderr.split())
    assert "namespace 'no-such-namespace' does not exist" in said
