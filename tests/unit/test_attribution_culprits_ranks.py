"""Ranks and hosts from three more forms real jobs print: Lightning's rank-prefixed
messages, Horovod's stall report listing the ranks it waits for, and Open MPI's launcher
naming the rank, node and signal of the process that died.

Each line is published text (source beside it); where a test needs a layout the source
does not state, the test gives one and says so.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.attribution_support import diagnose as _diagnose
from trainmedic.catalog.correlation import Topology, parse_line
from trainmedic.domain import Action, Category

# benign/e-058.log (Lightning on Slurm).
LIGHTNING_SEED = "[rank: 1] Global seed set to 0"
# tune/d-025.log (Horovod's stall inspector).
HOROVOD_STALL = [
    "WARNING: One or more tensors were submitted to be reduced, gathered or broadcasted by "
    "subset of ranks and are waiting for remainder of ranks for more than 60 seconds. This "
    "may indicate that different ranks are trying to submit different tensors or that only "
    "subset of ranks is submitting tensors, which will cause deadlock.",
    "Stalled ops:",
    "NmtModel/Distributed_TransformGradients_Allreduce/HorovodAllreduce_NmtModel_gradients_"
    "NmtModel_encoder_layer_0_layer_norm_mul_1_grad_tuple_control_dependency_1_0 "
    "[missing ranks: 3, 6]",
]
# https://github.com/open-mpi/ompi/issues/2661 (not in the corpus): the ranks needed more
# memory than the node had.
MPIRUN_KILLED = (
    "mpirun noticed that process rank 0 with PID 21183 on node host01 exited on signal 9 (Killed)."
)


def test_lightning_rank_prefix_names_the_rank() -> None:
    ctx = parse_line(LIGHTNING_SEED, Topology())
    assert ctx.rank == 1 and ctx.node is None


def test_the_rank_prefix_still_needs_its_bracket_and_separator() -> None:
    assert parse_line("[rank7]: RuntimeError: boom", Topology()).rank == 7
    assert parse_line("[rank: 7]RuntimeError", Topology()).rank is None
    assert parse_line("[ranking 7] done", Topology()).rank is None


def test_a_rank_prefix_maps_to_its_node_through_the_layout() -> None:
    # The layout is the test's: two nodes of two tasks each.
    ctx = parse_line(LIGHTNING_SEED.replace("rank: 1", "rank: 3"), Topology(["g1", "g2"], 2))
    assert (ctx.rank, ctx.node, ctx.node_from_layout) == (3, "g2", True)


def test_horovod_stall_names_every_missing_rank(tmp_path: Path) -> None:
    # A warning a run that goes on prints too (benign g-808): it names the ranks, the
    # failure's cause is told elsewhere.
    diagnosis = _diagnose(tmp_path, HOROVOD_STALL)
    assert diagnosis.category is Category.UNKNOWN
    assert diagnosis.culprit_ranks == [3, 6]
    assert diagnosis.culprit_nodes == []


def test_horovod_stall_without_the_tensor_lines_names_no_rank(tmp_path: Path) -> None:
    assert _diagnose(tmp_path, HOROVOD_STALL[:1]).culprit_ranks == []


def test_mpirun_names_the_killed_rank_and_its_node(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [MPIRUN_KILLED])
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [0]
    assert diagnosis.culprit_nodes == ["host01"]


def test_mpirun_signal_decides_the_kind_of_death(tmp_path: Path) -> None:
    segv = MPIRUN_KILLED.replace("signal 9 (Killed)", "signal 11 (Segmentation fault)")
    bus = MPIRUN_KILLED.replace("signal 9 (Killed)", "signal 7 (Bus error)")
    term = MPIRUN_KILLED.replace("signal 9 (Killed)", "signal 15 (Terminated)")
    for line, rule_id in ((segv, "proc.segfault"), (bus, "proc.bus_error")):
        diagnosis = _diagnose(tmp_path, [line])
        assert diagnosis.rule_ids == [rule_id]
        assert (diagnosis.culprit_ranks, diagnosis.culprit_nodes) == ([0], ["host01"])
    # SIGTERM is how a launcher tears the others down: no root cause of its own.
    assert _diagnose(tmp_path, [term]).category is Category.UNKNOWN
