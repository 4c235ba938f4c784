"""The contract every Slurm backend passes, on the real lab: the same tests for Slurm's
commands run locally and run over SSH (a real sshd on loopback, as root to localhost).

The cases live in tests/integration/slurm_backend_cases.py (reads, every effect with its
idempotence, typed errors for unknown jobs and nodes); imported here, each runs once per
backend through the `slurm` fixture below. A new backend (pyslurm) joins BACKENDS.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fixtures.ssh import SshServer
from tests.integration.slurm_backend_cases import (
    test_cancel_and_comment,
    test_drain_and_resume_with_reason,
    test_requeue_counts_a_restart,
    test_requeue_hold_exclude_release_lands_elsewhere,
    test_start_now_on_a_running_job_is_a_no_op,
    test_unknown_job_and_node_raise_typed_errors,
    test_version_and_reads,
)
from trainmedic.adapters.slurm import LocalRunner, SlurmCli, SshRunner
from trainmedic.lab import Lab

pytestmark = pytest.mark.integration

__all__ = [
    "test_cancel_and_comment",
    "test_drain_and_resume_with_reason",
    "test_requeue_counts_a_restart",
    "test_requeue_hold_exclude_release_lands_elsewhere",
    "test_start_now_on_a_running_job_is_a_no_op",
    "test_unknown_job_and_node_raise_typed_errors",
    "test_version_and_reads",
]

BACKENDS = ["local", "ssh"]


@pytest.fixture(scope="session")
async def ssh_lab_runner(slurm_lab: Lab, ssh_server: SshServer) -> AsyncIterator[SshRunner]:
    """One SSH connection for the whole contract run, as the controller keeps one."""
    runner = ssh_server.runner(env=slurm_lab.env_overrides())
    yield runner
    await runner.close()


@pytest.fixture(params=BACKENDS)
def slurm(request: pytest.FixtureRequest, clean_lab: Lab) -> SlurmCli:
    if request.param == "ssh":
        runner = request.getfixturevalue("ssh_lab_runner")
        return SlurmCli(runner, timeout=30)
    return SlurmCli(LocalRunner(env=clean_lab.env_overrides()), timeout=30)


async def test_reads_match_what_slurm_says_locally(clean_lab: Lab, slurm: SlurmCli) -> None:
    local = SlurmCli(LocalRunner(env=clean_lab.env_overrides()), timeout=30)
    nodes = await slurm.list_nodes()
    assert [n.name for n in nodes] == [n.name for n in await local.list_nodes()]
    assert len(nodes) == 4 and all(n.is_available for n in nodes)
    assert (await slurm.get_node(nodes[0].name)).name == nodes[0].name
    assert {j.job_id for j in await slurm.list_jobs()} == {
        j.job_id for j in await local.list_jobs()
    }
    assert all(j.is_finished for j in await slurm.list_jobs())  # clean_lab left none running
