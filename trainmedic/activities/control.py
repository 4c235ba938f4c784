"""Activities that talk to the cluster's ControlWorkflow (mode, policy, safety rails).

Workflows cannot query or update another workflow, so these do it through the client
the worker hands in (house style: never build a client inside an activity).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from trainmedic.activities.errors import slurm_call
from trainmedic.adapters.slurm.protocol import SlurmBackend
from trainmedic.config import Policy
from trainmedic.domain.activity_io import ControlRef, ReserveIsolation, ReserveRestart
from trainmedic.domain.control import (
    ControlInput,
    ControlState,
    IsolationGrant,
    OffenseRequest,
    OffenseVerdict,
    RestartGrant,
)
from trainmedic.workflows.control import ControlWorkflow, control_workflow_id
from trainmedic.workflows.planning import is_ours


async def ensure_control(client: Client, cluster: str, policy: Policy, task_queue: str) -> None:
    """Start the cluster's ControlWorkflow unless it runs already (then keep it as it is)."""
    await client.start_workflow(
        ControlWorkflow.run,
        ControlInput(cluster=cluster, policy=policy),
        id=control_workflow_id(cluster),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


class ControlActivities:
    def __init__(
        self,
        client: Client,
        policy: Policy,
        task_queue: str,
        backend: SlurmBackend | None = None,
    ) -> None:
        self._client = client
        self._policy = policy
        self._task_queue = task_queue
        # Slurm, read before each isolation reservation so the ledger counts the nodes
        # trainmedic holds out now (an operator's resume releases one).
        self._slurm = backend

    @activity.defn(name="control_snapshot")
    async def control_snapshot(self, ref: ControlRef) -> ControlState:
        handle = self._client.get_workflow_handle_for(
            ControlWorkflow.run, control_workflow_id(ref.cluster)
        )
        try:
            return await handle.query(ControlWorkflow.current)
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND:
                raise
        # First incident on a cluster whose control workflow was never started.
        await ensure_control(self._client, ref.cluster, self._policy, self._task_queue)
        return await handle.query(ControlWorkflow.current)

    async def _reserve(self, cluster: str, update: Any, request: Any, what: str) -> Any:
        handle = self._client.get_workflow_handle_for(
            ControlWorkflow.run, control_workflow_id(cluster)
        )
        try:
            return await handle.execute_update(update, request)
        except WorkflowUpdateFailedError as error:
            raise ApplicationError(f"{what} reservation refused: {error.cause}") from error

    @activity.defn(name="reserve_isolation")
    async def reserve_isolation(self, request: ReserveIsolation) -> IsolationGrant:
        isolation = request.request
        if self._slurm is not None:
            nodes = await slurm_call(self._slurm.list_nodes())
            held = sorted(
                n.name for n in nodes if (n.drain_flag or n.is_down) and is_ours(n.reason)
            )
            isolation = isolation.model_copy(update={"held_out": held})
        grant: IsolationGrant = await self._reserve(
            request.cluster, ControlWorkflow.reserve_isolation, isolation, "isolation"
        )
        return grant

    @activity.defn(name="confirm_isolation")
    async def confirm_isolation(self, request: ReserveIsolation) -> bool:
        confirmed: bool = await self._reserve(
            request.cluster, ControlWorkflow.confirm_isolation, request.request, "isolation"
        )
        return confirmed

    @activity.defn(name="reserve_restart")
    async def reserve_restart(self, request: ReserveRestart) -> RestartGrant:
        grant: RestartGrant = await self._reserve(
            request.cluster, ControlWorkflow.reserve_restart, request.request, "restart"
        )
        return grant


class ControlOffenseLedger:
    """The repeat-offender ledger in the cluster's ControlWorkflow (update
    `record_offense`), started first when the cluster has none yet."""

    def __init__(self, client: Client, policy: Policy, task_queue: str) -> None:
        self._client = client
        self._policy = policy
        self._task_queue = task_queue

    async def record(self, cluster: str, request: OffenseRequest) -> OffenseVerdict:
        handle = self._client.get_workflow_handle_for(
            ControlWorkflow.run, control_workflow_id(cluster)
        )
        try:
            return await self._update(handle, request)
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND:
                raise
        # The first quarantine on a cluster whose control workflow was never started.
        await ensure_control(self._client, cluster, self._policy, self._task_queue)
        return await self._update(handle, request)

    @staticmethod
    async def _update(handle: Any, request: OffenseRequest) -> OffenseVerdict:
        try:
            verdict: OffenseVerdict = await handle.execute_update(
                ControlWorkflow.record_offense, request
            )
        except WorkflowUpdateFailedError as error:
            raise ApplicationError(
                f"offense not recorded: {error.cause}", non_retryable=True
            ) from error
        return verdict
