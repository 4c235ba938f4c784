"""`trainmedic nodes`: the nodes trainmedic holds out, and releasing one.

The source of truth is each node's NodeQuarantineWorkflow (`node-<cluster>-<node>`):
visibility lists the running ones of the cluster, and each one's `status` query says why
the node is out, since when, and what happens next. A release is the workflow's
validated `release_node` update: recorded in its history with who, when and why.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

import typer
from rich.table import Table
from temporalio.client import Client
from temporalio.service import RPCError

from trainmedic.cli.common import console, settings
from trainmedic.cli.incidents import (
    ADDRESS,
    COMMENT,
    QUERY_TIMEOUT,
    Refused,
    _print_table,
    _run,
    _who,
    release,
)
from trainmedic.domain.hostlist import HostlistError, validate_node_name
from trainmedic.durations import format_duration
from trainmedic.workflows.quarantine import (
    NodeQuarantineWorkflow,
    QuarantineStatus,
    ReleasePayload,
)

app = typer.Typer(
    help="Nodes trainmedic holds out (one NodeQuarantineWorkflow each): list, release.",
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

CLUSTER = typer.Option(None, "--cluster", help="The cluster (default: TRAINMEDIC_CLUSTER).")


def _when(value: datetime | None) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S} UTC" if value else ""


def why(status: QuarantineStatus) -> dict[str, str | None]:
    """Why the node is out: the incident and category from trainmedic's drain reason,
    or (before the cool-down ends) the latest report."""
    cause = status.cause
    if cause is not None:
        return {
            "incident_id": cause.incident_id,
            "category": cause.category,
            "reason": cause.reason,
        }
    last = status.signals[-1] if status.signals else None
    reason = (
        f"{last.kind}: {last.detail}" if last and last.detail else (last.kind if last else None)
    )
    return {"incident_id": None, "category": None, "reason": reason}


def next_step(status: QuarantineStatus) -> str:
    """What happens next, in one line."""
    last = status.checks[-1] if status.checks else None
    failing = "; ".join(f"{c.name}: {c.detail}" for c in last.failed) if last else ""
    match status.state:
        case "cooling_down":
            return f"cooling down until {_when(status.cooldown_until)}, then a health check"
        case "checking":
            return "health check running"
        case "rechecking":
            return (
                f"health check failing ({failing}); re-check at {_when(status.next_check_at)} "
                f"({status.failed_checks} of {status.recheck_limit} failures)"
            )
        case "waiting_for_person":
            offense = status.cause.offense if status.cause else None
            if status.waiting_for == "repeat_offender" and offense is not None:
                return (
                    f"waiting for a person: repeat offender ({offense.count} incidents within "
                    f"{format_duration(offense.window)}); "
                    f"trainmedic nodes release {status.node} --by NAME"
                )
            return (
                f"waiting for a person: health check failing ({failing or status.escalated}); "
                f"trainmedic nodes release {status.node} --by NAME"
            )
        case _:
            return status.details


def _row(status: QuarantineStatus, workflow_id: str) -> dict[str, Any]:
    last = status.checks[-1] if status.checks else None
    offense = status.cause.offense if status.cause else None
    return {
        "node": status.node,
        "cluster": status.cluster,
        "workflow_id": workflow_id,
        "state": status.state,
        "since": status.since.isoformat() if status.since else None,
        **why(status),
        "next": next_step(status),
        "cooldown_until": status.cooldown_until.isoformat() if status.cooldown_until else None,
        "next_check_at": status.next_check_at.isoformat() if status.next_check_at else None,
        "failed_checks": status.failed_checks,
        "failing": [c.model_dump(exclude_none=True) for c in last.failed] if last else [],
        "waiting_for": status.waiting_for,
        "repeat_offender": bool(offense and offense.repeat),
        "incidents_in_window": offense.count if offense else None,
        "incidents": [o.incident_id or o.episode for o in offense.offenses] if offense else [],
    }


async def held(client: Client, cluster: str) -> list[dict[str, Any]]:
    query = (
        'WorkflowType = "NodeQuarantineWorkflow" AND ExecutionStatus = "Running" '
        f'AND TmCluster = "{cluster}"'
    )
    try:
        found = [w async for w in client.list_workflows(query)]
    except RPCError as error:
        raise Refused(f"listing quarantines: {error.message}") from None

    async def one(workflow_id: str) -> dict[str, Any]:
        handle = client.get_workflow_handle_for(NodeQuarantineWorkflow.run, workflow_id)
        try:
            status = await handle.query(NodeQuarantineWorkflow.status, rpc_timeout=QUERY_TIMEOUT)
        except RPCError as error:
            node = workflow_id.removeprefix(f"node-{cluster}-")
            return {
                "node": node,
                "cluster": cluster,
                "workflow_id": workflow_id,
                "state": "unknown",
                "next": f"(no worker answered the status query: {error.message})",
            }
        return _row(status, workflow_id)

    rows = await asyncio.gather(*(one(w.id) for w in found))
    # Visibility may lag a moment behind a quarantine that just ended: its own status
    # says so, and such a node is not held out any more.
    held_out = [r for r in rows if r["state"] not in ("resumed", "left_alone")]
    return sorted(held_out, key=lambda r: r["node"])


@app.callback()
def list_cmd(
    ctx: typer.Context,
    cluster: str | None = CLUSTER,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array of nodes."),
    address: str | None = ADDRESS,
) -> None:
    """The nodes trainmedic holds out: why, since when, and what happens next."""
    if ctx.invoked_subcommand is not None:
        return
    where = cluster or settings().cluster
    rows = _run(lambda client: held(client, where), address)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print(f"cluster {where}: trainmedic holds no node out")
        return
    table = Table(title=f"nodes held out on {where} ({len(rows)})")
    table.add_column("node", no_wrap=True)
    table.add_column("since", no_wrap=True)
    table.add_column("why", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("next", overflow="fold")
    for row in rows:
        incident = " ".join(x for x in (row.get("incident_id"), row.get("category")) if x)
        reason = row.get("reason") or ""
        table.add_row(
            row["node"],
            (row.get("since") or "")[:19].replace("T", " "),
            f"{incident}\n{reason}".strip() if incident else reason,
            row["state"],
            row["next"],
        )
    _print_table(table)


@app.command("release")
def release_cmd(
    node: str = typer.Argument(..., help="The node, e.g. gpu02."),
    cluster: str | None = CLUSTER,
    by: str = typer.Option(
        ..., "--by", help="Who releases it (recorded in the audit trail).", callback=_who
    ),
    comment: str = COMMENT,
    address: str | None = ADDRESS,
) -> None:
    """Let a held-out node go back (a repeat offender, or one whose health check keeps
    failing); resumed in Slurm only if trainmedic drained it."""
    try:
        validate_node_name(node)
    except HostlistError as error:
        raise typer.BadParameter(str(error), param_hint="NODE") from None
    where = cluster or settings().cluster
    payload = ReleasePayload(by=by, comment=comment)
    said = _run(lambda client: release(client, where, node, payload), address)
    console.print(said, markup=False, soft_wrap=True)
