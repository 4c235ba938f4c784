"""`trainmedic incidents`: list, show, approve/reject, the cluster's mode, and releasing
a node from its quarantine.

Approvals go through the RecoveryWorkflow's `decide` update, not the signals: an update
is validated by the workflow itself, so a wrong one (unknown action, already decided,
wrong stage) is refused with the workflow's own message and leaves no history event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from trainmedic.cli.common import console, err_console, settings
from trainmedic.domain.control import SetModeRequest
from trainmedic.domain.diagnosis import Diagnosis
from trainmedic.domain.enums import Mode
from trainmedic.domain.hostlist import HostlistError, validate_node_name
from trainmedic.domain.incident import (
    Decision,
    DecisionPayload,
    IncidentResult,
    IncidentStatus,
    PlannedEffect,
)
from trainmedic.errors import TrainmedicError
from trainmedic.temporal.client import connect
from trainmedic.temporal.search_attributes import (
    TM_CATEGORY,
    TM_CLUSTER,
    TM_JOB,
    TM_MODE,
    TM_OUTCOME,
    TM_STAGE,
)
from trainmedic.workflows.control import ControlWorkflow, control_workflow_id
from trainmedic.workflows.quarantine import (
    NodeQuarantineWorkflow,
    ReleasePayload,
    quarantine_workflow_id,
)
from trainmedic.workflows.recovery import RecoveryWorkflow

app = typer.Typer(
    help="Incidents (one RecoveryWorkflow each): list, show, approve or reject, set the mode;"
    " release a quarantined node.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

T = TypeVar("T")
QUERY_TIMEOUT = timedelta(seconds=10)
# An update needs a running controller; past this the CLI says so instead of waiting.
UPDATE_TIMEOUT = timedelta(seconds=15)

ADDRESS = typer.Option(
    None, "--address", help="Temporal address (default: TRAINMEDIC_TEMPORAL_ADDRESS)."
)


class Refused(TrainmedicError):
    """The workflow (or Temporal) said no; the message says why."""


def _run(work: Callable[[Client], Awaitable[T]], address: str | None) -> T:
    async def go() -> T:
        client = await connect(settings(), address=address)
        return await work(client)

    try:
        return asyncio.run(go())
    except TrainmedicError as error:
        err_console.print(Text.assemble(("error: ", "bold red"), str(error)), soft_wrap=True)
        raise typer.Exit(2) from None


def _rpc_problem(error: RPCError, workflow_id: str) -> Refused:
    if error.status is RPCStatusCode.NOT_FOUND:
        return Refused(f"no workflow {workflow_id!r}: {error.message}")
    return Refused(f"{workflow_id}: {error.message}")


def _update_refusal(error: WorkflowUpdateFailedError) -> str:
    cause = error.cause
    if isinstance(cause, ApplicationError) and cause.message:
        return cause.message
    return str(getattr(cause, "message", None) or cause or error)


def _update_problem(
    error: WorkflowUpdateFailedError | RPCError, workflow_id: str, not_found: str
) -> Refused:
    """An update that did not go through: the workflow's own refusal, `not_found` where
    there is no such workflow, else Temporal's message."""
    if isinstance(error, WorkflowUpdateFailedError):
        return Refused(f"{workflow_id} refused: {_update_refusal(error)}")
    if error.status is RPCStatusCode.NOT_FOUND:
        return Refused(not_found)
    return _rpc_problem(error, workflow_id)


def _print_table(table: Table) -> None:
    """At the terminal's width on a terminal; wide when piped, so that grep and scripts
    see whole ids, states and commands instead of folded cells."""
    if console.is_terminal:
        console.print(table)
    else:
        Console(width=400, highlight=False).print(table)


# --------------------------------------------------------------------------- list


@app.command("list")
def list_cmd(
    cluster: str | None = typer.Option(None, "--cluster", help="Only this cluster."),
    open_only: bool = typer.Option(False, "--open", help="Only incidents still running."),
    limit: int = typer.Option(20, "--limit", min=1, help="At most this many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
    address: str | None = ADDRESS,
) -> None:
    """Recent incidents with their stage, category and outcome (from visibility, which may
    lag a second or two behind)."""
    query = 'WorkflowType = "RecoveryWorkflow"'
    if cluster:
        query += f' AND TmCluster = "{cluster}"'
    if open_only:
        query += ' AND ExecutionStatus = "Running"'

    async def work(client: Client) -> list[Any]:
        try:
            return [w async for w in client.list_workflows(query, limit=limit)]
        except RPCError as error:
            raise Refused(f"listing incidents: {error.message}") from None

    rows = _run(work, address)
    if as_json:
        for w in rows:
            attrs = w.typed_search_attributes
            print(
                json.dumps(
                    {
                        "incident_id": w.id,
                        "started": w.start_time.isoformat() if w.start_time else None,
                        "status": w.status.name.lower() if w.status else None,
                        "stage": attrs.get(TM_STAGE),
                        "mode": attrs.get(TM_MODE),
                        "category": attrs.get(TM_CATEGORY),
                        "outcome": attrs.get(TM_OUTCOME),
                    }
                )
            )
        return
    table = Table(title=f"incidents ({len(rows)})", show_lines=False)
    table.add_column("incident", no_wrap=True)  # copied into `show`/`approve`: never cut
    for column in ("started", "status", "stage", "mode", "category", "outcome"):
        table.add_column(column, overflow="fold")
    for w in rows:
        attrs = w.typed_search_attributes
        status = w.status.name.lower() if w.status else "?"
        table.add_row(
            w.id,
            w.start_time.strftime("%Y-%m-%d %H:%M:%S") if w.start_time else "",
            status,
            attrs.get(TM_STAGE) or "",
            attrs.get(TM_MODE) or "",
            attrs.get(TM_CATEGORY) or "",
            attrs.get(TM_OUTCOME) or "",
        )
    if rows:
        _print_table(table)
    else:
        console.print("no incidents")


# --------------------------------------------------------------------------- show


async def _status(client: Client, incident_id: str) -> IncidentStatus | IncidentResult:
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident_id)
    try:
        described = await handle.describe()
    except RPCError as error:
        raise _rpc_problem(error, incident_id) from None
    if described.workflow_type != "RecoveryWorkflow":
        raise Refused(f"{incident_id} is a {described.workflow_type}, not an incident")
    if described.status is not WorkflowExecutionStatus.RUNNING:
        try:
            return await handle.result()
        except Exception as error:  # failed/terminated: fall back to the live query
            if described.status is WorkflowExecutionStatus.COMPLETED:
                raise Refused(f"reading the result of {incident_id}: {error}") from None
    try:
        return await handle.query(RecoveryWorkflow.status, rpc_timeout=QUERY_TIMEOUT)
    except RPCError as error:
        # No worker to answer (queries need one): what the memos recorded is still there.
        memo = await described.memo()
        diagnosis = memo.get("diagnosis")
        return IncidentStatus(
            incident_id=incident_id,
            cluster=described.typed_search_attributes.get(TM_CLUSTER) or "?",
            job_id=described.typed_search_attributes.get(TM_JOB) or None,
            stage=described.typed_search_attributes.get(TM_STAGE) or "detect",
            mode=described.typed_search_attributes.get(TM_MODE) or "monitor",
            details=f"(no worker answered the status query: {error.message}; from the memo)",
            diagnosis=Diagnosis.model_validate(diagnosis) if diagnosis else None,
            effects=[PlannedEffect.model_validate(e) for e in memo.get("effects") or []],
            decisions=[Decision.model_validate(d) for d in memo.get("decisions") or []],
        )


def _print_effects(effects: list[PlannedEffect]) -> None:
    if not effects:
        console.print("effects: none planned")
        return
    table = Table(title="effects")
    # Ids and statuses are what people copy and grep: never cut them.
    table.add_column("id", no_wrap=True)
    table.add_column("what")
    table.add_column("mode")
    table.add_column("status", no_wrap=True)
    table.add_column("note / commands", overflow="fold")
    for effect in effects:
        lines = [effect.note] if effect.note else []
        for result in effect.results:
            if result.command:
                changed = "changed" if result.changed else "no change"
                lines.append(f"$ {' '.join(result.command)}  ({changed}: {result.detail})")
        table.add_row(
            effect.id,
            effect.describe(),
            effect.mode.value,
            effect.status.value,
            "\n".join(lines),
        )
    _print_table(table)


def _print_diagnosis(diagnosis: Diagnosis | None) -> None:
    if diagnosis is None:
        console.print("diagnosis: not yet")
        return
    console.print(
        f"[bold]diagnosis:[/] {diagnosis.headline()} -> {diagnosis.action.value} "
        f"(confidence {diagnosis.confidence:.2f}, rules {', '.join(diagnosis.rule_ids) or '-'}, "
        f"catalog {diagnosis.catalog_version})"
    )
    for item in diagnosis.evidence:
        where = " ".join(
            part
            for part in (
                item.source.value,
                f"{item.file}:{item.line_no}" if item.file else "",
                item.node or "",
            )
            if part
        )
        console.print(f"  evidence [{where}] {item.text}", markup=False, soft_wrap=True)


def _print_decisions(decisions: list[Decision], ignored: list[str]) -> None:
    for decision in decisions:
        verb = "approved" if decision.approve else "rejected"
        when = decision.at.strftime("%H:%M:%S") if decision.at else ""
        why = f": {decision.comment}" if decision.comment else ""
        console.print(
            f"  {when} {verb} {decision.action} by {decision.by} via {decision.via}{why}",
            markup=False,
            soft_wrap=True,
        )
    for line in ignored:
        console.print(f"  ignored: {line}", markup=False, soft_wrap=True)


@app.command("show")
def show_cmd(
    incident_id: str,
    as_json: bool = typer.Option(False, "--json", help="The result or status as JSON."),
    address: str | None = ADDRESS,
) -> None:
    """Where an incident is: diagnosis, evidence, effects (with Slurm commands), decisions,
    what it waits for, and (once over) what it cost the job."""
    shown = _run(lambda client: _status(client, incident_id), address)
    if as_json:
        print(shown.model_dump_json())
        return
    console.print(f"[bold]{incident_id}[/]")
    if isinstance(shown, IncidentResult):
        console.print(f"outcome: [bold]{shown.outcome.value}[/] - {shown.summary}")
        times = shown.times
        parts = [
            f"{what} {value:.1f}s"
            for what, value in (
                ("detected in", times.detect_s()),
                ("first effect after", times.act_s()),
                ("failure to running again", times.down_s()),
            )
            if value is not None
        ]
        if parts:
            lost = f"; work since {times.last_progress} lost" if times.last_progress else ""
            console.print(f"time: {', '.join(parts)}{lost}", markup=False, soft_wrap=True)
        _print_diagnosis(shown.diagnosis)
        _print_effects(shown.effects)
        if shown.decisions:
            console.print("decisions:")
            _print_decisions(shown.decisions, [])
        if shown.job_nodes_after:
            console.print(f"job now on: {','.join(shown.job_nodes_after)}")
        return
    job = f", job {shown.job_id}" if shown.job_id else ""
    policy = f", policy {shown.policy_version}" if shown.policy_version else ""
    console.print(
        f"cluster {shown.cluster}{job}; stage [bold]{shown.stage}[/], mode {shown.mode}{policy}"
    )
    if shown.outcome:
        console.print(f"outcome: [bold]{shown.outcome.value}[/]")
    console.print(f"now: {shown.details}", markup=False, soft_wrap=True)
    _print_diagnosis(shown.diagnosis)
    _print_effects(shown.effects)
    if shown.decisions or shown.ignored:
        console.print("decisions:")
        _print_decisions(shown.decisions, shown.ignored)
    waiting = [e for e in shown.effects if e.status.value == "awaiting_approval"]
    if waiting:
        ids = " | ".join(e.id for e in waiting)
        console.print(
            f"waiting for approval of {ids}: "
            f"trainmedic incidents approve {incident_id} --action <{ids}|all> --by <you>",
            markup=False,
            soft_wrap=True,
        )


# ------------------------------------------------------------------ decisions


async def decide(client: Client, incident_id: str, payload: DecisionPayload) -> IncidentStatus:
    """Send the `decide` update; Refused carries the workflow's own reason for a no."""
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident_id)
    try:
        return await handle.execute_update(RecoveryWorkflow.decide, payload)
    except WorkflowUpdateFailedError as error:
        raise Refused(f"{incident_id} refused: {_update_refusal(error)}") from None
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND and "completed" in error.message:
            # Temporal answers an update to a closed workflow with NOT_FOUND; say what
            # the operator needs instead: it is over, and how it ended.
            raise Refused(await _closed_reason(client, incident_id)) from None
        raise _rpc_problem(error, incident_id) from None


async def _closed_reason(client: Client, incident_id: str, then: str = "nothing to decide") -> str:
    try:
        described = await client.get_workflow_handle(incident_id).describe()
    except RPCError:
        return f"{incident_id} is finished; {then}"
    outcome = described.typed_search_attributes.get(TM_OUTCOME)
    status = described.status.name.lower() if described.status else "closed"
    return f"{incident_id} is finished ({outcome or status}); {then}"


def _decide_cmd(
    incident_id: str,
    decision: str,
    action: str,
    by: str,
    comment: str,
    address: str | None,
    as_json: bool = False,
) -> None:
    payload = DecisionPayload(action=action, by=by, comment=comment, decision=decision)
    status = _run(lambda client: decide(client, incident_id, payload), address)
    if as_json:
        print(status.model_dump_json())
        return
    last = status.decisions[-1] if status.decisions else None
    touched = ", ".join(last.effect_ids) if last and last.effect_ids else action
    verb = "approved" if decision == "approve" else "rejected"
    console.print(
        f"{incident_id}: {verb} {touched} (by {by}); now: {status.details}",
        markup=False,
        soft_wrap=True,
    )


def _who(value: str) -> str:
    # Required is not enough: `--by ""` would record a decision by nobody.
    if not value.strip():
        raise typer.BadParameter("say who you are; it is recorded in the audit trail")
    return value.strip()


BY = typer.Option(..., "--by", help="Who decides (recorded in the audit trail).", callback=_who)
JSON = typer.Option(False, "--json", help="The answer as JSON.")
ACTION = typer.Option("all", "--action", help="An effect id (e.g. drain-gpu02) or 'all'.")
COMMENT = typer.Option("", "--comment", help="Why.")


@app.command("approve")
def approve_cmd(
    incident_id: str,
    action: str = ACTION,
    by: str = BY,
    comment: str = COMMENT,
    as_json: bool = JSON,
    address: str | None = ADDRESS,
) -> None:
    """Approve an effect that waits for approval (through the validated `decide` update)."""
    _decide_cmd(incident_id, "approve", action, by, comment, address, as_json)


@app.command("reject")
def reject_cmd(
    incident_id: str,
    action: str = ACTION,
    by: str = BY,
    comment: str = COMMENT,
    as_json: bool = JSON,
    address: str | None = ADDRESS,
) -> None:
    """Reject an effect that waits for approval: it is not done, and the incident says so."""
    _decide_cmd(incident_id, "reject", action, by, comment, address, as_json)


# ------------------------------------------------------------------------ mode


async def set_mode(client: Client, cluster: str, request: SetModeRequest) -> Mode:
    workflow_id = control_workflow_id(cluster)
    handle = client.get_workflow_handle_for(ControlWorkflow.run, workflow_id)
    try:
        state = await handle.execute_update(ControlWorkflow.set_mode, request)
    except (WorkflowUpdateFailedError, RPCError) as error:
        raise _update_problem(
            error,
            workflow_id,
            f"cluster {cluster!r} has no control workflow ({workflow_id}); it starts with "
            "the controller worker",
        ) from None
    return state.mode


@app.command("mode")
def mode_cmd(
    cluster: str,
    mode: Mode,
    by: str = typer.Option(..., "--by", help="Who changes it (recorded).", callback=_who),
    reason: str = typer.Option("", "--reason", help="Why (recorded)."),
    as_json: bool = JSON,
    address: str | None = ADDRESS,
) -> None:
    """Set a cluster's mode (monitor, approve, auto) on its ControlWorkflow."""
    request = SetModeRequest(mode=mode, by=by, reason=reason)
    now = _run(lambda client: set_mode(client, cluster, request), address)
    if as_json:
        print(json.dumps({"cluster": cluster, "mode": now.value, "by": by}))
        return
    console.print(f"cluster {cluster}: mode {now.value} (by {by})", markup=False, soft_wrap=True)


# -------------------------------------------------------------------- quarantine


async def release(client: Client, cluster: str, node: str, payload: ReleasePayload) -> str:
    """The quarantine's `release_node` update (`trainmedic nodes release` and `incidents
    release`): confirmed or refused with the workflow's reason (unknown node, over,
    already released, no name). When no controller takes it in time (down, restarting),
    the `release` signal is sent instead: Temporal keeps it and the quarantine acts on
    it once a controller runs (the Temporal UI sends the same signal)."""
    workflow_id = quarantine_workflow_id(cluster, node)
    handle = client.get_workflow_handle_for(NodeQuarantineWorkflow.run, workflow_id)
    try:
        described = await handle.describe()
        if described.status is not WorkflowExecutionStatus.RUNNING:
            state = described.status.name.lower() if described.status else "closed"
            raise Refused(
                f"node {node} is not held out on cluster {cluster}: its quarantine "
                f"{workflow_id} is over ({state})"
            )
        try:
            status = await handle.execute_update(
                NodeQuarantineWorkflow.release_node, payload, rpc_timeout=UPDATE_TIMEOUT
            )
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            await handle.signal(NodeQuarantineWorkflow.release, payload)
            return (
                f"{node}: no controller answered within {UPDATE_TIMEOUT.seconds} s; the "
                f"release by {payload.by} is recorded on {workflow_id} and takes effect when "
                "a controller runs (`trainmedic nodes` shows it then)."
            )
    except (WorkflowUpdateFailedError, RPCError) as error:
        raise _update_problem(
            error,
            workflow_id,
            f"node {node} is not held out by trainmedic on cluster {cluster} "
            f"(no quarantine {workflow_id})",
        ) from None
    return (
        f"{node}: released by {payload.by} ({workflow_id}); now {status.state}: "
        f"{status.details}. The health check runs and is recorded, then the node is resumed "
        "if trainmedic drained it."
    )


@app.command("release")
def release_cmd(
    node: str = typer.Argument(..., help="The quarantined node, e.g. gpu02."),
    cluster: str | None = typer.Option(
        None, "--cluster", help="Its cluster (default: TRAINMEDIC_CLUSTER)."
    ),
    by: str = typer.Option(
        ..., "--by", help="Who releases it (recorded in the audit trail).", callback=_who
    ),
    comment: str = COMMENT,
    address: str | None = ADDRESS,
) -> None:
    """Let a quarantined node go back early (skips the cool-down; resumed only if
    trainmedic drained it). The same as `trainmedic nodes release`."""
    try:
        validate_node_name(node)
    except HostlistError as error:
        raise typer.BadParameter(str(error), param_hint="NODE") from None
    where = cluster or settings().cluster
    payload = ReleasePayload(by=by, comment=comment)
    said = _run(lambda client: release(client, where, node, payload), address)
    console.print(said, markup=False, soft_wrap=True)


# ---------------------------------------------------------------------- cancel


async def cancel(client: Client, incident_id: str, by: str, reason: str) -> str:
    """Request cancellation; the workflow finishes no effect half-way and reports what
    Slurm looks like (RecoveryWorkflow._cancelled). Returns what happened."""
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident_id)
    try:
        described = await handle.describe()
        if described.workflow_type != "RecoveryWorkflow":
            raise Refused(f"{incident_id} is a {described.workflow_type}, not an incident")
        if described.status is not WorkflowExecutionStatus.RUNNING:
            raise Refused(await _closed_reason(client, incident_id, "nothing to cancel"))
        # Temporal records the reason with the request in the history: who and why.
        await handle.cancel(reason=f"cancelled by {by}" + (f": {reason}" if reason else ""))
    except RPCError as error:
        raise _rpc_problem(error, incident_id) from None
    return f"{incident_id}: cancellation requested (by {by}); effects not yet applied will not be"


@app.command("cancel")
def cancel_cmd(
    incident_id: str,
    by: str = typer.Option(..., "--by", help="Who cancels (recorded).", callback=_who),
    reason: str = typer.Option("", "--reason", help="Why (recorded)."),
    as_json: bool = JSON,
    address: str | None = ADDRESS,
) -> None:
    """Cancel an open incident: an effect under way finishes, none after it starts."""
    said = _run(lambda client: cancel(client, incident_id, by, reason), address)
    if as_json:
        print(json.dumps({"incident_id": incident_id, "cancel_requested": True, "by": by}))
        return
    console.print(said, markup=False, soft_wrap=True)
