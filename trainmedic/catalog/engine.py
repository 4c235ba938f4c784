"""The Attributor: evidence in, one Diagnosis out.

Order of reasoning (docs/architecture.md "Failure taxonomy"):
1. every line (logs of all ranks, kernel lines, NVML findings, Slurm state rendered as
   lines) is matched against the catalog and tagged with rank/node/GPU;
2. root rules beat cascades; among roots the highest precedence wins (hardware over the
   CUDA error it causes), then the earliest line;
3. culprits are the nodes/ranks where the winning category's roots fired, or that the
   line itself names (a rule's `rank`/`host` groups), or torchelastic's failure summary
   names; a "node" fault seen on most nodes is systemic, so nothing is drained. Only
   hardware rules (`blames_node`) isolate nodes; a stop or an escalation still says
   where the failure happened (it has no effect on the node);
4. with only cascades or confirmations the answer says so (low confidence, escalate
   when nothing points anywhere) and carries the best lines; among NCCL timeouts the
   rank whose collective sequence number lags the others is the one they waited for.

The summary is the winning rule's title ("uncorrectable ECC error"), never a raw line:
it becomes the headline, the drain reason and the job comment.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from trainmedic.catalog.correlation import (
    LineContext,
    Topology,
    elastic_field,
    nccl_thread,
    parse_line,
    uncoloured,
)
from trainmedic.catalog.loader import Catalog, load_catalog
from trainmedic.catalog.matcher import LineMatch, Matcher
from trainmedic.catalog.model import Rule
from trainmedic.catalog.scanner import Scanner, clip
from trainmedic.domain import (
    ISOLATING,
    Action,
    AttributionRequest,
    Category,
    Diagnosis,
    Evidence,
    EvidenceSource,
    Role,
    SlurmObservation,
)

log = logging.getLogger(__name__)

_MAX_FINDINGS_PER_RULE = 64  # bounded memory however many ranks repeat a line
_MAX_EVIDENCE = 12
_SAYS_WHERE = (Action.ESCALATE, Action.STOP)  # name the node, with no effect on it
_NEIGHBOUR_LINES = 8  # a wrapped line borrows the rank of its neighbours' prefixes
_ELASTIC_BLOCK_LINES = 12
_TRACEBACK_LINES = 80  # how far above its exception a traceback's frame may sit
_CHECKPOINT_FRAMES = ("checkpoint.resume_frame", "checkpoint.save_frame")
# A SIGKILL with no message of its own, and a phase at its host-memory peak at most a few
# lines above it: a start-up's (a model's loading cut short, DeepSpeed's memory report)
# or a checkpoint's save.
_SIGKILL = "proc.sigkill"
_STARTUP_PEAK = "oom.host_startup_peak"
_SAVE_PEAK = "oom.host_save_peak"
_HOST_MEMORY_PEAKS = (_STARTUP_PEAK, _SAVE_PEAK)
_STARTUP_DONE = "oom.host_startup_done"
_STARTUP_PEAK_LINES = 12  # a launcher's traceback may come between (tune g-824: 9 lines)
# Slurm's line in the job's log that it ended the job at its time limit, and how close
# below a program's error it comes when the job hung after that error.
_TIME_LIMIT = "slurm.time_limit"
# The time limit as the log or Slurm's state tells it, and the framework's own word that
# it did not requeue the job before that limit: nothing will, so the framework decides.
_TIME_LIMITS = frozenset({_TIME_LIMIT, "slurm_state.timeout"})
_REQUEUE_NOT_DONE = ("framework.requeue_failed", "framework.requeue_refused")
# Ray's "its node has died" and, on a line just under it, the GCS's reason.
_RAY_NODE_DIED = "ray.node_died"
_RAY_NODE_STOPPED = "ray.node_terminated_expectedly"
_RAY_REASON_LINES = 3
_HUNG_AFTER_ERROR_LINES = 12
# Context rules that tell an uncaught error (its traceback's header) and a teardown
# (a process told to stop) apart near the time limit's line.
_TRACEBACK_HEADER = "python.traceback_header"
_SIGTERM = "proc.sigterm_received"
# faulthandler's header before it prints every thread's stack of a dying process
# ("Fatal Python error: Aborted"); a dump under it shows where the process was when it
# crashed (tune g-269: the watchdog's abort after a timeout), not a hung job's.
_CRASH_HEADER = "Fatal Python error:"
_LIVE_DUMP_HEADER = "python.live_stack_dump"
_CRASH_DUMP_LINES = 400
_MAX_DUMP_HEADERS = 10_000
# A collective timeout whose sequence number is this low struck the job's first
# collectives (the barrier and parameter broadcast that follow set-up).
_START_UP_SEQ = 3
# PyTorch's default NCCL timeout is 10 or 30 minutes; one set below this is the job's own.
_SHORT_TIMEOUT_MS = 300_000
# Ranks of one group that are out of step sit a few collectives apart (tune g-090: 2,
# g-142: 4): a blocked collective stops its rank soon after. Numbers much further apart
# count in different process groups whose lines do not name them (tune g-592: 64088
# and 96117, a model-parallel and a data-parallel group): they cannot be compared.
_MAX_STEP_SPREAD = 64
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
# The rule that marks the thread of NCCL's bootstrap remote-allocation service.
_REM_ALLOCATOR = "nccl.rem_allocator_service"
# Python printed an exception and went on, and how many lines under the marker its
# traceback header may come: CPython's unraisable hook ("Exception ignored in: ...") puts
# it on the next line, NumPy 2's ABI warning under its paragraph of advice.
_SURVIVED_MARKER_REACH = {"python.exception_unraisable": 1, "python.numpy1_extension": 12}
# multiprocessing's spawned child unpickling its parent's data: the frame line right
# above the error it raises when the parent is gone, and the rule that reads that error
# (an EOFError, a truncated pickle) as a corrupt file. A MemoryError there is the child's
# own (tune g-1050) and stays.
_SPAWN_CHILD_UNPICKLING = "python.spawn_child_unpickling"
_SPAWN_FRAME_LINES = 2
_TRUNCATED_INPUT = "checkpoint.corrupt"
# Rules of other categories than the program's own whose error a finaliser raises at the
# teardown (MosaicML Streaming waits for its node's leader in StreamingDataset.__del__).
_RAISED_IN_FINALISERS = frozenset({"dataloader.streaming_leader_timeout"})
_EXITED_WITHOUT_DESTROY = "torch.exited_without_destroy"
_RUNTIME_ERROR_OTHER = "python.runtime_error_other"
_EXCEPTION_OTHER = "python.exception_other"
# What a rank's peers see when it is gone: a stall, a collective or a store that fails;
# and the lines of a job that was being stopped (its ranks leave because they were told).
_PEERS_VIEW = frozenset({Category.HANG, Category.NETWORK_NCCL})
_STORE_LOST = "torch.store_connection_lost"
_TOLD_TO_STOP = frozenset(
    {"proc.sigterm_received", "slurm.time_limit", "slurm.preemption", "slurm.cancelled"}
)
# A line that names the Slurm job it is about ("Job 42664148 exceeded memory limit"), and
# slurmstepd's line that ends that job on a node ("*** JOB 42664148 ON cn3152 CANCELLED").
_JOB_ID = re.compile(r"\bJob (\d+)\b")
_CANCELLED_ON = re.compile(
    r"\*\*\* (?:JOB|STEP) (\d+)(?:\.\S+)? ON ([A-Za-z0-9][\w.-]*) CANCELLED AT "
)
# The collective a watchdog line reports: "WorkNCCL(SeqNum=2109, OpType=_ALLGATHER_BASE,
# NumelIn=262711296, ...". Point-to-point operations count in a counter of their own
# (PyTorch 2.4+) and all-to-all's sizes differ by design: only these are compared.
_WORK = re.compile(r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)(?:, NumelIn=(\d+))?")
_COMPARED_OPS = frozenset(
    {
        "ALLREDUCE",
        "BROADCAST",
        "REDUCE",
        "ALLGATHER",
        "_ALLGATHER_BASE",
        "REDUCE_SCATTER",
        "_REDUCE_SCATTER_BASE",
        "BARRIER",
    }
)
_SAME_SIZE_OPS = _COMPARED_OPS - {"BARRIER"}
# Which process group a watchdog line speaks for, across ranks: PyTorch 2.3+ prints the
# group's GUID, the same on every rank ("PG GUID 5(DATA_PARALLEL_GROUP)"); its "PG ID" is
# a counter of each process, the same across ranks only for the default group (0).
_PG_GUID = re.compile(r"PG GUID (\S+?)\(")
# Lines that name no group (PyTorch before 2.3) are compared only where their number is
# past every group's start-up: two groups' counters meet at #2 all the time, at #3742816
# hardly ever.
_UNNAMED_GROUP_MIN_SEQ = 100
_ENQUEUED = re.compile(
    r"Received a dump signal due to a collective timeout from .{1,120}?"
    r"Last enqueued NCCL work: (\d+), last completed NCCL work: (-?\d+)"
)
# A line's process group by its number, "[PG 0 Rank 3]" or "[PG ID 0 PG GUID ...]".
_PG = re.compile(r"\[PG (?:ID )?(\d+)")


@dataclass(slots=True)
class Finding:
    rule: Rule
    evidence: Evidence
    order: tuple[int, int, int]  # (source file index, line number, sequence)
    xid: int | None = None
    seq: int | None = None  # a collective's sequence number, where the line gives one
    named: bool = False  # the node is written on the line, not inferred from the layout
    # The rank is what the rule's pattern reads off the line ("local_rank: 2"), not who
    # logged it.
    rank_named: bool = False


@dataclass(slots=True)
class _Collector:
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, set[str]] = field(default_factory=dict)
    ranks: dict[str, set[int]] = field(default_factory=dict)
    # torchelastic's "Root Cause (first observed failure)" block: host and rank.
    elastic_hosts: list[str] = field(default_factory=list)
    elastic_ranks: list[int] = field(default_factory=list)
    # The first host/rank of a failure block without a "Root Cause" header (a "Failures:"
    # list, or an excerpt that starts inside the block), and hosts that context lines
    # name (a Ray actor's "ip:"); used only where nothing better names a culprit.
    fallback_hosts: list[str] = field(default_factory=list)
    fallback_ranks: list[int] = field(default_factory=list)
    # Where stack dumps begin, per (file index, line): True for faulthandler's header of
    # a dying process ("Fatal Python error: Aborted"), False for a dump taken of a live
    # one ("Timeout (0:30:00)!", py-spy). Not capped per rule as findings are, so every
    # rank's dump keeps its header however many ranks there are.
    dump_headers: list[tuple[int, int, bool]] = field(default_factory=list)
    seq: int = 0

    def hosts(self) -> list[str]:
        return list(dict.fromkeys(self.elastic_hosts or self.fallback_hosts))

    def elastic(self) -> list[int]:
        return list(dict.fromkeys(self.elastic_ranks or self.fallback_ranks))

    def add(self, finding: Finding) -> None:
        rid = finding.rule.id
        self.counts[rid] = self.counts.get(rid, 0) + 1
        if finding.evidence.node:
            self.nodes.setdefault(rid, set()).add(finding.evidence.node)
        if finding.evidence.rank is not None:
            self.ranks.setdefault(rid, set()).add(finding.evidence.rank)
        bucket = self.findings.setdefault(rid, [])
        if len(bucket) < _MAX_FINDINGS_PER_RULE:
            bucket.append(finding)

    def all(self) -> list[Finding]:
        return [f for bucket in self.findings.values() for f in bucket]


def slurm_lines(obs: SlurmObservation, nodelist: list[str]) -> list[tuple[str, str | None]]:
    """Render Slurm's state as catalog-matchable lines: [(text, node)]."""
    lines: list[tuple[str, str | None]] = []
    if obs.job_state:
        lines.append(
            (
                f"slurm job_state={obs.job_state.upper()} reason={obs.state_reason} "
                f"exit_code={obs.exit_code} signal={obs.signal}",
                None,
            )
        )
    scope = set(nodelist)
    for node, state in sorted(obs.node_states.items()):
        if scope and node not in scope:
            continue
        reason = obs.node_reasons.get(node, "None")
        lines.append((f"slurm node {node} state={state.upper()} reason={reason}", node))
    for node, reason in sorted(obs.node_reasons.items()):
        if (not scope or node in scope) and node not in obs.node_states:
            lines.append((f"slurm node {node} state=UNKNOWN reason={reason}", node))
    return lines


class Attributor:
    """The recovery loop's attribution step: AttributionRequest -> Diagnosis."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        self.catalog = catalog if catalog is not None else load_catalog()
        self.matcher = Matcher(self.catalog)

    @property
    def version(self) -> str:
        return self.catalog.version

    # -- gathering ---------------------------------------------------------------------

    def _record(
        self,
        col: _Collector,
        matches: list[LineMatch] | tuple[LineMatch, ...],
        text: str,
        ctx: LineContext,
        topo: Topology,
        source: EvidenceSource,
        file: str | None,
        file_index: int,
        line_no: int,
    ) -> None:
        if source is EvidenceSource.LOG and len(col.dump_headers) < _MAX_DUMP_HEADERS:
            if _CRASH_HEADER in text:
                col.dump_headers.append((file_index, line_no, True))
            elif any(m.rule.id == _LIVE_DUMP_HEADER for m in matches):
                col.dump_headers.append((file_index, line_no, False))
        for match in matches:
            # A line may name several ranks ("[missing ranks: 3, 6]"): one finding each.
            for named_rank in match.ranks or (match.rank,):
                node, rank = ctx.node, ctx.rank
                explicit = node is not None and not ctx.node_from_layout
                # What the line names beats who logged it: "[rank0]: ... around rank 39".
                if named_rank is not None:
                    rank = named_rank
                if match.host and (named := topo.plausible_host(match.host)):
                    node, explicit = named, True
                    if match.rule.role is Role.CONTEXT:
                        col.fallback_hosts.append(named)
                gpu = ctx.gpu
                if gpu is None and match.pci:
                    # An Xid names its GPU by PCI bus id; the node's table gives the index.
                    gpu = topo.gpu_of(node, match.pci)
                col.seq += 1
                col.add(
                    Finding(
                        rule=match.rule,
                        evidence=Evidence(
                            source=source,
                            text=clip(uncoloured(text)),
                            file=file,
                            line_no=line_no,
                            rule_id=match.rule.id,
                            node=node,
                            rank=rank,
                            gpu=gpu,
                        ),
                        order=(file_index, line_no, col.seq),
                        xid=match.xid,
                        seq=match.seq,
                        named=explicit,
                        rank_named=named_rank is not None,
                    )
                )

    def _scan_file(self, col: _Collector, path: str, index: int, topo: Topology) -> None:
        scanner = Scanner(self.matcher)
        in_root_cause = 0
        first_block: dict[str, str | int] = {}
        for hit in scanner.scan_path(path):
            ids = {m.rule.id for m in hit.matches}
            if "torchelastic.child_failed" in ids and "Root Cause" in hit.text:
                in_root_cause = hit.line_no
                continue
            if "torchelastic.root_cause_field" in ids:
                got = elastic_field(hit.text)
                if got is None:
                    continue
                key, value = got
                if key == "host" and isinstance(value, str):
                    value = topo.plausible_host(value) or (value if not topo.known else "")
                if value == "":
                    continue
                if in_root_cause and hit.line_no - in_root_cause < _ELASTIC_BLOCK_LINES:
                    if key == "host" and isinstance(value, str):
                        col.elastic_hosts.append(value)
                    elif isinstance(value, int):
                        col.elastic_ranks.append(value)
                else:
                    # Without the header only the block's first entry counts: later ones
                    # are the ranks torn down after it.
                    first_block.setdefault(key, value)
                continue
            ctx = parse_line(hit.text, topo)
            self._record(
                col, hit.matches, hit.text, ctx, topo, EvidenceSource.LOG, path, index, hit.line_no
            )
        if isinstance(host := first_block.get("host"), str):
            col.fallback_hosts.append(host)
        if isinstance(rank := first_block.get("rank"), int):
            col.fallback_ranks.append(rank)

    def gather(self, request: AttributionRequest) -> tuple[_Collector, Topology]:
        topo = Topology(
            request.nodelist,
            request.tasks_per_node,
            addrs=request.node_addrs,
            gpus=request.gpu_bus_ids,
        )
        col = _Collector()
        base = len(request.log_paths)
        for index, path in enumerate(request.log_paths):
            try:
                self._scan_file(col, path, index, topo)
            except OSError as error:
                log.warning("cannot read log %s: %s", path, error)
        for offset, item in enumerate(request.evidence):
            matches = self.matcher.match(item.text, item.source)
            if not matches:
                continue
            ctx = parse_line(item.text, topo)
            if item.node:
                ctx.node, ctx.node_from_layout = item.node, False
            ctx.rank = item.rank if item.rank is not None else ctx.rank
            ctx.gpu = item.gpu if item.gpu is not None else ctx.gpu
            line_no = item.line_no if item.line_no is not None else offset + 1
            self._record(
                col,
                matches,
                item.text,
                ctx,
                topo,
                item.source,
                item.file,
                base + 1 + offset,
                line_no,
            )
        if request.slurm is not None:
            for offset, (text, node) in enumerate(slurm_lines(request.slurm, request.nodelist)):
                matches = self.matcher.match(text, EvidenceSource.SLURM)
                if text.startswith("slurm node "):
                    # A node's reason may itself be a catalog line ("Xid 79", "Kill task
                    # failed"); it is free text (an admin, a health check), not Slurm's
                    # state, so the Slurm-state rules do not read it.
                    reason = text.split(" reason=", 1)[-1]
                    matches = [*matches, *self.matcher.match(reason, None)]
                if matches:
                    ctx = LineContext(node=node)
                    self._record(
                        col,
                        matches,
                        text,
                        ctx,
                        topo,
                        EvidenceSource.SLURM,
                        None,
                        base + 100_000,
                        offset,
                    )
        return col, topo

    # -- deciding ----------------------------------------------------------------------

    def attribute(self, request: AttributionRequest) -> Diagnosis:
        col, topo = self.gather(request)
        return self.decide(col, topo, request)

    def decide(self, col: _Collector, topo: Topology, request: AttributionRequest) -> Diagnosis:
        findings = col.all()
        # Lines read as symptoms whatever their rule: a dying process's stack dump, and
        # NCCL's service thread answering a peer.
        symptoms = [f for f in findings if _in_crash_dump(f, col.dump_headers)]
        symptoms += _of_service_threads(findings)
        dropped = (
            _survived_exceptions(findings)
            + _explained_node_deaths(findings)
            + _orphaned_spawn_children(findings)
        )
        demoted = {id(f) for f in symptoms + dropped}
        roots = [f for f in findings if f.rule.role is Role.ROOT and id(f) not in demoted]
        cascades = [f for f in findings if f.rule.role is Role.CASCADE and id(f) not in demoted]
        confirms = [f for f in findings if f.rule.role is Role.CONFIRMATION] + symptoms
        if teardown := self._after_a_rank_exited(col, findings, roots + cascades + confirms):
            return teardown
        if roots:
            return self._from_roots(col, topo, roots, cascades + confirms)
        if cascades:
            return self._from_cascades(col, cascades, confirms, len(topo.nodelist) <= 1)
        if confirms:
            return self._unknown(
                col,
                confirms,
                f"only symptoms ({_titles(confirms)}); the cause is not in the evidence",
                0.25,
            )
        slurm = request.slurm
        summary = "no catalog line matched the evidence"
        if slurm is not None and (slurm.exit_code or slurm.signal):
            summary = (
                f"job ended with exit code {slurm.exit_code}, signal {slurm.signal}; " + summary
            )
        return self._unknown(col, [], summary, 0.1)

    def _key(self, finding: Finding) -> tuple[int, int, int, int]:
        return (
            -finding.rule.precedence,
            finding.order[0] if finding.evidence.source is EvidenceSource.LOG else -1,
            finding.order[1],
            finding.order[2],
        )

    def _from_roots(
        self, col: _Collector, topo: Topology, roots: list[Finding], others: list[Finding]
    ) -> Diagnosis:
        roots.sort(key=self._key)
        findings = col.all()
        primary = (
            _error_before_time_limit(roots, findings)
            or _requeue_not_done_before_time_limit(roots)
            or roots[0]
        )
        rule = primary.rule
        same = [f for f in roots if f.rule.category is rule.category]
        confidence = rule.confidence
        action = rule.action
        category, transient = rule.category, rule.transient
        notes: list[str] = []
        if category is Category.USER_CODE and (
            frame := _context_above(primary, findings, *_CHECKPOINT_FRAMES)
        ):
            # The program's error came out of a checkpoint loader (the saved state does not
            # fit this run) or saver: every restart loads or saves the same way again. An
            # error that its own rule does not already call deterministic (a storage
            # timeout, a connection error: the catch-alls escalate) may pass on retry, so
            # a person looks instead of the job stopping.
            category = Category.CHECKPOINT
            if action is Action.STOP:
                transient = False
            notes.append(frame.rule.title)
            others = [frame, *others]
        elif rule.id == _SIGKILL and (
            (peak := _context_above(primary, findings, *_HOST_MEMORY_PEAKS, _STARTUP_DONE))
            and peak.rule.id in _HOST_MEMORY_PEAKS
            and primary.order[1] - peak.order[1] <= _STARTUP_PEAK_LINES
        ):
            # Killed at a host-memory peak (a start-up phase, a checkpoint's save): the OOM
            # killer's signature with the phase that explains it; the same model peaks
            # the same way again.
            category, action, transient = Category.OOM_HOST, Action.STOP, False
            notes.append(peak.rule.title)
            others = [peak, *others]
        elif rule.id == _RUNTIME_ERROR_OTHER and _context_above(
            primary, findings, _EXCEPTION_OTHER
        ):
            # The program's RuntimeError wraps an exception no rule knows (a hub's 503 "was
            # the direct cause of" a failed load, review 25): whether that one passes on a
            # retry is for a person, so the wrapper does not stop the job.
            action, transient = Action.ESCALATE, None
        if action is Action.ESCALATE and (proof := _hardware_proof(primary, same)):
            action, transient = Action.DRAIN_AND_RESTART, False
            notes.append(f"with {proof.rule.title} on {proof.evidence.node}")
        nodes: list[str] = []
        if rule.blames_node:
            for f in same:
                if f.rule.blames_node and f.evidence.node and f.evidence.node not in nodes:
                    nodes.append(f.evidence.node)
            for rid in {f.rule.id for f in same if f.rule.blames_node}:
                for node in sorted(col.nodes.get(rid, ())):
                    if node not in nodes:
                        nodes.append(node)
        ranks: list[int] = []
        for f in same:
            if f.evidence.rank is not None and f.evidence.rank not in ranks:
                ranks.append(f.evidence.rank)
        for rid in {f.rule.id for f in same}:
            for rank in sorted(col.ranks.get(rid, ())):
                if rank not in ranks:
                    ranks.append(rank)
        gpus = sorted(
            {
                f"{f.evidence.node}:{f.evidence.gpu}"
                for f in same
                if f.rule.blames_node and f.evidence.node and f.evidence.gpu is not None
            }
        )
        if rule.blames_node and not nodes and col.hosts():
            nodes = col.hosts()
        if rule.blames_node:
            total = len(topo.nodelist)
            if len(nodes) >= 2 and total and len(nodes) * 2 > total:
                notes.append(f"seen on {len(nodes)}/{total} nodes: systemic, not one node")
                if action in ISOLATING:
                    action = Action.ESCALATE
                confidence *= 0.6
                nodes = []
            elif not nodes and action in ISOLATING:
                notes.append("culprit node not identified")
                confidence -= 0.15
                if rule.without_culprit is not None:
                    action = rule.without_culprit
                elif action is Action.RESTART_EXCLUDING:
                    action = Action.RESTART  # excluding nobody is a plain restart
        elif action in _SAYS_WHERE:
            # A person looks, or the owner reads why the job stopped: say where it
            # happened. Only these name a node that is not at fault (a restart is verified
            # away from its culprits), and only a node the text writes down, never one
            # inferred from a rank; neither drains nor excludes anything.
            nodes = _where(same, col) or _cancelled_on(primary, findings, topo)
        if nodes and action not in ISOLATING and action not in _SAYS_WHERE:
            nodes = []
        # Several independent root categories on different nodes: less sure.
        categories = {f.rule.category for f in roots if f.rule.precedence >= 50}
        if len(categories) > 1:
            confidence -= 0.05
        if not ranks and col.elastic() and not rule.blames_node:
            ranks = col.elastic()
        if (
            not ranks
            and len(topo.nodelist) <= 1  # the header's number is a process index per node
            and (header := _context_above(primary, findings, "python.traceback_of_rank"))
        ):
            ranks = [header.evidence.rank] if header.evidence.rank is not None else []
        if not ranks:
            # Any line of the winning cause may sit next to the rank's prefix (a kernel's
            # assertion lines come first, the RuntimeError near "destroyed on rank 0").
            for f in [primary, *same]:
                if (borrowed := _neighbour_rank(f, findings)) is not None:
                    ranks = [borrowed]
                    break
        evidence = self._pick_evidence(same, others, lead=primary)
        summary = rule.title
        if notes:
            summary += "; " + "; ".join(notes)
        return Diagnosis(
            category=category,
            action=action,
            culprit_nodes=nodes,
            culprit_ranks=sorted(ranks)[:64],
            culprit_gpus=gpus,
            transient=transient,
            confidence=round(max(0.05, min(1.0, confidence)), 2),
            evidence=[f.evidence for f in evidence],
            rule_ids=list(dict.fromkeys(f.rule.id for f in evidence)),
            catalog_version=self.catalog.version,
            summary=summary,
        )

    def _from_cascades(
        self,
        col: _Collector,
        cascades: list[Finding],
        confirms: list[Finding],
        single_node: bool,
    ) -> Diagnosis:
        cascades.sort(key=lambda f: (-f.rule.confidence, f.order))
        rule = cascades[0].rule
        category, action, transient = rule.category, rule.action, rule.transient
        summary = f"{rule.title} (a symptom: no local root error found)"
        seqs = [f.seq for f in cascades if f.seq is not None]
        limits = [int(m.group(1)) for f in cascades if (m := _TIMEOUT_MS.search(f.evidence.text))]
        groups = _seqs_by_group(cascades)
        lagging = _lagging_ranks(groups)
        # Four shapes of a collective timeout that a restart meets again. Ranks that called
        # different collectives as the same one are the program's doing: it stops. Whether
        # the code, the data or the network kept the ranks apart otherwise is for a person,
        # not a blind restart.
        if mismatch := _mismatched_collective(cascades):
            # Same sequence number, different operation or size (tune g-674, g-675): the
            # ranks took different code paths (a save on some ranks, uneven batches).
            # The network cannot change what a rank asked for; a restart asks again.
            category, action, transient = Category.HANG, Action.STOP, False
            summary = f"{rule.title}: the ranks disagree on {mismatch[0]}"
            lagging = mismatch[1]
        elif seqs and max(seqs) <= _START_UP_SEQ:
            # The ranks never all reached their first collectives (tune g-025, g-033, g-087:
            # one rank still preprocessing or caching data, ranks on different code paths).
            category, action, transient = Category.HANG, Action.ESCALATE, None
            summary = (
                f"{rule.title} at start-up (collective #{max(seqs)}): the ranks never all "
                "reached their first collectives"
            )
        elif limits and max(limits) < _SHORT_TIMEOUT_MS:
            # The job set its own timeout far below PyTorch's default (tune g-085, g-086: 60 s
            # while rank 0 scans labels or validates alone): it fires at the same place again.
            category, action, transient = Category.HANG, Action.ESCALATE, None
            summary = (
                f"{rule.title} after only {max(limits) // 1000} s: the job's own collective "
                "timeout is shorter than the work one rank does alone"
            )
        elif _out_of_step(groups) and not lagging:
            # Ranks of one group timed out in different collectives and no few of them are
            # simply behind the rest (tune d-075, g-090): they issued different numbers of
            # collectives (a code path or uneven data per rank). A few ranks behind everyone
            # else are a straggler or the rank that stopped first (tune a-051): restarted.
            category, action, transient = Category.HANG, Action.ESCALATE, None
            summary = f"{rule.title}: the ranks are out of step (different collectives)"
        # Who fell behind, whom torchelastic's summary names, or else the first rank a
        # cascade's own words name ("failed (exitcode: -7) local_rank: 2", tune g-074);
        # never every rank that printed its own timeout. Those words give a local rank
        # (per node), which is the job's rank only on a single node.
        named = [f.evidence.rank for f in sorted(cascades, key=lambda f: f.order) if f.rank_named]
        named = named if single_node else []
        ranks = lagging or col.elastic() or [r for r in named[:1] if r is not None]
        nodes = _where(cascades, col) if action is Action.ESCALATE else []
        evidence = self._pick_evidence(cascades, confirms)
        return Diagnosis(
            category=category,
            action=action,
            culprit_nodes=nodes,
            culprit_ranks=ranks,
            transient=transient,
            confidence=round(min(rule.confidence, 0.45), 2),
            evidence=[f.evidence for f in evidence],
            rule_ids=list(dict.fromkeys(f.rule.id for f in evidence)),
            catalog_version=self.catalog.version,
            summary=summary,
        )

    def _after_a_rank_exited(
        self, col: _Collector, findings: list[Finding], failing: list[Finding]
    ) -> Diagnosis | None:
        """Every line of the failure (`failing`: roots, cascades, confirmations) comes after
        a rank said it was exiting with its process group still open, at least one is a
        peer's collective failing or stuck, and none is of another kind: the peers lost a
        rank that left, at the end of its work or of its error (tune g-1017, a watchdog
        stuck in the teardown). A store read of 0 bytes alone is not enough: a finished
        run prints that at shutdown too (review 25); nor is a job that was being stopped
        (a SIGTERM, a preemption): its ranks leave because they were told to."""
        exits = [f for f in findings if f.rule.id == _EXITED_WITHOUT_DESTROY]
        failing = [f for f in failing if f.rule.role is not Role.CONTEXT]
        if not exits or not failing:
            return None
        if any(f.rule.id in _TOLD_TO_STOP for f in findings):
            return None
        if not any(
            f.rule.role in (Role.ROOT, Role.CASCADE) and f.rule.category in _PEERS_VIEW
            for f in failing
        ):
            return None
        if any(f.rule.category not in _PEERS_VIEW and f.rule.id != _STORE_LOST for f in failing):
            return None
        first = min(exits, key=lambda f: f.order)
        if not all(f.order[0] == first.order[0] and f.order > first.order for f in failing):
            return None
        evidence = [first, *sorted(failing, key=lambda f: f.order)][:_MAX_EVIDENCE]
        return Diagnosis(
            category=Category.USER_CODE,
            action=Action.STOP,
            culprit_nodes=_where(evidence, col),
            culprit_ranks=[],
            transient=False,
            confidence=0.45,
            evidence=[f.evidence for f in evidence],
            rule_ids=list(dict.fromkeys(f.rule.id for f in evidence)),
            catalog_version=self.catalog.version,
            summary=(
                f"{first.rule.title}: {_titles(failing)} after it; the program's end or "
                "its error, not the network"
            ),
        )

    def _unknown(
        self, col: _Collector, lines: list[Finding], summary: str, confidence: float
    ) -> Diagnosis:
        lines = sorted(lines, key=lambda f: f.order)[:_MAX_EVIDENCE]
        ranks = list(dict.fromkeys(f.evidence.rank for f in lines if f.evidence.rank is not None))
        return Diagnosis(
            category=Category.UNKNOWN,
            action=Action.ESCALATE,
            # Escalating touches no node: say where it happened, for the person who looks.
            culprit_nodes=_where(lines, col),
            culprit_ranks=col.elastic() or ranks[:64],
            transient=None,
            confidence=confidence,
            evidence=[f.evidence for f in lines],
            rule_ids=list(dict.fromkeys(f.rule.id for f in lines)),
            catalog_version=self.catalog.version,
            summary=summary,
        )

    def _pick_evidence(
        self, primary: list[Finding], others: list[Finding], lead: Finding | None = None
    ) -> list[Finding]:
        # The deciding line first (`lead`, where the engine chose it over a higher-ranked
        # one of the same category), then the rest by rank.
        chosen: list[Finding] = []
        seen_text: set[tuple[str, str | None]] = set()
        ranked = sorted(primary, key=self._key)
        if lead is not None and lead in ranked:
            ranked = [lead, *(f for f in ranked if f is not lead)]
        for group, limit in (
            (ranked, 8),
            (sorted(others, key=lambda f: f.order), 4),
        ):
            taken = 0
            for f in group:
                key = (f.evidence.text, f.evidence.node)
                if key in seen_text:
                    continue
                seen_text.add(key)
                chosen.append(f)
                taken += 1
                if taken >= limit or len(chosen) >= _MAX_EVIDENCE:
                    break
        return chosen


def _titles(findings: list[Finding]) -> str:
    return ", ".join(dict.fromkeys(f.rule.title for f in sorted(findings, key=lambda f: f.order)))


def _error_before_time_limit(roots: list[Finding], findings: list[Finding]) -> Finding | None:
    """The program's own error that the job died of just before Slurm ended it at its
    time limit, where the time limit would otherwise decide (`roots` sorted).

    A rank that raised left the others waiting in their next collective until the limit
    (tune g-167, g-642): requeued, the job raises again, so the error decides, not the
    wait. Only an uncaught exception (user_code, at the bottom of a traceback) among the
    last lines before the limit's line in the same log: a hung job prints nothing more,
    while a logged warning or a traceback from hours before was survived. Not where a
    SIGTERM came just before the traceback: the teardown's own tracebacks (remote ranks'
    output can reach the file before the batch host's cancel line) are the time limit's
    doing. A SIGTERM after the error is a launcher stopping the other ranks because of it."""
    limit = roots[0]
    if limit.rule.id != _TIME_LIMIT or limit.evidence.source is not EvidenceSource.LOG:
        return None
    file, line = limit.order[0], limit.order[1]
    for f in roots[1:]:
        if (
            f.rule.category is not Category.USER_CODE
            or f.evidence.source is not EvidenceSource.LOG
            or f.order[0] != file
            or not 0 < line - f.order[1] <= _HUNG_AFTER_ERROR_LINES
        ):
            continue
        header = _context_above(f, findings, _TRACEBACK_HEADER)
        if header is None:
            continue
        teardown = any(
            s.rule.id == _SIGTERM
            and s.order[0] == file
            and header.order[1] - _TRACEBACK_LINES <= s.order[1] < header.order[1]
            for s in findings
        )
        if not teardown:
            return f
    return None


def _hardware_proof(primary: Finding, same: list[Finding]) -> Finding | None:
    """A line of the same kind as the node-blaming failure a person would look at, from
    the same node, whose own rule drains it: the node's hardware line (an adapter's port
    error or cable fault under its completion errors) that proves the drain
    (self-written case 015)."""
    if not primary.rule.blames_node or not primary.evidence.node:
        return None
    return next(
        (
            f
            for f in same
            if f.rule.action is Action.DRAIN_AND_RESTART
            and f.rule.blames_node
            and f.evidence.node == primary.evidence.node
        ),
        None,
    )


def _requeue_not_done_before_time_limit(roots: list[Finding]) -> Finding | None:
    """The framework's word that it did not requeue the job (its scontrol requeue failed,
    or it refused), where the time limit would otherwise decide (`roots` sorted): the
    framework caught the limit's warning signal, so the limit is why the job ended, and
    nothing requeues it (review of 2026-12-03)."""
    if roots[0].rule.id not in _TIME_LIMITS:
        return None
    return next((f for f in roots if f.rule.id in _REQUEUE_NOT_DONE), None)


def _explained_node_deaths(findings: list[Finding]) -> list[Finding]:
    """Ray's "its node has died" lines whose reason, just under them, says the node was
    stopped on purpose (ray stop, a scale-down, a SIGTERM): not a node to drain."""
    stopped = [f for f in findings if f.rule.id == _RAY_NODE_STOPPED]
    return [
        f
        for f in findings
        if f.rule.id == _RAY_NODE_DIED
        and any(
            s.order[0] == f.order[0] and 0 < s.order[1] - f.order[1] <= _RAY_REASON_LINES
            for s in stopped
        )
    ]


def _where(findings: list[Finding], col: _Collector) -> list[str]:
    """Nodes these lines name (not inferred from ranks), else the failure summary's host."""
    nodes = list(dict.fromkeys(f.evidence.node for f in findings if f.evidence.node and f.named))
    return nodes or col.hosts()


def _cancelled_on(primary: Finding, findings: list[Finding], topo: Topology) -> list[str]:
    """The node on which slurmstepd cancelled the job that the winning line names by id
    (tune g-060, g-387: "Job 7518 exceeded memory limit", then "*** JOB 7518 ON xantipa
    CANCELLED AT ..."): where it happened, for a diagnosis that only says where; on a
    job of one node (or whose nodes are not known)."""
    if len(topo.nodelist) > 1 or not (job := _JOB_ID.search(primary.evidence.text)):
        # Only the step's first node prints the cancel line: on a job of several nodes
        # the limit may have been passed on another (review 25).
        return []
    nodes = [
        host
        for f in findings
        if (hit := _CANCELLED_ON.search(f.evidence.text))
        and hit.group(1) == job.group(1)
        and (host := topo.slurm_host(hit.group(2)))
    ]
    return list(dict.fromkeys(nodes))


def _neighbour_rank(finding: Finding, findings: list[Finding]) -> int | None:
    """The rank of the lines around a line that has none (a long message wrapped by the
    terminal keeps its `[rank6]:` prefix on the first piece only), if they agree."""
    if finding.evidence.source is not EvidenceSource.LOG:
        return None
    file, line = finding.order[0], finding.order[1]
    near = {
        f.evidence.rank
        for f in findings
        if f.evidence.rank is not None
        and not (f.rank_named and f.rule.names_lost_peer)
        and f.evidence.source is EvidenceSource.LOG
        and f.order[0] == file
        and abs(f.order[1] - line) <= _NEIGHBOUR_LINES
    }
    return near.pop() if len(near) == 1 else None


def _context_above(primary: Finding, findings: list[Finding], *rule_ids: str) -> Finding | None:
    """The nearest line of one of the context rules `rule_ids` shortly above the winning
    error line in the same file (a frame or a header of the traceback that ends in it)."""
    if primary.evidence.source is not EvidenceSource.LOG:
        return None
    file, line = primary.order[0], primary.order[1]
    above = [
        f
        for f in findings
        if f.rule.id in rule_ids
        and f.order[0] == file
        and 0 < line - f.order[1] <= _TRACEBACK_LINES
    ]
    nearest = max(above, key=lambda f: f.order, default=None)
    if nearest is None:
        return None
    # Another error between them ended the frame's traceback (a handled failure, logged,
    # then an unrelated one): the frame is not this error's.
    ended = any(
        f.rule.role in (Role.ROOT, Role.CASCADE)
        and f.order[0] == file
        and nearest.order[1] < f.order[1] < line
        for f in findings
    )
    return None if ended else nearest


def _survived_exceptions(findings: list[Finding]) -> list[Finding]:
    """The program's exceptions that Python printed and the process survived: the one at
    the bottom of a traceback whose header comes just under CPython's "Exception ignored
    in:" (an exception in a finaliser, discarded) or NumPy 2's warning that an extension
    was built for NumPy 1 (the import is caught and the run goes on). Not a failure of the
    job, whatever its class says (review of 2026-12-03). The program's own errors, and
    the few other rules' that only a finaliser raises (_RAISED_IN_FINALISERS)."""
    markers = [f for f in findings if f.rule.id in _SURVIVED_MARKER_REACH]
    if not markers:
        return []
    headers = [f for f in findings if f.rule.id == _TRACEBACK_HEADER]
    survived = []
    for f in findings:
        if f.rule.role is not Role.ROOT or not (
            f.rule.category is Category.USER_CODE or f.rule.id in _RAISED_IN_FINALISERS
        ):
            continue
        header = _context_above(f, findings, _TRACEBACK_HEADER)
        if header is None or header.evidence.rank != f.evidence.rank:
            continue
        if any(_first_header_under(m, header, headers) for m in markers):
            survived.append(f)
    return survived


def _orphaned_spawn_children(findings: list[Finding]) -> list[Finding]:
    """A spawned child's input running short while it unpickled what its parent sent (an
    EOFError, a truncated pickle): the parent went away mid-send, so it says nothing of
    any file (tune g-1340, read as a corrupt checkpoint before)."""
    frames = [f for f in findings if f.rule.id == _SPAWN_CHILD_UNPICKLING]
    if not frames:
        return []
    return [
        f
        for f in findings
        if f.rule.id == _TRUNCATED_INPUT
        and any(
            g.order[0] == f.order[0]
            and g.evidence.rank == f.evidence.rank
            and 0 < f.order[1] - g.order[1] <= _SPAWN_FRAME_LINES
            for g in frames
        )
    ]


def _first_header_under(marker: Finding, header: Finding, headers: list[Finding]) -> bool:
    """`header` is the traceback the marker announces: in the same file, from the same
    rank (ranks' output interleaves), the very next line under CPython's "Exception
    ignored in:" (which may come without a traceback) or the first header shortly under
    NumPy's warning; not a later one of an exception raised anew."""
    file, at, line = marker.order[0], marker.order[1], header.order[1]
    if header.order[0] != file or marker.evidence.rank != header.evidence.rank:
        return False
    reach = _SURVIVED_MARKER_REACH[marker.rule.id]
    if not 0 < line - at <= reach:
        return False
    return not any(h.order[0] == file and at < h.order[1] < line for h in headers)


def _of_service_threads(findings: list[Finding]) -> list[Finding]:
    """Root and cascade lines that NCCL's remote-allocation service thread logged (the
    same host:pid:tid as its "[Rem Allocator]" line): a peer's request failing here, a
    symptom, not this rank's own failure (benign g-981)."""
    threads = {
        t for f in findings if f.rule.id == _REM_ALLOCATOR and (t := nccl_thread(f.evidence.text))
    }
    if not threads:
        return []
    return [
        f
        for f in findings
        if f.rule.role in (Role.ROOT, Role.CASCADE) and nccl_thread(f.evidence.text) in threads
    ]


def _in_crash_dump(finding: Finding, headers: list[tuple[int, int, bool]]) -> bool:
    """A hang's stack-dump line whose nearest dump header above is faulthandler's for a
    dying process: a symptom of whatever killed it, which the other lines tell. Under a
    dump taken of a live process (or no header at all) it is a hang report."""
    if finding.rule.id != "hang.stack_dump_in_collective":
        return False
    file, line = finding.order[0], finding.order[1]
    above = [
        (at, crash)
        for index, at, crash in headers
        if index == file and 0 < line - at <= _CRASH_DUMP_LINES
    ]
    return max(above, default=(0, False))[1]


def _seqs_by_group(findings: list[Finding]) -> dict[str, dict[int, int]]:
    """Each process group's ranks and the (lowest) collective number they timed out in."""
    by_group: dict[str, dict[int, int]] = {}
    for f in findings:
        seq = f.seq if f.seq is not None else _waiting_in(f.evidence.text)
        if seq is None or f.evidence.rank is None:
            continue
        # The GUID where the line has one: a "PG ID" is each process's own counter.
        pg = _PG_GUID.search(f.evidence.text) or _PG.search(f.evidence.text)
        seqs = by_group.setdefault(pg.group(1) if pg else "", {})
        seqs[f.evidence.rank] = min(seq, seqs.get(f.evidence.rank, seq))
    named = [g for g in by_group if g]
    if "" in by_group and len(named) == 1:
        # Older lines name no group ("[Rank 1] Watchdog caught ..."): beside lines of a
        # single named group they are that group's (tune g-142).
        unnamed = by_group.pop("")
        group = by_group[named[0]]
        for rank, seq in unnamed.items():
            group[rank] = min(seq, group.get(rank, seq))
    return by_group


def _waiting_in(text: str) -> int | None:
    """The collective a rank told to dump is at (PyTorch 2.4+: "Received a dump signal ...
    Last enqueued NCCL work: E, last completed NCCL work: C"): the first one it has not
    completed, or, with nothing pending, the last it enqueued: a rank at E while the others
    time out in E + 1 never called the collective they wait in (review 23)."""
    if not (m := _ENQUEUED.search(text)):
        return None
    enqueued, completed = int(m.group(1)), int(m.group(2))
    return min(completed + 1, enqueued)


def _mismatched_collective(findings: list[Finding]) -> tuple[str, list[int]] | None:
    """What ranks of one process group disagree on in the collective with the same
    sequence number, its operation or the size of a collective whose size must match
    ("collective #2109: _ALLGATHER_BASE of 262711296 vs 40960 elements"), and the ranks
    on the minority's side, where there is one (the ranks that took the other path);
    None if they agree or the lines do not say."""
    seen: dict[tuple[str, int], dict[int, tuple[str, int | None]]] = {}
    for f in findings:
        if f.evidence.rank is None or not (work := _WORK.search(f.evidence.text)):
            continue
        op, seq = work.group(2), int(work.group(1))
        group = _group_across_ranks(f.evidence.text, seq)
        if op not in _COMPARED_OPS or group is None:
            continue
        numel = int(work.group(3)) if work.group(3) else None
        said = seen.setdefault((group, seq), {})
        if said.setdefault(f.evidence.rank, (op, numel)) != (op, numel):
            return None  # one rank, two collectives under one key: groups mixed up
    for (_, seq), by_rank in sorted(seen.items()):
        ops = {op for op, _ in by_rank.values()}
        if len(ops) > 1:
            called = {rank: op for rank, (op, _) in by_rank.items()}
            return f"collective #{seq}: {' vs '.join(sorted(ops))}", _minority(called)
        sizes = {rank: n for rank, (_, n) in by_rank.items() if n is not None}
        if ops <= _SAME_SIZE_OPS and len(set(sizes.values())) > 1:
            told = " vs ".join(map(str, sorted(set(sizes.values()))))
            return f"collective #{seq}: {ops.pop()} of {told} elements", _minority(sizes)
    return None


def _group_across_ranks(text: str, seq: int) -> str | None:
    """A name for the process group of a watchdog line that is the same on every rank,
    or None where the line's group cannot be told apart from another's."""
    if guid := _PG_GUID.search(text):
        return f"guid:{guid.group(1)}"
    if local := _PG.search(text):
        return "default" if local.group(1) == "0" else None
    return "" if seq > _UNNAMED_GROUP_MIN_SEQ else None


def _minority(said: Mapping[int, Hashable]) -> list[int]:
    """The ranks that said what fewer than half of the ranks said, if only they differ."""
    counts: dict[Hashable, list[int]] = {}
    for rank, value in said.items():
        counts.setdefault(value, []).append(rank)
    odd = [ranks for ranks in counts.values() if len(ranks) * 2 < len(said)]
    return sorted(odd[0]) if len(odd) == 1 and len(counts) == 2 else []


def _out_of_step(by_group: dict[str, dict[int, int]]) -> bool:
    """Ranks of the one process group seen timed out in different collectives."""
    seqs = _one_counter(by_group)
    return seqs is not None and len(set(seqs.values())) > 1


def _one_counter(by_group: dict[str, dict[int, int]]) -> dict[int, int] | None:
    """The ranks whose collective numbers one counter could have given, if the lines name
    a single process group: the numbers fall into clusters no more than `_MAX_STEP_SPREAD`
    apart, and a cluster of one rank is another group's stray line (lines that do not
    name their group). None where two clusters of several ranks each leave it open."""
    if len(by_group) != 1:
        return None
    seqs = next(iter(by_group.values()))
    clusters: list[dict[int, int]] = []
    for rank, seq in sorted(seqs.items(), key=lambda item: item[1]):
        if clusters and seq - max(clusters[-1].values()) <= _MAX_STEP_SPREAD:
            clusters[-1][rank] = seq
        else:
            clusters.append({rank: seq})
    if len(clusters) == 1:
        return clusters[0]
    several = [c for c in clusters if len(c) > 1]
    return several[0] if len(several) == 1 else None


def _lagging_ranks(by_group: dict[str, dict[int, int]]) -> list[int]:
    """Ranks whose timed-out collective is behind everyone else's in the same process
    group (`_seqs_by_group`): the others wait for them (a straggler, or the rank that
    stopped first)."""
    seqs = _one_counter(by_group)
    if seqs is None:
        return []
    low = min(seqs.values(), default=0)
    behind = sorted(r for r, s in seqs.items() if s == low)
    if len(set(seqs.values())) < 2 or len(behind) * 2 >= len(seqs):
        return []
    return behind
