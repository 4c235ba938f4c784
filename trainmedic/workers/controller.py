"""The controller worker: the only place that wires concrete adapters to activities."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from trainmedic.activities.attribution import AttributionActivities, Attributor
from trainmedic.activities.control import ControlActivities, ensure_control
from trainmedic.activities.notify import NotifyActivities
from trainmedic.activities.quarantine import (
    NodeHealth,
    QuarantineActivities,
    SlurmNodeHealth,
    lab_gpu_devices,
)
from trainmedic.activities.slurm import SlurmActivities
from trainmedic.adapters.slurm import SlurmBackend, SlurmCli
from trainmedic.adapters.slurm.remote_logs import RemoteLogs
from trainmedic.config import Policy, Settings
from trainmedic.domain.control import SetPolicyRequest
from trainmedic.lab import Lab
from trainmedic.temporal.client import require_search_attributes
from trainmedic.watchers.router import local_runner
from trainmedic.workflows.control import ControlWorkflow, control_workflow_id
from trainmedic.workflows.quarantine import NodeQuarantineWorkflow
from trainmedic.workflows.recovery import RecoveryWorkflow

logger = logging.getLogger(__name__)

WORKFLOWS: Sequence[type] = (RecoveryWorkflow, ControlWorkflow, NodeQuarantineWorkflow)


def slurm_backend(settings: Settings) -> SlurmBackend:
    """Slurm's commands on this host, or over SSH: the runner is the one the watchers'
    JSON polls use (in ssh mode, the same connection)."""
    return SlurmCli(local_runner(settings), timeout=settings.slurm_command_timeout.total_seconds())


def default_attributor() -> Attributor:
    from trainmedic.catalog import Attributor as CatalogAttributor

    return CatalogAttributor()


def node_health(backend: SlurmBackend, lab: Lab | None) -> NodeHealth:
    """Slurm's view of the node; in the lab also its fake GPU devices and their NVML."""
    if lab is None:
        return SlurmNodeHealth(backend)
    from trainmedic.adapters.nvml.fake import FakeNvml
    from trainmedic.lab.workload import nvml_state

    return SlurmNodeHealth(
        backend,
        lab_gpu_devices(lab.layout.gpu_dir),
        gpu_health=lambda node: FakeNvml.from_file(nvml_state(lab, node)),
    )


def notify_activities(settings: Settings) -> NotifyActivities:
    """The webhook from the settings, or none (the activity then says so in the history)."""
    from trainmedic.adapters.notify.webhook import WebhookNotifier
    from trainmedic.config import notify_event_names
    from trainmedic.domain.notify import NotifyEvent

    if settings.notify_webhook_url is None:
        return NotifyActivities(None)
    notifier = WebhookNotifier(
        settings.notify_webhook_url.get_secret_value(),
        settings.notify_format,
        timeout=settings.notify_timeout.total_seconds(),
    )
    events = [NotifyEvent(name) for name in notify_event_names(settings.notify_events)]
    return NotifyActivities(notifier, events)


def remote_logs(settings: Settings) -> RemoteLogs | None:
    """In SSH mode the controller may not see the shared file system: job logs are read
    over the same connection as Slurm's commands."""
    if settings.slurm_access != "ssh":
        return None
    from trainmedic.adapters.slurm.ssh import ssh_runner

    return RemoteLogs(ssh_runner(settings))


def build_activities(
    client: Client,
    settings: Settings,
    policy: Policy,
    backend: SlurmBackend | None = None,
    attributor: Attributor | None = None,
    lab: Lab | None = None,
) -> list[Any]:
    backend = backend or slurm_backend(settings)
    slurm = SlurmActivities(backend)
    attribution = AttributionActivities(
        attributor or default_attributor(),
        max_scan_bytes=settings.attribution_max_scan_bytes,
        scan_timeout=settings.attribution_scan_timeout,
        remote_logs=remote_logs(settings),
    )
    control = ControlActivities(client, policy, settings.temporal_task_queue, backend)
    quarantine = QuarantineActivities(backend, node_health(backend, lab))
    return [
        quarantine.check_health,
        quarantine.resume_node,
        slurm.gather_evidence,
        slurm.apply_effect,
        slurm.verify_job,
        slurm.check_consistency,
        attribution.attribute,
        control.control_snapshot,
        control.reserve_isolation,
        control.confirm_isolation,
        control.reserve_restart,
        notify_activities(settings).notify,
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
    lab: Lab | None = None,
) -> Worker:
    return Worker(
        client,
        task_queue=settings.temporal_task_queue,
        workflows=list(WORKFLOWS),
        activities=build_activities(client, settings, policy, backend, attributor, lab),
        activity_executor=ThreadPoolExecutor(max_workers=8),
    )


async def run_controller(
    client: Client,
    settings: Settings,
    policy: Policy,
    stop: asyncio.Event,
    *,
    lab: Lab | None = None,
    detect: bool = True,
    hang_after: timedelta = timedelta(minutes=10),
) -> None:
    """The controller process: the worker, and (unless `detect` is off) every watcher.

    Checks the namespace first, starts the worker (the policy sync below needs one to
    answer), then runs detection until `stop` is set.
    """
    from trainmedic.workers.detection import build_detection

    await require_search_attributes(client)
    backend = slurm_backend(settings)
    worker = build_worker(client, settings, policy, backend=backend, lab=lab)
    logger.info(
        "controller for cluster %s on task queue %s (detection %s)",
        settings.cluster,
        settings.temporal_task_queue,
        "on" if detect else "off",
    )
    async with worker:
        await sync_policy(client, settings, policy)
        if not detect:
            await stop.wait()
            return
        agents, nvml = [], {}
        if lab is not None:
            from trainmedic.lab.workload import kernel_log, lab_nodes, nvml_state, prepare_nodes

            prepare_nodes(lab)
            agents = [(node, kernel_log(lab, node)) for node in lab_nodes(lab)]
            nvml = {node: nvml_state(lab, node) for node in lab_nodes(lab)}
        detection = build_detection(
            client, settings, backend, agents=agents, nvml_states=nvml, hang_after=hang_after
        )
        await detection.run(stop)


async def run_worker(
    client: Client, settings: Settings, policy: Policy, stop: asyncio.Event | None = None
) -> None:
    """The worker alone (no watchers) until `stop` is set."""
    await run_controller(client, settings, policy, stop or asyncio.Event(), detect=False)
