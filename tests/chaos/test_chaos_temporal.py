"""Chaos around Temporal itself: the dev server killed in the middle of an incident, and
reports arriving while it is down. Each scenario runs its own dev server (the session's
must stay up for the other tests), an in-process controller worker and the watchers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.chaos.support import (
    AUTO,
    SlurmctldLog,
    controller_for,
    incidents,
    running,
    wait_incidents,
    xid79_on,
)
from tests.integration.support import async_wait_for, submit
from trainmedic import procs
from trainmedic.config import Policy, Settings
from trainmedic.domain import Outcome
from trainmedic.lab import Lab
from trainmedic.temporal.client import connect_plain
from trainmedic.temporal.devserver import DevServer
from trainmedic.watchers.epilog import spool_dir
from trainmedic.workers.controller import build_worker
from trainmedic.workflows.recovery import RecoveryWorkflow

pytestmark = pytest.mark.integration


@asynccontextmanager
async def own_temporal(
    tmp_path: Path, controller_settings: Settings
) -> AsyncIterator[tuple[DevServer, Client, Settings]]:
    """A dev server of this test's own, and the controller's worker on it."""
    server = DevServer(tmp_path / "temporal", port=procs.free_port(), ui_port=procs.free_port())
    server.start(timeout_s=90)
    try:
        client = await connect_plain(server.address)
        settings = controller_settings.model_copy(
            update={"temporal_address": server.address, "state_dir": tmp_path / "state"}
        )
        worker: Worker = build_worker(client, settings, Policy())
        async with worker:
            yield server, client, settings
    finally:
        server.stop()


async def test_temporal_killed_and_restarted_in_the_middle_of_an_incident(
    lab: Lab, tmp_path: Path, controller_settings: Settings
) -> None:
    """kill -9 of the server after the incident opened: once it is back, the incident
    goes on from its history; each effect happens exactly once."""
    ctld = SlurmctldLog(lab)
    async with (
        own_temporal(tmp_path, controller_settings) as (server, client, settings),
        controller_for(lab, client, settings, AUTO) as detection,
    ):
        job_id = submit(lab, 2)
        placed = await running(lab, job_id, detection)
        culprit = placed[0]
        xid79_on(lab, culprit)
        [incident] = await wait_incidents(detection, job_id, 1)
        server.kill_hard()
        await asyncio.sleep(5)
        server.start(timeout_s=90)
        handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
        result = await asyncio.wait_for(handle.result(), 240)
    assert result.outcome is Outcome.RECOVERED, result.summary
    assert ctld.drains(culprit) == 1
    assert ctld.requeues(job_id) == 1
    assert len(incidents(detection, job_id)) == 1


async def test_reports_arriving_while_temporal_is_down_are_not_lost(
    lab: Lab, tmp_path: Path, controller_settings: Settings
) -> None:
    """A job fails while the server is down: the Slurm watcher's report is held and the
    epilog's stays in its spool; both reach one incident when Temporal is back."""
    async with (
        own_temporal(tmp_path, controller_settings) as (server, client, settings),
        controller_for(lab, client, settings, AUTO) as detection,
    ):
        job_id = submit(lab, 1, body="sleep 4\necho 'ValueError: bad config' >&2\nexit 3")
        await running(lab, job_id, detection)
        server.kill_hard()
        # The epilog of a real cluster runs `trainmedic report` at the job's end.
        await async_wait_for(
            lambda: detection.slurm.held.held or None, "the watcher to hold its report"
        )
        env = {**os.environ, "TRAINMEDIC_STATE_DIR": str(settings.state_dir)}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainmedic.cli.main",
                "report",
                "--job-id",
                job_id,
                "--exit-code",
                "3",
                "--restart-count",
                "0",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        spool = spool_dir(settings.state_dir)
        await asyncio.sleep(3)  # the spool tries, and keeps the file
        assert [p for p in spool.glob("*.json")], "the epilog's report left the spool"
        assert incidents(detection, job_id) == []
        server.start(timeout_s=90)
        [incident] = await wait_incidents(detection, job_id, 1)
        handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident)

        async def both_sources() -> bool | None:
            status = await handle.query(RecoveryWorkflow.status)
            sources = {s.source for s in status.signals}
            return True if {"slurm", "epilog"} <= sources else None

        for _ in range(60):
            if await both_sources():
                break
            await asyncio.sleep(1)
        else:
            pytest.fail("the incident did not get both reports")
        await asyncio.wait_for(handle.result(), 180)
    assert not detection.slurm.held.held
    assert not list(spool.glob("*.json"))
