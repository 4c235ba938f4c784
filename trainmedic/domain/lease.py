"""The watchers' lease: which controller of a cluster runs detection (LeaseWorkflow)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class LeaseRequest(BaseModel):
    holder: str  # a controller's id (TRAINMEDIC_CONTROLLER_ID, default its host name)
    ttl_s: float = Field(gt=0, le=600)


class Handover(BaseModel):
    holder: str | None
    previous: str | None
    at: datetime
    why: str  # "first", "expired", "released", "after release"


class LeaseState(BaseModel):
    cluster: str
    holder: str | None = None
    expires_at: datetime | None = None
    since: datetime | None = None  # when the current holder took it
    handovers: list[Handover] = Field(default_factory=list)  # the latest ones


class LeaseGrant(BaseModel):
    granted: bool
    holder: str | None
    expires_at: datetime | None
    # The holder before this one, when this grant is a takeover: the new leader then
    # looks back for what the old one may not have seen.
    took_over_from: str | None = None


class LeaseInput(BaseModel):
    cluster: str
    state: LeaseState | None = None  # carried across continue-as-new
