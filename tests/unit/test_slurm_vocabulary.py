"""Slurm's vocabulary in one place: "drained by trainmedic" (`is_ours`), the node-state
predicates shared by the full and the lean read models, the node's address, the resume
guard and the lab's reading of `scontrol -o show node`."""

from __future__ import annotations

import types
from collections.abc import Sequence
from pathlib import Path

import pytest

from trainmedic.activities.quarantine import QuarantineActivities
from trainmedic.adapters.slurm.cli import SlurmCli
from trainmedic.adapters.slurm.parse import (
    node_from_scontrol,
    parse_scontrol_records,
    parse_sinfo_json,
)
from trainmedic.adapters.slurm.protocol import CompletedCommand
from trainmedic.adapters.slurm.pyslurm_backend import node_from_pyslurm
from trainmedic.adapters.slurm.view import NodeView, parse_sinfo_lean
from trainmedic.domain.diagnosis import Diagnosis
from trainmedic.domain.enums import Action, Category
from trainmedic.domain.slurm import SlurmNode, is_ours, parse_our_reason
from trainmedic.lab.lab import LabNode
from trainmedic.workflows.planning import is_ours as planning_is_ours
from trainmedic.workflows.planning import slurm_reason
from trainmedic.workflows.quarantine import AssessRequest, ResumeRequest

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
OURS = "trainmedic incident-lab-12-1: gpu_hardware: Xid 79 on gpu02"


# ----------------------------------------------------------------------------- is_ours


def old_planning(reason: str | None) -> bool:  # workflows/planning.py, before
    return bool(reason) and str(reason).startswith("trainmedic")


def old_watcher(reason: str | None) -> bool:  # watchers/slurm.py NodeView.ours, before
    return (reason or "").lower().startswith("trainmedic")


def old_resume_guard(reason: str | None) -> bool:  # only_if_reason_contains="trainmedic"
    return "trainmedic" in (reason or "")


@pytest.mark.parametrize(
    ("reason", "ours"),
    [
        # What trainmedic writes (planning.slurm_reason): all agreed, and still do.
        (OURS, True),
        ("trainmedic incident-c-7-1: node_down: gpu02 confirmed dead", True),
        # A person's reasons the old checks disagreed on: never ours now.
        ("trainmedic-test: bad fan", False),  # prefix: ours; substring: ours
        ("TRAINMEDIC incident-lab-1-1: gpu_hardware: x", False),  # lower-cased prefix: ours
        ("Trainmedic said Xid 79, swapping the board", False),  # lower-cased prefix: ours
        ("swapped GPU, see trainmedic incident-lab-3-1", False),  # substring: ours
        ("trainmedic note: disk", False),  # prefix: ours (no such category)
        ("trainmedic incident-lab-7-1", False),  # prefix: ours (no category)
        ("trainmedic: quarantine", False),  # prefix: ours
        ("trainmedic", False),
        ("bad fan", False),
        ("", False),
        (None, False),
    ],
)
def test_one_test_for_drained_by_trainmedic(reason: str | None, ours: bool) -> None:
    assert is_ours(reason) is ours
    assert planning_is_ours(reason) is ours  # planning's name is the same function
    node = SlurmNode(name="gpu02", state="IDLE", state_flags=["DRAIN"], reason=reason)
    view = NodeView.from_node(node)
    assert node.is_ours is ours and view.is_ours is ours
    if ours:  # everything trainmedic writes was "ours" for all three old checks
        assert old_planning(reason) and old_watcher(reason) and old_resume_guard(reason)


def test_the_cases_above_cover_every_disagreement() -> None:
    person = [
        "trainmedic-test: bad fan",
        "TRAINMEDIC incident-lab-1-1: gpu_hardware: x",
        "swapped GPU, see trainmedic incident-lab-3-1",
    ]
    verdicts = {(old_planning(r), old_watcher(r), old_resume_guard(r)) for r in person}
    assert len(verdicts) == len(person)  # each one split the old checks another way
    assert not any(is_ours(r) for r in person)


@pytest.mark.parametrize("category", list(Category))
def test_every_reason_trainmedic_writes_is_ours(category: Category) -> None:
    diagnosis = Diagnosis(
        category=category,
        action=Action.DRAIN_AND_RESTART,
        confidence=0.9,
        catalog_version="test",
        summary="Xid 79 \x1b[31m on gpu02: fell off the bus " * 10,  # long, with controls
    )
    reason = slurm_reason("incident-my.cluster_1-123_4-2", diagnosis)
    assert is_ours(reason)
    assert parse_our_reason(reason) == ("incident-my.cluster_1-123_4-2", category.value)


# ----------------------------------------------------------------------------- states


@pytest.mark.parametrize(
    ("state", "flags", "already_drain", "already_down"),
    [
        ("IDLE", [], None, None),
        ("IDLE", ["DRAIN"], "drained", None),
        ("MIXED", ["DRAIN"], "draining", None),
        ("DOWN", ["DRAIN"], "drained", "down"),
        ("DOWN", ["NOT_RESPONDING"], None, "down"),
        ("ALLOCATED", ["FAIL"], None, "down"),
    ],
)
def test_one_check_says_how_a_node_already_is(
    state: str, flags: list[str], already_drain: str | None, already_down: str | None
) -> None:
    node = SlurmNode(name="n", state=state, state_flags=flags)
    assert (node.already("DRAIN"), node.already("DOWN")) == (already_drain, already_down)
    assert node.is_out is bool(already_drain or already_down)


@pytest.mark.parametrize(
    "name",
    ["22.05/sinfo_drain_down.json", "22.05/sinfo_draining.json", "24.11/sinfo_draining.json"],
)
def test_full_and_lean_models_read_states_alike(name: str) -> None:
    text = (DATA / name).read_text()
    full = {n.name: n for n in parse_sinfo_json(text)}
    lean = parse_sinfo_lean(text, use_msgspec=False)
    predicates = [
        "state_text",
        "drain_flag",
        "is_drained",
        "is_draining",
        "is_down",
        "marked_down",
        "not_responding",
        "is_failing",
        "is_out",
        "is_ours",
        "is_available",
        "is_registered",
    ]
    for node_name, node in full.items():
        view = lean[node_name]
        assert [getattr(view, p) for p in predicates] == [getattr(node, p) for p in predicates]


# ----------------------------------------------------------------------------- address


def test_address_from_sinfo_json_22_05() -> None:
    nodes = parse_sinfo_json((DATA / "22.05/sinfo_drain_down.json").read_text())
    assert nodes and all(n.address == "localhost" for n in nodes)


def test_address_from_scontrol_both_versions() -> None:
    for name in ("22.05/scontrol_show_node.txt", "24.11/real/running_scontrol_show_node.txt"):
        records = parse_scontrol_records((DATA / name).read_text())
        nodes = [node_from_scontrol(r) for r in records]
        expected = "localhost" if name.startswith("22.05") else "127.0.0.1"
        assert nodes and all(n.address == expected for n in nodes), name
    (record,) = parse_scontrol_records("NodeName=n1 NodeAddr=10.1.2.3 State=IDLE\n")
    assert node_from_scontrol(record).address == "10.1.2.3"
    (record,) = parse_scontrol_records("NodeName=n1 State=IDLE\n")
    assert node_from_scontrol(record).address is None


def test_address_from_scontrol_json_24_11() -> None:
    text = (DATA / "24.11/real/running_scontrol_json_show_node.json").read_text()
    assert {n.address for n in parse_sinfo_json(text)} == {"127.0.0.1"}


def test_address_from_sinfo_json_24_11_only_when_it_lines_up() -> None:
    text = (DATA / "24.11/real/downdrain_sinfo.json").read_text()
    assert all(n.address is None for n in parse_sinfo_json(text))  # sinfo left it empty
    doc = (
        '{"sinfo": [{"node": {"state": ["IDLE"]}, "partition": {"name": "gpu"},'
        ' "nodes": {"nodes": ["gpu[01-02]"], "addresses": ["10.0.0.1", "10.0.0.2"]}}]}'
    )
    assert [(n.name, n.address) for n in parse_sinfo_json(doc)] == [
        ("gpu01", "10.0.0.1"),
        ("gpu02", "10.0.0.2"),
    ]


def test_address_from_pyslurm() -> None:
    base = {
        "name": "gpu02",
        "state": "IDLE",
        "reason": None,
        "reason_user": None,
        "partitions": ["gpu"],
        "configured_gres": {"gpu": 8},
        "total_cpus": 8,
        "hostname": "localhost",
    }
    assert node_from_pyslurm(types.SimpleNamespace(**base, address="10.0.0.2")).address == (
        "10.0.0.2"
    )
    assert node_from_pyslurm(types.SimpleNamespace(**base)).address is None


# ----------------------------------------------------------------------------- resume guard


class NodeRunner:
    """`scontrol -o show node` answers with `line`; `scontrol update` is recorded."""

    def __init__(self, line: str) -> None:
        self.line = line
        self.updates: list[list[str]] = []

    async def run(self, argv: Sequence[str], timeout: float) -> CompletedCommand:
        if list(argv[:2]) == ["scontrol", "update"]:
            self.updates.append(list(argv))
            self.line = self.line.replace("State=IDLE+DRAIN", "State=IDLE")
        return CompletedCommand(argv=list(argv), returncode=0, stdout=self.line)


@pytest.mark.parametrize(
    ("reason", "resumed"),
    [(OURS, True), ("swapped GPU, see trainmedic incident-lab-3-1", False)],
)
async def test_resume_guard_asks_is_ours(reason: str, resumed: bool) -> None:
    runner = NodeRunner(f"NodeName=gpu02 State=IDLE+DRAIN Reason={reason} [alice@2026-12-01]\n")
    result = await SlurmCli(runner).resume_node(
        "gpu02", only_if_reason_contains="trainmedic", only_if_ours=True
    )
    assert result.changed is resumed
    assert bool(runner.updates) is resumed
    if not resumed:
        assert "is not trainmedic's" in result.detail


# ----------------------------------------------------------------------------- the lab


def lab_node(line: str, pid: int | None = 42) -> LabNode:
    (record,) = parse_scontrol_records(line + "\n")
    return LabNode(
        name=record["NodeName"],
        port=1,
        slurmd_pid=pid,
        state=record.get("State"),
        reason=record.get("Reason"),
        slurm=node_from_scontrol(record),
    )


@pytest.mark.parametrize(
    ("state", "ready", "down", "drained", "idle"),
    [
        ("IDLE", True, False, False, True),
        ("IDLE+DRAIN", True, False, True, False),
        ("MIXED", True, False, False, False),
        ("DOWN+NOT_RESPONDING", False, True, False, False),
        ("DOWN+DRAIN", False, True, True, False),
        ("IDLE+NOT_RESPONDING", False, False, False, False),
        ("UNKNOWN", False, False, False, False),
        ("FUTURE", False, False, False, False),
        ("IDLE+INVALID_REG", False, False, False, False),
        ("IDLE+POWERED_DOWN", False, False, False, False),
        ("IDLE+FAIL", True, False, False, False),
    ],
)
def test_lab_nodes_read_through_the_adapter(
    state: str, ready: bool, down: bool, drained: bool, idle: bool
) -> None:
    node = lab_node(f"NodeName=gpu01 Arch=x86_64 State={state} Reason=Not responding [root@t]")
    assert (node.ready, node.is_down, node.is_drained, node.idle) == (ready, down, drained, idle)
    assert node.reason == "Not responding [root@t]"  # shown as scontrol prints it
    assert not lab_node(f"NodeName=gpu01 State={state}", pid=None).ready  # slurmd not running
    unknown = LabNode(name="gpu01", port=1)  # controller did not answer
    assert not (unknown.ready or unknown.is_down or unknown.is_drained or unknown.idle)


# ----------------------------------------------------------------------------- quarantine


@pytest.mark.parametrize(
    ("reason", "ours"),
    [
        (OURS, True),
        ("trainmedic-test: bad fan", False),  # the old prefix test: ours
        ("swapped GPU, see trainmedic incident-lab-3-1", False),  # the old resume guard: ours
    ],
)
async def test_quarantine_assesses_and_resumes_only_its_own_drains(reason: str, ours: bool) -> None:
    line = f"NodeName=gpu02 State=IDLE+DRAIN Reason={reason} [alice@2026-12-01]\n"
    activities = QuarantineActivities(SlurmCli(NodeRunner(line)), None, None)  # type: ignore[arg-type]
    request = AssessRequest(cluster="c", node="gpu02", episode="e", record=False)
    assessed = await activities.assess(request)
    assert (assessed.out, assessed.ours) == (True, ours)
    runner = NodeRunner(line)
    activities = QuarantineActivities(SlurmCli(runner), None, None)  # type: ignore[arg-type]
    resumed = await activities.resume_node(ResumeRequest(node="gpu02"))
    assert resumed.changed is ours and bool(runner.updates) is ours
