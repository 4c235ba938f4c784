"""Inputs and outputs of the activities (one model in, one model out).

Workflows call the activities by their typed methods (`execute_activity_method`), and
the audit reads these same models back from histories: change them compatibly (new
fields optional; a field dropped is ignored when an old history still carries it).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from trainmedic.domain.control import IsolationRequest, OffenseVerdict, RestartRequest
from trainmedic.domain.incident import EffectStatus, PlannedEffect
from trainmedic.domain.slurm import OUR_REASON_PREFIX, EffectResult, SlurmJob, SlurmNode


class GatherRequest(BaseModel):
    incident_id: str
    job_id: str | None = None
    nodes: list[str] = Field(default_factory=list)


class Gathered(BaseModel):
    job: SlurmJob | None = None
    nodes: list[SlurmNode] = Field(default_factory=list)  # the job's and the reported ones
    partition_sizes: dict[str, int] = Field(default_factory=dict)
    log_paths: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)  # e.g. "job 42 is unknown to Slurm"


class ApplyEffectRequest(BaseModel):
    incident_id: str
    effect: PlannedEffect


class EffectOutcome(BaseModel):
    status: EffectStatus  # APPLIED, ALREADY_TRUE, SKIPPED or FAILED
    note: str = ""
    results: list[EffectResult] = Field(default_factory=list)


class VerifyRequest(BaseModel):
    incident_id: str
    job_id: str
    avoid_nodes: list[str] = Field(default_factory=list)
    timeout_s: float
    poll_s: float = 2.0


class VerifyResult(BaseModel):
    running: bool
    state: str
    nodes: list[str] = Field(default_factory=list)
    detail: str = ""
    # Old histories also carry `nudged` (always empty): an extra field, ignored.


class ControlRef(BaseModel):
    cluster: str


class ReserveIsolation(BaseModel):
    cluster: str
    request: IsolationRequest


class ReserveRestart(BaseModel):
    cluster: str
    request: RestartRequest


class ConsistencyRequest(BaseModel):
    incident_id: str
    job_id: str | None = None
    nodes: list[str] = Field(default_factory=list)


class ConsistencyReport(BaseModel):
    summary: str
    results: list[EffectResult] = Field(default_factory=list)


# -- NodeQuarantineWorkflow's activities ----------------------------------------------


class AssessRequest(BaseModel):
    cluster: str
    node: str
    episode: str  # the quarantine's first run id: one offense per quarantine
    record: bool = True  # False: only read Slurm (a periodic look while waiting)


class Assessment(BaseModel):
    """The node as Slurm shows it when the cool-down ends, and its offense record."""

    node: str
    state: str  # Slurm's IDLE+DRAIN form
    out: bool  # drained or down
    ours: bool  # out with trainmedic's reason
    reason: str | None = None
    reason_user: str | None = None
    incident_id: str | None = None  # parsed from trainmedic's reason
    category: str | None = None
    offense: OffenseVerdict | None = None  # recorded only when `ours`


class HealthCheckRequest(BaseModel):
    node: str
    ecc_baseline: dict[str, int] = Field(default_factory=dict)


class ResumeRequest(BaseModel):
    node: str
    only_if_reason_contains: str = OUR_REASON_PREFIX
