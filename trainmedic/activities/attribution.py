"""The attribute activity: the catalog engine, off the event loop."""

from __future__ import annotations

import asyncio
from typing import Protocol

from temporalio import activity

from trainmedic.domain.diagnosis import AttributionRequest, Diagnosis


class Attributor(Protocol):
    def attribute(self, request: AttributionRequest) -> Diagnosis: ...


class AttributionActivities:
    def __init__(self, attributor: Attributor) -> None:
        self._attributor = attributor

    @activity.defn(name="attribute")
    async def attribute(self, request: AttributionRequest) -> Diagnosis:
        # Scanning logs is blocking file I/O and CPU: a thread keeps the worker responsive.
        diagnosis = await asyncio.to_thread(self._attributor.attribute, request)
        activity.logger.info(
            "job %s: %s (%s, confidence %.2f, rules %s)",
            request.job_id,
            diagnosis.headline(),
            diagnosis.action.value,
            diagnosis.confidence,
            ",".join(diagnosis.rule_ids),
        )
        return diagnosis
