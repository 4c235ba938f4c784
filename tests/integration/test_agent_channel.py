"""The agent channel on a real lab with Slurm's production timeout (SlurmdTimeout=300):
real agent processes (one per node) pushing to the controller's receiver, the real
controller worker and detection, the real Temporal dev server.

- a node death (`lab kill-node`, its agent dies with it) -> a node incident and the job
  running again elsewhere, while Slurm still has not called the node DOWN itself;
- an agent stopped (SIGSTOP) for 10 s, and an agent restart -> no effect, a note;
- the controller down -> the agent's findings spooled -> back -> delivered in order.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from temporalio.client import Client

from tests.fixtures.lab import private_root, require_lab
from tests.integration.support import async_wait_for, job, node, running_on
from trainmedic.activities.control import ensure_control
from trainmedic.config import Settings, parse_policy
from trainmedic.domain import Category, Outcome
from trainmedic.lab import Lab, find_free_port_base
from trainmedic.lab import agents as lab_agents
from trainmedic.lab.faults import Fault, append_kernel, kernel_lines
from trainmedic.lab.workload import (
    TrainingSpec,
    checkpoint_dir,
    inject,
    reset_nodes,
    submit_training,
)
from trainmedic.watchers.base import ListSink
from trainmedic.workers.controller import build_worker, slurm_backend
from trainmedic.workers.detection import Detection, build_detection
from trainmedic.workflows.recovery import RecoveryWorkflow

pytestmark = pytest.mark.integration

CLUSTER = "agch"
QUEUE = "trainmedic-it-agents"
NODES = 4
POLICY = (
    "version: it-agents\nmode: {default: auto}\n"
    "rails: {max_isolated_fraction: 1.0, max_drains_per_hour: 100}\n"
    "verify: {timeout: 120s, poll_interval: 1s}\n"
)


@pytest.fixture(scope="module")
def lab300() -> Iterator[Lab]:
    require_lab()
    with private_root() as root:
        lab = Lab(root, port_base=find_free_port_base(NODES + 2))
        try:
            lab.up(nodes=NODES, gpus=2, slurmd_timeout=300)
            yield lab
        finally:
            lab.down()


@pytest.fixture(scope="module")
async def channel(
    lab300: Lab,
    temporal_client: Client,
    temporal_server,  # type: ignore[no-untyped-def]
) -> AsyncIterator[Detection]:
    settings = Settings(
        cluster=CLUSTER,
        temporal_address=temporal_server.address,
        temporal_task_queue=QUEUE,
        slurm_conf=lab300.slurm_conf,
        state_dir=lab300.root / "state",
        agent_channel=True,
        agent_listen="127.0.0.1:0",
        agent_key_file=lab_agents.ensure_key(lab300),
    )
    policy = parse_policy(POLICY)
    backend = slurm_backend(settings)
    worker = build_worker(temporal_client, settings, policy, backend=backend)
    async with worker:
        await ensure_control(temporal_client, CLUSTER, policy, QUEUE)
        detection = build_detection(
            temporal_client, settings, backend, interval=1.0, probes=lab_agents.lab_probes(lab300)
        )
        assert detection.receiver is not None and detection.liveness is not None
        await detection.receiver.start()
        address = lab_agents.controller_address("127.0.0.1", detection.receiver.port)
        await asyncio.to_thread(lab_agents.start_agents, lab300, address)
        stop = asyncio.Event()
        task = asyncio.create_task(detection.run(stop))
        try:
            yield detection
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await asyncio.to_thread(lab_agents.stop_agents, lab300)


async def ready(lab: Lab, detection: Detection) -> None:
    """A clean lab, and every node's agent heartbeating."""
    await asyncio.to_thread(lab.reset, 180)
    await asyncio.to_thread(reset_nodes, lab)
    table = detection.liveness.table if detection.liveness else None
    assert table is not None
    nodes = lab300_nodes(lab)

    def all_beating() -> bool:
        now = table.clock()
        return all(n in table.agents and now - table.agents[n].last_seen < 3 for n in nodes)

    await async_wait_for(all_beating, "every lab agent to heartbeat", 60)


def lab300_nodes(lab: Lab) -> list[str]:
    spec = lab.spec
    assert spec is not None
    return spec.node_names


async def train(lab: Lab) -> tuple[str, list[str]]:
    name = f"a{uuid.uuid4().hex[:6]}"
    job_id = submit_training(
        lab, TrainingSpec(nodes=2, steps=5000, step_seconds=0.25, ckpt_every=8, name=name)
    )
    placed = await async_wait_for(lambda: running_on(lab, job_id), "training to run")
    ckpt = checkpoint_dir(lab, name)
    await async_wait_for(lambda: ckpt.is_dir() and any(ckpt.iterdir()), "a first checkpoint")
    return job_id, placed


def incidents(detection: Detection, job_id: str) -> list[str]:
    return [i for i in detection.router.started if i.startswith(f"incident-{CLUSTER}-{job_id}-")]


async def test_a_dead_node_is_replaced_before_slurm_calls_it_down(
    lab300: Lab, channel: Detection, temporal_client: Client
) -> None:
    await ready(lab300, channel)
    job_id, placed = await train(lab300)
    dead = placed[1]
    await asyncio.to_thread(inject, lab300, "node-death", dead, job_id)

    found = await async_wait_for(lambda: incidents(channel, job_id), "the node incident", 120)
    handle = temporal_client.get_workflow_handle_for(RecoveryWorkflow.run, found[0])
    result = await asyncio.wait_for(handle.result(), 240)

    assert result.diagnosis is not None
    assert result.diagnosis.category is Category.NODE_DOWN, result.diagnosis
    assert result.diagnosis.culprit_nodes == [dead]
    assert "trainmedic.node_silent" in result.diagnosis.rule_ids
    assert result.outcome is Outcome.RECOVERED, result.summary
    now_on = await async_wait_for(lambda: running_on(lab300, job_id), "the job to run again")
    assert dead not in now_on
    # Out of service by trainmedic's word, not by Slurm's timeout (its reason would be
    # "Not responding", after 300 s).
    state = node(lab300, dead)
    assert "DOWN" in state["State"], state
    assert state.get("Reason", "").startswith("trainmedic"), state
    assert int(job(lab300, job_id)["Restarts"]) >= 1
    assert channel.liveness is not None
    assert [s.nodes for s in channel.liveness.reported] == [[dead]]


async def test_an_agent_stopped_for_ten_seconds_has_no_effect(
    lab300: Lab, channel: Detection
) -> None:
    assert channel.liveness is not None
    table = channel.liveness.table
    await ready(lab300, channel)
    job_id, placed = await train(lab300)
    target = placed[1]
    blips, reported = table.counters["blips"], len(channel.liveness.reported)

    assert await asyncio.to_thread(lab_agents.signal_agent, lab300, target, signal.SIGSTOP)
    try:
        await asyncio.sleep(10)
    finally:
        await asyncio.to_thread(lab_agents.signal_agent, lab300, target, signal.SIGCONT)
    await async_wait_for(lambda: table.counters["blips"] > blips, "the blip to be noted", 30)

    assert len(channel.liveness.reported) == reported
    assert incidents(channel, job_id) == []
    assert running_on(lab300, job_id) == placed
    assert "DRAIN" not in node(lab300, target)["State"]
    assert any(target in note and "then back" in note for note in table.notes)


async def test_an_agent_restart_has_no_effect(lab300: Lab, channel: Detection) -> None:
    assert channel.liveness is not None
    table = channel.liveness.table
    await ready(lab300, channel)
    job_id, placed = await train(lab300)
    target = placed[0]
    before = table.agents[target].agent
    restarts, reported = table.counters["restarts"], len(channel.liveness.reported)

    await asyncio.to_thread(lab_agents.restart_agent, lab300, target)
    await async_wait_for(
        lambda: table.agents[target].agent != before, "the new agent's heartbeat", 60
    )
    await asyncio.sleep(3)  # a few more beats: nothing follows

    assert table.counters["restarts"] == restarts + 1
    assert len(channel.liveness.reported) == reported
    assert incidents(channel, job_id) == []
    assert running_on(lab300, job_id) == placed


async def test_findings_spooled_while_the_controller_is_down_arrive_in_order(
    lab300: Lab, channel: Detection
) -> None:
    receiver = channel.receiver
    assert receiver is not None
    await ready(lab300, channel)
    target = lab300_nodes(lab300)[2]
    spool = lab_agents.spool_dir(lab300, target)
    recorded = ListSink()
    original, receiver.sink = receiver.sink, recorded
    try:
        await receiver.close()  # the controller goes away
        for n in range(5):
            lines = kernel_lines(Fault.XID79, pid=1000 + n, node=target, gpu=0)
            await asyncio.to_thread(append_kernel, lab300.root, target, lines[:1])
            await async_wait_for(
                lambda n=n: len(list(spool.glob("*.json"))) == n + 1, f"finding {n} spooled", 30
            )
        assert recorded.signals == []
        await receiver.start()  # back, on the same port
        await async_wait_for(lambda: len(recorded.signals) >= 5, "the spool drained", 60)
        await asyncio.sleep(3)  # nothing more (no duplicates) follows
    finally:
        receiver.sink = original
    pids = [s.evidence[0].text.split("pid=")[1].split(",")[0] for s in recorded.signals]
    assert pids == [str(1000 + n) for n in range(5)]
    assert all(s.nodes == [target] for s in recorded.signals)
    assert not list(spool.glob("*.json"))
