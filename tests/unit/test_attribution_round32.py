"""Rounds 32 to 35 (session of 2026-12-03): decisions that the tune split's misses, a
benign case and review 25 asked for.

Lines quoted from a tune case name it; the others follow the tools' own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category


@pytest.mark.parametrize(
    "line",
    [
        "[rank1]: RuntimeError: Invalid mt19937 state",  # tune g-136
        "[rank0]: RuntimeError: FlashAttention only supports Ampere GPUs or newer.",  # g-443
        "RuntimeError: attn_softmax_inplace_forward_ not implemented on CPU",  # tune g-642
    ],
)
def test_a_programs_own_runtime_error_stops_the_chain(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["python.runtime_error_other"]
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)
    assert diagnosis.transient is False


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: cublas runtime error : resource allocation failed at "
        "/pytorch/aten/src/THC/THCGeneral.cpp:250",
        "RuntimeError: Unable to find a valid cuDNN algorithm to run convolution",
        "RuntimeError: Stop_waiting response is expected",
        "RuntimeError: Broken pipe",
        "RuntimeError: Caught an unknown exception!",
        # tune g-208: Open MPI's error class, the transport under the program.
        "RuntimeError: Runtime error: MPI_ERR_OTHER: known error not in list",
    ],
)
def test_a_runtime_error_naming_the_machine_is_for_a_person(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["python.runtime_error_environment"]
    assert diagnosis.action is Action.ESCALATE
    assert diagnosis.transient is None


def test_a_rule_that_knows_the_runtime_error_still_decides(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ["RuntimeError: Socket Timeout"])
    assert diagnosis.rule_ids == ["torch.store_timeout"]


KILLED = (
    "[2024-01-31 10:37:53,968] torch.distributed.elastic.multiprocessing.api: [ERROR] failed "
    "(exitcode: -9) local_rank: 3 (pid: 25705) of binary: /usr/bin/python"
)


def test_a_sigkill_that_cuts_the_models_loading_short_is_host_memory(tmp_path: Path) -> None:
    # The shape of tune g-075: the bar stopped at 71%, the launcher reports the kill.
    bar = "Loading checkpoint shards:  71%|███████▊   | 15/21 [01:02<00:25,  4.16s/it]"
    diagnosis = diagnose(tmp_path, [bar, KILLED])
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.STOP)
    assert diagnosis.transient is False
    assert "peak of host memory" in diagnosis.summary


def test_a_sigkill_after_the_model_loaded_stays_for_a_person(tmp_path: Path) -> None:
    # tune g-135: every shard loaded, then the kill; the bar says nothing of the phase.
    bar = "Loading checkpoint shards: 100%|██████████| 61/61 [05:45<00:00,  5.66s/it]"
    diagnosis = diagnose(tmp_path, [bar, KILLED])
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.ESCALATE)


def test_slurms_memory_limit_kill_says_where_by_the_jobs_cancel_line(tmp_path: Path) -> None:
    # The shape of tune g-387: the limit line names the job, the cancel line its node.
    diagnosis = diagnose(
        tmp_path,
        [
            "slurmstepd: error: Job 7518 exceeded memory limit (626359956 > 512000000), "
            "being killed",
            "slurmstepd: error: Exceeded job memory limit",
            "slurmstepd: error: *** JOB 7518 ON xantipa CANCELLED AT 2022-06-10T17:11:35 ***",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.STOP)
    assert diagnosis.culprit_nodes == ["xantipa"]


def test_another_jobs_cancel_line_names_no_node(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "slurmstepd: error: Job 7518 exceeded memory limit (626359956 > 512000000), "
            "being killed",
            "slurmstepd: error: *** JOB 9911 ON other01 CANCELLED AT 2022-06-10T17:11:35 ***",
        ],
    )
    assert diagnosis.culprit_nodes == []


def test_a_launcher_sent_sighup_restarts(tmp_path: Path) -> None:
    # The shape of tune g-891: mid-epoch, the agent gets signal 1 and tears the workers down.
    diagnosis = diagnose(
        tmp_path,
        [
            " 12%|█▏        | 2905/25120 [2:12:37<17:37:09,  2.86s/it]",
            "WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, "
            "shutting down workers",
            "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 2919043 "
            "closing signal SIGHUP",
        ],
    )
    assert diagnosis.rule_ids[0] == "proc.launcher_hangup"
    assert (diagnosis.action, diagnosis.transient) == (Action.RESTART, True)


def test_the_jobs_own_error_outranks_the_hangup(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "[rank0]: ValueError: Input sequence length 8192 exceeds max_position_embeddings 4096",
            "WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, "
            "shutting down workers",
        ],
    )
    assert diagnosis.action is Action.STOP


@pytest.mark.parametrize(
    "line",
    ["Killed", "/var/spool/slurmd/job9/slurm_script: line 20: 4410 Killed    python train.py"],
)
def test_the_shells_killed_is_a_sigkill(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, ["Epoch 0:   0%|          | 0/1250", line])
    assert diagnosis.rule_ids == ["proc.sigkill"]
    assert diagnosis.category is Category.OOM_HOST


def test_a_step_torn_down_by_srun_is_not_a_sigkill(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ["srun: error: gpu03: task 24: Killed"])
    assert "proc.sigkill" not in diagnosis.rule_ids


def test_tensorflows_failed_device_allocation_is_gpu_memory(tmp_path: Path) -> None:
    # tune g-944: TensorFlow's stream executor names the driver's error code.
    line = (
        "E tensorflow/stream_executor/cuda/cuda_driver.cc:806] failed to allocate 512.00M "
        "(536870912 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["oom.gpu_runtime"]
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.ESCALATE)


DS_HEADER = (
    "[2023-04-07 13:08:55,468] [INFO] [utils.py:829:see_memory_usage] Before initializing "
    "optimizer states"
)
DS_CPU = (
    "[2023-04-07 13:08:55,469] [INFO] [utils.py:838:see_memory_usage] CPU Virtual Memory:  "
    "used = 28.43 GB, percent = 22.6%"
)


def test_a_sigkill_right_below_deepspeeds_memory_report_is_host_memory(tmp_path: Path) -> None:
    # The shape of tune f-015 with the kill: ZeRO sets up the optimizer's states.
    diagnosis = diagnose(tmp_path, [DS_HEADER, DS_CPU, KILLED])
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.STOP)


def test_a_memory_report_long_before_the_kill_says_nothing_of_it(tmp_path: Path) -> None:
    steps = [f"iteration {i} | lm loss 2.31" for i in range(20)]
    diagnosis = diagnose(tmp_path, [DS_HEADER, DS_CPU, *steps, KILLED])
    assert diagnosis.action is Action.ESCALATE


def test_a_cancel_line_naming_a_node_outside_the_job_names_no_one(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "slurmstepd: error: Job 7518 exceeded memory limit (626359956 > 512000000), "
            "being killed",
            "slurmstepd: error: *** JOB 7518 ON login01 CANCELLED AT 2022-06-10T17:11:35 ***",
        ],
        nodelist=["gpu01", "gpu02"],
    )
    assert diagnosis.culprit_nodes == []


def test_a_fabric_manager_down_on_no_named_node_is_for_a_person(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ["RuntimeError: CUDA error: system not yet initialized"])
    assert diagnosis.category is Category.NVLINK_FABRIC
    assert diagnosis.action is Action.ESCALATE


def test_a_fabric_manager_down_on_a_named_node_drains_it(tmp_path: Path) -> None:
    line = "gpu07:2211:2211 [0] NCCL WARN Cuda failure 802 'system not yet initialized'"
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.action is Action.DRAIN_AND_RESTART
    assert diagnosis.culprit_nodes == ["gpu07"]


REM_ALLOCATOR = [
    "696b7901f904:39:298 [0] include/socket.h:423 NCCL WARN Net : Connection closed by remote "
    "peer 10.0.0.4<52638>",
    "696b7901f904:39:298 [0] bootstrap.cc:279 NCCL WARN [Rem Allocator] Allocation failed "
    "(segment 0, fd 130)",
    "696b7901f904:39:298 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'",
]


def test_nccls_remote_allocation_thread_raises_no_failure(tmp_path: Path) -> None:
    # The shape of benign g-981: the service thread's warnings, and training goes on.
    diagnosis = diagnose(tmp_path, [*REM_ALLOCATOR, "Train Epoch: 1 [0/246000 (0%)]"])
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)


def test_another_thread_of_the_same_process_still_fails_the_job(tmp_path: Path) -> None:
    own = "696b7901f904:39:39 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'"
    diagnosis = diagnose(tmp_path, [*REM_ALLOCATOR, own])
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.STOP)


EXITING = (
    "[rank0]:[W724 19:26:06.079439421 ProcessGroupNCCL.cpp:1479] Warning: WARNING: "
    "destroy_process_group() was not called before program exit, which can leak resources."
)
# tune g-1017: rank 4's watchdog, stuck in the teardown after the other ranks left.
WATCHDOG_STUCK = (
    "[rank4]:[E205 18:11:06.375750231 ProcessGroupNCCL.cpp:1870] [PG ID 12 PG GUID 99("
    "EXPERT_MODEL_PARALLEL_GROUP) Rank 4] ProcessGroupNCCL's watchdog got stuck for 480 "
    "seconds without making progress in monitoring enqueued collectives."
)
STORE_LOST = (
    "[rank1]:[W724 19:26:07.130163445 TCPStore.cpp:125] [c10d] recvValue failed on "
    "SocketImpl(fd=30, addr=[::ffff:127.0.0.1]:54736, remote=[::ffff:127.0.0.1]:8738): "
    "failed to recv, got 0 bytes"
)


def test_a_finished_job_that_says_so_raises_nothing(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, [EXITING, EXITING.replace("rank0", "rank1")])
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)


def test_a_failure_before_the_exit_is_read_as_usual(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, [STORE_LOST, EXITING])
    assert diagnosis.action is not Action.STOP


def test_an_error_of_its_own_after_the_exit_still_decides(tmp_path: Path) -> None:
    ecc = "[rank1]: RuntimeError: CUDA error: uncorrectable ECC error encountered"
    diagnosis = diagnose(tmp_path, [EXITING, ecc])
    assert diagnosis.category is Category.GPU_MEMORY_ECC


@pytest.mark.parametrize(
    "line",
    [
        "ip-10-0-87-143:149:298 [5] register_mr_buffers:465 NCCL WARN NET/OFI Unable to register "
        "memory (type = 1) for device 0. RC: 12, Error: Cannot allocate memory",
        "libfabric:718892:1658904526::efa:mr:efa_mr_regattr():632<warn> Unable to register MR: "
        "Cannot allocate memory",
    ],
)
def test_efa_that_cannot_register_memory_is_the_adapters_setup(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.category is Category.INFINIBAND_NIC
    assert diagnosis.action is Action.ESCALATE


def test_a_memory_error_behind_torchruns_label_is_host_memory(tmp_path: Path) -> None:
    # tune g-1050 under torchrun's --tee label: no blank between the label and the class.
    diagnosis = diagnose(tmp_path, ["[default3]:MemoryError"])
    assert diagnosis.category is Category.OOM_HOST


# -- review 25 ------------------------------------------------------------------------


def test_a_mid_training_memory_report_is_not_the_start_up(tmp_path: Path) -> None:
    # DeepSpeed's memory breakdown during training prints the same CPU line.
    diagnosis = diagnose(tmp_path, [DS_CPU, "iteration 120 | lm loss 2.31", KILLED])
    assert diagnosis.action is Action.ESCALATE


@pytest.mark.parametrize(
    "bars",
    [
        # tqdm's updates behind carriage returns, on one line, ending at 100%.
        [
            "Loading checkpoint shards:   0%|   | 0/2 [00:00<?, ?it/s]\rLoading checkpoint "
            "shards: 100%|██| 2/2 [00:05<00:00,  2.51s/it]"
        ],
        # The bar at 50%, then at 100% on a line of its own.
        [
            "Loading checkpoint shards:  50%|█    | 1/2 [00:02<00:02,  2.51s/it]",
            "Loading checkpoint shards: 100%|██| 2/2 [00:05<00:00,  2.51s/it]",
        ],
    ],
)
def test_a_kill_after_the_model_loaded_is_not_the_loading_peak(
    tmp_path: Path, bars: list[str]
) -> None:
    diagnosis = diagnose(tmp_path, [*bars, "{'loss': 2.31, 'epoch': 0.01}", KILLED])
    assert diagnosis.action is Action.ESCALATE


def test_a_finished_run_whose_store_closes_at_shutdown_raises_nothing(tmp_path: Path) -> None:
    # PyTorch 2.4/2.5's shutdown noise: the exit warning, then a peer's 0-byte store read.
    diagnosis = diagnose(tmp_path, [EXITING, STORE_LOST])
    assert diagnosis.action is not Action.STOP


def test_a_rank_told_to_stop_is_not_a_teardown_bug(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ["[rank: 0] Received SIGTERM: 15", EXITING, WATCHDOG_STUCK])
    assert diagnosis.action is not Action.STOP


def test_a_node_lost_after_a_rank_exited_is_still_the_node(tmp_path: Path) -> None:
    lost = "ORTE has lost communication with a remote daemon."
    diagnosis = diagnose(tmp_path, [EXITING, lost])
    assert diagnosis.category is not Category.USER_CODE


def test_a_watchdog_stuck_after_ranks_exited_stops(tmp_path: Path) -> None:
    # The shape of tune g-1017: ranks leave at the end, rank 4's watchdog is stuck.
    diagnosis = diagnose(tmp_path, [EXITING, WATCHDOG_STUCK])
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)


@pytest.mark.parametrize(
    "line",
    [
        "[rank3]: RuntimeError: No route to host",
        "RuntimeError: Network is unreachable",
        "RuntimeError: Resource temporarily unavailable",
        "RuntimeError: Too many open files. Communication with the workers is no longer possible.",
        "RuntimeError: Pin memory thread exited unexpectedly",
        "RuntimeError: Bus error",
    ],
)
def test_an_operating_systems_error_in_a_runtime_error_does_not_stop(
    tmp_path: Path, line: str
) -> None:
    assert diagnose(tmp_path, [line]).action is not Action.STOP


def test_a_runtime_error_wrapping_an_unknown_exception_is_for_a_person(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "shardio.errors.ShardServiceError: shard 17 unavailable",
            "",
            "The above exception was the direct cause of the following exception:",
            "",
            "Traceback (most recent call last):",
            '  File "train.py", line 10, in <module>',
            "RuntimeError: Failed to load shard 17 after 3 attempts",
        ],
    )
    assert diagnosis.action is Action.ESCALATE


def test_a_taken_port_in_older_pytorchs_words_stops(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ["RuntimeError: Address already in use"])
    assert diagnosis.rule_ids == ["torch.store_bind_failed"]
    assert diagnosis.action is Action.STOP


def test_a_hangup_yields_to_an_unknown_exception(tmp_path: Path) -> None:
    hangup = (
        "WARNING:torch.distributed.elastic.agent.server.api:Received Signals.SIGHUP death "
        "signal, shutting down workers"
    )
    assert diagnose(tmp_path, [hangup]).rule_ids[0] == "proc.launcher_hangup"
    diagnosis = diagnose(tmp_path, ["SomeLibError: the library gave up", hangup])
    assert diagnosis.action is Action.ESCALATE


def test_a_multi_node_jobs_cancel_line_names_no_node(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "slurmstepd: error: Job 7518 exceeded memory limit (626359956 > 512000000), "
            "being killed",
            "slurmstepd: error: *** JOB 7518 ON gpu01 CANCELLED AT 2022-06-10T17:11:35 ***",
        ],
        nodelist=["gpu01", "gpu02", "gpu03", "gpu04"],
    )
    assert diagnosis.culprit_nodes == []


def test_a_long_line_of_repeated_runtime_errors_is_read_quickly() -> None:
    # Review 25: Python's re spent 66 s on this line with the rule's old lookahead. The
    # rule must now run on RE2, whose time is linear in the line.
    from trainmedic.catalog.loader import load_catalog
    from trainmedic.catalog.matcher import needs_python_re

    rule = next(r for r in load_catalog().rules if r.id == "python.runtime_error_environment")
    assert not any(needs_python_re(p.regex) for p in rule.patterns)
