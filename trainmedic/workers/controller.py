"""The controller worker: the only place that wires concrete adapters to activities."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from trainmedic.activities.attribution import AttributionActivities, Attributor
from trainmedic.activities.control import ControlActivities, ensure_control
from trainmedic.activities.slurm import SlurmActivities
from trainmedic.adapters.slurm import LocalRunner, SlurmBackend, SlurmCli
from trainmedic.config import Policy, Settings
from trainmedic.domain.control import SetPolicyRequest
from trainmedic.temporal.client import require_search_attributes
from trainmedic.workflows.control import ControlWorkflow, control_workflow_id
from trainmedic.workflows.recovery import RecoveryWorkflow

logger = logging.getLogger(__name__)

WORKFLOWS: Sequence[type] = (RecoveryWorkflow, ControlWorkflow)


def slurm_backend(settings: Settings) -> SlurmBackend:
    if settings.slurm_access == "ssh":
        raise NotImplementedError("ssh access to Slurm is not built yet; use slurm_access=local")
    env = dict(os.environ)
    if settings.slurm_conf:
        env["SLURM_CONF"] = str(settings.slurm_conf)
    runner = LocalRunner(env=env, bin_dir=settings.slurm_bin_dir)
    return SlurmCli(runner, timeout=settings.slurm_command_timeout.total_seconds())


def default_attributor() -> Attributor:
    from trainmedic.catalog import Attributor as CatalogAttributor

    return CatalogAttributor()


def build_activities(
    client: Client,
    settings: Settings,
    policy: Policy,
    backend: SlurmBackend | None = None,
    attributor: Attributor | None = None,
) -> list[Any]:
    slurm = SlurmActivities(backend or slurm_backend(settings))
    attribution = AttributionActivities(attributor or default_attributor())
    control = ControlActivities(client, policy, settings.temporal_task_queue)
    return [
        slurm.gather_evidence,
        slurm.apply_effect,
        slurm.verify_job,
        slurm.check_consistency,
        attribution.attribute,
        control.control_snapshot,
        control.reserve_isolation,
        control.reserve_restart,
    ]


async def sync_policy(client: Client, settings: Settings, policy: Policy) -> None:
    """Make sure the cluster's ControlWorkflow runs and carries this policy version."""
    await ensure_control(client, settings.cluster, policy, settings.temporal_task_queue)
    handle = client.get_workflow_handle_for(
        ControlWorkflow.run, control_workflow_id(settings.cluster)
    )
    current = await handle.query(ControlWorkflow.current)
    if current.policy != policy:
        await handle.execute_update(
            ControlWorkflow.set_policy,
            SetPolicyRequest(
                policy=policy,
                by=f"worker@{os.uname().nodename}",
                reason=f"policy {current.policy.version} -> {policy.version} at worker start",
            ),
        )
        logger.info("policy of %s updated to %s", settings.cluster, policy.version)


def build_worker(
    client: Client,
    settings: Settings,
    policy: Policy,
    backend: SlurmBackend | None = None,
    attributor: Attributor | None = None,
) -> Worker:
    return Worker(
        client,
        task_queue=settings.temporal_task_queue,
        workflows=list(WORKFLOWS),
        activities=build_activities(client, settings, policy, backend, attributor),
        activity_executor=ThreadPoolExecutor(max_workers=8),
    )


async def run_worker(
    client: Client, settings: Settings, policy: Policy, stop: asyncio.Event | None = None
) -> None:
    """Check the namespace, sync the policy, and serve until `stop` is set."""
    await require_search_attributes(client)
    worker = build_worker(client, settings, policy)
    logger.info(
        "controller worker for cluster %s on task queue %s",
        settings.cluster,
        settings.temporal_task_queue,
    )
    async with worker:
        # After the worker runs: the query and update below need a worker to answer.
        await sync_policy(client, settings, policy)
        await (stop or asyncio.Event()).wait()
