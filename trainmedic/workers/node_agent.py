"""Node agent process for a real GPU node (or one lab node).

    python -m trainmedic.workers.node_agent --node "$(hostname -s)" \\
        --kernel journalctl --spool /var/spool/trainmedic/signals

Kernel source (`--kernel`): `kmsg` (/dev/kmsg, needs root or CAP_SYSLOG), `journalctl`
(`journalctl -k -f -n 0 -o short-monotonic`), or a file path to follow (e.g.
/var/log/kern.log, or the lab's <lab root>/nodes/<node>/kern.log).
NVML (`--nvml`): `pynvml` (the real driver; a node without one runs kernel-only), `none`,
or a path to a lab `nvml.json` (`FakeNvml`).

Delivery, for now deliberately simple: each signal is one JSON file
(`IncidentSignal.model_dump_json()`) written atomically and durably into `--spool DIR`
(mode 0640; signed with HMAC-SHA256 when `--key-file` or TRAINMEDIC_SPOOL_KEY_FILE names
the site key, which the controller then demands), which the controller drains (the
same path the Slurm epilog's `trainmedic report` can use when the controller is
unreachable). A direct Temporal client is the controller's job: the agent
does not know which job a node signal belongs to (`job_id` is None, `nodes=[node]`); the
controller's router maps it to the jobs on that node.

With `--controller HOST:PORT` the agent pushes each finding to the controller's agent
channel instead (`trainmedic.channel`), beats every `--heartbeat` seconds (2 s) and
answers the controller's probe on `--listen`; `--spool` is then its own fallback: a
finding the controller cannot take is kept there and sent, oldest first, once the
controller answers again. Requests are signed with the node's key, derived from the
site key (`--key-file`), or given as is (`--node-key-file`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import uuid
from pathlib import Path

from trainmedic.adapters.nvml import NvmlBackend, PynvmlBackend
from trainmedic.channel.client import (
    AgentChannel,
    ChannelClient,
    ChannelSink,
    ProbeListener,
    parse_address,
)
from trainmedic.channel.wire import node_key
from trainmedic.config import load_settings
from trainmedic.domain.enums import EvidenceSource
from trainmedic.domain.health import HEALTH_PATH
from trainmedic.domain.hostlist import HostlistError, validate_node_name
from trainmedic.domain.incident import IncidentSignal
from trainmedic.health.agent import build_health_endpoint
from trainmedic.watchers.base import SignalSink
from trainmedic.watchers.node import (
    CommandSource,
    KernelLogTail,
    KernelSource,
    KmsgSource,
    NodeAgent,
)
from trainmedic.watchers.spoolfile import KEY_FILE_ENV, load_key, safe_name, write_spool_file

log = logging.getLogger(__name__)

JOURNALCTL = ["journalctl", "-k", "-f", "-n", "0", "-o", "short-monotonic", "--no-pager"]


SIGNAL_PURPOSE = "signal"  # what spool signatures bind a node agent's file to
_AGENT_SOURCES = frozenset({EvidenceSource.KERNEL.value, EvidenceSource.NVML.value})


class SpoolSink:
    """Writes each signal as `<spool>/<time>-<node>-<uuid>.json`: the one spool writer
    (`spoolfile.write_spool_file`: tmp + fsync + rename, mode 0640, signed with `key`)."""

    def __init__(self, spool: Path, *, key: bytes | None = None) -> None:
        self.spool = spool
        self.key = key
        spool.mkdir(mode=0o750, parents=True, exist_ok=True)

    async def submit(self, signal: IncidentSignal) -> None:
        await asyncio.to_thread(self._write, signal)

    def _write(self, signal: IncidentSignal) -> None:
        stamp = signal.at.strftime("%Y%m%dT%H%M%S.%f") if signal.at else "unknown"
        node = safe_name(signal.nodes[0]) if signal.nodes else "node"
        name = f"{stamp}-{node}-{uuid.uuid4().hex[:8]}.json"
        write_spool_file(
            self.spool,
            name,
            signal.model_dump_json().encode(),
            key=self.key,
            purpose=SIGNAL_PURPOSE,
        )


def agent_signal_problem(signal: IncidentSignal) -> str | None:
    """Why `signal` is not something a node agent sends (None when it is): the reader
    of the agents' spool refuses anything else, since that folder speaks for agents only."""
    if signal.source not in _AGENT_SOURCES:
        return f"source {signal.source[:40]!r} is not a node agent's (kernel, nvml)"
    if signal.job_id is not None:
        return "a node agent does not name jobs"
    if len(signal.nodes) != 1:
        return "a node agent speaks for exactly one node"
    try:
        validate_node_name(signal.nodes[0])
    except HostlistError as error:
        return str(error)
    outside = {e.node for e in signal.evidence if e.node and e.node not in signal.nodes}
    if outside:
        return f"evidence names other nodes: {', '.join(sorted(outside))[:200]}"
    if any(e.source.value not in _AGENT_SOURCES for e in signal.evidence):
        return "evidence from a source other than the kernel or NVML"
    return None


def kernel_source(spec: str) -> KernelSource:
    if spec == "kmsg":
        return KmsgSource()
    if spec == "journalctl":
        return CommandSource(JOURNALCTL)
    return KernelLogTail(Path(spec))


def nvml_backend(spec: str) -> NvmlBackend | None:
    if spec == "none":
        return None
    if spec == "pynvml":
        return PynvmlBackend()
    # A lab node's fake GPUs (trainmedic.lab.agents starts agents this way).
    from trainmedic.adapters.nvml.fake import FakeNvml

    return FakeNvml.from_file(Path(spec))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="trainmedic node agent (kernel log + NVML)")
    parser.add_argument("--node", default=os.uname().nodename.split(".", 1)[0])
    parser.add_argument("--kernel", default="kmsg", help="kmsg | journalctl | PATH")
    parser.add_argument("--nvml", default="pynvml", help="pynvml | none | PATH to nvml.json")
    parser.add_argument("--spool", required=True, type=Path, help="directory for signals")
    parser.add_argument("--nvml-interval", type=float, default=5.0)
    parser.add_argument("--kernel-interval", type=float, default=0.25)
    parser.add_argument(
        "--key-file",
        type=Path,
        default=os.environ.get(KEY_FILE_ENV) or None,
        help=f"site key to sign spool files with (default: ${KEY_FILE_ENV})",
    )
    parser.add_argument(
        "--controller", default=None, help="HOST:PORT of the controller's agent channel"
    )
    parser.add_argument(
        "--node-key-file",
        type=Path,
        default=None,
        help="this node's channel key (instead of deriving it from --key-file)",
    )
    parser.add_argument("--heartbeat", type=float, default=2.0, help="seconds between beats")
    parser.add_argument(
        "--listen", default="0.0.0.0:8791", help="HOST:PORT of the probe listener (port 0: any)"
    )
    return parser.parse_args(argv)


def channel_key(args: argparse.Namespace) -> bytes:
    """The key this node signs channel requests with."""
    if args.node_key_file:
        return load_key(args.node_key_file)
    if args.key_file:
        return node_key(load_key(args.key_file), args.node)
    raise SystemExit("--controller needs --key-file (the site key) or --node-key-file")


async def run(args: argparse.Namespace) -> None:
    site_key = load_key(args.key_file) if args.key_file else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = []
    probe: ProbeListener | None = None
    sink: SignalSink
    nvml = nvml_backend(args.nvml)
    if args.controller:
        agent_id = uuid.uuid4().hex
        key = channel_key(args)
        client = ChannelClient(args.controller, args.node, key)
        channel_sink = ChannelSink(client, args.spool, agent_id=agent_id, spool_key=site_key)
        host, port = parse_address(args.listen)
        probe = ProbeListener(args.node, agent_id, host, port)
        # The quarantine's health check asks here (GET /health), answered with this
        # node's GPUs and signed with the node's key, like everything else it sends.
        probe.mount(
            HEALTH_PATH,
            build_health_endpoint(args.node, nvml, load_settings(), key=key),
        )
        probe_port = await probe.start()
        channel = AgentChannel(channel_sink, interval=args.heartbeat, probe_port=probe_port)
        tasks.append(channel.run(stop))
        sink = channel_sink
        log.info(
            "node agent for %s: controller %s, beat every %g s, probe port %d",
            args.node,
            args.controller,
            args.heartbeat,
            probe_port,
        )
    else:
        sink = SpoolSink(args.spool, key=site_key)
    agent = NodeAgent(
        args.node,
        sink,
        kernel=kernel_source(args.kernel),
        nvml=nvml,
        kernel_interval=args.kernel_interval,
        nvml_interval=args.nvml_interval,
    )
    log.info("node agent for %s: kernel %s, nvml %s", args.node, args.kernel, args.nvml)
    try:
        await asyncio.gather(agent.run(stop), *tasks)
    finally:
        if probe is not None:
            await probe.close()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
