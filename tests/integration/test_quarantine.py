"""Quarantine end to end: the real dev server, the real Slurm lab, the `trainmedic` CLI
as an operator runs it (real processes).

- an Xid 79 injected on a node: drained by its incident, fails its health check while
  the fault is present, back in service once it is cleared;
- an operator-drained node stays drained;
- an unreachable agent keeps the node out, until a person releases it;
- a repeat offender stays out until a person releases it (`trainmedic nodes release`),
  and `trainmedic nodes [--json]` says why, since when and what happens next.

With TRAINMEDIC_RECORD_HISTORIES=DIR these tests keep the quarantine histories for the
replay test (tests/replay/histories/quarantine-*.json).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from tests.integration.support import (
    TASK_QUEUE,
    node,
    result_of,
    start_control,
    start_incident,
    submit_running,
    unique_cluster,
    xid79,
)
from trainmedic import procs
from trainmedic.activities.control import ControlOffenseLedger
from trainmedic.activities.quarantine import QuarantineActivities
from trainmedic.adapters.slurm import LocalRunner, SlurmCli
from trainmedic.config import Policy
from trainmedic.domain import Outcome
from trainmedic.domain.incident import IncidentSignal
from trainmedic.health.probe import HttpNodeHealthProbe, NodeHealthProbe
from trainmedic.lab import Lab, faults
from trainmedic.lab.agents import LabNodeHealthProbe
from trainmedic.lab.workload import nvml_state, prepare_nodes
from trainmedic.temporal.devserver import DevServer
from trainmedic.watchers.router import IncidentRouter
from trainmedic.workflows.quarantine import NodeQuarantineWorkflow, QuarantineStatus

pytestmark = pytest.mark.integration

AUTO = (
    "version: it-quarantine\nmode: {default: auto}\n"
    "quarantine: {recheck_after: 2s, recheck_max_interval: 2s, recheck_limit: 100,"
    " repeat_offender_incidents: 2, repeat_offender_window: 1d}\n"
)
Handle = WorkflowHandle[NodeQuarantineWorkflow, QuarantineStatus]


async def keep_history(
    client: Client, workflow_id: str, name: str, kind: str = "quarantine"
) -> None:
    """With TRAINMEDIC_RECORD_HISTORIES=DIR, keep `<kind>-<name>.json` for replay."""
    target = os.environ.get("TRAINMEDIC_RECORD_HISTORIES")
    if not target:
        return
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    folder = Path(target)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{kind}-{name}.json").write_text(history.to_json())


def drain(lab: Lab, name: str, reason: str) -> None:
    lab.run_client(["scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}"])


def state_of(lab: Lab, name: str) -> str:
    return node(lab, name)["State"]


def healthy_gpus(lab: Lab, name: str) -> None:
    faults.write_json_atomic(nvml_state(lab, name), faults.default_nvml_state(name, 8))


@asynccontextmanager
async def quarantines(
    client: Client, lab: Lab, cluster: str, probe: NodeHealthProbe | None = None
) -> AsyncIterator[IncidentRouter]:
    """A worker for the cluster's quarantines (on its own queue, with the given probe;
    the lab's by default) and a router that opens them; the ControlWorkflow (the
    offense ledger) runs on the session's controller."""
    prepare_nodes(lab)
    queue = f"it-quarantine-{cluster}"
    backend = SlurmCli(LocalRunner(env=lab.env()))
    activities = QuarantineActivities(
        backend,
        probe or LabNodeHealthProbe(lambda n: nvml_state(lab, n)),
        ControlOffenseLedger(client, Policy(), TASK_QUEUE),
    )
    router = IncidentRouter(
        client,
        cluster,
        TASK_QUEUE,
        quarantine_task_queue=queue,
        quarantine_cooldown=timedelta(seconds=1),
    )
    async with Worker(
        client,
        task_queue=queue,
        workflows=[NodeQuarantineWorkflow],
        activities=[activities.assess, activities.check_health, activities.resume_node],
    ):
        yield router


def handle_of(client: Client, cluster: str, name: str) -> Handle:
    return client.get_workflow_handle_for(NodeQuarantineWorkflow.run, f"node-{cluster}-{name}")


async def reach(
    handle: Handle,
    check: Callable[[QuarantineStatus], bool],
    what: str,
    timeout: float = 90,
) -> QuarantineStatus:
    deadline = asyncio.get_running_loop().time() + timeout
    status = None
    while True:
        try:
            status = await handle.query(NodeQuarantineWorkflow.status)
            if check(status):
                return status
        except Exception as error:  # not started yet
            status = status or error  # type: ignore[assignment]
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}; last: {status}")
        await asyncio.sleep(0.3)


def cli_env(server: DevServer, cluster: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEDIC_")}
    env.update(
        {
            "TRAINMEDIC_TEMPORAL_ADDRESS": server.address,
            "TRAINMEDIC_CLUSTER": cluster,
            "COLUMNS": "200",
        }
    )
    return env


async def trainmedic(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "trainmedic.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def node_report(name: str, kind: str = "node_down") -> IncidentSignal:
    return IncidentSignal(source="strigger", kind=kind, nodes=[name], detail=f"{name} {kind}")


# ----------------------------------------------------------------------------- the lab


async def test_xid79_node_is_drained_kept_out_while_broken_and_back_once_cleared(
    temporal_client: Client, controller: Worker, clean_lab: Lab
) -> None:
    cluster = unique_cluster("qxid")
    await start_control(temporal_client, cluster, AUTO)
    job_id, placed = submit_running(clean_lab, 2)
    culprit = placed[0]
    async with quarantines(temporal_client, clean_lab, cluster) as router:
        try:
            # The fault, as `trainmedic lab inject xid79` leaves the node's GPUs: GPU 3
            # fallen off the bus, the driver asking for a reboot.
            faults.update_nvml(clean_lab.root, culprit, 3, faults.Fault.XID79)
            incident = await start_incident(temporal_client, cluster, job_id, xid79(culprit))
            result = await result_of(temporal_client, incident)
            assert result.outcome is Outcome.RECOVERED, result.summary
            assert "DRAIN" in state_of(clean_lab, culprit)
            # The node agent's report opens the node's quarantine (here after the drain:
            # the lab's one-second cool-down would otherwise end before it).
            await router.submit(xid79(culprit))

            handle = handle_of(temporal_client, cluster, culprit)
            status = await reach(
                handle,
                lambda s: s.state == "rechecking" and s.failed_checks >= 2,
                "two failed health checks",
            )
            failed = {c.name for c in status.checks[-1].failed}
            assert failed == {"gpu_count", "recovery_action"}, status.checks[-1].detail
            assert "gpu 3 lost (fallen off the bus)" in status.details
            assert status.cause is not None and status.cause.incident_id == incident
            assert status.cause.category == "gpu_hardware"
            assert "DRAIN" in state_of(clean_lab, culprit)

            healthy_gpus(clean_lab, culprit)  # the node was rebooted: the fault is gone
            final = await asyncio.wait_for(handle.result(), 60)
        finally:
            healthy_gpus(clean_lab, culprit)
    assert final.state == "resumed", final.details
    assert final.checks[-1].healthy and final.checks[-1].source == "lab"
    assert "DRAIN" not in state_of(clean_lab, culprit)
    await keep_history(temporal_client, handle.id, "xid79")


async def test_operator_drained_node_stays_drained(
    temporal_client: Client, controller: Worker, clean_lab: Lab
) -> None:
    cluster = unique_cluster("qadm")
    await start_control(temporal_client, cluster, AUTO)
    drain(clean_lab, "gpu04", "admin: bad fan")
    async with quarantines(temporal_client, clean_lab, cluster) as router:
        await router.submit(node_report("gpu04"))
        handle = handle_of(temporal_client, cluster, "gpu04")
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.state == "left_alone"
    assert "not trainmedic's drain" in result.details and result.checks == []
    assert "DRAIN" in state_of(clean_lab, "gpu04")
    await keep_history(temporal_client, handle.id, "admin")


async def test_unreachable_agent_keeps_the_node_out_until_a_person_releases_it(
    temporal_client: Client, controller: Worker, clean_lab: Lab, temporal_server: DevServer
) -> None:
    cluster = unique_cluster("qunr")
    await start_control(temporal_client, cluster, AUTO)
    drain(clean_lab, "gpu03", "trainmedic incident-x-3-1: gpu_hardware: Xid 79 on gpu03")
    # Nobody listens there: the node's agent is down.
    probe = HttpNodeHealthProbe(
        f"http://127.0.0.1:{procs.free_port()}/health?node={{node}}", b"k" * 32, timeout_s=5
    )
    env = cli_env(temporal_server, cluster)
    async with quarantines(temporal_client, clean_lab, cluster, probe) as router:
        await router.submit(node_report("gpu03"))
        handle = handle_of(temporal_client, cluster, "gpu03")
        status = await reach(handle, lambda s: s.failed_checks >= 2, "two checks without an answer")
        report = status.checks[-1]
        assert not report.reachable and [c.name for c in report.failed] == ["agent"]
        assert "DRAIN" in state_of(clean_lab, "gpu03")  # never back on Slurm's word alone

        listed = await trainmedic(env, "nodes", "--json")
        assert listed.returncode == 0, listed.stderr
        [row] = json.loads(listed.stdout)
        assert row["node"] == "gpu03" and row["incident_id"] == "incident-x-3-1"
        assert row["state"] in ("rechecking", "checking")

        released = await trainmedic(
            env, "nodes", "release", "gpu03", "--by", "alice", "--comment", "agent reinstalled"
        )
        assert released.returncode == 0, released.stderr
        assert "gpu03: released by alice" in released.stdout
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.state == "resumed"
    assert result.released_by is not None and result.released_by.by == "alice"
    assert result.released_by.via == "update" and result.released_by.comment
    assert "DRAIN" not in state_of(clean_lab, "gpu03")
    await keep_history(temporal_client, handle.id, "unreachable")


async def test_repeat_offender_stays_out_until_released(
    temporal_client: Client, controller: Worker, clean_lab: Lab, temporal_server: DevServer
) -> None:
    cluster = unique_cluster("qrep")
    await start_control(temporal_client, cluster, AUTO)
    env = cli_env(temporal_server, cluster)
    handle = handle_of(temporal_client, cluster, "gpu02")

    async def quarantine(n: int, then: Callable[[], Awaitable[None]] | None = None) -> None:
        drain(clean_lab, "gpu02", f"trainmedic incident-{cluster}-9{n}-1: gpu_hardware: Xid 79")
        async with quarantines(temporal_client, clean_lab, cluster) as router:
            await router.submit(node_report("gpu02", "xid"))
            if then is not None:
                await then()
            result = await asyncio.wait_for(handle.result(), 90)
        assert result.state == "resumed", result.details
        assert "DRAIN" not in state_of(clean_lab, "gpu02")

    # First time: healthy, straight back.
    await quarantine(1)
    await keep_history(temporal_client, handle.id, "repeat-1")

    async def second() -> None:
        status = await reach(
            handle, lambda s: s.state == "waiting_for_person", "the repeat offender to wait"
        )
        assert status.waiting_for == "repeat_offender" and status.checks == []
        assert "DRAIN" in state_of(clean_lab, "gpu02")
        table = await trainmedic(env, "nodes")
        assert table.returncode == 0, table.stderr
        print(table.stdout)  # what an operator sees (pytest -s)
        assert "gpu02" in table.stdout and "repeat offender" in table.stdout
        assert f"incident-{cluster}-92-1" in table.stdout
        listed = await trainmedic(env, "nodes", "--json")
        [row] = json.loads(listed.stdout)
        assert row["waiting_for"] == "repeat_offender" and row["repeat_offender"]
        assert row["incidents_in_window"] == 2 and row["category"] == "gpu_hardware"
        assert row["since"] and "nodes release gpu02" in row["next"]

        nobody = await trainmedic(env, "nodes", "release", "gpu02", "--by", " ")
        assert nobody.returncode != 0 and "--by" in nobody.stderr
        unknown = await trainmedic(env, "nodes", "release", "gpu99", "--by", "alice")
        assert unknown.returncode != 0
        assert "gpu99 is not held out by trainmedic" in unknown.stderr
        released = await trainmedic(env, "nodes", "release", "gpu02", "--by", "alice")
        assert released.returncode == 0, released.stderr
        again = await trainmedic(env, "nodes", "release", "gpu02", "--by", "bob")
        assert again.returncode != 0 or "released" in again.stdout

    # Second time within the window (K=2): it waits for a person, healthy or not.
    await quarantine(2, second)
    result = await handle.result()
    assert result.released_by is not None and result.released_by.by == "alice"
    assert len(result.checks) == 1 and result.checks[0].healthy  # checked, and recorded
    await keep_history(temporal_client, handle.id, "repeat-2")
    # The cluster's ControlWorkflow, with its record_offense updates (replayed too).
    await keep_history(temporal_client, f"control-{cluster}", "repeat", kind="control")
    empty = await trainmedic(env, "nodes")
    assert empty.returncode == 0 and "holds no node out" in empty.stdout
