"""Tuning rounds 12 to 15 on tests/corpus/real/tune and benign: the stacks faulthandler
prints as a process dies are not a hung job's stack dump, XLA's words for a missing NCCL
library, Open MPI launched by srun without PMI, Slurm rejecting its arguments, a job
script's shell missing a file, a task hung in the file system; and,
from PyTorch's documented output, the flight recorder's and monitored barrier's reports.

Each line is published text from the tune case named beside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category

_TIMEOUT = (
    "[E ProcessGroupNCCL.cpp:828] [Rank {r}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=388923, OpType=_ALLGATHER_BASE, Timeout(ms)=1800000) ran for 1804615 "
    "milliseconds before timing out."
)
_DUMP = [
    "Thread 0x00002ac6175f7700 (most recent call first):",
    '  File "/cluster/project/sachan/kushal/math/lib64/python3.8/site-packages/torch/'
    'distributed/distributed_c10d.py", line 2532 in all_gather_into_tensor',
    '  File "/cluster/project/sachan/kushal/math/lib64/python3.8/site-packages/torch/'
    'distributed/fsdp/flat_param.py", line 987 in _all_gather_flat_param',
]
# tune/g-269.log: both ranks time out in one all-gather; the watchdog aborts the process
# and faulthandler prints where its threads were.
ABORTED_AFTER_TIMEOUT = [
    _TIMEOUT.format(r=0),
    _TIMEOUT.format(r=1),
    "terminate called after throwing an instance of 'std::runtime_error'",
    "Fatal Python error: Aborted",
    "",
    *_DUMP,
]


def test_the_stacks_of_a_dying_process_are_not_a_hang_report(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ABORTED_AFTER_TIMEOUT)
    # The timeout decides (restart once, as for any causeless timeout); the dump is kept
    # as evidence of where the ranks were.
    assert diagnosis.action is Action.RESTART
    assert diagnosis.rule_ids[0] == "nccl.watchdog_timeout"
    assert "hang.stack_dump_in_collective" in diagnosis.rule_ids


def test_a_dump_taken_of_a_live_job_is_still_a_hang(tmp_path: Path) -> None:
    # faulthandler.dump_traceback_later prints the same frames under "Timeout (0:30:00)!"
    # while the process lives on: a person looks at the hung job.
    diagnosis = diagnose(tmp_path, ["Timeout (0:30:00)!", *_DUMP])
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)


@pytest.mark.parametrize("gap", [50, 450])
def test_a_live_dump_below_an_old_crash_is_still_a_hang(tmp_path: Path, gap: int) -> None:
    # The nearest header says whose stacks these are: a live dump taken after an earlier
    # crash of some other process is a hang report.
    lines = ["Fatal Python error: Aborted", *(["step ok"] * gap), "Timeout (0:30:00)!", *_DUMP]
    assert diagnose(tmp_path, lines).category is Category.HANG


def test_every_ranks_crash_dump_is_a_symptom_however_many_ranks(tmp_path: Path) -> None:
    # 96 ranks each abort after the timeout and print their stacks: more headers than
    # findings are kept per rule, and the verdict is the same as for two ranks.
    lines: list[str] = []
    for rank in range(96):
        lines += [
            _TIMEOUT.format(r=rank),
            "terminate called after throwing an instance of 'std::runtime_error'",
            "Fatal Python error: Aborted",
            *_DUMP,
        ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.action is Action.RESTART
    assert diagnosis.rule_ids[0] == "nccl.watchdog_timeout"


def test_xla_without_its_nccl_library_is_the_installation(tmp_path: Path) -> None:
    # tune/g-271.log: after a jaxlib upgrade every all-reduce fails the same way.
    diagnosis = diagnose(
        tmp_path,
        [
            "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Failed to execute XLA Runtime "
            "executable: run time error: custom call 'xla.gpu.all_reduce' failed: ",
            "external/xla/xla/service/gpu/nccl_utils.cc:133: NCCL operation "
            "ncclGetUniqueId(&id) failed: Unable to load NCCL library. Multi-GPU collectives "
            "will not work.;      ",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.CUDA_SOFTWARE, Action.ESCALATE)
    assert diagnosis.transient is False


# The flight-recorder analyser's report, in the shape PyTorch's tutorial shows for a job
# whose rank 1 never called the all-reduce.
FLIGHT_RECORDER_MISSING = [
    "Not all ranks joining collective 5 at entry 4",
    "group info: 0:default_pg",
    "collective: nccl:all_reduce",
    "missing ranks: {1}",
    "input sizes: [[3, 4]]",
    "output sizes: [[3, 4]]",
    "expected ranks: 2",
    "collective state: scheduled",
]


def test_the_flight_recorder_names_the_ranks_that_never_joined(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, FLIGHT_RECORDER_MISSING)
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [1]


def test_a_flight_recorder_mismatch_is_the_code(tmp_path: Path) -> None:
    lines = [
        "Collective 5 at entry 4 errors",
        "collective: nccl:all_reduce",
        "error message: Culprit rank 3; Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input "
        "sizes: '[[4, 4]]' does not match found input sizes: '[[5, 4]]'.",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)
    assert diagnosis.culprit_ranks == [3]


def test_the_monitored_barrier_names_who_did_not_arrive(tmp_path: Path) -> None:
    # PyTorch's error text on rank 0 (its own rank in front, the missing one after).
    lines = [
        "RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms",
        " Original exception: ",
        "[gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:8594",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [1]


def test_open_mpi_without_slurm_pmi_is_the_launch(tmp_path: Path) -> None:
    # tune/g-344.log: an MLPerf step direct-launched by srun aborts in MPI_Init.
    lines = [
        "[compute-hpc-node-73:349052] OPAL ERROR: Unreachable in file pmix3x_client.c at line 111",
        "srun: error: compute-hpc-node-73: task 0: Exited with exit code 1",
        'The application appears to have been direct launched using "srun",',
        "but OMPI was not built with SLURM's PMI support and therefore cannot",
        "execute. There are several options for building PMI support under",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)


def test_a_job_scripts_shell_missing_a_file_is_not_a_failure(tmp_path: Path) -> None:
    # benign/g-337.log: bash peeks at /etc/dgx-release, then a 16-node run starts fine.
    lines = [
        "++ srun -N1 -n1 bash",
        "/bin/bash: line 2: /etc/dgx-release: No such file or directory",
        "+ MLPERF_HOST_OS='Ubuntu 18.04.5 LTS / ??? ???'",
    ]
    assert diagnose(tmp_path, lines).category is Category.UNKNOWN
    # The program itself not finding its file still stops the job.
    missing = ["python: can't open file '/workspace/train.py': [Errno 2] No such file or directory"]
    assert diagnose(tmp_path, missing).action is Action.STOP


# tune/g-320.log: the kernel's hung-task report for the rank-0 trainer.
HUNG_TASK = [
    "[Sat Mar  4 04:23:09 2023] INFO: task python:280058 blocked for more than 120 seconds.",
    "[Sat Mar  4 04:23:09 2023] task:python          state:D stack:    0 pid:280058 "
    "ppid:279966 flags:0x00000084",
    "[Sat Mar  4 04:23:09 2023] Call Trace:",
    "[Sat Mar  4 04:23:09 2023]  __schedule+0x2d1/0x860",
    "[Sat Mar  4 04:23:09 2023]  schedule+0x35/0xa0",
]


def test_a_task_hung_in_the_file_system_is_storage(tmp_path: Path) -> None:
    in_gpfs = [*HUNG_TASK, "[Sat Mar  4 04:23:09 2023]  cxiWaitEventWait+0x208/0x330 [mmfslinux]"]
    diagnosis = diagnose(tmp_path, in_gpfs)
    assert (diagnosis.category, diagnosis.action) == (Category.STORAGE_IO, Action.ESCALATE)
    # The same report with no file system in its trace says only that something hung.
    assert diagnose(tmp_path, HUNG_TASK).category is Category.UNKNOWN


def test_slurm_rejecting_its_own_arguments_is_the_job_script(tmp_path: Path) -> None:
    # tune/g-366.log and g-370.log: nothing ran; the next submission is the same line.
    for lines in (
        [
            "srun: error: pyxis: mount source must be a relative path, an absolute path, "
            '"tmpfs" or "umount"',
            "srun: error: Invalid --container-mounts argument: tank/bert/packed_data:"
            "/workspace/data_phase2",
        ],
        ["./run-test.sh: 4: source: not found", 'sbatch: error: "t" is not a valid node count'],
    ):
        diagnosis = diagnose(tmp_path, lines)
        assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)
