"""The push paths: `trainmedic report` (epilog/strigger) -> spool -> signals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainmedic.adapters.slurm.errors import NoSuchJob
from trainmedic.adapters.slurm.protocol import CompletedCommand
from trainmedic.domain.slurm import ExitStatus, SlurmJob, SlurmNode
from trainmedic.watchers.base import ListSink
from trainmedic.watchers.epilog import (
    EpilogSpool,
    register_node_triggers,
    report_from_env,
    write_report,
)

CTLD_ENV = {
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_NODELIST": "gpu[01-02]",
    "SLURM_JOB_EXIT_CODE2": "3:0",
    "SLURM_JOB_EXIT_CODE": "768",
    "SLURM_RESTART_COUNT": "1",
    "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld",
}


def test_report_from_the_slurmctld_epilog_environment() -> None:
    report = report_from_env(CTLD_ENV)
    assert (report.job_id, report.nodes, report.exit, report.restart_count) == (
        "42",
        ["gpu01", "gpu02"],
        ExitStatus(code=3),
        1,
    )
    assert report.context == "epilog_slurmctld"


def test_report_from_a_wait_status_and_a_slurmd_epilog() -> None:
    killed = report_from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_EXIT_CODE": "9"})
    assert killed.exit == ExitStatus(signal=9)
    slurmd = report_from_env(
        {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "gpu03", "SLURM_JOB_NODELIST": "gpu[03-04]"}
    )
    assert (slurmd.nodes, slurmd.exit) == (["gpu03"], None)
    assert report_from_env(CTLD_ENV, exit_code=0).exit == ExitStatus(code=0)


class Jobs:
    def __init__(self, jobs: dict[str, SlurmJob], down: tuple[str, ...] = ("gpu04",)) -> None:
        self.jobs = jobs
        self.down = down

    async def get_job(self, job_id: str) -> SlurmJob:
        if job_id not in self.jobs:
            raise NoSuchJob(job_id)
        return self.jobs[job_id]

    async def get_node(self, name: str) -> SlurmNode:
        # strigger reports are confirmed with Slurm before they count.
        return SlurmNode(name=name, state="DOWN" if name in self.down else "IDLE")


async def test_spool_turns_failures_into_signals_and_drops_successes(tmp_path: Path) -> None:
    write_report(report_from_env(CTLD_ENV), tmp_path)
    write_report(report_from_env({**CTLD_ENV, "SLURM_JOB_ID": "43"}, exit_code=0), tmp_path)
    # slurmd epilog: no exit status in the environment; Slurm is asked.
    write_report(report_from_env({"SLURM_JOB_ID": "44", "SLURMD_NODENAME": "gpu03"}), tmp_path)
    write_report(report_from_env({"SLURM_JOB_ID": "45", "SLURMD_NODENAME": "gpu04"}), tmp_path)
    write_report(report_from_env({}, kind="node_down", nodes=["gpu04"]), tmp_path)
    (tmp_path / "garbage.json").write_text("{not json")
    backend = Jobs(
        {
            "44": SlurmJob(job_id="44", state="COMPLETED", exit=ExitStatus(code=0)),
            "45": SlurmJob(job_id="45", state="FAILED", exit=ExitStatus(code=1), restarts=2),
        }
    )
    sink = ListSink()
    spool = EpilogSpool(tmp_path, sink, backend=backend)  # type: ignore[arg-type]
    await spool.drain_once()
    got = sorted((s.kind, s.source, s.job_id, s.run) for s in sink.signals if s.job_id)
    assert got == [("epilog", "epilog", "42", 1), ("epilog", "epilog", "45", 2)]
    node = [s for s in sink.signals if not s.job_id]
    assert [(s.kind, s.source, s.nodes) for s in node] == [("node_down", "strigger", ["gpu04"])]
    assert spool.pending() == []  # all consumed
    assert (tmp_path / "bad" / "garbage.json").exists()
    await spool.drain_once()
    assert len(sink.signals) == 3  # nothing twice


# `trainmedic report` as the command itself (main.py mounts it with the same register()).
CLI = [
    sys.executable,
    "-c",
    "import typer; from trainmedic.cli.report import register; app = typer.Typer(); "
    "register(app); app.callback()(lambda: None); app()",
]


def test_cli_exits_zero_and_spools(tmp_path: Path) -> None:
    env = {**os.environ, **CTLD_ENV, "TRAINMEDIC_STATE_DIR": str(tmp_path)}
    done = subprocess.run(
        [*CLI, "report", "--detail", "from test"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    files = list((tmp_path / "spool" / "reports").glob("*.json"))
    assert len(files) == 1
    assert '"job_id":"42"' in files[0].read_text()
    # An unwritable spool: still exit 0, and says why on stderr.
    bad = subprocess.run(
        [*CLI, "report", "--spool", "/proc/none"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 0
    assert "not delivered" in bad.stderr


class Recorder:
    def __init__(self, existing: str = "") -> None:
        self.existing = existing
        self.argvs: list[list[str]] = []

    async def run(self, argv: list[str], timeout: float) -> CompletedCommand:
        self.argvs.append(list(argv))
        out = self.existing if "--get" in argv else ""
        return CompletedCommand(argv=list(argv), returncode=0, stdout=out)


async def test_strigger_registration_is_idempotent(tmp_path: Path) -> None:
    down, fail = tmp_path / "down.sh", tmp_path / "fail.sh"
    fresh = Recorder()
    await register_node_triggers(fresh, down, fail)  # type: ignore[arg-type]
    sets = [a for a in fresh.argvs if "--set" in a]
    assert sets == [
        ["strigger", "--set", "--node", "--down", f"--program={down}", "--flags=PERM"],
        ["strigger", "--set", "--node", "--fail", f"--program={fail}", "--flags=PERM"],
    ]
    again = Recorder(existing=f"  1 node * down {down}\n  2 node * fail {fail}\n")
    await register_node_triggers(again, down, fail)  # type: ignore[arg-type]
    assert [a for a in again.argvs if "--set" in a] == []
