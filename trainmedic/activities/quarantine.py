"""Activities of NodeQuarantineWorkflow: a node health check and a guarded resume."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trainmedic.adapters.nvml.protocol import NvmlBackend, RecoveryAction
from trainmedic.adapters.slurm.errors import NoSuchNode, SlurmError
from trainmedic.adapters.slurm.protocol import SlurmBackend
from trainmedic.domain.slurm import EffectResult
from trainmedic.workflows.quarantine import HealthRequest, HealthResult, ResumeRequest


class NodeHealth(Protocol):
    """Is a node fit to take work again? The real GPU probe comes with the node agent."""

    async def check(self, node: str) -> HealthResult: ...


class SlurmNodeHealth:
    """The node answers Slurm (not DOWN, not NOT_RESPONDING, no FAIL flag); optionally,
    its GPU device files exist as character devices (the lab's fake GPUs)."""

    def __init__(
        self,
        backend: SlurmBackend,
        gpu_devices: Callable[[str], list[Path]] | None = None,
        gpu_health: Callable[[str], NvmlBackend | None] | None = None,
    ) -> None:
        self._backend = backend
        self._gpu_devices = gpu_devices
        # Where the controller can read a node's NVML (the lab's fake GPUs); on a real
        # cluster that reading belongs to the node agent, so this stays None there.
        self._gpu_health = gpu_health

    async def check(self, node: str) -> HealthResult:
        checks: dict[str, bool] = {}
        notes: list[str] = []
        try:
            info = await self._backend.get_node(node)
        except NoSuchNode:
            return HealthResult(
                node=node,
                healthy=False,
                checks={"known": False},
                detail="unknown to Slurm",
                at=datetime.now(UTC),
            )
        checks["responding"] = not info.is_down and "NOT_RESPONDING" not in info.state_flags
        if not checks["responding"]:
            notes.append(f"Slurm has it {info.state_text} ({info.reason or 'no reason'})")
        if self._gpu_devices is not None:
            devices = self._gpu_devices(node)
            missing = [d for d in devices if not _is_char_device(d)]
            checks["gpu_devices"] = bool(devices) and not missing
            if missing or not devices:
                notes.append(f"GPU devices missing: {', '.join(map(str, missing)) or 'none found'}")
        if self._gpu_health is not None:
            nvml = self._gpu_health(node)
            if nvml is not None:
                bad = await asyncio.to_thread(unhealthy_gpus, nvml)
                checks["gpus"] = not bad
                notes.extend(bad)
        healthy = all(checks.values())
        return HealthResult(
            node=node,
            healthy=healthy,
            checks=checks,
            detail="; ".join(notes) or f"ok ({info.state_text})",
            at=datetime.now(UTC),
        )


def unhealthy_gpus(nvml: NvmlBackend) -> list[str]:
    """What NVML says is wrong with this node's GPUs (empty: nothing)."""
    problems: list[str] = []
    nvml.init()
    try:
        for index in range(nvml.device_count()):
            gpu = nvml.read(index)
            if gpu.lost:
                problems.append(f"gpu {index} lost (fallen off the bus)")
            if gpu.ecc_uncorrectable_volatile:
                problems.append(f"gpu {index} {gpu.ecc_uncorrectable_volatile} uncorrectable ECC")
            if gpu.remapped_rows_failure:
                problems.append(f"gpu {index} row remapping failed")
            if gpu.recovery_action not in (None, RecoveryAction.NONE):
                problems.append(f"gpu {index} driver asks for {gpu.recovery_action.value}")
    finally:
        nvml.shutdown()
    return problems


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def lab_gpu_devices(gpu_root: Callable[[str], Path]) -> Callable[[str], list[Path]]:
    """The lab's fake GPUs: `<lab>/dev/<node>/nvidiaN` (see trainmedic/lab/layout.py)."""

    def devices(node: str) -> list[Path]:
        folder = gpu_root(node)
        return sorted(folder.glob("nvidia[0-9]*")) if folder.is_dir() else []

    return devices


class QuarantineActivities:
    def __init__(self, backend: SlurmBackend, health: NodeHealth) -> None:
        self._backend = backend
        self._health = health

    @activity.defn(name="quarantine_check_health")
    async def check_health(self, request: HealthRequest) -> HealthResult:
        try:
            return await self._health.check(request.node)
        except SlurmError as error:
            if error.retryable:
                raise
            return HealthResult(
                node=request.node,
                healthy=False,
                detail=f"health check failed: {error}",
                at=datetime.now(UTC),
            )

    @activity.defn(name="quarantine_resume_node")
    async def resume_node(self, request: ResumeRequest) -> EffectResult:
        """Resume only a node drained/downed with a reason containing the marker."""
        try:
            return await self._backend.resume_node(
                request.node, only_if_reason_contains=request.only_if_reason_contains
            )
        except SlurmError as error:
            if error.retryable:
                raise
            raise ApplicationError(
                f"resume {request.node}: {error}", type=type(error).__name__, non_retryable=True
            ) from error
