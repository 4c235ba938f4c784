"""Inputs and outputs of the recovery activities (one model in, one model out)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from trainmedic.domain.control import IsolationRequest, RestartRequest
from trainmedic.domain.incident import EffectStatus, PlannedEffect
from trainmedic.domain.slurm import EffectResult, SlurmJob, SlurmNode


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
    nudged: list[EffectResult] = Field(default_factory=list)  # start-now commands issued


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
