"""Tuning rounds 17 and 18 on tests/corpus/real/tune: ROCm's memory access fault, the
fabric manager's failed service, a GPU failing NVIDIA's diagnostic, a launcher refused
by SSH, and the base `Exception` class; then memory exhaustion in the words of Slurm,
Kubernetes, Python's subprocess, ROCm and TensorFlow, and launch and start-up failures
in the words of the shell, srun, nvidia-smi, c10d and torch.compile, NCCL's own set-up
and proxy warnings, nodes, containers and links failing in the words of Slurm, Ray,
the kubelet and mlx5, requests Slurm refuses and job scripts bash cannot run; then
round 19's InfiniBand flush and timeout(1)'s exit status.

Each line of the first part is published text from the tune case named beside it; the
second part's lines follow the tools' own message formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category

# tune/g-439.log: gpt-neox on LUMI's AMD GPUs; every agent reports the fault.
ROCM_FAULT = [
    "GPU core dump failed",
    "Memory access fault by GPU node-9 (Agent handle: 0x7d5f990) on address 0x14a1cfe01000. "
    "Reason: Unknown.",
    "Memory access fault by GPU node-6 (Agent handle: 0x7d5b060) on address 0x14c2c7e01000. "
    "Reason: Unknown.",
]

# tune/g-428.log: `systemctl status` of a P5 node whose training deadlocked.
FABRIC_MANAGER_FAILED = [
    "● nvidia-fabricmanager.service - NVIDIA fabric manager service",
    "     Active: failed (Result: exit-code) since Mon 2024-07-01 14:43:57 UTC; 5s ago",
    "    Process: 444114 ExecStart=/usr/bin/nv-fabricmanager -c "
    "/usr/share/nvidia/nvswitch/fabricmanager.cfg (code=exited, status=1/FAILURE)",
]
FABRIC_MANAGER_RUNNING = [
    "● nvidia-fabricmanager.service - NVIDIA fabric manager service",
    "     Active: active (running) since Mon 2024-07-01 14:43:57 UTC; 5s ago",
    "    Process: 444114 ExecStart=/usr/bin/nv-fabricmanager -c "
    "/usr/share/nvidia/nvswitch/fabricmanager.cfg (code=exited, status=0/SUCCESS)",
]

# tune/g-430.log: nvvs on a DGX-1 after training runs hung.
DIAGNOSTIC = [
    "\t\tMemory GPU5 ....................................... PASS",
    "\t\tMemory GPU6 ....................................... FAIL",
    "\t\t   *** Unable to create CUDA context",
    "\t\t   *** Memory test initialization failed.",
    "\t\tMemory GPU7 ....................................... PASS",
]

# tune/g-438.log: DeepSpeed's pdsh runner in containers without the workers' key.
SSH_REFUSED = [
    "172.17.0.2: Permission denied, please try again.",
    "172.17.0.2: mchorse@172.17.0.2: Permission denied (publickey,password).",
    "pdsh@6dca91c32bfd: 172.17.0.2: ssh exited with exit code 255",
]

# A torchrun worker raising the base class, as Python and torchrun print it (the tune
# case this came from was left out: its stored copy had lost its indentation).
BASE_EXCEPTION = [
    '  File "./trainer.py", line 110, in train',
    '    raise Exception("test exception")',
    "Exception: test exception",
    "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 "
    "(pid: 16651) of binary: /usr/bin/python",
]


def test_rocm_memory_access_fault_is_an_illegal_access(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ROCM_FAULT)
    assert (diagnosis.category, diagnosis.action) == (Category.CUDA_SOFTWARE, Action.ESCALATE)
    assert diagnosis.rule_ids[0] == "cuda.illegal_address"


def test_a_failed_fabric_manager_service_is_the_fabric(tmp_path: Path) -> None:
    assert diagnose(tmp_path, FABRIC_MANAGER_FAILED).category is Category.NVLINK_FABRIC
    running = diagnose(tmp_path, FABRIC_MANAGER_RUNNING)
    assert running.category is Category.UNKNOWN and not running.rule_ids


def test_a_gpu_failing_the_diagnostic_is_hardware(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, DIAGNOSTIC)
    assert diagnosis.category is Category.GPU_HARDWARE
    assert diagnosis.rule_ids == ["kernel.gpu_diagnostic_failed"]  # the PASS lines say nothing
    assert diagnose(tmp_path, [DIAGNOSTIC[0], DIAGNOSTIC[4]]).rule_ids == []


def test_a_launcher_refused_by_ssh_is_for_a_person(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, SSH_REFUSED)
    # The key missing everywhere (the set-up) or one node's login broken (that node):
    # the text does not say which, so a person looks; nothing ran there to restart.
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.ESCALATE)
    assert diagnosis.rule_ids[0] == "launch.ssh_denied"
    # A program's own permission error is not the launcher's login.
    other = diagnose(tmp_path, ["PermissionError: [Errno 13] Permission denied: '/ckpt/step_1'"])
    assert "launch.ssh_denied" not in other.rule_ids


def test_a_jobs_own_refused_git_login_does_not_decide(tmp_path: Path) -> None:
    # A best-effort `git pull` refused by a code host, then a transient GPU error: the
    # error decides (review: the refusal used to turn this restart into a stop).
    lines = [
        "git@github.com: Permission denied (publickey).",
        "RuntimeError: CUDA error: unknown error",
    ]
    alone = diagnose(tmp_path, lines[1:])
    both = diagnose(tmp_path, lines)
    assert "launch.ssh_denied" not in both.rule_ids
    assert (both.category, both.action) == (alone.category, alone.action)


def test_the_base_exception_class_names_the_program(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, BASE_EXCEPTION)
    assert diagnosis.category is Category.USER_CODE
    assert diagnosis.action is Action.ESCALATE  # the class says nothing: a person looks
    assert diagnosis.rule_ids[0] == "python.exception_other"
    # A program logging one it handled is not one it died of (review).
    timeout = (
        "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600010 milliseconds before timing out."
    )
    logged = diagnose(tmp_path, ["WARNING: Exception: connection reset, retrying", timeout])
    assert "python.exception_other" not in logged.rule_ids
    assert logged.action is Action.RESTART


def test_rocm_faults_of_the_hardware_are_not_a_programs_bad_access(tmp_path: Path) -> None:
    line = (
        "Memory access fault by GPU node-3 (Agent handle: 0x55d1a0) on address (nil). "
        "Reason: SRAM ECC failure (ie registers, no fault address)."
    )
    assert "cuda.illegal_address" not in diagnose(tmp_path, [line]).rule_ids
    imprecise = (
        "Memory access fault by GPU node-4 (Agent handle: 0x55d1a0) on address "
        "0x7f3a00000000(may not be exact address). Reason: Page not present or supervisor "
        "privilege."
    )
    assert diagnose(tmp_path, [imprecise]).rule_ids == ["cuda.illegal_address"]


# Memory exhaustion in the words of the tools that report it (their documented or source
# formats, not corpus lines): which memory ran out decides between stop on the host's
# memory and stop on the GPU's, and a warning is not a kill.
MEMORY_EXHAUSTION = [
    # Slurm's jobacct_gather enforcement (OverMemoryKill), "%ps exceeded memory limit".
    (
        "slurmstepd: error: StepId=4242.0 exceeded memory limit (8589934592 > 8388608000), "
        "being killed",
        Category.OOM_HOST,
        "oom.host_slurm",
    ),
    (
        "Some of your processes may have been killed by the cgroup out-of-memory handler.",
        Category.OOM_HOST,
        "oom.host_slurm",
    ),
    ("      Reason:       OOMKilled", Category.OOM_HOST, "oom.host_container"),
    (
        "subprocess.CalledProcessError: Command '['python', 'train.py']' died with "
        "<Signals.SIGKILL: 9>.",
        Category.OOM_HOST,
        "proc.sigkill",
    ),
    (
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB.",
        Category.OOM_GPU,
        "oom.gpu_torch",
    ),
    (
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
        "tensor with shape[32,64,224,224] and type float on "
        "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        Category.OOM_GPU,
        "oom.gpu_torch",
    ),
]


@pytest.mark.parametrize(
    "line",
    [
        "java.lang.OutOfMemoryError: Java heap space",  # the JVM's heap, not a GPU
        "slurmstepd: Exceeded step memory limit at some point.",  # a warning (benign g-061)
        "OOM when allocating tensor with shape[1024] and type float on "
        "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
    ],
)
def test_other_memory_is_not_the_gpus(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.category is not Category.OOM_GPU
    assert "oom.host_slurm" not in diagnosis.rule_ids


# Launch and start-up failures in the tools' own message formats.
@pytest.mark.parametrize(
    ("line", "category", "action", "rule"),
    [
        (
            "/var/spool/slurmd/job4242/slurm_script: line 12: python3: command not found",
            Category.USER_CODE,
            Action.STOP,
            "launch.program_not_runnable",
        ),
        (
            "/bin/sh: 1: torchrun: not found",
            Category.USER_CODE,
            Action.STOP,
            "launch.program_not_runnable",
        ),
        (
            "slurmstepd: error: execve(): train.py: Permission denied",
            Category.USER_CODE,
            Action.STOP,
            "launch.program_not_runnable",
        ),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
            "sure that the latest NVIDIA driver is installed and running.",
            Category.GPU_HARDWARE,
            Action.RESTART,  # excluding the node, when the line says which (none here)
            "cuda.no_device",
        ),
        (
            "RuntimeError: Timed out initializing process group in store based barrier on rank: "
            "3, for key: store_based_barrier_key:1 (world_size=8, worker_count=4, "
            "timeout=0:30:00)",
            Category.NETWORK_NCCL,
            Action.ESCALATE,
            "torch.store_timeout",
        ),
        (
            "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
            Category.USER_CODE,
            Action.ESCALATE,
            "python.exception_other",
        ),
    ],
)
def test_launch_and_start_up_failures_in_the_tools_words(
    tmp_path: Path, line: str, category: Category, action: Action, rule: str
) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action, diagnosis.rule_ids[0]) == (
        category,
        action,
        rule,
    )


def test_srun_names_the_node_whose_slurmd_timed_out(tmp_path: Path) -> None:
    line = (
        "srun: error: slurm_receive_msgs: [[gpu-03]:6818] failed: Socket timed out on "
        "send/recv operation"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["slurm.node_unreachable"]
    assert diagnosis.culprit_nodes == ["gpu-03"]


@pytest.mark.parametrize(
    "line",
    ["bash: module: command not found", "which: no nvidia-smi in (/usr/bin:/bin)"],
)
def test_a_missing_helper_command_is_not_the_program(tmp_path: Path, line: str) -> None:
    assert "launch.program_not_runnable" not in diagnose(tmp_path, [line]).rule_ids


# NCCL's own warnings (init.cc, shm.h, proxy.cc): a launch mapping two ranks to one GPU
# is set-up that a restart repeats; no room in /dev/shm is a small container or a node
# that earlier jobs filled; the proxy failing a peer is what survivors print after
# someone else's failure.
NCCL_SET_UP_AND_PROXY = [
    (
        "gpu01:1234:1234 [0] init.cc:763 NCCL WARN Duplicate GPU detected : rank 1 and "
        "rank 0 both on CUDA device 1a000",
        Category.USER_CODE,
        Action.STOP,
    ),
    (
        "gpu01:1234:1234 [0] include/shm.h:48 NCCL WARN Error while creating shared memory "
        "segment /dev/shm/nccl-KkM0Gc (size 9637888)",
        Category.NETWORK_NCCL,  # NCCL's transport fails (round 28: tune g-680, g-720)
        Action.ESCALATE,  # a small container's /dev/shm, or one earlier jobs filled
    ),
    (
        "gpu01:1234:5678 [0] proxy.cc:1495 NCCL WARN [Proxy Service] Failed to execute "
        "operation Connect from rank 3, retcode 3",
        Category.NETWORK_NCCL,
        Action.RESTART,
    ),
]


def test_a_proxy_failure_yields_to_the_error_that_caused_it(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "gpu01:1234:5678 [0] proxy.cc:1523 NCCL WARN [Service thread] Error encountered "
            "progressing operation=Connect, res=3, closing connection",
        ],
    )
    assert diagnosis.category is Category.OOM_GPU


# Nodes and containers failing, in Slurm's, Ray's and the kubelet's words.
NODES_AND_CONTAINERS = [
    (
        "slurmstepd: error: *** STEP 123.0 STEPD TERMINATED ON gpu-03 AT "
        "2024-01-01T00:00:00 DUE TO JOB NOT ENDING WITH SIGNALS ***",
        Category.NODE_DOWN,
        "slurm.kill_task_failed",
    ),
    (
        "ray.exceptions.ActorDiedError: The actor died because its node has died. Node Id: 8f3c",
        Category.NODE_DOWN,
        "ray.node_died",
    ),
    (
        "ray.exceptions.NodeDiedError: Task failed due to the node dying.",
        Category.NODE_DOWN,
        "ray.node_died",
    ),
    ("Error: Job failed: Container was OOMKilled", Category.OOM_HOST, "oom.host_container"),
    (
        "  Warning  Evicted    2m    kubelet  The node was low on resource: memory.",
        Category.OOM_HOST,
        "oom.host_evicted",
    ),
]


@pytest.mark.parametrize(("line", "category", "rule"), MEMORY_EXHAUSTION + NODES_AND_CONTAINERS)
def test_failures_in_the_reporting_tools_words(
    tmp_path: Path, line: str, category: Category, rule: str
) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.rule_ids[0]) == (category, rule)


def test_an_unkillable_step_names_its_node(tmp_path: Path) -> None:
    line = (
        "slurmstepd: error: *** JOB 123 STEPD TERMINATED ON gpu-03 AT 2024-01-01T00:00:00 "
        "DUE TO JOB NOT ENDING WITH SIGNALS ***"
    )
    assert diagnose(tmp_path, [line]).culprit_nodes == ["gpu-03"]


@pytest.mark.parametrize(
    "line",
    ["OSError: [Errno 24] Too many open files", "RuntimeError: received 0 items of ancdata"],
)
def test_running_out_of_open_files_is_the_data_loaders(tmp_path: Path, line: str) -> None:
    # tune/g-245.log: DataLoader workers sharing tensors by file descriptor, 4 GPUs.
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (Category.DATA_LOADER, Action.STOP)


# Requests Slurm can never grant as asked, and job scripts bash cannot run, in their words.
@pytest.mark.parametrize(
    ("line", "rule"),
    [
        (
            "srun: error: Unable to allocate resources: Invalid account or account/partition "
            "combination specified",
            "slurm.request_refused",
        ),
        (
            "sbatch: error: Batch job submission failed: Invalid generic resource (gres) "
            "specification",
            "slurm.request_refused",
        ),
        (
            "srun: error: Unable to create step for job 1234: More processors requested than "
            "permitted",
            "slurm.request_refused",
        ),
        (
            "/var/spool/slurmd/job4242/slurm_script: line 14: syntax error near unexpected "
            "token `('",
            "launch.job_script_error",
        ),
    ],
)
def test_requests_and_scripts_that_cannot_run_stop(tmp_path: Path, line: str, rule: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action, diagnosis.rule_ids[0]) == (
        Category.USER_CODE,
        Action.STOP,
        rule,
    )


@pytest.mark.parametrize(
    "line",
    [
        "srun: error: Unable to create step for job 1234: Job/step already completing or completed",
        "srun: error: Unable to allocate resources: Socket timed out on send/recv operation",
    ],
)
def test_refusals_that_can_pass_later_do_not_stop(tmp_path: Path, line: str) -> None:
    assert "slurm.request_refused" not in diagnose(tmp_path, [line]).rule_ids


def test_a_jit_build_for_an_unknown_gpu_is_the_toolkit(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ["nvcc fatal   : Unsupported gpu architecture 'compute_90'"])
    assert (diagnosis.category, diagnosis.rule_ids[0]) == (
        Category.CUDA_SOFTWARE,
        "cuda.no_kernel_image",
    )


@pytest.mark.parametrize(
    "flushed",
    [
        # tune/g-480.log, as PyTorch reprints NCCL's last error...
        "NET/IB : Got completion from peer 10.42.0.2<47534> with error 5, opcode 48, "
        "len 32764, vendor err 244",
        # ...as NCCL's own WARN line prints it (review: the WARN prefix made it an IB set-up
        # failure naming the node)...
        "node-1:178:1027 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from "
        "peer 10.42.0.2<47534> with error 5, opcode 48, len 32764, vendor err 244 (Recv)",
        # ...and in newer NCCL's words.
        "gpu03:881:990 [1] NCCL WARN NET/IB : Got completion from peer 10.12.0.17<44913> with "
        "status=IBV_WC_WR_FLUSH_ERR(5) opcode=IBV_WC_RECV(128) reqSize=0 vendor_err=249",
    ],
)
def test_flushed_ib_requests_are_the_aftermath_not_the_cause(tmp_path: Path, flushed: str) -> None:
    # Status 5 is IBV_WC_WR_FLUSH_ERR: requests flushed after the queue pair had failed;
    # the cause is elsewhere, so restart once.
    diagnosis = diagnose(tmp_path, [flushed])
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)
    assert diagnosis.rule_ids == ["nccl.ib_flushed"]
    retry_exceeded = flushed.replace("error 5,", "error 12,").replace("(5)", "(12)")
    assert diagnose(tmp_path, [retry_exceeded]).rule_ids == ["nccl.ib_completion_error"]


def test_exit_status_124_is_the_job_scripts_timeout(tmp_path: Path) -> None:
    # tune/g-478.log: GNU timeout's status for the command it stopped.
    line = (
        "failed (exitcode: 124) local_rank: 0 (pid: 94384) of binary: "
        "/home/beomseok/anaconda3/envs/vila/bin/python3.10"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.RESTART)


PATHS_AND_TOOLKITS = [
    # EACCES on the job's own path: its rights are the same at every requeue.
    (
        "PermissionError: [Errno 13] Permission denied: '/checkpoints/run1'",
        Category.USER_CODE,
        Action.STOP,
    ),
    # EROFS: a read-only mount by design or a file system that remounted itself.
    (
        "OSError: [Errno 30] Read-only file system: '/checkpoints/step_100'",
        Category.STORAGE_IO,
        Action.ESCALATE,
    ),
    # DeepSpeed's op builder against a toolkit torch was not built with.
    (
        "deepspeed.ops.op_builder.builder.CUDAMismatchException: >- DeepSpeed Op Builder: "
        "Installed CUDA version 12.4 does not match the version torch was compiled with "
        "12.1, unable to compile cuda/cpp extensions without a matching cuda version.",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
    ),
]


@pytest.mark.parametrize(("line", "category", "action"), NCCL_SET_UP_AND_PROXY + PATHS_AND_TOOLKITS)
def test_set_up_paths_and_toolkits_in_the_tools_words(
    tmp_path: Path, line: str, category: Category, action: Action
) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (category, action)


@pytest.mark.parametrize(
    "line",
    [
        "/var/spool/slurmd/job4242/slurm_script: line 7: NUM_GPUS: unbound variable",
        "EnvironmentNameNotFound: Could not find conda environment: llm",
    ],
)
def test_an_incomplete_environment_is_for_a_person(tmp_path: Path, line: str) -> None:
    # Likely the job's end, not surely: the script may go on without the variable or
    # the environment.
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.ESCALATE)


def test_a_kubelet_eviction_restarts_and_a_container_oom_kill_stops(tmp_path: Path) -> None:
    evicted = diagnose(
        tmp_path, ["  Warning  Evicted  kubelet  The node was low on resource: memory."]
    )
    assert evicted.action is Action.RESTART  # the node's other pods, not the job alone
    killed = diagnose(tmp_path, ["      Reason:       OOMKilled"])
    assert killed.action is Action.STOP  # its own memory limit, the same next time


# Lines healthy jobs print (review): none of them may decide the verdict of a failure
# whose cause is elsewhere, least of all turn a restart into a stop.
_TRANSIENT = "RuntimeError: CUDA error: unknown error"
_CASCADE = (
    "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600010 milliseconds before timing out."
)


@pytest.mark.parametrize(
    "healthy",
    [
        "Installed CUDA version 12.2 does not match the version torch was compiled with 12.1 "
        "but since the APIs are compatible, accepting this combination",
        "ERROR: Could not install packages due to an OSError: [Errno 13] Permission denied: "
        "'/usr/lib/python3/dist-packages/six.py'",
        "wandb: ERROR Error while calling W&B API: [Errno 24] Too many open files",
        'kube_pod_container_status_last_terminated_reason{reason="OOMKilled"} 0',
        "mlx5_core 0000:1a:00.0: Port module event: module 0, Cable unplugged",
        "mount: /mnt/img: mounting /dev/loop3 as EROFS image",
    ],
)
@pytest.mark.parametrize("failure", [_TRANSIENT, _CASCADE], ids=["root", "cascade"])
def test_a_healthy_jobs_line_does_not_decide(tmp_path: Path, healthy: str, failure: str) -> None:
    alone = diagnose(tmp_path, [failure])
    both = diagnose(tmp_path, [healthy, failure])
    if (both.category, both.action) != (alone.category, alone.action):
        # An exception class named in a healthy line may still ask a person (the generic
        # exception rule, beside a cascade); it never stops, drains or excludes.
        assert both.action is Action.ESCALATE and both.rule_ids[0] == "python.exception_other"


def test_a_helper_missing_its_interpreter_yields_to_the_jobs_error(tmp_path: Path) -> None:
    lines = [
        "/var/spool/slurmd/job4242/slurm_script: line 3: python: command not found",
        "OSError: [Errno 5] Input/output error",
    ]
    assert diagnose(tmp_path, lines).rule_ids[0] != "launch.program_not_runnable"


def test_a_slurmd_timeout_yields_to_the_jobs_own_error(tmp_path: Path) -> None:
    # srun may time out on a node's slurmd while the job runs on (review): the job's own
    # error decides, and no innocent node is excluded for it.
    lines = [
        "srun: error: slurm_receive_msgs: [[gpu-03]:6818] failed: Socket timed out on "
        "send/recv operation",
        "ValueError: Input sequence length 8192 exceeds max_position_embeddings 4096",
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.action is Action.STOP and diagnosis.culprit_nodes == []
