"""`trainmedic demo`: the whole story on the embedded default, in a couple of minutes.

Stack and lab up, a training job running, a fault injected on one of its nodes, and a
timeline as trainmedic detects, attributes, drains, requeues, and the job resumes from
its checkpoint. Stops what it started when done.

Each run tells only its own story. The dev server's database outlives a demo, and so
would the quarantine of the node the last demo drained (its cool-down fires minutes
later, in the middle of the next story) and the fault it injected (the node's fake GPU
stays "lost"). So a demo starts by closing the quarantines and incidents earlier demos
left open on the lab's cluster, clearing injected faults and putting every lab node
back in service; and it closes its own before it ends (unless --keep).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shlex
import time
import uuid
from datetime import timedelta

import typer
from rich.markup import escape
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from trainmedic.cli.common import console, dev_server, settings
from trainmedic.config import Settings, load_policy
from trainmedic.domain.control import SetModeRequest
from trainmedic.domain.enums import Mode
from trainmedic.domain.incident import EffectStatus, IncidentStatus
from trainmedic.errors import TrainmedicError
from trainmedic.lab import Lab
from trainmedic.lab.faults import Fault
from trainmedic.lab.sshd import loopback_sshd
from trainmedic.lab.workload import (
    TrainingSpec,
    checkpoint_dir,
    clear_faults,
    inject,
    job_output,
    lab_nodes,
    submit_training,
)
from trainmedic.temporal.client import connect
from trainmedic.workers.controller import run_controller
from trainmedic.workflows.control import ControlWorkflow, control_workflow_id
from trainmedic.workflows.quarantine import quarantine_workflow_id
from trainmedic.workflows.recovery import RecoveryWorkflow, incident_workflow_id

logger = logging.getLogger(__name__)

DEMO = "trainmedic demo"
LEFT_BEFORE = (
    f"closed by {DEMO}: left open by an earlier demo of this lab cluster; "
    "each demo starts from a clean slate"
)
DEMO_OVER = f"closed by {DEMO}: the demo is over and its lab is reset"


class Timeline:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def say(self, text: str) -> None:
        console.print(f"[dim]t+{time.monotonic() - self.start:6.1f}s[/]  {text}")


def _job_field(lab: Lab, job_id: str, key: str) -> str:
    out = lab.run_client(["scontrol", "-o", "show", "job", job_id], check=False).stdout
    match = re.search(rf"\b{key}=(\S*)", out)
    return match.group(1) if match else ""


async def _wait(what: str, probe: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(probe):  # type: ignore[arg-type]
            return
        await asyncio.sleep(0.3)
    raise TrainmedicError(f"demo: timed out after {timeout:.0f}s waiting for {what}")


async def _close_demo_workflows(
    client: Client, cluster: str, nodes: list[str], reason: str
) -> list[str]:
    """Terminate the cluster's open incidents and node quarantines: the demo's own.

    Terminated, not cancelled: no worker needs to run for it, nothing of theirs runs
    afterwards, and the reason shows in the UI and the history. Slurm is put back by
    the lab reset that follows, not by them. Returns the workflow ids closed.
    """
    # By the cluster's search attribute; by id for one that never ran its first task
    # (it has no attributes yet), matching this cluster only, not `<cluster>-x`. Cluster
    # names are letters, digits, '.', '_' and '-' (Settings), safe inside the quotes.
    node_ids = {quarantine_workflow_id(cluster, node) for node in nodes}
    incident_id = re.compile(rf"incident-{re.escape(cluster)}-[^-]+-\d+")
    query = (
        "ExecutionStatus = 'Running' AND "
        "WorkflowType IN ('NodeQuarantineWorkflow', 'RecoveryWorkflow') AND "
        f"(TmCluster = '{cluster}' OR WorkflowId STARTS_WITH 'node-{cluster}-' OR "
        f"WorkflowId STARTS_WITH 'incident-{cluster}-')"
    )
    closed = []
    async for execution in client.list_workflows(query):
        ours = execution.search_attributes.get("TmCluster") == [cluster] or (
            "TmCluster" not in execution.search_attributes
            and (execution.id in node_ids or incident_id.fullmatch(execution.id) is not None)
        )
        if not ours:
            continue
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        try:
            await handle.terminate(reason=reason)
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND:  # closed meanwhile: fine
                raise
            continue
        logger.info("%s %s (%s)", reason, execution.id, execution.workflow_type)
        closed.append(execution.id)
    return closed


def _say_closed(closed: list[str], why: str) -> str:
    quarantines = sum(1 for c in closed if c.startswith("node-"))
    incidents = len(closed) - quarantines
    parts = [
        f"{n} {what}{'' if n == 1 else 's'}"
        for n, what in ((quarantines, "node quarantine"), (incidents, "incident"))
        if n
    ]
    return f"closed {' and '.join(parts)} {why}"


async def _clean_slate(client: Client, cluster: str, lab: Lab) -> None:
    """What earlier demos left: open workflows, injected faults, nodes out of service."""
    nodes = lab_nodes(lab)
    closed = await _close_demo_workflows(client, cluster, nodes, LEFT_BEFORE)
    faulty = await asyncio.to_thread(clear_faults, lab)
    await asyncio.to_thread(lab.reset)
    done = []
    if closed:
        done.append(_say_closed(closed, "left open by an earlier demo"))
    if faulty:
        done.append(f"cleared the faults injected on {', '.join(faulty)}")
    if done:
        console.print(f"[dim]clean slate: {'; '.join(done)}[/]")


async def _follow(
    client: Client, incident: str, timeline: Timeline, timeout: float
) -> IncidentStatus:
    """Print the incident's progress as it happens; return its final status."""
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
    seen_signals = 0
    last_stage = None
    shown_diagnosis = False
    shown_effects: set[tuple[str, str]] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = await handle.query(RecoveryWorkflow.status)
        except RPCError:
            await asyncio.sleep(0.1)
            continue
        if seen_signals == 0 and status.signals:
            timeline.say(f"[bold]detected[/]: incident [cyan]{incident}[/] opened")
        for signal in status.signals[seen_signals:]:
            first = signal.evidence[0].text[:100] if signal.evidence else signal.detail
            timeline.say(f"  report from {signal.source} ({signal.kind}): {first}")
        seen_signals = len(status.signals)
        if status.diagnosis and not shown_diagnosis:
            shown_diagnosis = True
            d = status.diagnosis
            timeline.say(
                f"[bold]attributed[/]: {d.category.value} -> {d.action.value}; culprit "
                f"{', '.join(d.culprit_nodes) or '-'} (confidence {d.confidence:.2f}, "
                f"rules {', '.join(d.rule_ids[:3])})"
            )
        if status.stage != last_stage:
            last_stage = status.stage
        for effect in status.effects:
            key = (effect.id, effect.status.value)
            if key in shown_effects or effect.status is EffectStatus.PLANNED:
                continue
            shown_effects.add(key)
            timeline.say(f"[bold]{effect.status.value}[/]: {effect.describe()}")
            for result in effect.results:
                if result.command:
                    # One command a line, quoted as a shell needs it (the drain reason and
                    # the job comment are one argument each) and never wrapped, so it can
                    # be pasted; escaped, as reasons quote log lines with [brackets].
                    console.print(
                        f"{'':13}[dim]$ {escape(shlex.join(result.command))}[/]", soft_wrap=True
                    )
        if status.outcome is not None:
            timeline.say(f"[bold]outcome[/]: {status.outcome.value} - {status.details}")
            return status
        await asyncio.sleep(0.2)
    raise TrainmedicError(f"demo: incident {incident} did not finish within {timeout:.0f}s")


async def _story(config: Settings, lab: Lab, fault: Fault, ui_url: str, keep: bool) -> bool:
    client = await connect(config)
    # Before the controller starts, so that nothing of an earlier demo wakes up in it.
    await _clean_slate(client, config.cluster, lab)
    # The configured policy as it is; only the cluster's mode is switched to auto for the
    # demo (an audited set_mode) and handed back afterwards.
    policy = load_policy(config.policy_file)
    stop = asyncio.Event()
    controller = asyncio.create_task(
        run_controller(client, config, policy, stop, lab=lab, hang_after=timedelta(seconds=15))
    )
    job_id = None
    previous_mode: Mode | None = None
    try:
        control = client.get_workflow_handle_for(
            ControlWorkflow.run, control_workflow_id(config.cluster)
        )
        await _wait("the controller", lambda: True, 1)
        for _ in range(100):  # the controller starts the cluster's ControlWorkflow
            with contextlib.suppress(RPCError):
                await control.query(ControlWorkflow.current)
                break
            await asyncio.sleep(0.2)
        previous_mode = (await control.query(ControlWorkflow.current)).mode
        await control.execute_update(
            ControlWorkflow.set_mode,
            SetModeRequest(mode=Mode.AUTO, by="trainmedic demo", reason="demo: act on its own"),
        )
        timeline = Timeline()
        name = f"demo-{uuid.uuid4().hex[:6]}"
        job_id = submit_training(
            lab, TrainingSpec(nodes=2, steps=100000, step_seconds=0.5, ckpt_every=10, name=name)
        )
        timeline.say(f"submitted training job {job_id} (2 nodes, checkpoint every 10 steps)")
        await _wait("the job to run", lambda: _job_field(lab, job_id, "JobState") == "RUNNING", 60)
        nodes = _job_field(lab, job_id, "NodeList")
        ckpt = checkpoint_dir(lab, name)
        await _wait("a checkpoint", lambda: ckpt.is_dir() and any(ckpt.iterdir()), 60)
        timeline.say(f"job {job_id} training on {nodes}; first checkpoint written")
        from trainmedic.domain.hostlist import expand

        target = expand(nodes)[-1]
        timeline.say(f"[bold red]injecting {fault.value}[/] on {target}")
        await asyncio.to_thread(inject, lab, fault, target, job_id)
        incident = incident_workflow_id(config.cluster, job_id, 1)
        final = await _follow(client, incident, timeline, timeout=180)
        resumed = False
        if final.outcome and final.outcome.value == "recovered":

            def resumed_line() -> bool:
                return "resuming from checkpoint" in job_output(lab, job_id).read_text()

            with contextlib.suppress(TrainmedicError):
                await _wait("the resume", resumed_line, 60)
                step = re.findall(
                    r"resuming from checkpoint step (\d+)", job_output(lab, job_id).read_text()
                )
                now_on = _job_field(lab, job_id, "NodeList")
                timeline.say(
                    f"[bold green]job {job_id} resumed from checkpoint step {step[-1]}[/] "
                    f"on {now_on}"
                )
                resumed = True
        console.print()
        console.print(
            f"Incident in the Temporal UI: {ui_url}/namespaces/"
            f"{config.temporal_namespace}/workflows/{incident}"
        )
        console.print(f"Its audit trail: trainmedic audit export --incident {incident}")
        return resumed
    finally:
        if job_id:
            lab.run_client(["scancel", job_id], check=False)
        if previous_mode is not None and previous_mode is not Mode.AUTO:
            # The cluster's mode outlives the demo in the dev server: hand it back.
            with contextlib.suppress(Exception):
                await control.execute_update(
                    ControlWorkflow.set_mode,
                    SetModeRequest(
                        mode=previous_mode,
                        by="trainmedic demo",
                        reason=f"demo over: back to {previous_mode.value}",
                    ),
                )
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(controller, 30)
        if not keep:
            # Its quarantine would otherwise wake up in the next demo (or any controller
            # on this cluster) minutes from now; the lab reset after this puts the node
            # back. With --keep, all stays for a look; the next demo closes it.
            try:
                closed = await _close_demo_workflows(
                    client, config.cluster, lab_nodes(lab), DEMO_OVER
                )
                await asyncio.to_thread(clear_faults, lab)
            except (RPCError, TrainmedicError, OSError) as error:
                logger.warning("demo: could not close what it started: %s", error)
            else:
                if closed:
                    console.print(
                        f"[dim]{_say_closed(closed, 'that the demo opened')}: the next demo "
                        "starts clean[/]"
                    )


def demo(
    fault: Fault = typer.Option(Fault.XID79, help="The fault to inject."),
    keep: bool = typer.Option(False, help="Leave the dev server and the lab running."),
    slurm_access: str = typer.Option(
        "local",
        "--slurm-access",
        help="local, or ssh: reach the lab's Slurm over SSH (a real sshd on loopback, its "
        "host key checked against a known_hosts file), as a controller off-cluster would.",
    ),
) -> None:
    """The main job's story: training, a fault, and trainmedic recovering it."""
    if slurm_access not in ("local", "ssh"):
        raise typer.BadParameter("local or ssh", param_hint="--slurm-access")
    # The timeline is the output; service logs only for warnings (-v shows them all).
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger().setLevel(logging.WARNING)
    config = settings()
    server = dev_server(config)
    lab = Lab(config.lab_dir, port_base=config.lab_port_base)
    started_server = server.pid() is None
    started_lab = not lab.status().running
    stack = contextlib.ExitStack()
    try:
        with console.status("starting the Temporal dev server..."):
            status = server.start()
        with console.status("starting the Slurm lab (4 nodes x 8 GPUs)..."):
            lab.up(nodes=4, gpus=8)
        config = config.model_copy(update={"slurm_conf": lab.slurm_conf})
        if "metrics_address" not in config.model_fields_set:
            # A story, not a service: no metrics endpoint unless one was asked for (the
            # default port may be a running controller's, and its error would be noise).
            config = config.model_copy(update={"metrics_address": ""})
        if slurm_access == "ssh":
            sshd = stack.enter_context(loopback_sshd())
            config = config.model_copy(
                update={
                    "slurm_access": "ssh",
                    "ssh_host": sshd.host,
                    "ssh_port": sshd.port,
                    "ssh_user": sshd.user,
                    "ssh_key": sshd.client_key,
                    "ssh_known_hosts": sshd.known_hosts,
                }
            )
            console.print(
                f"Slurm over SSH: {sshd.user}@{sshd.host}:{sshd.port} (a real sshd on "
                f"loopback; its host key checked against {sshd.known_hosts}); every Slurm "
                "command, poll and job-log read goes over one connection."
            )
        console.print(
            f"[bold]trainmedic demo[/] - Temporal UI {status.ui_url}, cluster "
            f"{config.cluster}, lab nodes gpu01-gpu04. The cluster runs in auto mode for "
            "the demo only and goes back to its own mode afterwards."
        )
        ok = asyncio.run(_story(config, lab, fault, status.ui_url, keep))
    finally:
        stack.close()
        if not keep:
            with console.status("stopping what the demo started..."):
                if started_lab:
                    lab.down()
                else:
                    lab.reset()
                if started_server:
                    server.stop()
    console.print("[green]demo done[/]" if ok else "[red]demo ended without a recovery[/]")
    if not ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(demo)
