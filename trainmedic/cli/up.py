"""`trainmedic up` (the whole embedded stack) and `trainmedic worker` (the controller alone)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import typer

from trainmedic.cli.common import console, dev_server, settings
from trainmedic.config import Policy, Settings, load_policy
from trainmedic.lab import Lab
from trainmedic.temporal.client import connect
from trainmedic.workers.controller import run_worker

logger = logging.getLogger(__name__)


async def _serve(config: Settings, policy: Policy) -> None:
    """Run the controller until SIGINT/SIGTERM; a clean stop, not a traceback."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = await connect(config)
    await run_worker(client, config, policy, stop)


def worker() -> None:
    """Run the controller worker against the configured Temporal and Slurm."""
    config = settings()
    policy = load_policy(config.policy_file)
    console.print(
        f"controller worker: cluster [bold]{config.cluster}[/], Temporal "
        f"{config.temporal_address} ({config.temporal_namespace}), queue "
        f"{config.temporal_task_queue}, policy {policy.version}"
    )
    asyncio.run(_serve(config, policy))
    console.print("controller worker stopped.")


def up(
    nodes: int = typer.Option(4, help="Lab nodes (when the lab is used)."),
    gpus: int = typer.Option(8, help="Fake GPUs per lab node."),
    use_lab: bool = typer.Option(
        True, "--lab/--existing-slurm", help="Start the Slurm lab, or use the Slurm configured."
    ),
    keep: bool = typer.Option(False, help="Leave the dev server and lab running on exit."),
) -> None:
    """The main job on the embedded default: Temporal dev server, Slurm lab, controller."""
    config = settings()
    policy = load_policy(config.policy_file)  # bad policy: refuse before starting anything
    server = dev_server(config)
    lab = Lab(config.lab_dir) if use_lab else None
    started_server = server.pid() is None
    started_lab = False
    try:
        with console.status("starting the Temporal dev server..."):
            status = server.start()
        if lab is not None:
            started_lab = not lab.status().running
            with console.status(f"starting the Slurm lab ({nodes} nodes x {gpus} GPUs)..."):
                lab_status = lab.up(nodes=nodes, gpus=gpus)
            config = config.model_copy(update={"slurm_conf": lab.slurm_conf})
            node_names = ", ".join(n.name for n in lab_status.nodes)
        else:
            node_names = "(configured Slurm)"
        console.print(f"[bold green]trainmedic is up[/] - cluster [bold]{config.cluster}[/]")
        console.print(f"  Temporal UI  {status.ui_url}/namespaces/{config.temporal_namespace}")
        console.print(f"  Temporal     {status.address}")
        console.print(f"  Slurm        {node_names}")
        if lab is not None:
            console.print(f"               export SLURM_CONF={lab.slurm_conf}")
        console.print(f"  mode         {policy.mode.default.value} (policy {policy.version})")
        console.print("  Ctrl-C stops it.")
        asyncio.run(_serve(config, policy))
    finally:
        if not keep:
            if lab is not None and started_lab:
                with console.status("stopping the Slurm lab..."):
                    lab.down()
            if started_server:
                with contextlib.suppress(Exception):
                    server.stop()
        console.print("trainmedic stopped." if not keep else "controller stopped; stack kept.")


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(worker)
