"""`trainmedic demo` twice in a row: the second tells only its own story.

The first run is left as an interrupted demo leaves things (`--keep`: the dev server and
the lab still up, its node quarantine still open, the fault it injected still on the
node); the second, with another fault, must close that quarantine, clear the fault, and
print nothing of the first run's incident or quarantine; and when it ends, nothing of
its own is left open to wake up in a third.

Both runs are the real command, in a subprocess, on a private state directory and free
ports, beside the session's own dev server and lab.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus

from tests.fixtures.lab import private_root, require_lab
from trainmedic import procs
from trainmedic.lab import Lab, find_free_port_base
from trainmedic.lab.faults import node_dir
from trainmedic.temporal.client import connect_plain
from trainmedic.temporal.devserver import DevServer

pytestmark = pytest.mark.integration

CLUSTER = "lab"


class DemoEnv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.port, self.ui_port = procs.free_port(), procs.free_port()
        self.lab_port_base = find_free_port_base(6)
        self.server = DevServer(self.state / "temporal", port=self.port, ui_port=self.ui_port)
        self.lab = Lab(self.state / "lab", port_base=self.lab_port_base)

    def run(self, *args: str) -> str:
        env = {
            **os.environ,
            "TRAINMEDIC_STATE_DIR": str(self.state),
            "TRAINMEDIC_TEMPORAL_ADDRESS": self.server.address,
            "TRAINMEDIC_TEMPORAL_UI_PORT": str(self.ui_port),
            "TRAINMEDIC_LAB_PORT_BASE": str(self.lab_port_base),
            "TRAINMEDIC_CLUSTER": CLUSTER,
            "COLUMNS": "250",  # one timeline entry, one line
        }
        env.pop("TRAINMEDIC_POLICY_FILE", None)
        done = subprocess.run(
            [sys.executable, "-m", "trainmedic.cli.main", "demo", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=420,
            check=False,
        )
        assert done.returncode == 0, f"demo {' '.join(args)} failed:\n{done.stdout}"
        return done.stdout


@pytest.fixture
def demo_env() -> Iterator[DemoEnv]:
    require_lab()
    with private_root() as root:
        env = DemoEnv(root)
        try:
            yield env
        finally:
            env.lab.down()
            env.server.stop()


def incident_of(output: str) -> str:
    found = re.findall(r"incident (incident-lab-\d+-\d+) opened", output)
    assert len(found) == 1, output
    return found[0]


def drained_node(output: str) -> str:
    found = re.findall(r"applied: drain (\S+)", output)
    assert len(found) == 1, output
    return found[0]


async def open_workflows(env: DemoEnv) -> dict[str, str]:
    client = await connect_plain(env.server.address)
    return {
        w.id: w.run_id or ""
        async for w in client.list_workflows(
            # The cluster's control and lease workflows live as long as the cluster.
            "ExecutionStatus = 'Running' AND WorkflowType != 'ControlWorkflow' "
            "AND WorkflowType != 'LeaseWorkflow'"
        )
    }


async def run_status(env: DemoEnv, workflow_id: str, run_id: str) -> tuple[object, str]:
    client = await connect_plain(env.server.address)
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    described = await handle.describe()
    history = await handle.fetch_history()
    reason = next(
        (
            e.workflow_execution_terminated_event_attributes.reason
            for e in history.events
            if e.HasField("workflow_execution_terminated_event_attributes")
        ),
        "",
    )
    return described.status, reason


def test_second_demo_tells_only_its_own_story(demo_env: DemoEnv) -> None:
    first = demo_env.run("--keep")
    first_incident = incident_of(first)
    first_node = drained_node(first)
    left = asyncio.run(open_workflows(demo_env))
    # What the first demo left, as an interrupted one does: its quarantine and its fault.
    quarantine = f"node-{CLUSTER}-{first_node}"
    assert quarantine in left, left
    assert "Xid" in (node_dir(demo_env.lab.root, first_node) / "kern.log").read_text()

    second = demo_env.run("--fault", "ecc")

    second_incident = incident_of(second)
    assert second_incident != first_incident
    assert "clean slate: closed 1 node quarantine left open by an earlier demo" in second
    assert f"cleared the faults injected on {first_node}" in second
    # Not one line of the first run's story, and no warning or traceback at all.
    for line in second.splitlines():
        assert first_incident not in line, second
        assert "WARNING" not in line and "Traceback" not in line, second
    assert "gpu_memory_ecc" in second and "gpu_hardware" not in second, second
    assert "demo done" in second

    # The first run's quarantine was closed by the second, saying why.
    status, reason = asyncio.run(run_status(demo_env, quarantine, left[quarantine]))
    assert status == WorkflowExecutionStatus.TERMINATED
    assert "left open by an earlier demo" in reason
    # And the second closed its own when it ended: nothing is left to wake up later.
    assert "closed 1 node quarantine that the demo opened: the next demo starts clean" in second
    assert asyncio.run(open_workflows(demo_env)) == {}


def test_the_demo_over_ssh(demo_env: DemoEnv) -> None:
    """`make demo-ssh`: the same story with every Slurm command, poll and log read going
    over one verified SSH connection to a real sshd on loopback."""
    from trainmedic.lab.sshd import sshd_unavailable_reason

    reason = sshd_unavailable_reason()
    if reason is not None:
        if os.environ.get("TRAINMEDIC_REQUIRE_LAB") == "1":
            pytest.fail(f"TRAINMEDIC_REQUIRE_LAB=1 but the loopback sshd cannot run: {reason}")
        pytest.skip(reason)
    out = demo_env.run("--slurm-access", "ssh")
    assert "Slurm over SSH: " in out and "host key checked against" in out
    node = drained_node(out)
    assert re.search(rf"resumed from checkpoint step \d+\S* on (?!.*{node})", out), out
    assert "demo done" in out
    assert "Traceback" not in out
