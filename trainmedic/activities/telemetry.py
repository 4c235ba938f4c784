"""The record_outcome activity: an incident's figures, recorded once it has finished.

Workflow code must not record metrics itself (a replay would record them again), so
the RecoveryWorkflow hands its result to this activity at its end.
"""

from __future__ import annotations

from opentelemetry import metrics
from opentelemetry.metrics import Meter
from temporalio import activity

from trainmedic.domain.telemetry import OutcomeRecord, OutcomeRecorded
from trainmedic.telemetry import METER_NAME, OutcomeInstruments


class TelemetryActivities:
    def __init__(self, meter: Meter | None = None) -> None:
        # Default: the process's meter (a no-op one where telemetry is off; a proxy that
        # follows setup_telemetry when it is set up later).
        self._instruments = OutcomeInstruments(meter or metrics.get_meter(METER_NAME))

    @activity.defn(name="record_outcome")
    async def record_outcome(self, record: OutcomeRecord) -> OutcomeRecorded:
        touched = self._instruments.record(record)
        if touched is None:
            return OutcomeRecorded(recorded=False)
        activity.logger.debug(
            "recorded %s (%s): %s",
            record.result.incident_id,
            record.result.outcome.value,
            ", ".join(touched),
        )
        return OutcomeRecorded(recorded=True, instruments=touched)
