"""Where a lab keeps its files, and the slurm.conf / gres.conf it runs with.

Pure: paths and text only, no processes. Every path lives under one root so two labs
(the user's and a test run's) never share a socket, a spool or a pid file.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trainmedic.domain.hostlist import compress

DEFAULT_PORT_BASE = 16817
NODE_PREFIX = "gpu"


class LabSpec(BaseModel):
    """The shape of a lab: what `up` was asked for. Stored as <root>/lab.json."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: int = Field(4, ge=1, le=99, description="emulated nodes gpu01..gpuNN")
    gpus: int = Field(8, ge=0, le=64, description="fake GPUs per node")
    cpus: int = Field(8, ge=1, le=1024, description="CPUs each node claims")
    port_base: int = Field(DEFAULT_PORT_BASE, ge=1024, le=65535 - 100, description="slurmctld port")
    # Slurm's own time to call a silent node DOWN. 5 s keeps lab tests short; production
    # clusters run Slurm's default, 300 s (the agent channel's node-death tests use it).
    slurmd_timeout: int = Field(5, ge=1, le=3600, description="SlurmdTimeout (seconds)")

    @property
    def node_names(self) -> list[str]:
        return [node_name(i) for i in range(1, self.nodes + 1)]

    def node_port(self, name: str) -> int:
        # slurmctld = base, gpu01 = base + 2, ...: base + 1 stays free for a SlurmdPort
        # default that Slurm would otherwise pick for nodes without Port=.
        return self.port_base + 1 + node_index(name)

    @property
    def ports(self) -> list[int]:
        return [self.port_base, *(self.node_port(n) for n in self.node_names)]


def node_name(index: int) -> str:
    return f"{NODE_PREFIX}{index:02d}"


def node_index(name: str) -> int:
    if not name.startswith(NODE_PREFIX) or not name[len(NODE_PREFIX) :].isdigit():
        raise ValueError(f"not a lab node name: {name!r}")
    return int(name[len(NODE_PREFIX) :])


class LabLayout:
    """All paths of one lab, derived from its root."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        # Slurm reads gres.conf from the directory of slurm.conf; the name is fixed.
        return self.etc / "gres.conf"

    @property
    def spec_file(self) -> Path:
        return self.root / "lab.json"

    @property
    def munge_key(self) -> Path:
        return self.etc / "munge.key"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def state_save(self) -> Path:
        return self.spool / "ctld"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    @property
    def jobs(self) -> Path:
        """A scratch directory for job scripts and output (tests, the CLI's hints)."""
        return self.root / "jobs"

    def munged_pid(self) -> Path:
        return self.run / "munged.pid"

    def munged_log(self) -> Path:
        return self.log / "munged.log"

    def slurmctld_pid(self) -> Path:
        return self.run / "slurmctld.pid"

    def slurmctld_log(self) -> Path:
        return self.log / "slurmctld.log"

    def slurmd_pid(self, node: str) -> Path:
        return self.run / f"slurmd-{node}.pid"

    def slurmd_log(self, node: str) -> Path:
        return self.log / f"slurmd-{node}.log"

    def slurmd_spool(self, node: str) -> Path:
        return self.spool / node

    def gpu_dir(self, node: str) -> Path:
        return self.dev / node

    def daemon_output(self, daemon: str) -> Path:
        """Where a daemon's stdout/stderr go before it has opened its own log."""
        return self.log / f"{daemon}.out"


def render_slurm_conf(spec: LabSpec, layout: LabLayout, controller_host: str) -> str:
    nodes = spec.node_names
    auth_info = f"socket={layout.munge_socket},cred_expire=5"
    lines = [
        "# Written by `trainmedic lab up`; rewritten on the next fresh start.",
        "ClusterName=lab",
        # The controller's name must be this host's short name for slurmctld to run as
        # primary; the address keeps every client and slurmd on the loopback.
        f"SlurmctldHost={controller_host}(127.0.0.1)",
        f"SlurmctldPort={spec.port_base}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire: a requeued job may not start again before its old step credentials
        # expire (default 120 s); 5 s keeps requeue tests short. Munge ignores options it
        # does not know, so this is harmless where Slurm reads it elsewhere.
        f"AuthInfo={auth_info}",
        f"StateSaveLocation={layout.state_save}",
        f"SlurmdSpoolDir={layout.spool}/%n",
        f"SlurmctldPidFile={layout.slurmctld_pid()}",
        f"SlurmdPidFile={layout.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.slurmctld_log()}",
        f"SlurmdLogFile={layout.log}/slurmd-%n.log",
        # Nodes claim 8 CPUs each on a 2-core host.
        "SlurmdParameters=config_overrides",
        # No cgroups: the lab runs in containers and CI runners without a delegated tree.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        # No accounting, job completion log or job accounting: the defaults are "none",
        # and leaving them unset keeps the file valid across Slurm versions.
        "MpiDefault=none",
        "MailProg=/bin/true",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        # Jobs start within about a second instead of the default 60 s / 30 s cycles.
        "SchedulerParameters=sched_interval=1,bf_interval=1",
        "GresTypes=gpu",
        # 1: a node that was DOWN for not responding comes back when its slurmd
        # registers again; a manual DOWN stays (2 would undo that at once).
        "ReturnToService=1",
        # A killed node is marked DOWN after this (plus one ping cycle).
        f"SlurmdTimeout={spec.slurmd_timeout}",
        "MessageTimeout=5",
        "JobRequeue=1",
        "KillWait=5",
    ]
    for name in nodes:
        gres = f" Gres=gpu:{spec.gpus}" if spec.gpus else ""
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1"
            f" Port={spec.node_port(name)} CPUs={spec.cpus}{gres} State=UNKNOWN"
        )
    lines.append(f"PartitionName=gpu Nodes={compress(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_cgroup_conf(version: tuple[int, int, int] | None) -> str | None:
    """cgroup.conf for the lab, or None where the release needs none.

    slurm.conf reads the same from 22.05 to 25.11 (tried: a 25.11.7 built from source
    accepts the lab's file as is). 25.11's slurmd, though, loads a cgroup plugin even
    with proctrack/linuxproc + task/none: without a cgroup.conf it picks cgroup/v1
    ("deprecated" warning here) and on a cgroup v2 host without a delegated tree it may
    fail. `CgroupPlugin=disabled` (unknown to 22.05, hence by version) turns that off."""
    if version is None or version[:2] < (25, 11):
        return None
    return "# Written by `trainmedic lab up` (Slurm >= 25.11).\nCgroupPlugin=disabled\n"


def render_gres_conf(spec: LabSpec, layout: LabLayout) -> str:
    # Files must be character devices: regular files or Count without File leave the
    # node INVALID. AutoDetect=off keeps slurmd from looking for NVML.
    lines = ["AutoDetect=off"]
    if spec.gpus:
        for name in spec.node_names:
            last = spec.gpus - 1
            files = "nvidia0" if last == 0 else f"nvidia[0-{last}]"
            lines.append(f"NodeName={name} Name=gpu File={layout.gpu_dir(name)}/{files}")
    return "\n".join(lines) + "\n"
