"""The agent channel over real loopback HTTP: what the receiver refuses (and says why),
what it delivers (once), the agent's spool fallback, and the node-death detector."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trainmedic.activities.slurm import SlurmActivities
from trainmedic.catalog import Attributor
from trainmedic.channel import wire
from trainmedic.channel.client import (
    AgentChannel,
    ChannelClient,
    ChannelSink,
    ProbeListener,
)
from trainmedic.channel.liveness import (
    AgentProbe,
    AgentState,
    AgentTable,
    NodeDeathDetector,
    ProbeResult,
    TcpProbe,
)
from trainmedic.channel.receiver import AgentReceiver
from trainmedic.config import Settings, load_settings
from trainmedic.domain import Evidence, EvidenceSource
from trainmedic.domain.diagnosis import AttributionRequest
from trainmedic.domain.enums import Category, Mode
from trainmedic.domain.incident import EffectKind, EffectStatus, IncidentSignal, PlannedEffect
from trainmedic.domain.slurm import EffectResult, SlurmNode
from trainmedic.errors import ConfigError, DeliveryError
from trainmedic.lab.layout import LabLayout, LabSpec, render_slurm_conf
from trainmedic.watchers.base import ListSink
from trainmedic.workers.detection import agent_site_key
from trainmedic.workflows.planning import trusted_witnesses

SITE_KEY = b"0123456789abcdef-site-key-for-tests"
NODE = "gpu01"


def xid(node: str, n: int) -> IncidentSignal:
    return IncidentSignal(
        source="kernel",
        kind="kernel_xid",
        nodes=[node],
        at=datetime.now(UTC),
        detail=f"Xid 79 on {node} #{n}",
        evidence=[
            Evidence(
                source=EvidenceSource.KERNEL,
                node=node,
                text=f"NVRM: Xid (PCI:0000:3b:00): 79, pid={n}, name=python, GPU has fallen off",
            )
        ],
    )


@pytest.fixture
async def receiver() -> AsyncIterator[AgentReceiver]:
    got = AgentReceiver(ListSink(), SITE_KEY, AgentTable(), port=0, max_body=4096, rate=50)
    await got.start()
    yield got
    await got.close()


def client_for(
    receiver: AgentReceiver, node: str = NODE, key: bytes | None = None
) -> ChannelClient:
    return ChannelClient(receiver.address, node, key or wire.node_key(SITE_KEY, node))


def delivered(receiver: AgentReceiver) -> list[IncidentSignal]:
    sink = receiver.sink
    assert isinstance(sink, ListSink)
    return sink.signals


def finding(signal: IncidentSignal, finding_id: str = "f" * 32) -> dict[str, object]:
    return {"id": finding_id, "signal": signal.model_dump(mode="json")}


async def test_a_signed_heartbeat_lands_in_the_table(receiver: AgentReceiver) -> None:
    client = client_for(receiver)
    status, _ = await client.post(
        wire.HEARTBEAT_PATH, {"node": NODE, "agent": "a1", "interval": 2.0, "probe_port": 1}
    )
    await client.close()
    assert status == 200
    state = receiver.table.agents[NODE]
    assert (state.agent, state.probe_port, state.peer) == ("a1", 1, "127.0.0.1")


async def test_a_finding_is_delivered_once_per_idempotency_key(receiver: AgentReceiver) -> None:
    client = client_for(receiver)
    body = {"node": NODE, "agent": "a1", "findings": [finding(xid(NODE, 1))]}
    first = await client.post(wire.FINDINGS_PATH, body)
    again = await client.post(wire.FINDINGS_PATH, body)
    await client.close()
    assert first == (200, {"ok": True, "delivered": ["f" * 32], "duplicates": []})
    assert again == (200, {"ok": True, "delivered": [], "duplicates": ["f" * 32]})
    assert [s.detail for s in delivered(receiver)] == ["Xid 79 on gpu01 #1"]


async def rejected(
    receiver: AgentReceiver,
    caplog: pytest.LogCaptureFixture,
    client: ChannelClient,
    path: str,
    body: dict[str, object],
) -> tuple[int, str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainmedic.channel.receiver"):
        status, answer = await client.post(path, body)
    await client.close()
    assert delivered(receiver) == []
    assert receiver.table.agents == {}
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "nothing delivered" in lines[0]
    return status, lines[0] + " | " + str(answer.get("reason"))


async def test_a_bad_signature_is_refused(
    receiver: AgentReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    client = client_for(receiver, key=wire.node_key(b"another-site-key-0123456789", NODE))
    body = {"node": NODE, "agent": "a1", "findings": [finding(xid(NODE, 1))]}
    status, line = await rejected(receiver, caplog, client, wire.FINDINGS_PATH, body)
    assert status == 401
    assert "bad signature" in line and "signature" in line


async def test_another_nodes_key_cannot_speak_for_this_node(
    receiver: AgentReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    # gpu02's key, claiming to be gpu01: the derived keys differ.
    client = client_for(receiver, NODE, key=wire.node_key(SITE_KEY, "gpu02"))
    status, line = await rejected(
        receiver, caplog, client, wire.HEARTBEAT_PATH, {"node": NODE, "agent": "a1"}
    )
    assert status == 401 and "signature" in line


async def test_a_stale_timestamp_is_refused(
    receiver: AgentReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.wall_clock = lambda: time.time() + 120  # the request looks two minutes old
    status, line = await rejected(
        receiver, caplog, client_for(receiver), wire.HEARTBEAT_PATH, {"node": NODE, "agent": "a"}
    )
    assert status == 401
    assert "replay window" in line and "stale" in line


async def test_a_replayed_request_is_refused(
    receiver: AgentReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    body = json.dumps({"node": NODE, "agent": "a1"}).encode()
    headers = wire.signed_headers(
        wire.node_key(SITE_KEY, NODE), wire.HEARTBEAT_PATH, NODE, time.time(), body
    )
    raw = wire.request_bytes(receiver.address, wire.HEARTBEAT_PATH, body, headers)
    statuses = []
    with caplog.at_level(logging.WARNING, logger="trainmedic.channel.receiver"):
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", receiver.port)
            writer.write(raw)
            status, _, _ = await wire.read_response(reader, 5)
            statuses.append(status)
            writer.close()
    assert statuses == [200, 401]
    assert receiver.rejected["replay"] == 1
    assert any("a replay" in r.getMessage() for r in caplog.records)


async def test_a_body_naming_another_node_is_refused(
    receiver: AgentReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    status, line = await rejected(
        receiver, caplog, client_for(receiver), wire.HEARTBEAT_PATH, {"node": "gpu02", "agent": "a"}
    )
    assert status == 403 and "signed by gpu01" in line


async def test_a_finding_about_another_node_is_refused(
    receiver: AgentReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"node": NODE, "agent": "a1", "findings": [finding(xid("gpu02", 1))]}
    status, line = await rejected(receiver, caplog, client_for(receiver), wire.FINDINGS_PATH, body)
    assert status == 403
    assert "about gpu02, signed by gpu01" in line


async def test_a_finding_that_is_not_an_agents_is_refused(
    receiver: AgentReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    signal = xid(NODE, 1).model_copy(update={"source": "slurm", "job_id": "42"})
    body = {"node": NODE, "agent": "a1", "findings": [finding(signal)]}
    status, line = await rejected(receiver, caplog, client_for(receiver), wire.FINDINGS_PATH, body)
    assert status == 400 and "not-agent" in line


async def test_an_oversize_body_is_refused_before_it_is_read(
    receiver: AgentReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    big = xid(NODE, 1).model_copy(update={"detail": "x" * 10_000})
    body = {"node": NODE, "agent": "a1", "findings": [finding(big)]}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainmedic.channel.receiver"):
        status, answer = await client_for(receiver).post(wire.FINDINGS_PATH, body)
    assert status == 413
    assert "limit is 4096" in answer["error"]
    assert delivered(receiver) == []
    assert any("413" in r.getMessage() for r in caplog.records)


async def test_too_many_requests_from_one_node_are_refused(receiver: AgentReceiver) -> None:
    receiver.limiter.rate, receiver.limiter.burst = 0.001, 3
    client = client_for(receiver)
    statuses = [
        (await client.post(wire.HEARTBEAT_PATH, {"node": NODE, "agent": "a"}))[0] for _ in range(5)
    ]
    await client.close()
    assert statuses == [200, 200, 200, 429, 429]
    assert receiver.rejected["rate"] == 2


async def test_a_finding_temporal_cannot_take_is_answered_503(receiver: AgentReceiver) -> None:
    class Down:
        async def submit(self, signal: IncidentSignal) -> None:
            raise DeliveryError("Temporal unreachable")

    receiver.sink = Down()
    body = {"node": NODE, "agent": "a1", "findings": [finding(xid(NODE, 1))]}
    client = client_for(receiver)
    status, _ = await client.post(wire.FINDINGS_PATH, body)
    await client.close()
    assert status == 503
    assert "f" * 32 not in {k.split("/")[-1] for k in receiver.ledger._ids}


async def test_spool_fallback_keeps_order_and_loses_nothing(tmp_path: Path) -> None:
    """Controller down: findings go to the agent's spool; controller back: drained in
    order after the next heartbeat, each delivered once."""
    table = AgentTable()
    receiver = AgentReceiver(ListSink(), SITE_KEY, table, port=0)
    await receiver.start()
    port = receiver.port
    await receiver.close()  # the controller is down
    client = ChannelClient(f"127.0.0.1:{port}", NODE, wire.node_key(SITE_KEY, NODE), timeout=1)
    sink = ChannelSink(client, tmp_path / "spool", agent_id="a1", spool_key=SITE_KEY)
    for n in range(5):
        await sink.submit(xid(NODE, n))
    assert sink.spooled == 5 and sink.pushed == 0
    channel = AgentChannel(sink, interval=0.2)
    assert not await channel.beat()

    back = AgentReceiver(ListSink(), SITE_KEY, table, port=port)
    await back.start()
    try:
        stop = asyncio.Event()
        task = asyncio.create_task(channel.run(stop))
        for _ in range(100):
            if len(delivered(back)) >= 5 and not sink.backlog():
                break
            await asyncio.sleep(0.05)
        await sink.submit(xid(NODE, 5))  # pushed directly once the spool is empty
        stop.set()
        await task
    finally:
        await back.close()
    assert [s.detail for s in delivered(back)] == [f"Xid 79 on gpu01 #{n}" for n in range(6)]
    assert not sink.backlog()
    assert sink.drained == 5 and sink.pushed == 6


async def test_a_lost_acknowledgement_does_not_deliver_twice(
    receiver: AgentReceiver, tmp_path: Path
) -> None:
    client = client_for(receiver)
    sink = ChannelSink(client, tmp_path / "spool", agent_id="a1", spool_key=SITE_KEY)
    item = finding(xid(NODE, 1), "a" * 32)
    await sink.push(item)  # delivered, but say the answer was lost: the agent spooled it
    await asyncio.to_thread(sink._write, item)
    assert await sink.drain() == 1
    await client.close()
    assert len(delivered(receiver)) == 1
    assert receiver.accepted["duplicate"] == 1


# ------------------------------------------------------------------------- liveness


class Probe:
    def __init__(self, answered: bool | None, decisive: bool = True) -> None:
        self.name = "slurmd"
        self.decisive = decisive
        self.answered = answered
        self.calls = 0

    async def probe(self, state: AgentState) -> ProbeResult:
        self.calls += 1
        return ProbeResult(self.answered, f"slurmd answered={self.answered}")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(table: AgentTable, agent: str = "a1", node: str = NODE) -> None:
    table.beat(node, wire.Heartbeat(node=node, agent=agent, interval=2.0), "127.0.0.1")


def _node(state_text: str | None) -> SlurmNode | None:
    """A node as the Slurm watcher sees it, from Slurm's 'STATE+FLAG' form."""
    if state_text is None:
        return None
    state, *flags = state_text.split("+")
    return SlurmNode(name=NODE, state=state, state_flags=flags)


def detector(
    probe: Probe, jobs: list[str] | None = None, slurm: str | None = None
) -> tuple[NodeDeathDetector, AgentTable, Clock, ListSink]:
    clock = Clock()
    table = AgentTable(clock=clock)
    sink = ListSink()
    found = NodeDeathDetector(
        table,
        sink,
        jobs_on=lambda node: ["42"] if jobs is None else jobs,
        slurm_node=lambda node: _node(slurm),
        probes=[probe],
        silence=6,
        probe_interval=1,
        failures_needed=2,
    )
    return found, table, clock, sink


async def test_a_silent_agent_on_a_dead_node_opens_one_node_down_signal() -> None:
    found, table, clock, sink = detector(Probe(False))
    beat(table)
    for _ in range(20):
        clock.now += 0.5
        await found.check_once()
    assert len(sink.signals) == 1
    signal = sink.signals[0]
    assert (signal.source, signal.kind, signal.nodes, signal.job_id) == (
        "agent_heartbeat",
        "node_down",
        [NODE],
        None,
    )
    assert table.counters["confirmed"] == 1
    # The catalog reads it as node_down on that node, and a drain may rest on it.
    diagnosis = Attributor().attribute(
        AttributionRequest(job_id="42", nodelist=[NODE, "gpu02"], evidence=signal.evidence)
    )
    assert diagnosis.category is Category.NODE_DOWN
    assert diagnosis.culprit_nodes == [NODE]
    assert NODE in trusted_witnesses(diagnosis, {})


async def test_a_blip_while_the_node_answers_is_only_a_note() -> None:
    probe = Probe(True)
    found, table, clock, sink = detector(probe)
    beat(table)
    for _ in range(20):  # 10 s of silence
        clock.now += 0.5
        await found.check_once()
    beat(table)
    assert sink.signals == []
    assert probe.calls >= 3
    assert table.counters["blips"] == 1
    assert any("then back" in note for note in table.notes)


async def test_an_agent_restart_is_only_a_note() -> None:
    found, table, clock, sink = detector(Probe(True))
    beat(table, "a1")
    clock.now += 3
    beat(table, "a2")
    await found.check_once()
    assert sink.signals == []
    assert table.counters["restarts"] == 1


async def test_a_silent_node_without_a_job_is_noted_not_reported() -> None:
    probe = Probe(False)
    found, table, clock, sink = detector(probe, jobs=[])
    beat(table)
    clock.now += 30
    await found.check_once()
    await found.check_once()
    assert sink.signals == [] and probe.calls == 0
    assert table.counters["idle_silent"] == 1


async def test_slurm_agreeing_confirms_without_a_probe() -> None:
    found, table, clock, sink = detector(Probe(None), slurm="ALLOCATED+NOT_RESPONDING")
    beat(table)
    clock.now += 7
    await found.check_once()
    assert len(sink.signals) == 1
    assert "Slurm shows it" in sink.signals[0].evidence[0].text


async def test_an_undecisive_probe_never_confirms() -> None:
    found, table, clock, sink = detector(Probe(False, decisive=False))
    beat(table)
    for _ in range(60):
        clock.now += 0.5
        await found.check_once()
    assert sink.signals == []


async def test_probes_against_real_ports(tmp_path: Path) -> None:
    listener = ProbeListener(NODE, "a1", "127.0.0.1", 0)
    port = await listener.start()
    state = AgentState(NODE, "a1", 0, 0, 0, peer="127.0.0.1", probe_port=port)
    try:
        assert (await AgentProbe().probe(state)).answered is True
        assert (await TcpProbe("slurmd", lambda s: ("127.0.0.1", port)).probe(state)).answered
    finally:
        await listener.close()
    assert (await AgentProbe().probe(state)).answered is False
    closed = await TcpProbe("slurmd", lambda s: ("127.0.0.1", port)).probe(state)
    assert closed.answered is False and "refused" in closed.detail.lower()


# --------------------------------------------------------------------- configuration


def test_the_lab_can_run_slurms_production_timeout(tmp_path: Path) -> None:
    layout = LabLayout(tmp_path)
    assert "SlurmdTimeout=300\n" in render_slurm_conf(LabSpec(slurmd_timeout=300), layout, "h")
    assert "SlurmdTimeout=5\n" in render_slurm_conf(LabSpec(), layout, "h")


def test_the_channel_refuses_to_run_without_a_key(tmp_path: Path) -> None:
    settings = Settings(agent_channel=True, state_dir=tmp_path)
    with pytest.raises(ConfigError, match="TRAINMEDIC_AGENT_KEY_FILE"):
        agent_site_key(settings)
    key = tmp_path / "agent.key"
    key.write_text("k" * 32)
    key.chmod(0o600)
    assert agent_site_key(settings.model_copy(update={"spool_key_file": key})) == b"k" * 32


def test_a_bad_listen_address_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="TRAINMEDIC_AGENT_LISTEN"):
        load_settings(agent_listen="nowhere")


async def test_many_agents_silent_at_once_is_no_verdict() -> None:
    """The controller lagging, or the network failing, is not 60 nodes dying."""
    probe = Probe(False)
    found, table, clock, sink = detector(probe)
    for n in range(100):
        beat(table, node=f"gpu{n:03d}")
    clock.now += 10
    for _ in range(5):
        clock.now += 0.5
        await found.check_once()
    assert sink.signals == [] and probe.calls == 0
    assert table.counters["mass_silence"] == 1


async def test_the_probe_listener_serves_mounted_endpoints() -> None:
    @dataclass(frozen=True)
    class Answer:
        status: int
        body: bytes
        headers: dict[str, str]

    class Health:
        async def handle(self, method: str, target: str, headers: Mapping[str, str]) -> Answer:
            return Answer(200, f"{method} {target}".encode(), {"X-Signed": "yes"})

    listener = ProbeListener(NODE, "a1", "127.0.0.1", 0)
    listener.mount("/health", Health())
    port = await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health?q=abc HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = await reader.read()
        writer.close()
    finally:
        await listener.close()
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"X-Signed: yes\r\n" in raw
    assert raw.endswith(b"GET /health?q=abc")


# ------------------------------------------------------------- isolating a dead node


class Backend:
    """get_node / drain_node / down_node, recording what was asked."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def get_node(self, name: str) -> SlurmNode:
        return SlurmNode(name=name, state="ALLOCATED")

    async def drain_node(self, name: str, reason: str) -> EffectResult:
        self.calls.append(f"drain {name}")
        return EffectResult(changed=True, detail=f"{name} set to drain")

    async def down_node(self, name: str, reason: str) -> EffectResult:
        self.calls.append(f"down {name}")
        return EffectResult(changed=True, detail=f"{name} set DOWN")


def isolation(category: str) -> PlannedEffect:
    return PlannedEffect(
        id="drain-gpu02",
        kind=EffectKind.DRAIN_NODE,
        node="gpu02",
        reason=f"trainmedic incident-lab-42-1: {category}: gpu02 confirmed dead",
        mode=Mode.AUTO,
    )


async def test_a_dead_node_is_marked_down_not_drained() -> None:
    """A drained dead node keeps its jobs COMPLETING until SlurmdTimeout (seen in the
    lab): a node_down culprit is set DOWN, any other culprit drained."""
    backend = Backend()
    activities = SlurmActivities(backend)  # type: ignore[arg-type]
    down = await activities._drain(isolation("node_down"))
    drained = await activities._drain(isolation("gpu_hardware"))
    assert backend.calls == ["down gpu02", "drain gpu02"]
    assert down.status is EffectStatus.APPLIED and "DOWN" in down.note
    assert drained.status is EffectStatus.APPLIED
