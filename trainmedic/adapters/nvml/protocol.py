"""What trainmedic reads from NVML, as typed models, behind one Protocol.

`PynvmlBackend` reads a real driver through pynvml; `FakeNvml` plays scripted GPUs
(tests, the lab). The node agent only sees `NvmlBackend`, and turns changes between two
`GpuHealth` readings into `NvmlFinding`s with `findings()`.

Evidence text shape (the catalog's `kernel.gpu_reset_required` / `kernel.nvml_ecc_dbe`
rules match it): `nvml: gpu 3 recovery_action=NODE_REBOOT`,
`nvml: gpu 5 ecc_uncorrectable_volatile=3`, `nvml: gpu 1 row_remap_failure=true`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field


class RecoveryAction(StrEnum):
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (driver r570+), by NVML's names."""

    NONE = "NONE"
    GPU_RESET = "GPU_RESET"
    NODE_REBOOT = "NODE_REBOOT"
    DRAIN_P2P = "DRAIN_P2P"
    DRAIN_AND_RESET = "DRAIN_AND_RESET"
    RECOVER_IMEX_DOMAIN = "RECOVER_IMEX_DOMAIN"
    BUS_RESET = "BUS_RESET"
    SYSTEM_REBOOT = "SYSTEM_REBOOT"


# NVML's numeric codes (nvmlDeviceGpuRecoveryAction_t) in order.
RECOVERY_ACTION_CODES: dict[int, RecoveryAction] = dict(enumerate(RecoveryAction))


class GpuHealth(BaseModel):
    """One reading of one GPU. A field is None when the GPU or driver does not support it
    (the reason is in `unsupported`): absence of data is never read as health."""

    model_config = ConfigDict(frozen=True)

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None  # NVML's spelling: 00000000:3B:00.0
    lost: bool = False  # NVML_ERROR_GPU_IS_LOST on access: fallen off the bus
    ecc_uncorrectable_volatile: int | None = None
    ecc_uncorrectable_aggregate: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    recovery_action: RecoveryAction | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    throttle_reasons: int | None = None  # nvmlClocksEventReason bit mask
    # NVLink: how many links the GPU has, and which of them are not active. None: the
    # GPU has no NVLink (or the driver cannot say), so there is nothing to check.
    nvlink_links: int | None = None
    nvlink_down: list[int] | None = None
    unsupported: dict[str, str] = Field(default_factory=dict)  # field -> NVML's reason


class XidEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    gpu: int
    xid: int
    at: datetime | None = None


class NvmlFinding(BaseModel):
    """Something worth reporting about one GPU, as a catalog-matchable line."""

    model_config = ConfigDict(frozen=True)

    gpu: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    field: str
    value: str
    text: str


class NvmlError(Exception):
    """NVML could not be used at all (no driver, init failed)."""


class NvmlBackend(Protocol):
    """A GPU management interface. Calls block briefly; the agent runs them in a thread."""

    def init(self) -> None:
        """Open the library; raises NvmlError when NVML cannot be used here."""

    def shutdown(self) -> None: ...

    def driver_version(self) -> str | None: ...

    def device_count(self) -> int: ...

    def read(self, index: int) -> GpuHealth:
        """Every field of one GPU; unsupported fields are None, a lost GPU `lost=True`."""

    def xid_events(self, timeout_ms: int = 0) -> list[XidEvent]:
        """Xid events since the last call (waits up to timeout_ms for the first)."""


_THROTTLE_HW_SLOWDOWN = 0x8 | 0x40 | 0x80  # HW slowdown, HW thermal, HW power brake


def _line(gpu: int, field: str, value: str) -> str:
    return f"nvml: gpu {gpu} {field}={value}"


def findings(previous: GpuHealth | None, current: GpuHealth) -> list[NvmlFinding]:
    """What changed for the worse between two readings of one GPU.

    With no previous reading (agent start) only standing conditions count (lost GPU,
    a pending recovery action, row-remap failure, pending retirements); counters are
    reported when they grow, so a restart of the agent does not re-report old errors.
    """
    out: list[NvmlFinding] = []

    def add(field: str, value: str, note: str = "") -> None:
        out.append(
            NvmlFinding(
                gpu=current.index,
                uuid=current.uuid,
                pci_bus_id=current.pci_bus_id,
                field=field,
                value=value,
                text=_line(current.index, field, value) + note,
            )
        )

    prev = previous
    if current.lost and not (prev and prev.lost):
        add("gpu_lost", "true", " (NVML_ERROR_GPU_IS_LOST)")
    action = current.recovery_action
    if (
        action is not None
        and action is not RecoveryAction.NONE
        and (prev is None or prev.recovery_action != action)
    ):
        add("recovery_action", action.value)
    if prev is not None:
        for field in ("ecc_uncorrectable_volatile", "ecc_uncorrectable_aggregate"):
            now, before = getattr(current, field), getattr(prev, field)
            if now is not None and now > (before or 0):
                add(field, str(now))
    for field, name in (
        ("remapped_rows_failure", "row_remap_failure"),
        ("retired_pages_pending", "retired_pages_pending"),
        ("remapped_rows_pending", "row_remap_pending"),
    ):
        if getattr(current, field) and not (prev and getattr(prev, field)):
            add(name, "true")
    if (
        current.throttle_reasons is not None
        and current.throttle_reasons & _THROTTLE_HW_SLOWDOWN
        and not (prev and (prev.throttle_reasons or 0) & _THROTTLE_HW_SLOWDOWN)
    ):
        add("hw_slowdown", hex(current.throttle_reasons))
    return out


def xid_finding(event: XidEvent, health: GpuHealth | None) -> NvmlFinding:
    # "Xid 79" in the text lets the catalog's per-Xid rules classify it like a kernel line.
    return NvmlFinding(
        gpu=event.gpu,
        uuid=health.uuid if health else None,
        pci_bus_id=health.pci_bus_id if health else None,
        field="xid",
        value=str(event.xid),
        text=f"nvml: gpu {event.gpu} Xid {event.xid} event",
    )
