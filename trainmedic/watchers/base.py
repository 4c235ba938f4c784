"""What every watcher emits into: one `SignalSink` (the incident router in production)."""

from __future__ import annotations

from typing import Protocol

from trainmedic.domain.incident import IncidentSignal


class SignalSink(Protocol):
    """Takes a signal about a failure; never raises for a bad signal (logs and drops it).

    Raises `trainmedic.errors.DeliveryError` when the signal could not be delivered
    (Temporal unreachable): a caller that holds the report durably keeps it for a retry.
    """

    async def submit(self, signal: IncidentSignal) -> None: ...


class ListSink:
    """Collects signals in memory: for tests and benchmarks of a single watcher."""

    def __init__(self) -> None:
        self.signals: list[IncidentSignal] = []

    async def submit(self, signal: IncidentSignal) -> None:
        self.signals.append(signal)
