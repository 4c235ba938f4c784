"""NVML through pynvml (the `nvidia-ml-py` package): the real GPUs of this node.

Every field is read on its own: a GPU or driver that lacks one (NotSupported, NoPermission,
FunctionNotFound on an old driver) leaves that field None and says why in
`GpuHealth.unsupported`; a GPU that has fallen off the bus (GpuIsLost) is reported as
`lost`. Nothing here is retried: the agent polls again in a few seconds anyway.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from trainmedic.adapters.nvml.protocol import (
    RECOVERY_ACTION_CODES,
    GpuHealth,
    NvmlError,
    XidEvent,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; pynvml has the constant from 12.570 on, the
# number is fixed by NVML's ABI, so older bindings can still ask a new driver.
_FI_RECOVERY_ACTION = 230


class _Lost(Exception):
    pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """`NvmlBackend` over the real library. Thread-safe: NVML itself is; our state is locked."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._event_set: Any = None
        self._handles: dict[int, Any] = {}
        self._index_by_handle: dict[int, int] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ lifecycle

    def init(self) -> None:
        try:
            import pynvml  # deferred: the controller never loads NVML
        except ImportError as error:  # pragma: no cover - it is a dependency
            raise NvmlError(
                f"pynvml is not installed ({error}); pip install nvidia-ml-py"
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise NvmlError(f"NVML init failed: {error}") from None
        except OSError as error:
            raise NvmlError(f"NVML library not found: {error}") from None
        self._nvml = pynvml
        self._setup_events()

    def shutdown(self) -> None:
        nvml = self._nvml
        if nvml is None:
            return
        with self._lock:
            if self._event_set is not None:
                try:
                    nvml.nvmlEventSetFree(self._event_set)
                except nvml.NVMLError as error:
                    log.debug("nvmlEventSetFree: %s", error)
                self._event_set = None
            self._handles.clear()
            self._index_by_handle.clear()
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as error:
            log.debug("nvmlShutdown: %s", error)
        self._nvml = None

    def _lib(self) -> Any:
        if self._nvml is None:
            raise NvmlError("NVML is not initialised (call init() first)")
        return self._nvml

    def _setup_events(self) -> None:
        nvml = self._lib()
        mask = nvml.nvmlEventTypeXidCriticalError
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.info("NVML events unavailable (%s): Xids come from the kernel log only", error)
            return
        for index in range(self.device_count()):
            try:
                nvml.nvmlDeviceRegisterEvents(self._handle(index), mask, event_set)
            except (nvml.NVMLError, _Lost) as error:
                # Not supported on some GPUs (and not at all under some VMs).
                log.info("no Xid events for GPU %d: %s", index, error)
        self._event_set = event_set

    # --------------------------------------------------------------- reads

    def driver_version(self) -> str | None:
        nvml = self._lib()
        try:
            return _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            return None

    def device_count(self) -> int:
        nvml = self._lib()
        try:
            return int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as error:
            raise NvmlError(f"nvmlDeviceGetCount: {error}") from None

    def _handle(self, index: int) -> Any:
        nvml = self._lib()
        with self._lock:
            handle = self._handles.get(index)
        if handle is not None:
            return handle
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError_GpuIsLost:
            raise _Lost from None
        with self._lock:
            self._handles[index] = handle
            self._index_by_handle[_handle_key(handle)] = index
        return handle

    def read(self, index: int) -> GpuHealth:
        nvml = self._lib()
        try:
            handle = self._handle(index)
        except _Lost:
            return GpuHealth(index=index, lost=True)
        except nvml.NVMLError as error:
            return GpuHealth(index=index, unsupported={"handle": str(error)})
        unsupported: dict[str, str] = {}
        lost = False

        def get(field: str, call: Callable[[], T]) -> T | None:
            nonlocal lost
            try:
                return call()
            except nvml.NVMLError_GpuIsLost:
                lost = True
            except nvml.NVMLError as error:
                unsupported[field] = str(error)
            return None

        uuid = get("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
        pci = get("pci_bus_id", lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile = get(
            "ecc_uncorrectable_volatile",
            lambda: int(nvml.nvmlDeviceGetTotalEccErrors(handle, unc, nvml.NVML_VOLATILE_ECC)),
        )
        aggregate = get(
            "ecc_uncorrectable_aggregate",
            lambda: int(nvml.nvmlDeviceGetTotalEccErrors(handle, unc, nvml.NVML_AGGREGATE_ECC)),
        )
        retired = get(
            "retired_pages_pending",
            lambda: bool(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)),
        )
        # (correctable, uncorrectable, pending, failure) rows; Ampere and newer.
        rows = get("remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        action = get("recovery_action", lambda: self._recovery_action(handle))
        temperature = get(
            "temperature_c",
            lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        )
        power = get("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        throttle = get("throttle_reasons", lambda: self._throttle(handle))
        links = get("nvlink", lambda: self._nvlinks(handle))
        return GpuHealth(
            index=index,
            uuid=uuid,
            pci_bus_id=pci,
            lost=lost,
            ecc_uncorrectable_volatile=volatile,
            ecc_uncorrectable_aggregate=aggregate,
            retired_pages_pending=retired,
            remapped_rows_pending=bool(rows[2]) if rows is not None else None,
            remapped_rows_failure=bool(rows[3]) if rows is not None else None,
            recovery_action=RECOVERY_ACTION_CODES.get(action) if action is not None else None,
            temperature_c=temperature,
            power_w=power,
            throttle_reasons=throttle,
            nvlink_links=links[0] if links is not None else None,
            nvlink_down=links[1] if links is not None else None,
            unsupported=unsupported,
        )

    def _recovery_action(self, handle: Any) -> int:
        nvml = self._lib()
        field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", _FI_RECOVERY_ACTION)
        value = nvml.nvmlDeviceGetFieldValues(handle, [field])[0]
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            # Field-level failure (older driver): surface it like a call failure.
            raise nvml.NVMLError(value.nvmlReturn)
        return int(value.value.uiVal)

    def _nvlinks(self, handle: Any) -> tuple[int, list[int]]:
        """(links the GPU has, the ones not active). A GPU without NVLink answers
        NotSupported for link 0 (raised: the field is unsupported, not failed); past
        its last link NVML answers InvalidArgument or NotSupported."""
        nvml = self._lib()
        past_the_end = (
            nvml.NVMLError_NotSupported,
            getattr(nvml, "NVMLError_InvalidArgument", nvml.NVMLError_NotSupported),
        )
        count, down = 0, []
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except past_the_end:
                if link == 0:
                    raise
                break
            count += 1
            if state != nvml.NVML_FEATURE_ENABLED:
                down.append(link)
        return count, down

    def _throttle(self, handle: Any) -> int:
        nvml = self._lib()
        # Renamed "clocks event reasons" in r535; keep the old name for old bindings.
        call = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(call(handle))

    def xid_events(self, timeout_ms: int = 0) -> list[XidEvent]:
        nvml = self._lib()
        if self._event_set is None:
            return []
        events: list[XidEvent] = []
        wait = timeout_ms
        while len(events) < 256:  # bounded: a storm is reported, not buffered forever
            try:
                data = nvml.nvmlEventSetWait(self._event_set, wait)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError as error:
                log.warning("nvmlEventSetWait: %s", error)
                break
            wait = 0
            if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                with self._lock:
                    index = self._index_by_handle.get(_handle_key(data.device), -1)
                events.append(XidEvent(gpu=index, xid=int(data.eventData), at=datetime.now(UTC)))
        return events


def _handle_key(handle: Any) -> int:
    # pynvml handles are ctypes pointers: compare by address.
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
