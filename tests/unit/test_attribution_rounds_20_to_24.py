"""Rounds 20 to 24 on tests/corpus/real/tune, and failures in the words of the tools that
print them: MPI launchers and Horovod, JAX across hosts, DeepSpeed's launcher, CUDA,
checkpoints and data, object stores, Kubernetes, Slurm's daemons, DCGM, nvidia-smi and
the mlx5 driver, ROCm and amdgpu; and names that only look like hosts.

Lines quoted from a tune case name it; the others follow the tools' own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category

# tune/g-076.log: py-spy of a GRPO trainer's GPU 0, parked in vLLM's all-reduce.
VLLM_DUMP = [
    "    __call__ (torch/_ops.py:1209)",
    "    all_reduce (vllm/distributed/device_communicators/symm_mem.py:148)",
    "    all_reduce (vllm/distributed/device_communicators/cuda_communicator.py:201)",
    "    _all_reduce_out_place (vllm/distributed/parallel_state.py:514)",
]


def test_a_dump_inside_a_librarys_collective_is_a_hang(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, VLLM_DUMP)
    assert diagnosis.category is Category.HANG
    assert diagnosis.rule_ids[0] == "hang.stack_dump_in_collective"


@pytest.mark.parametrize(
    "frame",
    [
        # A profile of a healthy step: frames of other modules named like collectives.
        "    broadcast_tensors (torch/functional.py:77)",
        "    wait (threading.py:324)",
        "    recv (multiprocessing/connection.py:250)",
        "    all_reduce_metrics (myproject/common/metrics.py:41)",
    ],
)
def test_frames_outside_a_communication_layer_are_not_a_hang(tmp_path: Path, frame: str) -> None:
    assert diagnose(tmp_path, [frame]).rule_ids == []


def test_cudas_older_wording_for_a_busy_gpu(tmp_path: Path) -> None:
    # tune/g-123.log: a stray process held the allocated GPU (CUDA 9 era PyTorch).
    line = (
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCTensorRandom.cu line=25 error=46 : "
        "all CUDA-capable devices are busy or unavailable"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids[0] == "cuda.device_busy"
    # No node is named, so there is none to keep away from: a plain restart.
    assert (diagnosis.category, diagnosis.action) == (Category.GPU_HARDWARE, Action.RESTART)


@pytest.mark.parametrize(
    "line",
    [
        "python3: can't open file '/home/u/train.py': [Errno 2] No such file or directory",
        "urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='cdn-lfs.huggingface.co',"
        " port=443): Read timed out.",
        # A package with a digit that no list names: the exception's own name tells.
        "mylib2.errors.ShardError: shard 00042 is missing",
    ],
)
def test_programs_packages_and_exceptions_are_not_hosts(tmp_path: Path, line: str) -> None:
    assert diagnose(tmp_path, line.split("\n")).culprit_nodes == []


def test_a_host_prefix_still_names_its_host(tmp_path: Path) -> None:
    line = "gpu03.cluster: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert diagnose(tmp_path, [line]).culprit_nodes == ["gpu03"]


# MPI launchers and Horovod: tune cases where there are any, otherwise the launchers'
# help texts (Open MPI's help-errmgr-base.txt, help-orterun.txt, help-mpi-api.txt;
# MPICH's MPIR_Abort; Horovod's common.h).

# tune/g-487.log: mpirun's rsh agent pointed at a port the worker refuses.
DAEMONS_NOT_STARTED = [
    "ssh: connect to host 192.168.11.1 port 50000: Connection refused",
    "",
    "ORTE was unable to reliably start one or more daemons.",
]

# tune/g-486.log: hvd.init() in a container whose host name does not resolve.
MPI_INIT_FAILED = [
    "Fatal error in PMPI_Init_thread: Other MPI error, error stack:",
    "MPIR_Init_thread(474)..............: ",
    "MPID_Init(190).....................: channel initialization failed",
]

DAEMON_LOST = [
    "ORTE has lost communication with a remote daemon.",
    "",
    "  HNP daemon   : [[16919,0],0] on node gpu-031",
    "  Remote daemon: [[16919,0],3] on node gpu-127",
]

PEER_GONE = [
    "An MPI communication peer process has unexpectedly disconnected.  This",
    "usually indicates a failure in the peer process (e.g., a crash or",
    "otherwise exiting without calling MPI_FINALIZE first).",
]

HOROVOD_SHUT_DOWN = (
    "RuntimeError: Horovod has been shut down. This was caused by an exception on one of the "
    "ranks or an attempt to allreduce, allgather or broadcast a tensor after one of the ranks "
    "finished execution. If the shutdown was caused by an exception, you should see the "
    "exception in the log before the first shutdown message."
)

CUDA_OOM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total "
    "capacity; 12.10 GiB already allocated; 1.50 GiB free)"
)


def test_a_lost_daemon_alone_restarts_once(tmp_path: Path) -> None:
    # mpirun reports the loss, not its cause (a node gone, a wrong interface, or the
    # tear-down after the program's own error): no node is kept out on its word.
    diagnosis = diagnose(tmp_path, DAEMON_LOST)
    assert (diagnosis.category, diagnosis.action) == (Category.NODE_DOWN, Action.RESTART)
    assert diagnosis.culprit_nodes == []


@pytest.mark.parametrize(
    ("before", "category", "action"),
    [
        (
            [
                "Traceback (most recent call last):",
                '  File "train.py", line 3, in <module>',
                "KeyError: 'labels'",
            ],
            Category.USER_CODE,
            Action.STOP,
        ),
        (
            ["RuntimeError: CUDA error: device-side assert triggered"],
            Category.USER_CODE,
            Action.STOP,
        ),
        (
            ["slurmstepd: error: *** JOB 551289 ON gpu07 CANCELLED AT 2025-03-12T10:02:11 ***"],
            Category.SCHEDULER_PREEMPTION,
            Action.WAIT,
        ),
    ],
    ids=["own error", "device assert", "cancelled"],
)
@pytest.mark.parametrize(
    "after",
    [
        DAEMON_LOST,
        [
            "E0312 coordination_service.cc:956] UNAVAILABLE: Task /job:jax_worker/replica:0/"
            "task:5 heartbeat timeout. This indicates that the remote task has failed, got "
            "preempted, or crashed unexpectedly."
        ],
        # The EFA handshake a dead peer no longer answers.
        [
            "algo-2:123:456 [3] NCCL WARN NET/OFI Request 0x7f1c2a0 completed with error. RC: "
            "103. Error: 4126 (Unresponsive receiver (reachable by EFA device but handshake "
            "failed)"
        ],
        # A GPU queue stuck on a collective whose peer died, and its reset.
        [
            "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled "
            "seq=1, emitted seq=3",
            "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
        ],
    ],
    ids=["mpirun lost a daemon", "jax heartbeat", "efa request failed", "amdgpu ring timeout"],
)
def test_what_the_survivors_report_yields_to_a_cause(
    tmp_path: Path, before: list[str], category: Category, action: Action, after: list[str]
) -> None:
    diagnosis = diagnose(tmp_path, [*before, *after])
    assert (diagnosis.category, diagnosis.action) == (category, action)
    assert diagnosis.culprit_nodes == []


def test_a_launch_failure_yields_to_the_jobs_own_error(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, [CUDA_OOM, *DAEMONS_NOT_STARTED])
    assert diagnosis.category is Category.OOM_GPU


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        ("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD", 3),
        ("application called MPI_Abort(MPI_COMM_WORLD, 1) - process 5", 5),
    ],
)
def test_an_mpi_abort_names_the_rank_and_asks(tmp_path: Path, line: str, rank: int) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [rank]


def test_an_mpi_abort_yields_to_the_error_before_it(tmp_path: Path) -> None:
    lines = [CUDA_OOM, "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD"]
    assert diagnose(tmp_path, lines).category is Category.OOM_GPU


def test_a_peer_that_went_away_restarts_once_unless_its_error_is_here(tmp_path: Path) -> None:
    alone = diagnose(tmp_path, PEER_GONE)
    assert (alone.category, alone.action) == (Category.UNKNOWN, Action.RESTART)
    assert diagnose(tmp_path, [CUDA_OOM, *PEER_GONE]).category is Category.OOM_GPU


def test_horovods_shut_down_is_a_symptom(tmp_path: Path) -> None:
    # Horovod's own text: another rank's exception, or a rank that finished early.
    alone = diagnose(tmp_path, [HOROVOD_SHUT_DOWN])
    assert (alone.category, alone.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert alone.rule_ids == ["horovod.shut_down"]
    assert diagnose(tmp_path, [CUDA_OOM, HOROVOD_SHUT_DOWN]).category is Category.OOM_GPU


# JAX across hosts: tune cases, otherwise XLA's coordination service and client texts.

# tune/g-501.log: three Slurm tasks segfault, then the service stops hearing task 15.
SEGFAULTS_THEN_HEARTBEAT = [
    "srun: error: ip-26-0-141-178: task 15: Segmentation fault",
    "srun: error: ip-26-0-141-217: task 16: Segmentation fault",
    "2023-03-07 16:06:30.684022: E external/org_tensorflow/tensorflow/tsl/distributed_runtime/"
    "coordination/coordination_service.cc:956] /job:jax_worker/replica:0/task:15 has been set "
    "to ERROR in coordination service: UNAVAILABLE: Task /job:jax_worker/replica:0/task:15 "
    "heartbeat timeout. This indicates that the remote task has failed, got preempted, or "
    "crashed unexpectedly. [type.googleapis.com/tensorflow.CoordinationServiceError='']",
]

# tune/g-278.log: a data loader made task 1 reconnect; every process then terminates.
TASK_RECONNECTED = [
    "2025-04-05 18:39:10.837611: E external/xla/xla/tsl/distributed_runtime/coordination/"
    "coordination_service.cc:962] /job:jax_worker/replica:0/task:1 unexpectedly tried to "
    "connect with a different incarnation. It has likely restarted.",
    "E0405 18:39:10.837983     387 coordination_service_agent.cc:455] Polled an error from "
    "coordination service (this can be an error from this or another task).",
]


@pytest.mark.parametrize(
    "line",
    [
        "Task 3 heartbeat timeout. This indicates that the remote task has failed, got "
        "preempted, or crashed unexpectedly.",
        "UNAVAILABLE: Task /job:jax_worker/replica:0/task:3 heartbeat timeout. This indicates "
        "that the remote task has failed, got preempted, or crashed unexpectedly.",
    ],
)
def test_a_silent_jax_process_is_named_and_restarted(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (Category.NODE_DOWN, Action.RESTART)
    assert diagnosis.culprit_ranks == [3]


def test_the_silent_processs_own_crash_decides(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, SEGFAULTS_THEN_HEARTBEAT)
    assert diagnosis.category is Category.CUDA_SOFTWARE  # the segmentation faults
    assert diagnosis.rule_ids[0] == "proc.segfault"


def test_a_reconnected_jax_process_is_for_a_person(tmp_path: Path) -> None:
    # Not a transient by itself: in g-278 the same process reconnected on every run.
    diagnosis = diagnose(tmp_path, TASK_RECONNECTED)
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [1]


@pytest.mark.parametrize(
    "peer_line",
    [
        "Task /job:jax_worker/replica:0/task:3 heartbeat timeout. This indicates that the "
        "remote task has failed, got preempted, or crashed unexpectedly.",
        "/job:jax_worker/replica:0/task:3 unexpectedly tried to connect with a different "
        "incarnation. It has likely restarted.",
    ],
    ids=["silent", "reconnected"],
)
def test_a_lost_peers_rank_is_not_lent_to_the_error_beside_it(
    tmp_path: Path, peer_line: str
) -> None:
    # Review 20: the writer's own error, a few lines below the line naming the remote task
    # it lost, is not task 3's. A launcher's line naming the rank that failed still lends
    # its rank to the traceback above it (tune g-145).
    lines = [peer_line, "Traceback (most recent call last):", "ValueError: bad config"]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == "python.traceback_exception"
    assert diagnosis.culprit_ranks == []
    launcher = "torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 2"
    assert diagnose(tmp_path, [*lines[1:], launcher]).culprit_ranks == [2]


@pytest.mark.parametrize(
    ("code", "rule"),
    [("-9", "proc.sigkill"), ("-11", "proc.segfault")],
)
def test_deepspeeds_launcher_reports_the_signal_of_the_first_dead_worker(
    tmp_path: Path, code: str, rule: str
) -> None:
    line = (
        "[2023-11-28 10:00:34,590] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python',"
        f" '-u', 'finetune.py', '--local_rank=0'] exits with return code = {code}"
    )
    assert diagnose(tmp_path, [line]).rule_ids == [rule]


def test_an_interrupted_deepspeed_run_is_not_a_crash(tmp_path: Path) -> None:
    # -2: SIGINT, a person pressed Ctrl-C.
    line = (
        "[ERROR] [launch.py:341:sigkill_handler] ['python', 'train.py'] exits with return code = -2"
    )
    assert diagnose(tmp_path, [line]).rule_ids == []


def test_a_terminated_containers_other_exit_codes_say_nothing(tmp_path: Path) -> None:
    # 143 is SIGTERM: the kubelet or the job controller stopping the pod, not a crash.
    lines = [
        "    Last State:     Terminated",
        "      Reason:       Error",
        "      Exit Code:    143",
    ]
    assert diagnose(tmp_path, lines).rule_ids == []


def test_mpiruns_renamed_binary_still_names_the_rank_and_node(tmp_path: Path) -> None:
    # tune/g-510.log: Horovod's images wrap mpirun and rename the real one.
    line = (
        "mpirun.real noticed that process rank 1 with PID 39 on node mpi-test-2-mpijob-worker-1 "
        "exited on signal 9 (Killed)."
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids[0] == "proc.sigkill"
    assert (diagnosis.culprit_nodes, diagnosis.culprit_ranks) == (
        ["mpi-test-2-mpijob-worker-1"],
        [1],
    )


@pytest.mark.parametrize(
    "line",
    [
        # tune/g-521.log: another job's StreamingDataset holds the same local directory.
        "ValueError: Reused local directory: ['/nvmedisk/Datasets/llmfoundry/c4/train_small'] vs "
        "['/nvmedisk/Datasets/llmfoundry/c4/train_small']. Provide a different one.",
        # tune/g-528.log: LitData's chunk cache had no index yet on a two-node start.
        "ValueError: The provided dataset `/root/.lightning/chunks/<hash>/<hash>` doesn't contain "
        "any index.json file. HINT: Did you successfully optimize a dataset to the provided "
        "`input_dir`?",
    ],
)
def test_a_streaming_cache_conflict_is_for_a_person(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (Category.DATA_LOADER, Action.ESCALATE)


# Failures in the words of the tools that print them, one line or block each: the rule
# that decides, its category and action, and the nodes named (None: not checked).
# Sources: Open MPI's and MPICH's texts, XLA's coordination service and client, PyTorch,
# the CUDA runtime, the kubelet and `kubectl describe pod`, Hugging Face's Trainer and
# from_pretrained, torch.load, Pillow, botocore, the Google Cloud client, slurmctld's
# node_mgr.c, proc_req.c and job_mgr.c, slurmstepd's req.c, DCGM's dcgm_errors.h,
# nvidia-smi -q and the mlx5 driver's health.c. Lines from a tune case name it.
TOOLS_WORDS: list[tuple[list[str], str, Category, Action, list[str] | None]] = [
    # The same words follow a set-up error (tune g-487: a refused port) and a start-up
    # race (tune g-352: a worker not yet resolvable): neither a blind restart nor a stop.
    (DAEMONS_NOT_STARTED, "mpi.launch_failed", Category.USER_CODE, Action.ESCALATE, None),
    # Set-up (tune g-486: a host name that does not resolve) or one node's fabric
    # (open-mpi/ompi#10601): a person tells which.
    (MPI_INIT_FAILED, "mpi.init_failed", Category.USER_CODE, Action.ESCALATE, None),
    (
        # tune/g-277.log: a 32-node MaxText start-up that never completed registration.
        [
            "Original error: DEADLINE_EXCEEDED: Barrier timed out. Id: "
            "[Init]Wait_for_all_tasks_to_register::0. This usually happens because a task "
            "triggered the barrier too early or too slowly."
        ],
        "jax.startup_timeout",
        Category.UNKNOWN,
        Action.ESCALATE,
        None,
    ),
    (
        ["RuntimeError: distributed.initialize should only be called once."],
        "jax.initialize_misuse",
        Category.USER_CODE,
        Action.STOP,
        None,
    ),
    (
        [
            "[id=0] Termination timeout for `acquire clique for rank #0; run_id=1` of 40 "
            "seconds exceeded. Exiting to ensure a consistent program state. Expected 8 "
            "threads to join the rendezvous, but not all of them arrived on time."
        ],
        "xla.rendezvous_terminated",
        Category.HANG,
        Action.RESTART,
        None,
    ),
    (
        [
            "RuntimeError: Found no NVIDIA driver on your system. Please check that you have "
            "an NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx"
        ],
        "cuda.no_device",
        Category.GPU_HARDWARE,
        Action.RESTART,
        None,
    ),
    (
        ["RuntimeError: CUDA error: an illegal instruction was encountered"],
        "cuda.illegal_address",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
        None,
    ),
    (
        ["RuntimeError: CUDA error: hardware stack error"],
        "cuda.illegal_address",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
        None,
    ),
    (
        ["Message:        Pod was terminated in response to imminent node shutdown."],
        "kubelet.node_shutdown",
        Category.SCHEDULER_PREEMPTION,
        Action.RESTART,
        None,
    ),
    (
        ["ValueError: Can't find a valid checkpoint at /ckpt/run3/checkpoint-500"],
        "checkpoint.not_found",
        Category.CHECKPOINT,
        Action.STOP,
        None,
    ),
    (
        [
            "_pickle.UnpicklingError: Weights only load failed. This file can still be "
            "loaded, to do so you have two options, do those steps only if you trust the "
            "source of the checkpoint."
        ],
        "checkpoint.weights_only_refused",
        Category.CHECKPOINT,
        Action.STOP,
        None,
    ),
    (
        ["OSError: image file is truncated (5 bytes not processed)"],
        "dataloader.unreadable_sample",
        Category.DATA_LOADER,
        Action.STOP,
        None,
    ),
    (
        [
            "botocore.exceptions.ClientError: An error occurred (SlowDown) when calling the "
            "GetObject operation (reached max retries: 4): Please reduce your request rate."
        ],
        "storage.object_store_unavailable",
        Category.STORAGE_IO,
        Action.RESTART,
        None,
    ),
    (
        [
            "botocore.exceptions.ClientError: An error occurred (NoSuchKey) when calling the "
            "GetObject operation: The specified key does not exist."
        ],
        "storage.file_not_found",
        Category.USER_CODE,
        Action.STOP,
        None,
    ),
    (
        [
            "Message:      The node was low on resource: ephemeral-storage. Threshold "
            "quantity: 10Gi, available: 9Gi."
        ],
        "storage.evicted_local_disk",
        Category.STORAGE_IO,
        Action.ESCALATE,
        None,
    ),
    (
        ["    Last State:     Terminated", "      Reason:       Error", "      Exit Code:    139"],
        "proc.segfault",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
        None,
    ),
    (
        [
            "    Last State:     Terminated",
            "      Reason:       OOMKilled",
            "      Exit Code:    137",
        ],
        "oom.host_container",
        Category.OOM_HOST,
        Action.STOP,
        None,
    ),
    (
        ["slurmctld: error: Nodes gpu07 not responding, setting DOWN"],
        "slurm.node_failure",
        Category.NODE_DOWN,
        Action.DRAIN_AND_RESTART,
        ["gpu07"],
    ),
    (
        [
            "slurmstepd: error: *** JOB 551289 ON gpu07 UNCORRECTABLE MEMORY ERROR AT "
            "2025-03-12T10:02:11 ***"
        ],
        "slurm.node_memory_error",
        Category.NODE_DOWN,
        Action.DRAIN_AND_RESTART,
        ["gpu07"],
    ),
    (
        [
            "slurmctld: error: validate_node_specs: Prolog or job env setup failure on node "
            "gpu07, draining the node"
        ],
        "slurm.node_set_up_failed",
        Category.NODE_DOWN,
        Action.RESTART_EXCLUDING,
        ["gpu07"],
    ),
    (
        [
            "slurmctld: error: Setting node gpu07 state to INVAL with reason:gres/gpu count "
            "reported lower than configured (7 < 8)"
        ],
        "slurm.gpu_count_dropped",
        Category.GPU_HARDWARE,
        Action.DRAIN_AND_RESTART,
        ["gpu07"],
    ),
    (
        # Slurm requeues the job itself: wait for that run, do not submit another.
        ["slurmctld: requeue JobId=551289 due to failure of node gpu07"],
        "slurm.requeued_for_node_failure",
        Category.NODE_DOWN,
        Action.WAIT,
        [],
    ),
    (
        ["srun: error: Application launch failed: Job credential expired"],
        "slurm.credential_expired",
        Category.UNKNOWN,
        Action.RESTART,
        [],
    ),
    (
        ["gpu07: Detected 2 volatile double-bit ECC error(s) in GPU 3."],
        "dcgm.memory_fault",
        Category.GPU_MEMORY_ECC,
        Action.DRAIN_AND_RESTART,
        ["gpu07"],
    ),
    (
        ["gpu07: GPU 3 had memory errors and row remappings are pending"],
        "kernel.row_remap_pending",
        Category.GPU_MEMORY_ECC,
        Action.DRAIN_AND_RESTART,
        ["gpu07"],
    ),
    (
        ["gpu07: GPU 3's NvLink link 5 is currently down"],
        "dcgm.nvlink_fault",
        Category.NVLINK_FABRIC,
        Action.DRAIN_AND_RESTART,
        ["gpu07"],
    ),
    (
        ["    GPU Recovery Action                   : Reboot"],
        "kernel.gpu_reset_required",
        Category.GPU_HARDWARE,
        Action.DRAIN_AND_RESTART,
        [],
    ),
    (
        [
            "Dec  1 10:00:00 gpu07 kernel: mlx5_core 0000:4b:00.0: mlx5_health_try_recover:338:"
            "(pid 1234): health recovery flow aborted, PCI reads still not working"
        ],
        "kernel.mlx5_firmware_fault",
        Category.INFINIBAND_NIC,
        Action.DRAIN_AND_RESTART,
        ["gpu07"],
    ),
    (
        ["RuntimeError: HIP error: invalid device function"],
        "cuda.no_kernel_image",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
        None,
    ),
    (
        [
            "Dec  1 10:00:00 gpu07 kernel: [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring "
            "gfx_0.0.0 timeout, signaled seq=1, emitted seq=2"
        ],
        "kernel.amdgpu_ring_timeout",
        Category.HANG,
        Action.RESTART,
        [],
    ),
    (
        [
            "Dec  1 10:00:00 gpu07 kernel: amdgpu 0000:c1:00.0: amdgpu: 1 uncorrectable "
            "hardware errors detected in UMC block"
        ],
        "kernel.amdgpu_ras_uncorrectable",
        Category.GPU_MEMORY_ECC,
        Action.DRAIN_AND_RESTART,
        ["gpu07"],
    ),
    (
        # tune/g-548.log: a JAX benchmark on ROCm 6.2 whose queue the runtime aborted.
        [
            "brax.0 [stderr] :0:rocdevice.cpp            :2984: 159730272363 us: [pid:403868 "
            "tid:0x7f37b81ff640] Callback: Queue 0x7ef728200000 aborting with error : "
            "HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory "
            "beyond the largest legal address. code: 0x29"
        ],
        "cuda.illegal_address",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
        None,
    ),
    (
        # tune/g-552.log: context parallel with the math attention kernel.
        [
            "[rank0]: RuntimeError: aten.add.Tensor: got mixed torch.Tensor and DTensor, need "
            "to convert all torch.Tensor to DTensor before calling distributed operators!"
        ],
        "torch.tensor_mismatch",
        Category.USER_CODE,
        Action.STOP,
        None,
    ),
    (
        # tune/g-558.log: a fullgraph-compiled optimizer step fed changing shapes.
        [
            "torch._dynamo.exc.FailOnRecompileLimitHit: recompile_limit reached with "
            "fullgraph=True. Excessive recompilations can degrade performance due to the "
            "compilation overhead of each recompilation."
        ],
        "torch.tensor_mismatch",
        Category.USER_CODE,
        Action.STOP,
        None,
    ),
    (
        # aws-ofi-nccl's failed request: the fabric's, not a file system's I/O error.
        [
            "algo-2:123:456 [3] ofi_process_cq:1040 NCCL WARN NET/OFI Request 0x7f1c2a0 "
            "completed with error. RC: 5. Error: 5 (Input/output error). Completed length: 0, "
            "Request: { dev: 3, size: 1048576, state: CREATED, direction: SEND }"
        ],
        "nccl.ofi_completion_error",
        Category.NETWORK_NCCL,
        Action.ESCALATE,
        ["algo-2"],
    ),
    (
        # tune/g-583.log: gpt-neox's overflow monitor on a diverged fp16 run.
        ["Exception: Skipped 50 iterations in a row due to Overflow - Exiting training."],
        "python.loss_scale_underflow",
        Category.USER_CODE,
        Action.STOP,
        None,
    ),
]


@pytest.mark.parametrize(("lines", "rule", "category", "action", "nodes"), TOOLS_WORDS)
def test_failures_in_the_tools_own_words(
    tmp_path: Path,
    lines: list[str],
    rule: str,
    category: Category,
    action: Action,
    nodes: list[str] | None,
) -> None:
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == rule
    assert (diagnosis.category, diagnosis.action) == (category, action)
    if nodes is not None:
        assert diagnosis.culprit_nodes == nodes


@pytest.mark.parametrize(
    "healthy",
    [
        # Start-up progress, XLA's own retracted warning, and the launchers' benign lines.
        "Waiting for 3/16 tasks to connect.",
        "Coordination agent has successfully connected.",
        "[id=0] This thread has been waiting for `acquire clique` for 20 seconds and may be "
        "stuck. Expected 8 threads to join the rendezvous, but not all of them arrived on time.",
        "Thread is unstuck! Warning above was a false-positive. Perhaps the timeout is too short.",
        "[gpu009:2974788] Local abort after MPI_FINALIZE started completed successfully, but am "
        "not able to aggregate error messages, and not able to guarantee that all other "
        "processes were killed!",
        "  HNP daemon   : [[16919,0],0] on node gpu-031",
        # A node back, a job already ended, a warning DCGM itself only monitors, a healthy
        # field, a cable plugged in.
        "slurmctld: Node gpu07 now responding",
        "slurmctld: slurmd error running JobId=551289 from node(s)=gpu07: Job/step already "
        "completing or completed",
        "Detected nonfatal errors on NvSwitch 2 link 17",
        "    GPU Recovery Action                   : None",
        "mlx5_core 0000:4b:00.0: Port module event: module 0, Cable plugged",
        # amdgpu's RAS all-clear, and correctable errors it has already corrected.
        "amdgpu 0000:c3:00.0: amdgpu: no uncorrectable hardware errors detected in umc block",
        "amdgpu 0000:c1:00.0: amdgpu: 0 uncorrectable hardware errors detected in umc block",
    ],
)
def test_healthy_lines_of_these_tools_find_nothing(tmp_path: Path, healthy: str) -> None:
    assert diagnose(tmp_path, [healthy]).rule_ids == []


@pytest.mark.parametrize(
    ("warning", "then", "category"),
    [
        (
            # A pipeline that skips an image it cannot decode and goes on (webdataset).
            "/usr/lib/python3/site-packages/webdataset/handlers.py:34: UserWarning: "
            "OSError('image file is truncated (5 bytes not processed)')",
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, "
            "unhandled system error",
            Category.NETWORK_NCCL,
        ),
        (
            # A loader that falls back to a full load when weights_only refuses.
            "patch_torch.py:22: UserWarning: Falling back to unsafe load: Weights only load "
            "failed. This file can still be loaded",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            Category.CUDA_SOFTWARE,
        ),
        (
            # A read that was retried and passed.
            "WARNING: retrying S3 read after botocore.exceptions.ReadTimeoutError: Read "
            'timeout on endpoint URL: "https://s3/bucket/x"',
            "ValueError: shapes do not match",
            Category.USER_CODE,
        ),
    ],
    ids=["skipped image", "weights_only fallback", "retried read"],
)
def test_a_warning_about_a_handled_error_does_not_decide(
    tmp_path: Path, warning: str, then: str, category: Category
) -> None:
    alone = diagnose(tmp_path, [then])
    both = diagnose(tmp_path, [warning, then])
    assert both.category is category
    assert (both.category, both.action) == (alone.category, alone.action)


@pytest.mark.parametrize(
    ("line", "rule", "action"),
    [
        # An array job's task requeued by Slurm for a failed node: still Slurm's own run.
        (
            "slurmctld: requeue JobId=551289_3(551292) due to failure of node gpu07",
            "slurm.requeued_for_node_failure",
            Action.WAIT,
        ),
        # Several nodes at once come as a host list.
        (
            "slurmctld: error: Nodes gpu[07-08] not responding, setting DOWN",
            "slurm.node_failure",
            Action.DRAIN_AND_RESTART,
        ),
        # No GPU seen at all is configuration, a driver or NVML far more often.
        (
            "slurmctld: error: Setting node gpu07 state to INVAL with reason:gres/gpu count "
            "reported lower than configured (0 < 8)",
            "slurm.no_gpus_seen",
            Action.ESCALATE,
        ),
        # An endpoint that cannot be reached at all fails the same way every time.
        (
            "botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL: "
            '"https://s3.us-east-1.amazonaws.com/bucket"',
            "python.exception_other",
            Action.ESCALATE,
        ),
    ],
)
def test_slurm_and_store_formats_of_review_20(
    tmp_path: Path, line: str, rule: str, action: Action
) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids[0] == rule
    assert diagnosis.action is action


@pytest.mark.parametrize(
    "healthy",
    [
        # The driver's health poll before its recovery, and the routine fatal sensors: a
        # virtual function taken offline (3) and a firmware reset someone ran (4).
        "mlx5_core 0000:4b:00.0: poll_health:825:(pid 0): device's health compromised - "
        "reached miss count",
        "mlx5_core 0000:4b:00.1: poll_health:800:(pid 0): Fatal error 3 detected",
        "mlx5_core 0000:4b:00.1: poll_health:800:(pid 0): Fatal error 4 detected",
    ],
)
def test_routine_adapter_events_are_not_a_failure(tmp_path: Path, healthy: str) -> None:
    assert diagnose(tmp_path, [healthy]).rule_ids == []


def test_jax_started_twice_after_a_timeout_is_the_timeout(tmp_path: Path) -> None:
    lines = [
        "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Connect() timed out after "
        "300s with 30 attempts. Most recent failure was: UNAVAILABLE: failed to connect",
        "RuntimeError: distributed.initialize should only be called once.",
    ]
    assert diagnose(tmp_path, lines).rule_ids[0] == "jax.startup_timeout"


def test_xlas_rendezvous_timeout_of_a_large_run(tmp_path: Path) -> None:
    devices = ", ".join(str(i) for i in range(128))
    line = (
        "E0101 rendezvous.cc:127] [id=0] Termination timeout for `all reduce RendezvousKey{"
        f"run_id=7, global_devices=[{devices}], num_local_participants=8}}` of 40 seconds "
        "exceeded. Exiting to ensure a consistent program state."
    )
    assert diagnose(tmp_path, [line]).rule_ids == ["xla.rendezvous_terminated"]


def test_the_ofi_plugins_io_error_is_not_a_file_systems(tmp_path: Path) -> None:
    line = (
        "algo-2:1:2 [0] NCCL WARN NET/OFI Unable to retrieve completion queue entries. RC: -5, "
        "ERROR: Input/output error"
    )
    assert "storage.io_error" not in diagnose(tmp_path, [line]).rule_ids


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        (
            'gpu07: botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: "https://s3/x"',
            "storage.object_store_unavailable",
        ),
        (
            "0: [rank0]: OSError: image file is truncated (5 bytes not processed)",
            "dataloader.unreadable_sample",
        ),
    ],
)
def test_raised_errors_behind_launcher_labels(tmp_path: Path, line: str, rule: str) -> None:
    # pdsh's host label, srun's task label and PyTorch's rank label may stack in front.
    assert diagnose(tmp_path, [line]).rule_ids[0] == rule
