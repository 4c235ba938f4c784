"""Parsing outputs captured from a real Slurm 24.11.5 lab (tests/data/slurm/24.11/real/).

Every capture is parsed by the adapter's parsers and by the watcher's lean parsers, and the
fields trainmedic acts on are checked against what the capture scripts did (see the
README there): jobs 1 (exit 3), 2 (killed by signal 9), 3 (2-node, requeued when gpu02
went DOWN), 4 (--no-requeue), 5 (array 0-1), 8 (requeue-held), 9 (--hold), 10 (--begin).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainmedic.adapters.slurm import errors as E
from trainmedic.adapters.slurm.errors import classify
from trainmedic.adapters.slurm.parse import (
    job_from_scontrol,
    node_from_scontrol,
    parse_scontrol_records,
    parse_sinfo_json,
    parse_squeue_json,
    parse_version,
)
from trainmedic.domain.slurm import SlurmJob, SlurmNode
from trainmedic.watchers.slurm import parse_sinfo_lean, parse_squeue_lean

REAL = Path(__file__).resolve().parents[1] / "data" / "slurm" / "24.11" / "real"
LEAN_MODES = [False, True]  # json, msgspec


def _text(name: str) -> str:
    return (REAL / name).read_text()


def _jobs(name: str) -> dict[str, SlurmJob]:
    text = _text(name)
    if name.endswith(".txt"):
        return {j.job_id: j for j in map(job_from_scontrol, parse_scontrol_records(text))}
    return {j.job_id: j for j in parse_squeue_json(text)}


def _nodes(name: str) -> dict[str, SlurmNode]:
    text = _text(name)
    if name.endswith(".txt"):
        return {n.name: n for n in map(node_from_scontrol, parse_scontrol_records(text))}
    return {n.name: n for n in parse_sinfo_json(text)}


def test_version_is_24_11() -> None:
    version = parse_version(_text("scontrol_version.txt"))
    assert (version.major, version.minor, version.micro) == (24, 11, 5)


def test_every_capture_parses() -> None:
    """No capture is left out: each JSON or scontrol file yields at least one record."""
    seen = 0
    for path in sorted(REAL.glob("*")):
        name = path.name
        if ("squeue" in name and name.endswith(".json")) or "json_show_job" in name:
            jobs = _jobs(name)
            assert jobs or name == "finished_squeue_default.json", name
        elif "sinfo" in name or "json_show_node" in name:
            assert _nodes(name), name
        elif "scontrol_show_job" in name:
            assert _jobs(name), name
        elif "scontrol_show_node" in name:
            assert _nodes(name), name
        else:
            continue
        seen += 1
    assert seen >= 30


# ----------------------------------------------------------------------------- jobs

RUNNING_JOB_FILES = [
    "running_squeue.json",
    "running_scontrol_json_show_job.json",
    "running_scontrol_show_job.txt",
]


@pytest.mark.parametrize("name", RUNNING_JOB_FILES)
def test_running_two_node_job(name: str) -> None:
    job = _jobs(name)["3"]
    assert (job.state, job.state_flags) == ("RUNNING", [])
    assert job.nodes == ["gpu01", "gpu02"]
    assert job.node_count == 2
    assert job.partition == "gpu"
    assert job.restarts == 0
    assert job.requeue is True and job.batch is True
    assert job.batch_host == "gpu01"
    assert job.comment == "tm run=abc step 12"
    assert job.stdout_path == "/tmp/lab/jobs/train-3.out"
    assert job.stderr_path == "/tmp/lab/jobs/train-3.err"
    assert job.tasks_per_node == 1


@pytest.mark.parametrize("name", RUNNING_JOB_FILES)
def test_pending_no_requeue_job_and_array_meta(name: str) -> None:
    jobs = _jobs(name)
    pending = jobs["4"]
    assert (pending.state, pending.state_flags) == ("PENDING", [])
    assert pending.state_reason == "Resources"
    assert pending.requeue is False
    assert pending.nodes == []
    assert not pending.is_held
    # The array's pending meta record is the range, not its first task.
    meta = jobs["5_[0-1]"]
    assert meta.state == "PENDING" and meta.array_job_id == 5 and meta.array_task_id is None


@pytest.mark.parametrize(
    "name",
    [
        "running_scontrol_json_show_job.json",
        "running_scontrol_show_job.txt",
        "nodedown_scontrol_show_job.txt",
        "held_squeue.json",
        "finished_squeue_states_all.json",
    ],
)
def test_failed_jobs_exit_code_and_signal(name: str) -> None:
    jobs = _jobs(name)
    exit3 = jobs["1"]
    assert exit3.state == "FAILED"
    assert exit3.exit is not None and (exit3.exit.code, exit3.exit.signal) == (3, None)
    assert exit3.stdout_path == exit3.stderr_path == "/tmp/lab/jobs/exit3-1.out"
    killed = jobs["2"]
    assert killed.state == "FAILED"
    assert killed.exit is not None and (killed.exit.code, killed.exit.signal) == (None, 9)
    assert killed.state_reason is not None and killed.state_reason.startswith("RaisedSignal")
    # Default output path of a batch job: slurm-%j.out in its working directory.
    assert killed.stdout_path == "/tmp/lab/jobs/slurm-2.out"


@pytest.mark.parametrize(
    "name",
    [
        "downdrain_squeue.json",
        "downdrain_scontrol_json_show_job_one.json",
        "downdrain_scontrol_show_job_one.txt",
    ],
)
def test_job_requeued_by_node_down(name: str) -> None:
    job = _jobs(name)["3"]
    assert job.state == "PENDING"
    assert job.restarts == 1
    assert job.excluded_nodes == ["gpu02"]
    assert job.nodes == []
    assert job.state_reason == "BeginTime"  # waits out cred_expire before it may start


@pytest.mark.parametrize("name", ["downdrain_squeue.json", "downdrain_scontrol_show_job.txt"])
def test_array_tasks_running(name: str) -> None:
    jobs = _jobs(name)
    for task in (0, 1):
        job = jobs[f"5_{task}"]
        assert job.state == "RUNNING" and job.nodes == ["gpu01"]
        assert (job.array_job_id, job.array_task_id) == (5, task)
        assert job.stdout_path == f"/tmp/lab/jobs/arr-5_{task}.out"


@pytest.mark.parametrize(
    "name", ["held_squeue.json", "held_scontrol_json_show_job.json", "held_scontrol_show_job.txt"]
)
def test_held_jobs(name: str) -> None:
    jobs = _jobs(name)
    requeue_held = jobs["8"]
    assert requeue_held.state == "PENDING" and requeue_held.is_held
    assert requeue_held.restarts == 1
    assert jobs["9"].is_held
    assert jobs["10"].state == "PENDING" and not jobs["10"].is_held
    assert jobs["10"].state_reason == "BeginTime"


def test_default_squeue_json_hides_finished_jobs() -> None:
    """24.11 applies squeue's default state filter to --json: finished jobs need --states=all."""
    assert parse_squeue_json(_text("finished_squeue_default.json")) == []
    assert {"1", "2"}.isdisjoint(_jobs("running_squeue.json"))  # FAILED by then
    finished = _jobs("finished_squeue_states_all.json")
    assert {j.state for j in finished.values()} >= {"FAILED", "COMPLETED", "CANCELLED"}
    assert finished["7"].exit is not None and finished["7"].exit.code == 3


@pytest.mark.parametrize("fast", LEAN_MODES)
@pytest.mark.parametrize(
    "name",
    [
        "running_squeue.json",
        "downdrain_squeue.json",
        "nodedown_squeue.json",
        "held_squeue.json",
        "finished_squeue_states_all.json",
        "running_scontrol_json_show_job.json",
        "held_scontrol_json_show_job.json",
    ],
)
def test_lean_jobs_agree_with_full_parser(name: str, fast: bool) -> None:
    full = _jobs(name)
    lean = parse_squeue_lean(_text(name), use_msgspec=fast)
    assert set(lean) == set(full)
    for job_id, view in lean.items():
        job = full[job_id]
        assert (view.state, list(view.flags)) == (job.state, job.state_flags)
        assert view.restarts == job.restarts
        assert view.held == job.is_held
        assert view.node_names() == job.nodes
        if job.state not in {"RUNNING", "COMPLETING", "SUSPENDED"}:
            assert view.exit == job.exit


# ----------------------------------------------------------------------------- nodes


@pytest.mark.parametrize(
    "name",
    [
        "running_sinfo.json",
        "running_scontrol_json_show_node.json",
        "running_scontrol_show_node.txt",
        "running_scontrol_json_show_node_one.json",
        "running_scontrol_show_node_one.txt",
    ],
)
def test_draining_node(name: str) -> None:
    node = _nodes(name)["gpu02"]
    assert (node.state, node.state_flags) == ("ALLOCATED", ["DRAIN"])
    assert node.reason == "tm: Xid 79 on gpu1"
    assert node.reason_user == "root"
    assert node.partitions == ["gpu"]
    assert node.gres == "gpu:2"
    assert node.cpus == 8


@pytest.mark.parametrize("name", ["running_sinfo.json", "running_scontrol_json_show_node.json"])
def test_node_without_reason(name: str) -> None:
    # 24.11's sinfo gives {"description": "", "time": 0, "user": ""} for "no reason".
    node = _nodes(name)["gpu01"]
    assert (node.state, node.state_flags) == ("ALLOCATED", [])
    assert node.reason is None and node.reason_user is None


@pytest.mark.parametrize(
    "name",
    [
        "downdrain_sinfo.json",
        "downdrain_scontrol_json_show_node.json",
        "downdrain_scontrol_show_node.txt",
    ],
)
def test_down_and_drained_nodes(name: str) -> None:
    nodes = _nodes(name)
    down = nodes["gpu02"]
    assert (down.state, down.state_flags) == ("DOWN", ["DRAIN"])
    assert down.reason == "tm: node lost"
    mixed = nodes["gpu01"]
    assert (mixed.state, mixed.state_flags) == ("MIXED", ["DRAIN"])
    assert mixed.reason == "tm: ecc errors"


@pytest.mark.parametrize(
    "name",
    [
        "nodedown_sinfo.json",
        "nodedown_scontrol_json_show_node.json",
        "nodedown_scontrol_show_node.txt",
        "nodedown_scontrol_json_show_node_one.json",
        "nodedown_scontrol_show_node_one.txt",
    ],
)
def test_node_down_not_responding(name: str) -> None:
    node = _nodes(name)["gpu02"]
    assert (node.state, node.state_flags) == ("DOWN", ["NOT_RESPONDING"])
    assert node.reason == "Not responding"
    assert node.is_down


@pytest.mark.parametrize(
    "name", ["held_sinfo.json", "held_scontrol_json_show_node.json", "held_scontrol_show_node.txt"]
)
def test_idle_drained_node(name: str) -> None:
    nodes = _nodes(name)
    assert (nodes["gpu02"].state, nodes["gpu02"].state_flags) == ("IDLE", ["DRAIN"])
    assert nodes["gpu02"].reason == "tm: idle drain"
    assert nodes["gpu02"].is_drained
    assert (nodes["gpu01"].state, nodes["gpu01"].state_flags) == ("IDLE", [])


@pytest.mark.parametrize("fast", LEAN_MODES)
@pytest.mark.parametrize(
    "name",
    [
        "running_sinfo.json",
        "downdrain_sinfo.json",
        "nodedown_sinfo.json",
        "held_sinfo.json",
        "nodedown_scontrol_json_show_node.json",
        "held_scontrol_json_show_node.json",
    ],
)
def test_lean_nodes_agree_with_full_parser(name: str, fast: bool) -> None:
    full = _nodes(name)
    lean = parse_sinfo_lean(_text(name), use_msgspec=fast)
    assert set(lean) == set(full)
    for node_name, view in lean.items():
        node = full[node_name]
        assert (view.state, list(view.state_flags)) == (node.state, node.state_flags)
        assert view.reason == node.reason
        assert view.reason_user == node.reason_user
        # A reason must never leak as the repr of 24.11's reason object.
        assert "description" not in (view.reason or "")


# ----------------------------------------------------------------------------- errors

# Expected class of each line of errors.txt, in order; None: the command succeeded.
EXPECTED_ERRORS: list[type[E.SlurmError] | None] = [
    E.NoSuchJob,  # show job 999
    E.NoSuchJob,  # show job 5_7 ("Job 5_7 not found", on stdout)
    None,  # scontrol --json show job 999: exit 0, empty list
    E.NoSuchNode,  # show node nope (on stdout)
    None,  # scontrol --json show node nope: exit 0, a warning
    E.NoSuchJob,  # requeue 999
    E.JobNotRequeueable,  # requeue of a pending --no-requeue job
    None,  # requeue of a FAILED batch job works in 24.11
    E.NoSuchJob,  # requeuehold 999
    E.NoSuchJob,  # update unknown job
    E.NoSuchJob,  # release 999
    E.JobStateConflict,  # starttime=now on a running job
    None,  # update comment of a finished job works
    E.NoSuchNode,  # drain unknown node
    E.SlurmInvalidArgument,  # drain without a reason
    E.SlurmInvalidArgument,  # bogus state
    E.NoSuchJob,  # scancel -v 999: exit 0, error on stderr
    E.JobNotRequeueable,  # requeue of a running --no-requeue job
    None,  # starttime=now on a pending job
    E.SlurmTimeout,  # slurmctld stopped (SIGSTOP)
    E.SlurmTimeout,
    E.SlurmUnavailable,  # slurmctld killed: squeue --json exits 1 (22.05: 0 + errors)
    E.SlurmUnavailable,  # sinfo --json
    None,  # scontrol --json show job: exit 0 and an empty list even with no controller
    E.SlurmUnavailable,
    E.SlurmUnavailable,
    E.SlurmUnavailable,
    E.SlurmUnavailable,
    E.SlurmUnavailable,  # requeue: "Unexpected message received"
    E.SlurmUnavailable,  # scancel exit 8
]


def _error_records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in _text("errors.txt").splitlines() if line.strip()]


def test_error_records_match_expectations_list() -> None:
    assert len(_error_records()) == len(EXPECTED_ERRORS)


@pytest.mark.parametrize("index", range(len(EXPECTED_ERRORS)))
def test_real_error_messages_map_to_typed_errors(index: int) -> None:
    record = _error_records()[index]
    expected = EXPECTED_ERRORS[index]
    # What the command adapter does: scancel's errors are read from stderr on exit 0.
    failed = record["rc"] != 0 or (
        record["argv"][0] == "scancel" and "error:" in record["stderr"].lower()
    )
    if expected is None:
        assert not failed, record
        return
    assert failed, record
    error = classify(record["argv"], record["rc"], record["stderr"] or record["stdout"])
    assert type(error) is expected, (record, error)
    assert error.retryable == expected.retryable


def test_scontrol_json_with_controller_down_is_indistinguishable_from_no_jobs() -> None:
    """Why the adapter reads jobs through squeue / `scontrol -o`, not `scontrol --json`."""
    record = _error_records()[23]
    assert record["argv"] == ["scontrol", "--json", "show", "job"] and record["rc"] == 0
    doc = json.loads(record["stdout"])
    assert doc["jobs"] == [] and not doc["errors"]
    assert parse_squeue_json(record["stdout"]) == []
