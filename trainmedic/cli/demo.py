"""`trainmedic demo`: the whole story on the embedded default, in a couple of minutes.

Stack and lab up, a training job running, a fault injected on one of its nodes, and a
timeline as trainmedic detects, attributes, drains, requeues, and the job resumes from
its checkpoint. Stops what it started when done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from datetime import timedelta

import typer
from temporalio.client import Client
from temporalio.service import RPCError

from trainmedic.cli.common import console, dev_server, settings
from trainmedic.config import Settings, load_policy
from trainmedic.domain.control import SetModeRequest
from trainmedic.domain.enums import Mode
from trainmedic.domain.incident import EffectStatus, IncidentStatus
from trainmedic.errors import TrainmedicError
from trainmedic.lab import Lab
from trainmedic.lab.faults import Fault
from trainmedic.lab.workload import (
    TrainingSpec,
    checkpoint_dir,
    inject,
    job_output,
    reset_nodes,
    submit_training,
)
from trainmedic.temporal.client import connect
from trainmedic.workers.controller import run_controller
from trainmedic.workflows.control import ControlWorkflow, control_workflow_id
from trainmedic.workflows.recovery import RecoveryWorkflow, incident_workflow_id


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
            commands = "; ".join(" ".join(r.command) for r in effect.results if r.command)
            suffix = f"  [dim]$ {commands}[/]" if commands else ""
            timeline.say(f"[bold]{effect.status.value}[/]: {effect.describe()}{suffix}")
        if status.outcome is not None:
            timeline.say(f"[bold]outcome[/]: {status.outcome.value} - {status.details}")
            return status
        await asyncio.sleep(0.2)
    raise TrainmedicError(f"demo: incident {incident} did not finish within {timeout:.0f}s")


async def _story(config: Settings, lab: Lab, fault: Fault, ui_url: str) -> bool:
    client = await connect(config)
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
        reset_nodes(lab)
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


def demo(
    fault: Fault = typer.Option(Fault.XID79, help="The fault to inject."),
    keep: bool = typer.Option(False, help="Leave the dev server and the lab running."),
) -> None:
    """The main job's story: training, a fault, and trainmedic recovering it."""
    # The timeline is the output; service logs only for warnings (-v shows them all).
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger().setLevel(logging.WARNING)
    config = settings()
    server = dev_server(config)
    lab = Lab(config.lab_dir, port_base=config.lab_port_base)
    started_server = server.pid() is None
    started_lab = not lab.status().running
    try:
        with console.status("starting the Temporal dev server..."):
            status = server.start()
        with console.status("starting the Slurm lab (4 nodes x 8 GPUs)..."):
            lab.up(nodes=4, gpus=8)
        config = config.model_copy(update={"slurm_conf": lab.slurm_conf})
        console.print(
            f"[bold]trainmedic demo[/] - Temporal UI {status.ui_url}, cluster "
            f"{config.cluster}, lab nodes gpu01-gpu04. The cluster runs in auto mode for "
            "the demo only and goes back to its own mode afterwards."
        )
        ok = asyncio.run(_story(config, lab, fault, status.ui_url))
    finally:
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
