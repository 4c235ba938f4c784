"""`trainmedic advice report` and `trainmedic mode promote`: from monitor to auto.

The report reads the cluster's closed incidents of the window from Temporal (visibility,
then each one's history: its result and the job as gathered when it failed), reads
Slurm once (the job list and the node list, through the SlurmBackend the controller
uses), and hands both to trainmedic.advice, which judges each recommendation and counts.
The bar and the cluster's modes come from the live ControlWorkflow.

`promote` lives in a `mode` group rather than under `advice`: it changes the cluster's
autonomy, like `trainmedic incidents mode`, and the group is where further mode verbs
belong; its check of the figures is the report's own code. It goes through the
ControlWorkflow's validated `set_policy` update, so the change is in that workflow's
history with who and why.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from rich.table import Table
from rich.text import Text
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from trainmedic.advice import (
    AUTONOMY,
    PROMOTABLE,
    AdviceReport,
    Case,
    FollowUp,
    Promotion,
    SlurmView,
    build_report,
    case_from_history,
    promoted_policy,
)
from trainmedic.cli.common import console, err_console, settings
from trainmedic.cli.incidents import ADDRESS, Refused, _print_table, _run, _update_problem
from trainmedic.config import PositiveDuration
from trainmedic.domain.control import ControlState, SetPolicyRequest
from trainmedic.domain.enums import Action, Mode
from trainmedic.errors import TrainmedicError

app = typer.Typer(
    help="Advice review: how often trainmedic's advice matched what operators did, and "
    "which action kinds have earned more autonomy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
mode_app = typer.Typer(
    help="The cluster's autonomy per action kind (the cluster's own mode: "
    "`trainmedic incidents mode`).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Closed incidents read per report; beyond it the newest are read, and the report says so.
MAX_INCIDENTS = 2000
HISTORY_READS = 8  # histories fetched at once
CLUSTER = typer.Option(None, "--cluster", help="Default: TRAINMEDIC_CLUSTER.")
SINCE = typer.Option(
    None, "--since", help="Window, e.g. 7d, 24h (default: the policy's promotion.window)."
)


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="advice")
    main.add_typer(mode_app, name="mode")


def _fail(message: str) -> typer.Exit:
    """One line on stderr and exit status 2, like the other commands' refusals."""
    err_console.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    return typer.Exit(2)


def _window(since: str | None) -> timedelta | None:
    if since is None:
        return None
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(PositiveDuration).validate_python(since)
    except ValidationError as error:
        raise _fail(f"--since: {error.errors()[0]['msg'].removeprefix('Value error, ')}") from None


# --------------------------------------------------------------------------- reading


async def _control(client: Client, cluster: str) -> ControlState:
    from trainmedic.cli.status import _control as control_state

    return await control_state(client, cluster)


async def _cases(client: Client, cluster: str, since: datetime) -> tuple[list[Case], int, int]:
    """The recommendations among the cluster's incidents closed since `since`; also how
    many incidents were listed and how many histories could not be read."""
    stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    query = (
        f'WorkflowType = "RecoveryWorkflow" AND TmCluster = "{cluster}" '
        f'AND ExecutionStatus = "Completed" AND CloseTime > "{stamp}"'
    )
    try:
        listed = [w async for w in client.list_workflows(query, limit=MAX_INCIDENTS)]
    except RPCError as error:
        raise Refused(f"listing incidents: {error.message}") from None
    gate = asyncio.Semaphore(HISTORY_READS)
    unreadable = 0

    async def one(workflow_id: str, run_id: str | None) -> Case | None:
        nonlocal unreadable
        async with gate:
            try:
                history = await client.get_workflow_handle(
                    workflow_id, run_id=run_id
                ).fetch_history()
            except RPCError:
                unreadable += 1
                return None
        return case_from_history(history)

    found = await asyncio.gather(*(one(w.id, w.run_id) for w in listed))
    cases = sorted((c for c in found if c is not None), key=lambda c: c.incident_id)
    return cases, len(listed), unreadable


async def _slurm_view() -> SlurmView:
    """Slurm now: every job it still knows and every node, read once."""
    from trainmedic.workers.controller import slurm_backend

    try:
        backend = slurm_backend(settings())
        jobs = await backend.list_jobs()
        nodes = await backend.list_nodes()
    except TrainmedicError as error:
        return SlurmView(problem=str(error), read_at=datetime.now(UTC))
    return SlurmView(jobs=jobs, nodes=nodes, read_at=datetime.now(UTC))


async def gather_report(
    client: Client, cluster: str, window: timedelta | None, slurm: SlurmView | None = None
) -> tuple[AdviceReport, ControlState]:
    control = await _control(client, cluster)
    now = datetime.now(UTC)
    since = now - (window or control.policy.promotion.window)
    cases, listed, unreadable = await _cases(client, cluster, since)
    view = slurm
    if view is None:
        # Slurm is read only when a monitor-mode case needs it.
        view = await _slurm_view() if any(c.mode is Mode.MONITOR for c in cases) else SlurmView()
    report = build_report(cluster, since, now, control.policy, control.mode, cases, view)
    report.incidents_listed = listed
    report.incidents_read = listed - unreadable
    report.incidents_unreadable = unreadable
    return report, control


# --------------------------------------------------------------------------- report


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _follow_ups(counts: dict[str, int]) -> str:
    order = [f.value for f in FollowUp]
    return ", ".join(f"{k} {counts[k]}" for k in order if counts.get(k))


def _tally_table(title: str, key: str, rows: dict[str, dict[str, Any]]) -> Table:
    table = Table(title=title)
    table.add_column(key, no_wrap=True)
    for column in ("cases", "monitor", "approve", "agree/judged", "agreement"):
        table.add_column(column, justify="right")
    table.add_column("what happened next", overflow="fold")
    for name, t in rows.items():
        table.add_row(
            name,
            str(t["cases"]),
            str(t["monitor"]),
            str(t["approve"]),
            f"{t['agree']}/{t['judged']}",
            _pct(t["agreement"]),
            _follow_ups(t["follow_ups"]),
        )
    return table


def _print_promotions(report: AdviceReport) -> None:
    bar = report.bar
    console.print(
        f"promotion bar (policy {report.policy_version}): at least {bar.min_cases} cases, "
        f"{bar.min_agreement:.0%} agreement"
        + ("; auto needs approvals in approve mode" if bar.auto_requires_approvals else ""),
        markup=False,
        soft_wrap=True,
    )
    for p in report.promotions:
        if p.promote_to is not None:
            verdict = (
                f"earned {p.promote_to.value}: trainmedic mode promote {p.action.value} "
                f"--to {p.promote_to.value} --cluster {report.cluster} --by <you>"
            )
        else:
            nxt = Mode.AUTO if p.current is Mode.APPROVE else Mode.APPROVE
            if p.current is Mode.AUTO:
                verdict = "runs in auto"
            else:
                verdict = f"not yet {nxt.value}: {p.bar(nxt).why}"
        console.print(
            f"  {p.action.value} (now {p.current.value}): {verdict}", markup=False, soft_wrap=True
        )


def _print_report(report: AdviceReport) -> None:
    days = (report.generated_at - report.since).total_seconds() / 86400
    console.print(
        f"[bold]{report.cluster}[/]: advice of the last {days:g}d "
        f"({len(report.cases)} recommendations in {report.incidents_read} incidents closed; "
        f"cluster mode {report.cluster_mode.value})",
        soft_wrap=True,
    )
    if report.incidents_unreadable:
        console.print(f"  {report.incidents_unreadable} incident histories could not be read")
    if report.incidents_listed >= MAX_INCIDENTS:
        console.print(f"  only the newest {MAX_INCIDENTS} incidents were read")
    if report.slurm_problem:
        console.print(
            f"[yellow]Slurm could not be read[/]: {report.slurm_problem}; monitor-mode "
            "follow-ups are unknown",
            soft_wrap=True,
        )
    if report.cases:
        _print_table(_tally_table("by action kind", "action", report.by_action))
        _print_table(_tally_table("by category", "category", report.by_category))
        _print_table(_tally_table("by rule", "rule", report.by_rule))
        cases = Table(title="recommendations")
        for column in ("incident", "mode", "advice", "next", "agree", "seen"):
            cases.add_column(column, no_wrap=column == "incident", overflow="fold")
        for j in report.cases:
            agree = "-" if j.agree is None else ("yes" if j.agree else "no")
            cases.add_row(
                j.case.incident_id,
                j.case.mode.value,
                "; ".join(j.case.advice),
                j.follow_up.value,
                agree,
                j.detail,
            )
        _print_table(cases)
    else:
        console.print("no recommendations in the window")
    _print_promotions(report)
    console.print(f"note: {report.limitation}", markup=False, soft_wrap=True)


@app.command("report")
def report_cmd(
    cluster: str | None = CLUSTER,
    since: str | None = SINCE,
    as_json: bool = typer.Option(False, "--json", help="One JSON object."),
    address: str | None = ADDRESS,
) -> None:
    """For each action kind, category and rule: recommendations made in monitor and
    approve mode, what happened next (approved, rejected, or what an operator did by
    hand as Slurm shows it now), the agreement rate, and which kinds have earned
    promotion under the policy's bar (`promotion:`)."""
    window = _window(since)
    where = cluster or settings().cluster
    report, _ = _run(lambda client: gather_report(client, where, window), address)
    if as_json:
        print(json.dumps(report.model_dump(mode="json"), sort_keys=True))
        return
    _print_report(report)


# --------------------------------------------------------------------------- promote


def _kind(value: str) -> Action:
    known = [a.value for a in PROMOTABLE]
    if value not in known:
        why = " (it has no effect to gate)" if value in (Action.WAIT, Action.ESCALATE) else ""
        raise _fail(f"unknown action kind {value!r}{why}; one of: {', '.join(known)}")
    return Action(value)


def _target(value: str) -> Mode:
    if value not in (Mode.APPROVE.value, Mode.AUTO.value):
        raise _fail(f"--to {value!r}: promote to approve or auto")
    return Mode(value)


async def promote(
    client: Client,
    cluster: str,
    action: Action,
    to: Mode,
    by: str,
    reason: str,
    force: bool,
    window: timedelta | None,
) -> tuple[ControlState, Promotion, list[str], bool]:
    """Apply the promotion; returns the new state, the figures, what changed in the
    policy, and whether it was forced (the figures did not meet the bar)."""
    from trainmedic.workflows.control import ControlWorkflow, control_workflow_id

    report, control = await gather_report(client, cluster, window)
    figures = next(p for p in report.promotions if p.action is action)
    if AUTONOMY[figures.current] >= AUTONOMY[to]:
        raise Refused(
            f"{action.value} already runs in {figures.current.value} on {cluster}; "
            "promote only raises autonomy"
        )
    if control.breaker_tripped_at is not None:
        raise Refused(
            f"the breaker of {cluster} is open ({control.breaker_reason}); re-arm the cluster "
            "with `trainmedic incidents mode` first"
        )
    if control.mode is Mode.MONITOR and control.policy.mode.default is not Mode.MONITOR:
        last = control.changes[-1] if control.changes else None
        said = f" by {last.by}: {last.reason}" if last else ""
        raise Refused(
            f"{cluster} is held in monitor{said}; that holds every kind in monitor: set its "
            "mode with `trainmedic incidents mode` first"
        )
    days = (report.generated_at - report.since).total_seconds() / 86400
    bar = figures.bar(to)
    earned = AUTONOMY[figures.earned] >= AUTONOMY[to]
    if not earned and not force:
        raise Refused(
            f"{action.value} has not earned {to.value} on {cluster} (last {days:g}d): "
            f"{bar.why}; --force promotes anyway (recorded)"
        )
    policy, changes = promoted_policy(control.policy, control.mode, action, to)
    said = f"promote {action.value} to {to.value}: {bar.why} (last {days:g}d)"
    if not earned:
        said += "; forced: the bar was not met"
    if reason:
        said += f"; {reason}"
    workflow_id = control_workflow_id(cluster)
    handle = client.get_workflow_handle_for(ControlWorkflow.run, workflow_id)
    try:
        state = await handle.execute_update(
            ControlWorkflow.set_policy,
            SetPolicyRequest(policy=policy, by=by, reason=said, expected=control.autonomy()),
        )
    except (WorkflowUpdateFailedError, RPCError) as error:
        raise _update_problem(
            error, workflow_id, f"cluster {cluster!r} has no control workflow"
        ) from None
    return state, figures, changes, not earned


def _name(value: str) -> str:
    if not value.strip():
        raise _fail("--by: say who you are; it is recorded in the audit trail")
    return value.strip()


@mode_app.command("promote")
def promote_cmd(
    kind: str = typer.Argument(..., help="restart, restart_excluding, drain_and_restart or stop."),
    to: str = typer.Option(..., "--to", help="approve or auto."),
    by: str = typer.Option(..., "--by", help="Who promotes it (recorded)."),
    reason: str = typer.Option("", "--reason", help="Why (recorded)."),
    force: bool = typer.Option(
        False, "--force", help="Promote although the figures do not meet the bar (recorded)."
    ),
    cluster: str | None = CLUSTER,
    since: str | None = SINCE,
    as_json: bool = typer.Option(False, "--json", help="One JSON object."),
    address: str | None = ADDRESS,
) -> None:
    """Raise one action kind's mode on the cluster's ControlWorkflow (its policy's
    mode.actions) when its advice figures meet the policy's bar, or with --force.

    Live at once; put it in the policy file too (a controller start reapplies the file)."""
    action, target, who = _kind(kind), _target(to), _name(by)
    window = _window(since)
    where = cluster or settings().cluster
    state, figures, changes, forced = _run(
        lambda client: promote(client, where, action, target, who, reason, force, window),
        address,
    )
    if as_json:
        out = {
            "cluster": where,
            "action": action.value,
            "to": target.value,
            "by": who,
            "forced": forced,
            "figures": figures.bar(target).model_dump(mode="json"),
            "changes": changes,
            "policy_version": state.policy.version,
            "cluster_mode": state.mode.value,
        }
        print(json.dumps(out, sort_keys=True))
        return
    console.print(
        f"{where}: {action.value} -> {target.value} (by {who}); policy {state.policy.version}, "
        f"cluster mode {state.mode.value}",
        markup=False,
        soft_wrap=True,
    )
    for change in changes:
        console.print(f"  {change}", markup=False, soft_wrap=True)
    modes = state.policy.mode
    lines = [f"  default: {modes.default.value}", "  actions:"] + [
        f"    {k.value}: {v.value}" for k, v in modes.actions.items()
    ]
    if modes.partitions:
        lines += ["  partitions:"] + [f"    {k}: {v.value}" for k, v in modes.partitions.items()]
    console.print(
        "live now; the controller's next start reapplies the policy file, so put this "
        "there too:\nmode:\n" + "\n".join(lines),
        markup=False,
        soft_wrap=True,
    )
