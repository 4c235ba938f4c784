"""The lab's training job on the real Slurm lab: progress, checkpoints, resume after a
requeue, and each injectable fault with its log lines, kernel lines and exit status —
and the catalog attributing each one (category and culprit) from what it left behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.support import job, wait_for
from trainmedic.catalog import Attributor
from trainmedic.domain import (
    Action,
    AttributionRequest,
    Evidence,
    EvidenceSource,
    SlurmObservation,
)
from trainmedic.domain.hostlist import expand
from trainmedic.lab import Lab
from trainmedic.lab.faults import EXPECTED_CATEGORY, Fault
from trainmedic.lab.workload import (
    TrainingSpec,
    checkpoint_dir,
    inject,
    job_output,
    kernel_log,
    reset_nodes,
    submit_training,
)

pytestmark = pytest.mark.integration

STEP = 0.2


@pytest.fixture(scope="module")
def attributor() -> Attributor:
    return Attributor()


@pytest.fixture
def lab(clean_lab: Lab) -> Lab:
    reset_nodes(clean_lab)
    return clean_lab


def _start(lab: Lab, name: str, nodes: int = 2, ckpt_every: int = 5) -> tuple[str, list[str]]:
    spec = TrainingSpec(
        nodes=nodes, steps=2000, step_seconds=STEP, ckpt_every=ckpt_every, name=name
    )
    job_id = submit_training(lab, spec)
    out = job_output(lab, job_id)

    def every_rank_stepping() -> bool:
        text = out.read_text() if out.exists() else ""
        return all(f"[rank{r}]: step 2/" in text for r in range(nodes))

    wait_for(every_rank_stepping, f"job {job_id} to make progress on every rank", 60)
    return job_id, expand(job(lab, job_id)["NodeList"])


def _finished(lab: Lab, job_id: str) -> dict[str, str] | None:
    info = job(lab, job_id)
    return info if info["JobState"] in {"FAILED", "COMPLETED", "CANCELLED"} else None


def _kernel_evidence(lab: Lab, nodes: list[str], sizes: dict[str, int]) -> list[Evidence]:
    evidence = []
    for node in nodes:
        path = kernel_log(lab, node)
        with path.open() as handle:
            handle.seek(sizes[node])
            for offset, line in enumerate(handle.read().splitlines()):
                evidence.append(
                    Evidence(
                        source=EvidenceSource.KERNEL,
                        text=line,
                        file=str(path),
                        line_no=offset + 1,
                        node=node,
                    )
                )
    return evidence


def _sizes(lab: Lab, nodes: list[str]) -> dict[str, int]:
    return {n: kernel_log(lab, n).stat().st_size for n in nodes}


def test_progress_checkpoints_and_resume_after_requeue(lab: Lab) -> None:
    job_id, nodes = _start(lab, "resume")
    assert len(nodes) == 2
    ckpt = checkpoint_dir(lab, "resume")
    wait_for(lambda: (ckpt / "step-10").exists(), "the step-10 checkpoint", 60)
    lab.run_client(["scontrol", "requeue", job_id])

    # The requeued job waits a few seconds (its old credentials must expire) and runs again.
    def restarted() -> bool:
        info = job(lab, job_id)
        return info["JobState"] == "RUNNING" and info["Restarts"] == "1"

    wait_for(restarted, f"job {job_id} to run again", 60)
    out = job_output(lab, job_id)
    wait_for(
        lambda: all(f"[rank{r}]: resuming from checkpoint step" in out.read_text() for r in (0, 1)),
        "the requeued job to resume",
        90,
    )
    text = out.read_text()
    saved = max(int(p.name[5:]) for p in ckpt.glob("step-*"))
    resumed = int(text.split("[rank0]: resuming from checkpoint step ")[1].split()[0])
    assert resumed % 5 == 0 and 10 <= resumed <= saved
    wait_for(
        lambda: f"[rank0]: step {resumed + 1}/2000 | loss " in out.read_text(),
        "a step after the resumed checkpoint",
        30,
    )
    assert job(lab, job_id)["Restarts"] == "1"
    lab.run_client(["scancel", job_id])


# fault -> (job exit code as scontrol shows it, kernel line expected on the faulty node)
CRASHES = {
    Fault.XID79: ("NVRM: Xid (PCI:0000:18:00): 79, pid=", "CUDA error: unspecified launch failure"),
    Fault.ECC: ("NVRM: Xid (PCI:0000:18:00): 48, pid=", "uncorrectable ECC error encountered"),
    Fault.NCCL_CASCADE: (None, "CUDA error: an illegal memory access was encountered"),
    Fault.CUDA_OOM: (None, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"),
    Fault.USER_EXCEPTION: (None, "KeyError: 'labels'"),
    Fault.HOST_OOM: ("Out of memory: Killed process", None),
}


@pytest.mark.parametrize("fault", list(CRASHES), ids=[f.value for f in CRASHES])
def test_fault_fails_the_job_like_the_real_thing(
    lab: Lab, attributor: Attributor, fault: Fault
) -> None:
    job_id, nodes = _start(lab, f"f-{fault.value}")
    sizes = _sizes(lab, nodes)
    culprit = nodes[1]  # rank 1
    done = inject(lab, fault, culprit, job_id)
    assert (done.job_id, done.rank, done.node) == (job_id, 1, culprit)
    info = wait_for(lambda: _finished(lab, job_id), f"job {job_id} to fail", 60)
    kernel_line, log_line = CRASHES[fault]
    text = job_output(lab, job_id).read_text()
    kern = _kernel_evidence(lab, nodes, sizes)
    # Kernel lines only on the faulty node, and with the dying task's pid.
    assert {e.node for e in kern} <= {culprit}
    if kernel_line:
        assert any(kernel_line in e.text and str(done.pid) in e.text for e in kern)
    else:
        assert kern == []
    if log_line:
        assert any(line.startswith("[rank1]: ") and log_line in line for line in text.splitlines())
    # The healthy rank times out in its collective and aborts, as NCCL's watchdog does.
    assert "[rank0]:[E" in text and "[Rank 0] Watchdog caught collective operation timeout" in text
    assert info["JobState"] == "FAILED"
    if fault is Fault.HOST_OOM:
        assert f"srun: error: {culprit}: task 1: Killed" in text
    else:
        assert f"srun: error: {culprit}: task 1: Exited with exit code 1" in text
    assert info["ExitCode"] in {"134:0", "137:0", "1:0"}

    exit_code = int(info["ExitCode"].split(":")[0])
    diagnosis = attributor.attribute(
        AttributionRequest(
            job_id=job_id,
            nodelist=nodes,
            tasks_per_node=1,
            log_paths=[str(job_output(lab, job_id))],
            evidence=kern,
            slurm=SlurmObservation(
                job_state=info["JobState"], state_reason=info["Reason"], exit_code=exit_code
            ),
        )
    )
    assert diagnosis.category.value == EXPECTED_CATEGORY[fault], diagnosis.summary
    if fault in {Fault.XID79, Fault.ECC}:
        assert diagnosis.culprit_nodes == [culprit]
    else:
        # Not the node's fault: nothing drained or excluded. A stop may still say where
        # it happened (the node of the error line), and only that node.
        assert diagnosis.action not in {Action.DRAIN_AND_RESTART, Action.RESTART_EXCLUDING}
        assert set(diagnosis.culprit_nodes) <= {culprit}
    if fault not in {Fault.XID79, Fault.ECC, Fault.HOST_OOM}:
        assert diagnosis.culprit_ranks == [1]


def test_hang_stops_progress_but_not_the_job(lab: Lab) -> None:
    job_id, nodes = _start(lab, "hang")
    sizes = _sizes(lab, nodes)
    inject(lab, Fault.HANG, nodes[1], job_id)
    out = job_output(lab, job_id)
    # Each rank may finish the step it was in; after that, silence.
    _settle(out)
    before = out.read_text()
    assert job(lab, job_id)["JobState"] == "RUNNING"
    assert out.read_text() == before
    assert "Watchdog" not in before and "Traceback" not in before
    assert _kernel_evidence(lab, nodes, sizes) == []
    lab.run_client(["scancel", job_id])


def _settle(path: Path) -> int:
    """Line count once it has not changed for a few step times."""
    count = -1
    while True:
        now = len(path.read_text().splitlines())
        if now == count:
            return now
        count = now
        time.sleep(STEP * 5)


def test_node_death_is_silent_and_slurm_sees_it(lab: Lab, attributor: Attributor) -> None:
    job_id, nodes = _start(lab, "death")
    sizes = _sizes(lab, nodes)
    victim = nodes[1]
    result = inject(lab, Fault.NODE_DEATH, victim, job_id)
    assert result.killed_pids

    def node_down() -> str | None:
        state = lab.status().node(victim).state or ""
        return state if "DOWN" in state or "NOT_RESPONDING" in state else None

    state = wait_for(node_down, f"{victim} to be marked down", 60)
    assert _kernel_evidence(lab, nodes, sizes) == []  # silent: no kernel line
    text = job_output(lab, job_id).read_text()
    assert "Traceback" not in text
    info = job(lab, job_id)
    diagnosis = attributor.attribute(
        AttributionRequest(
            job_id=job_id,
            nodelist=nodes,
            tasks_per_node=1,
            log_paths=[str(job_output(lab, job_id))],
            slurm=SlurmObservation(
                job_state=info["JobState"],
                state_reason=info["Reason"],
                node_states={n: (state if n == victim else "ALLOCATED") for n in nodes},
                node_reasons={victim: lab.status().node(victim).reason or "Not responding"},
            ),
        )
    )
    assert diagnosis.category.value == EXPECTED_CATEGORY[Fault.NODE_DEATH], diagnosis.summary
    assert diagnosis.culprit_nodes == [victim]
