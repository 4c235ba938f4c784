"""The push paths beside the poll: Slurm's epilog (`trainmedic report`) and `strigger`.

Both write a small JSON report into a spool directory, atomically and durably
(`spoolfile.write_spool_file`), and return: an epilog must be fast and must never fail
(a failing slurmd Epilog drains the node). The controller's `EpilogSpool` polls the
directory every 0.5 s, turns each report into a signal for the router and deletes the
file once the router took it (a report stays while Temporal is down). The spool is plain
files on purpose: nothing to connect to from an epilog, nothing lost while the
controller restarts. Who may write there, and what is refused, is `spoolfile`'s
business; a report's content is checked here (`report_problems`), and a node-down or
node-fail report only counts once Slurm confirms the node is down.

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
import re
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from trainmedic.adapters.slurm.errors import NoSuchNode, SlurmError
from trainmedic.adapters.slurm.protocol import CommandRunner, CompletedCommand, SlurmBackend
from trainmedic.domain.diagnosis import Evidence
from trainmedic.domain.enums import EvidenceSource
from trainmedic.domain.hostlist import HostlistError, expand, validate_node_name
from trainmedic.domain.incident import IncidentSignal
from trainmedic.domain.slurm import ExitStatus, SlurmNode
from trainmedic.watchers.base import SignalSink
from trainmedic.watchers.slurm import FAILED_JOB_KINDS
from trainmedic.watchers.spoolfile import (
    SpoolDir,
    SpoolItem,
    SpoolPolicy,
    SpoolRefused,
    SpoolRetry,
    safe_name,
    write_spool_file,
)

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


# A job id as Slurm prints it: "42", an array task "42_7", a het component "42+1".
JOB_ID = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,9}|\+[0-9]{1,4})?$")
MAX_NODES = 100_000
MAX_DETAIL = 2000
PURPOSE = "report"  # what spool signatures bind a report file to


def valid_job_id(job_id: str) -> bool:
    return bool(JOB_ID.match(job_id))


def parse_nodes(expr: str) -> list[str]:
    """A hostlist from an epilog or strigger argument; HostlistError says what is wrong.

    Only hostlist characters get through: a shell metacharacter, a space or a control
    character in a node list is never a node, whatever the expansion would make of it.
    """
    if len(expr) > 65536:
        raise HostlistError("node list longer than 64 KiB")
    odd = sorted({c for c in expr if not (c.isascii() and (c.isalnum() or c in "[]-_.,"))})
    if odd:
        shown = ", ".join(repr(c) for c in odd[:8])
        raise HostlistError(f"node list {expr[:80]!r} has characters no hostlist has: {shown}")
    return expand(expr, limit=MAX_NODES)


def clean_detail(text: str) -> str:
    """Free text for an incident: no control characters, bounded."""
    text = "".join(c if c.isprintable() else " " for c in text)
    return text[:MAX_DETAIL]


def report_problems(report: PushReport) -> list[str]:
    """What makes a report garbage (empty when it is fine): checked before spooling and
    again when read, since a spool file may not come from `trainmedic report`."""
    problems: list[str] = []
    if report.job_id is not None and not valid_job_id(report.job_id):
        problems.append(f"job id {report.job_id[:40]!r} is not N, N_M or N+M")
    if report.kind == "epilog" and report.job_id is None:
        problems.append("an epilog report needs a job id")
    if report.kind != "epilog" and not report.nodes:
        problems.append(f"a {report.kind} report needs nodes")
    if len(report.nodes) > MAX_NODES:
        problems.append(f"more than {MAX_NODES} nodes")
    for node in report.nodes[:MAX_NODES]:
        try:
            validate_node_name(node)
        except HostlistError as error:
            problems.append(str(error))
            break
    if len(report.detail) > MAX_DETAIL or any(not c.isprintable() for c in report.detail):
        problems.append("detail has control characters or is too long")
    for name, value in (("exit code", report.exit_code), ("signal", report.signal)):
        if value is not None and not 0 <= value <= 255:
            problems.append(f"{name} {value} out of range")
    if report.restart_count is not None and report.restart_count < 0:
        problems.append("negative restart count")
    return problems


def write_report(report: PushReport, folder: Path, *, key: bytes | None = None) -> Path:
    """Atomically and durably add one report to the spool (readers never see half a file)."""
    name = f"{time.time_ns()}-{safe_name(report.job_id or 'node')}-{uuid.uuid4().hex[:8]}.json"
    return write_spool_file(
        folder, name, report.model_dump_json().encode(), key=key, purpose=PURPOSE
    )


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
    A node-down/node-fail report counts only for the nodes Slurm says are down (with a
    backend; without one, as the lab's unit tests run, it is taken as is). A report the
    router could not deliver stays in the spool for the next cycle.
    """

    def __init__(
        self,
        folder: Path,
        sink: SignalSink,
        *,
        backend: SlurmBackend | None = None,
        interval: float = 0.5,
        policy: SpoolPolicy | None = None,
    ) -> None:
        self.folder = folder
        self.sink = sink
        self.backend = backend
        self.interval = interval
        # Epilog reports are written on the controller's host by slurmctld's epilog:
        # the owner check is the guard; a key is used only when one is passed.
        self.spool = SpoolDir(
            folder,
            policy if policy is not None else SpoolPolicy.from_env(signed=False),
            purpose=PURPOSE,
            label="epilog spool",
        )
        self.submitted = 0
        self.dropped = 0
        self._signals: list[IncidentSignal] = []

    def pending(self) -> list[Path]:
        return [self.folder / name for name in self.spool.names()]

    async def drain_once(self) -> list[IncidentSignal]:
        self._signals = []
        await self.spool.drain(self._handle)
        return self._signals

    async def _handle(self, item: SpoolItem) -> bool:
        try:
            report = PushReport.model_validate_json(item.payload)
        except (ValidationError, ValueError) as error:
            raise SpoolRefused("malformed", _short(error)) from error
        problems = report_problems(report)
        if problems:
            raise SpoolRefused("malformed", "; ".join(problems[:4]))
        if report.kind == "epilog":
            if not await self._is_failure(report):
                self.dropped += 1
                return False
        else:
            confirmed = await self._confirm_down(report)
            if confirmed is None:
                self.dropped += 1
                return False
            report = confirmed
        signal = signal_from_report(report)
        await self.sink.submit(signal)  # DeliveryError: the spool keeps the file
        self._signals.append(signal)
        self.submitted += 1
        return True

    async def _confirm_down(self, report: PushReport) -> PushReport | None:
        """The report with only the nodes Slurm shows down; None when none is."""
        if self.backend is None:
            return report
        try:
            if len(report.nodes) <= 4:
                found: list[SlurmNode] = []
                for name in report.nodes:
                    with contextlib.suppress(NoSuchNode):
                        found.append(await self.backend.get_node(name))
            else:
                wanted = set(report.nodes)
                found = [n for n in await self.backend.list_nodes() if n.name in wanted]
        except SlurmError as error:
            raise SpoolRetry(f"cannot confirm {report.kind} with Slurm: {error}") from error
        down = {n.name for n in found if n.is_down or "NOT_RESPONDING" in n.state_flags}
        kept = [name for name in report.nodes if name in down]
        if len(kept) < len(report.nodes):
            logger.warning(
                "spool: %s report names nodes Slurm does not show down: %s; not counted",
                report.kind,
                ",".join(n for n in report.nodes if n not in down)[:200],
            )
        if not kept:
            return None
        return report.model_copy(update={"nodes": kept})

    async def _is_failure(self, report: PushReport) -> bool:
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
            except Exception:  # a spool that stops reading loses every later report
                logger.exception("spool: read failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval)


def _short(error: Exception, limit: int = 300) -> str:
    return " ".join(str(error).split())[:limit]


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
