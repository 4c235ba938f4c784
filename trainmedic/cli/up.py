"""`trainmedic up` (the whole embedded stack) and `trainmedic worker` (the controller alone)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from datetime import timedelta

import typer

from trainmedic.cli.common import console, dev_server, settings
from trainmedic.config import MAX_DURATION, Policy, Settings, load_policy
from trainmedic.durations import parse_duration
from trainmedic.lab import Lab
from trainmedic.temporal.client import connect
from trainmedic.workers.controller import run_controller

logger = logging.getLogger(__name__)


async def _serve(
    config: Settings,
    policy: Policy,
    *,
    lab: Lab | None = None,
    detect: bool = True,
    hang_after: timedelta = timedelta(minutes=10),
) -> None:
    """Run the controller until SIGINT/SIGTERM; a clean stop, not a traceback."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = await connect(config)
    await run_controller(
        client, config, policy, stop, lab=lab, detect=detect, hang_after=hang_after
    )


def _hang_after(text: str) -> timedelta:
    try:
        value = parse_duration(text)
    except (ValueError, OverflowError):
        value = None
    if not isinstance(value, timedelta):
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 10m)")
    # 0s would call every running job hung at once; a huge value overflows the clock.
    if not timedelta(0) < value <= MAX_DURATION:
        raise typer.BadParameter(f"{text!r}: give more than 0s and at most {MAX_DURATION.days}d")
    return value


def _check_hang_after(text: str) -> str:
    _hang_after(text)  # at parse time: refused before the lab or server starts
    return text


HANG_AFTER = typer.Option(
    "10m", help="No training progress this long is a hang.", callback=_check_hang_after
)


def worker(
    detect: bool = typer.Option(
        True, "--detect/--no-detect", help="Run the watchers too (Slurm, logs, spools)."
    ),
    hang_after: str = HANG_AFTER,
) -> None:
    """Run the controller (worker and watchers) against the configured Temporal and Slurm."""
    config = settings()
    policy = load_policy(config.policy_file)
    console.print(
        f"controller worker: cluster [bold]{config.cluster}[/], Temporal "
        f"{config.temporal_address} ({config.temporal_namespace}), queue "
        f"{config.temporal_task_queue}, policy {policy.version}"
    )
    asyncio.run(_serve(config, policy, detect=detect, hang_after=_hang_after(hang_after)))
    console.print("controller worker stopped.")


def up(
    nodes: int = typer.Option(4, help="Lab nodes (when the lab is used)."),
    gpus: int = typer.Option(8, help="Fake GPUs per lab node."),
    use_lab: bool = typer.Option(
        True, "--lab/--existing-slurm", help="Start the Slurm lab, or use the Slurm configured."
    ),
    keep: bool = typer.Option(False, help="Leave the dev server and lab running on exit."),
    hang_after: str = HANG_AFTER,
) -> None:
    """The main job on the embedded default: Temporal dev server, Slurm lab, controller."""
    config = settings()
    policy = load_policy(config.policy_file)  # bad policy: refuse before starting anything
    server = dev_server(config)
    lab = Lab(config.lab_dir, port_base=config.lab_port_base) if use_lab else None
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
            if "agent_channel" not in config.model_fields_set:
                # The lab's node agents push to the controller over the agent channel.
                from trainmedic.lab.agents import ensure_key

                listen = config.agent_listen
                if "agent_listen" not in config.model_fields_set:
                    listen = "127.0.0.1:0"  # any free port: the lab's agents are told it
                key = config.site_key_file or ensure_key(lab)
                config = config.model_copy(
                    update={"agent_channel": True, "agent_key_file": key, "agent_listen": listen}
                )
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
        asyncio.run(_serve(config, policy, lab=lab, hang_after=_hang_after(hang_after)))
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
