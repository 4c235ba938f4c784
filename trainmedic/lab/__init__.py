"""The Slurm lab: a real Slurm cluster (munged, slurmctld, one slurmd per node) on one machine."""

from trainmedic.lab.lab import (
    INSTALL_HINT,
    Lab,
    LabError,
    LabNode,
    LabStatus,
    find_free_port_base,
    port_free,
    require_binaries,
)
from trainmedic.lab.layout import DEFAULT_PORT_BASE, LabLayout, LabSpec

__all__ = [
    "DEFAULT_PORT_BASE",
    "INSTALL_HINT",
    "Lab",
    "LabError",
    "LabLayout",
    "LabNode",
    "LabSpec",
    "LabStatus",
    "find_free_port_base",
    "port_free",
    "require_binaries",
]
