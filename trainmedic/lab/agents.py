"""The lab's node agents as real processes, one per emulated node.

Each runs `python -m trainmedic.workers.node_agent` for its node (the node's kern.log and
fake NVML state), pushes to the controller's agent channel, beats every 2 s and keeps its
fallback spool in `<root>/nodes/<node>/agent-spool`. An agent is part of its node:
`Lab.kill_node` kills it with the node's slurmd (a dead node's agent is silent), and
`revive_node`/`reset` start it again; `down` stops them all.

How each was started is kept in `<root>/nodes/<node>/agent.json`, so a restart (the
lab's `systemctl restart`) brings back the same agent. Pids are checked against their
command line before any signal, like every other lab process.

Also the lab's wiring of its fakes into the controller (`workers.controller` imports
this module only when it runs against a lab): node agents inside the controller over
the nodes' fake GPUs (`in_process_agents`), and the quarantine's health probe over the
same fake GPUs (`LabNodeHealthProbe`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainmedic import procs
from trainmedic.adapters.nvml.fake import FakeNvml
from trainmedic.channel.liveness import AgentProbe, AgentState, NodeProbe, TcpProbe
from trainmedic.domain.health import NodeHealthReport, NodeHealthRequest
from trainmedic.health.checks import HealthConfig, NodeHealthChecker
from trainmedic.health.probe import AgentUnreachable
from trainmedic.lab.faults import KERNEL_LOG, NVML_STATE, node_dir

if TYPE_CHECKING:
    from trainmedic.lab.lab import Lab
    from trainmedic.workers.detection import InProcessAgent

log = logging.getLogger(__name__)

MODULE = "trainmedic.workers.node_agent"
CONFIG = "agent.json"


def pid_file(lab: Lab, node: str) -> Path:
    return lab.layout.run / f"agent-{node}.pid"


def log_file(lab: Lab, node: str) -> Path:
    return lab.layout.log / f"agent-{node}.log"


def spool_dir(lab: Lab, node: str) -> Path:
    return node_dir(lab.root, node) / "agent-spool"


def ensure_key(lab: Lab) -> Path:
    """The lab's site key for the agent channel (0600, made once per lab root)."""
    path = lab.layout.etc / "agent.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(32).encode())
        finally:
            os.close(fd)
    return path


def _is_agent(lab: Lab, node: str) -> Callable[[list[str]], bool]:
    spool = str(spool_dir(lab, node))

    def match(argv: list[str]) -> bool:
        return MODULE in argv and procs.has_flags(argv, ("--node", node), ("--spool", spool))

    return match


def agent_pid(lab: Lab, node: str) -> int | None:
    """The node's running agent, if any (a zombie child of ours is reaped here)."""
    pid = procs.read_pid(pid_file(lab, node))
    if pid is not None:
        procs.reap(pid)
    return procs.verified_pid(pid_file(lab, node), _is_agent(lab, node))


def start_agent(
    lab: Lab,
    node: str,
    *,
    controller: str | None = None,
    key_file: Path | None = None,
    heartbeat: float | None = None,
) -> int:
    """Start the node's agent (the one described in its agent.json, updated by what is
    given here); returns its pid. A running agent is left as it is."""
    running = agent_pid(lab, node)
    if running is not None:
        return running
    directory = node_dir(lab.root, node)
    directory.mkdir(parents=True, exist_ok=True)
    config_path = directory / CONFIG
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    if controller is not None:
        config["controller"] = controller
    if key_file is not None:
        config["key_file"] = str(key_file)
    if heartbeat is not None:
        config["heartbeat"] = heartbeat
    if "controller" not in config:
        raise ValueError(f"no controller address known for {node}'s agent")
    config.setdefault("key_file", str(ensure_key(lab)))
    config.setdefault("heartbeat", 2.0)
    config_path.write_text(json.dumps(config))
    argv = [
        sys.executable,
        "-m",
        MODULE,
        "--node",
        node,
        "--kernel",
        str(directory / KERNEL_LOG),
        "--nvml",
        str(directory / NVML_STATE),
        "--spool",
        str(spool_dir(lab, node)),
        "--key-file",
        config["key_file"],
        "--controller",
        config["controller"],
        "--heartbeat",
        str(config["heartbeat"]),
        "--listen",
        "127.0.0.1:0",
    ]
    lab.layout.log.mkdir(parents=True, exist_ok=True)
    lab.layout.run.mkdir(parents=True, exist_ok=True)
    with log_file(lab, node).open("ab") as out:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=lab.root,
            start_new_session=True,  # its own group: a Ctrl-C of the caller is not its death
        )
    pid_file(lab, node).write_text(f"{child.pid}\n")
    log.info("started the agent of %s (pid %d)", node, child.pid)
    return child.pid


def start_agents(lab: Lab, controller: str, key_file: Path | None = None) -> dict[str, int]:
    from trainmedic.lab.workload import lab_nodes, prepare_nodes

    prepare_nodes(lab)
    key = key_file or ensure_key(lab)
    return {n: start_agent(lab, n, controller=controller, key_file=key) for n in lab_nodes(lab)}


def signal_agent(lab: Lab, node: str, sig: signal.Signals) -> int | None:
    """Send `sig` to the node's agent (SIGSTOP/SIGCONT in tests); its pid, or None."""
    pid = agent_pid(lab, node)
    if pid is not None:
        procs.send([pid], sig)
    return pid


def kill_agent(lab: Lab, node: str) -> list[int]:
    """SIGKILL (the node died with it); the pids killed."""
    pid = agent_pid(lab, node)
    if pid is None:
        return []
    procs.send([pid], signal.SIGCONT)  # a stopped one too
    procs.send([pid], signal.SIGKILL)
    procs.wait_exited([pid], 5.0)
    agent_pid(lab, node)  # reap
    return [pid]


def stop_agent(lab: Lab, node: str, grace: float = 5.0) -> None:
    pid = agent_pid(lab, node)
    if pid is not None:
        procs.send([pid], signal.SIGCONT)
        procs.terminate_all([pid], grace)
        agent_pid(lab, node)


def restart_agent(lab: Lab, node: str) -> int:
    """What systemd's restart does: stop it, start the same agent again."""
    stop_agent(lab, node)
    return start_agent(lab, node)


def revive_agent(lab: Lab, node: str) -> int | None:
    """Start the node's agent again if it ever ran here (its agent.json) and is not running."""
    if not (node_dir(lab.root, node) / CONFIG).exists():
        return None
    return start_agent(lab, node)


def stop_agents(lab: Lab) -> None:
    spec = lab.spec
    for node in spec.node_names if spec else []:
        stop_agent(lab, node)


def lab_probes(lab: Lab, timeout: float = 1.0) -> list[NodeProbe]:
    """The controller's direct questions to a lab node: its agent, and its slurmd's port
    (every lab node is 127.0.0.1 on a port of its own)."""
    spec = lab.spec

    def slurmd_of(state: AgentState) -> tuple[str, int] | None:
        if spec is None or state.node not in spec.node_names:
            return None
        return "127.0.0.1", spec.node_port(state.node)

    return [AgentProbe(timeout), TcpProbe("slurmd", slurmd_of, timeout)]


def controller_address(host: str, port: int) -> str:
    """Where a lab agent reaches a receiver bound to `host:port`."""
    return f"{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"


# -- the lab's fakes, wired into the controller -------------------------------------------


class LabNodeHealthProbe:
    """The lab's stand-in for a node agent's `GET /health`: the same checks, in this
    process, over the node's fake GPUs (`FakeNvml` on `<root>/nodes/<node>/nvml.json`;
    `trainmedic lab inject` breaks them, clearing the fault heals them). No dcgmi in
    the lab: there is nothing real to diagnose."""

    def __init__(
        self, nvml_file: Callable[[str], Path], config: HealthConfig | None = None
    ) -> None:
        self._nvml_file = nvml_file
        self._config = config or HealthConfig()

    async def check(self, request: NodeHealthRequest) -> NodeHealthReport:
        path = self._nvml_file(request.node)
        if not path.exists():
            raise AgentUnreachable(f"lab node {request.node} has no agent state ({path})")
        checker = NodeHealthChecker(request.node, FakeNvml.from_file(path), self._config)
        return await checker.check(request.model_copy(update={"diag": False}), source="lab")


def lab_health_probe(lab: Lab) -> LabNodeHealthProbe:
    """The quarantine's health check against the lab's nodes."""
    return LabNodeHealthProbe(lambda node: node_dir(lab.root, node) / NVML_STATE)


def fake_nvml(lab: Lab, node: str) -> FakeNvml:
    """The node's fake GPUs (read from its nvml.json on every call)."""
    return FakeNvml.from_file(node_dir(lab.root, node) / NVML_STATE)


def prepare(lab: Lab) -> None:
    """Every lab node's kern.log and healthy nvml.json, where missing."""
    from trainmedic.lab.workload import prepare_nodes

    prepare_nodes(lab)


def in_process_agents(lab: Lab) -> list[InProcessAgent]:
    """One node agent per lab node, to run inside the controller (no agent channel):
    the node's kern.log and its fake GPUs."""
    from trainmedic.lab.workload import lab_nodes
    from trainmedic.workers.detection import InProcessAgent

    prepare(lab)
    return [
        InProcessAgent(node, node_dir(lab.root, node) / KERNEL_LOG, fake_nvml(lab, node))
        for node in lab_nodes(lab)
    ]
