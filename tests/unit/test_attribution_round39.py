"""Third session of 2026-12-03: decisions that tune cases asked for once read again.

Lines quoted from a tune case name it; the others follow the tools' own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category

PREEMPTED = (
    "submitit WARNING (2022-07-12 04:18:45,881) - Caught signal SIGUSR1 on learnfair0293: "
    "this job is timed-out."
)


@pytest.mark.parametrize(
    "reason",
    [
        # tune c-041, the last line of its traceback.
        "submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out and not "
        "checkpointable.",
        "submitit INFO (2023-03-02 08:14:51,120) - Job not requeued because: timed-out too many "
        "times.",
        "submitit INFO (2023-03-02 08:14:51,120) - Job not requeued because: checkpoint function "
        "returned None.",
    ],
)
def test_submitits_refusal_to_requeue_is_a_stop_not_a_wait(tmp_path: Path, reason: str) -> None:
    # Nothing will requeue the job: waiting for the framework would wait forever.
    diagnosis = diagnose(tmp_path, [PREEMPTED, reason])
    assert diagnosis.rule_ids[0] == "framework.requeue_refused"
    assert (diagnosis.category, diagnosis.action) == (Category.SCHEDULER_PREEMPTION, Action.STOP)
    assert diagnosis.transient is False


def test_submitits_own_requeue_is_still_waited_for(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "submitit WARNING (2022-07-12 04:18:45,881) - Caught signal SIGUSR1 on learnfair0293: "
            "this job is preempted.",
            "submitit INFO (2021-04-01 02:26:28,004) - Requeued job 39025082 "
            "(3 remaining timeouts)",
        ],
    )
    assert diagnosis.rule_ids[0] == "framework.requeue"
    assert diagnosis.action is Action.WAIT


def test_lightnings_failed_requeue_is_ours_to_do(tmp_path: Path) -> None:
    # Lightning logs the failure of its own `scontrol requeue` with the words its success
    # line starts with; nothing else requeues the job, and its checkpoint is saved.
    lines = [
        "Handling auto-requeue signal: 10",
        "requeing job 4406981...",
        "Requeuing SLURM job 4406981 failed with error code 1",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == "framework.requeue_failed"
    assert (diagnosis.category, diagnosis.action) == (
        Category.SCHEDULER_PREEMPTION,
        Action.RESTART,
    )
    succeeded = diagnose(tmp_path, [*lines[:2], "Requeued SLURM job: 4406981"])
    assert succeeded.action is Action.WAIT


# A review of the rules against the source of the tools that print their lines (Slurm,
# submitit, Lightning, Ray, CUDA) found lines that mean the opposite of what a rule read.

TIME_LIMIT = (
    "slurmstepd: error: *** JOB 4406981 ON gpu01 CANCELLED AT 2025-03-14T08:00:07 "
    "DUE TO TIME LIMIT ***"
)


def test_a_failed_framework_requeue_outranks_the_time_limit_that_follows(
    tmp_path: Path,
) -> None:
    # Lightning goes on training after its requeue failed, until the limit ends the job:
    # nothing requeues it, so the framework's intent is carried out here.
    diagnosis = diagnose(
        tmp_path,
        [
            "Handling auto-requeue signal: 10",
            "Requeuing SLURM job 4406981 failed with error code 1",
            "Epoch 7:  41%|████      | 410/1000 [10:02<14:26,  0.68it/s, loss=2.31]",
            TIME_LIMIT,
        ],
    )
    assert diagnosis.rule_ids[0] == "framework.requeue_failed"
    assert diagnosis.action is Action.RESTART


def test_submitits_failed_scontrol_requeue_is_not_a_requeue_under_way(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            PREEMPTED.replace("timed-out", "preempted"),
            "subprocess.CalledProcessError: Command '['scontrol', 'requeue', '39025082']' "
            "returned non-zero exit status 1.",
        ],
    )
    assert diagnosis.rule_ids[0] == "framework.requeue_failed"
    assert diagnosis.action is Action.RESTART


@pytest.mark.parametrize(
    "announcement",
    [PREEMPTED.replace("timed-out", "preempted"), "Handling auto-requeue signal: 10"],
)
def test_a_requeue_announcement_is_waited_for_only_where_nothing_else_failed(
    tmp_path: Path, announcement: str
) -> None:
    # The signal is announced before the checkpoint and the requeue are tried.
    alone = diagnose(tmp_path, [announcement])
    assert (alone.rule_ids[0], alone.action) == ("framework.requeue_signal", Action.WAIT)
    crashed = diagnose(
        tmp_path,
        [
            announcement,
            "Traceback (most recent call last):",
            '  File "train.py", line 88, in checkpoint',
            "KeyError: 'optimizer'",
        ],
    )
    assert crashed.action is not Action.WAIT
    assert "framework.requeue_signal" not in crashed.rule_ids[:1]


def test_slurmctlds_requeue_error_is_not_a_requeue(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "slurmctld: _slurm_rpc_requeue: Requeue of JobId=771 returned an error: "
            "Only batch jobs are accepted or processed"
        ],
    )
    assert diagnosis.action is not Action.WAIT


def test_a_step_torn_down_after_a_failure_is_not_a_cancelled_job(tmp_path: Path) -> None:
    # srun's teardown after MPI_Abort prints the step's banner, as scancel does.
    failed = diagnose(
        tmp_path,
        [
            "Abort(1) on node 0 (rank 0 in comm 0): application called MPI_Abort"
            "(MPI_COMM_WORLD, 1) - process 0",
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
            "slurmstepd: error: *** STEP 1693636.0 ON comput126 CANCELLED AT "
            "2020-12-24T12:40:17 ***",
            "srun: error: comput126: tasks 0-35: Killed",
        ],
    )
    assert "slurm.cancelled" not in failed.rule_ids
    assert failed.action is not Action.WAIT
    for banner in (
        "slurmstepd: error: *** JOB 551289 ON gpu01 CANCELLED AT 2025-03-13T09:41:02 ***",
        "slurmstepd: error: *** JOB 551289 ON gpu01 CANCELLED AT 2026-09-25T02:29:47 DUE to "
        "SIGNAL Killed ***",
    ):
        cancelled = diagnose(tmp_path, [banner])
        assert (cancelled.rule_ids[0], cancelled.action) == ("slurm.cancelled", Action.WAIT)


def test_a_ray_node_stopped_on_purpose_is_not_drained(tmp_path: Path) -> None:
    died = "ray.exceptions.ActorDiedError: The actor died because its node has died. Node Id: 8f3c"
    expected = diagnose(
        tmp_path, [died, "\tthe actor's node was terminated expectedly: received SIGTERM"]
    )
    assert (expected.rule_ids[0], expected.action) == (
        "ray.node_terminated_expectedly",
        Action.RESTART,
    )
    assert expected.culprit_nodes == []
    lost = diagnose(
        tmp_path,
        [
            died,
            "\tthe actor's node was terminated unexpectedly: health check failed due to "
            "missing too many heartbeats",
        ],
    )
    assert lost.action is Action.DRAIN_AND_RESTART


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: CUDA error: cudaErrorDevicesUnavailable",
        "jax.errors.JaxRuntimeError: INTERNAL: CUDA_ERROR_DEVICE_UNAVAILABLE",
    ],
)
def test_cuda_error_46_is_a_busy_gpu_not_a_lost_one(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids[0] == "cuda.device_busy"
    assert diagnosis.action is not Action.DRAIN_AND_RESTART


def test_xid_154_drains_only_when_the_gpu_needs_an_action(tmp_path: Path) -> None:
    xid = "Mar 12 11:01:22 gpu03 kernel: NVRM: Xid (PCI:0000:9a:00): 154, GPU recovery action "
    needs = diagnose(tmp_path, [xid + "changed from 0x0 (None) to 0x1 (GPU Reset Required)"])
    assert (needs.rule_ids[0], needs.action) == (
        "kernel.gpu_reset_required",
        Action.DRAIN_AND_RESTART,
    )
    recovered = diagnose(tmp_path, [xid + "changed from 0x1 (GPU Reset Required) to 0x0 (None)"])
    assert recovered.action is not Action.DRAIN_AND_RESTART
    assert recovered.culprit_nodes == []
