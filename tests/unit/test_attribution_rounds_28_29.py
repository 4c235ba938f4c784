"""Rounds 28 and 29 (other LLM frameworks, training outside language models, GPU node
faults on Kubernetes stacks, elastic launchers; Chinese-ecosystem and vision-language
repositories, MLPerf logs, open pretraining projects), and the documented words written
before their cases arrived: PaddlePaddle's launchers and signal handler, the Kubernetes
device plugin's Xid health check, the NVIDIA container runtime's refusals, Ray Train's
summary, an exception PyTorch re-raises from a DataLoader worker, a C program's CUDA
error line.

Lines quoted from a tune case name it; the others follow the tools' own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        (
            "LAUNCH ERROR 2023-05-10 12:00:00,000 ABORT!!! Out of all 4 trainers, the trainer "
            "process with rank=[2] was aborted. Please check its log.",
            2,
        ),
        (
            "Container rank 6 status failed cmd ['/usr/bin/python', '-u', 'train.py'] code 1 "
            "log log/default.fxemxd.6.log",
            6,
        ),
    ],
)
def test_paddles_launchers_name_the_trainer_that_failed(
    tmp_path: Path, line: str, rank: int
) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["torchelastic.child_failed"]
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [rank]


def test_paddles_launcher_names_no_one_when_several_trainers_died(tmp_path: Path) -> None:
    line = (
        "LAUNCH ERROR 2023-05-10 12:00:00,000 ABORT!!! Out of all 8 trainers, the trainer "
        "process with rank=[2,3] was aborted. Please check its log."
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["torchelastic.child_failed"]
    assert diagnosis.culprit_ranks == []


def test_the_trainers_own_error_decides_over_paddles_launcher(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "MemoryError: (ResourceExhausted) Out of memory error on GPU 0. Cannot allocate "
            "1.0GB memory on GPU 0, 79.1GB memory has been allocated and available memory is "
            "only 10.0MB.",
            "LAUNCH INFO 2022-07-21 11:58:59,451 Pod failed",
            "LAUNCH ERROR 2022-07-21 11:58:59,452 Container failed !!!",
            "Container rank 0 status failed cmd ['/usr/bin/python', '-u', 'train.py'] code 1 "
            "log log/workerlog.0",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.STOP)


@pytest.mark.parametrize(
    ("signal", "rule", "category"),
    [
        ("Segmentation fault", "proc.segfault", Category.CUDA_SOFTWARE),
        ("Erroneous arithmetic operation", "proc.native_crash", Category.CUDA_SOFTWARE),
        ("Bus error", "proc.bus_error", Category.DATA_LOADER),
        ("Process abort signal", "proc.abort", Category.UNKNOWN),
    ],
)
def test_paddles_signal_handler_names_the_signal(
    tmp_path: Path, signal: str, rule: str, category: Category
) -> None:
    diagnosis = diagnose(tmp_path, [f"FatalError: `{signal}` is detected by the operating system."])
    assert diagnosis.rule_ids == [rule]
    assert diagnosis.category == category


def test_paddles_termination_signal_is_a_teardown_not_the_programs_exception(
    tmp_path: Path,
) -> None:
    # SIGTERM is what a launcher or Slurm sends the survivors; it is not a Python
    # exception of the program's (python.exception_other read the class name before).
    diagnosis = diagnose(
        tmp_path, ["FatalError: `Termination signal` is detected by the operating system."]
    )
    assert diagnosis.category == Category.UNKNOWN
    assert "python.exception_other" not in diagnosis.rule_ids


def test_ray_trains_summary_is_not_the_programs_exception(tmp_path: Path) -> None:
    # tune/g-355.log: the summary asks to read the errors before it.
    diagnosis = diagnose(
        tmp_path,
        [
            "ray.train.base_trainer.TrainingFailedError: The Ray Train run failed. Please "
            "inspect the previous error messages for a cause."
        ],
    )
    assert diagnosis.category == Category.UNKNOWN
    assert diagnosis.action == Action.ESCALATE


@pytest.mark.parametrize(
    ("xid", "category"),
    [(79, Category.GPU_HARDWARE), (48, Category.GPU_MEMORY_ECC)],
)
def test_the_kubernetes_device_plugins_xid_health_check(
    tmp_path: Path, xid: int, category: Category
) -> None:
    line = (
        f"I0312 10:01:22.118000 1 health.go:120] XidCriticalError: Xid={xid} on "
        "Device=GPU-1a2b3c4d-0000-1111-2222-333344445555; marking device as unhealthy."
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == [f"kernel.xid_{xid}"]
    assert (diagnosis.category, diagnosis.action) == (category, Action.DRAIN_AND_RESTART)


def test_an_xid_number_without_its_word_is_not_read(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ["step 79 | loss 2.31 | Xidx=79"])
    assert diagnosis.category == Category.UNKNOWN
    assert diagnosis.rule_ids == []


def test_the_container_runtimes_driver_mismatch(tmp_path: Path) -> None:
    line = (
        "nvidia-container-cli: initialization error: nvml error: driver/library version "
        "mismatch: unknown"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["cuda.driver_mismatch"]
    assert diagnosis.action == Action.ESCALATE


def test_the_container_runtime_finding_no_driver_is_the_nodes(tmp_path: Path) -> None:
    line = (
        "stderr: Auto-detected mode as 'legacy' nvidia-container-cli: initialization error: "
        "nvml error: driver not loaded: unknown"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["cuda.no_device"]
    assert diagnosis.category == Category.GPU_HARDWARE


def test_paddles_data_reader_failing_is_the_data_loaders_restarted_once(tmp_path: Path) -> None:
    # tune/g-710.log: the queue is killed and the reader's own exception is not shown.
    diagnosis = diagnose(
        tmp_path,
        [
            "ERROR:root:DataLoader reader thread raised an exception!",
            "SystemError: (Fatal) Blocking queue is killed because the data reader raises an "
            "exception.",
            "  [Hint: Expected killed_ != true, but received killed_:1 == true:1.] (at "
            "/paddle/paddle/fluid/operators/reader/blocking_queue.h:166)",
        ],
    )
    assert diagnosis.rule_ids[0] == "dataloader.reader_raised"
    assert (diagnosis.category, diagnosis.action) == (Category.DATA_LOADER, Action.RESTART)


def test_the_readers_own_exception_decides_over_paddles_queue(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "KeyError: 'gt_bbox'",
            "SystemError: (Fatal) Blocking queue is killed because the data reader raises an "
            "exception.",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)


def test_ucx_probing_an_infiniband_device_it_was_not_given_is_not_a_missing_file(
    tmp_path: Path,
) -> None:
    # benign/g-728.log: HugeCTR starts on in a container without the HCA.
    line = (
        "[1609317489.343426] [ec5422b27eec:26444:0]          ib_md.c:1580 UCX  ERROR "
        "ibv_open_device(mlx5_0) failed: No such file or directory"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert "storage.file_not_found" not in diagnosis.rule_ids
    assert diagnosis.category == Category.UNKNOWN


def test_no_room_in_dev_shm_is_ncclss_transport_failing(tmp_path: Path) -> None:
    # tune/g-720.log (and g-680): read as NCCL's failure; a person looks where.
    line = (
        "LXC:71145:71167 [0] include/shm.h:48 NCCL WARN Error while creating shared memory "
        "segment nccl-shm-recv-37615efd7c719251-0-1-0 (size 9637888)"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["nccl.shm_segment_failed"]
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.ESCALATE)


def _caught_in_worker(exception: str, message: str, prefix: str = "") -> list[str]:
    return [
        f"{prefix}{exception}: Caught {exception} in DataLoader worker process 0.",
        f"{prefix}Original Traceback (most recent call last):",
        f'{prefix}  File "/work/dataset.py", line 40, in __getitem__',
        f"{prefix}{exception}: {message}",
    ]


@pytest.mark.parametrize(
    ("exception", "message"),
    [
        ("KeyError", "'image'"),
        ("FileNotFoundError", "[Errno 2] No such file or directory: '/data/img/000197.jpg'"),
        ("IndexError", "list index out of range"),
    ],
)
def test_an_exception_in_a_dataloader_worker_is_the_datas_and_stops(
    tmp_path: Path, exception: str, message: str
) -> None:
    diagnosis = diagnose(tmp_path, _caught_in_worker(exception, message))
    assert diagnosis.rule_ids[0] == "dataloader.worker_exception"
    assert (diagnosis.category, diagnosis.action) == (Category.DATA_LOADER, Action.STOP)


def test_a_dataloader_workers_exception_names_the_rank(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, _caught_in_worker("ValueError", "bad label 7", "[rank3]: "))
    assert diagnosis.culprit_ranks == [3]


def test_a_worker_error_that_a_rule_knows_decides(tmp_path: Path) -> None:
    lines = _caught_in_worker("OSError", "image file is truncated (5 bytes not processed)")
    assert diagnose(tmp_path, lines).rule_ids[0] == "dataloader.unreadable_sample"


@pytest.mark.parametrize(
    ("exception", "message"),
    [
        ("OSError", "[Errno 110] Connection timed out"),
        ("huggingface_hub.errors.HfHubHTTPError", "429 Client Error: Too Many Requests for url"),
        ("RuntimeError", "object store returned HTTP 503 Slow Down for shard-00042.tar"),
    ],
)
def test_a_worker_error_that_may_pass_on_a_retry_does_not_stop(
    tmp_path: Path, exception: str, message: str
) -> None:
    # Review 24: a worker streaming from a hub, a file system or an object store.
    lines = _caught_in_worker(exception, message)
    lines[0] = f"{exception}: Caught {exception.rsplit('.', 1)[-1]} in DataLoader worker process 0."
    diagnosis = diagnose(tmp_path, lines)
    assert "dataloader.worker_exception" not in diagnosis.rule_ids
    assert diagnosis.action is not Action.STOP


def test_a_streaming_datasets_own_error_decides_in_a_worker(tmp_path: Path) -> None:
    lines = _caught_in_worker("ValueError", "Reused local directory: ['/nvme/c4'] vs ['/nvme/c4']")
    assert diagnose(tmp_path, lines).rule_ids[0] == "dataloader.streaming_cache_conflict"


def test_a_worker_streaming_its_data_over_a_lost_connection_is_not_the_datas(
    tmp_path: Path,
) -> None:
    line = (
        "requests.exceptions.ConnectionError: Caught ConnectionError in DataLoader worker "
        "process 1."
    )
    diagnosis = diagnose(tmp_path, [line])
    assert "dataloader.worker_exception" not in diagnosis.rule_ids
    assert diagnosis.action is not Action.STOP


def test_the_cuda_runtimes_error_string_alone_under_a_c_programs_header(tmp_path: Path) -> None:
    # llm.c's error macro prints cudaGetErrorString() on the line after its header.
    diagnosis = diagnose(tmp_path, ["[CUDA ERROR] at file train_gpt2.cu:1041:", "out of memory"])
    assert diagnosis.rule_ids == ["oom.gpu_runtime"]
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.ESCALATE)


def test_a_failed_c_assert_is_a_native_check_and_the_program_is_not_a_host(
    tmp_path: Path,
) -> None:
    # tune/g-775.log: glibc's message starts with the program's name, not a node's.
    line = (
        "train_gpt2cu: llmc/dataloader.h:186: void dataloader_init(DataLoader*, const char*, "
        "size_t, size_t, int, int, int): Assertion `shard_ntok >= (int64_t) (num_processes * "
        "B * T + 1)' failed."
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["proc.native_check_failed"]
    assert diagnosis.action == Action.ESCALATE
    assert diagnosis.culprit_nodes == []


def test_a_host_prefix_still_names_its_node(tmp_path: Path) -> None:
    line = "gpu03: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert diagnose(tmp_path, [line]).culprit_nodes == ["gpu03"]


def test_glogs_header_with_the_year_is_read(tmp_path: Path) -> None:
    line = (
        "F20221031 10:52:42.193126 106986 shape_tree.cc:54] Check failed: "
        "result->children_start_id >= 0 (-1 vs. 0)"
    )
    assert diagnose(tmp_path, [line]).rule_ids == ["proc.native_check_failed"]


def test_an_mpi_call_before_mpi_init_is_the_programs_and_stops(tmp_path: Path) -> None:
    # tune/g-783.log
    lines = [
        "*** The MPI_Barrier() function was called before MPI_INIT was invoked.",
        "*** This is disallowed by the MPI standard.",
        "*** Your MPI job will now abort.",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids == ["mpi.called_outside_init"]
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)


def test_an_mpi_call_after_finalize_is_teardown_noise_not_the_cause(tmp_path: Path) -> None:
    # Review 24: a crashed program tears down out of order and prints it after its error.
    lines = [
        "[E ProcessGroupNCCL.cpp:458] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800100 "
        "milliseconds before timing out.",
        "*** The MPI_Comm_free() function was called after MPI_FINALIZE was invoked.",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert "mpi.called_outside_init" not in diagnosis.rule_ids
    assert diagnosis.action is Action.RESTART


def test_a_launchers_label_in_front_of_the_cuda_runtimes_error_string(tmp_path: Path) -> None:
    lines = ["0: [CUDA ERROR] at file train_gpt2.cu:1041:", "0: out of memory"]
    assert diagnose(tmp_path, lines).rule_ids == ["oom.gpu_runtime"]


def test_gdb_frames_of_cpp_functions_with_their_signatures(tmp_path: Path) -> None:
    line = (
        "#4  0x00007f67471b31e1 in ncclTransportP2pSetup(ncclComm*, ncclTopoGraph*, int, "
        "int*) () from /usr/lib/x86_64-linux-gnu/libnccl.so.2"
    )
    assert diagnose(tmp_path, [line]).rule_ids == ["hang.stack_dump_in_collective"]


def test_a_crash_handlers_bracketed_host_keeps_its_underscore(tmp_path: Path) -> None:
    line = (
        "[gpu_node01:12345:0] Caught signal 11 (Segmentation fault: address not mapped to "
        "object at address 0x8)"
    )
    assert diagnose(tmp_path, [line]).culprit_nodes == ["gpu_node01"]


def test_a_streaming_datasets_reused_directory_wrapped_after_vs(tmp_path: Path) -> None:
    # tune/g-779.log
    lines = [
        "ValueError: Reused local directory: ['/raid/mpt/my-copy-c4/train_small'] vs",
        "['/raid/mpt/my-copy-c4/train_small']. Provide a different one.",
    ]
    assert diagnose(tmp_path, lines).rule_ids[0] == "dataloader.streaming_cache_conflict"


# Round 30's sweep, written before its cases (hangs, processes killed, the program's
# own errors) arrived.


def test_glooss_monitored_barrier_on_the_other_ranks_names_no_one(tmp_path: Path) -> None:
    # Rank 0 runs the barrier; it stops answering when it failed over another rank
    # (review 24), so the line blames no one.
    line = (
        "[E ProcessGroupGloo.cpp:138] Rank 1 successfully reached monitoredBarrier, but "
        "received errors while waiting for send/recv from rank 0. Please check rank 0 logs "
        "for faulty rank."
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["torch.monitored_barrier_failed"]
    assert diagnosis.culprit_ranks == []
    other = "RuntimeError: Rank 3 failed to pass monitoredBarrier in 1800000 ms"
    assert diagnose(tmp_path, [other, line]).culprit_ranks == [3]


def test_a_launchers_child_killed_by_sigkill_in_numbers(tmp_path: Path) -> None:
    line = (
        "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' returned "
        "non-zero exit status -9."
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids[0] == "proc.sigkill"
    assert diagnosis.category == Category.OOM_HOST


def test_rays_actor_dead_because_its_worker_died(tmp_path: Path) -> None:
    line = (
        "The actor is dead because its worker process has died. Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error "
        "code 2. End of file."
    )
    assert diagnose(tmp_path, [line]).rule_ids == ["ray.worker_died"]


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: Expected to mark a variable ready only once. This error is caused by "
        "one of the following reasons: 1) Use of a module parameter outside the `forward` "
        "function.",
        "RuntimeError: one of the variables needed for gradient computation has been modified "
        "by an inplace operation: [torch.cuda.FloatTensor [1024]] is at version 3; expected "
        "version 2 instead.",
        "deepspeed.runtime.config.DeepSpeedConfigError: Check batch related parameters. "
        "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * "
        "world_size 16 != 2 * 1 * 4",
    ],
)
def test_the_models_and_configs_own_errors_stop(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)


def test_a_horovod_stall_warning_alone_is_not_a_failure(tmp_path: Path) -> None:
    # benign/g-808.log: rank 0 lagged for a minute and the fine-tune ran to the end.
    lines = [
        "[1,0]<stderr>:[2021-11-20 04:52:04.885367: W horovod/common/stall_inspector.cc:105] "
        "One or more tensors were submitted to be reduced, gathered or broadcasted by subset "
        "of ranks and are waiting for remainder of ranks for more than 60 seconds.",
        "[1,0]<stderr>:Stalled ranks:",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)


def test_a_horovod_stall_supports_the_failure_found_elsewhere(tmp_path: Path) -> None:
    lines = [
        "WARNING: One or more tensors were submitted to be reduced, gathered or broadcasted by "
        "subset of ranks and are waiting for remainder of ranks for more than 60 seconds.",
        "HorovodAllreduce_grads_0 [missing ranks: 3]",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == "cuda.illegal_address"
    assert "horovod.stalled_ranks" in diagnosis.rule_ids


def test_kubernetes_oomkilled_in_a_platforms_own_words(tmp_path: Path) -> None:
    # tune/g-819.log: OpenPAI quotes the pod's termination reason in lower case.
    line = 'Pod failed: PodPattern matched: containers: - name: app reason: OOMKilled message: "'
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.STOP)


def test_gdb_attached_to_a_rank_stuck_in_the_cuda_runtime_is_a_hang(tmp_path: Path) -> None:
    # tune/g-811.log: the one rank not waiting in cudaDeviceSynchronize.
    lines = [
        "#0  0x000014cd955ebdbc in ?? () from /lib64/libcuda.so.1",
        "#1  0x000014cd953608b6 in ?? () from /lib64/libcuda.so.1",
        "#14 0x000014cdd8a6cf36 in cudaMemcpyAsync () from "
        "/g/data/z00/yxs900/installation/cuda/11.3.0/lib64/libcudart.so.11.0",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids == ["hang.stack_dump_in_collective"]
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)


def test_a_crashs_backtrace_in_nccl_is_the_crash(tmp_path: Path) -> None:
    lines = [
        'Thread 1 "python" received signal SIGSEGV, Segmentation fault.',
        "#0  0x00007f67471b224b in ?? () from /lib/x86_64-linux-gnu/libnccl.so.2",
    ]
    assert diagnose(tmp_path, lines).rule_ids[0] == "proc.segfault"


def test_ncclss_socket_of_a_family_the_interface_lacks_is_set_up(tmp_path: Path) -> None:
    # tune/g-850.log
    line = (
        "[1,4]<stdout>:gpu7:4105:4372 [0] include/socket.h:318 NCCL WARN Net : Socket "
        "creation failed : Address family not supported by protocol"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["nccl.socket_connect_failed"]
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.ESCALATE)


def test_a_distributed_checkpoint_without_its_metadata_is_the_checkpoints(
    tmp_path: Path,
) -> None:
    # tune/g-870.log
    lines = [
        "Traceback (most recent call last): (RANK 0)",
        '  File ".../torch/distributed/checkpoint/filesystem.py", line 511, in read_metadata',
        '    with (self.path / ".metadata").open("rb") as metadata_file:',
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'completed-model/checkpoint-600/pytorch_model_0/.metadata'",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.CHECKPOINT, Action.STOP)
