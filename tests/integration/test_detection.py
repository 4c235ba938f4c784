"""Detection end to end on the lab: a training job, a fault injected the way real jobs
fail, and the controller's watchers -> one incident with the right diagnosis -> (auto)
the job resumes from its checkpoint on healthy nodes."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.integration.support import (
    async_wait_for,
    job,
    node,
    record_history,
    running_on,
    start_control,
    wait_for,
)
from trainmedic.config import Settings
from trainmedic.domain import Action, Category, Outcome
from trainmedic.domain.incident import NODE_EVIDENCE, IncidentResult
from trainmedic.lab import Lab, faults
from trainmedic.lab.agents import in_process_agents
from trainmedic.lab.faults import Fault
from trainmedic.lab.workload import (
    TrainingSpec,
    checkpoint_dir,
    inject,
    job_output,
    prepare_nodes,
    reset_nodes,
    submit_training,
)
from trainmedic.workers.controller import slurm_backend
from trainmedic.workers.detection import Detection, build_detection
from trainmedic.workflows.recovery import RecoveryWorkflow

pytestmark = pytest.mark.integration

CLUSTER = "det"
POLICY = (
    "version: it-detect\nmode: {default: auto}\n"
    "rails: {max_isolated_fraction: 1.0, max_drains_per_hour: 100}\n"
    "verify: {timeout: 90s, poll_interval: 1s}\n"
)


@pytest.fixture(scope="module")
async def detection(
    slurm_lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> AsyncIterator[Detection]:
    settings = controller_settings.model_copy(update={"cluster": CLUSTER})
    await start_control(temporal_client, CLUSTER, POLICY)
    prepare_nodes(slurm_lab)
    built = build_detection(
        temporal_client,
        settings,
        slurm_backend(settings),
        interval=1.0,
        # Above the lab's time to flag a dead node NOT_RESPONDING (~7 s): a silent node
        # death must read as node_down, not as the hang its ranks also show.
        hang_after=timedelta(seconds=10),
        agents=in_process_agents(slurm_lab),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(built.run(stop))
    yield built
    stop.set()
    await asyncio.wait_for(task, 30)


async def train(lab: Lab) -> tuple[str, list[str], str]:
    name = f"t{uuid.uuid4().hex[:6]}"
    job_id = submit_training(
        lab, TrainingSpec(nodes=2, steps=5000, step_seconds=0.25, ckpt_every=8, name=name)
    )
    placed = await asyncio.to_thread(wait_for, lambda: running_on(lab, job_id), "training")
    ckpt = checkpoint_dir(lab, name)
    await asyncio.to_thread(
        wait_for, lambda: ckpt.is_dir() and any(ckpt.iterdir()), "a first checkpoint"
    )
    return job_id, placed, name


async def incident_of(
    detection: Detection, client: Client, job_id: str, fault: str
) -> IncidentResult:
    prefix = f"incident-{CLUSTER}-{job_id}-"
    for _ in range(600):
        ids = {i for i in detection.router.started if i.startswith(prefix)}
        if ids:
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail(f"no incident opened for job {job_id}")
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, sorted(ids)[0])
    result = await asyncio.wait_for(handle.result(), 180)
    await record_history(client, handle.id, name=f"det-{fault}")
    return result


def resumed_from_checkpoint(lab: Lab, job_id: str) -> int | None:
    found = re.findall(r"resuming from checkpoint step (\d+)", job_output(lab, job_id).read_text())
    return int(found[-1]) if found else None


async def check_one_incident(detection: Detection, client: Client, job_id: str) -> None:
    """Every source reported; all of it landed in incident ...-1, nothing opened ...-2."""
    opened = {i for i in detection.router.started if f"-{job_id}-" in i}
    assert len(opened) == 1, opened
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, opened.pop())
    status = await handle.query(RecoveryWorkflow.status)
    assert len({s.source for s in status.signals}) >= 1


CASES = [
    # fault, category, action, culprit is the injected node, resumes
    ("xid79", Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART, True, Outcome.RECOVERED),
    ("ecc", Category.GPU_MEMORY_ECC, Action.DRAIN_AND_RESTART, True, Outcome.RECOVERED),
    # An illegal memory access: a person must look (issue 8), not a blind restart.
    ("nccl-cascade", Category.CUDA_SOFTWARE, Action.ESCALATE, False, Outcome.ESCALATED),
    ("hang", Category.HANG, Action.RESTART, False, Outcome.RECOVERED),
    ("node-death", Category.NODE_DOWN, Action.DRAIN_AND_RESTART, True, Outcome.RECOVERED),
    ("cuda-oom", Category.OOM_GPU, Action.STOP, False, Outcome.STOPPED),
    ("user-exception", Category.USER_CODE, Action.STOP, False, Outcome.STOPPED),
    ("host-oom", Category.OOM_HOST, Action.STOP, False, Outcome.STOPPED),
]


@pytest.mark.parametrize(
    ("fault", "category", "action", "node_culprit", "outcome"), CASES, ids=[c[0] for c in CASES]
)
async def test_fault_is_detected_attributed_and_recovered(
    clean_lab: Lab,
    temporal_client: Client,
    detection: Detection,
    fault: str,
    category: Category,
    action: Action,
    node_culprit: bool,
    outcome: Outcome,
) -> None:
    reset_nodes(clean_lab)
    job_id, placed, _ = await train(clean_lab)
    target = placed[1]
    await asyncio.to_thread(inject, clean_lab, fault, target, job_id)

    result = await incident_of(detection, temporal_client, job_id, fault)

    assert result.diagnosis is not None
    assert result.diagnosis.category is category, result.diagnosis
    assert result.diagnosis.action is action, result.diagnosis
    if node_culprit:
        assert result.diagnosis.culprit_nodes == [target]
    else:
        assert (
            target not in result.diagnosis.culprit_nodes or action is not Action.DRAIN_AND_RESTART
        )
    await check_one_incident(detection, temporal_client, job_id)

    assert result.outcome is outcome, result.summary
    if outcome is Outcome.RECOVERED:
        step = await asyncio.to_thread(
            wait_for, lambda: resumed_from_checkpoint(clean_lab, job_id), "resume from checkpoint"
        )
        assert step >= 8
        now_on = running_on(clean_lab, job_id)
        assert now_on
        if action is Action.DRAIN_AND_RESTART:
            assert target not in now_on
            # Drained by us, or already DOWN in Slurm (a dead node: already true).
            state = node(clean_lab, target)["State"]
            assert "DRAIN" in state or "DOWN" in state, state
    else:
        assert job(clean_lab, job_id)["JobState"] in {"FAILED", "CANCELLED", "OUT_OF_MEMORY"}


async def test_a_node_finding_that_leaves_the_node_fit_leaves_a_running_job_alone(
    clean_lab: Lab, temporal_client: Client, detection: Detection
) -> None:
    """The kernel OOM-kills another process on the job's node (a shared node): the node
    agent reports it, the job runs on. No incident opens for the job (a stop would have
    cancelled a healthy run); the finding waits as evidence for the job's own failure."""
    reset_nodes(clean_lab)
    job_id, placed, _ = await train(clean_lab)
    target = placed[1]
    stranger = faults.kernel_lines(Fault.HOST_OOM, pid=424242, comm="other_users_job")
    await asyncio.to_thread(faults.append_kernel, clean_lab.root, target, stranger)

    def waiting_evidence() -> bool | None:
        waiting = detection.router.node_waiting.get(job_id, ())
        return any(s.kind == NODE_EVIDENCE and s.source == "kernel" for s in waiting) or None

    await async_wait_for(waiting_evidence, "the node's finding to wait as evidence", 30)
    await asyncio.sleep(3)  # what a wrongly opened incident would have used to start
    assert not [
        i for i in detection.router.started if i.startswith(f"incident-{CLUSTER}-{job_id}-")
    ]
    assert job(clean_lab, job_id)["JobState"] == "RUNNING"
    clean_lab.run_client(["scancel", job_id])


async def test_an_appending_job_gets_a_diagnosis_per_run(
    clean_lab: Lab, temporal_client: Client, detection: Detection
) -> None:
    """Issue 8.5: with --open-mode=append run 1's ECC error stays in the log; run 2's
    node death must be diagnosed from run 2's lines (and Slurm), not from run 1's."""
    reset_nodes(clean_lab)
    name = f"a{uuid.uuid4().hex[:6]}"
    job_id = submit_training(
        clean_lab,
        TrainingSpec(
            nodes=2, steps=5000, step_seconds=0.25, ckpt_every=8, name=name, append_log=True
        ),
    )
    placed = await asyncio.to_thread(wait_for, lambda: running_on(clean_lab, job_id), "training")
    ckpt = checkpoint_dir(clean_lab, name)
    await asyncio.to_thread(
        wait_for, lambda: ckpt.is_dir() and any(ckpt.iterdir()), "a first checkpoint"
    )
    await asyncio.to_thread(inject, clean_lab, "ecc", placed[1], job_id)
    first = await incident_of(detection, temporal_client, job_id, "append-ecc")
    assert first.diagnosis is not None
    assert first.diagnosis.category is Category.GPU_MEMORY_ECC, first.diagnosis
    assert first.outcome is Outcome.RECOVERED, first.summary

    def second_run() -> list[str] | None:
        on = running_on(clean_lab, job_id)
        return on if on and resumed_from_checkpoint(clean_lab, job_id) else None

    now_on = await asyncio.to_thread(wait_for, second_run, "run 2 resumed")
    dead = now_on[1]
    await asyncio.to_thread(inject, clean_lab, "node-death", dead, job_id)
    second_id = f"incident-{CLUSTER}-{job_id}-2"
    await asyncio.to_thread(
        wait_for, lambda: second_id in detection.router.started or None, "run 2's incident", 120
    )
    handle = temporal_client.get_workflow_handle_for(RecoveryWorkflow.run, second_id)
    second = await asyncio.wait_for(handle.result(), 180)
    assert second.diagnosis is not None
    assert second.diagnosis.category is Category.NODE_DOWN, second.diagnosis
    assert second.diagnosis.culprit_nodes == [dead]
    assert not any("ecc" in rule.lower() for rule in second.diagnosis.rule_ids)
    # Run 1's error is still in the file: only the scoping kept it out.
    assert "uncorrectable" in job_output(clean_lab, job_id).read_text().lower()
