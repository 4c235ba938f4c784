"""Turning a diagnosis into effects under the policy. Pure and deterministic."""

from __future__ import annotations

import re

from trainmedic.config import Policy
from trainmedic.domain.diagnosis import Diagnosis
from trainmedic.domain.enums import ISOLATING, RESTART_FAMILY, Action, EvidenceSource, Mode
from trainmedic.domain.incident import (
    NODE_EVIDENCE,
    EffectKind,
    EffectStatus,
    IncidentSignal,
    PlannedEffect,
)
from trainmedic.domain.slurm import OUR_REASON_PREFIX, SlurmJob, SlurmNode
from trainmedic.domain.slurm import is_ours as is_ours  # the one test, kept importable here

_AUTONOMY = {Mode.MONITOR: 0, Mode.APPROVE: 1, Mode.AUTO: 2}
# Sources whose word may take a node out of service (docs/architecture.md "Trust model"):
# the node agent (kernel log, NVML), Slurm itself, an operator. A job's own output is
# written by its user and justifies restarts, stops and escalations, never a drain.
# AGENT_HEARTBEAT is the controller's own observation, not a report anyone can write: a
# node's authenticated agent fell silent *and* the node's slurmd did not answer the
# controller's probes (or Slurm agreed); what Slurm concludes after SlurmdTimeout.
TRUSTED_SOURCES = frozenset(
    {
        EvidenceSource.KERNEL,
        EvidenceSource.NVML,
        EvidenceSource.SLURM,
        EvidenceSource.OPERATOR,
        EvidenceSource.AGENT_HEARTBEAT,
    }
)
_REASON_CHARS = re.compile(r"[^\x20-\x7e]+")


def effect_mode(
    policy: Policy,
    cluster_mode: Mode,
    action: Action,
    partition: str | None,
    forced: Mode | None = None,
) -> Mode:
    """The mode one effect runs under.

    A cluster in monitor (set by an operator, or by the breaker) keeps everything in
    monitor. Otherwise a partition's or an action's override replaces the cluster's
    mode, and where both are set the stricter wins; an incident's forced mode can only
    lower the result, never be raised by an override.
    """
    if cluster_mode is Mode.MONITOR:
        return Mode.MONITOR
    overrides = [
        m
        for m in (policy.mode.partitions.get(partition or ""), policy.mode.actions.get(action))
        if m is not None
    ]
    mode = min(overrides, key=_AUTONOMY.__getitem__) if overrides else cluster_mode
    if forced is not None and _AUTONOMY[forced] < _AUTONOMY[mode]:
        mode = forced
    return mode


def slurm_reason(incident_id: str, diagnosis: Diagnosis) -> str:
    """What Slurm is told: names the incident so `sinfo -R` leads back to it.

    The summary may quote a log line, and log lines are anyone's text: control and
    non-ASCII characters make scontrol refuse the reason (and the drain with it), so
    they are folded into single spaces.
    """
    detail = diagnosis.summary or diagnosis.category.value
    text = f"{OUR_REASON_PREFIX} {incident_id}: {diagnosis.category.value}: {detail}"
    text = " ".join(_REASON_CHARS.sub(" ", text).split())
    # Slurm keeps reasons whole, but operators read them in `sinfo -R` columns.
    return text[:200]


def is_out(node: SlurmNode) -> bool:
    """Already out of service: drained (by anyone) or down."""
    return node.is_out


def trusted_witnesses(diagnosis: Diagnosis, nodes: dict[str, SlurmNode]) -> dict[str, str]:
    """Culprit node -> the trusted source that shows it failing (absent: none does)."""
    witnesses: dict[str, str] = {}
    for name in diagnosis.culprit_nodes:
        node = nodes.get(name)
        if node is not None and (node.is_down or node.not_responding):
            witnesses[name] = f"Slurm shows {name} {node.state_text}"
            continue
        for evidence in diagnosis.evidence:
            if evidence.node == name and evidence.source in TRUSTED_SOURCES:
                witnesses[name] = f"{evidence.source.value} evidence on {name}"
                break
    return witnesses


def running_job_untouched(job: SlurmJob | None, signals: list[IncidentSignal]) -> str | None:
    """Why a running job must be left alone, or None.

    A running job is acted on only when something says it is failing: Slurm, the
    epilog, a hang, a node agent showing its node unfit, an operator. Lines matched in
    its own output while it runs and progresses are what real jobs print by the hundred
    (issue 9.9); a node finding that leaves the node fit may be about another job's
    process, and the job's own failure, if it comes, is reported by Slurm.
    """
    if job is None or not job.is_running or not signals:
        return None
    if all(_evidence_only(s) for s in signals):
        what = (
            "lines in its own output"
            if all(s.kind == "log_match" for s in signals)
            else "node findings that leave its nodes fit"
        )
        return (
            f"job {job.job_id} is running and nothing but {what} was reported; "
            "recorded as a note, no effect"
        )
    return None


def _evidence_only(signal: IncidentSignal) -> bool:
    """A report that is evidence for a failure, not one: a line of the job's own output,
    or a node finding that leaves the node fit."""
    if signal.kind == "log_match":
        return signal.source == "log"
    return signal.kind == NODE_EVIDENCE


def plan_effects(
    incident_id: str,
    diagnosis: Diagnosis,
    job: SlurmJob | None,
    nodes: dict[str, SlurmNode],
    policy: Policy,
    cluster_mode: Mode,
    forced: Mode | None = None,
) -> list[PlannedEffect]:
    """Effects in the order they must happen: isolate first, then act on the job.

    Culprits are confined to the job's own nodes. A culprit that is already out of
    service (down, or drained by anyone) is recorded as already true and reserves no
    budget; a culprit that only the job's own output names is not drained in auto mode
    (the restart excludes it instead, and says why), since a user can print any line.
    """
    reason = slurm_reason(incident_id, diagnosis)
    partition = job.partition if job else None
    action = diagnosis.action
    culprits = list(diagnosis.culprit_nodes)
    notes: list[str] = []
    if job is not None and job.nodes:
        foreign = [n for n in culprits if n not in job.nodes]
        if foreign:
            culprits = [n for n in culprits if n in job.nodes]
            notes.append(f"ignored {', '.join(foreign)}: not a node of job {job.job_id}")

    def mode() -> Mode:
        return effect_mode(policy, cluster_mode, action, partition, forced)

    effects: list[PlannedEffect] = []
    if action is Action.DRAIN_AND_RESTART:
        witnesses = trusted_witnesses(diagnosis, nodes)
        for name in culprits:
            node = nodes.get(name)
            node_partition = node.partitions[0] if node and node.partitions else partition
            drain_mode = effect_mode(policy, cluster_mode, action, node_partition, forced)
            drain = PlannedEffect(
                id=f"drain-{name}",
                kind=EffectKind.DRAIN_NODE,
                node=name,
                partition=node_partition,
                reason=reason,
                mode=drain_mode,
            )
            if node is not None and is_out(node):
                who = f" by {node.reason_user}" if node.reason_user else ""
                why = f", reason {node.reason!r}{who}" if node.reason else ""
                drain.status = EffectStatus.ALREADY_TRUE
                drain.note = (
                    f"{name} is already out of service ({node.state_text}{why}); "
                    "no budget reserved, kept out of the job"
                )
            elif name not in witnesses and drain_mode is not Mode.APPROVE:
                notes.append(
                    f"{name} not drained: only the job's own output names it (a user can "
                    "print any line); excluded from the restart instead"
                )
                continue
            elif name not in witnesses:
                drain.note = "only the job's own output names this node: your approval is the proof"
            effects.append(drain)
    if job is None:
        return effects
    note = "; ".join(notes)
    if action in ISOLATING and culprits:
        requeue = PlannedEffect(
            id=f"requeue-{job.job_id}",
            kind=EffectKind.REQUEUE_EXCLUDING,
            job_id=job.job_id,
            exclude=sorted(set(culprits) | set(job.excluded_nodes)),
            partition=partition,
            seen_restarts=job.restarts,
            reason=reason,
            mode=mode(),
            note=note,
        )
        pinned = sorted(set(culprits) & set(job.required_nodes))
        if pinned:
            # Slurm would keep it PENDING (BadConstraints) for ever: a person decides
            # whether to change the job's node list or wait for the node.
            requeue.status = EffectStatus.SKIPPED
            requeue.note = "; ".join(
                n
                for n in (
                    note,
                    f"job {job.job_id} must run on {', '.join(pinned)} (--nodelist): a "
                    "restart excluding it could never start; left for a person",
                )
                if n
            )
        effects.append(requeue)
    elif action in RESTART_FAMILY:
        effects.append(
            PlannedEffect(
                id=f"requeue-{job.job_id}",
                kind=EffectKind.REQUEUE_JOB,
                job_id=job.job_id,
                partition=partition,
                seen_restarts=job.restarts,
                reason=reason,
                mode=mode(),
                note=note,
            )
        )
    elif action is Action.STOP:
        effects.append(
            PlannedEffect(
                id=f"cancel-{job.job_id}",
                kind=EffectKind.CANCEL_JOB,
                job_id=job.job_id,
                partition=partition,
                reason=reason,
                mode=mode(),
                note=note,
            )
        )
    return effects


def cause_key(diagnosis: Diagnosis) -> str:
    """'The same failure' for the restart budget: the category, and the culprit nodes a
    trusted source shows failing.

    A node that only the job's own output names (a failed prolog, a lost task, a line
    the job printed) is not part of the key: when the failure comes back on another
    node, what the nodes share (the site's prolog, the job itself) is the cause, and
    keying on the node would exclude one more node per restart and never spend the
    budget. Hardware proof on two nodes stays two failures (two bad GPUs in a large
    cluster).
    """
    # Without Slurm's node states: only what the diagnosis's own evidence proves (Slurm's
    # word on a node is in it as `slurm` evidence when the diagnosis rests on it).
    proven = sorted(trusted_witnesses(diagnosis, {}))
    return f"{diagnosis.category.value}@{','.join(proven) or '-'}"
