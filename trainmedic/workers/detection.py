"""Detection in the controller process: every watcher, wired to one incident router.

    Slurm watcher (poll + diff) ─── HeldSignals ──────────┐
    epilog / strigger spool (keeps its files) ────────────┤
    log watcher (job outputs; retries its own) ───────────┼─▶ IncidentRouter ─▶ RecoveryWorkflow
                                                          │   (signal-with-start: one incident
    in-process node agents ─ HeldSignals ─┐               │    per job and run; a node's own
    node-death detector ──── (the same) ──┤               │    signal: its quarantine)
    node-agent signal spool ──────────────┼─▶ NodeFanout ─┘
    agent channel (receiver) ─────────────┘   (a node's signal -> one per job on it,
                                               plus the node's own)

Only the node sources go through NodeFanout (their signals name a node, not a job);
the Slurm watcher, the epilog spool and the log watcher name their jobs and go to the
router directly. HeldSignals keeps, in order, what a source without a spool could not
deliver while Temporal was unreachable; spools keep their files until the router has
the report; the agent channel answers 503 and the agent keeps the finding.

Watchers only decide *that* something happened; the router decides which incident it
belongs to; the workflow decides what it means.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple, Protocol, cast

from pydantic import ValidationError
from temporalio.client import Client

from trainmedic.adapters.nvml.protocol import NvmlBackend
from trainmedic.adapters.slurm import SlurmBackend, SlurmError
from trainmedic.adapters.slurm.view import SlurmView
from trainmedic.catalog.loader import load_catalog
from trainmedic.catalog.matcher import Matcher
from trainmedic.channel.liveness import (
    AgentProbe,
    AgentTable,
    NodeDeathDetector,
    NodeProbe,
    slurmd_probe,
)
from trainmedic.channel.receiver import AgentReceiver
from trainmedic.config import Settings
from trainmedic.domain import EvidenceSource
from trainmedic.domain.incident import NODE_EVIDENCE, IncidentSignal
from trainmedic.domain.slurm import NodeStates, SlurmJob
from trainmedic.errors import ConfigError
from trainmedic.watchers.base import SignalSink
from trainmedic.watchers.logs import LogWatchConfig, LogWatcher
from trainmedic.watchers.node import KernelSource, NodeAgent
from trainmedic.watchers.remote_tail import RemoteFiles
from trainmedic.watchers.router import (
    HeldSignals,
    IncidentRouter,
    SlurmDetection,
    StartsWorkflows,
    build_slurm_detection,
    local_runner,
)
from trainmedic.watchers.slurm import SlurmWatcher
from trainmedic.watchers.spoolfile import (
    SpoolDir,
    SpoolItem,
    SpoolPolicy,
    SpoolRefused,
    load_key,
    spool_policy,
)
from trainmedic.workers.node_agent import SIGNAL_PURPOSE, agent_signal_problem

logger = logging.getLogger(__name__)

# Node-agent findings name a node, not a job; the jobs on that node are what failed.
# So does the controller's own verdict that a node died (its agent silent, the node not
# answering: trainmedic.channel.liveness).
NODE_SOURCES = frozenset(
    {
        EvidenceSource.KERNEL.value,
        EvidenceSource.NVML.value,
        EvidenceSource.AGENT_HEARTBEAT.value,
    }
)
# The controller's verdict that a node died (channel/liveness.py): its jobs cannot go on.
NODE_DOWN_KINDS = frozenset({"node_down"})


class InProcessAgent(NamedTuple):
    """A node agent run inside the controller (the lab's nodes: `trainmedic.lab.agents`
    builds these with the nodes' fake GPUs): its node, kernel log and NVML."""

    node: str
    kernel: KernelSource | Path
    nvml: NvmlBackend | None = None


class HasSlurmView(Protocol):
    """What NodeFanout reads of the Slurm watcher: its latest view (None before the
    first poll)."""

    @property
    def view(self) -> SlurmView | None: ...


class NodeFanout:
    """A SignalSink in front of the router: a kernel/NVML signal about a node becomes one
    signal per job running there (with its run), plus the node's own (its quarantine).

    A job on the node is told as a failure only when the finding shows the node unfit:
    the node died, or a line whose rule takes the node out (an Xid 79, an uncorrectable
    ECC error, an NVLink fault). Any other finding (an Xid the application is told of
    and may survive or die of, a kernel OOM kill that may have hit another job's
    process on a shared node) reaches the job as `node_evidence`: it joins the job's
    incident if Slurm reports the job failed, and opens nothing while the job runs.
    Opening one would act on a running job on a guess, and would close its run's
    incident before the job's real failure could arrive.
    """

    def __init__(
        self, router: SignalSink, watcher: HasSlurmView, matcher: Matcher | None = None
    ) -> None:
        self._router = router
        self._watcher = watcher
        self._matcher = matcher or Matcher(load_catalog())

    async def submit(self, signal: IncidentSignal) -> None:
        if signal.job_id is None and signal.source in NODE_SOURCES and signal.nodes:
            view = self._watcher.view
            if view is not None:
                kind = signal.kind if self.shows_node_unfit(signal) else NODE_EVIDENCE
                seen: set[str] = set()
                for jobs in view.jobs_on(signal.nodes).values():
                    for job in jobs:
                        if job.job_id in seen:
                            continue
                        seen.add(job.job_id)
                        await self._router.submit(
                            signal.model_copy(
                                update={"job_id": job.job_id, "run": job.restarts, "kind": kind}
                            )
                        )
        await self._router.submit(signal)

    def shows_node_unfit(self, signal: IncidentSignal) -> bool:
        """The node is dead, or a line of the finding matches a rule that drains it.

        The controller's catalog reads the lines again: the agent's rule ids may come
        from an older catalog, and a line no rule here knows shows nothing. The agent
        keeps its weightiest lines when it has more than it may send (watchers/node.py),
        so a drain line is not lost behind a flood of lesser ones."""
        if signal.kind in NODE_DOWN_KINDS and signal.source == EvidenceSource.AGENT_HEARTBEAT:
            # The controller's own verdict; an agent saying so of itself proves nothing.
            return True
        for evidence in signal.evidence:
            for match in self._matcher.match(evidence.text, evidence.source):
                if match.rule.drains:
                    return True
        return False


class SignalSpool:
    """Node agents on real nodes write signals as JSON files into a shared folder
    (`python -m trainmedic.workers.node_agent --spool DIR`); this delivers them.

    The folder and its files pass `spoolfile`'s checks (owner, mode, type, size, and the
    site key's HMAC when TRAINMEDIC_SPOOL_KEY_FILE is set). A file must also read as
    what a node agent sends: a kernel or NVML signal about named nodes, with evidence
    only about those nodes; anything else is set aside, since this folder can only
    speak for node agents. A file stays until the router took it; no spool error ends
    the loop.
    """

    def __init__(
        self,
        folder: Path,
        sink: SignalSink,
        interval: float = 0.5,
        *,
        policy: SpoolPolicy | None = None,
    ) -> None:
        self.folder = folder
        self.sink = sink
        self.interval = interval
        self.spool = SpoolDir(
            folder,
            policy if policy is not None else SpoolPolicy.from_env(),
            purpose=SIGNAL_PURPOSE,
            label="signal spool",
        )

    async def poll(self) -> int:
        result = await self.spool.drain(self._handle)
        return result.delivered

    async def _handle(self, item: SpoolItem) -> bool:
        try:
            signal = IncidentSignal.model_validate_json(item.payload)
        except (ValidationError, ValueError) as error:
            raise SpoolRefused("malformed", " ".join(str(error).split())[:300]) from error
        problem = agent_signal_problem(signal)
        if problem:
            raise SpoolRefused("malformed", problem)
        await self.sink.submit(signal)  # DeliveryError: the file stays for the next cycle
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # a spool error must never end the watcher
                logger.exception("signal spool: cycle failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)


class JobFollower:
    """Hands the log watcher the running jobs, with the full records it needs (output
    paths) read once per run of each job, not every poll."""

    def __init__(
        self, backend: SlurmBackend, watcher: SlurmWatcher, logs: LogWatcher, interval: float
    ) -> None:
        self._backend = backend
        self._watcher = watcher
        self._logs = logs
        self._interval = interval
        self._records: dict[str, SlurmJob] = {}

    async def sync_once(self) -> None:
        view = self._watcher.view
        if view is None:
            return
        running = {j.job_id: j for j in view.jobs.values() if j.state == "RUNNING"}
        for job_id, seen in running.items():
            known = self._records.get(job_id)
            if known is None or known.restarts != seen.restarts:
                try:
                    self._records[job_id] = await self._backend.get_job(job_id)
                except SlurmError as error:
                    logger.debug("log follower: job %s not read: %s", job_id, error)
                    continue
        for job_id in [j for j in self._records if j not in running]:
            del self._records[job_id]
        jobs = [
            record.model_copy(
                update={"state": "RUNNING", "nodes": running[job_id].node_names() or record.nodes}
            )
            for job_id, record in self._records.items()
        ]
        self._logs.sync(jobs)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sync_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval)


@dataclass
class Detection:
    slurm: SlurmDetection
    logs: LogWatcher
    follower: JobFollower
    fanout: NodeFanout
    agents: list[NodeAgent] = field(default_factory=list)
    spools: list[SignalSpool] = field(default_factory=list)
    # In front of the fanout for in-process node agents, which keep no spool: their
    # findings wait here for Temporal instead of being lost.
    held: HeldSignals | None = None
    # The agent channel (settings.agent_channel): receiver and node-death detector.
    receiver: AgentReceiver | None = None
    liveness: NodeDeathDetector | None = None

    @property
    def router(self) -> IncidentRouter:
        return self.slurm.router

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(
            self.slurm.run(stop),
            self.logs.run(stop),
            self.follower.run(stop),
            *(agent.run(stop) for agent in self.agents),
            *(spool.run(stop) for spool in self.spools),
            *([self.held.run(stop)] if self.held else []),
            *([self.receiver.run(stop)] if self.receiver else []),
            *([self.liveness.run(stop)] if self.liveness else []),
        )


def remote_files(settings: Settings) -> RemoteFiles | None:
    """SSH mode: the job logs are read over the Slurm connection (one command a cycle)."""
    if settings.slurm_access != "ssh":
        return None
    from trainmedic.adapters.slurm.ssh import ssh_runner

    return RemoteFiles(ssh_runner(settings))


def build_detection(
    client: Client,
    settings: Settings,
    backend: SlurmBackend,
    *,
    interval: float = 2.0,
    hang_after: timedelta = timedelta(minutes=10),
    agents: Sequence[InProcessAgent] = (),
    signal_spool: Path | None = None,
    quarantine_cooldown: timedelta = timedelta(minutes=10),
    agent_channel: bool | None = None,
    probes: Sequence[NodeProbe] | None = None,
) -> Detection:
    """Everything `trainmedic up` and `trainmedic worker` run beside the worker.

    `agent_channel` (default: settings.agent_channel) adds the agents' HTTP receiver and
    the node-death detector; `probes` are its direct questions to a silent node
    (default: a TCP connect to slurmd on the address the node's heartbeats come from).

    `agents` are node agents followed in-process: the lab's nodes. On a real cluster
    node agents run on the nodes and deliver through the agent channel or `signal_spool`.
    """
    slurm = build_slurm_detection(
        # Client satisfies the router's narrow protocol; its overloads hide that from mypy.
        cast(StartsWorkflows, client),
        settings,
        backend,
        runner=local_runner(settings),
        interval=interval,
        quarantine_cooldown=quarantine_cooldown,
    )
    # One compiled catalog for the fanout and the in-process agents, not one each.
    matcher = Matcher(load_catalog())
    fanout = NodeFanout(slurm.router, slurm.watcher, matcher)
    config = LogWatchConfig.model_validate({"progress": {"hang_after": hang_after}})
    logs = LogWatcher(
        slurm.router, cluster=settings.cluster, config=config, remote=remote_files(settings)
    )
    follower = JobFollower(backend, slurm.watcher, logs, interval=min(interval, 1.0))
    held = HeldSignals(fanout)
    node_agents = [
        NodeAgent(a.node, held, kernel=a.kernel, nvml=a.nvml, matcher=matcher) for a in agents
    ]
    spools = [
        SignalSpool(
            signal_spool or settings.state_dir / "spool" / "signals",
            fanout,
            policy=spool_policy(settings, signed=True),
        )
    ]
    receiver, liveness = None, None
    if settings.agent_channel if agent_channel is None else agent_channel:
        receiver, liveness = build_agent_channel(settings, fanout, held, slurm.watcher, probes)
    return Detection(
        slurm=slurm,
        logs=logs,
        follower=follower,
        fanout=fanout,
        agents=node_agents,
        spools=spools,
        held=held,
        receiver=receiver,
        liveness=liveness,
    )


def agent_site_key(settings: Settings) -> bytes:
    """The site key the agent channel derives node keys from; ConfigError if unset."""
    path = settings.site_key_file
    if path is None:
        raise ConfigError(
            "environment (TRAINMEDIC_*)",
            [
                "TRAINMEDIC_AGENT_CHANNEL is on but no key is set: set "
                "TRAINMEDIC_AGENT_KEY_FILE (or TRAINMEDIC_SPOOL_KEY_FILE) to a 0600 file "
                "of at least 16 random bytes"
            ],
        )
    return load_key(path)


def build_agent_channel(
    settings: Settings,
    fanout: SignalSink,
    held: SignalSink,
    watcher: SlurmWatcher,
    probes: Sequence[NodeProbe] | None = None,
) -> tuple[AgentReceiver, NodeDeathDetector]:
    """The receiver (findings -> `fanout`, answered 503 when it cannot take them) and the
    node-death detector (its verdicts wait in `held` while Temporal is away)."""
    host, _, port = settings.agent_listen.rpartition(":")
    table = AgentTable()
    receiver = AgentReceiver(
        fanout,
        agent_site_key(settings),
        table,
        host=host.strip("[]"),
        port=int(port),
        replay_window=settings.agent_replay_window.total_seconds(),
        max_body=settings.agent_max_body,
        rate=settings.agent_rate_per_node,
        burst=max(20.0, 4 * settings.agent_rate_per_node),
    )
    if probes is None:
        timeout = settings.agent_probe_timeout.total_seconds()
        port_ = settings.agent_slurmd_port
        probes = [AgentProbe(timeout), *([slurmd_probe(port_, timeout)] if port_ else [])]

    running: dict[str, list[str]] = {}
    seen: list[object] = [None]

    def jobs_on(node: str) -> list[str]:
        """Running jobs per node, computed once per Slurm view (20,000 jobs)."""
        view = watcher.view
        if view is None:
            return []
        if seen[0] is not view:
            seen[0] = view
            running.clear()
            for job in view.jobs.values():
                if job.state == "RUNNING":
                    for name in job.node_names():
                        running.setdefault(name, []).append(job.job_id)
        return running.get(node, [])

    def slurm_node(node: str) -> NodeStates | None:
        view = watcher.view
        return view.nodes.get(node) if view is not None else None

    liveness = NodeDeathDetector(
        table,
        held,
        jobs_on=jobs_on,
        slurm_node=slurm_node,
        probes=probes,
        silence=settings.agent_silence.total_seconds(),
        probe_interval=settings.agent_probe_interval.total_seconds(),
        failures_needed=settings.agent_probe_failures,
    )
    return receiver, liveness
