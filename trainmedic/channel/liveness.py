"""Node death in seconds, without false drains: the last-seen table and its detector.

Heartbeats only touch `AgentTable` (a dict write: no Temporal call, no I/O). The
`NodeDeathDetector` walks the table twice a second:

    heartbeating --silent >= `silence` while a job runs there--> suspect
    suspect --probe every `probe_interval`--> confirmed dead    (one node incident)
                                          \\-> heard again      (a recorded note only)

Silence alone is never enough. A suspect is confirmed when Slurm agrees (the node
DOWN / NOT_RESPONDING), or when a *decisive* probe of the node itself fails
`failures_needed` times in a row and no decisive probe answers. The agent's own port is
asked too, but it is not decisive: a stopped or restarting agent does not answer while
its node is fine. In the lab and on a real cluster the decisive probe is a TCP connect
to the node's slurmd: a node whose slurmd accepts connections is not dead, whatever
its agent does. A silent node that runs no job is only noted: there is no job to save,
and Slurm's own timeout takes it out.

A confirmed death is one signal (`source=agent_heartbeat`, `kind=node_down`, the node
only: the fanout adds one per job there) whose evidence line the catalog's
`trainmedic.node_silent` rule reads as `node_down` on that node. Its source is trusted
for a drain (workflows/planning.py TRUSTED_SOURCES) because the controller itself
observed it: the node's authenticated agent stopped and the node's own daemon does not
answer the controller, which is what Slurm concludes after SlurmdTimeout, only sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple, Protocol

from trainmedic.channel import wire
from trainmedic.domain.diagnosis import Evidence
from trainmedic.domain.enums import EvidenceSource
from trainmedic.domain.incident import IncidentSignal
from trainmedic.domain.slurm import NodeStates
from trainmedic.watchers.base import SignalSink

logger = logging.getLogger(__name__)

SOURCE = EvidenceSource.AGENT_HEARTBEAT.value


def slurm_says_dead(node: NodeStates) -> bool:
    """Slurm has the node down (base state DOWN, a FAIL flag) or not responding. Read
    from its state and flags, not a substring of their text: the power-saving flags
    POWER_DOWN, POWERING_DOWN and POWERED_DOWN name a node switched off on purpose
    (review of 2026-12-03)."""
    return node.is_down or node.not_responding


@dataclass(slots=True)
class AgentState:
    node: str
    agent: str
    first_seen: float  # monotonic
    last_seen: float  # monotonic
    last_seen_wall: float
    interval: float = 2.0
    peer: str = ""
    probe_port: int | None = None
    beats: int = 0
    suspect_since: float | None = None
    next_probe: float = 0.0
    failures: int = 0
    dead: bool = False
    noted_idle: bool = False
    noted_answering: bool = False


class AgentTable:
    """Last seen per node, written by the receiver; notes and counters for the record."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        self.wall_clock = wall_clock
        self.agents: dict[str, AgentState] = {}
        self.notes: deque[str] = deque(maxlen=1000)
        self.counters: dict[str, int] = {
            "restarts": 0,
            "blips": 0,
            "suspects": 0,
            "confirmed": 0,
            "idle_silent": 0,
            "back_after_death": 0,
            "mass_silence": 0,
        }
        # Seconds between two heartbeats of one agent beyond its interval (benchmarks).
        self.gaps: deque[float] = deque(maxlen=100_000)

    def note(self, counter: str | None, text: str) -> None:
        if counter:
            self.counters[counter] = self.counters.get(counter, 0) + 1
        self.notes.append(text)
        logger.info("agent liveness: %s", text)

    def beat(self, node: str, beat: wire.Heartbeat, peer: str) -> None:
        now = self.clock()
        state = self.agents.get(node)
        if state is None:
            self.agents[node] = AgentState(
                node=node,
                agent=beat.agent,
                first_seen=now,
                last_seen=now,
                last_seen_wall=self.wall_clock(),
                interval=beat.interval,
                peer=peer,
                probe_port=beat.probe_port,
                beats=1,
            )
            return
        silent = now - state.last_seen
        self.gaps.append(max(0.0, silent - state.interval))
        if state.agent != beat.agent:
            self.note(
                "restarts",
                f"agent on {node} restarted (silent {silent:.1f} s); no effect",
            )
        if state.dead:
            self.note(
                "back_after_death",
                f"agent on {node} heard again {silent:.1f} s after its node was reported dead",
            )
        elif state.suspect_since is not None:
            self.note(
                "blips",
                f"agent on {node} silent {silent:.1f} s, then back; its node kept answering "
                "(not confirmed dead): no effect",
            )
        state.agent = beat.agent
        state.last_seen = now
        state.last_seen_wall = self.wall_clock()
        state.interval = beat.interval
        state.peer = peer
        state.probe_port = beat.probe_port
        state.beats += 1
        state.suspect_since = None
        state.failures = 0
        state.dead = False
        state.noted_idle = False
        state.noted_answering = False

    def seen(self, node: str) -> None:
        state = self.agents.get(node)
        if state is not None and not state.dead:
            state.last_seen = self.clock()
            state.last_seen_wall = self.wall_clock()


# ------------------------------------------------------------------------------ probes


class ProbeResult(NamedTuple):
    answered: bool | None  # None: this probe cannot tell (no address known)
    detail: str


class NodeProbe(Protocol):
    """A direct question to one node. `decisive`: its failure says the node (not only
    its agent) is gone."""

    name: str
    decisive: bool

    async def probe(self, state: AgentState) -> ProbeResult: ...


async def _connect(host: str, port: int, timeout: float) -> tuple[bool, str]:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except TimeoutError:
        return False, f"{host}:{port} did not answer within {timeout:g} s"
    except OSError as error:
        why = os.strerror(error.errno) if error.errno else str(error)
        return False, f"{host}:{port}: {why.lower()}"
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True, f"{host}:{port} accepts connections"


class TcpProbe:
    """A TCP connect to a port of the node (its slurmd, by default): decisive."""

    decisive = True

    def __init__(
        self,
        name: str,
        address_of: Callable[[AgentState], tuple[str, int] | None],
        timeout: float = 1.0,
    ) -> None:
        self.name = name
        self.address_of = address_of
        self.timeout = timeout

    async def probe(self, state: AgentState) -> ProbeResult:
        address = self.address_of(state)
        if address is None:
            return ProbeResult(None, f"{self.name}: no address for {state.node}")
        ok, detail = await _connect(*address, self.timeout)
        return ProbeResult(ok, f"{self.name} {detail}")


class AgentProbe:
    """`GET /v1/alive` on the agent's probe listener: recorded, never decisive (a stopped
    or restarting agent does not answer while its node is fine)."""

    name = "agent"
    decisive = False

    def __init__(self, timeout: float = 1.0) -> None:
        self.timeout = timeout

    async def probe(self, state: AgentState) -> ProbeResult:
        if not state.probe_port or not state.peer:
            return ProbeResult(None, "agent: no probe port advertised")
        host, port = state.peer, state.probe_port
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), self.timeout
            )
        except TimeoutError:
            return ProbeResult(False, f"agent {host}:{port}: no answer in {self.timeout:g} s")
        except OSError as error:
            why = os.strerror(error.errno) if error.errno else str(error)
            return ProbeResult(False, f"agent {host}:{port}: {why.lower()}")
        try:
            writer.write(f"GET {wire.ALIVE_PATH} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            status, _, _ = await wire.read_response(reader, self.timeout)
            return ProbeResult(status == 200, f"agent {host}:{port} answered {status}")
        except (TimeoutError, OSError, wire.HttpError, asyncio.IncompleteReadError):
            return ProbeResult(False, f"agent {host}:{port} accepted but did not answer")
        finally:
            writer.close()


def slurmd_probe(port: int, timeout: float = 1.0) -> TcpProbe:
    """slurmd on the address the agent's heartbeats come from (a real cluster)."""
    return TcpProbe("slurmd", lambda state: (state.peer, port) if state.peer else None, timeout)


# ---------------------------------------------------------------------------- detector


class NodeDeathDetector:
    def __init__(
        self,
        table: AgentTable,
        sink: SignalSink,
        *,
        jobs_on: Callable[[str], list[str]],
        slurm_node: Callable[[str], NodeStates | None] | None = None,
        probes: Iterable[NodeProbe] = (),
        silence: float = 6.0,
        probe_interval: float = 1.0,
        failures_needed: int = 2,
        interval: float = 0.5,
        mass_silence: float = 0.05,
    ) -> None:
        self.table = table
        self.sink = sink
        self.jobs_on = jobs_on
        self.slurm_node = slurm_node
        self.probes = list(probes)
        self.silence = silence
        self.probe_interval = probe_interval
        self.failures_needed = failures_needed
        self.interval = interval
        # More than this share of the agents (and at least 50) silent at once is not
        # nodes dying one by one: the controller itself is lagging, or the network
        # between it and the nodes failed. No verdicts then (and no probe storm).
        self.mass_silence = mass_silence
        self.holding = False
        self.reported: list[IncidentSignal] = []

    async def check_once(self) -> list[IncidentSignal]:
        now = self.table.clock()
        due: list[tuple[AgentState, list[str]]] = []
        silent_states = [
            state
            for state in self.table.agents.values()
            if not state.dead and now - state.last_seen >= max(self.silence, 2 * state.interval)
        ]
        limit = max(50, int(self.mass_silence * len(self.table.agents)))
        if len(silent_states) > limit:
            if not self.holding:
                self.holding = True
                self.table.note(
                    "mass_silence",
                    f"{len(silent_states)} of {len(self.table.agents)} agents silent at once: "
                    "the controller is lagging or the network to the nodes failed; no node "
                    "verdicts until it clears (Slurm's own timeout still applies)",
                )
            return []
        if self.holding:
            self.holding = False
            self.table.note(None, f"agents heard again ({len(silent_states)} silent): judging")
        for state in silent_states:
            silent = now - state.last_seen
            jobs = self.jobs_on(state.node)
            if not jobs:
                if not state.noted_idle:
                    state.noted_idle = True
                    self.table.note(
                        "idle_silent",
                        f"agent on {state.node} silent {silent:.1f} s; no job runs there: "
                        "noted, nothing to do",
                    )
                continue
            if state.suspect_since is None:
                state.suspect_since = now
                state.next_probe = now
                self.table.counters["suspects"] += 1
                logger.warning(
                    "agent liveness: %s silent %.1f s while job(s) %s run there: probing",
                    state.node,
                    silent,
                    ",".join(jobs),
                )
            if now >= state.next_probe:
                state.next_probe = now + self.probe_interval
                due.append((state, jobs))
        if not due:
            return []
        verdicts = await asyncio.gather(*(self._judge(state, jobs) for state, jobs in due))
        return [signal for signal in verdicts if signal is not None]

    async def _judge(self, state: AgentState, jobs: list[str]) -> IncidentSignal | None:
        results = await asyncio.gather(*(p.probe(state) for p in self.probes))
        slurm = self.slurm_node(state.node) if self.slurm_node else None
        slurm_agrees = slurm is not None and slurm_says_dead(slurm)
        decisive = [r for p, r in zip(self.probes, results, strict=True) if p.decisive]
        failed = any(r.answered is False for r in decisive)
        answered = any(r.answered is True for r in decisive)
        if state.last_seen >= (state.suspect_since or 0.0) or state.dead:
            return None  # heard again while we probed
        if failed and not answered:
            state.failures += 1
        else:
            state.failures = 0
            if answered and not state.noted_answering:
                state.noted_answering = True
                self.table.note(
                    None,
                    f"agent on {state.node} silent, but the node answers "
                    f"({'; '.join(r.detail for r in decisive if r.answered)}): not dead, "
                    "no effect",
                )
        if not slurm_agrees and state.failures < self.failures_needed:
            return None
        state.dead = True
        self.table.counters["confirmed"] += 1
        silent = self.table.clock() - state.last_seen
        why = [r.detail for r in results if r.answered is not None]
        if slurm_agrees and slurm is not None:
            why.insert(0, f"Slurm shows it {slurm.state_text}")
        elif state.failures > 1:
            why.append(f"{state.failures} probes in a row")
        job_text = ",".join(jobs[:20])
        text = (
            f"trainmedic: node {state.node} confirmed dead: agent silent for {silent:.1f} s "
            f"while job {job_text} runs there; {'; '.join(why)}"
        )
        signal = IncidentSignal(
            source=SOURCE,
            kind="node_down",
            job_id=None,
            nodes=[state.node],
            at=datetime.fromtimestamp(state.last_seen_wall, UTC),
            detail=text.removeprefix("trainmedic: "),
            evidence=[
                Evidence(
                    source=EvidenceSource.AGENT_HEARTBEAT,
                    text=text,
                    node=state.node,
                    rule_id="trainmedic.node_silent",
                )
            ],
        )
        logger.error("agent liveness: %s", signal.detail)
        self.reported.append(signal)
        try:
            await self.sink.submit(signal)
        except Exception:
            logger.exception("agent liveness: could not hand on the death of %s", state.node)
        return signal

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("agent liveness: check failed; carrying on")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
