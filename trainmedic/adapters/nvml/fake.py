"""Scripted GPUs behind the `NvmlBackend` Protocol: for tests and the lab's fake nodes.

`FakeNvml(gpus=8)` keeps its state in memory and is changed with `set`, `lose` and
`xid`. `FakeNvml.from_file(path)` reads the lab's `<lab root>/nodes/<node>/nvml.json`
on every call instead, so `trainmedic lab inject` (another process) can break a GPU.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainmedic.adapters.nvml.protocol import GpuHealth, NvmlError, RecoveryAction, XidEvent


def _healthy(index: int) -> GpuHealth:
    return GpuHealth(
        index=index,
        uuid=f"GPU-fake0000-0000-4000-8000-{index:012x}",
        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        ecc_uncorrectable_volatile=0,
        ecc_uncorrectable_aggregate=0,
        retired_pages_pending=False,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        recovery_action=RecoveryAction.NONE,
        temperature_c=40,
        power_w=90.0,
        throttle_reasons=0,
        nvlink_links=18,
        nvlink_down=[],
    )


class FakeNvml:
    def __init__(self, gpus: int = 8, *, fail_init: str | None = None) -> None:
        self._gpus = [_healthy(i) for i in range(gpus)]
        self._events: list[XidEvent] = []
        self._fail_init = fail_init
        self._file: Path | None = None
        self._file_events_seen = 0
        self._lock = threading.Lock()
        self.initialised = False
        self.reads = 0

    @classmethod
    def from_file(cls, path: Path) -> FakeNvml:
        """GPUs as the lab file says at each call (a missing file: no GPUs yet)."""
        fake = cls(gpus=0)
        fake._file = path
        return fake

    # --------------------------------------------------------------- script

    def set(self, index: int, **fields: Any) -> None:
        with self._lock:
            self._gpus[index] = self._gpus[index].model_copy(update=fields)

    def lose(self, index: int) -> None:
        """The GPU falls off the bus: reads fail, the driver asks for a reboot."""
        self.set(index, lost=True, recovery_action=RecoveryAction.NODE_REBOOT)
        self.xid(index, 79)

    def xid(self, index: int, xid: int) -> None:
        with self._lock:
            self._events.append(XidEvent(gpu=index, xid=xid, at=datetime.now(UTC)))

    # ------------------------------------------------------------- protocol

    def init(self) -> None:
        if self._fail_init:
            raise NvmlError(self._fail_init)
        self.initialised = True
        if self._file is not None:
            # Like a real event set: only events after registration are delivered.
            self._file_events_seen = len(self._load().get("xid_events", []))

    def shutdown(self) -> None:
        self.initialised = False

    def driver_version(self) -> str | None:
        return "570.133.20-fake"

    def _state(self) -> list[GpuHealth]:
        if self._file is None:
            with self._lock:
                return list(self._gpus)
        data = self._load()
        gpus: list[GpuHealth] = []
        for entry in data.get("gpus", []):
            entry = {k: v for k, v in entry.items() if k in GpuHealth.model_fields}
            gpus.append(GpuHealth.model_validate(entry))
        return gpus

    def _load(self) -> dict[str, Any]:
        if self._file is None:
            return {}
        try:
            data = json.loads(self._file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def device_count(self) -> int:
        self._check()
        return len(self._state())

    def read(self, index: int) -> GpuHealth:
        self._check()
        self.reads += 1
        gpus = self._state()
        if index >= len(gpus):
            raise NvmlError(f"no GPU {index}")
        gpu = gpus[index]
        if gpu.lost:
            # What a real read returns for a GPU that is gone: nothing but the fact.
            return GpuHealth(index=index, lost=True, recovery_action=gpu.recovery_action)
        return gpu

    def xid_events(self, timeout_ms: int = 0) -> list[XidEvent]:
        self._check()
        if self._file is not None:
            raw = self._load().get("xid_events", [])
            fresh = raw[self._file_events_seen :]
            self._file_events_seen = len(raw)
            return [
                XidEvent(
                    gpu=int(e["gpu"]),
                    xid=int(e["xid"]),
                    at=datetime.fromtimestamp(float(e["at"]), UTC) if e.get("at") else None,
                )
                for e in fresh
                if isinstance(e, dict)
            ]
        with self._lock:
            events, self._events = self._events, []
        return events

    def _check(self) -> None:
        if not self.initialised:
            raise NvmlError("NVML is not initialised (call init() first)")
