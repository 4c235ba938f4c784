"""The real pynvml backend against real GPUs. Skipped where NVML cannot initialise.

Run on a GPU machine with `tests/gpu/run.sh` (or `pytest tests/gpu`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from trainmedic.adapters.nvml import GpuHealth, NvmlError, PynvmlBackend, RecoveryAction, findings
from trainmedic.catalog import Matcher, load_catalog
from trainmedic.watchers.node import pci_key


def _nvml_reason() -> str | None:
    try:
        import pynvml
    except ImportError as error:
        return f"pynvml not installed: {error}"
    try:
        pynvml.nvmlInit()
    except Exception as error:
        return f"NVML unavailable: {error}"
    pynvml.nvmlShutdown()
    return None


pytestmark = pytest.mark.skipif(_nvml_reason() is not None, reason=str(_nvml_reason()))


@pytest.fixture(scope="module")
def backend() -> Iterator[PynvmlBackend]:
    nvml = PynvmlBackend()
    nvml.init()
    yield nvml
    nvml.shutdown()


def test_devices_and_every_field(backend: PynvmlBackend) -> None:
    version = backend.driver_version()
    assert version and re.match(r"^\d+\.\d+", version)
    count = backend.device_count()
    assert count >= 1
    seen_uuids: set[str] = set()
    for index in range(count):
        gpu = backend.read(index)
        print(f"gpu {index}: {gpu.model_dump_json()}")
        assert isinstance(gpu, GpuHealth) and gpu.index == index
        assert not gpu.lost, "a GPU is lost on the test machine"
        assert gpu.uuid and gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.uuid not in seen_uuids
        seen_uuids.add(gpu.uuid)
        assert gpu.pci_bus_id and pci_key(gpu.pci_bus_id) is not None
        if gpu.temperature_c is not None:
            assert 0 < gpu.temperature_c < 120
        if gpu.power_w is not None:
            assert 0 <= gpu.power_w < 2000
        for field in ("ecc_uncorrectable_volatile", "ecc_uncorrectable_aggregate"):
            value = getattr(gpu, field)
            assert value is None or (isinstance(value, int) and value >= 0)
        assert gpu.recovery_action is None or isinstance(gpu.recovery_action, RecoveryAction)
        for flag in ("retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure"):
            assert getattr(gpu, flag) in (None, True, False)
        # Every field is either read or said to be unsupported, with NVML's reason.
        for name, reason in gpu.unsupported.items():
            assert reason, name
        # A healthy machine's reading against itself: nothing new.
        assert findings(gpu, gpu) == []


def test_findings_of_a_real_reading_match_the_catalog(backend: PynvmlBackend) -> None:
    matcher = Matcher(load_catalog())
    for index in range(backend.device_count()):
        for finding in findings(None, backend.read(index)):
            print(f"standing finding: {finding.text}")
            if finding.field in ("recovery_action", "row_remap_failure", "gpu_lost"):
                assert matcher.match(finding.text), finding.text


def test_xid_events_poll_returns_quickly(backend: PynvmlBackend) -> None:
    events = backend.xid_events(timeout_ms=100)
    assert isinstance(events, list)
    assert all(e.gpu >= -1 and e.xid >= 0 for e in events)


def test_init_error_is_typed_without_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def fail() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    with pytest.raises(NvmlError):
        PynvmlBackend().init()
