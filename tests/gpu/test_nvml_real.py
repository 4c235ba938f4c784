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


def test_nvlink_fields(backend: PynvmlBackend) -> None:
    """Links read with nvmlDeviceGetNvLinkState: a count and the inactive ones, or None
    with NVML's reason for a GPU without NVLink."""
    for index in range(backend.device_count()):
        gpu = backend.read(index)
        print(f"gpu {index}: nvlink_links={gpu.nvlink_links} nvlink_down={gpu.nvlink_down}")
        if gpu.nvlink_links is None:
            assert gpu.nvlink_down is None and "nvlink" in gpu.unsupported
        else:
            assert gpu.nvlink_down is not None
            assert all(0 <= link < gpu.nvlink_links for link in gpu.nvlink_down)


async def test_the_node_health_check_on_real_gpus() -> None:
    """The quarantine's health check, as the node agent runs it, on this machine: every
    NVML check is present; on a healthy machine none fails. dcgmi runs where installed."""
    import uuid
    from datetime import UTC, datetime

    from trainmedic.domain.health import NodeHealthRequest
    from trainmedic.health import HealthConfig, NodeHealthChecker

    nvml = PynvmlBackend()
    nvml.init()
    count = nvml.device_count()
    nvml.shutdown()
    checker = NodeHealthChecker("this-node", PynvmlBackend(), HealthConfig(dcgm_timeout_s=300))
    request = NodeHealthRequest(
        node="this-node", nonce=uuid.uuid4().hex, at=datetime.now(UTC), expected_gpus=count
    )
    report = await checker.check(request)
    for check in report.checks:
        state = "unknown" if check.unknown else "skipped" if check.skipped else check.ok
        print(f"health {check.name}: {state} - {check.detail}")
    names = {c.name for c in report.checks}
    assert {"gpu_count", "row_remap", "ecc", "recovery_action", "nvlink"} <= names
    assert report.driver_version
    assert report.healthy, report.detail
