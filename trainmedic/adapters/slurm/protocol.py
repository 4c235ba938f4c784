"""The Slurm seams: how commands run (local, later SSH) and what the backend offers.

Activities depend on `SlurmBackend` only; workers choose the implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, Field

from trainmedic.domain.slurm import EffectResult, SlurmJob, SlurmNode, SlurmVersion


class CompletedCommand(BaseModel):
    argv: list[str]
    returncode: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = Field(default=0.0, ge=0.0)


@runtime_checkable
class CommandRunner(Protocol):
    """Runs one argv (never a shell string) with a bounded timeout.

    Raises `SlurmTimeout` when the timeout passes (the process is killed first) and
    `SlurmCommandNotFound` when the binary is missing; a non-zero exit status is returned,
    not raised, so the caller can classify Slurm's message.
    """

    async def run(self, argv: Sequence[str], timeout: float) -> CompletedCommand: ...


@runtime_checkable
class SlurmBackend(Protocol):
    """Everything trainmedic reads from, or does to, Slurm.

    Effects are idempotent: each re-reads the job or node first and, when the wanted
    state is already there, returns `changed=False` with what it found instead of
    failing. Errors are `trainmedic.adapters.slurm.errors.SlurmError` subclasses.
    """

    async def version(self) -> SlurmVersion: ...

    # reads
    async def list_jobs(self) -> list[SlurmJob]: ...
    async def get_job(self, job_id: str) -> SlurmJob: ...
    async def list_nodes(self) -> list[SlurmNode]: ...
    async def get_node(self, name: str) -> SlurmNode: ...
    async def nodes_of_job(self, job_id: str) -> list[SlurmNode]: ...

    # node effects
    async def drain_node(self, name: str, reason: str) -> EffectResult: ...
    async def resume_node(
        self, name: str, *, only_if_reason_contains: str | None = None, only_if_ours: bool = False
    ) -> EffectResult: ...

    # job effects
    async def requeue(self, job_id: str, *, hold: bool = False) -> EffectResult: ...
    async def hold(self, job_id: str) -> EffectResult: ...
    async def release(self, job_id: str) -> EffectResult: ...
    async def exclude_nodes(self, job_id: str, nodes: Sequence[str]) -> EffectResult: ...
    async def start_now(self, job_id: str) -> EffectResult: ...
    async def requeue_excluding(self, job_id: str, nodes: Sequence[str]) -> list[EffectResult]: ...
    async def cancel(self, job_id: str) -> EffectResult: ...
    async def set_comment(self, job_id: str, comment: str) -> EffectResult: ...
