"""The read model the Slurm watcher diffs: all jobs and nodes, as small slotted records.

At 12,500 nodes and 20,000 jobs the full pydantic models cost seconds per cycle, these
records a few hundred milliseconds (bench/watch_scale.py). Two constructors fill them:

- from the full models (`JobView.from_job`, `NodeView.from_node`), for any
  `SlurmBackend` (`BackendSource`: simple, slower);
- the lean path (`lean_job`, `lean_node`, `parse_squeue_lean`, `parse_sinfo_lean`): reads
  only the fields the diff needs from `squeue --json` / `sinfo --json`, with msgspec (it
  skips the rest of each record without building it, ~10x faster than `json.loads` on
  60 MB of squeue output). `JsonSource` runs the two commands.

Both read states, reasons and exit codes with the parser's own helpers
(`trainmedic.adapters.slurm.parse`), and nodes answer the domain's node-state
predicates (`trainmedic.domain.slurm.NodeStates`), so the two paths agree by
construction (tests/unit/test_slurm_watcher.py checks it on captured output).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import msgspec

from trainmedic.adapters.slurm.errors import SlurmParseError, classify
from trainmedic.adapters.slurm.parse import (
    clean_text,
    exit_from_json,
    json_job_id,
    load_json,
    node_reason,
    parse_sinfo_json,
    raise_json_errors,
    slurm_int,
    split_job_state,
    split_node_state,
)
from trainmedic.adapters.slurm.protocol import CommandRunner, SlurmBackend
from trainmedic.domain.hostlist import HostlistError, expand
from trainmedic.domain.slurm import ExitStatus, NodeStates, SlurmJob, SlurmNode, job_is_held

logger = logging.getLogger(__name__)

# States in which a job still holds its nodes.
ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})


# ----------------------------------------------------------------------------- records


@dataclass(slots=True, frozen=True)
class JobView:
    """What the diff needs of one job. `nodes` stays a hostlist until someone asks."""

    job_id: str
    state: str
    restarts: int = 0
    held: bool = False
    reason: str | None = None
    nodes: str = ""
    exit: ExitStatus | None = None
    flags: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        """Still holds its nodes (running, completing or suspended)."""
        return self.state in ACTIVE_JOB_STATES

    def node_names(self) -> list[str]:
        if not self.nodes:
            return []
        try:
            return expand(self.nodes)
        except HostlistError:
            logger.warning("job %s: cannot expand node list %r", self.job_id, self.nodes)
            return []

    def render(self) -> str:
        """The catalog's 'slurm job_state=...' line (catalog/data/slurm_state.yaml)."""
        code = self.exit.code if self.exit else None
        signal = self.exit.signal if self.exit else None
        return (
            f"slurm job_state={self.state} reason={self.reason or 'None'} "
            f"exit_code={code} signal={signal}"
        )

    @classmethod
    def from_job(cls, job: SlurmJob) -> JobView:
        return cls(
            job_id=job.job_id,
            state=job.state,
            restarts=job.restarts,
            held=job.is_held,
            reason=job.state_reason,
            nodes=",".join(job.nodes),
            exit=job.exit,
            flags=tuple(job.state_flags),
        )


@dataclass(slots=True, frozen=True)
class NodeView(NodeStates):
    """What the diff needs of one node; its state means what `NodeStates` says."""

    name: str
    state: str
    state_flags: tuple[str, ...] = ()
    reason: str | None = None
    reason_user: str | None = None

    def render(self) -> str:
        return f"slurm node {self.name} state={self.state_text} reason={self.reason or 'None'}"

    @classmethod
    def from_node(cls, node: SlurmNode) -> NodeView:
        return cls(
            name=node.name,
            state=node.state,
            state_flags=tuple(node.state_flags),
            reason=node.reason,
            reason_user=node.reason_user,
        )


@dataclass(slots=True)
class SlurmView:
    jobs: dict[str, JobView]
    nodes: dict[str, NodeView]
    read_at: float  # time.monotonic() of the read

    def jobs_on(self, names: Iterable[str]) -> dict[str, list[JobView]]:
        """Jobs holding each of `names` (only computed when a node went down)."""
        wanted = set(names)
        found: dict[str, list[JobView]] = {n: [] for n in wanted}
        for job in self.jobs.values():
            if not job.active or not job.nodes:
                continue
            for name in job.node_names():
                if name in wanted:
                    found[name].append(job)
        return found


# ----------------------------------------------------------------------------- lean JSON


@lru_cache(maxsize=512)
def _job_state(states: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    base, flags = split_job_state(states)
    return base, tuple(flags)


@lru_cache(maxsize=512)
def _node_state(states: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    base, flags = split_node_state(states)
    return base, tuple(flags)


def lean_job(raw: Mapping[str, Any]) -> JobView:
    """One `squeue --json` record (22.05 or 24.11) -> JobView, reading only what we need."""
    numeric = slurm_int(raw.get("job_id"))
    if numeric is None:
        raise SlurmParseError("squeue --json: a job without job_id")
    job_id = json_job_id(raw, numeric)[0]
    state_value = raw.get("job_state") or "UNKNOWN"
    states = tuple(state_value) if isinstance(state_value, list) else (str(state_value),)
    state, flags = _job_state(states)
    reason = clean_text(raw.get("state_reason"))
    # 24.11 also says `hold: true` (priority 0); 22.05 only through the reason.
    held = job_is_held(state, reason, flags) or (state == "PENDING" and raw.get("hold") is True)
    nodes = raw.get("nodes") or ""
    if isinstance(nodes, list):
        nodes = ",".join(str(n) for n in nodes)
    exit_raw = raw.get("exit_code")
    active = state in ACTIVE_JOB_STATES
    return JobView(
        job_id=job_id,
        state=state,
        restarts=slurm_int(raw.get("restart_cnt")) or 0,
        held=held,
        reason=reason,
        nodes="" if nodes in ("(null)", "None") else str(nodes),
        # Decoded only for finished jobs: the rest are never rendered.
        exit=exit_from_json(exit_raw) if not active and exit_raw is not None else None,
        flags=flags,
    )


def lean_node(raw: Mapping[str, Any]) -> NodeView:
    """One 22.05 `sinfo --json` (or `scontrol --json show node`) `nodes[]` record -> NodeView."""
    state_value = raw.get("state") or "UNKNOWN"
    states = list(state_value) if isinstance(state_value, list) else [state_value]
    states += list(raw.get("state_flags") or [])
    state, flags = _node_state(tuple(str(s) for s in states))
    reason, reason_user = node_reason(raw.get("reason"), raw.get("reason_set_by_user"))
    return NodeView(
        name=str(raw["name"]),
        state=state,
        state_flags=flags,
        reason=reason,
        reason_user=reason_user,
    )


# msgspec decodes only the fields named below and skips the rest: a third of the
# standard library's time on 20,000 jobs (bench/watch_scale.py). `use_msgspec=False`
# reads the same output with `json`: the bench's baseline and the tests' cross-check.


class _MJob(msgspec.Struct):
    job_id: Any = None
    job_state: Any = None
    restart_cnt: Any = 0
    nodes: Any = ""
    state_reason: Any = None
    exit_code: Any = None
    array_job_id: Any = None
    array_task_id: Any = None
    array_task_string: Any = None
    hold: Any = None


class _MSqueue(msgspec.Struct):
    jobs: list[_MJob] | None = None
    errors: list[Any] | None = None


class _MNode(msgspec.Struct):
    name: str
    state: Any = None
    state_flags: list[Any] | None = None
    reason: Any = None
    reason_set_by_user: Any = None


class _MSinfo(msgspec.Struct):
    nodes: list[_MNode] | None = None
    errors: list[Any] | None = None
    sinfo: Any = None  # 24.11 shape: handed to the full parser


_SQUEUE_DECODER = msgspec.json.Decoder(_MSqueue)
_SINFO_DECODER = msgspec.json.Decoder(_MSinfo)


def _records(
    text: str | bytes, what: str, key: str, decoder: Any, use_msgspec: bool
) -> Iterable[Mapping[str, Any]] | None:
    """The command's `key` records as plain mappings, one at a time (None when the
    output has no such list), after Slurm's own `errors` are raised."""
    if not use_msgspec:
        plain = load_json(text, what)
        raise_json_errors(plain, what)
        records = plain.get(key)
        return records if isinstance(records, list) else None
    try:
        doc = decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise SlurmParseError(f"{what}: {exc}") from exc
    raise_json_errors({"errors": doc.errors}, what)
    structs = getattr(doc, key)
    return None if structs is None else (msgspec.structs.asdict(r) for r in structs)


def parse_squeue_lean(text: str | bytes, *, use_msgspec: bool = True) -> dict[str, JobView]:
    raws = _records(text, "squeue --json", "jobs", _SQUEUE_DECODER, use_msgspec)
    if raws is None:
        raise SlurmParseError("squeue --json: no 'jobs' list")
    return {view.job_id: view for view in map(lean_job, raws)}


def parse_sinfo_lean(text: str | bytes, *, use_msgspec: bool = True) -> dict[str, NodeView]:
    raws = _records(text, "sinfo --json", "nodes", _SINFO_DECODER, use_msgspec)
    if raws is None:
        return _nodes_full(text)
    return {view.name: view for view in map(lean_node, raws)}


def _nodes_full(text: str | bytes) -> dict[str, NodeView]:
    """24.11's per-partition `sinfo` shape: the full parser merges it per node."""
    as_text = text.decode() if isinstance(text, bytes) else text
    return {n.name: NodeView.from_node(n) for n in parse_sinfo_json(as_text)}


# ----------------------------------------------------------------------------- sources


class ViewSource(Protocol):
    async def read(self) -> SlurmView: ...


class BackendSource:
    """A view from any `SlurmBackend` (full models, then reduced)."""

    def __init__(self, backend: SlurmBackend) -> None:
        self._backend = backend

    async def read(self) -> SlurmView:
        jobs = await self._backend.list_jobs()
        nodes = await self._backend.list_nodes()
        return SlurmView(
            jobs={j.job_id: JobView.from_job(j) for j in jobs},
            nodes={n.name: NodeView.from_node(n) for n in nodes},
            read_at=time.monotonic(),
        )


class JsonSource:
    """A view straight from `squeue --json` and `sinfo --json` through `runner`, on the
    lean path (`use_msgspec=False`: the standard library's json, for the bench's baseline)."""

    def __init__(
        self, runner: CommandRunner, *, timeout: float = 30.0, use_msgspec: bool = True
    ) -> None:
        self._runner = runner
        self._timeout = timeout
        self._use_msgspec = use_msgspec

    async def _json(self, argv: list[str]) -> str:
        result = await self._runner.run(argv, self._timeout)
        if result.returncode != 0:
            raise classify(argv, result.returncode, result.stderr or result.stdout)
        return result.stdout

    async def read(self) -> SlurmView:
        squeue, sinfo = await asyncio.gather(
            # --states=all: 24.11 applies squeue's default filter to --json and would hide
            # the FAILED/NODE_FAIL jobs the diff exists to see (22.05 ignores it).
            self._json(["squeue", "--json", "--states=all"]),
            self._json(["sinfo", "--json"]),
        )
        fast = self._use_msgspec
        return SlurmView(
            jobs=parse_squeue_lean(squeue, use_msgspec=fast),
            nodes=parse_sinfo_lean(sinfo, use_msgspec=fast),
            read_at=time.monotonic(),
        )
