"""The bare-metal systemd units verify with systemd's own tools (deploy/systemd/).

`systemd-analyze verify` checks that every ExecStart binary exists, so it runs on a
copy of each unit whose /opt/trainmedic/bin/ is this virtual environment's bin/ (the
only difference). It reports bad or unknown directives on stderr with exit status 0:
a clean run here means exit status 0 and nothing on stderr. `systemd-sysusers` and
`systemd-tmpfiles --root` then build the user and the state/spool directories in a
scratch root, so the modes the spool reader demands are checked as created.

The tools come with Debian's `systemd` package. Without them these tests skip, unless
TRAINMEDIC_REQUIRE_LAB=1 (`make test`): then they fail, naming the package.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
UNITS = ("trainmedic-controller.service", "trainmedic-node-agent.service")
INSTALLED_BIN = "/opt/trainmedic/bin/"
# `systemd-analyze security` exposure, 0 (locked down) to 10, given to --threshold in
# tenths: 30 means 3.0. Both units score about 1.5-2 with systemd 252.
EXPOSURE_MAX_TENTHS = 30


def _tool(name: str) -> str:
    path = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin"]))
    if path:
        return path
    message = f"{name} not found: install Debian's `systemd` package (apt-get install systemd)"
    if os.environ.get("TRAINMEDIC_REQUIRE_LAB") == "1":
        pytest.fail(f"TRAINMEDIC_REQUIRE_LAB=1 but {message}")
    pytest.skip(message)


def _directives(path: Path) -> dict[str, list[str]]:
    """Key -> values of a unit file (repeated keys keep every value)."""
    found: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        found.setdefault(key.strip(), []).append(value.strip())
    return found


def _testable_copy(unit: str, folder: Path) -> Path:
    text = (DEPLOY / unit).read_text()
    assert INSTALLED_BIN in text
    copy = folder / unit
    copy.write_text(text.replace(INSTALLED_BIN, f"{Path(sys.executable).parent}/"))
    return copy


def _verify(analyze: str, *units: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [analyze, "verify", "--man=no", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = _tool("systemd-analyze")
    copies = [_testable_copy(unit, tmp_path) for unit in UNITS]
    result = _verify(analyze, *copies)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_verify_would_catch_a_bad_directive(tmp_path: Path) -> None:
    """The check above is not vacuous: a typo is reported (on stderr, status 0)."""
    analyze = _tool("systemd-analyze")
    copy = _testable_copy(UNITS[0], tmp_path)
    copy.write_text(copy.read_text().replace("ProtectSystem=strict", "ProtectSystem=strikt"))
    result = _verify(analyze, copy)
    assert "ProtectSystem" in result.stderr or "protect system" in result.stderr


def test_units_are_locked_down_per_systemd_security(tmp_path: Path) -> None:
    analyze = _tool("systemd-analyze")
    for unit in UNITS:
        copy = _testable_copy(unit, tmp_path)
        result = subprocess.run(
            [analyze, "security", "--offline=yes", f"--threshold={EXPOSURE_MAX_TENTHS}", str(copy)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        overall = [line for line in result.stdout.splitlines() if "Overall exposure" in line]
        assert result.returncode == 0, f"{unit}: {overall or result.stdout[-2000:]} {result.stderr}"


@pytest.mark.parametrize("unit", UNITS)
def test_unit_hardening_contract(unit: str) -> None:
    d = _directives(DEPLOY / unit)
    assert d["User"] == ["trainmedic"] and d["Group"] == ["trainmedic"]
    assert d["ProtectSystem"] == ["strict"]
    assert d["ProtectHome"] == ["true"]
    assert d["PrivateTmp"] == ["true"]
    assert d["NoNewPrivileges"] == ["true"]
    assert d["CapabilityBoundingSet"] == [""]  # none at all
    assert d["AmbientCapabilities"] == [""]
    assert d["Restart"] == ["on-failure"]
    assert d["EnvironmentFile"] == ["/etc/trainmedic/env"]
    assert d["RestrictAddressFamilies"]
    # Writes only to the state/spool tree.
    for value in d["ReadWritePaths"]:
        for path in value.split():
            assert path.startswith("/var/lib/trainmedic"), path


def test_controller_runs_the_worker_and_the_agent_its_module() -> None:
    controller = _directives(DEPLOY / UNITS[0])
    assert controller["ExecStart"] == ["/opt/trainmedic/bin/trainmedic worker"]
    agent = _directives(DEPLOY / UNITS[1])
    assert agent["ExecStart"][0].startswith("/opt/trainmedic/bin/python -m ")
    # journalctl -k without a capability: the journal's group.
    assert agent["SupplementaryGroups"] == ["systemd-journal"]


def test_the_agents_arguments_parse() -> None:
    """ExecStart's arguments are ones the node agent accepts (its own parser)."""
    from trainmedic.workers.node_agent import parse_args

    (exec_start,) = _directives(DEPLOY / UNITS[1])["ExecStart"]
    words = exec_start.split()
    assert words[1:3] == ["-m", "trainmedic.workers.node_agent"]
    args = parse_args([w.replace("%H", "gpu01") for w in words[3:]])
    assert (args.node, args.kernel, args.nvml) == ("gpu01", "journalctl", "pynvml")
    assert args.spool == Path("/var/lib/trainmedic/spool/signals")


def test_sysusers_and_tmpfiles_make_the_spools_the_reader_accepts(tmp_path: Path) -> None:
    sysusers, tmpfiles = _tool("systemd-sysusers"), _tool("systemd-tmpfiles")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for argv in (
        [sysusers, f"--root={root}", str(DEPLOY / "trainmedic.sysusers")],
        [tmpfiles, "--create", f"--root={root}", str(DEPLOY / "trainmedic.tmpfiles")],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"{argv[0]}: {result.stderr}"
    passwd = (root / "etc" / "passwd").read_text().splitlines()
    (entry,) = [line for line in passwd if line.startswith("trainmedic:")]
    uid = int(entry.split(":")[2])
    assert entry.endswith(":/usr/sbin/nologin")
    for sub in ("", "spool", "spool/reports", "spool/signals"):
        st = (root / "var/lib/trainmedic" / sub).lstat()
        assert stat.S_ISDIR(st.st_mode), sub
        assert st.st_uid == uid, sub  # owned by the controller's user
        assert stat.S_IMODE(st.st_mode) == 0o750, f"{sub}: {stat.S_IMODE(st.st_mode):o}"
        assert not st.st_mode & 0o022  # what SpoolDir refuses
    env_dir = (root / "etc/trainmedic").lstat()
    assert env_dir.st_uid == 0 and stat.S_IMODE(env_dir.st_mode) == 0o750


def test_a_missing_tool_skips_or_fails_naming_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    monkeypatch.delenv("TRAINMEDIC_REQUIRE_LAB", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Debian's `systemd` package"):
        _tool("systemd-analyze")
    monkeypatch.setenv("TRAINMEDIC_REQUIRE_LAB", "1")
    with pytest.raises(pytest.fail.Exception, match="TRAINMEDIC_REQUIRE_LAB=1 but systemd-analyze"):
        _tool("systemd-analyze")
