"""Rules added in the fourth tuning round, each held to lines of a real tune case
(tests/corpus/real/tune/d-*.log, sources in that folder's labels.jsonl): what the line
means, what to do, and whom it blames."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.catalog import Attributor
from trainmedic.domain import Action, AttributionRequest, Category, Diagnosis

ENGINE = Attributor()


def _diagnose(tmp_path: Path, text: str) -> Diagnosis:
    log = tmp_path / "job.log"
    log.write_text(text if text.endswith("\n") else text + "\n")
    return ENGINE.attribute(AttributionRequest(log_paths=[str(log)]))


# (case, excerpt, category, action, rule that decides)
CASES = [
    (
        "d-016 tensors on different devices: a code bug, stop",
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:3 and cuda:0! (when checking argument for argument index in method "
        "wrapper_CUDA__index_select)",
        Category.USER_CODE,
        Action.STOP,
        "torch.tensor_mismatch",
    ),
    (
        "d-070 CPU tensor handed to the NCCL group: stop",
        "[rank2]: RuntimeError: Expected all tensors to be on the same device, but found at "
        "least two devices, cpu and cuda:2! (when checking argument for argument tensors in "
        "method wrapper_CUDA_cat)",
        Category.USER_CODE,
        Action.STOP,
        "torch.tensor_mismatch",
    ),
    (
        "d-037 DDP unused parameters: stop, the named rank",
        "RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one. This error indicates that your module has parameters that were "
        "not used in producing loss.\n"
        "Parameter indices which did not receive grad for rank 3: 444 445 446 447 448 449",
        Category.USER_CODE,
        Action.STOP,
        "torch.ddp_usage_error",
    ),
    (
        "d-058 ranks built different models: stop",
        "RuntimeError: DDP expects same model across all ranks, but Rank 3 has 2247 params, "
        "while rank 0 has inconsistent 0 params.",
        Category.USER_CODE,
        Action.STOP,
        "torch.ddp_usage_error",
    ),
    (
        "d-050 desync report names the rank that never joined: stop",
        "[rank0]:[E515 18:36:47.343377708 ProcessGroupNCCL.cpp:1937] Rank 0\n"
        "         - [0] Timeout at collective: ALLREDUCE, #315\n"
        "         - To our best knowledge, the lagging/dead/mismatched ranks that caused the "
        "desync are:\n"
        "             [7] finished collective #182, but didn't join collective #183 (count "
        "from 1)",
        Category.HANG,
        Action.STOP,
        "torch.desync_report",
    ),
    (
        "d-042 NCCL RAS: ranks at different operation counts, a hang",
        "#0-0 (fa93daea854b060b) MISMATCH\n"
        "  Communicator ranks have different AllGather operation counts\n"
        "  30 ranks have launched up to operation 640\n",
        Category.HANG,
        Action.RESTART,
        "nccl.ras_mismatch",
    ),
    (
        "d-060 NCCL and PyTorch builds do not match: a person fixes the environment",
        "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, invalid argument, NCCL version "
        "2.14.3\n"
        "ncclInvalidArgument: Invalid value for an argument.\n"
        "Last error:\n"
        "Invalid config blocking attribute value -2147483648",
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
        "nccl.config_version_mismatch",
    ),
    (
        "d-053 Ray node preempted: run again elsewhere",
        "(TrainController pid=79312) The actor died because its node has died. Node Id: "
        "b157c93de9603b1458ae4bd22668b46a4f0ae249bf9467072ba6fd45\n"
        "(TrainController pid=79312) \tthe actor's node was preempted: "
        "preemption_integration_demo: simulating node drain",
        Category.SCHEDULER_PREEMPTION,
        Action.RESTART,
        "ray.node_preempted",
    ),
    (
        "d-025 Horovod stall: a warning, the failure is told elsewhere (benign g-808)",
        "WARNING: One or more tensors were submitted to be reduced, gathered or broadcasted "
        "by subset of ranks and are waiting for remainder of ranks for more than 60 seconds.",
        Category.UNKNOWN,
        Action.ESCALATE,
        "horovod.stalled_ranks",
    ),
    (
        "d-027 checkpoint write failed: check the storage first",
        "RuntimeError: [enforce fail at inline_container.cc:445] . PytorchStreamWriter failed "
        "writing file data/176: file write failed",
        Category.STORAGE_IO,
        Action.ESCALATE,
        "storage.checkpoint_write_failed",
    ),
    (
        "d-077 NCCL receives more bytes than sent: ranks disagree on a size, stop",
        "[2025-09-01 21:12:17] nid001097:5838:6020 [0] transport/net_socket.cc:561 NCCL WARN "
        "NET/Socket : peer 10.249.23.66<41138> message truncated : receiving 8 bytes instead "
        "of 4. If you believe your socket network is in a healthy state, there may be a "
        "mismatch in collective sizes or environment settings (e.g. NCCL_PROTO, NCCL_ALGO) "
        "between ranks\n"
        "nid001097:5838:6020 [0] NCCL INFO transport/net.cc:1393 -> 5",
        Category.USER_CODE,
        Action.STOP,
        "nccl.message_truncated",
    ),
    (
        "d-076 a pipeline stage waits on its neighbour until the store poll times out",
        "[rank0]:[rank4]:[W731 01:01:29.544034999 socket.cpp:460] [c10d] waitForInput: poll "
        "for socket SocketImpl(fd=49, addr=jrc0913.jureca:46374, remote=jrc0912.jureca:38293) "
        "returned 0, likely a timeout",
        Category.HANG,
        Action.ESCALATE,
        "torch.store_wait_timeout",
    ),
    (
        "d-087 distributed code launched without a process group: stop",
        "RuntimeError: Default process group has not been initialized, please make sure to "
        "call init_process_group.",
        Category.USER_CODE,
        Action.STOP,
        "torch.pg_not_initialized",
    ),
    (
        "d-007 the script's own NaN guard: the run diverged, a restart replays it",
        "Loss is nan, stopping training",
        Category.USER_CODE,
        Action.STOP,
        "python.nan_loss",
    ),
    (
        "d-057 autograd anomaly mode found a NaN: the run diverged, a restart replays it",
        "RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.",
        Category.USER_CODE,
        Action.STOP,
        "python.nan_loss",
    ),
]


@pytest.mark.parametrize(
    ("text", "category", "action", "rule_id"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_round4_family(
    tmp_path: Path, text: str, category: Category, action: Action, rule_id: str
) -> None:
    diagnosis = _diagnose(tmp_path, text)
    assert (diagnosis.category, diagnosis.action) == (category, action), diagnosis.rule_ids
    assert diagnosis.rule_ids[0] == rule_id, diagnosis.rule_ids


def test_ddp_unused_parameters_blame_the_named_rank(tmp_path: Path) -> None:
    # tune d-038: the reducer error has no rank prefix; its parameter list names rank 2.
    diagnosis = _diagnose(
        tmp_path,
        "Parameter indices which did not receive grad for rank 2: 362 363 364 365 366 367",
    )
    assert diagnosis.culprit_ranks == [2]


def test_desync_report_blames_the_rank_that_never_joined(tmp_path: Path) -> None:
    # tune d-050: the rank that printed the report (0) waited; rank 7 is named.
    diagnosis = _diagnose(
        tmp_path,
        "[rank0]:[E515 18:36:47.341808597 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=241, OpType=ALLREDUCE, NumelIn=6, "
        "NumelOut=6, Timeout(ms)=600000) ran for 600086 milliseconds before timing out.\n"
        "             [7] finished collective #182, but didn't join collective #183 (count "
        "from 1)",
    )
    assert diagnosis.culprit_ranks == [7]


def test_ray_node_marked_dead_with_its_address_isolates_that_node(tmp_path: Path) -> None:
    # tune d-052: Ray names the dead node's address; the survivor on 10.128.0.32 reports it.
    diagnosis = _diagnose(
        tmp_path,
        "2022-02-15 16:53:52,096\tWARNING worker.py:1462 -- The node with node id: "
        "8f205b12643d25d8c1ce57c45527a6c912f3479765096718ad2bf0d3 and ip: 10.128.0.103 has "
        "been marked dead because the detector has missed too many heartbeats from it. This "
        "can happen when a raylet crashes unexpectedly or has lagging heartbeats.",
    )
    assert diagnosis.category is Category.NODE_DOWN
    assert diagnosis.action is Action.DRAIN_AND_RESTART
    assert diagnosis.culprit_nodes == ["10.128.0.103"]


def test_desync_preamble_alone_is_not_a_diagnosis(tmp_path: Path) -> None:
    # The report's header names nobody; only the rank line decides.
    diagnosis = _diagnose(
        tmp_path,
        "         - To our best knowledge, the lagging/dead/mismatched ranks that caused the "
        "desync are:",
    )
    assert "torch.desync_report" not in diagnosis.rule_ids
