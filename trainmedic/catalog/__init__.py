"""The failure catalog (versioned data) and the attribution engine built on it.

Public API: `Attributor().attribute(AttributionRequest) -> Diagnosis`, `load_catalog()`,
`Catalog.version` and the module-level `CATALOG_VERSION` (loaded on first access).
"""

from __future__ import annotations

from typing import Any

from trainmedic.catalog.engine import Attributor
from trainmedic.catalog.loader import Catalog, load_catalog
from trainmedic.catalog.matcher import Matcher
from trainmedic.catalog.model import CatalogError, Rule
from trainmedic.catalog.scanner import Scanner

__all__ = [
    "CATALOG_VERSION",
    "Attributor",
    "Catalog",
    "CatalogError",
    "Matcher",
    "Rule",
    "Scanner",
    "load_catalog",
]


def __getattr__(name: str) -> Any:
    # Loaded lazily so importing the package never parses YAML (workflow sandboxes).
    if name == "CATALOG_VERSION":
        return load_catalog().version
    raise AttributeError(name)
