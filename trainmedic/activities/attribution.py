"""The attribute activity: the catalog engine, off the event loop, bounded.

The logs it scans are written by the job's owner, so the scan must end whatever they
are: each file is cut to its last `max_scan_bytes` (the failure is at the end), the
whole scan stops after `scan_timeout` and decides on what it read, non-regular files
(a FIFO, /dev/zero) are refused, and what was skipped is said in the diagnosis summary.
The scan runs in a thread; the activity heartbeats while it runs, and when the activity
is cancelled or times out the thread stops at its next block (no thread piles up over
retries).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from temporalio import activity

from trainmedic.adapters.slurm.remote_logs import RemoteLogs
from trainmedic.catalog.scanner import DEFAULT_MAX_SCAN_BYTES, ScanLimits, scan_limits
from trainmedic.domain.diagnosis import AttributionRequest, Diagnosis

DEFAULT_SCAN_TIMEOUT = timedelta(minutes=2)  # well inside the workflow's 5 min timeout
_HEARTBEAT_EVERY = 5.0  # seconds; the workflow's heartbeat timeout is 60 s


class AttributionEngine(Protocol):
    """What the activity runs: `trainmedic.catalog.Attributor`, or a test's stand-in."""

    def attribute(self, request: AttributionRequest) -> Diagnosis: ...


class AttributionActivities:
    def __init__(
        self,
        attributor: AttributionEngine,
        *,
        max_scan_bytes: int | None = DEFAULT_MAX_SCAN_BYTES,
        scan_timeout: timedelta = DEFAULT_SCAN_TIMEOUT,
        heartbeat_every: float = _HEARTBEAT_EVERY,
        remote_logs: RemoteLogs | None = None,
    ) -> None:
        self._attributor = attributor
        # SSH mode: the job logs are on the far side of the connection.
        self._remote_logs = remote_logs
        self.max_scan_bytes = max_scan_bytes
        self.scan_timeout = scan_timeout
        self.heartbeat_every = heartbeat_every

    @activity.defn(name="attribute")
    async def attribute(self, request: AttributionRequest) -> Diagnosis:
        if self._remote_logs is None or not request.log_paths:
            return await self._attribute(request)
        with tempfile.TemporaryDirectory(prefix="trainmedic-logs-") as folder:
            fetched = await self._remote_logs.fetch(
                request.log_paths,
                Path(folder),
                start_at=request.log_from,
                max_bytes=self.max_scan_bytes,
                # Each file's command is bounded (30 s) well inside the heartbeat timeout.
                progress=lambda n: activity.heartbeat({"fetched": n}),
            )
            local = request.model_copy(
                update={"log_paths": list(fetched.local_to_remote), "log_from": {}}
            )
            diagnosis = await self._attribute(local, fetched.notes)
        # Evidence and notes name the file the operator knows, not the copy.
        evidence = [
            e.model_copy(update={"file": fetched.remote(e.file)}) if e.file else e
            for e in diagnosis.evidence
        ]
        return diagnosis.model_copy(
            update={"evidence": evidence, "summary": fetched.rename(diagnosis.summary)}
        )

    async def _attribute(
        self, request: AttributionRequest, notes: list[str] | None = None
    ) -> Diagnosis:
        limits = ScanLimits(max_bytes=self.max_scan_bytes, start_at=dict(request.log_from))
        limits.notes.extend(notes or [])
        budget = self.scan_timeout.total_seconds()

        def scan() -> Diagnosis:
            # The deadline starts when the thread does, not when the task was queued.
            limits.deadline = time.monotonic() + budget
            with scan_limits(limits):
                return self._attributor.attribute(request)

        # Scanning logs is blocking file I/O and CPU: a thread keeps the worker responsive.
        work = asyncio.ensure_future(asyncio.to_thread(scan))
        # Whatever becomes of this activity, the thread's outcome is collected (no
        # "exception never retrieved" when it stops on the cancel flag).
        work.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            while True:
                activity.heartbeat({"files": limits.files, "bytes": limits.bytes_scanned})
                finished, _ = await asyncio.wait({work}, timeout=self.heartbeat_every)
                if finished:
                    break
            diagnosis = work.result()
        finally:
            # Cancelled, timed out or done: the thread stops at its next block.
            limits.cancel.set()
        if limits.notes:
            skipped = "; ".join(limits.notes[:8])
            summary = f"{diagnosis.summary}; scan limits: {skipped}".lstrip("; ")
            diagnosis = diagnosis.model_copy(update={"summary": summary})
        activity.logger.info(
            "job %s: %s (%s, confidence %.2f, rules %s)",
            request.job_id,
            diagnosis.headline(),
            diagnosis.action.value,
            diagnosis.confidence,
            ",".join(diagnosis.rule_ids),
        )
        return diagnosis
