"""Diagnose a few log lines, as the attribution tests do over and over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainmedic.catalog import Attributor
from trainmedic.domain import AttributionRequest, Diagnosis

ENGINE = Attributor()


def diagnose(tmp_path: Path, lines: list[str], **request: Any) -> Diagnosis:
    """The engine's diagnosis of `lines` written to a job log under `tmp_path`."""
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    return ENGINE.attribute(AttributionRequest(log_paths=[str(log)], **request))
