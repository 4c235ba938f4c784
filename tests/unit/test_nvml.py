"""NVML adapter: findings from readings, the fake, and PynvmlBackend over a stand-in pynvml."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from trainmedic.adapters.nvml import (
    FakeNvml,
    GpuHealth,
    NvmlError,
    PynvmlBackend,
    RecoveryAction,
    findings,
)
from trainmedic.catalog import Matcher, load_catalog
from trainmedic.lab import faults


@pytest.fixture(scope="module")
def matcher() -> Matcher:
    return Matcher(load_catalog())


def _rules(matcher: Matcher, text: str) -> set[str]:
    return {m.rule.id for m in matcher.match(text)}


def test_first_reading_reports_standing_faults_not_counters() -> None:
    gpu = GpuHealth(
        index=3,
        ecc_uncorrectable_volatile=5,
        recovery_action=RecoveryAction.NODE_REBOOT,
        remapped_rows_failure=True,
    )
    got = {f.field: f.text for f in findings(None, gpu)}
    assert got == {
        "recovery_action": "nvml: gpu 3 recovery_action=NODE_REBOOT",
        "row_remap_failure": "nvml: gpu 3 row_remap_failure=true",
    }


def test_counter_growth_and_changes_only() -> None:
    before = GpuHealth(index=1, ecc_uncorrectable_volatile=1, recovery_action=RecoveryAction.NONE)
    same = findings(before, before)
    assert same == []
    after = before.model_copy(
        update={"ecc_uncorrectable_volatile": 3, "recovery_action": RecoveryAction.GPU_RESET}
    )
    texts = sorted(f.text for f in findings(before, after))
    assert texts == [
        "nvml: gpu 1 ecc_uncorrectable_volatile=3",
        "nvml: gpu 1 recovery_action=GPU_RESET",
    ]
    # An unsupported counter (None) never reads as a change.
    assert findings(before, before.model_copy(update={"ecc_uncorrectable_volatile": None})) == []


def test_finding_texts_match_catalog_rules(matcher: Matcher) -> None:
    lost = GpuHealth(index=0, lost=True, recovery_action=RecoveryAction.NODE_REBOOT)
    by_field = {f.field: f.text for f in findings(None, lost)}
    assert "kernel.gpu_reset_required" in _rules(matcher, by_field["recovery_action"])
    assert "cuda.gpu_lost" in _rules(matcher, by_field["gpu_lost"])
    ecc = findings(
        GpuHealth(index=5, ecc_uncorrectable_volatile=0),
        GpuHealth(index=5, ecc_uncorrectable_volatile=2),
    )
    assert "kernel.nvml_ecc_dbe" in _rules(matcher, ecc[0].text)
    assert not _rules(matcher, "nvml: gpu 3 recovery_action=NONE")


def test_fake_requires_init_and_scripts_faults() -> None:
    fake = FakeNvml(gpus=2)
    with pytest.raises(NvmlError):
        fake.device_count()
    fake.init()
    assert fake.device_count() == 2
    assert fake.read(1).recovery_action is RecoveryAction.NONE
    fake.lose(1)
    lost = fake.read(1)
    assert lost.lost and lost.uuid is None
    assert [(e.gpu, e.xid) for e in fake.xid_events()] == [(1, 79)]
    assert fake.xid_events() == []  # delivered once


def test_fake_from_lab_file_sees_injected_faults(tmp_path: Any) -> None:
    state = faults.node_dir(tmp_path, "gpu02") / faults.NVML_STATE
    state.parent.mkdir(parents=True)
    faults.write_json_atomic(state, faults.default_nvml_state("gpu02", 2))
    faults.update_nvml(tmp_path, "gpu02", 0, faults.Fault.ECC)  # before start: old news
    fake = FakeNvml.from_file(state)
    fake.init()
    assert fake.device_count() == 2
    assert fake.read(1).pci_bus_id == faults.pci_bus_id(1)
    assert fake.xid_events() == []
    faults.update_nvml(tmp_path, "gpu02", 1, faults.Fault.XID79)
    assert fake.read(1).lost
    assert fake.read(1).recovery_action is RecoveryAction.NODE_REBOOT
    assert [(e.gpu, e.xid) for e in fake.xid_events()] == [(1, 79)]
    assert fake.read(0).ecc_uncorrectable_volatile == 1


# --------------------------------------------------------- PynvmlBackend, stand-in lib


class _Err(Exception):
    def __init__(self, value: int = 999) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


class _NotSupported(_Err):
    pass


class _Lost(_Err):
    pass


class _Timeout(_Err):
    pass


class _InvalidArgument(_Err):
    pass


def _stand_in(lost: set[int], unsupported: set[str]) -> types.ModuleType:
    """Just enough of pynvml's surface, with per-call failures."""
    m = types.ModuleType("pynvml")
    ns: Any = m
    ns.NVMLError, ns.NVMLError_NotSupported = _Err, _NotSupported
    ns.NVMLError_GpuIsLost, ns.NVMLError_Timeout = _Lost, _Timeout
    ns.NVML_SUCCESS, ns.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    ns.NVML_VOLATILE_ECC, ns.NVML_AGGREGATE_ECC, ns.NVML_TEMPERATURE_GPU = 0, 1, 0
    ns.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
    ns.nvmlEventTypeXidCriticalError = 8
    ns.calls = []

    def call(name: str, handle: int | None, value: Any) -> Any:
        ns.calls.append(name)
        if handle in lost:
            raise _Lost(15)
        if name in unsupported:
            raise _NotSupported(3)
        return value

    ns.nvmlInit = lambda: None
    ns.nvmlShutdown = lambda: ns.calls.append("shutdown")
    ns.nvmlSystemGetDriverVersion = lambda: b"570.86.15"
    ns.nvmlDeviceGetCount = lambda: 2
    ns.nvmlDeviceGetHandleByIndex = lambda i: i
    ns.nvmlEventSetCreate = lambda: "events"
    ns.nvmlDeviceRegisterEvents = lambda h, mask, es: None
    ns.nvmlEventSetFree = lambda es: None

    def wait(es: Any, timeout: int) -> Any:
        raise _Timeout(10)

    ns.nvmlEventSetWait = wait
    ns.nvmlDeviceGetUUID = lambda h: call("uuid", h, f"GPU-{h}")
    ns.nvmlDeviceGetPciInfo = lambda h: call(
        "pci", h, types.SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())
    )
    ns.nvmlDeviceGetTotalEccErrors = lambda h, t, c: call("ecc", h, 2 if c == 0 else 7)
    ns.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: call("retired", h, 0)
    ns.nvmlDeviceGetRemappedRows = lambda h: call("rows", h, (0, 1, 1, 0))

    def fields(h: int, ids: list[int]) -> Any:
        call("fields", h, None)
        return [types.SimpleNamespace(nvmlReturn=0, value=types.SimpleNamespace(uiVal=2))]

    ns.nvmlDeviceGetFieldValues = fields
    ns.nvmlDeviceGetTemperature = lambda h, s: call("temp", h, 45)
    ns.nvmlDeviceGetPowerUsage = lambda h: call("power", h, 250500)
    ns.nvmlDeviceGetCurrentClocksEventReasons = lambda h: call("clocks", h, 0x40)
    ns.NVMLError_InvalidArgument, ns.NVML_NVLINK_MAX_LINKS, ns.NVML_FEATURE_ENABLED = (
        _InvalidArgument,
        18,
        1,
    )

    def nvlink(h: int, link: int) -> int:
        # 4 links per GPU; GPU 1's link 2 is down.
        if link >= 4:
            raise _InvalidArgument(2)
        return call("nvlink", h, 0 if (h, link) == (1, 2) else 1)

    ns.nvmlDeviceGetNvLinkState = nvlink
    return m


def test_pynvml_backend_reads_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _stand_in(lost=set(), unsupported=set())
    monkeypatch.setitem(sys.modules, "pynvml", lib)
    backend = PynvmlBackend()
    backend.init()
    try:
        assert backend.driver_version() == "570.86.15"
        gpu = backend.read(1)
        assert gpu.uuid == "GPU-1" and gpu.pci_bus_id == "00000000:19:00.0"
        assert (gpu.ecc_uncorrectable_volatile, gpu.ecc_uncorrectable_aggregate) == (2, 7)
        assert gpu.remapped_rows_pending is True and gpu.remapped_rows_failure is False
        assert gpu.recovery_action is RecoveryAction.NODE_REBOOT
        assert gpu.power_w == pytest.approx(250.5)
        assert gpu.throttle_reasons == 0x40 and gpu.unsupported == {}
        assert (gpu.nvlink_links, gpu.nvlink_down) == (4, [2])
        assert backend.read(0).nvlink_down == []
        assert backend.xid_events(0) == []
    finally:
        backend.shutdown()
    assert "shutdown" in lib.__dict__["calls"]


def test_pynvml_backend_unsupported_fields_and_lost_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        sys.modules, "pynvml", _stand_in(lost={1}, unsupported={"rows", "fields", "nvlink"})
    )
    backend = PynvmlBackend()
    backend.init()
    gpu = backend.read(0)
    assert gpu.remapped_rows_failure is None and gpu.recovery_action is None
    assert gpu.nvlink_links is None and gpu.nvlink_down is None  # a GPU without NVLink
    assert set(gpu.unsupported) == {"remapped_rows", "recovery_action", "nvlink"}
    assert gpu.temperature_c == 45  # the rest still read
    lost = backend.read(1)
    assert lost.lost and lost.ecc_uncorrectable_volatile is None
    backend.shutdown()


def test_pynvml_backend_without_init_is_a_typed_error() -> None:
    with pytest.raises(NvmlError):
        PynvmlBackend().device_count()
