"""What trainmedic tells people outside Temporal: one model per notification."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field


class NotifyEvent(StrEnum):
    """The moments a person may need to hear about (docs/architecture.md "Data flow")."""

    APPROVAL_NEEDED = "approval_needed"
    EFFECT_APPLIED = "effect_applied"
    JOB_STOPPED = "job_stopped"
    ESCALATED = "escalated"
    BREAKER_TRIPPED = "breaker_tripped"


class Notification(BaseModel):
    event: NotifyEvent
    incident_id: str
    cluster: str
    job_id: str | None = None
    nodes: list[str] = Field(default_factory=list)
    # One line a person can act on ("waiting for approval to drain gpu02: Xid 79 ...").
    summary: str
    # What to send back, where there is something to send (an approval's payload).
    action_hint: str = ""
    at: datetime


class NotifyResult(BaseModel):
    delivered: bool
    # Why not: "no notifier configured", "event not subscribed", or the receiver's answer.
    detail: str = ""
