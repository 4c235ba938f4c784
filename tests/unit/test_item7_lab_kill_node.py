"""`trainmedic lab kill-node` with no lab running says so and fails (no "killed 0")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainmedic.lab import Lab, LabError
from trainmedic.lab.layout import LabSpec


@pytest.fixture
def stopped_lab(tmp_path: Path) -> Lab:
    """A lab that ran here once (its spec is on disk) and is down now."""
    lab = Lab(tmp_path / "lab")
    lab.root.mkdir(parents=True)
    lab.layout.spec_file.write_text(LabSpec(nodes=2, gpus=0).model_dump_json())
    return lab


def test_kill_node_of_a_stopped_lab_is_an_error(stopped_lab: Lab) -> None:
    with pytest.raises(LabError, match="not running"):
        stopped_lab.kill_node("gpu01")


def test_kill_node_of_an_unknown_node_or_lab_is_an_error(stopped_lab: Lab, tmp_path: Path) -> None:
    with pytest.raises(LabError, match="no node 'gpu07'"):
        stopped_lab.kill_node("gpu07")
    with pytest.raises(LabError, match="no lab in"):
        Lab(tmp_path / "never").kill_node("gpu01")


def test_cli_kill_node_without_a_lab_exits_non_zero(stopped_lab: Lab) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEDIC_")}
    argv = [sys.executable, "-m", "trainmedic.cli.main", "lab", "kill-node", "gpu01"]
    done = subprocess.run(
        [*argv, "--root", str(stopped_lab.root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "is not running" in " ".join(done.stderr.split())  # rich wraps long lines
    assert "killed" not in done.stdout
