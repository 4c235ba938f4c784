"""Parsing Slurm 22.05 (captured) and 24.11 (documented shape) outputs, error mapping,
and the adapter's idempotent effects against a scripted runner."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from trainmedic.adapters.slurm import errors as slurm_errors
from trainmedic.adapters.slurm.cli import SlurmCli, validate_job_id
from trainmedic.adapters.slurm.errors import (
    JobNotRequeueable,
    NoSuchJob,
    SlurmCommandFailed,
    SlurmInvalidArgument,
    SlurmParseError,
    SlurmUnavailable,
    classify,
)
from trainmedic.adapters.slurm.parse import (
    expand_std_path,
    job_from_scontrol,
    node_from_scontrol,
    parse_scontrol_records,
    parse_sinfo_json,
    parse_squeue_json,
    parse_version,
)
from trainmedic.adapters.slurm.protocol import CommandRunner, CompletedCommand, SlurmBackend
from trainmedic.domain.slurm import ExitStatus, SlurmJob

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
V22 = DATA / "22.05"
V24 = DATA / "24.11"


def by_id(jobs: list[SlurmJob]) -> dict[str, SlurmJob]:
    return {job.job_id: job for job in jobs}


# ---------------------------------------------------------------- exit status


@pytest.mark.parametrize(
    ("raw", "code", "signal"),
    [(0, 0, None), (768, 3, None), (9, None, 9), (15, None, 15), (137 << 8, 137, None)],
)
def test_wait_status_decodes_to_exit_code_or_signal(raw: int, code: int, signal: int) -> None:
    status = ExitStatus.from_wait_status(raw)
    assert (status.code, status.signal) == (code, signal)


@pytest.mark.parametrize(("text", "code", "signal"), [("3:0", 3, None), ("0:9", None, 9)])
def test_scontrol_exit_code_form(text: str, code: int, signal: int) -> None:
    status = ExitStatus.from_colon(text)
    assert (status.code, status.signal) == (code, signal)


def test_version_strings() -> None:
    assert str(parse_version((V22 / "sinfo_version.txt").read_text())) == "22.05.8"
    version = parse_version("slurm 24.11.1\n")
    assert (version.major, version.minor, version.micro) == (24, 11, 1)
    assert version.has_scontrol_json and not parse_version("slurm-wlm 22.05.8").has_scontrol_json
    with pytest.raises(SlurmParseError):
        parse_version("no version here")


# ---------------------------------------------------------------- squeue --json


@pytest.mark.parametrize(
    ("sample", "ids"),
    [
        (V22 / "squeue_held_nodefail.json", {"held": "1", "failed": "2", "killed": "3"}),
        (V24 / "squeue_mixed.json", {"held": "107", "failed": "102", "killed": "103"}),
    ],
)
def test_squeue_both_versions_give_the_same_model(sample: Path, ids: dict[str, str]) -> None:
    jobs = by_id(parse_squeue_json(sample.read_text()))
    held = jobs[ids["held"]]
    assert held.state == "PENDING" and held.is_held
    assert held.excluded_nodes == ["gpu01"]
    assert held.restarts == 1
    assert held.comment.startswith("trainmedic: incident-")
    assert held.tasks_per_node == 2
    failed = jobs[ids["failed"]]
    assert failed.is_finished and failed.exit == ExitStatus(code=3)
    assert failed.state_reason == "NonZeroExitCode"
    killed = jobs[ids["killed"]]
    assert killed.exit == ExitStatus(signal=9) and killed.exit.code is None


def test_squeue_2205_running_multinode_job() -> None:
    jobs = by_id(parse_squeue_json((V22 / "squeue_mixed.json").read_text()))
    job = jobs["1"]
    assert job.is_running and job.nodes == ["gpu01", "gpu02"]
    assert (job.node_count, job.tasks, job.tasks_per_node) == (2, 4, 2)
    assert job.partition == "gpu" and job.batch is True and job.requeue is True
    # 22.05 JSON keeps the pattern ('train-%j.out'); the model carries the real path.
    assert job.stdout_path == "/tmp/tmslurm/jobs/train-1.out"
    assert job.stderr_path == "/tmp/tmslurm/jobs/train-1.err"
    assert jobs["4"].requeue is False and jobs["4"].is_pending and not jobs["4"].is_held
    # array tasks are named <array>_<task>; default output file follows slurm-%A_%a.out
    assert jobs["5_0"].array_job_id == 5 and jobs["5_0"].numeric_id == 6
    assert jobs["5_0"].stdout_path == "/tmp/tmslurm/jobs/slurm-5_0.out"


def test_squeue_2205_node_fail_signal() -> None:
    jobs = by_id(parse_squeue_json((V22 / "squeue_held_nodefail.json").read_text()))
    node_fail = jobs["8"]
    assert node_fail.state == "NODE_FAIL" and node_fail.state_reason == "NodeDown"
    assert node_fail.exit == ExitStatus(signal=15)
    assert jobs["7"].exit is not None and jobs["7"].exit.success


def test_squeue_2411_state_list_and_wrapped_ints() -> None:
    jobs = by_id(parse_squeue_json((V24 / "squeue_mixed.json").read_text()))
    held = jobs["107"]
    assert held.state_flags == ["REQUEUE_HOLD"] and held.priority == 0
    running = jobs["101"]
    assert (running.node_count, running.tasks, running.tasks_per_node) == (2, 4, 2)
    assert running.nodes == ["gpu01", "gpu02"]
    assert jobs["104"].exit is None  # status PENDING: no exit yet
    assert jobs["105_0"].array_task_id == 0 and jobs["105_0"].numeric_id == 106
    assert jobs["108"].exit == ExitStatus(signal=15)
    assert jobs["109"].state == "OUT_OF_MEMORY" and jobs["109"].exit == ExitStatus(code=137)


def test_squeue_errors_array_means_controller_unreachable() -> None:
    with pytest.raises(SlurmUnavailable) as caught:
        parse_squeue_json((V22 / "squeue_unreachable.json").read_text())
    assert caught.value.retryable
    with pytest.raises(SlurmUnavailable):
        parse_sinfo_json((V22 / "sinfo_unreachable.json").read_text())


def test_not_json_is_a_parse_error() -> None:
    with pytest.raises(SlurmParseError):
        parse_squeue_json("slurm_load_jobs error: ...")
    with pytest.raises(SlurmParseError):
        parse_sinfo_json(json.dumps({"meta": {}, "errors": []}))


# ---------------------------------------------------------------- sinfo --json


@pytest.mark.parametrize("sample", [V22 / "sinfo_draining.json", V24 / "sinfo_draining.json"])
def test_sinfo_both_versions_drained_vs_draining(sample: Path) -> None:
    nodes = {node.name: node for node in parse_sinfo_json(sample.read_text())}
    assert nodes["gpu01"].is_available and nodes["gpu01"].state == "IDLE"
    assert nodes["gpu02"].is_draining and not nodes["gpu02"].is_drained
    assert nodes["gpu02"].state_text == "MIXED+DRAIN"
    assert "Xid 79" in (nodes["gpu02"].reason or "")
    assert nodes["gpu04"].is_drained and nodes["gpu04"].state_text == "IDLE+DRAIN"
    assert nodes["gpu03"].is_down and not nodes["gpu03"].is_available
    assert nodes["gpu03"].reason == "node fail test"


def test_sinfo_2411_merges_partitions_and_groups() -> None:
    nodes = {n.name: n for n in parse_sinfo_json((V24 / "sinfo_draining.json").read_text())}
    assert nodes["gpu04"].partitions == ["gpu", "debug"]
    assert nodes["gpu04"].is_drained  # the second entry does not undo the first
    assert "NOT_RESPONDING" in nodes["gpu03"].state_flags
    assert {"cpu01", "cpu02"} <= set(nodes) and nodes["cpu02"].partitions == ["cpu"]
    assert len(nodes) == 6  # each node once


def test_scontrol_json_node_shape_is_accepted() -> None:
    doc = {"nodes": [{"name": "gpu09", "state": ["IDLE", "DRAIN"], "reason": "x"}], "errors": []}
    (node,) = parse_sinfo_json(json.dumps(doc))
    assert node.is_drained and node.reason == "x"


# ---------------------------------------------------------------- scontrol -o


def test_scontrol_job_records() -> None:
    records = parse_scontrol_records((V22 / "scontrol_show_job.txt").read_text())
    jobs = by_id([job_from_scontrol(r) for r in records])
    held = jobs["1"]
    # the comment has spaces and 'key=value': it stays one field
    assert held.comment == "trainmedic: incident-tmtest-1-1 key=value drain gpu01"
    assert held.state_reason == "job_requeued_in_held_state" and held.is_held
    assert held.excluded_nodes == ["gpu01"] and held.restarts == 1
    assert held.stdout_path == "/tmp/tmslurm/jobs/train-1.out"
    assert held.stderr_path == "/tmp/tmslurm/jobs/train-1.err"
    assert held.tasks_per_node == 2 and held.user == "root"
    assert jobs["3"].exit == ExitStatus(signal=9)
    assert jobs["8"].state == "NODE_FAIL" and jobs["8"].nodes == ["gpu03"]
    assert jobs["5_1"].numeric_id == 5 and jobs["4"].requeue is False
    assert jobs["4"].node_count == 4  # NumNodes=4-4


def test_scontrol_node_records_strip_reason_stamp() -> None:
    records = parse_scontrol_records((V22 / "scontrol_show_node.txt").read_text())
    nodes = {n.name: n for n in (node_from_scontrol(r) for r in records)}
    assert nodes["gpu02"].state_text == "MIXED+DRAIN" and nodes["gpu02"].is_draining
    assert nodes["gpu02"].reason == "trainmedic incident-tmtest-5-1: Xid 79 on gpu02"
    assert nodes["gpu02"].reason_user == "root"
    assert nodes["gpu04"].is_drained and nodes["gpu01"].reason is None
    assert nodes["gpu01"].partitions == ["gpu"] and nodes["gpu01"].cpus == 4


@pytest.mark.parametrize(
    ("shown", "state", "held"),
    [
        ("REQUEUED", "PENDING", False),
        ("REQUEUE_HOLD", "PENDING", True),
        ("CONFIGURING", "RUNNING", False),
        ("COMPLETING", "COMPLETING", False),
    ],
)
def test_scontrol_job_flag_shown_as_state(shown: str, state: str, held: bool) -> None:
    # right after `scontrol requeue` 22.05 prints JobState=REQUEUED, not PENDING
    line = job_line("5").replace("JobState=RUNNING", f"JobState={shown}")
    job = job_from_scontrol(parse_scontrol_records(line)[0])
    assert (job.state, job.state_flags, job.is_held) == (state, [shown], held)
    assert not job.is_finished


def test_scontrol_not_responding_marker() -> None:
    (record,) = parse_scontrol_records("NodeName=n1 State=DOWN*+DRAIN Reason=gone [slurm@now]\n")
    node = node_from_scontrol(record)
    assert node.state == "DOWN" and set(node.state_flags) == {"NOT_RESPONDING", "DRAIN"}
    assert node.reason == "gone"


def test_expand_std_path_patterns() -> None:
    job = SlurmJob(
        job_id="7_3",
        numeric_id=9,
        array_job_id=7,
        array_task_id=3,
        name="t",
        user="alice",
        state="RUNNING",
        work_dir="/w",
        batch=True,
    )
    assert expand_std_path("/o/%x-%A_%a-%j.%u.%%.out", job) == "/o/t-7_3-9.alice.%.out"
    assert expand_std_path("/o/%5j.out", job) == "/o/00009.out"
    assert expand_std_path(None, job) == "/w/slurm-7_3.out"


# ---------------------------------------------------------------- error mapping


def captured_errors() -> list[dict[str, object]]:
    return json.loads((V22 / "errors.json").read_text())


@pytest.mark.parametrize("case", captured_errors(), ids=lambda c: str(c["stderr"])[:40])
def test_captured_messages_map_to_typed_errors(case: dict[str, object]) -> None:
    error = classify(case["argv"], case["rc"], str(case["stderr"]))  # type: ignore[arg-type]
    assert type(error).__name__ == case["error"]
    assert error.retryable == (case["error"] in {"SlurmUnavailable", "SlurmTimeout"})
    assert error.argv == case["argv"]


def test_unknown_message_is_a_non_retryable_command_failure() -> None:
    error = classify(["scontrol", "x"], 1, "something new\n")
    assert isinstance(error, SlurmCommandFailed) and not error.retryable
    assert isinstance(error, slurm_errors.SlurmError)


@pytest.mark.parametrize("bad", ["", "12a", "-1", "1_", "1 2", "1;rm", "_3"])
def test_job_ids_are_validated(bad: str) -> None:
    with pytest.raises(SlurmInvalidArgument):
        validate_job_id(bad)


# ---------------------------------------------------------------- adapter logic


class ScriptedRunner:
    """Answers argv prefixes with canned results and records every call."""

    def __init__(self, answers: dict[tuple[str, ...], list[CompletedCommand]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    async def run(self, argv: Sequence[str], timeout: float) -> CompletedCommand:
        self.calls.append(list(argv))
        assert timeout > 0
        for prefix, results in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return results.pop(0) if len(results) > 1 else results[0]
        raise AssertionError(f"unexpected command {argv}")


def done(argv: list[str], stdout: str = "", rc: int = 0, stderr: str = "") -> CompletedCommand:
    return CompletedCommand(argv=argv, returncode=rc, stdout=stdout, stderr=stderr)


def node_line(name: str) -> str:
    for line in (V22 / "scontrol_show_node.txt").read_text().splitlines():
        if line.startswith(f"NodeName={name} "):
            return line + "\n"
    raise AssertionError(name)


def job_line(job_id: str) -> str:
    for line in (V22 / "scontrol_show_job.txt").read_text().splitlines():
        if line.startswith(f"JobId={job_id} "):
            return line + "\n"
    raise AssertionError(job_id)


def test_protocols_are_satisfied() -> None:
    runner = ScriptedRunner({})
    assert isinstance(runner, CommandRunner)
    assert isinstance(SlurmCli(runner), SlurmBackend)


async def test_drain_of_a_drained_node_runs_no_update() -> None:
    runner = ScriptedRunner({("scontrol", "-o", "show", "node"): [done([], node_line("gpu04"))]})
    result = await SlurmCli(runner).drain_node("gpu04", "trainmedic incident-x: Xid 79")
    assert not result.changed and result.command == []
    assert "already drained" in result.detail and "ECC" in result.detail
    assert all(call[1] != "update" for call in runner.calls)


async def test_drain_builds_one_argv_with_the_reason() -> None:
    reason = "trainmedic incident-c-1-1: Xid 79 on gpu01"
    runner = ScriptedRunner(
        {
            ("scontrol", "-o", "show", "node"): [
                done([], node_line("gpu01")),
                done([], node_line("gpu01").replace("State=IDLE", "State=IDLE+DRAIN")),
            ],
            ("scontrol", "update"): [done([])],
        }
    )
    result = await SlurmCli(runner).drain_node("gpu01", reason)
    assert result.changed
    assert result.command == [
        "scontrol",
        "update",
        "NodeName=gpu01",
        "State=DRAIN",
        f"Reason={reason}",
    ]
    assert (result.before, result.after) == ("IDLE", "IDLE+DRAIN")


async def test_resume_leaves_someone_elses_drain_alone() -> None:
    runner = ScriptedRunner({("scontrol", "-o", "show", "node"): [done([], node_line("gpu04"))]})
    result = await SlurmCli(runner).resume_node("gpu04", only_if_reason_contains="incident-zzz")
    assert not result.changed and "does not mention" in result.detail


async def test_requeue_refuses_a_no_requeue_job_before_calling_slurm() -> None:
    # job 4 is pending with Requeue=0: pending short-circuits; a running no-requeue job raises
    line = job_line("4").replace("JobState=PENDING", "JobState=RUNNING")
    runner = ScriptedRunner({("scontrol", "-o", "show", "job"): [done([], line)]})
    with pytest.raises(JobNotRequeueable):
        await SlurmCli(runner).requeue("4")
    assert all(call[1] != "requeue" for call in runner.calls)


async def test_requeue_of_a_pending_job_is_a_no_op() -> None:
    runner = ScriptedRunner({("scontrol", "-o", "show", "job"): [done([], job_line("1"))]})
    result = await SlurmCli(runner).requeue("1", hold=True)
    assert not result.changed and "already pending" in result.detail


async def test_cancel_of_a_finished_job_is_a_no_op() -> None:
    runner = ScriptedRunner({("scontrol", "-o", "show", "job"): [done([], job_line("7"))]})
    result = await SlurmCli(runner).cancel("7")
    assert not result.changed and "COMPLETED" in result.detail


async def test_scancel_error_on_stderr_with_exit_zero_is_raised() -> None:
    runner = ScriptedRunner(
        {
            ("scontrol", "-o", "show", "job"): [done([], job_line("5"))],
            ("scancel",): [
                done(
                    [],
                    "",
                    0,
                    "scancel: error: Kill job error on job id 5: Invalid job id specified\n",
                )
            ],
        }
    )
    with pytest.raises(NoSuchJob):
        await SlurmCli(runner).cancel("5")


async def test_exclude_nodes_keeps_existing_exclusions() -> None:
    runner = ScriptedRunner(
        {
            ("scontrol", "-o", "show", "job"): [
                done([], job_line("1")),
                done([], job_line("1").replace("ExcNodeList=gpu01", "ExcNodeList=gpu[01,03]")),
            ],
            ("scontrol", "update"): [done([])],
        }
    )
    result = await SlurmCli(runner).exclude_nodes("1", ["gpu01", "gpu03"])
    assert result.changed
    assert result.command == ["scontrol", "update", "JobId=1", "ExcNodeList=gpu01,gpu03"]
    assert result.after == "gpu01,gpu03"


async def test_failed_command_raises_the_classified_error() -> None:
    runner = ScriptedRunner(
        {
            ("scontrol", "-o", "show", "job"): [
                done(
                    [],
                    "",
                    1,
                    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
                )
            ]
        }
    )
    with pytest.raises(SlurmUnavailable) as caught:
        await SlurmCli(runner).get_job("12")
    assert caught.value.retryable and caught.value.returncode == 1


@pytest.mark.parametrize("reason", ["", "two\nlines", "x" * 2000])
async def test_bad_drain_reasons_are_refused_before_any_command(reason: str) -> None:
    runner = ScriptedRunner({})
    with pytest.raises(SlurmInvalidArgument):
        await SlurmCli(runner).drain_node("gpu01", reason)
    assert runner.calls == []


async def test_bad_node_names_are_refused() -> None:
    runner = ScriptedRunner({})
    with pytest.raises(SlurmInvalidArgument):
        await SlurmCli(runner).get_node("-gpu01")
    assert runner.calls == []


def test_required_nodes_from_both_shapes() -> None:
    """ReqNodeList (sbatch -w): planning must not exclude a node the job requires."""
    record = parse_scontrol_records(
        job_line("1").replace("ReqNodeList=(null)", "ReqNodeList=gpu[02-03]")
    )[0]
    assert job_from_scontrol(record).required_nodes == ["gpu02", "gpu03"]
    unpinned = parse_scontrol_records(job_line("1"))[0]
    assert job_from_scontrol(unpinned).required_nodes == []
