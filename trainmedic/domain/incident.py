"""Incidents: what comes in (signals), what is planned and decided, and what comes out.

One incident is one RecoveryWorkflow. Everything here is recorded in its history, so the
models double as the audit trail's schema: change them compatibly (new fields optional).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from trainmedic.domain.diagnosis import Diagnosis, Evidence
from trainmedic.domain.enums import Mode, Outcome, Stage
from trainmedic.domain.slurm import EffectResult

# A node agent's finding handed to a job that runs on the node, when the finding does not
# show the node unfit (an Xid the application is told of and may survive, a kernel OOM
# kill that may have hit another job's process): evidence for that job's incident should
# the job fail, never the reason to open one (workers/detection.py NodeFanout).
NODE_EVIDENCE = "node_evidence"


class IncidentSignal(BaseModel):
    """One report that something failed: from a watcher, an epilog, or a person."""

    source: str = "manual"  # slurm | log | epilog | nvml | operator | manual
    kind: str = "report"  # job_failed, node_down, log_match, hang, ...
    job_id: str | None = None
    nodes: list[str] = Field(default_factory=list)
    at: datetime | None = None
    detail: str = ""
    evidence: list[Evidence] = Field(default_factory=list)
    progress: str | None = None  # last progress marker seen (e.g. checkpoint step)
    # Which run of the job failed: Slurm's restart count while it ran. Reports about
    # one run are one incident; the next failure after a requeue is a new one.
    run: int | None = None
    # Where that run's output begins in each log file (bytes). A requeued job writing
    # with --open-mode=append keeps the earlier runs' lines before it; they are not
    # evidence about this run.
    log_from: dict[str, int] = Field(default_factory=dict)


class IncidentInput(BaseModel):
    """RecoveryWorkflow's input. Startable by hand:
    temporal workflow start --type RecoveryWorkflow --task-queue trainmedic
        --workflow-id incident-lab-42-1 --input '{"cluster": "lab", "job_id": "42"}'
    """

    cluster: str
    job_id: str | None = None
    nodes: list[str] = Field(default_factory=list)
    signal: IncidentSignal | None = None
    mode: Mode | None = None  # force a mode for this incident (never above the cluster's)


class EffectKind(StrEnum):
    DRAIN_NODE = "drain_node"
    REQUEUE_JOB = "requeue_job"
    REQUEUE_EXCLUDING = "requeue_excluding"
    CANCEL_JOB = "cancel_job"


class EffectStatus(StrEnum):
    PLANNED = "planned"
    WOULD_APPLY = "would_apply"  # monitor mode: recorded, not done
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    REJECTED = "rejected"
    APPLIED = "applied"
    ALREADY_TRUE = "already_true"  # the world already was as wanted: nothing done
    SKIPPED = "skipped"  # not done, and why is in `note` (operator's drain, job gone, ...)
    BLOCKED = "blocked"  # a safety rail said no
    FAILED = "failed"
    ABANDONED = "abandoned"  # approval timed out with fallback abandon/escalate


class PlannedEffect(BaseModel):
    id: str  # stable within the incident: "drain-gpu02", "requeue-42"
    kind: EffectKind
    job_id: str | None = None
    node: str | None = None
    exclude: list[str] = Field(default_factory=list)
    partition: str | None = None
    # The job's restart count when planned: a higher one at apply time means Slurm
    # (or someone) already restarted it, and requeueing again would kill a fresh run.
    seen_restarts: int | None = None
    reason: str  # what Slurm is told (drain reason, job comment); names the incident
    mode: Mode
    status: EffectStatus = EffectStatus.PLANNED
    note: str = ""
    results: list[EffectResult] = Field(default_factory=list)
    applied_at: datetime | None = None
    # When it began to wait for an operator (approve mode): the approval wait's start.
    awaiting_since: datetime | None = None

    def describe(self) -> str:
        match self.kind:
            case EffectKind.DRAIN_NODE:
                return f"drain {self.node}"
            case EffectKind.REQUEUE_EXCLUDING:
                return f"requeue job {self.job_id} excluding {','.join(self.exclude)}"
            case EffectKind.REQUEUE_JOB:
                return f"requeue job {self.job_id}"
            case EffectKind.CANCEL_JOB:
                return f"cancel job {self.job_id}"


class DecisionPayload(BaseModel):
    """What the Temporal UI (or CLI) sends with `approve` / `reject` / `decide`."""

    action: str = "all"  # an effect id, or "all"
    by: str = ""
    comment: str = ""
    # Only `decide` needs it (approve/reject signals say it by their name).
    decision: Literal["approve", "reject"] | None = None


class Decision(BaseModel):
    action: str
    approve: bool
    by: str
    comment: str = ""
    via: Literal["signal", "update", "timeout"] = "signal"
    at: datetime | None = None
    effect_ids: list[str] = Field(default_factory=list)  # what it applied to


class IncidentStatus(BaseModel):
    """The `status` query: enough for the CLI and the UI to say where the incident is."""

    incident_id: str
    cluster: str
    job_id: str | None = None
    stage: Stage
    mode: Mode
    details: str = ""
    diagnosis: Diagnosis | None = None
    effects: list[PlannedEffect] = Field(default_factory=list)
    decisions: list[Decision] = Field(default_factory=list)
    ignored: list[str] = Field(default_factory=list)  # decisions refused, with why
    signals: list[IncidentSignal] = Field(default_factory=list)
    outcome: Outcome | None = None
    policy_version: str | None = None


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


class IncidentTimes(BaseModel):
    """When the failure was seen, handled and over: what goodput is computed from."""

    failed_at: datetime | None = None  # the earliest report's time (its first witness)
    opened_at: datetime | None = None  # the incident's workflow started
    acted_at: datetime | None = None  # the first effect applied
    running_again_at: datetime | None = None  # the job was seen running again
    # The last progress marker before the failure (e.g. a checkpoint step), when known:
    # the work since it is lost too, and is said beside the time.
    last_progress: str | None = None

    def detect_s(self) -> float | None:
        return _seconds(self.failed_at, self.opened_at)

    def act_s(self) -> float | None:
        return _seconds(self.opened_at, self.acted_at)

    def down_s(self) -> float | None:
        """Failure to running again: the time this incident cost the job."""
        return _seconds(self.failed_at or self.opened_at, self.running_again_at)


class IncidentResult(BaseModel):
    incident_id: str
    outcome: Outcome
    summary: str
    diagnosis: Diagnosis | None = None
    effects: list[PlannedEffect] = Field(default_factory=list)
    decisions: list[Decision] = Field(default_factory=list)
    job_nodes_after: list[str] = Field(default_factory=list)
    times: IncidentTimes = Field(default_factory=IncidentTimes)
