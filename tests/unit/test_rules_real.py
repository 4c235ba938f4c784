"""The rule families issue 8 asked for, each held to lines from real, published logs
(tests/corpus/real/tune): what the line means, what to do, and whom it blames."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.catalog import Attributor
from trainmedic.domain import Action, AttributionRequest, Category

ENGINE = Attributor()


def _diagnose(tmp_path: Path, text: str, nodelist: list[str] | None = None):
    log = tmp_path / "job.log"
    log.write_text(text if text.endswith("\n") else text + "\n")
    return ENGINE.attribute(AttributionRequest(nodelist=nodelist or [], log_paths=[str(log)]))


# (family, excerpt, category, action)
CASES = [
    (
        "collective mismatch: a code desync, stop",
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=0, OpType=_ALLGATHER_BASE, "
        "TensorShape=[359, 1, 1435, 16]), but Rank 2 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=0, OpType=_ALLGATHER_BASE, "
        "TensorShape=[359, 1, 1436, 16]).",
        Category.USER_CODE,
        Action.STOP,
    ),
    (
        "NCCL's own mismatched-collective check",
        "`init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective "
        "calls at and around rank 39. You can use NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL "
        "to see the collective logs`",
        Category.USER_CODE,
        Action.STOP,
    ),
    (
        "py-spy dump of ranks stuck in collectives: a hang, a person reads it",
        'Thread 688510 (active): "MainThread"\n'
        "    broadcast (torch/distributed/distributed_c10d.py:1191)\n"
        "    _bcast_pipe_scalar (deepspeed/runtime/pipe/engine.py:542)\n",
        Category.HANG,
        Action.ESCALATE,
    ),
    (
        # NVIDIA: with a remap pending, running and new work go on until the next reset
        # (Xid 63 is IGNORE in its catalog); alone it is a symptom, not a drain.
        "row remap pending (Xid 63 text): nothing failed by itself",
        "Xid errors on instance: ip-26-0-146-100, Error: May 19 07:08:57 ip-26-0-146-100 "
        "kernel: [680111.646286] NVRM: Xid (PCI:0000:10:1c): 63, pid=1850, Row Remapper: "
        "New row marked for remapping, reset gpu to activate",
        Category.UNKNOWN,
        Action.ESCALATE,
    ),
    (
        "dcgmi diag: uncorrectable memory errors, remaps pending",
        "| Error                     | GPU 3 has uncorrectable memory errors and row  |\n"
        "|                           |  remappings are pending                        |",
        Category.GPU_MEMORY_ECC,
        Action.DRAIN_AND_RESTART,
    ),
    (
        "SIGKILL from torchelastic: probably host OOM, unproven",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: "
        "3 (pid: 812917) of binary: /data/envs/bin/python",
        Category.OOM_HOST,
        Action.ESCALATE,
    ),
    (
        "Ray's memory monitor: host OOM, the same settings fail again",
        "> (raylet) [2022-10-28 13:00:31,947 E 90952 90952] (raylet) node_manager.cc:3077: 6 "
        "Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due "
        "to other reasons at node (ID: 28b65794b30840d656df62dff0cfe84933253e1885d7672568c378b9, "
        "IP: 172.17.0.2) over the last time period.",
        Category.OOM_HOST,
        Action.STOP,
    ),
    (
        "DataLoader worker SIGKILLed: host OOM that a restart repeats, stop",
        "RuntimeError: DataLoader worker (pid 1817) is killed by signal: Killed. ",
        Category.OOM_HOST,
        Action.STOP,
    ),
    (
        "submitit requeues on preemption: wait, do not double it",
        "submitit WARNING (2021-04-01 02:26:27,643) - Caught signal SIGUSR1 on learnfair4096: "
        "this job is preempted.\n"
        "submitit INFO (2021-04-01 02:26:28,004) - Requeued job 39025082 (3 remaining timeouts)",
        Category.SCHEDULER_PREEMPTION,
        Action.WAIT,
    ),
    (
        "state_dict shapes differ: a resume that fails the same way every time",
        "RuntimeError: Error(s) in loading state_dict for Model:\n"
        "\tsize mismatch for model.0.conv.weight: copying a param with shape "
        "torch.Size([19, 3, 3, 3]) from checkpoint, the shape in current model is "
        "torch.Size([32, 3, 3, 3]).",
        Category.CHECKPOINT,
        Action.STOP,
    ),
    (
        "ZeRO checkpoint from another DP world size",
        "deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a "
        "DP world size of 32 but the current world size is 128. Automatic adjustment of ZeRO's "
        "optimizer state partitioning with a new world size is not currently supported.",
        Category.CHECKPOINT,
        Action.STOP,
    ),
    (
        "stale file handle: one-off or a shared cache, a person tells",
        "OSError: [Errno 116] Stale file handle",
        Category.STORAGE_IO,
        Action.ESCALATE,
    ),
    (
        "EIO while writing a checkpoint",
        "ERROR: megatron.core.dist_checkpointing.strategies.filesystem_async: Local process 0 "
        "encountered an error: [Errno 5] Input/output error",
        Category.STORAGE_IO,
        Action.ESCALATE,
    ),
    (
        "EIO reading data, no node named: a plain restart",
        "OSError: [Errno 5] Input/output error: '/opt/data/private/dataset/k400_frame/train/x'",
        Category.STORAGE_IO,
        Action.RESTART,
    ),
    (
        "illegal memory access: a person looks",
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
    ),
    (
        "segfault seen by torchelastic: a person looks",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) local_rank: "
        "0 (pid: 2977223) of binary: /home/u/envs/bin/python",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
    ),
    (
        "driver older than the CUDA runtime: a person fixes the environment",
        "RuntimeError: cuda runtime error (35) : CUDA driver version is insufficient for CUDA "
        "runtime version at /pytorch/aten/src/THC/THCGeneral.cpp:74",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
    ),
    (
        "cuBLAS execution failed: toolkit or hardware, a person looks",
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( "
        "handle, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
    ),
    (
        "Xid 13 from the application's kernel: a person looks, no blind restart",
        "[Wed Jun 24 15:44:20 2026] NVRM: Xid (PCI:0000:70:00): 13, Graphics SM Warp Exception "
        "on (GPC 1, TPC 1, SM 1): MMU Fault",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
    ),
    (
        "rendezvous unreachable at start-up: configuration, a person checks",
        "[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to "
        "connect to 192.0.0.1:1234\n"
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to "
        "the C10d store has failed. See inner exception for details.",
        Category.NETWORK_NCCL,
        Action.ESCALATE,
    ),
    (
        "Ray node marked dead, no host given: a plain restart",
        "The node with client ID 1eadc9db2f074bfec34caf25dd5bf1f99fad0d59 has been marked dead "
        "because the monitor has missed too many heartbeats from it.",
        Category.NODE_DOWN,
        Action.RESTART,
    ),
    (
        "CUDA unknown error mid-run: a GPU crash without a named node",
        "[default3]:terminate called after throwing an instance of 'c10::CUDAError'\n"
        "[default3]:  what():  CUDA error: unknown error",
        Category.GPU_HARDWARE,
        Action.RESTART,
    ),
]


@pytest.mark.parametrize(
    ("text", "category", "action"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_real_line_family(tmp_path: Path, text: str, category: Category, action: Action) -> None:
    diagnosis = _diagnose(tmp_path, text)
    assert (diagnosis.category, diagnosis.action) == (category, action), diagnosis.rule_ids


def test_nccl_info_noise_is_not_a_missing_file(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        "gpu01:1234:1234 [0] NCCL INFO NET/Plugin: Plugin load (libnccl-net.so) returned 2 : "
        "libnccl-net.so: cannot open shared object file: No such file or directory",
    )
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)


def test_ray_report_of_possible_sigsegv_is_not_a_segfault(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        "(raylet) A worker died or was killed while executing a task by an unexpected system "
        "error. Worker IP address: 10.0.7.57 Worker port: 10046 Worker PID: 89513 Worker exit "
        "type: SYSTEM_ERROR Worker exit detail: There are some potential root causes. (1) The "
        "process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop "
        "--force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other "
        "unexpected errors.",
    )
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert diagnosis.culprit_nodes == ["10.0.7.57"]


# -- culprits from the forms real logs use ---------------------------------------------


def test_collective_mismatch_blames_the_named_rank(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        "`init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective "
        "calls at and around rank 39.`",
    )
    assert diagnosis.culprit_ranks == [39] and diagnosis.culprit_nodes == []


def test_torchelastic_failure_block_without_root_cause_header(tmp_path: Path) -> None:
    # The excerpt starts inside the block: its first entry is the failure.
    diagnosis = _diagnose(
        tmp_path,
        "  time      : 2025-12-23_05:17:58\n"
        "  host      : yotta-B200-232\n"
        "  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -11 (pid: 3304209)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 11 (SIGSEGV) received by PID 3304209\n",
    )
    assert diagnosis.action is Action.ESCALATE
    assert diagnosis.culprit_nodes == ["yotta-B200-232"] and diagnosis.culprit_ranks == [0]


def test_root_cause_block_names_host_and_rank_for_an_unexplained_exit(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2024-07-10_14:44:36\n"
        "  host      : node155\n"
        "  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : 1 (pid: 3054645)\n",
    )
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert diagnosis.culprit_nodes == ["node155"] and diagnosis.culprit_ranks == [0]


def test_timestamped_mpi_and_nccl_prefixes_name_host_and_ranks(tmp_path: Path) -> None:
    host = "container-e275-1553839402050-12124-01-000057"
    lines = [
        f"2019-06-02T16:13:44.884Z: [1,{rank}]<stdout>:{host}:815:864 [0] transport/net_ib.cu:80 "
        "NCCL WARN NET/IB : Got async event : local catastrophic error"
        for rank in (12, 13, 14)
    ]
    diagnosis = _diagnose(tmp_path, "\n".join(lines))
    assert diagnosis.action is Action.DRAIN_AND_RESTART
    assert diagnosis.culprit_nodes == [host] and diagnosis.culprit_ranks == [12, 13, 14]


def test_nccl_prefix_quoted_inside_a_line_names_the_host(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        "problem 1: one pod hang with error message: `task-646--1-mhpnk:91:123 [0] "
        "transport/net_ib.cc:881 NCCL WARN NET/IB : Got completion from peer "
        "172.17.127.143<49577> with error 12, opcode 1, len 0, vendor err 129`",
    )
    assert diagnosis.category is Category.INFINIBAND_NIC
    assert diagnosis.action is Action.ESCALATE  # the reporter is not proven bad
    assert diagnosis.culprit_nodes == ["task-646--1-mhpnk"]


def test_srun_task_launch_failure_excludes_that_node(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path, "srun: error: Task launch for 36.0 failed on node cn131: Job credential expired"
    )
    assert (diagnosis.category, diagnosis.action) == (Category.NODE_DOWN, Action.RESTART_EXCLUDING)
    assert diagnosis.culprit_nodes == ["cn131"]


def test_salloc_node_failure_drains_the_node(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, "salloc: error: Node failure on worker-1")
    assert diagnosis.action is Action.DRAIN_AND_RESTART and diagnosis.culprit_nodes == ["worker-1"]


def test_ray_actor_on_a_dead_node_names_its_address(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: RayTrainWorker\n"
        "\tpid: 6420\n"
        "\tip: 10.72.56.3\n"
        "The actor is dead because its node has died. Node Id: 677df2a9020c5db45e755b0078c4\n",
    )
    assert (diagnosis.category, diagnosis.action) == (Category.NODE_DOWN, Action.DRAIN_AND_RESTART)
    assert diagnosis.culprit_nodes == ["10.72.56.3"]


def test_rank_behind_in_sequence_numbers_is_the_culprit(tmp_path: Path) -> None:
    pg = "[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    text = "\n".join(
        [
            f"[rank6]:[E904 23:21:18.043 ProcessGroupNCCL.cpp:1834] {pg.format(r=6)} Timeout at "
            "NCCL work: 70005, last enqueued NCCL work: 70005, last completed NCCL work: 70004.",
            f"[rank7]:[E904 23:21:18.044 ProcessGroupNCCL.cpp:1834] {pg.format(r=7)} Timeout at "
            "NCCL work: 70005, last enqueued NCCL work: 70005, last completed NCCL work: 70004.",
            f"[rank2]:[E904 23:21:18.046 ProcessGroupNCCL.cpp:1595] {pg.format(r=2)} Process "
            "group watchdog thread terminated with exception: [Rank 2] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=70002, OpType=ALLREDUCE, "
            "Timeout(ms)=600000) ran for 600015 milliseconds before timing out.",
        ]
    )
    diagnosis = _diagnose(tmp_path, text)
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)
    assert diagnosis.culprit_ranks == [2] and diagnosis.culprit_nodes == []


def test_same_sequence_number_everywhere_names_no_rank(tmp_path: Path) -> None:
    text = "\n".join(
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=88211, OpType=ALLREDUCE, Timeout(ms)=600000) ran "
        "for 600083 milliseconds before timing out."
        for r in range(4)
    )
    assert _diagnose(tmp_path, text).culprit_ranks == []


def test_wrapped_watchdog_message_keeps_its_rank(tmp_path: Path) -> None:
    # A terminal wrapped the message: only its first piece carries "[rank6]:".
    text = (
        "[rank6]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID "
        "0(default_pg) Rank 6] ProcessGroupNCCL'\n"
        "s watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
        "collectives. This typically indi\n"
        "cates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog\n"
    )
    diagnosis = _diagnose(tmp_path, text)
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.RESTART)
    assert diagnosis.culprit_ranks == [6]


# -- what the operator reads -----------------------------------------------------------


def test_summary_is_the_rule_title_not_a_raw_line(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        "1: :[E ProcessGroupNCCL.cpp:1515] [PG 0 Rank 9] CUDA error: uncorrectable ECC error "
        "encountered",
        nodelist=["gpu01", "gpu02"],
    )
    assert diagnosis.summary.startswith("uncorrectable ECC error")
    assert "ProcessGroupNCCL" not in diagnosis.summary
    xid = _diagnose(tmp_path, "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off")
    assert xid.summary.startswith("GPU fell off the bus (Xid 79)")


def test_every_rule_has_a_short_operator_title() -> None:
    for rule in ENGINE.catalog.rules:
        assert 3 <= len(rule.title) <= 80, rule.id
        assert "\n" not in rule.title and not rule.title.endswith("."), rule.id


def test_stop_says_on_which_node_it_happened(tmp_path: Path) -> None:
    # A stop touches no node, but the owner reads where it failed (tune/b-092).
    diagnosis = _diagnose(
        tmp_path,
        "gpu-q-13: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "896.00 MiB (GPU 2; 79.17 GiB total capacity; 76.68 GiB already allocated; "
        "381.31 MiB free; 77.24 GiB reserved in total by PyTorch)",
        nodelist=["gpu-q-13", "gpu-q-14"],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.STOP)
    assert diagnosis.culprit_nodes == ["gpu-q-13"]


@pytest.mark.parametrize(
    "text",
    [
        # tune/c-057: a peer agent left, the agent retries its workers itself
        "I0213 12:07:20.086000 870572 torch/distributed/elastic/agent/server/api.py:889] "
        "[default] Worker group FAILED. 3/3 attempts left; will restart worker group\n"
        "I0213 12:07:20.086000 870572 torch/distributed/elastic/agent/server/api.py:699] "
        "[default] Stopping worker group",
        # tune/c-058: re-joining after an elastic scale-down
        "    raise RendezvousClosedError()\n"
        "torch.distributed.elastic.rendezvous.api.RendezvousClosedError",
    ],
)
def test_torchelastic_restarting_its_workers_is_a_restart(tmp_path: Path, text: str) -> None:
    diagnosis = _diagnose(tmp_path, text)
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.RESTART)
    assert diagnosis.transient is True


def test_torchelastic_restart_yields_to_a_real_error(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
        "local_rank: 3 (pid: 812917) of binary: /usr/bin/python\n"
        "[default] Worker group FAILED. 3/3 attempts left; will restart worker group",
    )
    assert diagnosis.category is Category.OOM_HOST and diagnosis.action is Action.ESCALATE


def test_ray_train_worker_index_is_the_rank(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        (Path(__file__).parents[1] / "corpus" / "real" / "tune" / "b-087.log").read_text(),
    )
    assert diagnosis.action is Action.ESCALATE
    assert diagnosis.culprit_nodes == ["10.0.7.57"] and diagnosis.culprit_ranks == [0]


def test_rank_named_after_the_error_is_borrowed_by_the_cause(tmp_path: Path) -> None:
    # tune/b-084: the kernel assertion comes first, far from the rank; the RuntimeError
    # of the same cause sits next to "destroyed on rank 0".
    assertion = (
        "/pytorch/aten/src/ATen/native/cuda/ScatterGatherKernel.cu:276: operator(): "
        "block: [0,0,0], thread: [26,0,0] Assertion `idx_dim >= 0 && idx_dim < index_size "
        '&& "index out of bounds"` failed.\n'
    )
    diagnosis = _diagnose(
        tmp_path,
        assertion
        + '  File "train.py", line 821, in <module>\n' * 10
        + "RuntimeError: CUDA error: device-side assert triggered\n"
        "terminate called after throwing an instance of 'c10::Error'\n"
        "  what():  NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:181, "
        "unhandled cuda error, NCCL version 21.0.3\n"
        "Process Group destroyed on rank 0\n",
    )
    assert diagnosis.category is Category.USER_CODE and diagnosis.culprit_ranks == [0]


def test_workers_aborted_with_no_error_of_their_own_restart_as_a_watchdog(
    tmp_path: Path,
) -> None:
    # tune/a-067: every local rank dead of SIGABRT, nothing else: PyTorch's NCCL watchdog
    # takes processes down with abort().
    diagnosis = _diagnose(
        tmp_path,
        "  exitcode  : -6 (pid: 3437)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 3437\n"
        "-----------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2025-05-01_11:12:35\n"
        "  host      : 472a4389fceb\n"
        "  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -6 (pid: 3431)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 3431\n",
    )
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)
    assert diagnosis.culprit_ranks == [0]


def test_sigabrt_after_a_real_error_is_that_error(tmp_path: Path) -> None:
    diagnosis = _diagnose(
        tmp_path,
        "RuntimeError: CUDA error: device-side assert triggered\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 3431\n",
    )
    assert diagnosis.category is Category.USER_CODE
