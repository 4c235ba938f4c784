"""Node agent process for a real GPU node (or one lab node).

    python -m trainmedic.workers.node_agent --node "$(hostname -s)" \\
        --kernel journalctl --spool /var/spool/trainmedic/signals

Kernel source (`--kernel`): `kmsg` (/dev/kmsg, needs root or CAP_SYSLOG), `journalctl`
(`journalctl -k -f -n 0 -o short-monotonic`), or a file path to follow (e.g.
/var/log/kern.log, or the lab's <lab root>/nodes/<node>/kern.log).
NVML (`--nvml`): `pynvml` (the real driver; a node without one runs kernel-only), `none`,
or a path to a lab `nvml.json` (`FakeNvml`).

Delivery, for now deliberately simple: each signal is one JSON file
(`IncidentSignal.model_dump_json()`) written atomically into `--spool DIR`, which the
controller drains (the same path the Slurm epilog's `trainmedic report` can use when the
controller is unreachable). A direct Temporal client is the controller's job: the agent
does not know which job a node signal belongs to (`job_id` is None, `nodes=[node]`); the
controller's router maps it to the jobs on that node.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import uuid
from pathlib import Path

from trainmedic.adapters.nvml import FakeNvml, NvmlBackend, PynvmlBackend
from trainmedic.domain.incident import IncidentSignal
from trainmedic.watchers.node import CommandSource, FileTail, KernelSource, KmsgSource, NodeAgent

log = logging.getLogger(__name__)

JOURNALCTL = ["journalctl", "-k", "-f", "-n", "0", "-o", "short-monotonic", "--no-pager"]


class SpoolSink:
    """Writes each signal as `<spool>/<time>-<node>-<uuid>.json`, atomically (tmp + rename)."""

    def __init__(self, spool: Path) -> None:
        self.spool = spool
        spool.mkdir(parents=True, exist_ok=True)

    async def submit(self, signal: IncidentSignal) -> None:
        await asyncio.to_thread(self._write, signal)

    def _write(self, signal: IncidentSignal) -> None:
        stamp = signal.at.strftime("%Y%m%dT%H%M%S.%f") if signal.at else "unknown"
        node = signal.nodes[0] if signal.nodes else "node"
        name = f"{stamp}-{node}-{uuid.uuid4().hex[:8]}.json"
        tmp = self.spool / f".{name}.tmp"
        tmp.write_text(signal.model_dump_json())
        os.replace(tmp, self.spool / name)  # a reader never sees half a signal


def kernel_source(spec: str) -> KernelSource:
    if spec == "kmsg":
        return KmsgSource()
    if spec == "journalctl":
        return CommandSource(JOURNALCTL)
    return FileTail(Path(spec))


def nvml_backend(spec: str) -> NvmlBackend | None:
    if spec == "none":
        return None
    if spec == "pynvml":
        return PynvmlBackend()
    return FakeNvml.from_file(Path(spec))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="trainmedic node agent (kernel log + NVML)")
    parser.add_argument("--node", default=os.uname().nodename.split(".", 1)[0])
    parser.add_argument("--kernel", default="kmsg", help="kmsg | journalctl | PATH")
    parser.add_argument("--nvml", default="pynvml", help="pynvml | none | PATH to nvml.json")
    parser.add_argument("--spool", required=True, type=Path, help="directory for signals")
    parser.add_argument("--nvml-interval", type=float, default=5.0)
    parser.add_argument("--kernel-interval", type=float, default=0.25)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    agent = NodeAgent(
        args.node,
        SpoolSink(args.spool),
        kernel=kernel_source(args.kernel),
        nvml=nvml_backend(args.nvml),
        kernel_interval=args.kernel_interval,
        nvml_interval=args.nvml_interval,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("node agent for %s: kernel %s, nvml %s", args.node, args.kernel, args.nvml)
    await agent.run(stop)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
