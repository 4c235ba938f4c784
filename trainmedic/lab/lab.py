"""A real Slurm cluster on one machine: munged, slurmctld and one slurmd per node.

Everything lives under one root directory (config, munge key and socket, spool, logs,
pid files, fake GPU devices), so a test run can bring up its own lab on other ports
beside the user's. The lab only ever signals processes it can prove are its own (see
`procs`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from trainmedic import procs
from trainmedic.adapters.slurm.errors import SlurmParseError
from trainmedic.adapters.slurm.parse import node_from_scontrol, parse_scontrol_records
from trainmedic.domain.hostlist import HostlistError, expand, validate_node_name
from trainmedic.domain.slurm import SlurmNode
from trainmedic.errors import MissingDependencyError, ServiceError
from trainmedic.lab import agents
from trainmedic.lab.layout import (
    DEFAULT_PORT_BASE,
    LabLayout,
    LabSpec,
    render_cgroup_conf,
    render_gres_conf,
    render_slurm_conf,
)

log = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install -y slurmctld slurmd slurm-client munge"
# binary -> the Debian package that ships it
REQUIRED_BINARIES = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "scontrol": "slurm-client",
    "scancel": "slurm-client",
    "sbatch": "slurm-client",
}
# The host's own daemons and sbin may not be on a user's PATH.
_SEARCH_PATH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"]
)
# Variables of an outer Slurm job or the user's defaults would leak into lab commands.
_FOREIGN_ENV = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCONTROL_")

_PREFIX_FILE = "slurm-prefix"  # the Slurm install of the last fresh `up`, if not the system's


class LabError(ServiceError):
    """The lab could not be started, reached or changed as asked."""


class LabNode(BaseModel):
    """One emulated node: its daemon and what Slurm says about it (`slurm`, read with the
    Slurm adapter's parser; what its state means is the domain's `NodeStates`)."""

    model_config = ConfigDict(frozen=True)

    name: str
    port: int
    slurmd_pid: int | None = None
    state: str | None = None  # Slurm's state string, e.g. "IDLE", "DOWN+NOT_RESPONDING"
    gres: str | None = None
    reason: str | None = None  # as scontrol prints it, with who set it and when
    jobs: list[str] = []
    slurm: SlurmNode | None = None  # None: Slurm did not say (controller down, unknown)

    @property
    def is_down(self) -> bool:
        return self.slurm is not None and self.slurm.marked_down

    @property
    def is_drained(self) -> bool:
        return self.slurm is not None and self.slurm.drain_flag

    @property
    def not_responding(self) -> bool:
        return self.slurm is not None and self.slurm.not_responding

    @property
    def idle(self) -> bool:
        """IDLE and nothing else: how `reset` leaves every node."""
        return self.slurm is not None and self.slurm.state == "IDLE" and not self.slurm.state_flags

    @property
    def ready(self) -> bool:
        """Registered and responding: Slurm could place work here (unless drained)."""
        if self.slurm is None or self.slurmd_pid is None:
            return False
        return self.slurm.is_registered


class LabStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    root: Path
    slurm_conf: Path
    spec: LabSpec | None
    munged_pid: int | None = None
    slurmctld_pid: int | None = None
    controller_reachable: bool = False
    nodes: list[LabNode] = []

    @property
    def running(self) -> bool:
        """Every daemon of the lab is alive (Slurm may still be catching up)."""
        return (
            self.spec is not None
            and self.munged_pid is not None
            and self.slurmctld_pid is not None
            and all(node.slurmd_pid is not None for node in self.nodes)
        )

    @property
    def stopped(self) -> bool:
        return (
            self.munged_pid is None
            and self.slurmctld_pid is None
            and all(node.slurmd_pid is None for node in self.nodes)
        )

    def node(self, name: str) -> LabNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise LabError(f"no node {name!r} in this lab")


def slurm_dirs(prefix: Path) -> list[Path]:
    """Where a Slurm install under `prefix` keeps its programs (`make install` layout)."""
    return [prefix / "bin", prefix / "sbin"]


def require_binaries(slurm_prefix: Path | None = None) -> dict[str, str]:
    """Paths of the Slurm and munge programs; MissingDependencyError naming what to install.

    With `slurm_prefix` (a Slurm built from source, deploy/lab/build-slurm.sh), Slurm's
    programs come from that install only, never mixed with the distribution's; munged
    still comes from the system."""
    found: dict[str, str] = {}
    missing: dict[str, str] = {}
    for binary, package in REQUIRED_BINARIES.items():
        search = _SEARCH_PATH
        if slurm_prefix is not None and binary != "munged":
            search = os.pathsep.join(str(d) for d in slurm_dirs(slurm_prefix))
        path = shutil.which(binary, path=search)
        if path:
            found[binary] = path
        else:
            missing[binary] = package
    if missing and slurm_prefix is not None and "munged" not in missing:
        raise MissingDependencyError(
            f"no {', '.join(sorted(missing))} under {slurm_prefix} (bin/, sbin/): is Slurm"
            " installed there? Build it with deploy/lab/build-slurm.sh VERSION PREFIX"
        )
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        raise MissingDependencyError(
            f"the Slurm lab needs {', '.join(sorted(missing))} (Debian packages: {packages});"
            f" install them with: {INSTALL_HINT}"
        )
    return found


def port_free(port: int) -> bool:
    """True if nothing listens on `port` (Slurm binds with SO_REUSEADDR, so TIME_WAIT is fine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def find_free_port_base(span: int, low: int = 20000, high: int = 32000) -> int:
    """A base with `span` free ports from it, at random below the ephemeral range (tests)."""
    for _ in range(200):
        base = secrets.randbelow(high - low - span) + low
        if all(port_free(port) for port in range(base, base + span)):
            return base
    raise LabError(f"no {span} consecutive free ports found between {low} and {high}")


class Lab:
    """One lab rooted at `root`. Construction starts nothing; `up` does."""

    def __init__(
        self,
        root: Path,
        port_base: int | None = None,
        *,
        start_timeout: float = 90.0,
        command_timeout: float = 30.0,
        slurm_prefix: Path | None = None,
    ) -> None:
        self.layout = LabLayout(root)
        self._port_base = port_base
        # A Slurm install of its own (e.g. 25.11 built from source) instead of the
        # system's; remembered in the root so `down`/`status` later use the same one.
        self._slurm_prefix = slurm_prefix.resolve() if slurm_prefix else None
        self.start_timeout = start_timeout
        self.command_timeout = command_timeout

    # ----------------------------------------------------------------- basics

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def slurm_conf(self) -> Path:
        return self.layout.slurm_conf

    @property
    def spec(self) -> LabSpec | None:
        """The shape this root was last brought up with, if any."""
        try:
            return LabSpec.model_validate_json(self.layout.spec_file.read_text())
        except (OSError, ValidationError):
            return None

    @property
    def port_base(self) -> int:
        if self._port_base is not None:
            return self._port_base
        stored = self.spec
        return stored.port_base if stored else DEFAULT_PORT_BASE

    @property
    def slurm_prefix(self) -> Path | None:
        """The Slurm install this lab runs (None: the system's), given or remembered."""
        return self._slurm_prefix or self._remembered_prefix()

    def _remembered_prefix(self) -> Path | None:
        try:
            stored = (self.root / _PREFIX_FILE).read_text().strip()
        except OSError:
            return None
        return Path(stored) if stored else None

    def slurm_version(self) -> tuple[int, int, int] | None:
        """The version of the slurmctld this lab runs (`slurmctld -V`), None if unknown."""
        try:
            slurmctld = require_binaries(self.slurm_prefix)["slurmctld"]
            out = subprocess.run(
                [slurmctld, "-V"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (MissingDependencyError, OSError, subprocess.TimeoutExpired):
            return None
        match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
        return (int(match[1]), int(match[2]), int(match[3])) if match else None

    def env_overrides(self) -> dict[str, str]:
        """What a Slurm client needs on top of a clean environment to talk to this lab."""
        env = {"SLURM_CONF": str(self.slurm_conf)}
        prefix = self.slurm_prefix
        if prefix is not None:
            # Clients of another Slurm version cannot talk to this slurmctld.
            dirs = [str(d) for d in slurm_dirs(prefix)]
            env["PATH"] = os.pathsep.join([*dirs, os.environ.get("PATH", "")])
        return env

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A full environment for Slurm client commands against this lab."""
        source = os.environ if base is None else base
        out = {k: v for k, v in source.items() if not k.startswith(_FOREIGN_ENV)}
        out.update(self.env_overrides())
        return out

    def run_client(
        self, argv: list[str], *, timeout: float | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (argv list) against this lab."""
        try:
            result = subprocess.run(
                argv,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=timeout or self.command_timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            require_binaries(self.slurm_prefix)
            raise
        except subprocess.TimeoutExpired as error:
            raise LabError(f"{' '.join(argv)} timed out after {error.timeout:.0f} s") from None
        if check and result.returncode != 0:
            raise LabError(
                f"{' '.join(argv)} failed ({result.returncode}): "
                f"{(result.stderr or result.stdout).strip()}"
            )
        return result

    # ------------------------------------------------------- process identity

    def _munged_pid(self) -> int | None:
        socket_arg = f"--socket={self.layout.munge_socket}"
        return procs.verified_pid(
            self.layout.munged_pid(), lambda argv: _runs(argv, "munged") and socket_arg in argv
        )

    def _slurmctld_pid(self) -> int | None:
        conf = ("-f", str(self.slurm_conf))
        return procs.verified_pid(
            self.layout.slurmctld_pid(), lambda argv: _runs(argv, "slurmctld", conf)
        )

    def _slurmd_pid(self, node: str) -> int | None:
        flags = (("-f", str(self.slurm_conf)), ("-N", node))
        return procs.verified_pid(
            self.layout.slurmd_pid(node), lambda argv: _runs(argv, "slurmd", *flags)
        )

    def _stepds(self, node: str) -> list[int]:
        return procs.stepds_holding(self.layout.slurmd_log(node))

    def processes(self) -> list[int]:
        """Every live process this lab started: daemons, step daemons and job processes."""
        spec = self.spec
        nodes = spec.node_names if spec else []
        pids = [self._munged_pid(), self._slurmctld_pid(), *(self._slurmd_pid(n) for n in nodes)]
        roots = [pid for pid in pids if pid is not None]
        for node in nodes:
            roots.extend(self._stepds(node))
        return sorted(set(roots) | set(procs.descendants(roots)))

    # ---------------------------------------------------------------- status

    def status(self) -> LabStatus:
        spec = self.spec
        munged, ctld = self._munged_pid(), self._slurmctld_pid()
        slurm_nodes: dict[str, tuple[dict[str, str], SlurmNode]] = {}
        jobs: dict[str, list[str]] = {}
        reachable = False
        if spec is not None and ctld is not None:
            try:
                slurm_nodes = self._scontrol_nodes()
                jobs = self._jobs_by_node()
                reachable = True
            except LabError as error:
                log.debug("controller not answering: %s", error)
        nodes = []
        for name in spec.node_names if spec else []:
            record, slurm = slurm_nodes.get(name, ({}, None))
            nodes.append(
                LabNode(
                    name=name,
                    port=spec.node_port(name) if spec else 0,
                    slurmd_pid=self._slurmd_pid(name),
                    state=record.get("State"),
                    gres=record.get("Gres"),
                    reason=record.get("Reason") or None,
                    jobs=jobs.get(name, []),
                    slurm=slurm,
                )
            )
        return LabStatus(
            root=self.root,
            slurm_conf=self.slurm_conf,
            spec=spec,
            munged_pid=munged,
            slurmctld_pid=ctld,
            controller_reachable=reachable,
            nodes=nodes,
        )

    def _scontrol_nodes(self) -> dict[str, tuple[dict[str, str], SlurmNode]]:
        """Each node's `scontrol -o show node` record (as printed) and its reading."""
        out = self.run_client(["scontrol", "-o", "show", "node"]).stdout
        try:
            records = [r for r in parse_scontrol_records(out) if "NodeName" in r]
            return {r["NodeName"]: (r, node_from_scontrol(r)) for r in records}
        except SlurmParseError as error:
            raise LabError(f"unreadable `scontrol -o show node` output: {error}") from None

    def _jobs_by_node(self) -> dict[str, list[str]]:
        out = self.run_client(["squeue", "-h", "-o", "%i|%N"]).stdout
        by_node: dict[str, list[str]] = {}
        for line in out.splitlines():
            job, _, nodelist = line.strip().partition("|")
            if not job or not nodelist:
                continue
            try:
                names = expand(nodelist)
            except HostlistError:
                continue
            for name in names:
                by_node.setdefault(name, []).append(job)
        return by_node

    # -------------------------------------------------------------------- up

    def up(
        self,
        nodes: int | None = None,
        gpus: int | None = None,
        cpus: int | None = None,
        *,
        slurmd_timeout: int | None = None,
    ) -> LabStatus:
        """Start the lab, or whatever part of it is missing; return once every node is ready.

        A shape left unset is the one this root was last brought up with (else 4 nodes x
        8 GPUs x 8 CPUs). Asking a running lab for another shape is an error.
        """
        binaries = require_binaries(self.slurm_prefix)
        if os.geteuid() != 0:
            raise LabError(
                "the Slurm lab must run as root (slurmd runs jobs as their owner and"
                " needs to create device nodes); run it with sudo or in a container"
            )
        given = {"nodes": nodes, "gpus": gpus, "cpus": cpus, "slurmd_timeout": slurmd_timeout}
        shape = {**(self.spec or LabSpec()).model_dump(), "port_base": self.port_base}
        shape.update((key, value) for key, value in given.items() if value is not None)
        try:
            wanted = LabSpec.model_validate(shape)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
            )
            raise LabError(f"invalid lab shape: {problems}") from None
        with self._locked():
            return self._up(wanted, binaries)

    def _up(self, wanted: LabSpec, binaries: dict[str, str]) -> LabStatus:
        current = self.status()
        fresh = current.stopped
        if not fresh:
            stored = self._remembered_prefix()
            if self._slurm_prefix is not None and self._slurm_prefix != stored:
                raise LabError(
                    f"a lab is already running in {self.root} on Slurm from"
                    f" {stored or 'the system'}; asked for {self._slurm_prefix}."
                    " Run `trainmedic lab down` first."
                )
            if current.spec != wanted:
                raise LabError(
                    f"a lab is already running in {self.root} as {_describe(current.spec)};"
                    f" asked for {_describe(wanted)}. Run `trainmedic lab down` first."
                )
        else:
            self._check_ports(wanted)
            self._prepare(wanted)
        spec = wanted
        if current.munged_pid is None:
            self._start_munged(binaries["munged"])
        if current.slurmctld_pid is None:
            # A fresh start clears saved jobs and node states (-c): a lab that was taken
            # down starts clean. If slurmds still run (only the controller died), keep
            # the state so their jobs are recovered.
            any_slurmd = any(n.slurmd_pid is not None for n in current.nodes)
            clear = [] if any_slurmd else ["-c"]
            self._spawn(
                "slurmctld",
                [binaries["slurmctld"], "-f", str(self.slurm_conf), *clear],
                lambda: self._slurmctld_pid() is not None,
                self.layout.slurmctld_log(),
            )
        self._wait(self._controller_answers, "slurmctld to answer", self.layout.slurmctld_log())
        for name in spec.node_names:
            if self._slurmd_pid(name) is None:
                self._start_slurmd(binaries["slurmd"], name)
        self._wait_nodes_ready(spec.node_names)
        return self.status()

    def _check_ports(self, spec: LabSpec) -> None:
        for port in spec.ports:
            if not port_free(port):
                raise LabError(
                    f"port {port} is in use by another program; the lab needs ports"
                    f" {spec.port_base}-{max(spec.ports)}. Pick another base with --port-base"
                )

    def _prepare(self, spec: LabSpec) -> None:
        layout = self.layout
        # 0755: munged refuses a socket directory (munge_dir) that others can write to.
        dirs = (layout.etc, layout.run, layout.log, layout.spool, layout.jobs, layout.munge_dir)
        for directory in dirs:
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o755)
        layout.state_save.mkdir(parents=True, exist_ok=True)
        for name in spec.node_names:
            layout.slurmd_spool(name).mkdir(parents=True, exist_ok=True)
            self._make_gpus(name, spec.gpus)
        self._make_munge_key()
        layout.slurm_conf.write_text(
            render_slurm_conf(spec, layout, socket.gethostname().split(".")[0])
        )
        cgroup_conf = render_cgroup_conf(self.slurm_version())
        if cgroup_conf is not None:
            (layout.etc / "cgroup.conf").write_text(cgroup_conf)
        else:
            (layout.etc / "cgroup.conf").unlink(missing_ok=True)
        # Like the shape, the Slurm install sticks to the root until another is asked for.
        if self.slurm_prefix is not None:
            (self.root / _PREFIX_FILE).write_text(f"{self.slurm_prefix}\n")
        layout.gres_conf.write_text(render_gres_conf(spec, layout))
        layout.spec_file.write_text(spec.model_dump_json(indent=2) + "\n")
        log.info("lab config written to %s", layout.slurm_conf)

    def _make_munge_key(self) -> None:
        key = self.layout.munge_key
        if key.exists():
            return
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        try:
            os.write(fd, secrets.token_bytes(1024))
        finally:
            os.close(fd)

    def _make_gpus(self, node: str, count: int) -> None:
        # Slurm only accepts gres File= entries that are character devices. 195 is the
        # NVIDIA major number; nothing opens these, they only have to exist.
        directory = self.layout.gpu_dir(node)
        directory.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            path = directory / f"nvidia{index}"
            try:
                if stat.S_ISCHR(path.lstat().st_mode):
                    continue
                path.unlink()
            except FileNotFoundError:
                pass
            try:
                os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(195, index))
            except PermissionError:
                raise LabError(
                    f"cannot create the fake GPU device {path}: creating device nodes"
                    " needs CAP_MKNOD (run as root, or give the container that capability)"
                ) from None

    def _spawn(self, name: str, argv: list[str], up: Callable[[], bool], log_file: Path) -> None:
        """Start a daemon that forks into the background and wait until `up`; fail on a
        non-zero exit."""
        output = self.layout.daemon_output(name)
        with output.open("ab") as sink:
            try:
                result = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    env=self.env(),
                    cwd=self.layout.log,
                    timeout=self.command_timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise LabError(
                    f"{name} did not go to the background within {self.command_timeout:.0f} s"
                ) from None
        if result.returncode != 0:
            raise LabError(f"{name} exited with status {result.returncode}:\n{_tail(output)}")
        log.info("started %s", name)
        self._wait(up, f"{name} to start", log_file)

    def _start_munged(self, munged: str) -> None:
        layout = self.layout
        # A socket left by a munged that died would make the new one refuse to start.
        with contextlib.suppress(FileNotFoundError):
            layout.munge_socket.unlink()
        self._spawn(
            "munged",
            [
                munged,
                # munged wants every directory above its socket searchable by all; a lab
                # under /root or pytest's 0700 temp dirs is not. Only root talks to this
                # munged, so --force (which turns that check into a logged warning) is safe.
                "--force",
                f"--socket={layout.munge_socket}",
                f"--key-file={layout.munge_key}",
                f"--pid-file={layout.munged_pid()}",
                f"--log-file={layout.munged_log()}",
                f"--seed-file={layout.run / 'munged.seed'}",
            ],
            lambda: self._munged_pid() is not None and layout.munge_socket.exists(),
            layout.munged_log(),
        )

    def _start_slurmd(self, slurmd: str, node: str) -> None:
        self._spawn(
            f"slurmd-{node}",
            [slurmd, "-f", str(self.slurm_conf), "-N", node],
            lambda: self._slurmd_pid(node) is not None,
            self.layout.slurmd_log(node),
        )

    def _controller_answers(self) -> bool:
        try:
            self.run_client(["scontrol", "ping"], timeout=10)
        except LabError:
            return False
        return True

    def _wait_nodes_ready(self, names: list[str]) -> None:
        resumed: set[str] = set()

        def ready() -> bool:
            status = self.status()
            waiting = []
            for name in names:
                node = status.node(name)
                if node.ready:
                    continue
                waiting.append(name)
                # DOWN but answering: set down by hand, or for a reason ReturnToService=1
                # does not undo. Its daemon is ours and running, so bring it back.
                answering = not node.not_responding
                if node.slurmd_pid and node.is_down and answering and name not in resumed:
                    self._resume(name)
                    resumed.add(name)
            return not waiting

        log_file = (
            self.layout.slurmd_log(names[0]) if len(names) == 1 else self.layout.slurmctld_log()
        )
        self._wait(ready, f"node(s) {', '.join(names)} to become ready", log_file)

    def _resume(self, name: str) -> None:
        log.info("resuming node %s", name)
        self.run_client(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)

    def _wait(
        self,
        condition: Callable[[], bool],
        what: str,
        log_file: Path,
        timeout: float | None = None,
    ) -> None:
        limit = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            if condition():
                return
            if time.monotonic() >= deadline:
                raise LabError(
                    f"timed out after {limit:.0f} s waiting for {what};"
                    f" last lines of {log_file}:\n{_tail(log_file)}"
                )
            time.sleep(0.25)

    # ------------------------------------------------------------------ down

    def down(self) -> None:
        """Cancel every job and stop every process of the lab. A stopped lab: no-op."""
        if not self.layout.root.exists():
            return
        with self._locked():
            self._down()

    def _down(self) -> None:
        spec = self.spec
        nodes = spec.node_names if spec else []
        if self._slurmctld_pid() is not None:
            self._cancel_all()
        agents.stop_agents(self)
        slurmds = [pid for pid in (self._slurmd_pid(n) for n in nodes) if pid is not None]
        procs.terminate_all(slurmds, grace=10.0)
        ctld = self._slurmctld_pid()
        if ctld is not None:
            # slurmctld's helper (slurmscriptd) should exit with it; remember it in case.
            helpers = _snapshot(procs.descendants([ctld]))
            procs.terminate_all([ctld], grace=15.0)
            _kill_if_unchanged(helpers)
        for name in nodes:
            self._kill_steps(name)
        munged = self._munged_pid()
        if munged is not None:
            procs.terminate_all([munged], grace=10.0)
        for pid_file in self.layout.run.glob("*.pid"):
            pid_file.unlink(missing_ok=True)
        left = procs.processes_under(self.root)
        if left:
            # Not ours to kill (a user's shell sitting in the jobs directory, say).
            log.warning("processes still use %s after down: %s", self.root, left)
        log.info("lab in %s is down", self.root)

    def _cancel_all(self) -> None:
        try:
            out = self.run_client(["squeue", "-h", "-o", "%i"], timeout=10).stdout
        except LabError as error:
            log.warning("could not list jobs before stopping: %s", error)
            return
        jobs = [line.strip() for line in out.splitlines() if line.strip()]
        if not jobs:
            return
        self.run_client(["scancel", *jobs], check=False, timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            result = self.run_client(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
            if result.returncode != 0 or not result.stdout.strip():
                return
            time.sleep(0.25)

    def _kill_steps(self, name: str) -> list[int]:
        """SIGKILL the node's slurmstepd processes and every process under them."""
        killed: list[int] = []
        # Twice: a step may be forking its job while the first sweep runs.
        for _ in range(2):
            stepds = self._stepds(name)
            if not stepds:
                break
            victims = _snapshot([*stepds, *procs.descendants(stepds)])
            killed.extend(_kill_if_unchanged(victims))
            procs.wait_exited(list(victims), 5.0)
        return killed

    def reset(self, timeout: float | None = None) -> LabStatus:
        """Back to a clean, running lab: no jobs, every node's slurmd running, every node IDLE.

        Between tests: cancels all jobs, revives killed nodes, resumes drained or DOWN ones.
        """
        binaries = require_binaries(self.slurm_prefix)
        spec = self._running_spec()
        with self._locked():
            self._cancel_all()
            for name in spec.node_names:
                if self._slurmd_pid(name) is None:
                    self._start_slurmd(binaries["slurmd"], name)
                agents.revive_agent(self, name)
            for node in self.status().nodes:
                if node.is_down or node.is_drained:
                    self._resume(node.name)
            self._wait_nodes_ready(spec.node_names)

            def idle() -> bool:
                status = self.status()
                for node in status.nodes:
                    if not node.idle or node.jobs:
                        # Drained or DOWN again (e.g. by a late ping): resume again.
                        if node.is_drained or (node.is_down and node.slurmd_pid):
                            self._resume(node.name)
                        return False
                return True

            self._wait(idle, "every node to be IDLE", self.layout.slurmctld_log(), timeout)
            return self.status()

    # ---------------------------------------------------------- node faults

    def kill_node(self, name: str) -> list[int]:
        """A hard node death: SIGKILL its slurmd, its step daemons and their job processes,
        and the node's agent when the lab runs one (`trainmedic.lab.agents`).

        Slurm notices on its own: the node goes DOWN (not responding) after
        SlurmdTimeout and its batch jobs are requeued. Returns the pids killed: none when
        the node is already dead. A lab that is not running is an error, not "0 killed".
        """
        self._known_node(name)
        with self._locked():
            self._running_spec(
                f"the lab in {self.root} is not running, so {name} has nothing to kill"
            )
            killed: list[int] = []
            slurmd = self._slurmd_pid(name)
            if slurmd is not None:
                # The slurmd first, so it cannot start new steps while we sweep.
                procs.send([slurmd], signal.SIGKILL)
                procs.wait_exited([slurmd], 5.0)
                killed.append(slurmd)
            killed.extend(self._kill_steps(name))
            killed.extend(agents.kill_agent(self, name))  # the node's agent dies with it
            log.info("killed node %s: pids %s", name, killed)
            return killed

    def revive_node(self, name: str) -> LabNode:
        """Start the node's slurmd again and wait until Slurm has it back in service."""
        self._known_node(name)
        binaries = require_binaries(self.slurm_prefix)
        with self._locked():
            self._running_spec()
            if self._slurmd_pid(name) is None:
                self._start_slurmd(binaries["slurmd"], name)
            agents.revive_agent(self, name)
            self._wait_nodes_ready([name])
            return self.status().node(name)

    def _running_spec(self, problem: str = "the lab is not running") -> LabSpec:
        spec = self.spec
        if spec is None or self._slurmctld_pid() is None:
            raise LabError(f"{problem}; start it with `trainmedic lab up`")
        return spec

    def _known_node(self, name: str) -> None:
        try:
            validate_node_name(name)
        except HostlistError as error:
            raise LabError(str(error)) from None
        spec = self.spec
        if spec is None:
            raise LabError(f"no lab in {self.root}; start one with `trainmedic lab up`")
        if name not in spec.node_names:
            raise LabError(f"no node {name!r} in this lab (it has {', '.join(spec.node_names)})")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One lab operation at a time (the CLI and a test may share a root)."""
        self.layout.root.mkdir(parents=True, exist_ok=True)
        with (self.layout.root / "lab.lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _runs(argv: list[str], program: str, *flags: tuple[str, str]) -> bool:
    """`argv` runs `program` (from any directory) with each flag followed by its value."""
    return bool(argv) and os.path.basename(argv[0]) == program and procs.has_flags(argv, *flags)


def _snapshot(pids: list[int]) -> dict[int, list[str]]:
    return {pid: procs.cmdline(pid) for pid in pids}


def _kill_if_unchanged(snapshot: dict[int, list[str]]) -> list[int]:
    """SIGKILL each pid whose command line is still the one we saw (no pid reuse)."""
    victims = [
        pid
        for pid, argv in snapshot.items()
        if argv and procs.is_alive(pid) and procs.cmdline(pid) == argv
    ]
    procs.send(victims, signal.SIGKILL)
    return victims


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _describe(spec: LabSpec | None) -> str:
    if spec is None:
        return "an unknown shape"
    return f"{spec.nodes} nodes x {spec.gpus} GPUs, ports from {spec.port_base}"
