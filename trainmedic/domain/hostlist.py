"""Slurm hostlist expressions: 'gpu[01-03,07],login1' <-> ['gpu01', 'gpu02', ...].

Pure functions, safe in workflows. Node names are validated here because every
Slurm command trainmedic builds takes names from this module or from Slurm itself.
"""

from __future__ import annotations

import re

# Slurm node names: letters, digits, '-', '_', '.'; we refuse anything a shell or an
# option parser could misread (leading '-', spaces, quotes, '=').
NODE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(ValueError):
    """A hostlist expression or node name that Slurm would not accept."""


def validate_node_name(name: str) -> str:
    if not NODE_NAME.match(name):
        raise HostlistError(f"invalid node name {name!r}")
    return name


def _split_top_level(expr: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in expr:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in {expr!r}")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def expand(expr: str, limit: int = 100_000) -> list[str]:
    """Expand a hostlist; order kept, duplicates kept out."""
    names: list[str] = []
    seen: set[str] = set()
    for part in _split_top_level(expr.strip()):
        for name in _expand_one(part, limit):
            validate_node_name(name)
            if name not in seen:
                seen.add(name)
                names.append(name)
            if len(names) > limit:
                raise HostlistError(f"hostlist expands to more than {limit} names")
    return names


def _expand_one(part: str, limit: int) -> list[str]:
    match = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
    if not match:
        return [part]
    prefix, ranges, rest = match.groups()
    suffixes = _expand_one(rest, limit) if rest else [""]
    out: list[str] = []
    for item in ranges.split(","):
        found = _RANGE.match(item.strip())
        if not found:
            raise HostlistError(f"bad range {item!r} in {part!r}")
        low_text, high_text = found.group(1), found.group(2) or found.group(1)
        low, high = int(low_text), int(high_text)
        if high < low:
            raise HostlistError(f"descending range {item!r} in {part!r}")
        if (high - low + 1) * len(suffixes) > limit:
            raise HostlistError(f"hostlist expands to more than {limit} names")
        width = len(low_text) if low_text.startswith("0") else 0
        for number in range(low, high + 1):
            for suffix in suffixes:
                out.append(f"{prefix}{number:0{width}d}{suffix}")
    return out


def compress(names: list[str]) -> str:
    """The inverse of expand for 'prefix + number' names: ['gpu01','gpu02'] -> 'gpu[01-02]'."""
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int] | str] = []
    for name in names:
        match = re.match(r"^(.*?)(\d+)$", name)
        if not match:
            order.append(name)
            continue
        key = (match.group(1), len(match.group(2)))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(match.group(2)))
    parts: list[str] = []
    for entry in order:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, width = entry
        key = entry
        numbers = sorted(set(groups[key]))
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        spans: list[str] = []
        start = prev = numbers[0]
        for number in [*numbers[1:], None]:
            if number is not None and number == prev + 1:
                prev = number
                continue
            spans.append(
                f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
            )
            if number is not None:
                start = prev = number
        parts.append(f"{prefix}[{','.join(spans)}]")
    return ",".join(parts)
