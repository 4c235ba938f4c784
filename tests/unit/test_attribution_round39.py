"""Third session of 2026-12-03: decisions that tune cases asked for once read again.

Lines quoted from a tune case name it; the others follow the tools' own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.channel.liveness import slurm_says_dead
from trainmedic.domain import Action, Category, SlurmObservation
from trainmedic.domain.slurm import SlurmNode

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


# Single lines the review found read against their source: what each now decides.
@pytest.mark.parametrize(
    ("line", "rule", "action"),
    [
        # NCCL_NET names a transport that is not up on this node: not the program's bug.
        (
            "gpu03:4242:4242 [0] misc/net.cc:732 NCCL WARN Error: network IB not found.",
            "nccl.network_not_found",
            Action.ESCALATE,
        ),
        # DeepSpeed's loss scaler giving up is the same divergence as fairseq's.
        (
            "Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
            "Exiting run.",
            "python.loss_scale_underflow",
            Action.STOP,
        ),
        # Newer NCCL's connect failures at set-up.
        (
            "gpu01:33017:34012 [0] misc/socket.cc:568 NCCL WARN socketPollConnect: exceeded "
            "retries (20)",
            "nccl.socket_connect_failed",
            Action.ESCALATE,
        ),
        # The kernel's SIGBUS for a bad DIMM: the node, not /dev/shm.
        (
            "Mar 12 11:01:22 gpu03 kernel: Memory failure: 0x3f2a5c: Sending SIGBUS to "
            "pt_data_worker:4242 due to hardware memory corruption",
            "kernel.memory_failure",
            Action.DRAIN_AND_RESTART,
        ),
        # The kernel out of cgroup ids, not a full disk (the line names no node, so the
        # restart cannot exclude one).
        (
            "slurmstepd: error: xcgroup_instantiate: unable to create cgroup "
            "'/sys/fs/cgroup/memory/slurm/uid_1201/job_551289' : No space left on device",
            "slurm.cgroup_create_failed",
            Action.RESTART,
        ),
        # An NFS server's outage, printed by every client: nobody's node is excluded.
        (
            "Mar 12 11:01:22 gpu03 kernel: nfs: server fs01 not responding, still trying",
            "storage.nfs_server_not_responding",
            Action.ESCALATE,
        ),
        # torch.distributed.checkpoint's planner on a key the checkpoint lacks.
        (
            "[rank0]: RuntimeError: Missing key in checkpoint state_dict: model.layers.0.bias.",
            "checkpoint.resume_mismatch",
            Action.STOP,
        ),
        # JAX's current wording of the same misuse.
        (
            "RuntimeError: jax.distributed.initialize() must be called before any JAX calls "
            "that might initialise the XLA backend.",
            "jax.initialize_misuse",
            Action.STOP,
        ),
        # A fatal SXid still drains.
        (
            "kernel: nvidia-nvswitch2: SXid (PCI:0000:88:00.0): 24007, Fatal, Link 31 "
            "sourcetrack TCEN0 crumbstore ECC DBE Error",
            "kernel.sxid_nvswitch",
            Action.DRAIN_AND_RESTART,
        ),
    ],
)
def test_lines_read_against_their_source(
    tmp_path: Path, line: str, rule: str, action: Action
) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert (diagnosis.rule_ids[0], diagnosis.action) == (rule, action)


@pytest.mark.parametrize(
    "line",
    [
        # Non-fatal and corrected SXids leave the fabric working.
        "kernel: nvidia-nvswitch2: SXid (PCI:0000:88:00.0): 12028, Non-fatal, Link 31 egress "
        "non-posted PRIV error (First)",
        # mlx5's fatal error opens a recovery that may well succeed.
        "mlx5_core 0000:4b:00.0: poll_health:800:(pid 0): Fatal error 1 detected",
        # Slurm's memory warnings, also printed for steps that end well.
        "slurmstepd: error: Exceeded job memory limit at some point.",
        "slurmstepd: task/cgroup: task_cgroup_memory_check_oom: StepId=551289.0 hit memory "
        "limit at least once during execution. This may or may not result in some failure.",
        # NCCL calls these adapter events non-fatal.
        "gpu02:7712:7790 [0] transport/net_ib.cc:125 NCCL WARN NET/IB : mlx5_0:1 Got async "
        "error event: port active",
        # c10d warns on each address it fails to bind; the rendezvous may go on as a client.
        "[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 "
        "(errno: 98 - Address already in use).",
    ],
)
def test_lines_that_do_not_end_a_job_by_themselves_do_not_outrank_one_that_does(
    tmp_path: Path, line: str
) -> None:
    # Next to a crash of its own, the job's real failure decides.
    segfault = "srun: error: gpu03: task 5: Segmentation fault (core dumped)"
    diagnosis = diagnose(tmp_path, [line, segfault])
    assert diagnosis.rule_ids[0] == "proc.segfault", diagnosis.rule_ids
    assert diagnosis.action is Action.ESCALATE


def test_a_power_saving_node_is_not_down(tmp_path: Path) -> None:
    lines = ["Epoch 3: 100%|██████████| 1000/1000 [10:02<00:00]"]
    for state, down in (
        ("IDLE+CLOUD+POWERED_DOWN", False),
        ("IDLE+POWERING_DOWN", False),
        ("DOWN+NOT_RESPONDING", True),
        ("IDLE*+NOT_RESPONDING", True),
    ):
        slurm = SlurmObservation(job_state="FAILED", node_states={"gpu03": state})
        diagnosis = diagnose(tmp_path, lines, nodelist=["gpu03"], slurm=slurm)
        assert (diagnosis.rule_ids[:1] == ["slurm_state.node_down"]) is down, state


def test_a_desync_report_gives_way_to_the_crash_that_made_it(tmp_path: Path) -> None:
    report = "             [7] finished collective #182, but didn't join collective #183"
    alone = diagnose(tmp_path, [report])
    assert (alone.rule_ids[0], alone.action) == ("torch.desync_report", Action.STOP)
    crashed = diagnose(
        tmp_path, ["srun: error: gpu03: task 7: Segmentation fault (core dumped)", report]
    )
    assert crashed.rule_ids[0] == "proc.segfault"


@pytest.mark.parametrize(
    "survived",
    [
        [
            "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3a>",
            "Traceback (most recent call last):",
            '  File "torch/utils/data/dataloader.py", line 1478, in __del__',
            "    self._shutdown_workers()",
            "AssertionError: can only test a child process",
        ],
        [
            "A module that was compiled using NumPy 1.x cannot be run in",
            "NumPy 2.0.0 as it may crash. To support both 1.x and 2.x",
            "versions of NumPy, modules must be compiled with NumPy 2.0.",
            "",
            "Traceback (most recent call last):",
            '  File "train.py", line 3, in <module>',
            "    import torch",
            "AttributeError: _ARRAY_API not found",
        ],
    ],
)
def test_an_exception_python_printed_and_survived_is_not_the_failure(
    tmp_path: Path, survived: list[str]
) -> None:
    alone = diagnose(tmp_path, survived)
    assert alone.category is Category.UNKNOWN and alone.action is Action.ESCALATE
    assert alone.rule_ids == []
    # The job's real failure after it decides.
    died = diagnose(
        tmp_path, [*survived, "srun: error: gpu03: task 5: Segmentation fault (core dumped)"]
    )
    assert died.rule_ids[0] == "proc.segfault"
    assert "python.traceback_exception" not in died.rule_ids
    # An uncaught exception of its own still stops the job.
    raised = diagnose(
        tmp_path,
        [*survived, "Traceback (most recent call last):", "KeyError: 'attention_mask'"],
    )
    assert (raised.rule_ids[0], raised.action) == ("python.traceback_exception", Action.STOP)


# The second review of this session's diff: each case below was a regression it found.

GPU_LOST = "RuntimeError: CUDA error: GPU is lost"
KEY_ERROR = ["Traceback (most recent call last):", "KeyError: 'attention_mask'"]
WATCHDOG = (
    "[rank1]:[E312 10:20:11.2 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=9001, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600063 milliseconds before timing out."
)


def test_a_failed_framework_requeue_does_not_hide_a_lost_gpu(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path, ["Requeuing SLURM job 4406981 failed with error code 1", GPU_LOST]
    )
    assert diagnosis.action is Action.DRAIN_AND_RESTART


def test_a_refusal_gives_way_to_slurms_own_requeue(tmp_path: Path) -> None:
    # submitit says "checkpoint function returned None" on a preemption too; Slurm then
    # requeued the job itself, and cancelling it would be wrong.
    lines = [
        PREEMPTED.replace("timed-out", "preempted"),
        "submitit INFO (2023-03-02 08:14:51,120) - Job not requeued because: checkpoint "
        "function returned None.",
        "slurmstepd: error: *** JOB 771 ON gpu01 CANCELLED AT 2025-03-13T02:15:40 DUE TO JOB "
        "REQUEUE ***",
    ]
    assert diagnose(tmp_path, lines).action is Action.WAIT
    state = SlurmObservation(job_state="PREEMPTED")
    assert diagnose(tmp_path, lines[:2], slurm=state).action is Action.WAIT
    timed_out = SlurmObservation(job_state="TIMEOUT")
    assert diagnose(tmp_path, lines[:2], slurm=timed_out).action is Action.STOP


def test_an_unraisable_exception_without_a_traceback_drops_nothing(tmp_path: Path) -> None:
    # CPython's hook often prints no traceback; the next one, another rank's, is real.
    diagnosis = diagnose(
        tmp_path,
        [
            "[rank1]: Exception ignored in: <_io.TextIOWrapper name='<stdout>'>",
            "[rank1]: BrokenPipeError: [Errno 32] Broken pipe",
            "[rank0]: Traceback (most recent call last):",
            '[rank0]:   File "train.py", line 88, in <module>',
            "[rank0]: ValueError: Input sequence length 8192 exceeds max_position_embeddings",
            WATCHDOG,
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)


def test_a_marker_of_one_rank_does_not_drop_another_ranks_exception(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "[rank1]: Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__>",
            "[rank0]: Traceback (most recent call last):",
            "[rank1]: Traceback (most recent call last):",
            "[rank1]: AssertionError: can only test a child process",
            "[rank0]: KeyError: 'attention_mask'",
        ],
    )
    assert diagnosis.action is Action.STOP
    assert 0 in diagnosis.culprit_ranks


def test_an_ib_port_error_gives_way_to_the_programs_own_error(tmp_path: Path) -> None:
    port = (
        "gpu02:7712:7790 [0] transport/net_ib.cc:125 NCCL WARN NET/IB : mlx5_0:1 Got async "
        "error event: port error"
    )
    active = port.replace("port error", "port active")
    assert diagnose(tmp_path, [port, active, *KEY_ERROR]).action is Action.STOP
    # Beside a network failure it is why, and its node is drained.
    assert diagnose(tmp_path, [port, WATCHDOG]).action is Action.DRAIN_AND_RESTART


def test_bind_warnings_do_not_stop_a_job_that_died_otherwise(tmp_path: Path) -> None:
    bind = (
        "[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 "
        "(errno: 98 - Address already in use)."
    )
    assert diagnose(tmp_path, [bind, WATCHDOG]).action is not Action.STOP
    assert diagnose(tmp_path, [bind, "Handling auto-requeue signal: 10"]).action is Action.WAIT


def test_a_ray_node_stopped_by_the_time_limit_is_the_time_limit(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "ray.exceptions.ActorDiedError: The actor died because its node has died. Node Id: 8f",
            "\tthe actor's node was terminated expectedly: received SIGTERM",
            TIME_LIMIT,
        ],
    )
    assert diagnosis.rule_ids[0] == "slurm.time_limit"
    assert diagnosis.culprit_nodes == []


@pytest.mark.parametrize(
    "code", ["999 'unknown error'", "700 'an illegal memory access was encountered'"]
)
def test_nccls_calloc_failure_gives_way_to_the_cuda_error_behind_it(
    tmp_path: Path, code: str
) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            f"gpu02:4410:4410 [6] include/alloc.h:103 NCCL WARN Cuda failure {code}",
            "gpu02:4410:4410 [6] include/alloc.h:48 NCCL WARN Failed to CUDA calloc 33554432 bytes",
        ],
    )
    assert diagnosis.category is not Category.OOM_GPU
    assert diagnosis.action is not Action.STOP


def test_the_desync_report_gives_way_to_the_programs_runtime_error(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "[rank7]: RuntimeError: shape '[4, 4096]' is invalid for input of size 8192",
            "             [7] finished collective #182, but didn't join collective #183",
        ],
    )
    assert diagnosis.rule_ids[0] != "torch.desync_report"


# NVIDIA's Xid catalog, read again: what the table now does for Xids it had wrong.
@pytest.mark.parametrize(
    ("xid", "drains"),
    [
        (44, False),  # IGNORE: fault during a context switch
        (80, False),  # RESTART_APP: corrupted data sent to the GPU
        (121, False),  # IGNORE: corrected C2C errors
        (157, False),  # IGNORE: "you may still run workloads"
        (109, True),  # RESET_GPU: context switch timeout
        (156, True),  # RESET_GPU: resource retirement event
        (136, True),  # RESET_GPU: link training failed
    ],
)
def test_xid_buckets_follow_nvidias_catalog(tmp_path: Path, xid: int, drains: bool) -> None:
    line = f"Mar 12 11:01:22 gpu03 kernel: NVRM: Xid (PCI:0000:9a:00): {xid}, pid=4242, name=python"
    diagnosis = diagnose(tmp_path, [line], nodelist=["gpu03"])
    assert (diagnosis.action is Action.DRAIN_AND_RESTART) is drains, diagnosis.rule_ids


def test_only_a_fatal_nvlink5_xid_drains(tmp_path: Path) -> None:
    fatal = (
        "kernel: NVRM: Xid (PCI:0019:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 10 "
        "(0x025001c6 0x00000000)"
    )
    nonfatal = "kernel: NVRM: Xid (PCI:0000:5f:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 02"
    assert diagnose(tmp_path, [fatal]).action is Action.DRAIN_AND_RESTART
    assert diagnose(tmp_path, [nonfatal]).action is not Action.DRAIN_AND_RESTART


def test_a_pending_row_remap_alone_does_not_drain_but_a_failed_one_does(tmp_path: Path) -> None:
    pending = "        Pending                           : Yes"
    failed = "        Remapping Failure Occurred        : Yes"
    assert diagnose(tmp_path, [pending]).action is not Action.DRAIN_AND_RESTART
    assert diagnose(tmp_path, [failed]).action is Action.DRAIN_AND_RESTART


def test_a_revoked_launch_credential_excludes_no_node(tmp_path: Path) -> None:
    revoked = "srun: error: Task launch for 36.0 failed on node cn131: Job credential revoked"
    assert diagnose(tmp_path, [revoked]).action is not Action.RESTART_EXCLUDING


@pytest.mark.parametrize(
    ("state", "dead"),
    [
        ("DOWN+NOT_RESPONDING", True),
        ("IDLE*+NOT_RESPONDING", True),
        ("MIXED+FAIL", True),
        ("MIXED+DRAIN+POWER_DOWN", False),
        ("IDLE+CLOUD+POWERED_DOWN", False),
        ("IDLE+POWERING_DOWN", False),
        ("ALLOCATED", False),
    ],
)
def test_the_liveness_check_reads_slurms_flags_whole(state: str, dead: bool) -> None:
    # A node switched off to save power is not a dead one (review of 2026-12-03).
    base, *flags = state.split("+")
    assert slurm_says_dead(SlurmNode(name="gpu03", state=base, state_flags=flags)) is dead
