"""The push paths beside the poll: Slurm's epilog (`trainmedic report`) and `strigger`.

Both write a small JSON report into a spool directory, atomically (a temporary name in
the same directory, then rename), and return: an epilog must be fast and must never
fail (a failing slurmd Epilog drains the node). The controller's `EpilogSpool` polls
the directory every 0.5 s, turns each report into a signal for the router and deletes
the file. The spool is plain files on purpose: nothing to connect to from an epilog,
nothing lost while the controller restarts.

Where the reports come from (Slurm's "Prolog and Epilog Guide"):
- `EpilogSlurmctld` runs on the controller host at job end with SLURM_JOB_ID,
  SLURM_JOB_NODELIST, SLURM_JOB_EXIT_CODE (a wait status), SLURM_JOB_EXIT_CODE2
  ("exit:signal"), SLURM_JOB_DERIVED_EC and SLURM_SCRIPT_CONTEXT=epilog_slurmctld: the
  recommended place, since trainmedic runs there and the spool is local.
- `Epilog` (slurmd) runs on each compute node with SLURM_JOB_ID, SLURMD_NODENAME and
  SLURM_JOB_NODELIST, but without the job's exit code: the spool must then be on
  storage the controller sees, and the controller asks Slurm for the exit status.
- `strigger --set --node --down|--fail --program=P --flags=PERM` runs P with the node
  list as its argument when nodes go down/fail (within ~15 s): a backstop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from trainmedic.adapters.slurm.errors import SlurmError
from trainmedic.adapters.slurm.protocol import CommandRunner, CompletedCommand, SlurmBackend
from trainmedic.domain.diagnosis import Evidence
from trainmedic.domain.enums import EvidenceSource
from trainmedic.domain.hostlist import HostlistError, expand
from trainmedic.domain.incident import IncidentSignal
from trainmedic.domain.slurm import ExitStatus
from trainmedic.watchers.base import SignalSink
from trainmedic.watchers.slurm import FAILED_JOB_KINDS

logger = logging.getLogger(__name__)

ReportKind = Literal["epilog", "node_down", "node_failed"]


def spool_dir(state_dir: Path) -> Path:
    return state_dir / "spool" / "reports"


class PushReport(BaseModel):
    """One report written by `trainmedic report` (an epilog or a trigger)."""

    kind: ReportKind = "epilog"
    job_id: str | None = None
    nodes: list[str] = Field(default_factory=list)
    exit_code: int | None = None
    signal: int | None = None
    restart_count: int | None = None
    context: str | None = None  # SLURM_SCRIPT_CONTEXT: epilog_slurmd / epilog_slurmctld
    detail: str = ""
    host: str = ""
    at: datetime

    @property
    def exit(self) -> ExitStatus | None:
        if self.signal:
            return ExitStatus(code=None, signal=self.signal)
        if self.exit_code is not None:
            return ExitStatus(code=self.exit_code, signal=None)
        return None


def _int(value: str | None) -> int | None:
    value = (value or "").strip()
    return int(value) if value.isdigit() else None


def _nodes(value: str | None) -> list[str]:
    value = (value or "").strip()
    if not value or value == "(null)":
        return []
    try:
        return expand(value)
    except HostlistError:
        return [value]


def report_from_env(
    env: Mapping[str, str],
    *,
    kind: ReportKind = "epilog",
    job_id: str | None = None,
    nodes: Sequence[str] = (),
    exit_code: int | None = None,
    signal: int | None = None,
    restart_count: int | None = None,
    detail: str = "",
) -> PushReport:
    """A report from what Slurm put in the environment; explicit values win."""
    code, sig = exit_code, signal
    if code is None and sig is None:
        if env.get("SLURM_JOB_EXIT_CODE2"):
            status = ExitStatus.from_colon(env["SLURM_JOB_EXIT_CODE2"])
            code, sig = status.code, status.signal
        elif _int(env.get("SLURM_JOB_EXIT_CODE")) is not None:
            status = ExitStatus.from_wait_status(_int(env.get("SLURM_JOB_EXIT_CODE")) or 0)
            code, sig = status.code, status.signal
    names = list(nodes)
    if not names:
        # The slurmd epilog speaks for its own node; the ctld one for the whole job.
        names = _nodes(env.get("SLURMD_NODENAME")) or _nodes(env.get("SLURM_JOB_NODELIST"))
    return PushReport(
        kind=kind,
        job_id=job_id or env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None,
        nodes=names,
        exit_code=code,
        signal=sig,
        restart_count=(
            restart_count if restart_count is not None else _int(env.get("SLURM_RESTART_COUNT"))
        ),
        context=env.get("SLURM_SCRIPT_CONTEXT"),
        detail=detail,
        host=socket.gethostname(),
        at=datetime.now(UTC),
    )


def write_report(report: PushReport, folder: Path) -> Path:
    """Atomically add one report to the spool (readers never see half a file)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns()}-{report.job_id or 'node'}-{uuid.uuid4().hex[:8]}.json"
    tmp = folder / f".{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(report.model_dump_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, folder / name)
    return folder / name


def signal_from_report(report: PushReport) -> IncidentSignal:
    exit_status = report.exit
    if report.kind == "epilog":
        text = (
            f"epilog: job {report.job_id} ended exit_code="
            f"{exit_status.code if exit_status else None} "
            f"signal={exit_status.signal if exit_status else None} on {','.join(report.nodes)}"
        )
    else:
        text = f"strigger: {report.kind} {','.join(report.nodes)}"
    return IncidentSignal(
        source="epilog" if report.kind == "epilog" else "strigger",
        kind=report.kind,
        job_id=report.job_id,
        nodes=report.nodes,
        at=report.at,
        detail=report.detail or text,
        evidence=[
            Evidence(
                source=EvidenceSource.SLURM,
                text=text,
                node=report.nodes[0] if len(report.nodes) == 1 else None,
            )
        ],
        run=report.restart_count,
    )


class EpilogSpool:
    """Reads the spool every `interval` seconds and submits its reports as signals.

    An epilog report of a job that succeeded is dropped: with the exit status in the
    report (EpilogSlurmctld) directly, otherwise after one `get_job` (slurmd Epilog).
    """

    def __init__(
        self,
        folder: Path,
        sink: SignalSink,
        *,
        backend: SlurmBackend | None = None,
        interval: float = 0.5,
    ) -> None:
        self.folder = folder
        self.sink = sink
        self.backend = backend
        self.interval = interval
        self.submitted = 0
        self.dropped = 0

    def pending(self) -> list[Path]:
        try:
            return sorted(p for p in self.folder.glob("*.json") if not p.name.startswith("."))
        except OSError:
            return []

    async def drain_once(self) -> list[IncidentSignal]:
        signals: list[IncidentSignal] = []
        for path in self.pending():
            try:
                report = PushReport.model_validate_json(path.read_bytes())
            except (OSError, ValidationError, ValueError) as error:
                logger.warning("spool: unreadable report %s (%s); set aside", path.name, error)
                bad = self.folder / "bad"
                bad.mkdir(exist_ok=True)
                with contextlib.suppress(OSError):
                    os.replace(path, bad / path.name)
                continue
            if await self._is_failure(report):
                signal = signal_from_report(report)
                try:
                    await self.sink.submit(signal)
                except Exception:
                    logger.exception("spool: sink failed; report %s kept for retry", path.name)
                    continue
                signals.append(signal)
                self.submitted += 1
            else:
                self.dropped += 1
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return signals

    async def _is_failure(self, report: PushReport) -> bool:
        if report.kind != "epilog":
            return True
        status = report.exit
        if status is None and self.backend is not None and report.job_id:
            try:
                job = await self.backend.get_job(report.job_id)
            except SlurmError as error:
                logger.info("spool: job %s not readable (%s); reported", report.job_id, error)
                return True
            if report.restart_count is None:
                report.restart_count = job.restarts
            if job.state in FAILED_JOB_KINDS:
                return True
            status = job.exit
        if status is not None and status.success:
            logger.debug("spool: job %s ended with exit 0; not a failure", report.job_id)
            return False
        return True

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        logger.info("epilog spool at %s every %.1f s", self.folder, self.interval)
        while not stop.is_set():
            try:
                await self.drain_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("spool: read failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval)


# ----------------------------------------------------------------------------- strigger


async def registered_triggers(runner: CommandRunner, timeout: float = 10.0) -> str:
    result = await runner.run(["strigger", "--get", "--node"], timeout)
    return result.stdout if result.returncode == 0 else ""


async def register_node_triggers(
    runner: CommandRunner,
    down_program: Path,
    fail_program: Path | None = None,
    *,
    timeout: float = 10.0,
) -> list[CompletedCommand]:
    """Register (once) permanent node-down (and node-fail) triggers.

    strigger needs SlurmUser (or root); a trigger with the same program already there
    is kept, so calling this at every start is harmless. PERM keeps a trigger after it
    fires (otherwise Slurm purges it).
    """
    existing = await registered_triggers(runner, timeout)
    done: list[CompletedCommand] = []
    for event, program in (("--down", down_program), ("--fail", fail_program)):
        if program is None:
            continue
        if any(str(program) in line for line in existing.splitlines()):
            logger.info("strigger: %s trigger for %s already there", event, program)
            continue
        argv = ["strigger", "--set", "--node", event, f"--program={program}", "--flags=PERM"]
        result = await runner.run(argv, timeout)
        if result.returncode != 0:
            logger.warning("strigger %s failed: %s", event, result.stderr.strip())
        done.append(result)
    return done


def trigger_script(trainmedic_bin: str, state_dir: Path, kind: str = "node-down") -> str:
    """The program strigger runs: Slurm passes the node list as the first argument."""
    return (
        "#!/bin/sh\n"
        "# Registered by trainmedic with strigger; must return fast and never fail.\n"
        f'TRAINMEDIC_STATE_DIR="{state_dir}" exec "{trainmedic_bin}" report --{kind} '
        '--nodes "$1" >/dev/null 2>&1 || exit 0\n'
    )


def install_trigger_scripts(folder: Path, trainmedic_bin: str, state_dir: Path) -> dict[str, Path]:
    """Write the down/fail trigger programs into `folder` (executable)."""
    folder.mkdir(parents=True, exist_ok=True)
    scripts: dict[str, Path] = {}
    for kind in ("node-down", "node-fail"):
        path = folder / f"trainmedic-{kind}.sh"
        path.write_text(trigger_script(trainmedic_bin, state_dir, kind))
        path.chmod(0o755)
        scripts[kind] = path
    return scripts
