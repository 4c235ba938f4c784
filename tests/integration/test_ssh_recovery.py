"""One incident recovered end to end in SSH mode: the controller's worker reaches Slurm
only through `slurm_backend(settings)` with slurm_access=ssh (a real sshd on loopback,
one verified connection), and drains the culprit and requeues the job away from it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.fixtures.ssh import SshServer
from tests.integration.support import (
    job,
    node,
    result_of,
    running_on,
    submit_running,
    unique_cluster,
    xid79,
)
from trainmedic.activities.control import ensure_control
from trainmedic.adapters.slurm import SlurmCli
from trainmedic.adapters.slurm.ssh import SshRunner, ssh_runner
from trainmedic.config import Policy, Settings, parse_policy
from trainmedic.domain import Action, Outcome
from trainmedic.domain.incident import EffectStatus, IncidentInput
from trainmedic.lab import Lab
from trainmedic.workers.controller import build_worker, slurm_backend
from trainmedic.workflows.recovery import RecoveryWorkflow

pytestmark = pytest.mark.integration

AUTO = "version: it-ssh-auto\nmode: {default: auto}\nverify: {timeout: 90s, poll_interval: 1s}\n"


@pytest.fixture
async def ssh_settings(
    slurm_lab: Lab,
    ssh_server: SshServer,
    temporal_server,  # type: ignore[no-untyped-def]
) -> AsyncIterator[Settings]:
    settings = Settings(
        cluster="itssh",
        temporal_address=temporal_server.address,
        temporal_task_queue=f"trainmedic-it-ssh-{uuid.uuid4().hex[:6]}",
        slurm_access="ssh",
        ssh_host=ssh_server.host,
        ssh_port=ssh_server.port,
        ssh_user=ssh_server.user,
        ssh_key=ssh_server.client_key,
        ssh_known_hosts=ssh_server.known_hosts,
        slurm_conf=slurm_lab.slurm_conf,
        state_dir=slurm_lab.root / "state-ssh",
    )
    yield settings
    await ssh_runner(settings).close()


async def test_auto_xid79_over_ssh_drains_culprit_and_requeues_elsewhere(
    clean_lab: Lab, temporal_client: Client, ssh_settings: Settings
) -> None:
    backend = slurm_backend(ssh_settings)
    assert isinstance(backend, SlurmCli)
    runner = backend._runner
    assert isinstance(runner, SshRunner) and runner is ssh_runner(ssh_settings)
    queue = ssh_settings.temporal_task_queue
    cluster = unique_cluster("ssh")
    policy: Policy = parse_policy(AUTO)
    worker: Worker = build_worker(temporal_client, ssh_settings, Policy(), backend=backend)
    async with worker:
        await ensure_control(temporal_client, cluster, policy, queue)
        job_id, placed = submit_running(clean_lab, 2)
        culprit = placed[0]
        signal = xid79(culprit)
        incident = f"incident-{cluster}-{job_id}-1"
        await temporal_client.start_workflow(
            RecoveryWorkflow.run,
            IncidentInput(cluster=cluster, job_id=job_id, nodes=signal.nodes, signal=signal),
            id=incident,
            task_queue=queue,
        )
        result = await result_of(temporal_client, incident)

    assert result.outcome is Outcome.RECOVERED, result.summary
    assert result.diagnosis is not None
    assert result.diagnosis.action is Action.DRAIN_AND_RESTART
    assert result.diagnosis.culprit_nodes == [culprit]
    assert [e.status for e in result.effects] == [EffectStatus.APPLIED, EffectStatus.APPLIED]
    drained = node(clean_lab, culprit)
    assert "DRAIN" in drained["State"] and incident in drained["Reason"]
    now_on = running_on(clean_lab, job_id)
    assert now_on and culprit not in now_on and len(now_on) == 2
    assert int(job(clean_lab, job_id)["Restarts"]) == 1
    assert culprit in job(clean_lab, job_id)["ExcNodeList"]
    # everything went over the one SSH connection, which is still up
    assert runner._master is not None and runner._master.poll() is None
