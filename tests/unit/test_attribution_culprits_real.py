"""Tuning round 3 on tests/corpus/real/tune: culprits from the forms real logs write
(Ray's `ip=` prefix, Slurm's NodeAddr, `slurmstepd-<host>:`, an Xid's PCI bus id), and a
program's own exception beating the socket errors that the other ranks print after it.

Each excerpt is a line published in a tune case (named beside it); where a test needs a
layout the source does not state (a node list, NodeAddr, NVML's bus ids), the test gives
one, and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainmedic.catalog import Attributor, load_catalog
from trainmedic.catalog.correlation import Topology, parse_line, pci_key
from trainmedic.catalog.matcher import Matcher
from trainmedic.domain import Action, AttributionRequest, Category, Diagnosis

ENGINE = Attributor()
MATCHER = Matcher(load_catalog())

# tune/c-080.log (Ray Train): the colour codes lost their ESC when pasted into the issue.
RAY_WORKER_LINE = (
    "\x1b[2m\x1b[36m(RayTrainWorker pid=1942, ip=100.97.252.234)\x1b[0m 17-Jan-23 17:21:19 "
    "[Worker:0] [INFO] Returning from train func!!"
)
RAY_WORKER_LINE_PASTED = (
    "[2m[36m(RayTrainWorker pid=1942, ip=100.97.252.234)[0m 17-Jan-23 17:21:19 "
    "[Worker:0] [INFO] Final Sync to HDFS completed!"
)
# tune/b-041.log (Ray's raylet on host OOM).
RAY_OOM_LINE = (
    "> (raylet) [2022-10-28 13:00:31,947 E 90952 90952] (raylet) node_manager.cc:3077: 6 "
    "Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to "
    "other reasons at node (ID: 28b65794b30840d656df62dff0cfe84933253e1885d7672568c378b9, "
    "IP: 172.17.0.2) over the last time period."
)
# tune/a-083.log (Xid 64 on an AWS instance, quoted by a monitoring tool).
XID64_LINE = (
    "Xid errors on instance: ip-26-0-147-135, Error: May 29 01:37:38 ip-26-0-147-135 "
    "kernel: [257087.812628] NVRM: Xid (PCI:0000:90:1c): 64, ..."
)
# tune/a-078.log: the step daemon of a surviving node reports the node failure.
NODE_FAILURE = "srun: error: Node failure on jean-zay-iam37"
STEP_CANCELLED = (
    "slurmstepd: error: *** STEP 1943824.0 ON jean-zay-iam17 CANCELLED AT "
    "2023-03-06T03:17:51 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
)
# tune/b-106.log (the program's own bug) and tune/a-031.log (what a peer prints when the
# other side's process went away).
KEY_ERROR = "KeyError: 'RANK'"
PEER_RESET = [
    "ncclRemoteError: A call failed possibly due to a network error or a remote process "
    "exiting prematurely.",
    "socketProgressOpt: Call to recv from 172....<33759> failed : Connection reset by peer",
]
# tune/c-084.log: Paddle's rendezvous error is raised as a ValueError.
TCP_SEND_ERROR = "ValueError: (InvalidArgument) TCP send error. Details: Broken pipe."


def _diagnose(tmp_path: Path, lines: list[str], **request: Any) -> Diagnosis:
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    return ENGINE.attribute(AttributionRequest(log_paths=[str(log)], **request))


# -- who logged the line ----------------------------------------------------------------


@pytest.mark.parametrize("line", [RAY_WORKER_LINE, RAY_WORKER_LINE_PASTED])
def test_ray_prefix_names_the_workers_address(line: str) -> None:
    assert parse_line(line, Topology()).node == "100.97.252.234"


def test_ray_prefix_address_is_the_node_slurm_knows_it_as() -> None:
    # The layout is the test's: tune/c-080 names no Slurm node.
    topo = Topology(["gpu-a7", "gpu-a8"], addrs={"100.97.252.234": "gpu-a8"})
    ctx = parse_line(RAY_WORKER_LINE_PASTED, topo)
    assert ctx.node == "gpu-a8" and not ctx.node_from_layout


def test_an_address_outside_the_nodes_addresses_names_no_node() -> None:
    topo = Topology(["gpu-a7", "gpu-a8"], addrs={"10.0.0.7": "gpu-a7"})
    assert parse_line(RAY_WORKER_LINE_PASTED, topo).node is None


def test_slurmstepd_prefix_names_its_node() -> None:
    # Slurm >= 21.08 writes "slurmstepd-<node>:"; no tune case shows it, so the line is
    # tune/a-078's with the prefix as newer Slurm prints it.
    line = "slurmstepd-jean-zay-iam17: error: Detected 1 oom-kill event(s) in StepId=191.batch"
    assert parse_line(line, Topology()).node == "jean-zay-iam17"


def test_a_survivor_reporting_the_node_failure_is_not_the_culprit(tmp_path: Path) -> None:
    prefixed = STEP_CANCELLED.replace("slurmstepd:", "slurmstepd-jean-zay-iam17:")
    for step_line in (STEP_CANCELLED, prefixed):
        diagnosis = _diagnose(tmp_path, [NODE_FAILURE, step_line])
        assert diagnosis.category is Category.NODE_DOWN
        assert diagnosis.action is Action.DRAIN_AND_RESTART
        assert diagnosis.culprit_nodes == ["jean-zay-iam37"]


def test_node_addr_maps_an_ip_culprit_to_its_node(tmp_path: Path) -> None:
    # Without NodeAddr the address is what the log gives (tune/b-041's label).
    plain = _diagnose(tmp_path, [RAY_OOM_LINE])
    assert (plain.category, plain.action) == (Category.OOM_HOST, Action.STOP)
    assert plain.culprit_nodes == ["172.17.0.2"]
    mapped = _diagnose(
        tmp_path,
        [RAY_OOM_LINE],
        nodelist=["dgx-011", "dgx-012"],
        node_addrs={"172.17.0.2": "dgx-012"},
    )
    assert mapped.culprit_nodes == ["dgx-012"]


# -- which GPU ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bus_id", "key"),
    [
        ("00000000:90:1C.0", "90:1c"),  # NVML
        ("0000:90:1c", "90:1c"),  # an Xid line
        ("PCI:0000:3b:00", "3b:00"),
        ("3B:00.0", "3b:00"),
        ("not a bus id", None),
    ],
)
def test_pci_bus_ids_compare_in_any_spelling(bus_id: str, key: str | None) -> None:
    assert pci_key(bus_id) == key


def test_xid_bus_id_names_the_gpu_index(tmp_path: Path) -> None:
    # NVML's table for the node is the test's; tune/a-083 gives only the bus id.
    diagnosis = _diagnose(
        tmp_path,
        [XID64_LINE],
        gpu_bus_ids={"ip-26-0-147-135": {"00000000:90:1C.0": 5, "00000000:A8:1C.0": 6}},
    )
    assert diagnosis.category is Category.GPU_MEMORY_ECC
    assert diagnosis.culprit_nodes == ["ip-26-0-147-135"]
    assert diagnosis.culprit_gpus == ["ip-26-0-147-135:5"]
    assert diagnosis.evidence[0].gpu == 5


def test_xid_without_a_bus_id_table_names_no_gpu(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [XID64_LINE])
    assert diagnosis.culprit_nodes == ["ip-26-0-147-135"] and diagnosis.culprit_gpus == []


# -- which error is the cause ------------------------------------------------------------


@pytest.mark.parametrize("order", ["bug first", "peers first"])
def test_programs_exception_beats_the_peers_socket_errors(tmp_path: Path, order: str) -> None:
    lines = [KEY_ERROR, *PEER_RESET] if order == "bug first" else [*PEER_RESET, KEY_ERROR]
    diagnosis = _diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)
    assert diagnosis.rule_ids[0] == "python.traceback_exception"


def test_peers_socket_errors_alone_still_restart(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, PEER_RESET)
    assert diagnosis.action is Action.RESTART


def test_a_generic_exception_yields_to_a_rule_that_knows_the_message() -> None:
    assert [m.rule.id for m in MATCHER.match(TCP_SEND_ERROR)] == ["torch.store_timeout"]
    assert [m.rule.id for m in MATCHER.match(KEY_ERROR)] == ["python.traceback_exception"]


def test_generic_rules_are_the_exception_type_ones() -> None:
    generic = sorted(r.id for r in load_catalog().rules if r.generic)
    assert generic == [
        "python.exception_other",
        "python.runtime_error_environment",
        "python.runtime_error_other",
        "python.traceback_exception",
    ]


# -- families the brief named that no tune case shows: PyTorch's and NCCL's own strings --


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        # PyTorch's text for the NCCL result code (torch/csrc/distributed/c10d/NCCLUtils.cpp).
        ("[rank0]: ncclInternalError: Internal check failed.", "nccl.internal_error"),
        (
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:1275, internal error, NCCL version 2.14.3",
            "nccl.internal_error",
        ),
        # c10d's socket (torch/csrc/distributed/c10d) gives up on the store.
        ("torch.distributed.DistNetworkError: Socket Timeout", "torch.store_timeout"),
        ("RuntimeError: Socket Timeout", "torch.store_timeout"),
    ],
)
def test_nccl_internal_error_and_store_socket_timeout(line: str, rule: str) -> None:
    assert [m.rule.id for m in MATCHER.match(line) if m.rule.role.value != "cascade"] == [rule]


def test_nccl_internal_error_is_escalated_not_restarted(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, ["[rank0]: ncclInternalError: Internal check failed."])
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [0]


def test_argparse_refusing_the_command_line_stops(tmp_path: Path) -> None:
    # argparse's own message (CPython Lib/argparse.py); the srun line is tune/c-082's.
    diagnosis = _diagnose(
        tmp_path,
        [
            "train.py: error: unrecognized arguments: --local-rank=3",
            "srun: error: udc-aj36-35: task 0: Exited with exit code 2",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)
    assert diagnosis.transient is False
