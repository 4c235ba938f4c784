"""What the RecoveryWorkflow hands the `record_outcome` activity at its end.

Workflow code never touches the OpenTelemetry SDK (it would record again on every
replay); the figures an incident yields are computed from its result in an activity.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from trainmedic.domain.enums import Mode
from trainmedic.domain.incident import IncidentResult


class OutcomeRecord(BaseModel):
    cluster: str
    mode: Mode
    result: IncidentResult
    # A reservation of this incident tripped the cluster's breaker (the grant said so;
    # the effect's BLOCKED status alone does not tell a trip from a plain refusal).
    breaker_tripped: bool = False


class OutcomeRecorded(BaseModel):
    recorded: bool  # False: this incident was recorded already (a retried activity)
    instruments: list[str] = Field(default_factory=list)  # the instruments it touched
