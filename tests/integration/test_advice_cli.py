"""`trainmedic advice report` and `trainmedic mode promote` against the real dev server
and the Slurm lab: monitor-mode incidents, an operator's own hands in Slurm afterwards
(scontrol drain with their reason, scancel, scontrol requeue, or nothing), the report's
counts, and a promotion recorded on the ControlWorkflow."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from tests.integration.support import (
    TASK_QUEUE,
    job,
    result_of,
    start_control,
    start_incident,
    submit_running,
    unique_cluster,
    wait_for,
    xid79,
)
from tests.integration.test_status_cli import cli
from trainmedic.audit import records_from_history
from trainmedic.cli.main import app
from trainmedic.domain import Outcome
from trainmedic.domain.enums import Action, Mode
from trainmedic.lab import Lab
from trainmedic.temporal.devserver import DevServer
from trainmedic.workflows.control import STALE_READ, ControlWorkflow, control_workflow_id

pytestmark = pytest.mark.integration

# A low bar, so that one drain the operator agreed with out of five earns approve here.
MONITOR = (
    "version: it-advice\nmode: {default: monitor}\ndetect: {settle: 0s}\n"
    "promotion: {min_cases: 5, min_agreement: 0.2, window: 1d}\n"
)
OPS_REASON = "ops: GPU fell off the bus, RMA opened"


def one_line(err: str) -> bool:
    return err.count("\n") <= 1 and err.startswith("error: ")


async def test_advice_report_counts_what_operators_did_and_promote_records_it(
    clean_lab: Lab, temporal_client: Client, temporal_server: DevServer, controller: Worker
) -> None:
    address = ["--address", temporal_server.address]
    env = {
        "TRAINMEDIC_SLURM_CONF": str(clean_lab.slurm_conf),
        "TRAINMEDIC_TEMPORAL_TASK_QUEUE": TASK_QUEUE,
    }
    cluster = unique_cluster("adv")
    await start_control(temporal_client, cluster, MONITOR)

    # Five jobs, all running before anyone touches a node: two on gpu01+gpu02, three
    # on gpu03+gpu04 (jobs share nodes: one core each).
    left, right = ("-x", "gpu03,gpu04"), ("-x", "gpu01,gpu02")
    scripted: dict[str, tuple[tuple[str, str], int]] = {
        "drained_advised": (left, 0),  # Xid on gpu01, the operator drains gpu01
        "drained_other": (left, 1),  # Xid on gpu02; gpu01 (drained above) is its other node
        "nothing": (right, 0),
        "cancelled": (right, 1),
        "requeued": (right, 0),
    }
    jobs: dict[str, tuple[str, list[str], str]] = {}
    for choice, (where, blamed) in scripted.items():
        job_id, placed = submit_running(clean_lab, 2, *where)
        jobs[choice] = (job_id, placed, placed[blamed])
    incidents: dict[str, str] = {}
    for choice, (job_id, _, culprit) in jobs.items():
        incidents[choice] = await start_incident(temporal_client, cluster, job_id, xid79(culprit))
    for choice, incident in incidents.items():
        result = await result_of(temporal_client, incident)
        assert result.outcome is Outcome.RECOMMENDED, (choice, result.summary)

    # The operator, by hand, in Slurm.
    drained = jobs["drained_advised"][2]
    clean_lab.run_client(
        ["scontrol", "update", f"nodename={drained}", "state=drain", f"reason={OPS_REASON}"]
    )
    clean_lab.run_client(["scancel", jobs["cancelled"][0]])
    clean_lab.run_client(["scontrol", "requeue", jobs["requeued"][0]])
    # Slurm shows a cancelled job COMPLETING until its processes are gone: the report
    # reads Slurm as it is, so wait until the cancel is what Slurm says.
    await asyncio.to_thread(
        wait_for,
        lambda: job(clean_lab, jobs["cancelled"][0]).get("JobState") == "CANCELLED" or None,
        "the cancelled job to settle",
        60,
    )
    assert drained != jobs["drained_other"][2]

    text_args = ["advice", "report", "--cluster", cluster, *address]
    report_args = [*text_args, "--json"]

    def report_now() -> dict[str, Any] | None:
        from typer.testing import CliRunner

        done = CliRunner().invoke(app, report_args, env=env)
        assert done.exit_code == 0, done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        # Visibility may lag a second behind the last close.
        return report if len(report["cases"]) == len(incidents) else None

    report = await asyncio.to_thread(wait_for, report_now, "five cases in the advice report", 30)
    follow_ups = {j["case"]["incident_id"]: j for j in report["cases"]}
    for choice, incident in incidents.items():
        judged = follow_ups[incident]
        assert judged["follow_up"] == choice, (choice, judged["detail"])
        assert judged["case"]["mode"] == "monitor"
        assert judged["agree"] is (choice == "drained_advised"), choice
    assert OPS_REASON in follow_ups[incidents["drained_advised"]]["detail"]
    row = report["by_action"]["drain_and_restart"]
    assert (row["cases"], row["monitor"], row["approve"]) == (5, 5, 0)
    assert row["follow_ups"] == dict.fromkeys(scripted, 1)
    assert (row["agree"], row["judged"], row["agreement"]) == (1, 5, 0.2)
    assert report["by_rule"]["kernel.xid_79"]["cases"] == 5
    assert report["by_category"]["gpu_hardware"]["agree"] == 1
    assert report["slurm_problem"] is None and "as it is now" in report["limitation"]
    verdict = next(p for p in report["promotions"] if p["action"] == "drain_and_restart")
    assert (verdict["current"], verdict["earned"], verdict["promote_to"]) == (
        "monitor",
        "approve",
        "approve",
    )

    code, out, err = await cli(app, text_args, env)
    assert code == 0, err
    assert "drain_and_restart (now monitor): earned approve" in out
    assert "as it is now" in out

    # Not earned: auto needs approvals in approve mode. Refused, with the figures.
    promote = ["mode", "promote", "drain_and_restart", "--cluster", cluster, *address]
    code, _, err = await cli(app, [*promote, "--to", "auto", "--by", "alice"], env)
    assert code == 2 and one_line(err), err
    assert "has not earned auto" in err and "0 decisions in approve mode (needs 5)" in err

    code, out, err = await cli(
        app,
        [*promote, "--to", "approve", "--by", "alice", "--reason", "week 1 review", "--json"],
        env,
    )
    assert code == 0, err
    said = json.loads(out)
    assert said["forced"] is False and said["cluster_mode"] == "approve"
    assert said["policy_version"] == "it-advice+drain_and_restart=approve"
    handle = temporal_client.get_workflow_handle_for(
        ControlWorkflow.run, control_workflow_id(cluster)
    )
    state = await handle.query(ControlWorkflow.current)
    assert state.mode is Mode.APPROVE
    assert state.policy.mode.actions == {
        Action.DRAIN_AND_RESTART: Mode.APPROVE,
        Action.RESTART: Mode.MONITOR,
        Action.RESTART_EXCLUDING: Mode.MONITOR,
        Action.STOP: Mode.MONITOR,
    }
    last = state.changes[-1]
    assert last.by == "alice" and last.policy_version == said["policy_version"]
    assert last.reason.startswith("promote drain_and_restart to approve: 5 cases judged")
    assert "week 1 review" in last.reason and "forced" not in last.reason
    # The audit trail reads it back from the ControlWorkflow's history.
    changes = [
        r for r in records_from_history(await handle.fetch_history()) if r.kind == "policy_change"
    ]
    assert changes[-1].who == "alice" and changes[-1].status == "applied"
    assert "it-advice+drain_and_restart=approve" in changes[-1].detail

    # Already there: refused. Forced to auto: done, and the record says it was forced.
    code, _, err = await cli(app, [*promote, "--to", "approve", "--by", "alice"], env)
    assert code == 2 and "already runs in approve" in err
    code, out, err = await cli(app, [*promote, "--to", "auto", "--by", "bob", "--force"], env)
    assert code == 0, err
    assert "drain_and_restart -> auto (by bob)" in out and "policy file" in out
    state = await handle.query(ControlWorkflow.current)
    assert state.policy.mode.actions[Action.DRAIN_AND_RESTART] is Mode.AUTO
    assert state.changes[-1].by == "bob" and "forced" in state.changes[-1].reason


async def test_advice_errors_are_one_line_and_exit_2(
    temporal_client: Client, temporal_server: DevServer, controller: Worker
) -> None:
    address = ["--address", temporal_server.address]
    promote_stop = ["mode", "promote", "stop", "--to", "auto", "--by", "x"]
    cases = [
        (["mode", "promote", "reboot", "--to", "approve", "--by", "x", *address], "unknown action"),
        (["mode", "promote", "wait", "--to", "auto", "--by", "x", *address], "no effect to gate"),
        (["mode", "promote", "stop", "--to", "monitor", "--by", "x", *address], "--to"),
        (["mode", "promote", "stop", "--to", "auto", "--by", " ", *address], "--by"),
        (["advice", "report", "--since", "soon", *address], "--since"),
        (["advice", "report", "--cluster", "nosuch", *address], "has no control workflow"),
        ([*promote_stop, "--cluster", "nosuch", *address], "has no control workflow"),
        (["advice", "report", "--address", "127.0.0.1:1"], "cannot reach Temporal at 127.0.0.1:1"),
        ([*promote_stop, "--address", "127.0.0.1:1"], "cannot reach Temporal"),
    ]
    for args, why in cases:
        code, out, err = await cli(app, args)
        assert code == 2, (args, out, err)
        assert one_line(err) and why in err, (args, err)


async def test_a_policy_change_from_a_stale_read_is_refused(
    temporal_client: Client, controller: Worker
) -> None:
    from temporalio.client import WorkflowUpdateFailedError

    from trainmedic.advice import promoted_policy
    from trainmedic.domain.control import SetModeRequest, SetPolicyRequest

    cluster = unique_cluster("stale")
    policy = await start_control(temporal_client, cluster, MONITOR)
    handle = temporal_client.get_workflow_handle_for(
        ControlWorkflow.run, control_workflow_id(cluster)
    )
    # Two operators read the same policy and promote different kinds.
    read = (await handle.query(ControlWorkflow.current)).autonomy()
    alices, _ = promoted_policy(policy, Mode.MONITOR, Action.RESTART, Mode.APPROVE)
    bobs, _ = promoted_policy(policy, Mode.MONITOR, Action.STOP, Mode.APPROVE)
    await handle.execute_update(
        ControlWorkflow.set_policy,
        SetPolicyRequest(policy=alices, by="alice", reason="earned", expected=read),
    )
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            ControlWorkflow.set_policy,
            SetPolicyRequest(policy=bobs, by="bob", reason="earned", expected=read),
        )
    assert "changed after they were read" in str(refused.value.cause)
    # The type the controller's start looks for before it reads again (sync_policy).
    assert isinstance(refused.value.cause, ApplicationError)
    assert refused.value.cause.type == STALE_READ
    kept = await handle.query(ControlWorkflow.current)
    assert kept.policy == alices  # bob's write did not undo alice's promotion
    assert [c.by for c in kept.changes][-1] == "alice"

    # A mode change between reading and writing refuses the write too: a promotion
    # computed from the old mode would pin the other kinds to it.
    read = kept.autonomy()
    other = Mode.APPROVE if kept.mode is Mode.MONITOR else Mode.MONITOR
    await handle.execute_update(
        ControlWorkflow.set_mode, SetModeRequest(mode=other, by="carol", reason="drill")
    )
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            ControlWorkflow.set_policy,
            SetPolicyRequest(policy=bobs, by="bob", reason="earned", expected=read),
        )
    said = str(refused.value.cause)
    assert f"read policy {alices.version}, mode {kept.mode.value}" in said
    assert f"now policy {alices.version}, mode {other.value}" in said


async def test_a_controller_restart_keeps_a_promotion_and_a_new_file_replaces_it(
    temporal_client: Client, controller: Worker, controller_settings: Any
) -> None:
    from trainmedic.advice import promoted_policy
    from trainmedic.config import parse_policy
    from trainmedic.domain.control import SetPolicyRequest
    from trainmedic.workers.controller import sync_policy

    cluster = unique_cluster("keep")
    settings = controller_settings.model_copy(update={"cluster": cluster})
    policy = await start_control(temporal_client, cluster, MONITOR)
    handle = temporal_client.get_workflow_handle_for(
        ControlWorkflow.run, control_workflow_id(cluster)
    )
    promoted, _ = promoted_policy(policy, Mode.MONITOR, Action.DRAIN_AND_RESTART, Mode.APPROVE)
    await handle.execute_update(
        ControlWorkflow.set_policy, SetPolicyRequest(policy=promoted, by="alice", reason="earned")
    )
    await sync_policy(temporal_client, settings, policy)  # the controller restarts
    kept = await handle.query(ControlWorkflow.current)
    assert kept.policy.version == "it-advice+drain_and_restart=approve"
    assert kept.policy.mode.actions[Action.DRAIN_AND_RESTART] is Mode.APPROVE

    newer = parse_policy(MONITOR.replace("it-advice", "it-advice-2"))
    await sync_policy(temporal_client, settings, newer)
    replaced = await handle.query(ControlWorkflow.current)
    assert replaced.policy.version == "it-advice-2"
