"""Rounds 25 to 27 on tests/corpus/real/tune (NVIDIA's and MosaicML's stacks, JAX on
GPUs, expert-parallel communication; vision, fine-tuning, speech and diffusion repos;
PyTorch, Hugging Face, NCCL and DeepSpeed threads) and review 22: collective numbers of
different process groups, ranks that disagree on one collective, a native library's
failed CHECK, DeepEP's kernel timeouts, Composer's, Lightning's and subprocess launchers,
a streaming dataset's leftover shared memory, an error just before Slurm's time limit.

Lines quoted from a tune case name it; the others follow the tools' own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category


def _timeout(rank: int, seq: int) -> str:
    return (
        f"[E ProcessGroupNCCL.cpp:458] [Rank {rank}] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for "
        "25625613 milliseconds before timing out."
    )


def test_collective_numbers_far_apart_are_different_groups_not_out_of_step(
    tmp_path: Path,
) -> None:
    # tune/g-592.log: rank 0 and rank 7 count in groups the old lines do not name; no
    # rank is behind, and the unexplained timeout is restarted once.
    diagnosis = diagnose(tmp_path, [_timeout(0, 96117), _timeout(0, 96125), _timeout(7, 64088)])
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)
    assert "out of step" not in diagnosis.summary
    assert diagnosis.culprit_ranks == []


def test_collective_numbers_a_few_apart_are_still_out_of_step(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, [_timeout(0, 7559), _timeout(1, 7561)])
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)
    assert "out of step" in diagnosis.summary


def test_one_stray_line_of_another_group_does_not_hide_ranks_out_of_step(
    tmp_path: Path,
) -> None:
    # Review 22: two ranks at #100 and two at #98 are out of step, whatever rank 7's
    # line of another group says.
    lines = [_timeout(0, 100), _timeout(1, 100), _timeout(2, 98), _timeout(3, 98)]
    diagnosis = diagnose(tmp_path, [*lines, _timeout(7, 64088)])
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)
    assert "out of step" in diagnosis.summary


def test_one_stray_line_of_another_group_does_not_hide_a_straggler(tmp_path: Path) -> None:
    lines = [_timeout(0, 100), _timeout(1, 100), _timeout(2, 100), _timeout(3, 98)]
    diagnosis = diagnose(tmp_path, [*lines, _timeout(7, 64088)])
    assert diagnosis.culprit_ranks == [3]


# tune/g-604.log: XLA's GPU compiler aborts on its own CHECK.
XLA_CHECK = [
    "F0105 23:50:34.026692   34204 nccl_all_reduce_thunk.cc:175] Check failed: "
    "reduction_kind.has_value() ",
    "*** Check failure stack trace: ***",
    "    @     0x7f16cadf093d  absl::lts_20230802::log_internal::LogMessageFatal::"
    "~LogMessageFatal()",
]


def test_a_native_librarys_failed_check_is_for_a_person(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, XLA_CHECK)
    assert diagnosis.rule_ids[0] == "proc.native_check_failed"
    assert (diagnosis.category, diagnosis.action) == (Category.CUDA_SOFTWARE, Action.ESCALATE)


@pytest.mark.parametrize(
    "line",
    [
        # absl before its log is set up: 0000 and the seconds since the epoch.
        "F0000 00:00:1727392468.104549   12345 hlo_instruction.cc:1501] Check failed: "
        "operand_count() == 2",
        # TensorFlow's own logger, with the source's path.
        "2023-05-01 10:00:00.123456: F tensorflow/core/framework/tensor_shape.cc:45] Check "
        "failed: NDIMS == dims() (2 vs. 3)",
        # Behind Ray's and mpirun's labels.
        "(RayTrainWorker pid=4242, ip=10.0.0.7) F0105 23:50:34.026692   34204 gpu_compiler.cc:"
        "88] Check failed: ok",
        "[1,0]<stderr>:F0105 23:50:34.026692   34204 gpu_compiler.cc:88] Check failed: ok",
    ],
)
def test_a_failed_check_in_each_loggers_format(tmp_path: Path, line: str) -> None:
    assert diagnose(tmp_path, [line]).rule_ids == ["proc.native_check_failed"]


def test_a_failed_check_yields_to_a_hardware_fault_before_it(tmp_path: Path) -> None:
    xid = "[ 5403.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    diagnosis = diagnose(tmp_path, [xid, *XLA_CHECK])
    assert diagnosis.category is Category.GPU_HARDWARE


# tune/g-613.log: DeepEP's barrier on ranks 6 and 2 gave up waiting on their peers.
DEEPEP_TIMEOUTS = [
    "> DeepEP timeout check failed: rank = 6, thread = 0, value = 0)",
    "> DeepEP timeout check failed: rank = 6, thread = 5, value = 1024)",
    "> DeepEP timeout check failed: rank = 2, thread = 0, value = 0)",
]


@pytest.mark.parametrize(
    "lines",
    [
        DEEPEP_TIMEOUTS,
        # The dispatch and RDMA kernels' own words (DeepEP's csrc/kernels).
        ["DeepEP timeout for dispatch senders, rank 3, responsible_channel = 5"],
        ["DeepEP RDMA sender coordinator timeout, channel: 2, IB: 1, dst IB: 0, tail: 7"],
        # The host side's exception, when the CPU gave up on the kernels.
        ["[rank3]: RuntimeError: DeepEP error: CPU recv timeout"],
    ],
)
def test_deepeps_kernel_timeouts_are_a_hang_restarted_once(
    tmp_path: Path, lines: list[str]
) -> None:
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == "deepep.kernel_timeout"
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.RESTART)
    # The ranks that print it are the ones left waiting: none is named.
    assert diagnosis.culprit_ranks == []


def test_a_deepep_timeout_yields_to_the_error_that_stopped_a_peer(tmp_path: Path) -> None:
    error = "[rank3]: ValueError: expected the router's top-k to be at most 8"
    diagnosis = diagnose(tmp_path, [error, *DEEPEP_TIMEOUTS])
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)


def test_composers_launcher_names_the_rank_that_crashed(tmp_path: Path) -> None:
    # tune/g-603.log: the process aborted; the launcher's line is the only one naming it.
    line = "2023-07-17 22:43:51 - composer.cli.launcher - ERROR - Rank 4 crashed with exit code -6."
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["torchelastic.child_failed"]
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [4]


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        # tune/g-602.log: a killed run's shared-memory registration refuses the next run.
        (
            "[rank7]: FileExistsError: [Errno 17] File exists: '/000010_locals'",
            "dataloader.streaming_cache_conflict",
        ),
        # Any other file that exists is the program's own business.
        ("FileExistsError: [Errno 17] File exists: 'runs/exp1'", "python.exception_other"),
    ],
)
def test_a_streaming_datasets_leftover_shared_memory(tmp_path: Path, line: str, rule: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == [rule]
    assert diagnosis.action is Action.ESCALATE


@pytest.mark.parametrize(
    "healthy",
    [
        "W0105 23:50:34.026692   34204 gpu_util.cc:12] Check failed: autotuning result is stale",
        "E0105 23:50:34.026692   34204 gpu_util.cc:12] Check failed: autotuning result is stale",
        "DeepEP timeout cycles set to 200000000000",
        "DeepEP low-latency timeout: 100",
        "Set DeepEP timeout, default 100s",
        "INFO: increase the DeepEP timeout",
        "[INFO] DeepEP buffer: num_nvl_bytes=1073741824, low-latency timeout 100s",
    ],
)
def test_healthy_lines_of_these_tools_find_nothing(tmp_path: Path, healthy: str) -> None:
    assert diagnose(tmp_path, [healthy]).rule_ids == []


# tune/g-642.log: every rank raised, the job sat until Slurm's time limit.
TIME_LIMIT = (
    "slurmstepd: error: *** JOB 7031225 ON stxcompute184 CANCELLED AT 2023-04-11T16:24:13 "
    "DUE TO TIME LIMIT ***"
)
RAISED = [
    "Traceback (most recent call last):",
    '  File "train_openfold.py", line 600, in <module>',
    "ValueError: template features are missing",
]


def test_an_error_just_before_the_time_limit_decides(tmp_path: Path) -> None:
    aborted = "srun: Job step aborted: Waiting up to 32 seconds for job step to finish."
    diagnosis = diagnose(tmp_path, [*RAISED, aborted, TIME_LIMIT])
    assert diagnosis.rule_ids[0] == "python.traceback_exception"
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)
    # torchrun stopping the other workers because of it does not change that.
    closing = (
        "W0312 10:01:20.901000 4411 torch/distributed/elastic/multiprocessing/api.py:897] "
        "Sending process 4412 closing signal SIGTERM"
    )
    assert diagnose(tmp_path, [*RAISED, closing, TIME_LIMIT]).action is Action.STOP


@pytest.mark.parametrize(
    "between",
    [
        # Hours of training after the traceback: the job survived it.
        [f"step {n} | loss 2.31" for n in range(40)],
        # Raised after Slurm's SIGTERM: the time limit's doing.
        None,
    ],
    ids=["survived long before", "after the limit"],
)
def test_the_time_limit_decides_over_an_error_it_did_not_follow(
    tmp_path: Path, between: list[str] | None
) -> None:
    lines = [*RAISED, *between, TIME_LIMIT] if between else [TIME_LIMIT, *RAISED]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.SCHEDULER_PREEMPTION, Action.WAIT)


@pytest.mark.parametrize(
    "lines",
    [
        # A logged warning that names an exception, with no traceback: survived.
        [
            "step 1000 | loss 2.1",
            "WARNING: skipping sample 77: ValueError: image file is truncated",
            "step 1001 | loss 2.1",
            TIME_LIMIT,
        ],
        # The limit's SIGTERM reached a remote rank first, and its teardown traceback came
        # into the file before the batch host's cancel line.
        ["[rank: 9] Received SIGTERM: 15", *RAISED, TIME_LIMIT],
    ],
    ids=["a warning", "after SIGTERM"],
)
def test_only_an_uncaught_error_of_its_own_decides_over_the_time_limit(
    tmp_path: Path, lines: list[str]
) -> None:
    # Review 23.
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.SCHEDULER_PREEMPTION, Action.WAIT)


def test_lightnings_launcher_names_the_rank_whose_child_died(tmp_path: Path) -> None:
    # tune/g-652.log: the OOM line carries no rank; Lightning's next line does.
    lines = [
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 GiB. GPU 3 "
        "has a total capacty of 79.22 GiB of which 24.22 GiB is free.",
        "[rank: 3] Child process with PID 11479 terminated with code 1. Forcefully terminating "
        "all other processes to avoid zombies",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.STOP)
    assert diagnosis.culprit_ranks == [3]


@pytest.mark.parametrize(
    ("code", "rule"),
    [
        (-11, "proc.segfault"),
        (-9, "proc.sigkill"),
        (-7, "proc.bus_error"),
        (1, "torchelastic.child_failed"),
    ],
)
def test_lightnings_child_exit_code_says_the_signal(tmp_path: Path, code: int, rule: str) -> None:
    line = (
        f"[rank: 1] Child process with PID 2053468 terminated with code {code}. Forcefully "
        "terminating all other processes to avoid zombies"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids[0] == rule
    assert diagnosis.culprit_ranks == [1]


def test_a_ranks_own_error_is_not_blamed_on_the_rank_missing_from_the_barrier(
    tmp_path: Path,
) -> None:
    # Review 22: rank 0 raised; its monitored barrier names rank 5, which is not lent.
    lines = [
        "Traceback (most recent call last):",
        "ValueError: bad config",
        "RuntimeError: [Rank 0]: Rank 5 failed to pass monitoredBarrier in 1800000 ms",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == "python.traceback_exception"
    assert diagnosis.culprit_ranks == []


@pytest.mark.parametrize(
    ("line", "rule", "category"),
    [
        # tune/g-670.log: the CUDA runtime's own words for an allocation that failed.
        ("Error running job: CUDA error: out of memory", "oom.gpu_runtime", Category.OOM_GPU),
        # tune/g-654.log: the node could not bind the address NCCL picked for bootstrap.
        (
            "nd20-01:275975:275975 [0] misc/socket.cc:379 NCCL WARN Call to bind failed : "
            "Cannot assign requested address",
            "nccl.socket_connect_failed",
            Category.NETWORK_NCCL,
        ),
    ],
)
def test_round_26_words(tmp_path: Path, line: str, rule: str, category: Category) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids[0] == rule
    assert diagnosis.category is category


@pytest.mark.parametrize(
    ("line", "rule", "category"),
    [
        # PyTorch 2.4+ (ProcessGroupNCCL.cpp): a rank told to dump by the one whose
        # watchdog fired, and the process ending itself after the dump.
        (
            "[rank6]:[E703 21:51:54.112142364 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID "
            "0(default_pg) Rank 6] Received a dump signal due to a collective timeout from  rank "
            "7 and we will try our best to dump the debug info. Last enqueued NCCL work: 56116, "
            "last completed NCCL work: 56116.",
            "nccl.watchdog_timeout",
            Category.NETWORK_NCCL,
        ),
        (
            "[rank0]:[F725 02:47:41.268394894 ProcessGroupNCCL.cpp:1653] [PG ID 0 PG GUID "
            "0(default_pg) Rank 0] Terminating the process after attempting to dump debug info, "
            "due to collective timeout or exception.",
            "nccl.watchdog_timeout",
            Category.NETWORK_NCCL,
        ),
        (
            "[rank2]:[F1229 20:37:13.091528310 ProcessGroupNCCL.cpp:1306] [PG ID 0 PG GUID "
            "0(default_pg) Rank 2] Terminating the process after attempting to dump debug info, "
            "due to ProcessGroupNCCL watchdog hang.",
            "nccl.heartbeat_monitor",
            Category.HANG,
        ),
    ],
)
def test_pytorchs_newer_timeout_words_are_the_watchdogs_cascade(
    tmp_path: Path, line: str, rule: str, category: Category
) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == [rule]
    assert (diagnosis.category, diagnosis.action) == (category, Action.RESTART)
    # The rank that told it to dump waited too: no rank is named.
    assert diagnosis.culprit_ranks == []


CALLED_PROCESS = (
    "subprocess.CalledProcessError: Command '['/usr/bin/python', 'train.py', '--config', "
    "'a.yaml']' returned non-zero exit status 1."
)


def test_a_launchers_subprocess_error_is_a_summary_not_a_cause(tmp_path: Path) -> None:
    # accelerate launch and wrapper scripts raise it when the training script failed.
    alone = diagnose(tmp_path, [CALLED_PROCESS])
    assert (alone.category, alone.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert alone.rule_ids == ["torchelastic.child_failed"]
    with_cause = diagnose(tmp_path, ["KeyError: 'labels'", CALLED_PROCESS])
    assert (with_cause.category, with_cause.action) == (Category.USER_CODE, Action.STOP)


@pytest.mark.parametrize(
    "line",
    [
        # tune/g-295.log: the runner's password-less login check to the first host failed.
        "subprocess.CalledProcessError: Command 'ssh -o PasswordAuthentication=no "
        "192.168.3.100 hostname' returned non-zero exit status 255.",
        # Review 23: newer DeepSpeed's list form, and --ssh_port.
        "subprocess.CalledProcessError: Command '['ssh', '-o', 'PasswordAuthentication=no', "
        "'worker-1', 'hostname']' returned non-zero exit status 255.",
        "subprocess.CalledProcessError: Command 'ssh -o PasswordAuthentication=no -p 2222 "
        "worker-1 hostname' returned non-zero exit status 255.",
    ],
)
def test_deepspeeds_login_check_is_the_ssh_set_up(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["launch.ssh_denied"]
    assert diagnosis.category is Category.USER_CODE


def _work(rank: int, seq: int, op: str, numel: int, pg: str = "") -> str:
    return (
        f"[rank{rank}]:[E616 13:41:10.909476913 ProcessGroupNCCL.cpp:565] {pg}[Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
        f"NumelIn={numel}, NumelOut={numel * 2}, Timeout(ms)=1800000) ran for 1800083 "
        "milliseconds before timing out."
    )


def test_ranks_in_different_operations_at_one_collective_stop(tmp_path: Path) -> None:
    # tune/g-675.log: rank 0 is in a REDUCE where the others all-gather, at one number.
    lines = [
        _work(1, 3742816, "_ALLGATHER_BASE", 4096),
        _work(0, 3742816, "REDUCE", 4096),
        _work(5, 3742816, "_ALLGATHER_BASE", 4096),
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.STOP)
    assert "disagree on collective #3742816" in diagnosis.summary
    assert diagnosis.culprit_ranks == [0]  # the one that took the other path


def test_ranks_gathering_different_sizes_at_one_collective_stop(tmp_path: Path) -> None:
    # tune/g-674.log: two ranks, one all-gather number, two sizes: no majority to name.
    lines = [_work(1, 2109, "_ALLGATHER_BASE", 262711296), _work(0, 2109, "_ALLGATHER_BASE", 40960)]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.STOP)
    assert "262711296" in diagnosis.summary
    assert diagnosis.culprit_ranks == []


@pytest.mark.parametrize(
    "lines",
    [
        # The same collective on every rank: a timeout with no cause in sight.
        [_work(0, 500, "ALLREDUCE", 1024), _work(1, 500, "ALLREDUCE", 1024)],
        # All-to-all's sizes differ by design.
        [_work(0, 500, "ALLTOALL_BASE", 1024), _work(1, 500, "ALLTOALL_BASE", 4096)],
        # Point-to-point operations count in a counter of their own.
        [_work(0, 500, "SEND", 1024), _work(1, 500, "ALLREDUCE", 1024)],
        # Two process groups that happen to be at the same number.
        [
            _work(0, 500, "ALLREDUCE", 1024, "[PG ID 1 PG GUID 1 Rank 0] "),
            _work(1, 500, "_REDUCE_SCATTER_BASE", 1024, "[PG ID 2 PG GUID 2 Rank 1] "),
        ],
        # Review 23: data-parallel groups of two pipeline stages, told apart by their GUID
        # (their "PG ID" is each process's own counter).
        [
            _work(0, 1201, "_REDUCE_SCATTER_BASE", 412090368, "[PG ID 2 PG GUID 5(DP) Rank 0] "),
            _work(1, 1201, "_REDUCE_SCATTER_BASE", 412090368, "[PG ID 2 PG GUID 5(DP) Rank 1] "),
            _work(2, 1201, "_REDUCE_SCATTER_BASE", 301989888, "[PG ID 2 PG GUID 6(DP) Rank 0] "),
            _work(3, 1201, "_REDUCE_SCATTER_BASE", 301989888, "[PG ID 2 PG GUID 6(DP) Rank 1] "),
        ],
        # Old lines without a group, at start-up where every group's counter is low.
        [_work(0, 2, "ALLREDUCE", 1024), _work(1, 2, "BROADCAST", 1024)],
    ],
    ids=["agree", "all-to-all", "point-to-point", "two groups", "two GUIDs", "start-up"],
)
def test_collectives_that_may_differ_are_not_a_disagreement(
    tmp_path: Path, lines: list[str]
) -> None:
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.action is not Action.STOP
    assert "disagree" not in diagnosis.summary


def test_ncclss_settings_that_leave_no_algorithm_are_for_a_person(tmp_path: Path) -> None:
    # tune/g-691.log: NCCL_ALGO forced CollNet on a fabric without it; NCCL's warning
    # comes before the internal error PyTorch raises for it.
    lines = [
        "201: :41367:41367 [1] enqueue.cc:422 NCCL WARN Error : no algorithm/protocol available",
        "201: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:911, internal error, NCCL "
        "version 2.12.7",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == "nccl.no_algorithm"
    # The job's settings, or a node where SHARP or NVLS did not come up (review 23).
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.ESCALATE)


@pytest.mark.parametrize(
    "line",
    [
        # tune/g-680.log: older NCCL names the segment without its directory.
        "simple-layoutlm-mmml-1573-investigate-how-to-implement-d-lcbz2t:97:183 [0] "
        "include/shm.h:48 NCCL WARN Error while creating shared memory segment "
        "nccl-shm-recv-c43b846667d22574-1-1-0 (size 9637888)",
        # Newer NCCL reserves the space first (a plain 'No space left' would stop the job).
        "gpu01:97:183 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space "
        "left on device",
    ],
)
def test_ncclss_shared_memory_that_does_not_fit_is_for_a_person(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["nccl.shm_segment_failed"]
    assert diagnosis.action is Action.ESCALATE
    assert len(diagnosis.culprit_nodes) == 1  # where it happened, told to the person


def test_a_programs_own_subprocess_failing_is_its_error(tmp_path: Path) -> None:
    # Review 23: a copy the program runs failed; it fails again on every restart, so it
    # is not a launcher's summary that the collective timeouts around it outrank.
    lines = [
        "[rank0]: subprocess.CalledProcessError: Command '['cp', '-r', 'ckpt', '/nfs/ckpt']' "
        "returned non-zero exit status 1.",
        _work(1, 3412, "ALLREDUCE", 1024),
        _work(2, 3412, "ALLREDUCE", 1024),
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == "python.exception_other"
    assert diagnosis.category is Category.USER_CODE
    assert diagnosis.culprit_ranks == [0]


@pytest.mark.parametrize(
    "lines",
    [
        # Review 23: a GPU that a leftover process holds, or pinned memory: not the model's
        # size, and not PyTorch's allocator.
        [
            "[rank5]:     torch.cuda.set_device(local_rank)",
            "[rank5]: RuntimeError: CUDA error: out of memory",
        ],
        [
            "RuntimeError: Caught RuntimeError in pin memory thread for device 0.",
            "RuntimeError: CUDA error: out of memory",
        ],
    ],
)
def test_the_cuda_runtimes_out_of_memory_is_for_a_person(tmp_path: Path, lines: list[str]) -> None:
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.ESCALATE)


def _dumped(rank: int, enqueued: int, completed: int) -> str:
    return (
        f"[rank{rank}]:[E703 21:51:54.112142364 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID "
        f"0(default_pg) Rank {rank}] Received a dump signal due to a collective timeout from  "
        f"rank 7 and we will try our best to dump the debug info. Last enqueued NCCL work: "
        f"{enqueued}, last completed NCCL work: {completed}."
    )


def test_a_rank_that_never_called_the_collective_the_others_wait_in_is_named(
    tmp_path: Path,
) -> None:
    # Review 23: rank 7 timed out in #56117; ranks 4 and 5 wait in it too (enqueued, not
    # completed); rank 6 completed everything up to #56116 and never called #56117.
    timeout = _work(7, 56117, "ALLREDUCE", 1024, "[PG ID 0 PG GUID 0(default_pg) Rank 7] ")
    lines = [timeout, _dumped(4, 56117, 56116), _dumped(5, 56118, 56116), _dumped(6, 56116, 56116)]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)
    assert diagnosis.culprit_ranks == [6]


def test_open_mpis_error_before_a_communicator_exists_is_a_failed_init(tmp_path: Path) -> None:
    # tune/g-493.log: DeepSpeed found an MPI environment, and MPI_Init_thread failed.
    lines = ["*** An error occurred in MPI_Init_thread", "*** on a NULL communicator"]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids == ["mpi.init_failed"]
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.ESCALATE)
