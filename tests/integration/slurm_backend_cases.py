"""The Slurm backend contract's cases against the real lab: reads, every effect,
idempotence, and typed errors for unknown jobs and nodes.

Not collected on its own: test_slurm_backend_contract.py runs each case once per backend
(local commands and SSH on the system's Slurm 22.05, pyslurm on a Slurm 25.11 lab)
through its `slurm` fixture. An effect's recorded `command` is the request as made: the
argv of the command-line backends, the same prefixed with "pyslurm" when libslurm made
it in-process; the cases check the request, which both share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from trainmedic.adapters.slurm import (
    JobStateConflict,
    NoSuchJob,
    NoSuchNode,
    SlurmBackend,
)
from trainmedic.domain.slurm import SlurmJob
from trainmedic.lab import Lab

pytestmark = pytest.mark.integration

T = TypeVar("T")


async def wait_for(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.5)


def submit(lab: Lab, *args: str, script: str = "sleep 600") -> str:
    jobs = lab.layout.jobs
    path = jobs / f"job-{time.monotonic_ns()}.sh"
    path.write_text("#!/bin/bash\n" + script + "\n")
    out = lab.run_client(
        ["sbatch", "--parsable", "-D", str(jobs), "-o", f"{jobs}/%j.out", *args, str(path)]
    ).stdout
    return out.strip().split(";")[0]


async def running(slurm: SlurmBackend, job_id: str) -> SlurmJob:
    seen: list[str] = []

    async def probe() -> SlurmJob | None:
        job = await slurm.get_job(job_id)
        state = "+".join([job.state, *job.state_flags]) + f" ({job.state_reason})"
        if not seen or seen[-1] != state:
            seen.append(state)
        return job if job.is_running and job.nodes else None

    try:
        return await wait_for(probe, f"job {job_id} to run")
    except pytest.fail.Exception as error:
        job = await slurm.get_job(job_id)
        out = Path(job.stdout_path) if job.stdout_path else None
        tail = out.read_text()[-400:] if out and out.exists() else "(no output file)"
        raise AssertionError(f"{error}; states seen: {seen}; output: {tail!r}") from None


async def test_version_and_reads(slurm: SlurmBackend, clean_lab: Lab) -> None:
    version = await slurm.version()
    assert version.major >= 22
    job_id = submit(clean_lab, "-N", "2", "--ntasks-per-node=2", "--comment", "hi there")
    job = await running(slurm, job_id)
    assert len(job.nodes) == 2 and job.tasks_per_node == 2 and job.comment == "hi there"
    assert job.stdout_path == f"{clean_lab.layout.jobs}/{job_id}.out"
    listed = {j.job_id: j for j in await slurm.list_jobs()}
    assert listed[job_id].nodes == job.nodes
    assert listed[job_id].stdout_path == job.stdout_path  # pattern expanded like scontrol
    nodes = await slurm.nodes_of_job(job_id)
    assert [n.name for n in nodes] == job.nodes
    assert {n.name for n in await slurm.list_nodes()} >= set(job.nodes)


async def test_drain_and_resume_with_reason(slurm: SlurmBackend) -> None:
    reason = "trainmedic incident-lab-1-1: Xid 79 on gpu02"
    first = await slurm.drain_node("gpu02", reason)
    assert first.changed and first.after == "IDLE+DRAIN"
    node = await slurm.get_node("gpu02")
    assert node.is_drained and node.reason == reason
    again = await slurm.drain_node("gpu02", "another reason")
    assert not again.changed and again.command == []
    assert (await slurm.get_node("gpu02")).reason == reason  # not overwritten
    kept = await slurm.resume_node("gpu02", only_if_reason_contains="incident-other")
    assert not kept.changed and (await slurm.get_node("gpu02")).is_drained
    resumed = await slurm.resume_node("gpu02", only_if_reason_contains="incident-lab-1-1")
    assert resumed.changed and resumed.command[-1] == "State=RESUME"
    node = await slurm.get_node("gpu02")
    assert not node.drain_flag and node.reason is None
    # Slurm marks a resumed node not-responding ('IDLE*') until its next ping.

    async def available() -> bool:
        return (await slurm.get_node("gpu02")).is_available

    await wait_for(available, "gpu02 to take work again")
    assert not (await slurm.resume_node("gpu02")).changed


async def test_requeue_counts_a_restart(slurm: SlurmBackend, clean_lab: Lab) -> None:
    job_id = submit(clean_lab, "-N", "1")
    await running(slurm, job_id)
    result = await slurm.requeue(job_id)
    assert result.changed and result.command[-3:] == ["scontrol", "requeue", job_id]
    job = await slurm.get_job(job_id)
    # 22.05 shows the requeued job COMPLETING until its old processes are gone
    assert job.restarts == 1 and job.state in {"COMPLETING", "PENDING", "RUNNING"}
    if job.state != "RUNNING":
        assert not (await slurm.requeue(job_id)).changed  # the requeue already happened

    # No start_now here: on the same node, a restart right away can race the old job's
    # teardown and fail (seen: FAILED NonZeroExitCode); the lab's cred_expire is 5 s.
    await running(slurm, job_id)


async def test_requeue_hold_exclude_release_lands_elsewhere(
    slurm: SlurmBackend, clean_lab: Lab
) -> None:
    job_id = submit(clean_lab, "-N", "2")
    first = await running(slurm, job_id)
    bad = first.nodes
    results = await slurm.requeue_excluding(job_id, bad)
    assert [r.changed for r in results] == [True, True, True]
    assert results[0].command[-3:] == ["scontrol", "requeuehold", job_id]
    job = await slurm.get_job(job_id)
    assert set(bad) <= set(job.excluded_nodes)
    again = await running(slurm, job_id)
    assert not set(again.nodes) & set(bad), f"restarted on {again.nodes}, excluded {bad}"
    assert again.restarts == 1
    # repeating the steps after the job runs again changes nothing and says so
    # (repeating requeue_excluding as a whole would requeue the running job again:
    # whether the recovery already happened is the workflow's call, from `restarts`)
    assert not (await slurm.exclude_nodes(job_id, bad)).changed
    assert not (await slurm.release(job_id)).changed
    assert not (await slurm.start_now(job_id)).changed


async def test_cancel_and_comment(slurm: SlurmBackend, clean_lab: Lab) -> None:
    job_id = submit(clean_lab, "-N", "1")
    await running(slurm, job_id)
    note = "trainmedic incident-lab-2-1: stopped, same failure 3 times (key=value kept)"
    commented = await slurm.set_comment(job_id, note)
    assert commented.changed and (await slurm.get_job(job_id)).comment == note
    assert not (await slurm.set_comment(job_id, note)).changed
    cancelled = await slurm.cancel(job_id)
    assert cancelled.changed and cancelled.command[-2:] == ["scancel", job_id]

    async def ended() -> SlurmJob | None:
        job = await slurm.get_job(job_id)
        return job if job.is_finished else None

    assert (await wait_for(ended, "the job to end")).state == "CANCELLED"
    assert not (await slurm.cancel(job_id)).changed
    with pytest.raises(JobStateConflict):
        await slurm.set_comment(job_id, "too late")


async def test_start_now_on_a_running_job_is_a_no_op(slurm: SlurmBackend, clean_lab: Lab) -> None:
    job_id = submit(clean_lab, "-N", "1")
    await running(slurm, job_id)
    result = await slurm.start_now(job_id)
    assert not result.changed and "not pending" in result.detail
    assert not (await slurm.release(job_id)).changed


async def test_unknown_job_and_node_raise_typed_errors(slurm: SlurmBackend) -> None:
    with pytest.raises(NoSuchJob) as job_error:
        await slurm.get_job("987654")
    assert not job_error.value.retryable
    with pytest.raises(NoSuchJob):
        await slurm.cancel("987654")
    with pytest.raises(NoSuchNode) as node_error:
        await slurm.get_node("nosuchnode9")
    assert not node_error.value.retryable
    with pytest.raises(NoSuchNode):
        await slurm.drain_node("nosuchnode9", "x")
