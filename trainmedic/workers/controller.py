"""The controller worker: the only place that wires concrete adapters to activities.

Every activity is an `async def` (blocking work inside them goes to a thread of its own,
e.g. the attribution scan), so the worker needs no activity executor.

The lab (`trainmedic lab`, the demo) passes its `Lab`; its fakes (fake GPUs, in-process
node agents, the lab's health probe) come from `trainmedic.lab.agents`, imported only
then: nothing here imports a lab or fake type on a real cluster.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from trainmedic.activities.attribution import AttributionActivities, AttributionEngine
from trainmedic.activities.control import ControlActivities, ControlOffenseLedger, ensure_control
from trainmedic.activities.notify import NotifyActivities
from trainmedic.activities.quarantine import QuarantineActivities
from trainmedic.activities.slurm import SlurmActivities
from trainmedic.activities.telemetry import TelemetryActivities
from trainmedic.adapters.slurm import SlurmBackend, SlurmCli
from trainmedic.adapters.slurm.remote_logs import RemoteLogs
from trainmedic.config import Policy, Settings
from trainmedic.domain.control import SetPolicyRequest
from trainmedic.health.probe import HttpNodeHealthProbe, NodeHealthProbe
from trainmedic.telemetry import is_tracing, setup_telemetry, tracing_interceptor
from trainmedic.temporal.client import require_search_attributes
from trainmedic.watchers.router import local_runner
from trainmedic.workers.lease import LeaseHolder
from trainmedic.workflows.control import STALE_READ, ControlWorkflow, control_workflow_id
from trainmedic.workflows.lease import LeaseWorkflow
from trainmedic.workflows.quarantine import NodeQuarantineWorkflow
from trainmedic.workflows.recovery import RecoveryWorkflow

if TYPE_CHECKING:
    from trainmedic.lab import Lab

logger = logging.getLogger(__name__)

WORKFLOWS: Sequence[type] = (
    RecoveryWorkflow,
    ControlWorkflow,
    NodeQuarantineWorkflow,
    LeaseWorkflow,
)


def slurm_backend(settings: Settings) -> SlurmBackend:
    """Slurm's commands on this host, or over SSH: the runner is the one the watchers'
    JSON polls use (in ssh mode, the same connection). With slurm_access=pyslurm,
    libslurm in this process (refused, with the reason, where pyslurm cannot serve)."""
    if settings.slurm_access == "pyslurm":
        from trainmedic.adapters.slurm.pyslurm_backend import PySlurmBackend

        return PySlurmBackend.open(
            settings.slurm_conf, timeout=settings.slurm_command_timeout.total_seconds()
        )
    return SlurmCli(local_runner(settings), timeout=settings.slurm_command_timeout.total_seconds())


def default_attributor() -> AttributionEngine:
    from trainmedic.catalog import Attributor as CatalogAttributor

    return CatalogAttributor()


def health_probe(settings: Settings, lab: Lab | None) -> NodeHealthProbe:
    """Where the quarantine's health check runs: each node's agent (`GET /health`,
    answers signed with the site key); in the lab, the lab node's fake GPUs."""
    if lab is not None:
        from trainmedic.lab.agents import lab_health_probe

        return lab_health_probe(lab)
    from trainmedic.watchers.spoolfile import load_key

    site = settings.site_key_file
    key = load_key(site) if site else None
    if key is None:
        logger.warning(
            "no site key (TRAINMEDIC_AGENT_KEY_FILE or _SPOOL_KEY_FILE): node agents' health "
            "answers cannot be verified, so quarantined nodes stay out until a person "
            "releases them"
        )
    return HttpNodeHealthProbe(
        settings.agent_health_url, key, timeout_s=settings.agent_health_timeout.total_seconds()
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
    attributor: AttributionEngine | None = None,
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
    quarantine = QuarantineActivities(
        backend,
        health_probe(settings, lab),
        ControlOffenseLedger(client, policy, settings.temporal_task_queue),
    )
    return [
        quarantine.assess,
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
        TelemetryActivities().record_outcome,
    ]


# Another change between reading and writing the policy makes the write retry; three
# changes in a row at one controller's start is not a race but a fight: say so.
_POLICY_SYNC_ATTEMPTS = 3


async def sync_policy(client: Client, settings: Settings, policy: Policy) -> None:
    """Make sure the cluster's ControlWorkflow runs and carries this policy version."""
    await ensure_control(client, settings.cluster, policy, settings.temporal_task_queue)
    handle = client.get_workflow_handle_for(
        ControlWorkflow.run, control_workflow_id(settings.cluster)
    )
    # Read, compare, write: the write names what was read, so a promotion that lands in
    # between is not overwritten; the loop reads again and decides again (it keeps it).
    for attempt in range(_POLICY_SYNC_ATTEMPTS):
        current = await handle.query(ControlWorkflow.current)
        if current.policy.version.startswith(f"{policy.version}+"):
            # `trainmedic mode promote` raised action kinds on top of this same file: keep
            # them (a restart must not undo an operator's promotion); a new file replaces
            # them.
            logger.info(
                "policy of %s is %s: the file's %s with promotions, kept; copy them into the "
                "file to make them permanent",
                settings.cluster,
                current.policy.version,
                policy.version,
            )
            return
        if current.policy == policy:
            return
        try:
            await handle.execute_update(
                ControlWorkflow.set_policy,
                SetPolicyRequest(
                    policy=policy,
                    by=f"worker@{os.uname().nodename}",
                    reason=f"policy {current.policy.version} -> {policy.version} at worker start",
                    expected=current.autonomy(),
                ),
            )
        except WorkflowUpdateFailedError as error:
            # Only a stale read is worth another try; any other refusal says the same
            # thing again.
            if not _stale_read(error) or attempt + 1 == _POLICY_SYNC_ATTEMPTS:
                raise
            logger.info(
                "policy of %s changed while syncing (%s); reading it again",
                settings.cluster,
                error.cause or error,
            )
            continue
        logger.info("policy of %s updated to %s", settings.cluster, policy.version)
        return


def _stale_read(error: WorkflowUpdateFailedError) -> bool:
    """Did the control workflow refuse the write because its state changed after it was
    read? A worker of the release before this one, still running the workflow during a
    rolling deploy, says so as a plain ValueError with these words."""
    cause = error.cause
    if not isinstance(cause, ApplicationError):
        return False
    return cause.type == STALE_READ or (
        cause.type == "ValueError" and "changed after they were read" in cause.message
    )


def build_worker(
    client: Client,
    settings: Settings,
    policy: Policy,
    backend: SlurmBackend | None = None,
    attributor: AttributionEngine | None = None,
    lab: Lab | None = None,
    *,
    tracing: bool = True,
) -> Worker:
    # Clients from open_client carry the tracing interceptor, and the worker takes it
    # from there (adding it twice would trace everything twice); a client built without
    # it still gets traced workflows and activities, unless `tracing` is off.
    traced = any(is_tracing(i) for i in client.config()["interceptors"])
    return Worker(
        client,
        task_queue=settings.temporal_task_queue,
        workflows=list(WORKFLOWS),
        activities=build_activities(client, settings, policy, backend, attributor, lab),
        interceptors=[tracing_interceptor()] if tracing and not traced else [],
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
    from trainmedic.workers.detection import InProcessAgent, build_detection

    await require_search_attributes(client)
    # Metrics endpoint and OTLP export, once per process (trainmedic.telemetry).
    telemetry = setup_telemetry(settings)
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

        async def watch(lost: asyncio.Event, took_over: bool) -> None:
            """Detection for one term of the lease: built fresh, stopped by `lost`."""
            agents: list[InProcessAgent] = []
            probes = None
            if lab is not None:
                from trainmedic.lab import agents as lab_agents

                if settings.agent_channel:
                    # The lab's agents run as processes of their own and push over the channel.
                    lab_agents.prepare(lab)
                    probes = lab_agents.lab_probes(lab)
                else:
                    agents = lab_agents.in_process_agents(lab)
            detection = build_detection(
                client, settings, backend, agents=agents, hang_after=hang_after, probes=probes
            )
            if lab is not None and detection.receiver is not None:
                receiver = detection.receiver
                await receiver.start()
                lab_agents.start_agents(
                    lab,
                    lab_agents.controller_address(receiver.host, receiver.port),
                    settings.site_key_file,
                )
            telemetry.watch(detection)  # watcher cycle times, spool depths
            detection.slurm.watcher.catch_up_ended = took_over
            await detection.run(lost)

        # Two controllers for availability: both serve the task queue above; the one
        # holding the cluster's lease runs detection (workers/lease.py).
        lease = LeaseHolder(
            client,
            settings.cluster,
            settings.controller_id,
            settings.temporal_task_queue,
            ttl=settings.lease_ttl,
        )
        await lease.lead(stop, watch)
