"""Load the catalog data files into one validated Catalog.

Every file under data/ is read; all must carry the same version string. Unknown
values fail in pydantic, duplicates and dangling Xid buckets fail here.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainmedic.catalog.model import (
    BucketPolicy,
    CatalogError,
    CatalogFile,
    Pattern,
    Rule,
    XidBucket,
    XidEntry,
)
from trainmedic.strict_yaml import UniqueKeyLoader

log = logging.getLogger(__name__)

# Kernel-log Xid lines: "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
# Older drivers print "NVRM: Xid (0000:3b:00): 79, ..."; NVML findings may say "Xid 79", and
# the Kubernetes device plugin's health check "XidCriticalError: Xid=79 on Device=GPU-...".
# The number is captured and dispatched through the Xid table.
# The GPU's PCI address is captured where it is one; a placeholder that a report
# redacted it to ("(PCI:...)", "(PCI:xxxx:xx:xx)") still leaves the Xid readable.
XID_REGEX = (
    r"(?<![A-Za-z])Xid(?: \((?:PCI:)?(?:(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
    r"(?:\.[0-9A-Fa-f])?)|[^()\d][^()]{0,30})\))?[:=]? *(?P<xid>\d{1,3})\b"
)


class Catalog:
    """The loaded catalog: rules by id, the Xid table, and the version string."""

    def __init__(
        self,
        version: str,
        rules: list[Rule],
        xids: dict[int, XidEntry],
        sources: list[str] | None = None,
    ) -> None:
        self.version = version
        self.rules = rules
        self.by_id: dict[str, Rule] = {}
        for rule in rules:
            if rule.id in self.by_id:
                raise CatalogError(f"duplicate rule id {rule.id!r}")
            self.by_id[rule.id] = rule
        self.xids = xids
        self.xid_rules: dict[int, Rule] = {r.xid: r for r in rules if r.xid is not None}
        self.sources = sources or []

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        return f"Catalog(version={self.version!r}, rules={len(self.rules)})"


def _xid_rule(entry: XidEntry, policy: BucketPolicy) -> Rule:
    name = entry.title or entry.description
    if not name or name in ("Unused", "Reserved") or name.startswith("Reserved "):
        name = entry.mnemonic.replace("_", " ").lower()
    transient = entry.transient if "transient" in entry.model_fields_set else policy.transient
    return Rule(
        id=f"kernel.xid_{entry.xid}",
        title=f"{name} (Xid {entry.xid})"[:80],
        role=policy.role,
        category=entry.category or policy.category,
        action=entry.action or policy.action,
        transient=transient,
        confidence=policy.confidence,
        precedence=policy.precedence,
        blames_node=policy.blames_node,
        description=f"Xid {entry.xid} {entry.mnemonic}: {entry.description} "
        f"(NVIDIA immediate action {entry.immediate.value})",
        patterns=[Pattern(regex=XID_REGEX.replace(r"\d{1,3}", str(entry.xid)), triggers=["Xid"])],
        examples=[
            f"kernel: NVRM: Xid (PCI:0000:3b:00): {entry.xid}, pid=4242, name=python, "
            f"{entry.description or entry.mnemonic}"
        ],
        xid=entry.xid,
    )


def parse_files(texts: dict[str, str]) -> Catalog:
    """Build a Catalog from {source name: YAML text}. Raises CatalogError."""
    versions: dict[str, str] = {}
    rules: list[Rule] = []
    buckets: dict[XidBucket, BucketPolicy] = {}
    xids: dict[int, XidEntry] = {}
    for name in sorted(texts):
        try:
            raw: Any = yaml.load(texts[name], Loader=UniqueKeyLoader)  # a SafeLoader
        except yaml.YAMLError as error:
            raise CatalogError(f"{name}: not valid YAML: {error}") from error
        if not isinstance(raw, dict):
            raise CatalogError(f"{name}: expected a mapping with 'version' and 'rules'")
        try:
            parsed = CatalogFile.model_validate(raw)
        except ValidationError as error:
            raise CatalogError(f"{name}: {error}") from error
        versions[name] = parsed.version
        rules.extend(parsed.rules)
        buckets.update(parsed.xid_buckets)
        for entry in parsed.xids:
            if entry.xid in xids:
                raise CatalogError(f"{name}: duplicate Xid {entry.xid}")
            xids[entry.xid] = entry
    if not versions:
        raise CatalogError("no catalog data files found")
    distinct = set(versions.values())
    if len(distinct) != 1:
        raise CatalogError(f"catalog files disagree on the version: {versions}")
    for entry in xids.values():
        if entry.immediate not in buckets:
            raise CatalogError(f"Xid {entry.xid}: no policy for bucket {entry.immediate.value}")
        rules.append(_xid_rule(entry, buckets[entry.immediate]))
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise CatalogError(f"duplicate rule id {rule.id!r}")
        seen.add(rule.id)
    return Catalog(distinct.pop(), rules, dict(sorted(xids.items())), sorted(texts))


def load_catalog(directory: str | Path | None = None) -> Catalog:
    """Load every *.yaml under `directory` (default: the packaged data)."""
    texts: dict[str, str] = {}
    if directory is None:
        root = resources.files("trainmedic.catalog").joinpath("data")
        for item in root.iterdir():
            if item.name.endswith(".yaml"):
                texts[item.name] = item.read_text(encoding="utf-8")
    else:
        path = Path(directory)
        if not path.is_dir():
            raise CatalogError(f"catalog directory {path} does not exist")
        for file in sorted(path.glob("*.yaml")):
            texts[file.name] = file.read_text(encoding="utf-8")
    catalog = parse_files(texts)
    log.debug("loaded catalog %s: %d rules", catalog.version, len(catalog.rules))
    return catalog
