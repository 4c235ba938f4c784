"""Turning a diagnosis into effects under the policy. Pure and deterministic."""

from __future__ import annotations

from trainmedic.config import Policy
from trainmedic.domain.diagnosis import Diagnosis
from trainmedic.domain.enums import Action, Mode
from trainmedic.domain.incident import EffectKind, PlannedEffect
from trainmedic.domain.slurm import SlurmJob, SlurmNode

_AUTONOMY = {Mode.MONITOR: 0, Mode.APPROVE: 1, Mode.AUTO: 2}
OUR_REASON_PREFIX = "trainmedic"


def effect_mode(
    policy: Policy,
    cluster_mode: Mode,
    action: Action,
    partition: str | None,
    forced: Mode | None = None,
) -> Mode:
    """The mode one effect runs under.

    A cluster in monitor (set by an operator, or by the breaker) keeps everything in
    monitor. Otherwise the policy's partition override wins over its action override,
    which wins over the cluster's mode; an incident's forced mode can only lower it.
    """
    if cluster_mode is Mode.MONITOR:
        return Mode.MONITOR
    mode = policy.mode.partitions.get(partition or "") or policy.mode.actions.get(
        action, cluster_mode
    )
    if forced is not None and _AUTONOMY[forced] < _AUTONOMY[mode]:
        mode = forced
    return mode


def is_ours(reason: str | None) -> bool:
    return bool(reason) and str(reason).startswith(OUR_REASON_PREFIX)


def slurm_reason(incident_id: str, diagnosis: Diagnosis) -> str:
    """What Slurm is told: names the incident so `sinfo -R` leads back to it."""
    detail = diagnosis.summary or diagnosis.category.value
    text = f"{OUR_REASON_PREFIX} {incident_id}: {diagnosis.category.value}: {detail}"
    # Slurm keeps reasons whole, but operators read them in `sinfo -R` columns.
    return text[:200]


def plan_effects(
    incident_id: str,
    diagnosis: Diagnosis,
    job: SlurmJob | None,
    nodes: dict[str, SlurmNode],
    policy: Policy,
    cluster_mode: Mode,
    forced: Mode | None = None,
) -> list[PlannedEffect]:
    """Effects in the order they must happen: isolate first, then act on the job."""
    reason = slurm_reason(incident_id, diagnosis)
    partition = job.partition if job else None
    action = diagnosis.action

    def mode() -> Mode:
        return effect_mode(policy, cluster_mode, action, partition, forced)

    effects: list[PlannedEffect] = []
    if action is Action.DRAIN_AND_RESTART:
        for name in diagnosis.culprit_nodes:
            node = nodes.get(name)
            node_partition = node.partitions[0] if node and node.partitions else partition
            effects.append(
                PlannedEffect(
                    id=f"drain-{name}",
                    kind=EffectKind.DRAIN_NODE,
                    node=name,
                    partition=node_partition,
                    reason=reason,
                    mode=effect_mode(policy, cluster_mode, action, node_partition, forced),
                )
            )
    if job is None:
        return effects
    if action in (Action.DRAIN_AND_RESTART, Action.RESTART_EXCLUDING) and diagnosis.culprit_nodes:
        effects.append(
            PlannedEffect(
                id=f"requeue-{job.job_id}",
                kind=EffectKind.REQUEUE_EXCLUDING,
                job_id=job.job_id,
                exclude=sorted(set(diagnosis.culprit_nodes) | set(job.excluded_nodes)),
                partition=partition,
                seen_restarts=job.restarts,
                reason=reason,
                mode=mode(),
            )
        )
    elif action in (Action.RESTART, Action.DRAIN_AND_RESTART, Action.RESTART_EXCLUDING):
        effects.append(
            PlannedEffect(
                id=f"requeue-{job.job_id}",
                kind=EffectKind.REQUEUE_JOB,
                job_id=job.job_id,
                partition=partition,
                seen_restarts=job.restarts,
                reason=reason,
                mode=mode(),
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
            )
        )
    return effects


def cause_key(diagnosis: Diagnosis) -> str:
    """'The same failure' for the restart budget: category and culprits."""
    culprits = ",".join(sorted(diagnosis.culprit_nodes)) or "-"
    return f"{diagnosis.category.value}@{culprits}"
