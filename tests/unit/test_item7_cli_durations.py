"""Durations given on the command line: zero, infinite or out of range is a usage error
naming the option, never a traceback, and refused before anything starts."""

from __future__ import annotations

from datetime import timedelta

import pytest
import typer
from typer.testing import CliRunner

from trainmedic.cli import up as up_cli


@pytest.mark.parametrize("text", ["0s", "0", "99999999999d", "99999999999999999999", "inf", "soon"])
def test_bad_hang_after_is_refused(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        up_cli._hang_after(text)


def test_good_hang_after_is_taken() -> None:
    assert up_cli._hang_after("90s") == timedelta(seconds=90)


def test_worker_refuses_a_zero_hang_after_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run(*_: object, **__: object) -> None:
        raise AssertionError("started despite a bad --hang-after")

    monkeypatch.setattr(up_cli, "settings", must_not_run)
    app = typer.Typer()
    up_cli.register(app)
    result = CliRunner().invoke(app, ["worker", "--hang-after", "0s"])
    assert result.exit_code == 2
    assert "--hang-after" in result.output
