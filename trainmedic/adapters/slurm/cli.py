"""`SlurmBackend` over Slurm's command-line clients (squeue, sinfo, scontrol, scancel).

Every effect first re-reads the job or node, so that doing it twice is harmless and the
result says what was found (docs/architecture.md "Modes and safety rails").
The exact argv of each command is returned in `EffectResult.command` for the audit trail.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Literal

from trainmedic.adapters.slurm.errors import (
    JobNotRequeueable,
    JobStateConflict,
    NoSuchJob,
    NoSuchNode,
    SlurmError,
    SlurmInvalidArgument,
    classify,
)
from trainmedic.adapters.slurm.parse import (
    job_from_scontrol,
    node_from_scontrol,
    parse_scontrol_records,
    parse_sinfo_json,
    parse_squeue_json,
    parse_version,
)
from trainmedic.adapters.slurm.protocol import CommandRunner, CompletedCommand
from trainmedic.domain.hostlist import HostlistError, validate_node_name
from trainmedic.domain.slurm import EffectResult, SlurmJob, SlurmNode, SlurmVersion

log = logging.getLogger(__name__)

JOB_ID = re.compile(r"^[0-9]{1,10}(?:_[0-9]{1,10})?$")
# Reasons and comments travel as one argv element, so no shell quoting is involved; we
# still refuse control characters (they break scontrol's one-line output) and cap length.
_MAX_TEXT = 1000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_job_id(job_id: str) -> str:
    job_id = str(job_id)
    if not JOB_ID.match(job_id):
        raise SlurmInvalidArgument(f"invalid job id {job_id!r} (digits, optionally _<index>)")
    return job_id


def _validate_node(name: str) -> str:
    try:
        return validate_node_name(name)
    except HostlistError as exc:
        raise SlurmInvalidArgument(str(exc)) from exc


def _validate_text(what: str, text: str, *, allow_empty: bool = False) -> str:
    if not allow_empty and not text.strip():
        raise SlurmInvalidArgument(f"{what} must not be empty")
    if _CONTROL.search(text):
        raise SlurmInvalidArgument(f"{what} must be one line without control characters")
    if len(text) > _MAX_TEXT:
        raise SlurmInvalidArgument(f"{what} is longer than {_MAX_TEXT} characters")
    return text


class SlurmCli:
    """The command-line `SlurmBackend`. `timeout` bounds each command, in seconds."""

    def __init__(
        self,
        runner: CommandRunner,
        *,
        timeout: float = 45.0,
        settle_timeout: float = 60.0,
        poll_interval: float = 0.5,
    ) -> None:
        self._runner = runner
        self._timeout = timeout
        # how long a composite effect waits for a requeued job to be PENDING again
        self._settle_timeout = settle_timeout
        self._poll_interval = poll_interval
        self._version: SlurmVersion | None = None

    # ------------------------------------------------------------------ plumbing

    async def _run(self, argv: list[str], *, check_stderr_errors: bool = False) -> CompletedCommand:
        result = await self._runner.run(argv, self._timeout)
        # scancel exits 0 for an unknown job and only says so on stderr ("error: ...").
        failed = result.returncode != 0 or (
            check_stderr_errors and "error:" in result.stderr.lower()
        )
        if failed:
            error = classify(argv, result.returncode, result.stderr or result.stdout)
            log.info("slurm command failed: %s -> %s", argv, type(error).__name__)
            raise error
        return result

    async def version(self) -> SlurmVersion:
        if self._version is None:
            result = await self._run(["sinfo", "--version"])
            self._version = parse_version(result.stdout or result.stderr)
        return self._version

    # ------------------------------------------------------------------ reads

    async def list_jobs(self) -> list[SlurmJob]:
        # 24.11 applies squeue's default state filter to --json too, so a job that just
        # FAILED would be missing; --states=all keeps it (22.05 ignores filters with --json).
        result = await self._run(["squeue", "--json", "--states=all"])
        return parse_squeue_json(result.stdout)

    async def get_job(self, job_id: str) -> SlurmJob:
        job_id = validate_job_id(job_id)
        argv = ["scontrol", "-o", "show", "job", job_id]
        result = await self._run(argv)
        jobs = [job_from_scontrol(r) for r in parse_scontrol_records(result.stdout)]
        for job in jobs:
            if job.job_id == job_id:
                return job
        for job in jobs:  # a plain id of an array task prints as <array>_<task>
            if str(job.numeric_id) == job_id:
                return job
        raise NoSuchJob(f"{' '.join(argv)}: job {job_id} not in the output", argv=argv)

    async def list_nodes(self) -> list[SlurmNode]:
        result = await self._run(["sinfo", "--json"])
        return parse_sinfo_json(result.stdout)

    async def get_node(self, name: str) -> SlurmNode:
        name = _validate_node(name)
        argv = ["scontrol", "-o", "show", "node", name]
        result = await self._run(argv)
        for record in parse_scontrol_records(result.stdout):
            node = node_from_scontrol(record)
            if node.name == name:
                return node
        raise NoSuchNode(f"{' '.join(argv)}: node {name} not in the output", argv=argv)

    async def nodes_of_job(self, job_id: str) -> list[SlurmNode]:
        job = await self.get_job(job_id)
        if not job.nodes:
            return []
        known = {node.name: node for node in await self.list_nodes()}
        return [known[n] if n in known else await self.get_node(n) for n in job.nodes]

    # ------------------------------------------------------------------ node effects

    async def drain_node(self, name: str, reason: str) -> EffectResult:
        return await self._set_node_state(name, "DRAIN", reason)

    async def down_node(self, name: str, reason: str) -> EffectResult:
        """Mark a dead node DOWN. A drained dead node keeps its jobs COMPLETING until
        Slurm's own SlurmdTimeout (seen in the lab with 300 s); DOWN is what Slurm does
        then, and it requeues the node's batch jobs at once."""
        return await self._set_node_state(name, "DOWN", reason)

    async def _set_node_state(
        self, name: str, state: Literal["DRAIN", "DOWN"], reason: str
    ) -> EffectResult:
        """DRAIN or DOWN with a reason, idempotent: a node already there keeps its reason."""
        name = _validate_node(name)
        reason = _validate_text(f"{state.lower()} reason", reason)
        node = await self.get_node(name)
        already = node.already(state)
        if already:
            return EffectResult(
                changed=False,
                detail=f"{name} already {already} (reason: {node.reason or 'none'}); reason kept",
                before=node.state_text,
                after=node.state_text,
            )
        argv = ["scontrol", "update", f"NodeName={name}", f"State={state}", f"Reason={reason}"]
        await self._run(argv)
        after = await self.get_node(name)
        done = "set to drain" if state == "DRAIN" else "set DOWN"
        return EffectResult(
            command=argv,
            changed=True,
            detail=f"{name} {done}: {reason}",
            before=node.state_text,
            after=after.state_text,
        )

    async def resume_node(
        self, name: str, *, only_if_reason_contains: str | None = None, only_if_ours: bool = False
    ) -> EffectResult:
        """Undo a drain/down. With `only_if_reason_contains`, a node drained by someone
        else (whose reason lacks that text, e.g. the incident id) is left alone; with
        `only_if_ours`, so is a node whose reason is not trainmedic's (`is_ours`)."""
        name = _validate_node(name)
        node = await self.get_node(name)
        if not node.is_out:
            return EffectResult(
                changed=False,
                detail=f"{name} is not drained or down ({node.state_text})",
                before=node.state_text,
                after=node.state_text,
            )
        if only_if_reason_contains and only_if_reason_contains not in (node.reason or ""):
            return EffectResult(
                changed=False,
                detail=(
                    f"{name} left {node.state_text}: its reason {node.reason!r} does not "
                    f"mention {only_if_reason_contains!r}"
                ),
                before=node.state_text,
                after=node.state_text,
            )
        if only_if_ours and not node.is_ours:
            return EffectResult(
                changed=False,
                detail=(
                    f"{name} left {node.state_text}: its reason {node.reason!r} is not trainmedic's"
                ),
                before=node.state_text,
                after=node.state_text,
            )
        argv = ["scontrol", "update", f"NodeName={name}", "State=RESUME"]
        await self._run(argv)
        after = await self.get_node(name)
        return EffectResult(
            command=argv,
            changed=True,
            detail=f"{name} resumed (was {node.state_text}, reason {node.reason!r})",
            before=node.state_text,
            after=after.state_text,
        )

    # ------------------------------------------------------------------ job effects

    @staticmethod
    def _job_state(job: SlurmJob) -> str:
        held = " held" if job.is_held else ""
        reason = f" ({job.state_reason})" if job.state_reason else ""
        return f"{job.state}{held}{reason}"

    async def _after(self, job_id: str) -> str | None:
        try:
            return self._job_state(await self.get_job(job_id))
        except SlurmError:  # the effect happened; a failed re-read must not hide that
            return None

    async def requeue(self, job_id: str, *, hold: bool = False) -> EffectResult:
        job_id = validate_job_id(job_id)
        job = await self.get_job(job_id)
        before = self._job_state(job)
        if job.is_pending:
            if hold and not job.is_held:
                return await self.hold(job_id)
            return EffectResult(
                changed=False, detail=f"job {job_id} already pending: {before}", before=before
            )
        if job.requeue is False:
            raise JobNotRequeueable(f"job {job_id} has requeue disabled (Requeue=0)")
        if job.batch is False:
            raise JobNotRequeueable(
                f"job {job_id} is not a batch job; Slurm requeues batch jobs only"
            )
        argv = ["scontrol", "requeuehold" if hold else "requeue", job_id]
        try:
            await self._run(argv)
        except JobStateConflict as error:
            # A job requeued a moment ago shows COMPLETING; Slurm then answers "Job is
            # pending execution": the requeue we want has already happened.
            if "pending execution" not in str(error) or "no longer" in str(error):
                raise
            if hold:
                await self._wait_until_pending(job_id)
                return await self.hold(job_id)
            return EffectResult(
                command=argv,
                changed=False,
                detail=f"job {job_id} already requeued (Slurm: job is pending execution)",
                before=before,
                after=await self._after(job_id),
            )
        return EffectResult(
            command=argv,
            changed=True,
            detail=f"job {job_id} requeued{' and held' if hold else ''} (was {before})",
            before=before,
            after=await self._after(job_id),
        )

    async def hold(self, job_id: str) -> EffectResult:
        return await self._set_held(job_id, held=True)

    async def release(self, job_id: str) -> EffectResult:
        return await self._set_held(job_id, held=False)

    async def _set_held(self, job_id: str, *, held: bool) -> EffectResult:
        """`scontrol hold` / `release`, only when the job is not already that way."""
        job_id = validate_job_id(job_id)
        job = await self.get_job(job_id)
        before = self._job_state(job)
        if job.is_held == held:
            already = "already held" if held else "is not held"
            return EffectResult(changed=False, detail=f"job {job_id} {already}", before=before)
        verb = "hold" if held else "release"
        argv = ["scontrol", verb, job_id]
        await self._run(argv)
        return EffectResult(
            command=argv,
            changed=True,
            detail=f"job {job_id} {'held' if held else 'released'}",
            before=before,
            after=await self._after(job_id),
        )

    async def exclude_nodes(self, job_id: str, nodes: Sequence[str]) -> EffectResult:
        """Add `nodes` to the job's ExcNodeList (kept: exclusions already there)."""
        job_id = validate_job_id(job_id)
        wanted = [_validate_node(n) for n in nodes]
        job = await self.get_job(job_id)
        before = ",".join(job.excluded_nodes) or "(none)"
        missing = [n for n in wanted if n not in job.excluded_nodes]
        if not missing:
            return EffectResult(
                changed=False, detail=f"job {job_id} already excludes {before}", before=before
            )
        merged = [*job.excluded_nodes, *missing]
        argv = ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(merged)}"]
        await self._run(argv)
        after = await self.get_job(job_id)
        return EffectResult(
            command=argv,
            changed=True,
            detail=f"job {job_id} now excludes {','.join(after.excluded_nodes)}",
            before=before,
            after=",".join(after.excluded_nodes) or "(none)",
        )

    async def start_now(self, job_id: str) -> EffectResult:
        """Ask a pending job to start at once (a requeued job otherwise waits for the
        credential expiry, docs/architecture.md "The Slurm lab"). Use it when the job
        excludes the nodes it ran on: in the lab, a plain requeue + start_now sometimes
        relaunched on the same node before the old job's teardown finished, and the new
        run failed at once."""
        job_id = validate_job_id(job_id)
        job = await self.get_job(job_id)
        before = self._job_state(job)
        if not job.is_pending:
            return EffectResult(
                changed=False, detail=f"job {job_id} is not pending ({before})", before=before
            )
        argv = ["scontrol", "update", f"JobId={job_id}", "StartTime=now"]
        await self._run(argv)
        return EffectResult(
            command=argv,
            changed=True,
            detail=f"job {job_id} start time set to now",
            before=before,
            after=await self._after(job_id),
        )

    async def requeue_excluding(self, job_id: str, nodes: Sequence[str]) -> list[EffectResult]:
        """Requeue held, add exclusions, release: the job cannot start on a suspect node
        between the requeue and the exclusion.

        No StartTime=now afterwards: Slurm keeps a requeued job back until the old run's
        job credentials expire (munge cred_expire); starting it sooner makes the launch
        fail with "Job credential revoked" on any node of the previous run (seen in the
        lab), which would look like a second failure."""
        results = [await self.requeue(job_id, hold=True)]
        # Right after a requeue the job shows COMPLETING until its old processes are gone;
        # Slurm refuses job updates until it is PENDING again.
        await self._wait_until_pending(job_id)
        results.append(await self.exclude_nodes(job_id, nodes))
        results.append(await self.release(job_id))
        return results

    async def _wait_until_pending(self, job_id: str) -> SlurmJob:
        deadline = asyncio.get_running_loop().time() + self._settle_timeout
        while True:
            job = await self.get_job(job_id)
            if job.is_pending or job.is_finished:
                return job
            if asyncio.get_running_loop().time() > deadline:
                raise JobStateConflict(
                    f"job {job_id} still {self._job_state(job)} after "
                    f"{self._settle_timeout:g}s; expected it pending after the requeue"
                )
            await asyncio.sleep(self._poll_interval)

    async def cancel(self, job_id: str) -> EffectResult:
        job_id = validate_job_id(job_id)
        job = await self.get_job(job_id)
        before = self._job_state(job)
        if job.is_finished:
            return EffectResult(
                changed=False, detail=f"job {job_id} already ended ({before})", before=before
            )
        argv = ["scancel", job_id]
        await self._run(argv, check_stderr_errors=True)
        return EffectResult(
            command=argv,
            changed=True,
            detail=f"job {job_id} cancelled (was {before})",
            before=before,
            after=await self._after(job_id),
        )

    async def set_comment(self, job_id: str, comment: str) -> EffectResult:
        job_id = validate_job_id(job_id)
        comment = _validate_text("comment", comment, allow_empty=True)
        job = await self.get_job(job_id)
        if job.comment == comment:
            return EffectResult(
                changed=False, detail=f"job {job_id} comment already set", before=job.comment
            )
        argv = ["scontrol", "update", f"JobId={job_id}", f"Comment={comment}"]
        await self._run(argv)
        return EffectResult(
            command=argv,
            changed=True,
            detail=f"job {job_id} comment set",
            before=job.comment,
            after=comment,
        )
