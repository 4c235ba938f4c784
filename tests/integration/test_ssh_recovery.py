"""One incident recovered end to end in SSH mode: the controller's worker reaches Slurm
only through `slurm_backend(settings)` with slurm_access=ssh (a real sshd on loopback,
one verified connection), and drains the culprit and requeues the job away from it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client

from tests.fixtures.ssh import SshServer
from tests.integration.support import (
    assert_drained_and_requeued_elsewhere,
    unique_cluster,
    xid79_recovery,
)
from trainmedic.adapters.slurm import SlurmCli
from trainmedic.adapters.slurm.ssh import SshRunner, ssh_runner
from trainmedic.config import Settings
from trainmedic.lab import Lab
from trainmedic.workers.controller import slurm_backend

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
    incident, job_id, culprit, result = await xid79_recovery(
        temporal_client, clean_lab, ssh_settings, backend, unique_cluster("ssh"), AUTO
    )

    assert_drained_and_requeued_elsewhere(clean_lab, incident, job_id, culprit, result)
    # everything went over the one SSH connection, which is still up
    assert runner._master is not None and runner._master.poll() is None
