"""`trainmedic audit export -o FILE` replaces FILE only with a complete export."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainmedic.audit import AuditRecord
from trainmedic.cli import audit as audit_cli
from trainmedic.errors import ServiceError

OLD = '{"kind": "an earlier export"}\n'


def record(kind: str) -> AuditRecord:
    return AuditRecord(
        time=datetime(2026, 1, 1, tzinfo=UTC),
        kind=kind,
        workflow_id="incident-lab-7-1",
        workflow_type="RecoveryWorkflow",
        event_id=1,
    )


@pytest.fixture
def old_export(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    path.write_text(OLD)
    path.chmod(0o640)
    return path


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "audit.jsonl")


def test_unreachable_temporal_leaves_the_old_file_untouched(
    monkeypatch: pytest.MonkeyPatch, old_export: Path
) -> None:
    async def refuse(*_: Any, **__: Any) -> Any:
        raise ServiceError("cannot reach Temporal at 127.0.0.1:1")

    monkeypatch.setattr(audit_cli, "connect", refuse)
    result = CliRunner().invoke(audit_cli.app, ["export", "-o", str(old_export)])
    assert result.exit_code == 2
    assert "cannot reach Temporal" in result.output
    assert old_export.read_text() == OLD
    assert leftovers(old_export.parent) == []


def test_a_failure_half_way_leaves_the_old_file_untouched(
    monkeypatch: pytest.MonkeyPatch, old_export: Path
) -> None:
    async def connect(*_: Any, **__: Any) -> object:
        return object()

    async def export(*_: Any, **__: Any) -> AsyncIterator[AuditRecord]:
        yield record("decision")
        raise ServiceError("history read failed")

    monkeypatch.setattr(audit_cli, "connect", connect)
    monkeypatch.setattr(audit_cli, "export", export)
    result = CliRunner().invoke(audit_cli.app, ["export", "-o", str(old_export)])
    assert result.exit_code == 2
    assert old_export.read_text() == OLD
    assert leftovers(old_export.parent) == []


def test_a_complete_export_replaces_the_file_and_keeps_its_mode(
    monkeypatch: pytest.MonkeyPatch, old_export: Path
) -> None:
    async def connect(*_: Any, **__: Any) -> object:
        return object()

    async def export(*_: Any, **__: Any) -> AsyncIterator[AuditRecord]:
        for kind in ("decision", "effect"):
            yield record(kind)

    monkeypatch.setattr(audit_cli, "connect", connect)
    monkeypatch.setattr(audit_cli, "export", export)
    result = CliRunner().invoke(audit_cli.app, ["export", "-o", str(old_export)])
    assert result.exit_code == 0, result.output
    lines = old_export.read_text().splitlines()
    assert [AuditRecord.model_validate_json(line).kind for line in lines] == ["decision", "effect"]
    assert old_export.stat().st_mode & 0o777 == 0o640
    assert leftovers(old_export.parent) == []


@pytest.mark.parametrize("since", ["99999999999d", "999999999d"])
def test_since_too_far_back_is_a_clean_error(since: str, old_export: Path) -> None:
    result = CliRunner().invoke(audit_cli.app, ["export", "--since", since, "-o", str(old_export)])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "--since" in result.output and "Traceback" not in result.output
    assert old_export.read_text() == OLD
