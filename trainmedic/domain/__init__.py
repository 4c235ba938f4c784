"""Pure pydantic models and enums, no I/O: safe to import inside workflows."""

from trainmedic.domain.diagnosis import (
    AttributionRequest,
    Diagnosis,
    Evidence,
    SlurmObservation,
)
from trainmedic.domain.enums import (
    ISOLATING,
    RESTART_FAMILY,
    Action,
    Category,
    EvidenceSource,
    Mode,
    Outcome,
    Role,
    Stage,
)

__all__ = [
    "ISOLATING",
    "RESTART_FAMILY",
    "Action",
    "AttributionRequest",
    "Category",
    "Diagnosis",
    "Evidence",
    "EvidenceSource",
    "Mode",
    "Outcome",
    "Role",
    "SlurmObservation",
    "Stage",
]
