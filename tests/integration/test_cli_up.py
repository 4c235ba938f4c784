"""`trainmedic up`, `worker` and `config check` as an operator runs them: real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.lab import require_lab
from trainmedic import procs
from trainmedic.lab import find_free_port_base

pytestmark = pytest.mark.integration

BAD_POLICY = "mode: {default: yolo}\nrails: {restart_budget: -1}\n"


def trainmedic(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainmedic.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def isolated_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEDIC_")}
    env.update(
        {
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "TRAINMEDIC_TEMPORAL_ADDRESS": f"127.0.0.1:{procs.free_port()}",
            "TRAINMEDIC_TEMPORAL_UI_PORT": str(procs.free_port()),
            "TRAINMEDIC_LAB_PORT_BASE": str(find_free_port_base(8)),
            "COLUMNS": "200",
        }
    )
    return env


def test_bad_configuration_is_refused_before_anything_starts(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    policy = tmp_path / "policy.yaml"
    policy.write_text(BAD_POLICY)
    checked = trainmedic("config", "check", str(policy), env=env)
    assert checked.returncode == 2
    assert "mode.default" in checked.stderr and "rails.restart_budget" in checked.stderr
    assert "Traceback" not in checked.stderr

    for command in (["worker"], ["up"]):
        refused = trainmedic(*command, env={**env, "TRAINMEDIC_POLICY_FILE": str(policy)})
        assert refused.returncode == 2, refused.stdout
        assert "mode.default" in refused.stderr
    assert not (tmp_path / "state" / "trainmedic" / "temporal" / "temporal.pid").exists()

    bad_env = trainmedic("worker", env={**env, "TRAINMEDIC_TEMPORAL_ADDRESS": "nowhere"})
    assert bad_env.returncode == 2 and "TRAINMEDIC_TEMPORAL_ADDRESS" in bad_env.stderr


def test_worker_says_when_temporal_is_unreachable(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)  # nothing listens on its Temporal port
    result = trainmedic("worker", "--no-detect", env=env)
    assert result.returncode == 2
    assert "cannot reach Temporal" in result.stderr and "Traceback" not in result.stderr


def test_up_brings_the_stack_up_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    require_lab()
    env = isolated_env(tmp_path)
    up = subprocess.Popen(
        [sys.executable, "-m", "trainmedic.cli.main", "up", "--nodes", "2", "--gpus", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert up.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        output = "".join(lines)
        assert "trainmedic is up" in output, output
        assert "Temporal UI" in output and "gpu01, gpu02" in output
        assert "monitor" in output  # the default mode, said out loud
        time.sleep(2)  # let the controller settle into its loops
    finally:
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=90)
    assert up.returncode == 0, rest
    assert "trainmedic stopped" in rest
    # Nothing left running: no process (dev server, munged, slurmctld, slurmd) whose
    # command line points into this state directory.
    state = str(tmp_path / "state")
    leftovers = [
        (int(p.name), procs.cmdline(int(p.name)))
        for p in Path("/proc").iterdir()
        if p.name.isdigit()
        and procs.is_alive(int(p.name))
        and any(state in arg for arg in procs.cmdline(int(p.name)))
    ]
    assert leftovers == []
