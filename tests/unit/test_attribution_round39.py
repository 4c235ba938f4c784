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
