"""strigger fired on the lab: a node-down trigger's report reaches the controller.

`trainmedic deploy slurm-hooks --install` writes the trigger programs and registers
them with the lab's slurmctld (SlurmUser=root there, and the test runs as root); a
killed node goes DOWN, slurmctld runs the program (`trainmedic report --node-down`), and
the report lands in the controller's spool under a temporary state dir, where the
controller's own reader (`EpilogSpool`, confirming with Slurm) turns it into a
node_down signal for the dead node. The triggers are cleared at the end.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from trainmedic.adapters.slurm import LocalRunner, SlurmCli
from trainmedic.lab import Lab
from trainmedic.watchers.base import ListSink
from trainmedic.watchers.epilog import EpilogSpool, spool_dir

NODE = "gpu02"
FIRE_WITHIN_S = 90.0  # SlurmdTimeout (5 s) + a ping cycle + the trigger check (~15 s)


def _trainmedic() -> Path:
    return Path(sys.executable).parent / "trainmedic"


def _our_triggers(lab: Lab, libexec: Path) -> list[str]:
    """Ids of the node triggers whose program lives in `libexec`."""
    out = lab.run_client(["strigger", "--get", "--node"], check=False).stdout
    return [
        line.split()[0]
        for line in out.splitlines()
        if str(libexec) in line and line.split() and line.split()[0].isdigit()
    ]


def _hooks(lab: Lab, libexec: Path, state: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        str(_trainmedic()),
        "deploy",
        "slurm-hooks",
        "--install",
        "--slurm-conf",
        str(lab.slurm_conf),
        "--bin",
        str(_trainmedic()),
        "--libexec",
        str(libexec),
        "--state-dir",
        str(state),
    ]
    return subprocess.run(
        argv, env=lab.env(), capture_output=True, text=True, timeout=60, check=False
    )


async def test_node_down_trigger_reaches_the_controller_spool(
    clean_lab: Lab, tmp_path: Path
) -> None:
    libexec, state = tmp_path / "libexec", tmp_path / "state"
    installed = _hooks(clean_lab, libexec, state)
    try:
        assert installed.returncode == 0, installed.stderr
        assert "# registered: strigger --set --node --down" in installed.stdout
        # The lab's slurm.conf has no EpilogSlurmctld: said, not edited.
        assert "slurm.conf was not edited" in installed.stdout
        assert "EpilogSlurmctld" not in clean_lab.slurm_conf.read_text()
        assert len(_our_triggers(clean_lab, libexec)) == 2

        again = _hooks(clean_lab, libexec, state)  # idempotent: nothing registered twice
        assert again.returncode == 0, again.stderr
        assert "already registered" in again.stdout
        assert len(_our_triggers(clean_lab, libexec)) == 2

        reports = spool_dir(state)
        assert not reports.exists() or not list(reports.glob("*.json"))
        killed_at = time.monotonic()
        clean_lab.kill_node(NODE)
        found: list[Path] = []
        while time.monotonic() - killed_at < FIRE_WITHIN_S:
            found = sorted(reports.glob("*.json")) if reports.exists() else []
            if found:
                break
            time.sleep(0.5)
        fired_s = time.monotonic() - killed_at
        assert found, (
            f"no strigger report in {reports} {FIRE_WITHIN_S:.0f} s after killing {NODE}; "
            f"triggers: {clean_lab.run_client(['strigger', '--get'], check=False).stdout!r}"
        )
        print(f"strigger report {fired_s:.1f} s after the kill")

        # The controller's reader: owner/mode checks, then Slurm confirms the node is down.
        sink = ListSink()
        spool = EpilogSpool(reports, sink, backend=SlurmCli(LocalRunner(env=clean_lab.env())))
        await spool.drain_once()
        assert [(s.kind, s.source, s.nodes) for s in sink.signals] == [
            ("node_down", "strigger", [NODE])
        ]
        assert not list(reports.glob("*.json"))  # handled and removed
    finally:
        for trigger in _our_triggers(clean_lab, libexec):
            clean_lab.run_client(["strigger", "--clear", f"--id={trigger}"], check=False)
        left = _our_triggers(clean_lab, libexec)
        assert not left, f"triggers left behind (strigger --clear --id=N): {left}"
