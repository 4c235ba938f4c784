"""NVML: the GPUs' own view of their health (ECC, Xid events, the driver's recovery action)."""

from trainmedic.adapters.nvml.fake import FakeNvml
from trainmedic.adapters.nvml.protocol import (
    GpuHealth,
    NvmlBackend,
    NvmlError,
    NvmlFinding,
    RecoveryAction,
    XidEvent,
    findings,
    xid_finding,
)
from trainmedic.adapters.nvml.pynvml_backend import PynvmlBackend

__all__ = [
    "FakeNvml",
    "GpuHealth",
    "NvmlBackend",
    "NvmlError",
    "NvmlFinding",
    "PynvmlBackend",
    "RecoveryAction",
    "XidEvent",
    "findings",
    "xid_finding",
]
