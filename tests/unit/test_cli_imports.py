"""The CLI starts without importing what its verb does not use.

`trainmedic --help` and the Slurm epilog's `trainmedic report` (run at every job end)
must not pay for the Temporal client, the audit reader or the lab: trainmedic.cli.main
imports each verb's module when the verb runs (bench/cli_start.py measures the time).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from trainmedic.cli import main as cli_main

HEAVY = ("temporalio", "trainmedic.audit", "trainmedic.lab")

# Runs `trainmedic ARGV...` in a fresh interpreter, then prints which HEAVY modules it
# imported (a timing assertion would be flaky; sys.modules is not).
PROBE = """
import json, sys
heavy, argv = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if argv is None:
    import trainmedic.cli.main
else:
    sys.argv = ["trainmedic", *argv]
    from trainmedic.cli.main import main
    try:
        main()
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in heavy if m in sys.modules)), file=sys.stderr)
"""


def _imported(argv: list[str] | None, tmp_path: Path) -> tuple[list[str], str]:
    """The HEAVY modules `trainmedic ARGV...` imported, and what it wrote on stderr."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY), json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "100"},
    )
    assert done.returncode == 0, done.stderr
    *said, last = done.stderr.strip().splitlines()
    found: list[str] = json.loads(last)
    return found, "\n".join(said)


@pytest.mark.parametrize(
    "argv",
    [None, ["--help"], ["--version"], ["report", "--help"], ["attribute", "--help"]],
    ids=["import", "help", "version", "report-help", "attribute-help"],
)
def test_starting_the_cli_imports_no_temporal_audit_or_lab(
    argv: list[str] | None, tmp_path: Path
) -> None:
    found, said = _imported(argv, tmp_path)
    assert found == [], said


def test_the_epilog_report_imports_no_temporal_audit_or_lab(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    argv = ["report", "--job-id", "12", "--nodes", "gpu01", "--exit-code", "1"]
    found, said = _imported([*argv, "--spool", str(spool)], tmp_path)
    assert found == [], said
    assert len(list(spool.glob("*.json"))) == 1, said  # and it did report


def test_the_root_help_lists_each_verb_as_its_module_defines_it() -> None:
    by_module: dict[str, set[str]] = {}
    for verb, (module, _) in cli_main.VERBS.items():
        by_module.setdefault(module, set()).add(verb)
    for module, verbs in by_module.items():
        commands = cli_main.load_verbs(module)
        assert set(commands) == verbs, module
        for verb, command in commands.items():
            assert command.name == verb
            assert not command.hidden and not command.deprecated
            assert not getattr(command, "rich_help_panel", None)
            first = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
            assert first == cli_main.VERBS[verb][1], verb


def test_the_root_help_reads_the_same_before_and_after_the_verbs_load(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")

    def root_help(group: TyperGroup) -> str:
        with pytest.raises(SystemExit) as done:
            group.main(["--help"], prog_name="trainmedic")
        assert done.value.code == 0
        return capsys.readouterr().out

    listed = root_help(typer.main.get_group(cli_main.app))
    group = typer.main.get_group(cli_main.app)
    for verb in cli_main.VERBS:
        assert group.commands[verb].name == verb  # imported now
    assert root_help(group) == listed
    assert all(verb in listed for verb in cli_main.VERBS)


def test_a_mistyped_verb_is_still_answered_with_a_suggestion() -> None:
    result = CliRunner().invoke(cli_main.app, ["incidnts"])
    assert result.exit_code == 2
    assert "Did you mean 'incidents'?" in result.output
