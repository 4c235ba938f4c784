"""The quarantine's GPU health reading: what NVML says must keep a node out."""

from __future__ import annotations

from trainmedic.activities.quarantine import unhealthy_gpus
from trainmedic.adapters.nvml.fake import FakeNvml
from trainmedic.adapters.nvml.protocol import RecoveryAction


def test_healthy_gpus_say_nothing() -> None:
    assert unhealthy_gpus(FakeNvml(gpus=8)) == []


def test_each_kind_of_damage_is_named() -> None:
    nvml = FakeNvml(gpus=8)
    nvml.set(1, lost=True)
    nvml.set(3, ecc_uncorrectable_volatile=2)
    nvml.set(5, remapped_rows_failure=True)
    nvml.set(6, recovery_action=RecoveryAction.NODE_REBOOT)
    nvml.set(7, recovery_action=RecoveryAction.NONE)  # the driver's "nothing to do"
    problems = unhealthy_gpus(nvml)
    assert problems == [
        "gpu 1 lost (fallen off the bus)",
        "gpu 3 2 uncorrectable ECC",
        "gpu 5 row remapping failed",
        "gpu 6 driver asks for NODE_REBOOT",
    ]
