"""Incidents recovered end to end with SLURM_ACCESS=pyslurm, on the Slurm 25.11 lab: the
controller's worker reaches Slurm only through `slurm_backend(settings)` (libslurm in
this process), and the Slurm watcher polls through the same backend.

1. An Xid 79 reported for a node of a running job: the culprit is drained and the job
   requeued away from it, every effect made with pyslurm.
2. A node dies under a running job: the watcher's pyslurm poll sees it, opens the
   incident, and the job is recovered on healthy nodes.

Skipped, with the reason, where the 25.11 build or pyslurm is missing (see
tests/fixtures/pyslurm.py); `make test-pyslurm` runs them and forbids the skip.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client

from tests.integration.support import (
    assert_drained_and_requeued_elsewhere,
    result_of,
    running_on,
    start_control,
    submit_running,
    unique_cluster,
    wait_for,
    xid79_recovery,
)
from trainmedic.adapters.slurm.pyslurm_backend import PySlurmBackend
from trainmedic.config import Policy, Settings
from trainmedic.domain import Outcome
from trainmedic.lab import Lab
from trainmedic.watchers.router import build_slurm_detection, local_runner
from trainmedic.watchers.slurm import BackendSource
from trainmedic.workers.controller import build_worker, slurm_backend

pytestmark = pytest.mark.integration

AUTO = (
    "version: it-pyslurm-auto\nmode: {default: auto}\nverify: {timeout: 90s, poll_interval: 1s}\n"
)
AUTO_RAILS = (
    "version: it-pyslurm-detect\nmode: {default: auto}\n"
    "rails: {max_isolated_fraction: 1.0, max_drains_per_hour: 100}\n"
    "verify: {timeout: 90s, poll_interval: 1s}\n"
)


@pytest.fixture
async def pyslurm_settings(
    clean_lab25: Lab,
    pyslurm_backend: PySlurmBackend,  # loads pyslurm for this lab's slurm.conf, once
    temporal_server,  # type: ignore[no-untyped-def]
) -> AsyncIterator[Settings]:
    yield Settings(
        cluster="itpyslurm",
        temporal_address=temporal_server.address,
        temporal_task_queue=f"trainmedic-it-pyslurm-{uuid.uuid4().hex[:6]}",
        slurm_access="pyslurm",
        slurm_conf=clean_lab25.slurm_conf,
        state_dir=clean_lab25.root / "state-pyslurm",
    )


async def test_auto_xid79_with_pyslurm_drains_culprit_and_requeues_elsewhere(
    clean_lab25: Lab, temporal_client: Client, pyslurm_settings: Settings
) -> None:
    backend = slurm_backend(pyslurm_settings)
    assert isinstance(backend, PySlurmBackend)
    assert str(await backend.version()) == "25.11.7"
    incident, job_id, culprit, result = await xid79_recovery(
        temporal_client, clean_lab25, pyslurm_settings, backend, unique_cluster("pys"), AUTO
    )
    backend.close()

    assert_drained_and_requeued_elsewhere(clean_lab25, incident, job_id, culprit, result)
    # every effect went through libslurm, and the audit says so
    commands = [r.command for e in result.effects for r in e.results if r.command]
    assert commands and all(c[0] == "pyslurm" for c in commands), commands


async def test_watcher_polls_with_pyslurm_and_a_dead_node_is_recovered(
    clean_lab25: Lab, temporal_client: Client, pyslurm_settings: Settings
) -> None:
    cluster = unique_cluster("pyw")
    settings = pyslurm_settings.model_copy(update={"cluster": cluster})
    backend = slurm_backend(settings)
    assert isinstance(backend, PySlurmBackend)
    # Given a command runner (as `trainmedic up` passes one), the watcher still polls
    # through the pyslurm backend, not squeue/sinfo JSON.
    detection = build_slurm_detection(
        temporal_client, settings, backend, runner=local_runner(settings), interval=1.0
    )
    assert isinstance(detection.watcher.source, BackendSource)
    worker = build_worker(temporal_client, settings, Policy(), backend=backend)
    stop = asyncio.Event()
    async with worker:
        await start_control(temporal_client, cluster, AUTO_RAILS, settings.temporal_task_queue)
        job_id, placed = submit_running(clean_lab25, 2)
        task = asyncio.create_task(detection.run(stop))
        try:
            # the first poll has seen the job running before the node dies
            await asyncio.to_thread(
                wait_for, lambda: detection.watcher.job_run(job_id) is not None, "a first poll"
            )
            culprit = placed[0]
            clean_lab25.kill_node(culprit)
            prefix = f"incident-{cluster}-{job_id}-"

            def opened() -> list[str] | None:
                ids = sorted(i for i in detection.router.started if i.startswith(prefix))
                return ids or None

            incident = (await asyncio.to_thread(wait_for, opened, "an incident"))[0]
            result = await result_of(temporal_client, incident)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
    backend.close()

    assert result.outcome is Outcome.RECOVERED, result.summary
    assert result.diagnosis is not None and culprit in result.diagnosis.culprit_nodes
    now_on = running_on(clean_lab25, job_id)
    assert now_on and culprit not in now_on
