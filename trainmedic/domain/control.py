"""The cluster's control state: mode, policy, and the ledgers behind the safety rails."""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from trainmedic.config import Policy, QuarantinePolicy
from trainmedic.domain.enums import Mode


class ModeChange(BaseModel):
    mode: Mode
    by: str
    reason: str
    at: datetime
    policy_version: str | None = None


class Isolation(BaseModel):
    node: str
    partition: str
    incident_id: str
    at: datetime
    # Slurm has shown the node out since the reservation: from then on, the node back
    # in service means someone released it (no grace for a drain still on its way).
    seen_out: bool = False


class RestartRecord(BaseModel):
    job_id: str
    cause: str  # category + culprits: "the same failure"
    progress: str | None  # the progress marker when restarted
    incident_id: str
    at: datetime


class OffenseRequest(BaseModel):
    node: str
    episode: str  # the quarantine's first run id
    incident_id: str | None = None  # from trainmedic's drain reason
    category: str | None = None
    reason: str | None = None


class Offense(OffenseRequest):
    """A node trainmedic drained and quarantined: one entry per quarantine (episode),
    whatever the number of reports or incidents about that one failure."""

    at: datetime


class Autonomy(BaseModel):
    """What a change of policy is derived from: the policy, the cluster's mode and its
    breaker. A promotion reads all three (it pins the other kinds to the mode it saw)."""

    policy: Policy
    mode: Mode
    breaker_tripped_at: datetime | None = None

    def __str__(self) -> str:
        breaker = "open" if self.breaker_tripped_at else "closed"
        return f"policy {self.policy.version}, mode {self.mode.value}, breaker {breaker}"


class ControlState(BaseModel):
    cluster: str
    mode: Mode
    policy: Policy
    breaker_tripped_at: datetime | None = None
    breaker_reason: str | None = None
    changes: list[ModeChange] = Field(default_factory=list)
    isolations: list[Isolation] = Field(default_factory=list)
    drains: list[Isolation] = Field(default_factory=list)
    restarts: list[RestartRecord] = Field(default_factory=list)
    # Repeat offenders: the quarantines of the policy's window (rails.record_offense).
    offenses: list[Offense] = Field(default_factory=list)

    def autonomy(self) -> Autonomy:
        return Autonomy(
            policy=self.policy, mode=self.mode, breaker_tripped_at=self.breaker_tripped_at
        )


class ControlInput(BaseModel):
    cluster: str
    policy: Policy = Policy()
    state: ControlState | None = None  # carried across continue-as-new


class SetModeRequest(BaseModel):
    mode: Mode
    by: str
    reason: str = ""


class SetPolicyRequest(BaseModel):
    policy: Policy
    by: str
    reason: str = ""
    # The policy, mode and breaker this change was derived from, as the caller read them
    # (ControlState.autonomy()): the change is refused when any of them is no longer so
    # (another change, a mode change or a breaker trip came in between), so that a
    # read-modify-write (a promotion, the controller's start) never silently undoes
    # someone else's change or re-arms a breaker that tripped meanwhile. None: replace
    # whatever is there.
    expected: Autonomy | None = None


class IsolationRequest(BaseModel):
    incident_id: str
    node: str
    partition: str
    partition_size: int
    # The nodes Slurm shows out of service (drained or down) with trainmedic's reason,
    # read right before the reservation. The ledger is reconciled against it: a node an
    # operator resumed is no longer held. None: not read (the ledger is taken as it is).
    held_out: list[str] | None = None


class IsolationGrant(BaseModel):
    granted: bool
    reason: str
    breaker_tripped: bool = False
    isolated_in_window: int = 0
    budget: int = 0
    # Another incident reserved this node first and drains it: this one must not drain
    # it again (its reason, and the quarantine that follows, belong to that incident).
    held_by: str | None = None


class RestartRequest(BaseModel):
    incident_id: str
    job_id: str
    cause: str
    progress: str | None = None


class RestartGrant(BaseModel):
    granted: bool
    reason: str
    restarts_without_progress: int = 0
    budget: int = 0


class OffenseVerdict(BaseModel):
    """How often the node was implicated within the window; `repeat`: it stays out until
    a person releases it. Carries the quarantine policy the verdict was made under."""

    repeat: bool
    count: int
    limit: int
    window: timedelta
    offenses: list[Offense] = Field(default_factory=list)  # this node's, oldest first
    policy: QuarantinePolicy = QuarantinePolicy()
    policy_version: str | None = None
