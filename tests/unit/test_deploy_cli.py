"""`trainmedic deploy slurm-hooks`: the epilog line and the strigger registrations.

Printing needs nothing; `--install` is run here against a fake `strigger` on PATH (the
real registration against the lab's slurmctld is tests/integration/test_strigger.py).
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainmedic.cli.deploy import configured_epilog, strigger_argvs
from trainmedic.cli.main import app

runner = CliRunner()


def _hooks(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = runner.invoke(app, ["deploy", "slurm-hooks", *args], env=env)
    return result.exit_code, result.output


def test_prints_the_epilog_line_and_the_triggers_as_commands() -> None:
    code, out = _hooks()
    assert code == 0, out
    lines = out.splitlines()
    assert "EpilogSlurmctld=/opt/trainmedic/libexec/epilog.sh" in lines
    down = "/opt/trainmedic/libexec/trainmedic-node-down.sh"
    fail = "/opt/trainmedic/libexec/trainmedic-node-fail.sh"
    assert f"strigger --set --node --down --program={down} --flags=PERM" in lines
    assert f"strigger --set --node --fail --program={fail} --flags=PERM" in lines
    # Each command line is the argv the installer runs, shell-quoted.
    for argv in strigger_argvs(Path("/opt/trainmedic/libexec")):
        assert shlex.join(argv) in lines
        assert shlex.split(shlex.join(argv)) == argv


def test_the_epilog_and_triggers_follow_the_options(tmp_path: Path) -> None:
    libexec = tmp_path / "lib exec"  # a space: the printed commands must quote it
    code, out = _hooks(
        "--libexec", str(libexec), "--bin", "/usr/bin/trainmedic", "--state-dir", "/srv/tm"
    )
    assert code == 0, out
    assert f"EpilogSlurmctld={libexec}/epilog.sh" in out.splitlines()
    assert shlex.quote(f"--program={libexec}/trainmedic-node-down.sh") in out
    assert "TRAINMEDIC_BIN=/usr/bin/trainmedic TRAINMEDIC_STATE_DIR=/srv/tm" in out
    assert "/srv/tm/spool/reports" in out


def test_relative_paths_are_refused() -> None:
    code, out = _hooks("--bin", "trainmedic")
    assert code == 2
    assert "--bin must be an absolute path" in out


def test_slurm_conf_is_read_for_the_epilog_line(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n# EpilogSlurmctld=/old\n")
    code, out = _hooks("--slurm-conf", str(conf))
    assert code == 0 and "no EpilogSlurmctld yet" in out
    conf.write_text("epilogslurmctld = /opt/trainmedic/libexec/epilog.sh  # ours\n")
    code, out = _hooks("--slurm-conf", str(conf))
    assert code == 0 and "set to trainmedic's epilog already" in out
    conf.write_text("EpilogSlurmctld=/etc/slurm/epilog-ctld.sh\n")
    assert configured_epilog(conf) == "/etc/slurm/epilog-ctld.sh"
    code, out = _hooks("--slurm-conf", str(conf))
    assert code == 0 and "EpilogSlurmctld=/etc/slurm/epilog-ctld.sh already" in out
    code, out = _hooks("--slurm-conf", str(tmp_path / "missing.conf"))
    assert code == 2 and "cannot read" in out


FAKE_STRIGGER = """#!/bin/sh
# Records each call; `--get` prints what was --set before, like strigger does.
echo "$*" >> "{log}"
case "$1" in
  --get) [ -f "{state}" ] && cat "{state}"; exit 0 ;;
  --set) [ -n "{fail}" ] && {{ echo "strigger: Access/permission denied" >&2; exit 1; }}
         n=$(($(cat "{state}" 2>/dev/null | wc -l) + 1))
         for a in "$@"; do case "$a" in --program=*) p="${{a#--program=}}" ;; esac; done
         echo "$n node * x 0 root PERM $p" >> "{state}"; exit 0 ;;
esac
exit 0
"""


def _fake_strigger(tmp_path: Path, *, fail: bool = False) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "strigger.log"
    script = bin_dir / "strigger"
    script.write_text(
        FAKE_STRIGGER.format(log=log, state=tmp_path / "triggers", fail="1" if fail else "")
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, log


def test_install_writes_the_programs_and_registers_once(tmp_path: Path) -> None:
    env, log = _fake_strigger(tmp_path)
    libexec, state = tmp_path / "libexec", tmp_path / "state"
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    args = ("--install", "--libexec", str(libexec), "--state-dir", str(state))
    args += ("--bin", "/opt/tm/bin/trainmedic", "--slurm-conf", str(conf))
    code, out = _hooks(*args, env=env)
    assert code == 0, out
    down = libexec / "trainmedic-node-down.sh"
    assert os.access(down, os.X_OK)
    assert f'TRAINMEDIC_STATE_DIR="{state}"' in down.read_text()
    assert '"/opt/tm/bin/trainmedic" report --node-down --nodes "$1"' in down.read_text()
    assert f"# registered: strigger --set --node --down --program={down} --flags=PERM" in out
    # slurm.conf is never edited: the line to add is printed instead.
    assert conf.read_text() == "ClusterName=x\n"
    assert "slurm.conf was not edited" in out
    sets = [line for line in log.read_text().splitlines() if line.startswith("--set")]
    assert len(sets) == 2

    code, out = _hooks(*args, env=env)  # again: nothing registered twice
    assert code == 0, out
    assert "already registered" in out
    sets = [line for line in log.read_text().splitlines() if line.startswith("--set")]
    assert len(sets) == 2


def test_install_says_when_strigger_refuses(tmp_path: Path) -> None:
    env, _ = _fake_strigger(tmp_path, fail=True)
    args = ("--install", "--libexec", str(tmp_path / "libexec"), "--state-dir", str(tmp_path))
    code, out = _hooks(*args, env=env)
    assert code == 1
    assert "Access/permission denied" in out
    assert "strigger needs SlurmUser or root" in out


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("", None),
        ("EpilogSlurmctld=/a\nEpilogSlurmctld=/b\n", "/b"),  # the last one wins
        ("Epilog=/x\n", None),
    ],
)
def test_configured_epilog(tmp_path: Path, text: str, value: str | None) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(text)
    assert configured_epilog(conf) == value
