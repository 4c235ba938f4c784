"""The node health check: is this node's hardware fit to take work again?

Run where the GPUs are (the node agent; in the lab, against the node's FakeNvml), over
the `NvmlBackend` Protocol, plus `dcgmi diag -r 1` when dcgmi is installed and the
site's own script when one is configured. Each check gives a `HealthCheck`; the node is
healthy only when every one is ok. A field NVML cannot give (old driver, a GPU without
it) is recorded as unknown, never read as health *or* as failure, except where its
absence is itself the fault (a lost GPU, a GPU missing from the count).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from trainmedic.adapters.nvml.protocol import GpuHealth, NvmlBackend, NvmlError, RecoveryAction
from trainmedic.config import Settings
from trainmedic.domain.health import (
    MAX_OUTPUT_CHARS,
    CheckName,
    HealthCheck,
    NodeHealthReport,
    NodeHealthRequest,
)

log = logging.getLogger(__name__)

DCGMI_DIAG = ("diag", "-r", "1")
# dcgmi's result table: `| Memory                    | Fail - GPU: 3 ...    |`
_DCGM_ROW = re.compile(
    r"^\|\s*(?P<test>[^|]*?)\s*\|\s*(?P<result>Pass|Fail|Warn|Skip)\b(?P<rest>[^|]*)"
)


@dataclass(frozen=True)
class HealthConfig:
    """What the agent runs besides NVML. `dcgmi`: the binary (None: looked up on PATH
    at each check, so installing DCGM later needs no restart); `site_script`: argv of
    the site's own check (exit 0 = healthy)."""

    dcgmi: Path | None = None
    dcgm_timeout_s: float = 180.0
    site_script: Sequence[str] = field(default_factory=tuple)
    site_script_timeout_s: float = 120.0

    def dcgmi_binary(self) -> str | None:
        if self.dcgmi is not None:
            return str(self.dcgmi) if os.access(self.dcgmi, os.X_OK) else None
        return shutil.which("dcgmi")


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_OUTPUT_CHARS else "..." + text[-MAX_OUTPUT_CHARS:]


# ----------------------------------------------------------------------------- NVML


@dataclass
class GpuReading:
    driver_version: str | None
    gpus: list[GpuHealth]


def read_gpus(nvml: NvmlBackend) -> GpuReading:
    """Every GPU, read once (blocking: run it in a thread). Raises NvmlError."""
    nvml.init()
    try:
        count = nvml.device_count()
        return GpuReading(nvml.driver_version(), [nvml.read(i) for i in range(count)])
    finally:
        nvml.shutdown()


def _names(gpus: list[GpuHealth]) -> str:
    return ", ".join(str(g.index) for g in gpus)


def gpu_checks(
    reading: GpuReading, request: NodeHealthRequest
) -> tuple[list[HealthCheck], dict[str, int]]:
    """The NVML checks over one reading, and the ECC counters to keep as a baseline."""
    gpus = reading.gpus
    present = [g for g in gpus if not g.lost]
    lost = [g for g in gpus if g.lost]
    checks: list[HealthCheck] = []

    # GPU count: as Slurm's gres says, and none fallen off the bus.
    problems = []
    if lost:
        problems.append(f"gpu {_names(lost)} lost (fallen off the bus)")
    if request.expected_gpus is not None and len(present) != request.expected_gpus:
        problems.append(f"{len(present)} GPUs answer, Slurm's gres says {request.expected_gpus}")
    expected = f" of {request.expected_gpus} expected" if request.expected_gpus is not None else ""
    checks.append(
        HealthCheck(
            name="gpu_count",
            ok=not problems,
            detail="; ".join(problems) or f"{len(present)} GPUs{expected}",
        )
    )

    def per_gpu(
        name: CheckName, bad: list[str], unknown: list[GpuHealth], ok_text: str
    ) -> HealthCheck:
        if bad:
            return HealthCheck(name=name, ok=False, detail="; ".join(bad))
        if present and len(unknown) == len(present):
            why = next(iter(unknown[0].unsupported.values()), "not reported")
            return HealthCheck(
                name=name,
                ok=True,
                unknown=True,
                detail=f"unknown: not reported by this GPU/driver ({why})",
            )
        note = f" (unknown on gpu {_names(unknown)})" if unknown else ""
        return HealthCheck(name=name, ok=True, detail=ok_text + note)

    # Row remapping (Ampere and newer).
    bad = []
    for g in present:
        if g.remapped_rows_failure:
            bad.append(f"gpu {g.index} row remapping failed")
        elif g.remapped_rows_pending:
            bad.append(f"gpu {g.index} row remap pending (needs a GPU reset)")
    unknown = [g for g in present if g.remapped_rows_pending is None]
    checks.append(per_gpu("row_remap", bad, unknown, "no pending or failed row remap"))

    # Uncorrectable ECC since the drain: over the baseline, else the volatile counter.
    bad = []
    aggregate: dict[str, int] = {}
    unknown = []
    for g in present:
        if g.uuid and g.ecc_uncorrectable_aggregate is not None:
            aggregate[g.uuid] = g.ecc_uncorrectable_aggregate
        base = request.ecc_baseline.get(g.uuid or "")
        now = g.ecc_uncorrectable_aggregate
        if base is not None and now is not None and now > base:
            bad.append(f"gpu {g.index} {now - base} new uncorrectable ECC errors since the drain")
            continue
        if g.ecc_uncorrectable_volatile:
            bad.append(
                f"gpu {g.index} {g.ecc_uncorrectable_volatile} uncorrectable ECC errors "
                "since the last GPU reset"
            )
        elif g.ecc_uncorrectable_volatile is None and base is None:
            unknown.append(g)
    checks.append(per_gpu("ecc", bad, unknown, "no uncorrectable ECC errors since the drain"))

    # The driver's own verdict (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, r570+).
    bad = [
        f"gpu {g.index} driver asks for {g.recovery_action.value}"
        for g in gpus
        if g.recovery_action is not None and g.recovery_action is not RecoveryAction.NONE
    ]
    unknown = [g for g in present if g.recovery_action is None]
    checks.append(per_gpu("recovery_action", bad, unknown, "no recovery action pending"))

    # NVLink: every link the GPU has is active.
    bad = [
        f"gpu {g.index} NVLink {', '.join(map(str, g.nvlink_down))} down"
        for g in present
        if g.nvlink_down
    ]
    unknown = [g for g in present if g.nvlink_links is None]
    if present and len(unknown) == len(present):
        checks.append(HealthCheck(name="nvlink", ok=True, skipped=True, detail="no NVLink"))
    else:
        links = sum(g.nvlink_links or 0 for g in present)
        checks.append(per_gpu("nvlink", bad, unknown, f"{links} links up"))
    return checks, aggregate


# ----------------------------------------------------------------------------- commands


async def _run(argv: Sequence[str], timeout_s: float) -> tuple[int | None, str]:
    """(exit status, or None on timeout; combined output). Never through a shell."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # a timeout kills the whole group (dcgmi's children too)
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        with contextlib.suppress(Exception):
            out, _ = await asyncio.wait_for(process.communicate(), 5)
            return None, out.decode("utf-8", "replace")
        return None, ""
    return process.returncode, out.decode("utf-8", "replace")


def parse_dcgm_diag(output: str) -> tuple[list[str], list[str]]:
    """(failed tests, warned tests) from `dcgmi diag`'s result table."""
    failed, warned = [], []
    for line in output.splitlines():
        match = _DCGM_ROW.match(line.strip())
        if not match:
            continue
        test = match["test"].strip()
        text = f"{test}: {match['result']}{match['rest'].rstrip()}"
        if match["result"] == "Fail":
            failed.append(text)
        elif match["result"] == "Warn":
            warned.append(text)
    return failed, warned


async def dcgm_check(config: HealthConfig) -> HealthCheck:
    binary = config.dcgmi_binary()
    if binary is None:
        return HealthCheck(name="dcgm_diag", ok=True, skipped=True, detail="dcgmi not installed")
    argv = [binary, *DCGMI_DIAG]
    try:
        status, output = await _run(argv, config.dcgm_timeout_s)
    except OSError as error:
        return HealthCheck(name="dcgm_diag", ok=False, detail=f"could not run dcgmi: {error}")
    failed, warned = parse_dcgm_diag(output)
    if status is None:
        detail = f"`dcgmi diag -r 1` timed out after {config.dcgm_timeout_s:.0f} s"
        return HealthCheck(name="dcgm_diag", ok=False, detail=detail, output=_tail(output))
    if failed or status != 0:
        why = "; ".join(failed) or f"dcgmi exited {status}"
        return HealthCheck(name="dcgm_diag", ok=False, detail=why, output=_tail(output))
    note = f" (warnings: {'; '.join(warned)})" if warned else ""
    return HealthCheck(
        name="dcgm_diag", ok=True, detail=f"dcgmi diag -r 1 passed{note}", output=_tail(output)
    )


async def site_script_check(config: HealthConfig, node: str) -> HealthCheck:
    if not config.site_script:
        return HealthCheck(name="site_script", ok=True, skipped=True, detail="none configured")
    argv = [*config.site_script, node]
    try:
        status, output = await _run(argv, config.site_script_timeout_s)
    except OSError as error:
        return HealthCheck(name="site_script", ok=False, detail=f"could not run {argv[0]}: {error}")
    if status is None:
        detail = f"{argv[0]} timed out after {config.site_script_timeout_s:.0f} s"
        return HealthCheck(name="site_script", ok=False, detail=detail, output=_tail(output))
    last = output.strip().splitlines()[-1][:200] if output.strip() else ""
    if status != 0:
        detail = f"{argv[0]} exited {status}" + (f": {last}" if last else "")
        return HealthCheck(name="site_script", ok=False, detail=detail, output=_tail(output))
    return HealthCheck(
        name="site_script", ok=True, detail=f"{argv[0]} exited 0", output=_tail(output)
    )


# ----------------------------------------------------------------------------- the check


class NodeHealthChecker:
    """Runs every check for one node. One check at a time: `dcgmi diag` takes the GPUs
    for itself, and a second request waits for the first instead of racing it."""

    def __init__(
        self, node: str, nvml: NvmlBackend | None, config: HealthConfig | None = None
    ) -> None:
        self.node = node
        self._nvml = nvml
        self.config = config or HealthConfig()
        self._lock = asyncio.Lock()

    async def check(self, request: NodeHealthRequest, *, source: str = "agent") -> NodeHealthReport:
        async with self._lock:
            checks: list[HealthCheck] = []
            aggregate: dict[str, int] = {}
            driver: str | None = None
            if self._nvml is None:
                checks.append(
                    HealthCheck(name="nvml", ok=False, detail="this agent runs without NVML")
                )
            else:
                try:
                    reading = await asyncio.to_thread(read_gpus, self._nvml)
                except NvmlError as error:
                    checks.append(HealthCheck(name="nvml", ok=False, detail=str(error)))
                else:
                    driver = reading.driver_version
                    gpu, aggregate = gpu_checks(reading, request)
                    checks.extend(gpu)
            # dcgmi only on GPUs NVML finds usable: a lost GPU already decided it.
            nvml_ok = all(c.ok for c in checks)
            if request.diag and nvml_ok:
                checks.append(await dcgm_check(self.config))
            elif request.diag:
                checks.append(
                    HealthCheck(
                        name="dcgm_diag",
                        ok=True,
                        skipped=True,
                        detail="not run: NVML checks failed already",
                    )
                )
            checks.append(await site_script_check(self.config, self.node))
            report = NodeHealthReport.of(
                self.node,
                checks,
                datetime.now(UTC),
                source=source,
                driver_version=driver,
                ecc_aggregate=aggregate,
            )
        log.info("health of %s: %s", self.node, report.detail)
        return report


def health_config(settings: Settings) -> HealthConfig:
    """The agent's extra checks from its Settings (TRAINMEDIC_HEALTH_*)."""
    return HealthConfig(
        dcgmi=settings.health_dcgmi,
        dcgm_timeout_s=settings.health_dcgm_timeout.total_seconds(),
        site_script=(str(settings.health_script),) if settings.health_script else (),
        site_script_timeout_s=settings.health_script_timeout.total_seconds(),
    )
