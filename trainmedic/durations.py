"""Human durations ("90s", "15m", "1h30m", "2d") as timedelta, for settings and policy."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
# Far beyond any sensible timeout, far below timedelta's own overflow: a typo like
# 99999999999d gets a clear error instead of an OverflowError traceback.
MAX_DURATION = timedelta(days=3650)


def _seconds(seconds: float, value: Any) -> timedelta:
    if not math.isfinite(seconds) or seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"'{value}' is out of range: at most {MAX_DURATION.days}d")
    return timedelta(seconds=seconds)


def parse_duration(value: Any) -> Any:
    """Accept '1h30m', '45s', a number of seconds, or anything pydantic takes."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return _seconds(float(value), value)
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if text and _PART.sub("", text) == "":
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(text))
            return _seconds(seconds, value)
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return _seconds(float(text), value)
        if not text.startswith("p"):  # let ISO 8601 ("PT15M") through to pydantic
            raise ValueError(f"'{value}' is not a duration; write e.g. 90s, 15m, 1h30m, 2d")
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def format_duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60}m"
    return f"{delta.total_seconds():g}s"
