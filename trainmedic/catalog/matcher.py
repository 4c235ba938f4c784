"""Match single lines against the catalog, with a cheap literal prefilter first.

The prefilter is one bytes regex of every rule's trigger literals; only lines that
contain a trigger are decoded and run through the per-rule regexes. It is compiled
with RE2 (google-re2, a required dependency): RE2 runs a literal alternation as one
DFA pass, ~30x faster than `re`, which tries the alternatives at every byte
(bench/scan_speed.py). `use_re2=False` builds the same prefilter with `re` over a
trie-factored alternation, with the same matches: the tests' cross-check and the
bench's baseline.

The per-rule regexes run on RE2 too wherever RE2 can express them. A job's log is its
owner's input, and `re` backtracks: one hostile line against a pattern with nested or
adjacent repeats took seconds, four times in three reviews (bench/regex_worst_case.py
found them one by one). RE2 runs in time linear in the line, which ends that class for
every pattern it accepts. Patterns that RE2 cannot express, or would read differently,
stay on `re` (needs_python_re; `Matcher.on_python_re` lists them: today lookarounds,
and one count above RE2's 1000) and the bench still times them.

Where both engines run a pattern they still differ on some characters: RE2's `\\d`, `\\w`
and `\\b` are ASCII where `re`'s follow Unicode, its `\\s` leaves out `\\v` and Unicode
spaces (NBSP), and its case folding differs for a few letters (the dotless i). A test
runs both engines over every line of the corpora and every rule's examples and finds
the same matches and the same captured groups; no real log line seen so far tells them
apart. A line with a lone surrogate (only evidence that arrived as JSON can carry one)
has no UTF-8 form: RE2 reads it with the surrogate replaced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import re2

from trainmedic.catalog.correlation import undecorate
from trainmedic.catalog.loader import XID_REGEX, Catalog
from trainmedic.catalog.model import Rule
from trainmedic.domain import EvidenceSource, Role

# RE2 memory for the prefilter's lazily built DFA. When the state cache fills RE2
# flushes it and goes on, so this bounds memory; 8 MiB (RE2's default) already holds
# the catalog's automaton, the headroom is for much larger catalogs.
_RE2_MAX_MEM = 32 << 20


class PatternMatch(Protocol):
    def groupdict(self) -> dict[str, str | None]: ...


class LinePattern(Protocol):
    """What a rule's compiled regex offers the matcher: `re.Pattern[str]` or RE2's."""

    @property
    def groupindex(self) -> Mapping[str, int]: ...
    def search(self, text: str) -> PatternMatch | None: ...


# Group openings that RE2 does not have: lookarounds, backreferences by name, atomic
# groups, comments and conditionals.
_PYTHON_ONLY_GROUPS = ("(?=", "(?!", "(?<=", "(?<!", "(?P=", "(?>", "(?#", "(?(")
# Escapes RE2 does not have: \Z (RE2 spells it \z) and Python's Unicode escapes.
_PYTHON_ONLY_ESCAPES = frozenset("ZuUN0123456789")
# Inline flags RE2 does not have (it has i, m, s and U).
_PYTHON_ONLY_FLAGS = frozenset("aLux")
_INLINE_FLAGS = re.compile(r"\(\?([a-zA-Z-]+)[:)]")
_RE2_MAX_REPEAT = 1000


def needs_python_re(regex: str) -> bool:
    """Must `regex` stay on `re`: does it use what RE2 cannot express (lookarounds,
    backreferences, atomic groups, possessive repeats, a count above RE2's 1000,
    comments, conditionals, \\Z, Unicode escapes, the flags a, L, u and x), or what RE2
    reads differently (`{,n}` is a repeat to `re` and text to RE2; `[[:alpha:]]` is a set
    of characters to `re` and a POSIX class to RE2)? Such patterns are not offered to
    RE2, which would log a parse error for each or, worse, match something else."""
    i, in_class, after_repeat = 0, False, False
    while i < len(regex):
        char = regex[i]
        if char == "\\":
            if regex[i + 1 : i + 2] in _PYTHON_ONLY_ESCAPES:
                return True  # a backreference, an octal escape, \Z, \u, \U, \N
            i, after_repeat = i + 2, False
            continue
        if in_class:
            if char == "[" and regex[i + 1 : i + 2] == ":":
                return True  # RE2 would read a POSIX class here
            in_class = char != "]"
            i += 1
            continue
        if char == "[":
            in_class = True
            i += 1
            if regex[i : i + 1] == "^":
                i += 1
            if regex[i : i + 1] == "]":
                i += 1  # a leading ] is a literal inside the class
            elif regex[i : i + 2] == "[:":
                return True
            after_repeat = False
            continue
        if char == "(" and regex[i + 1 : i + 2] == "?":
            if regex.startswith(_PYTHON_ONLY_GROUPS, i):
                return True
            flags = _INLINE_FLAGS.match(regex, i)
            if flags and _PYTHON_ONLY_FLAGS.intersection(flags.group(1)):
                return True
        if char == "{":
            close = regex.find("}", i)
            bounds = regex[i + 1 : close].split(",") if close > i else []
            if bounds and all(b.isdigit() or b == "" for b in bounds):
                if bounds[0] == "" or any(b and int(b) > _RE2_MAX_REPEAT for b in bounds):
                    return True
                i, after_repeat = close + 1, True
                continue
        if char == "+" and after_repeat:
            return True  # possessive
        # "?" after a repeat makes it lazy, which RE2 has; it ends the repeat.
        after_repeat = char in "*+?" and not after_repeat
        i += 1
    return False


def linear_regex(regex: str, *, ignore_case: bool) -> LinePattern | None:
    """`regex` compiled by RE2 (linear time in the line), or None where RE2 cannot run it."""
    if needs_python_re(regex):
        return None
    options = re2.Options()
    options.case_sensitive = not ignore_case
    try:
        compiled: LinePattern = re2.compile(regex, options)
    except re2.error:
        return None
    return compiled


class PrefilterMatch(Protocol):
    def start(self) -> int: ...
    def end(self) -> int: ...


class Prefilter(Protocol):
    """What the scanner and the log watcher need: `re.Pattern[bytes]`'s search API."""

    def search(
        self, text: bytes | bytearray, pos: int = ..., endpos: int = ...
    ) -> PrefilterMatch | None: ...
    def finditer(
        self, text: bytes | bytearray, pos: int = ..., endpos: int = ...
    ) -> Iterator[Any]: ...


@dataclass(frozen=True, slots=True)
class LineMatch:
    rule: Rule
    xid: int | None = None
    pci: str | None = None
    # What the line itself names (a pattern's named groups): "Rank 1 is running ...",
    # "Worker IP address: 10.0.7.57", "SeqNum=70002".
    rank: int | None = None
    # A list of ranks the line names ("[missing ranks: 3, 6]"); each is blamed alike.
    ranks: tuple[int, ...] = ()
    host: str | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: Rule
    regex: LinePattern
    triggers: tuple[str, ...]
    ignore_case: bool
    captures: bool  # the regex has named groups worth reading


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


def _minimal(words: Iterable[str], covered_by: Iterable[str] = ()) -> list[str]:
    """`words` less those containing a shorter word (or one of `covered_by`)."""
    kept = list(covered_by)
    out: list[str] = []
    for word in sorted(set(words), key=lambda w: (len(w), w)):
        if not any(k in word for k in kept):
            kept.append(word)
            out.append(word)
    return out


def literal_alternation(cs_triggers: Iterable[str], ci_triggers: Iterable[str]) -> bytes:
    """One RE2 pattern for the triggers: plain literals, then a `(?i:...)` group.

    RE2 folds case inside its DFA at no cost, so case-insensitive triggers match any
    spelling (the `re` fallback only knows three). A trigger containing a shorter one
    is left out: the shorter one fires first, and the DFA stays small.
    """
    ci = _minimal(t.lower() for t in ci_triggers)
    cs = [t for t in _minimal(cs_triggers) if not any(k in t.lower() for k in ci)]
    parts = [re.escape(t) for t in cs]
    if ci:
        parts.append("(?i:" + "|".join(re.escape(t) for t in ci) + ")")
    return "|".join(parts).encode() if parts else b"(?!)"


def compile_prefilter(
    cs_triggers: Iterable[str], ci_triggers: Iterable[str], *, use_re2: bool = True
) -> Prefilter:
    """The trigger prefilter: RE2, or `re` over a trie when asked (`use_re2=False`)."""
    cs, ci = set(cs_triggers), set(ci_triggers)
    if use_re2 and (cs or ci):  # RE2 has no (?!): an empty catalog falls through to re
        options = re2.Options()
        options.max_mem = _RE2_MAX_MEM
        prefilter: Prefilter = re2.compile(literal_alternation(cs, ci), options)
        return prefilter
    # Case-insensitive triggers become their usual spellings so the prefilter stays
    # one case-sensitive pattern (an inline (?i:) group defeats re's optimisations).
    literals = set(cs)
    for trigger in ci:
        literals.update({trigger, trigger.upper(), trigger.capitalize()})
    return re.compile(trie_regex(sorted(literals)))


_DECOR_STARTS = frozenset(">[0123456789 \t")


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _numbers(text: str | None) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text)) if text else ()


def _with_captures(rule: Rule, hit: PatternMatch) -> LineMatch:
    groups = hit.groupdict()
    return LineMatch(
        rule,
        rank=_number(groups.get("rank")),
        ranks=_numbers(groups.get("ranks")),
        host=groups.get("host") or None,
        seq=_number(groups.get("seq")),
    )


class Matcher:
    """Compiled view of a Catalog. Thread-safe after construction (read-only)."""

    def __init__(self, catalog: Catalog, *, use_re2: bool = True) -> None:
        self.catalog = catalog
        self._patterns: list[_Compiled] = []
        # The rule patterns left to `re`'s backtracking (needs_python_re), as (rule id,
        # regex): bench/regex_worst_case.py asks linear_regex the same and times them.
        self.on_python_re: list[tuple[str, str]] = []
        cs_triggers: set[str] = set()
        ci_triggers: set[str] = set()
        for rule in catalog.rules:
            if rule.xid is not None:
                continue  # all Xid rules share one regex, dispatched by number
            for pattern in rule.patterns:
                triggers = tuple(t.lower() if pattern.ignore_case else t for t in pattern.triggers)
                regex: LinePattern | None = None
                if use_re2:
                    regex = linear_regex(pattern.regex, ignore_case=pattern.ignore_case)
                if regex is None:
                    regex = pattern.compiled()
                    self.on_python_re.append((rule.id, pattern.regex))
                self._patterns.append(
                    _Compiled(rule, regex, triggers, pattern.ignore_case, bool(regex.groupindex))
                )
                (ci_triggers if pattern.ignore_case else cs_triggers).update(triggers)
        self._xid = re.compile(XID_REGEX)
        self._xid_rules = catalog.xid_rules
        if self._xid_rules:
            cs_triggers.add("Xid")
        self.triggers = sorted(cs_triggers | ci_triggers)
        # use_re2=False forces the `re` prefilter: for tests and the bench's baseline.
        self.prefilter: Prefilter = compile_prefilter(cs_triggers, ci_triggers, use_re2=use_re2)
        # Trigger -> indexes of the patterns it gates. Testing each distinct trigger once
        # per line is ~10x cheaper than each pattern testing its own (dense logs: many
        # candidate lines).
        cs_index: dict[str, list[int]] = {}
        ci_index: dict[str, list[int]] = {}
        for index, compiled in enumerate(self._patterns):
            index_of = ci_index if compiled.ignore_case else cs_index
            for trigger in compiled.triggers:
                index_of.setdefault(trigger, []).append(index)
        self._cs_index = tuple((t, tuple(i)) for t, i in cs_index.items())
        self._ci_index = tuple((t, tuple(i)) for t, i in ci_index.items())
        # With RE2, one Set match names every trigger in the line in one pass (~1 us,
        # against ~20 us for ~200 substring tests).
        self._trigger_set: Any = None
        self._set_index = self._cs_index + self._ci_index
        if type(self.prefilter).__module__.startswith("re2"):
            options = re2.Options()
            options.max_mem = _RE2_MAX_MEM
            trigger_set = re2.Set.SearchSet(options)
            for trigger, _ in self._cs_index:
                trigger_set.Add(re.escape(trigger))
            for trigger, _ in self._ci_index:
                trigger_set.Add("(?i:" + re.escape(trigger) + ")")
            trigger_set.Compile()
            self._trigger_set = trigger_set

    def match(
        self, line: str, source: EvidenceSource | None = EvidenceSource.LOG
    ) -> list[LineMatch]:
        """Every rule matching this line (already decoded, without newline) that reads
        lines from `source`: a rule naming its sources (the Slurm-state rules) ignores a
        job's log printing the same words. `None`: text of no known origin (a node's
        free-text reason), read only by rules that accept any source."""
        if "\x1b" in line or line[:1] in _DECOR_STARTS:
            # Coloured output (rich tracebacks, loguru, Ray) puts escape codes between a
            # message's words and its end, and a quoted or shipped log puts "> " or a
            # timestamp before its start: the rules read what the program wrote.
            line = undecorate(line)
        found: list[LineMatch] = []
        candidates: set[int] = set()
        if self._trigger_set is not None:
            try:
                numbers = self._trigger_set.Match(line)
            except UnicodeEncodeError:  # a lone surrogate: no UTF-8 form for RE2
                line = line.encode("utf-8", "replace").decode("utf-8")
                numbers = self._trigger_set.Match(line)
            for number in numbers or ():
                candidates.update(self._set_index[number][1])
        else:
            for trigger, indexes in self._cs_index:
                if trigger in line:
                    candidates.update(indexes)
            if self._ci_index:
                lowered = line.lower()
                for trigger, indexes in self._ci_index:
                    if trigger in lowered:
                        candidates.update(indexes)
        for index in sorted(candidates):  # catalog order, as rules are listed
            compiled = self._patterns[index]
            if any(f.rule is compiled.rule for f in found):
                continue
            if compiled.rule.sources and source not in compiled.rule.sources:
                continue
            hit = compiled.regex.search(line)
            if hit is None:
                continue
            if compiled.captures:
                found.append(_with_captures(compiled.rule, hit))
            else:
                found.append(LineMatch(compiled.rule))
        if "Xid" in line and self._xid_rules:
            for hit in self._xid.finditer(line):
                rule = self._xid_rules.get(int(hit.group("xid")))
                if rule is not None and not any(f.rule is rule for f in found):
                    found.append(LineMatch(rule, int(hit.group("xid")), hit.group("pci")))
                break  # one Xid per line: the first is the event, the rest is payload
        if len(found) > 1 and any(f.rule.role is Role.CONTEXT for f in found):
            # Context rules explain lines nothing else does (a wrapped message's prefix, a
            # summary field); on a line another rule matched they only take evidence slots.
            found = [f for f in found if f.rule.role is not Role.CONTEXT] or found
        if len(found) > 1 and any(f.rule.generic for f in found):
            # A line that a specific rule explains (a known cascade, the rendezvous, a
            # checkpoint mismatch) is not also a generic exception of the program (other
            # weak roots, such as a SIGKILL in torchelastic's summary, stay).
            specific = [f for f in found if not f.rule.generic]
            if specific:
                found = specific
            else:  # only generic ones: the exception class that is named beats "any class"
                top = max(f.rule.precedence for f in found)
                found = [f for f in found if f.rule.precedence == top]
        return found
