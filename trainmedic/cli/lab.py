"""`trainmedic lab up|down|status|kill-node|revive-node|train|inject`: the Slurm lab here."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from trainmedic.cli.common import console, settings
from trainmedic.domain.hostlist import HostlistError, validate_node_name
from trainmedic.lab import Lab, LabError, LabNode, LabStatus
from trainmedic.lab.faults import KERNEL_FAULTS, Fault
from trainmedic.lab.workload import (
    TrainingSpec,
    checkpoint_dir,
    job_output,
    kernel_log,
    submit_training,
)
from trainmedic.lab.workload import inject as inject_fault

app = typer.Typer(help="A real Slurm cluster on this machine, for trying and testing.")

_ROOT = typer.Option(None, "--root", help="Lab directory (default: <state dir>/lab).")


def _lab(root: Path | None, port_base: int | None = None, slurm_prefix: Path | None = None) -> Lab:
    config = settings()
    return Lab(
        root or config.lab_dir,
        port_base=port_base or config.lab_port_base,
        slurm_prefix=slurm_prefix,
    )


def _node(name: str) -> str:
    try:
        return validate_node_name(name)
    except HostlistError as error:
        raise LabError(str(error)) from None


def _state_markup(node: LabNode) -> str:
    state, slurm = node.state, node.slurm
    if state is None or slurm is None:
        return "[dim]unknown[/]"
    if not slurm.is_registered:
        return f"[red]{state}[/]"
    if slurm.drain_flag:
        return f"[yellow]{state}[/]"
    return f"[green]{state}[/]"


def _show(status: LabStatus) -> None:
    def pid(value: int | None) -> str:
        return f"running (pid {value})" if value else "[red]stopped[/]"

    console.print(f"lab in {status.root}")
    console.print(f"  munged     {pid(status.munged_pid)}")
    console.print(f"  slurmctld  {pid(status.slurmctld_pid)}")
    if status.spec is None:
        console.print("  (never started here)")
        return
    table = Table("node", "slurmd", "port", "state", "gres", "jobs", "reason")
    for node in status.nodes:
        table.add_row(
            node.name,
            str(node.slurmd_pid) if node.slurmd_pid else "[red]stopped[/]",
            str(node.port),
            _state_markup(node),
            node.gres or "",
            ",".join(node.jobs),
            node.reason or "",
        )
    console.print(table)


def _hint(lab: Lab) -> None:
    console.print("Use it from a shell with:")
    console.print(f"  export SLURM_CONF={lab.slurm_conf}", soft_wrap=True)
    if lab.slurm_prefix is not None:
        console.print(f"  export PATH={lab.slurm_prefix}/bin:$PATH", soft_wrap=True)
    console.print("  sinfo; sbatch ...; squeue")


@app.command()
def up(
    nodes: int | None = typer.Option(None, "--nodes", "-n", help="Emulated nodes (default 4)."),
    gpus: int | None = typer.Option(None, "--gpus", "-g", help="Fake GPUs per node (default 8)."),
    cpus: int | None = typer.Option(None, "--cpus", help="CPUs each node claims (default 8)."),
    port_base: int | None = typer.Option(
        None, "--port-base", help="slurmctld port; slurmd ports follow (default 16817)."
    ),
    root: Path | None = _ROOT,
    slurm_prefix: Path | None = typer.Option(
        None,
        "--slurm-prefix",
        envvar="TRAINMEDIC_SLURM_PREFIX",
        help="Run the Slurm installed under this prefix (bin/, sbin/), e.g. one built by"
        " deploy/lab/build-slurm.sh; default: TRAINMEDIC_SLURM_BIN_DIR's parent, else the"
        " prefix of the last start in this root, else the system's (/usr).",
    ),
    slurmd_timeout: int | None = typer.Option(
        None,
        "--slurmd-timeout",
        min=1,
        max=3600,
        help="Slurm's SlurmdTimeout, s (default 5; production clusters run 300).",
    ),
) -> None:
    """Start the lab, or the parts of it that are not running; wait until nodes are ready."""
    bin_dir = settings().slurm_bin_dir
    if slurm_prefix is None and bin_dir is not None:
        slurm_prefix = bin_dir.parent
    lab = _lab(root, port_base, slurm_prefix)
    with console.status("starting munged, slurmctld and the slurmd's..."):
        status = lab.up(nodes=nodes, gpus=gpus, cpus=cpus, slurmd_timeout=slurmd_timeout)
    _show(status)
    _hint(lab)


@app.command()
def down(root: Path | None = _ROOT) -> None:
    """Cancel every job and stop every process of the lab (a stopped lab: nothing to do)."""
    lab = _lab(root)
    with console.status("stopping the lab..."):
        lab.down()
    console.print(f"lab in {lab.root} is down.")


@app.command()
def status(root: Path | None = _ROOT) -> None:
    """Show the lab's daemons and Slurm's view of each node. Exit 1 when not running."""
    lab = _lab(root)
    current = lab.status()
    _show(current)
    if not current.running:
        raise typer.Exit(1)
    _hint(lab)


@app.command("kill-node")
def kill_node(
    name: str = typer.Argument(..., help="Node name, e.g. gpu02."), root: Path | None = _ROOT
) -> None:
    """Hard node death: SIGKILL the node's slurmd, its step daemons and their jobs."""
    lab = _lab(root)
    killed = lab.kill_node(_node(name))
    if not killed:
        # The lab runs but this node's slurmd was already gone: it is dead already.
        console.print(
            f"{name} was already dead (no slurmd or job processes); bring it back with"
            f" `trainmedic lab revive-node {name}`."
        )
        return
    console.print(
        f"killed {name} ({len(killed)} processes). Slurm marks it DOWN after SlurmdTimeout;"
        f" bring it back with `trainmedic lab revive-node {name}`."
    )


@app.command("revive-node")
def revive_node(
    name: str = typer.Argument(..., help="Node name, e.g. gpu02."), root: Path | None = _ROOT
) -> None:
    """Start the node's slurmd again and resume it in Slurm if it is DOWN."""
    lab = _lab(root)
    with console.status(f"reviving {name}..."):
        node = lab.revive_node(_node(name))
    console.print(f"{node.name} is back: {_state_markup(node)}")


# ------------------------------------------------------------ training workload


@app.command()
def train(
    nodes: int = typer.Option(2, "--nodes", "-N", help="Nodes (one task per node)."),
    steps: int = typer.Option(1000, "--steps", help="Training steps."),
    step_seconds: float = typer.Option(0.5, "--step-seconds", help="Seconds per step."),
    ckpt_every: int = typer.Option(10, "--ckpt-every", help="Checkpoint every N steps (0: never)."),
    name: str = typer.Option("train", "--name", help="Job name; checkpoints in jobs/ckpt-NAME."),
    root: Path | None = _ROOT,
) -> None:
    """Submit a fake multi-node training job that `lab inject` can break."""
    lab = _lab(root)
    spec = TrainingSpec(
        nodes=nodes, steps=steps, step_seconds=step_seconds, ckpt_every=ckpt_every, name=name
    )
    job_id = submit_training(lab, spec)
    console.print(f"submitted training job {job_id} ({name}, {nodes} nodes, {steps} steps)")
    console.print(f"  output       {job_output(lab, job_id)}", soft_wrap=True)
    console.print(f"  checkpoints  {checkpoint_dir(lab, name)}", soft_wrap=True)
    console.print(f"Break it with: trainmedic lab inject xid79 --node gpu01 --job {job_id}")


@app.command()
def inject(
    fault: Fault = typer.Argument(..., help="What goes wrong."),
    node: str = typer.Option(..., "--node", help="The node it happens on, e.g. gpu02."),
    job: str | None = typer.Option(None, "--job", help="Only this job's task takes it."),
    wait: float = typer.Option(
        15.0, "--wait", help="Seconds to wait for the training task to play it out."
    ),
    root: Path | None = _ROOT,
) -> None:
    """Make the training job fail on NODE as real jobs fail (log lines, kernel lines, exit)."""
    lab = _lab(root)
    result = inject_fault(lab, fault, _node(node), job, wait=wait)
    if result.fault is Fault.NODE_DEATH:
        console.print(
            f"killed {node} ({len(result.killed_pids)} processes): a silent death;"
            f" revive it with `trainmedic lab revive-node {node}`."
        )
        return
    if result.happened_at is None:
        console.print(f"asked for {fault.value} on {node}; a training task will take it")
        return
    delay = (result.happened_at - result.requested_at).total_seconds()
    console.print(
        f"{fault.value} on {node}: job {result.job_id} rank {result.rank} (pid {result.pid})"
        f" {delay:.1f} s after the request"
    )
    if fault in KERNEL_FAULTS:
        console.print(f"  kernel log   {kernel_log(lab, node)}", soft_wrap=True)
