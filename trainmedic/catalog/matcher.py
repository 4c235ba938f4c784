"""Match single lines against the catalog, with a cheap literal prefilter first.

The prefilter is one bytes regex of every rule's trigger literals; only lines that
contain a trigger are decoded and run through the per-rule regexes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trainmedic.catalog.loader import XID_REGEX, Catalog
from trainmedic.catalog.model import Rule
from trainmedic.domain import Role


@dataclass(frozen=True, slots=True)
class LineMatch:
    rule: Rule
    xid: int | None = None
    pci: str | None = None


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: Rule
    regex: re.Pattern[str]
    triggers: tuple[str, ...]
    ignore_case: bool


def trie_regex(words: list[str]) -> bytes:
    """One bytes regex matching any of `words`, factored as a trie.

    re tries alternatives one by one at every position; sharing prefixes makes a
    ~200-literal prefilter an order of magnitude faster than a flat alternation.
    A word that contains a shorter word is dropped: the shorter one already fires.
    """
    kept: list[bytes] = []
    for word in sorted({w.encode() for w in words}, key=len):
        if not any(k in word for k in kept):
            kept.append(word)
    root: dict[int, Any] = {}
    for word in kept:
        node = root
        for byte in word:
            node = node.setdefault(byte, {})
        node[-1] = {}

    def emit(node: dict[int, Any]) -> bytes:
        if -1 in node:
            return b""  # a whole word ends here; longer ones were dropped above
        alts = [re.escape(bytes([k])) + emit(v) for k, v in sorted(node.items())]
        return alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"

    return emit(root) if root else b"(?!)"


class Matcher:
    """Compiled view of a Catalog. Thread-safe after construction (read-only)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._patterns: list[_Compiled] = []
        cs_triggers: set[str] = set()
        ci_triggers: set[str] = set()
        for rule in catalog.rules:
            if rule.xid is not None:
                continue  # all Xid rules share one regex, dispatched by number
            for pattern in rule.patterns:
                triggers = tuple(t.lower() if pattern.ignore_case else t for t in pattern.triggers)
                self._patterns.append(
                    _Compiled(rule, pattern.compiled(), triggers, pattern.ignore_case)
                )
                (ci_triggers if pattern.ignore_case else cs_triggers).update(triggers)
        self._xid = re.compile(XID_REGEX)
        self._xid_rules = catalog.xid_rules
        if self._xid_rules:
            cs_triggers.add("Xid")
        self.triggers = sorted(cs_triggers | ci_triggers)
        # Case-insensitive triggers become their usual spellings so the prefilter stays
        # one case-sensitive pattern (an inline (?i:) group defeats re's optimisations).
        literals = set(cs_triggers)
        for trigger in ci_triggers:
            literals.update({trigger, trigger.upper(), trigger.capitalize()})
        self.prefilter = re.compile(trie_regex(sorted(literals)))

    def match(self, line: str) -> list[LineMatch]:
        """Every rule matching this line (already decoded, without newline)."""
        found: list[LineMatch] = []
        lowered: str | None = None
        for compiled in self._patterns:
            if compiled.ignore_case:
                if lowered is None:
                    lowered = line.lower()
                haystack = lowered
            else:
                haystack = line
            if not any(t in haystack for t in compiled.triggers):
                continue
            if compiled.regex.search(line) and not any(f.rule is compiled.rule for f in found):
                found.append(LineMatch(compiled.rule))
        if "Xid" in line and self._xid_rules:
            for hit in self._xid.finditer(line):
                rule = self._xid_rules.get(int(hit.group("xid")))
                if rule is not None and not any(f.rule is rule for f in found):
                    found.append(LineMatch(rule, int(hit.group("xid")), hit.group("pci")))
                break  # one Xid per line: the first is the event, the rest is payload
        if len(found) > 1 and any(f.rule.role is Role.CASCADE for f in found):
            # A line that is a known cascade is not also a generic user-code error.
            found = [f for f in found if not (f.rule.role is Role.ROOT and f.rule.precedence < 25)]
        return found
