"""NVML: the GPUs' own view of their health (ECC, Xid events, the driver's recovery action).

`FakeNvml` (the lab's and the tests' GPUs) is loaded only when asked for, so importing
this package on a real node loads no fake.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from trainmedic.adapters.nvml.fake import FakeNvml

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


def __getattr__(name: str) -> Any:
    if name == "FakeNvml":
        from trainmedic.adapters.nvml.fake import FakeNvml

        return FakeNvml
    raise AttributeError(name)
