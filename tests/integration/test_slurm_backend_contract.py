"""The contract every Slurm backend passes, on the real lab: the same tests for Slurm's
commands run locally and run over SSH (a real sshd on loopback, as root to localhost),
and for pyslurm (libslurm in this process) on a lab of Slurm 25.11, the only release
PyPI's pyslurm builds for.

The cases live in tests/integration/slurm_backend_cases.py (reads, every effect with its
idempotence, typed errors for unknown jobs and nodes); imported here, each runs once per
backend through the `slurm` fixture below. The pyslurm runs skip, saying why, where the
25.11 build or pyslurm is missing (`make test-pyslurm` provides both and forbids the skip).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

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
from trainmedic.adapters.slurm import LocalRunner, SlurmBackend, SlurmCli, SshRunner
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

BACKENDS = ["local", "ssh", "pyslurm"]


@pytest.fixture(scope="session")
async def ssh_lab_runner(slurm_lab: Lab, ssh_server: SshServer) -> AsyncIterator[SshRunner]:
    """One SSH connection for the whole contract run, as the controller keeps one."""
    runner = ssh_server.runner(env=slurm_lab.env_overrides())
    yield runner
    await runner.close()


@pytest.fixture
def clean_lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """The lab of the test's backend, clean: the system's Slurm for the command-line
    backends, Slurm 25.11 for pyslurm (this module's override of the shared fixture)."""
    callspec = getattr(request.node, "callspec", None)
    backend = callspec.params.get("slurm") if callspec is not None else None
    lab: Lab = request.getfixturevalue("slurm25_lab" if backend == "pyslurm" else "slurm_lab")
    lab.reset()
    yield lab
    lab.reset()


@pytest.fixture(params=BACKENDS)
def slurm(request: pytest.FixtureRequest, clean_lab: Lab) -> SlurmBackend:
    if request.param == "pyslurm":
        backend: SlurmBackend = request.getfixturevalue("pyslurm_backend")
        return backend
    if request.param == "ssh":
        runner = request.getfixturevalue("ssh_lab_runner")
        return SlurmCli(runner, timeout=30)
    return SlurmCli(LocalRunner(env=clean_lab.env_overrides()), timeout=30)


async def test_reads_match_what_slurm_says_locally(clean_lab: Lab, slurm: SlurmBackend) -> None:
    local = SlurmCli(LocalRunner(env=clean_lab.env_overrides()), timeout=30)
    nodes = await slurm.list_nodes()
    assert [n.name for n in nodes] == [n.name for n in await local.list_nodes()]
    assert len(nodes) == 4 and all(n.is_available for n in nodes)
    assert (await slurm.get_node(nodes[0].name)).name == nodes[0].name
    assert {j.job_id for j in await slurm.list_jobs()} == {
        j.job_id for j in await local.list_jobs()
    }
    assert all(j.is_finished for j in await slurm.list_jobs())  # clean_lab left none running
