"""Detection under the cluster's lease: two controllers for availability, one watching.

Every controller runs a worker (they share the task queue: Temporal spreads the work);
`lead` runs the watchers only while this controller holds the LeaseWorkflow's lease. It
asks every third of the lease's time. A leader that cannot renew steps down after two
thirds of it, before the lease can pass to another, so two never watch at once by the
clocks' reckoning; a standby takes over once the lease has lapsed (the leader's process,
host or network died) or at once when the leader released it on a clean stop.

A takeover looks back: the new leader's first Slurm view reports the failed jobs Slurm
still lists (MinJobAge keeps them for minutes), so a job that failed in the gap is not
lost; one the old leader handled maps to its closed incident and opens nothing. Spool
files wait in the spool for whoever leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from trainmedic.domain.lease import LeaseGrant, LeaseInput, LeaseRequest, LeaseState
from trainmedic.workflows.lease import LeaseWorkflow, lease_workflow_id

logger = logging.getLogger(__name__)

# `detect(lost, took_over)`: run the watchers until `lost` is set; `took_over` is True
# when another controller led before (look back for what it may have missed).
Detect = Callable[[asyncio.Event, bool], Coroutine[Any, Any, None]]


class LeaseHolder:
    def __init__(
        self,
        client: Client,
        cluster: str,
        holder: str,
        task_queue: str,
        ttl: timedelta = timedelta(seconds=10),
    ) -> None:
        self.client = client
        self.cluster = cluster
        self.holder = holder
        self.task_queue = task_queue
        self.ttl = ttl
        self.leading = False
        self.terms = 0  # how many times this controller took the lease

    async def _ensure(self) -> None:
        await self.client.start_workflow(
            LeaseWorkflow.run,
            LeaseInput(cluster=self.cluster),
            id=lease_workflow_id(self.cluster),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )

    async def _ask(self) -> LeaseGrant:
        handle = self.client.get_workflow_handle_for(
            LeaseWorkflow.run, lease_workflow_id(self.cluster)
        )
        return await handle.execute_update(
            LeaseWorkflow.acquire,
            LeaseRequest(holder=self.holder, ttl_s=self.ttl.total_seconds()),
            rpc_timeout=self.ttl / 3,
        )

    async def state(self) -> LeaseState:
        handle = self.client.get_workflow_handle_for(
            LeaseWorkflow.run, lease_workflow_id(self.cluster)
        )
        return await handle.query(LeaseWorkflow.current)

    async def lead(self, stop: asyncio.Event, detect: Detect) -> None:
        """Hold the lease (or wait for it) and run `detect` while holding it, until `stop`."""
        loop = asyncio.get_running_loop()
        every = self.ttl.total_seconds() / 3
        step_down_after = 2 * every
        task: asyncio.Task[None] | None = None
        lost = asyncio.Event()
        granted_at = 0.0
        complained = False
        said_standby = False
        try:
            await self._ensure()
            while not stop.is_set():
                grant: LeaseGrant | None
                try:
                    grant = await self._ask()
                    complained = False
                except Exception as error:  # Temporal unreachable, update timed out
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        # The SDK reports a cancelled update call as an exception of its
                        # own: this task is being cancelled, so stop instead of retrying.
                        raise asyncio.CancelledError from error
                    grant = None
                    if not complained:
                        logger.warning("lease of %s: cannot renew (%s)", self.cluster, error)
                        complained = True
                    with contextlib.suppress(Exception):
                        await self._ensure()  # e.g. the lease workflow was terminated
                now = loop.time()
                if grant is not None and grant.granted:
                    granted_at = now
                    if task is None:
                        took_over = bool(grant.took_over_from)
                        logger.info(
                            "controller %s leads detection for %s%s",
                            self.holder,
                            self.cluster,
                            f" (taking over from {grant.took_over_from})" if took_over else "",
                        )
                        lost = asyncio.Event()
                        task = asyncio.create_task(detect(lost, took_over))
                        self.leading = True
                        self.terms += 1
                elif task is not None and (
                    grant is not None or now - granted_at >= step_down_after
                ):
                    why = f"held by {grant.holder}" if grant is not None else "no renewal"
                    logger.warning("controller %s steps down (%s)", self.holder, why)
                    await self._stop(task, lost)
                    task = None
                elif grant is not None and task is None and not said_standby:
                    logger.info(
                        "controller %s is standby: %s leads detection for %s",
                        self.holder,
                        grant.holder,
                        self.cluster,
                    )
                    said_standby = True
                if task is not None and task.done():
                    task.result()  # detection ended on its own: let its error end the controller
                    task = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), every)
        finally:
            if task is not None:
                await self._stop(task, lost)
            if stop.is_set():  # a clean stop hands over at once; anything else waits it out
                await self._release()

    async def _release(self) -> None:
        with contextlib.suppress(Exception):
            handle = self.client.get_workflow_handle_for(
                LeaseWorkflow.run, lease_workflow_id(self.cluster)
            )
            await handle.execute_update(
                LeaseWorkflow.release,
                LeaseRequest(holder=self.holder, ttl_s=self.ttl.total_seconds()),
                rpc_timeout=timedelta(seconds=5),
            )

    async def _stop(self, task: asyncio.Task[None], lost: asyncio.Event) -> None:
        lost.set()
        self.leading = False
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
