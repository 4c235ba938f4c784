"""`trainmedic status` (the cluster at a glance) and `trainmedic recover JOB` (an incident
opened by a person).

`status` reads Temporal only: the ControlWorkflow's state (mode, breaker, nodes held
out), the open incidents from visibility, and the results of the incidents closed in the
window, from which the detection and recovery times and the time failures cost are
computed. Goodput here is per job: the time from each failure to the job running again,
plus the work since its last checkpoint where the incident knew it. The time saved is an
estimate against a person reacting at NVIDIA's published 69 s to detect and 94 s to act.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from rich.text import Text
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from trainmedic.cli.common import console, err_console, settings
from trainmedic.cli.incidents import ADDRESS, Refused, _print_table, _run, _who
from trainmedic.config import PositiveDuration
from trainmedic.domain.control import ControlState
from trainmedic.domain.enums import Outcome
from trainmedic.domain.hostlist import HostlistError, validate_node_name
from trainmedic.domain.incident import IncidentResult, IncidentSignal
from trainmedic.temporal.search_attributes import TM_JOB, TM_MODE, TM_STAGE

# NVIDIA's published figures for a person in the loop (detect, then act), in seconds.
PERSON_DETECT_S = 69.0
PERSON_ACT_S = 94.0
# Closed incidents read for the figures; more than this in a window is summarised from
# the newest ones (and said so).
MAX_CLOSED = 500


class OpenIncident(BaseModel):
    incident_id: str
    job_id: str | None = None
    stage: str = ""
    mode: str = ""
    started: datetime | None = None
    waiting_for_approval: bool = False


class JobCost(BaseModel):
    job_id: str
    incidents: int
    down_s: float  # failure to running again, summed over the window's incidents
    lost_progress: list[str] = Field(default_factory=list)  # last checkpoint before each


class StatusReport(BaseModel):
    cluster: str
    mode: str
    mode_by_partition: dict[str, str] = Field(default_factory=dict)
    mode_by_action: dict[str, str] = Field(default_factory=dict)
    breaker_tripped_at: datetime | None = None
    breaker_reason: str | None = None
    nodes_held_out: list[dict[str, Any]] = Field(default_factory=list)
    open_incidents: list[OpenIncident] = Field(default_factory=list)
    window_s: float
    closed: int = 0
    closed_read: int = 0
    outcomes: dict[str, int] = Field(default_factory=dict)
    detect_p50_s: float | None = None
    act_p50_s: float | None = None
    back_p50_s: float | None = None  # failure to running again, recovered incidents
    jobs: list[JobCost] = Field(default_factory=list)
    saved_estimate_s: float | None = None


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


async def _control(client: Client, cluster: str) -> ControlState:
    from trainmedic.workflows.control import ControlWorkflow, control_workflow_id

    handle = client.get_workflow_handle_for(ControlWorkflow.run, control_workflow_id(cluster))
    try:
        return await handle.query(ControlWorkflow.current, rpc_timeout=timedelta(seconds=10))
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise Refused(
                f"cluster {cluster!r} has no control workflow; it starts with the controller "
                "(`trainmedic up`)"
            ) from None
        raise Refused(f"cluster {cluster!r}: {error.message} (is a controller running?)") from None


async def gather_status(client: Client, cluster: str, window: timedelta) -> StatusReport:
    control = await _control(client, cluster)
    policy = control.policy
    report = StatusReport(
        cluster=cluster,
        mode=control.mode.value,
        mode_by_partition={k: v.value for k, v in policy.mode.partitions.items()},
        mode_by_action={k.value: v.value for k, v in policy.mode.actions.items()},
        breaker_tripped_at=control.breaker_tripped_at,
        breaker_reason=control.breaker_reason,
        nodes_held_out=[
            {"node": i.node, "partition": i.partition, "incident": i.incident_id, "since": i.at}
            for i in control.isolations
        ],
        window_s=window.total_seconds(),
    )
    base = f'WorkflowType = "RecoveryWorkflow" AND TmCluster = "{cluster}"'
    try:
        async for w in client.list_workflows(f'{base} AND ExecutionStatus = "Running"'):
            attrs = w.typed_search_attributes
            stage = attrs.get(TM_STAGE) or ""
            report.open_incidents.append(
                OpenIncident(
                    incident_id=w.id,
                    job_id=attrs.get(TM_JOB) or None,
                    stage=stage,
                    mode=attrs.get(TM_MODE) or "",
                    started=w.start_time,
                    waiting_for_approval=stage == "gate",
                )
            )
        since = (datetime.now(UTC) - window).strftime("%Y-%m-%dT%H:%M:%SZ")
        closed = [
            w
            async for w in client.list_workflows(
                f'{base} AND ExecutionStatus = "Completed" AND CloseTime > "{since}"'
            )
        ]
    except RPCError as error:
        raise Refused(f"listing incidents: {error.message}") from None
    report.closed = len(closed)
    from trainmedic.workflows.recovery import RecoveryWorkflow

    results: list[IncidentResult] = []
    for w in closed[:MAX_CLOSED]:
        try:
            handle = client.get_workflow_handle_for(RecoveryWorkflow.run, w.id)
            results.append(await handle.result())
        except Exception:
            continue  # an unreadable history: counted as closed, not read
    report.closed_read = len(results)
    _figures(report, results)
    return report


def _figures(report: StatusReport, results: list[IncidentResult]) -> None:
    report.outcomes = dict(Counter(r.outcome.value for r in results))
    detect = [d for r in results if (d := r.times.detect_s()) is not None]
    act = [a for r in results if (a := r.times.act_s()) is not None]
    recovered = [r for r in results if r.outcome is Outcome.RECOVERED]
    back = [b for r in recovered if (b := r.times.down_s()) is not None]
    report.detect_p50_s, report.act_p50_s, report.back_p50_s = _p50(detect), _p50(act), _p50(back)
    per_job: dict[str, JobCost] = defaultdict(lambda: JobCost(job_id="", incidents=0, down_s=0))
    for r in results:
        job = _job_of(r.incident_id)
        if job is None:
            continue
        cost = per_job[job]
        cost.job_id = job
        cost.incidents += 1
        cost.down_s += r.times.down_s() or 0.0
        if r.times.last_progress:
            cost.lost_progress.append(r.times.last_progress)
    report.jobs = sorted(per_job.values(), key=lambda c: -c.down_s)
    # Against a person: their detect + act time, less what trainmedic took for the same.
    saved = [
        PERSON_DETECT_S + PERSON_ACT_S - (r.times.detect_s() or 0.0) - (r.times.act_s() or 0.0)
        for r in recovered
        if r.times.acted_at is not None
    ]
    report.saved_estimate_s = round(sum(saved), 1) if saved else None


def _job_of(incident_id: str) -> str | None:
    """incident-<cluster>-<job>-<n> -> job (None for node and storm incidents)."""
    parts = incident_id.rsplit("-", 2)
    if len(parts) != 3 or not parts[1][:1].isdigit():
        return None
    return parts[1]


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _print_status(report: StatusReport) -> None:
    from rich.table import Table

    overrides = ", ".join(
        [f"{k}: {v}" for k, v in report.mode_by_action.items()]
        + [f"partition {k}: {v}" for k, v in report.mode_by_partition.items()]
    )
    console.print(
        f"[bold]{report.cluster}[/]: mode {report.mode}" + (f" ({overrides})" if overrides else ""),
        soft_wrap=True,
    )
    if report.breaker_tripped_at:
        console.print(
            f"[bold red]breaker open[/] since {report.breaker_tripped_at:%Y-%m-%d %H:%M:%S}: "
            f"{report.breaker_reason}",
            markup=True,
            soft_wrap=True,
        )
    else:
        console.print("breaker: closed")
    held = report.nodes_held_out
    console.print(
        "nodes held out: "
        + (", ".join(f"{h['node']} ({h['incident']})" for h in held) if held else "none"),
        markup=False,
        soft_wrap=True,
    )
    waiting = [i for i in report.open_incidents if i.waiting_for_approval]
    console.print(
        f"open incidents: {len(report.open_incidents)}, waiting for approval: {len(waiting)}"
    )
    if report.open_incidents:
        table = Table()
        for column in ("incident", "job", "stage", "mode", "started"):
            table.add_column(column, no_wrap=column == "incident")
        for i in report.open_incidents:
            started = f"{i.started:%H:%M:%S}" if i.started else ""
            table.add_row(i.incident_id, i.job_id or "", i.stage, i.mode, started)
        _print_table(table)
    hours = report.window_s / 3600
    read = "" if report.closed == report.closed_read else f" ({report.closed_read} read)"
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "none"
    console.print(
        f"last {hours:g}h: {report.closed} incidents closed{read}: {outcomes}", soft_wrap=True
    )
    console.print(
        f"median detection {_fmt_s(report.detect_p50_s)}, to first effect "
        f"{_fmt_s(report.act_p50_s)}, failure to running again {_fmt_s(report.back_p50_s)}"
    )
    for cost in report.jobs[:10]:
        lost = f"; work since {', '.join(cost.lost_progress)} lost" if cost.lost_progress else ""
        console.print(
            f"  job {cost.job_id}: {cost.incidents} incident(s), {cost.down_s:.0f}s down{lost}",
            markup=False,
            soft_wrap=True,
        )
    if report.saved_estimate_s is not None:
        console.print(
            f"time saved (estimate, against a person at {PERSON_DETECT_S:.0f}s to detect and "
            f"{PERSON_ACT_S:.0f}s to act): {report.saved_estimate_s:.0f}s"
        )


def status(
    cluster: str | None = typer.Option(None, "--cluster", help="Default: TRAINMEDIC_CLUSTER."),
    since: str = typer.Option("24h", "--since", help="Window for the figures, e.g. 1h, 7d."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object."),
    address: str | None = ADDRESS,
) -> None:
    """The cluster at a glance: mode, breaker, nodes held out, open incidents and
    approvals, and the last day's detection, recovery and goodput figures."""
    try:
        window = TypeAdapter(PositiveDuration).validate_python(since)
    except ValueError as error:
        why = error.errors()[0]["msg"] if isinstance(error, ValidationError) else str(error)
        raise typer.BadParameter(why, param_hint="--since") from None
    where = cluster or settings().cluster
    report = _run(lambda client: gather_status(client, where, window), address)
    if as_json:
        print(json.dumps(report.model_dump(mode="json"), sort_keys=True))
        return
    _print_status(report)


# ----------------------------------------------------------------------- recover


class Recovery(BaseModel):
    incident_id: str
    started: bool  # False: the report joined an incident already open


async def open_incident(
    client: Client, cluster: str, job_id: str, run: int, signal: IncidentSignal
) -> Recovery:
    from trainmedic.config import Settings
    from trainmedic.domain.incident import IncidentInput
    from trainmedic.workflows.recovery import RecoveryWorkflow, incident_workflow_id

    incident_id = incident_workflow_id(cluster, job_id, run + 1)
    handle = client.get_workflow_handle(incident_id)
    try:
        described = await handle.describe()
    except RPCError as error:
        if error.status is not RPCStatusCode.NOT_FOUND:
            raise Refused(f"{incident_id}: {error.message}") from None
        described = None
    if described is not None and described.status is not WorkflowExecutionStatus.RUNNING:
        state = described.status.name.lower() if described.status else "closed"
        raise Refused(
            f"{incident_id} is already closed ({state}); for a later run of job {job_id} "
            f"say which with --run (its restart count)"
        )
    try:
        await client.start_workflow(
            RecoveryWorkflow.run,
            IncidentInput(cluster=cluster, job_id=job_id, nodes=list(signal.nodes)),
            id=incident_id,
            task_queue=Settings().temporal_task_queue,
            start_signal="report",
            start_signal_args=[signal],
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
    except RPCError as error:
        raise Refused(f"{incident_id}: {error.message}") from None
    return Recovery(incident_id=incident_id, started=described is None)


def _restart_count(job_id: str) -> int:
    """The job's current run, from Slurm (the controller's own access to it)."""
    import asyncio

    from trainmedic.adapters.slurm.errors import NoSuchJob, SlurmError
    from trainmedic.workers.controller import slurm_backend

    try:
        job = asyncio.run(slurm_backend(settings()).get_job(job_id))
    except NoSuchJob:
        raise Refused(f"job {job_id} is unknown to Slurm") from None
    except SlurmError as error:
        raise Refused(f"reading job {job_id} from Slurm: {error} (or give --run)") from None
    return job.restarts or 0


def recover(
    job_id: str = typer.Argument(..., help="The Slurm job id."),
    by: str = typer.Option(..., "--by", help="Who asks (recorded).", callback=_who),
    reason: str = typer.Option("", "--reason", help="Why (recorded, shown to the attributor)."),
    suspect: list[str] = typer.Option(
        [],
        "--suspect",
        help="A node you believe is bad (repeatable), recorded as operator evidence.",
    ),
    run: int | None = typer.Option(
        None, "--run", min=0, help="The job's restart count (default: read from Slurm)."
    ),
    cluster: str | None = typer.Option(None, "--cluster", help="Default: TRAINMEDIC_CLUSTER."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object."),
    address: str | None = ADDRESS,
) -> None:
    """Open an incident for a job by hand (or add your report to the one already open).

    It then runs like any other: the job's logs and Slurm's view are attributed, the plan
    is gated by the cluster's mode and rails. Nodes named with --suspect go into the
    incident as an operator's evidence about them (a trusted source: if the diagnosis
    blames one of them, auto mode may drain it).
    """
    from trainmedic.domain.diagnosis import Evidence, EvidenceSource
    from trainmedic.watchers.epilog import valid_job_id

    if not valid_job_id(job_id):
        raise typer.BadParameter("not a Slurm job id (N, N_M or N+M)", param_hint="JOB_ID")
    for node in suspect:
        try:
            validate_node_name(node)
        except HostlistError as error:
            raise typer.BadParameter(str(error), param_hint="--suspect") from None
    where = cluster or settings().cluster
    current = run
    if current is None:
        try:
            current = _restart_count(job_id)
        except Refused as error:
            err_console.print(Text.assemble(("error: ", "bold red"), str(error)), soft_wrap=True)
            raise typer.Exit(2) from None
    text = f"operator {by} asks for recovery" + (f": {reason}" if reason else "")
    signal = IncidentSignal(
        source="operator",
        kind="manual",
        job_id=job_id,
        nodes=sorted(set(suspect)),
        at=datetime.now(UTC),
        detail=text,
        run=current,
        evidence=[
            Evidence(source=EvidenceSource.OPERATOR, text=f"{text} (suspect {n})", node=n)
            for n in sorted(set(suspect))
        ],
    )
    opened = _run(lambda client: open_incident(client, where, job_id, current, signal), address)
    if as_json:
        print(json.dumps(opened.model_dump(mode="json")))
        return
    verb = "opened" if opened.started else "added your report to the open incident"
    console.print(
        f"{verb} {opened.incident_id}; follow it with `trainmedic incidents show "
        f"{opened.incident_id}`",
        markup=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("recover")(recover)
