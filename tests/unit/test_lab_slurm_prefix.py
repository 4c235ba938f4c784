"""The lab on a Slurm install of its own (`--slurm-prefix`, e.g. 25.11 built from source
for pyslurm): which programs it runs, what its clients see, what 25.11 needs written."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from trainmedic.errors import MissingDependencyError
from trainmedic.lab import Lab
from trainmedic.lab.lab import REQUIRED_BINARIES, require_binaries
from trainmedic.lab.layout import render_cgroup_conf


def fake_install(prefix: Path, *, skip: str | None = None) -> Path:
    for binary in REQUIRED_BINARIES:
        if binary in {"munged", skip}:
            continue
        where = prefix / ("sbin" if binary.startswith("slurm") else "bin")
        where.mkdir(parents=True, exist_ok=True)
        program = where / binary
        program.write_text("#!/bin/sh\necho 'slurm 25.11.7'\n")
        program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return prefix


@pytest.mark.skipif(shutil.which("munged", path="/usr/sbin:/usr/bin") is None, reason="no munged")
def test_slurm_programs_come_from_the_prefix_only(tmp_path: Path) -> None:
    prefix = fake_install(tmp_path / "slurm")
    found = require_binaries(prefix)
    assert found["slurmctld"] == str(prefix / "sbin" / "slurmctld")
    assert found["scontrol"] == str(prefix / "bin" / "scontrol")
    assert not found["munged"].startswith(str(prefix))  # munged stays the system's
    partial = fake_install(tmp_path / "partial", skip="slurmd")
    with pytest.raises(MissingDependencyError, match=r"no slurmd under .*build-slurm\.sh"):
        require_binaries(partial)  # never the distribution's slurmd instead


def test_clients_use_the_prefix_and_the_root_remembers_it(tmp_path: Path) -> None:
    prefix = fake_install(tmp_path / "slurm")
    lab = Lab(tmp_path / "lab", slurm_prefix=prefix)
    env = lab.env_overrides()
    assert env["PATH"].split(":")[:2] == [str(prefix / "bin"), str(prefix / "sbin")]
    assert lab.slurm_version() == (25, 11, 7)  # `slurmctld -V`
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "slurm-prefix").write_text(f"{prefix}\n")
    again = Lab(tmp_path / "lab")  # `lab down` / `status` without the option
    assert again.slurm_prefix == prefix and "PATH" in again.env_overrides()
    assert "PATH" not in Lab(tmp_path / "other").env_overrides()  # the system's Slurm


def test_only_25_11_gets_a_cgroup_conf() -> None:
    assert render_cgroup_conf(None) is None
    assert render_cgroup_conf((22, 5, 8)) is None
    assert render_cgroup_conf((24, 11, 5)) is None
    assert "CgroupPlugin=disabled" in (render_cgroup_conf((25, 11, 7)) or "")
