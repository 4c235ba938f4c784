"""Advice review (trainmedic.advice): scripted series of recommendations with scripted
operator choices give the right follow-ups, agreement figures and promotion verdicts.
Pure: no Temporal, no Slurm (Slurm's present state is a SlurmView built here)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from trainmedic.advice import (
    Case,
    FollowUp,
    SlurmView,
    aggregate,
    build_report,
    case_from_history,
    case_from_result,
    decide_promotions,
    judge,
    out_by_a_person,
    promoted_policy,
)
from trainmedic.config import Policy, parse_policy
from trainmedic.domain.diagnosis import Diagnosis
from trainmedic.domain.enums import Action, Category, Mode, Outcome
from trainmedic.domain.incident import (
    Decision,
    EffectKind,
    EffectStatus,
    IncidentResult,
    PlannedEffect,
)
from trainmedic.domain.slurm import SlurmJob, SlurmNode
from trainmedic.errors import ConfigError

HISTORIES = Path(__file__).parent.parent / "replay" / "histories"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BAR = "promotion: {min_cases: 20, min_agreement: 0.95}\n"


# ------------------------------------------------------------------ scripted incidents


def result(
    n: int,
    action: Action = Action.DRAIN_AND_RESTART,
    mode: Mode = Mode.MONITOR,
    decisions: list[Decision] | None = None,
    category: Category = Category.GPU_HARDWARE,
    rules: tuple[str, ...] = ("kernel.xid_79",),
) -> IncidentResult:
    """What RecoveryWorkflow returns for job <n> on nodes a<n>, b<n>, blaming a<n>."""
    job, culprit = str(100 + n), f"a{n}"
    status = EffectStatus.WOULD_APPLY if mode is Mode.MONITOR else EffectStatus.APPLIED
    effects: list[PlannedEffect] = []
    if action is Action.DRAIN_AND_RESTART:
        effects.append(
            PlannedEffect(
                id=f"drain-{culprit}",
                kind=EffectKind.DRAIN_NODE,
                node=culprit,
                reason="trainmedic ...",
                mode=mode,
                status=status,
            )
        )
    kind = {
        Action.DRAIN_AND_RESTART: EffectKind.REQUEUE_EXCLUDING,
        Action.RESTART_EXCLUDING: EffectKind.REQUEUE_EXCLUDING,
        Action.RESTART: EffectKind.REQUEUE_JOB,
        Action.STOP: EffectKind.CANCEL_JOB,
    }[action]
    effects.append(
        PlannedEffect(
            id=f"job-{job}",
            kind=kind,
            job_id=job,
            exclude=[culprit] if kind is EffectKind.REQUEUE_EXCLUDING else [],
            seen_restarts=0,
            reason="trainmedic ...",
            mode=mode,
            status=status,
        )
    )
    return IncidentResult(
        incident_id=f"incident-c-{job}-1",
        outcome=Outcome.RECOMMENDED if mode is Mode.MONITOR else Outcome.RECOVERED,
        summary="",
        diagnosis=Diagnosis(
            category=category,
            action=action,
            culprit_nodes=[culprit],
            confidence=0.9,
            rule_ids=list(rules),
            catalog_version="t",
        ),
        effects=effects,
        decisions=decisions or [],
    )


def gathered(n: int, **changes: object) -> SlurmJob:
    """The job as gather_evidence saw it when it failed."""
    job = SlurmJob(
        job_id=str(100 + n),
        name=f"train-{n}",
        user="u",
        state="RUNNING",
        nodes=[f"a{n}", f"b{n}"],
        restarts=0,
    )
    return job.model_copy(update=changes)


def node(name: str, reason: str | None = None, state: str = "MIXED") -> SlurmNode:
    flags = ["DRAIN"] if reason else []
    return SlurmNode(name=name, state=state, state_flags=flags, reason=reason, reason_user="root")


def monitor_case(n: int, action: Action = Action.DRAIN_AND_RESTART) -> Case:
    case = case_from_result(result(n, action), gathered(n))
    assert case is not None
    return case


def operator(choice: str, n: int, view: SlurmView) -> None:
    """Script what the operator did about case n, as Slurm would show it afterwards."""
    a, b = f"a{n}", f"b{n}"
    job = gathered(n)
    nodes = {a: node(a), b: node(b)}
    match choice:
        case "drain_advised":
            nodes[a] = node(a, "ops: GPU fell off the bus (RMA 1234)")
        case "drain_other":
            nodes[b] = node(b, "ops: flaky IB port")
        case "cancel":
            job = job.model_copy(update={"state": "CANCELLED"})
        case "requeue":
            job = job.model_copy(update={"state": "PENDING", "restarts": 1})
        case "resubmit":
            job = job.model_copy(update={"state": "FAILED"})
            view.jobs.append(gathered(n, job_id=str(900 + n), state="RUNNING"))
        case "nothing":
            pass
        case "purged":
            view.nodes.extend(nodes.values())
            return
    view.jobs.append(job)
    view.nodes.extend(nodes.values())


def series(
    choices: list[str], action: Action = Action.DRAIN_AND_RESTART
) -> tuple[list[Case], SlurmView]:
    view = SlurmView(read_at=NOW)
    cases = []
    for n, choice in enumerate(choices):
        cases.append(monitor_case(n, action))
        operator(choice, n, view)
    return cases, view


def approve_case(n: int, approve: bool | None, by: str = "alice") -> Case:
    if approve is None:
        decision = Decision(action="all", approve=False, by="trainmedic:timeout", via="timeout")
    else:
        decision = Decision(action="all", approve=approve, by=by, via="update")
    case = case_from_result(result(n, mode=Mode.APPROVE, decisions=[decision]), gathered(n))
    assert case is not None
    return case


# ------------------------------------------------------------------ the scripted series


def test_25_monitor_recommendations_with_scripted_operator_choices() -> None:
    choices = ["drain_advised"] * 24 + ["nothing"]
    cases, view = series(choices)
    policy = parse_policy(BAR)
    report = build_report("c", NOW - timedelta(days=7), NOW, policy, Mode.MONITOR, cases, view)

    row = report.by_action["drain_and_restart"]
    assert (row["cases"], row["monitor"], row["approve"]) == (25, 25, 0)
    assert row["follow_ups"] == {"drained_advised": 24, "nothing": 1}
    assert (row["agree"], row["judged"], row["agreement"]) == (24, 25, 0.96)
    assert report.by_category["gpu_hardware"]["agree"] == 24
    assert report.by_rule["kernel.xid_79"]["judged"] == 25

    verdicts = {p.action: p for p in report.promotions}
    drain = verdicts[Action.DRAIN_AND_RESTART]
    assert drain.current is Mode.MONITOR
    assert drain.earned is Mode.APPROVE and drain.promote_to is Mode.APPROVE
    # auto is earned by approvals in approve mode: monitor mode's agreement is not enough.
    assert not drain.bar(Mode.AUTO).met
    assert "0 decisions in approve mode (needs 20)" in drain.bar(Mode.AUTO).why
    # Kinds never advised earned nothing.
    assert verdicts[Action.RESTART].promote_to is None
    assert verdicts[Action.RESTART].bar(Mode.APPROVE).cases == 0

    nothing = next(j for j in report.cases if j.follow_up is FollowUp.NOTHING)
    assert nothing.agree is False and "nothing visible (job 124 RUNNING)" in nothing.detail
    drained = report.cases[0]
    assert drained.follow_up is FollowUp.DRAINED_ADVISED and drained.agree is True
    assert "a0 MIXED+DRAIN ('ops: GPU fell off the bus (RMA 1234)' by root)" in drained.detail


def test_a_mixed_series_falls_under_the_bar_and_counts_each_choice() -> None:
    choices = ["drain_advised"] * 20 + [
        "drain_other",
        "cancel",
        "requeue",
        "resubmit",
        "nothing",
        "purged",
    ]
    cases, view = series(choices)
    report = build_report(
        "c", NOW - timedelta(days=7), NOW, parse_policy(BAR), Mode.MONITOR, cases, view
    )
    row = report.by_action["drain_and_restart"]
    assert row["follow_ups"] == {
        "drained_advised": 20,
        "drained_other": 1,
        "cancelled": 1,
        "requeued": 1,
        "resubmitted": 1,
        "nothing": 1,
        "unknown": 1,  # job purged, no node out: cannot be told, not judged
    }
    assert (row["cases"], row["judged"], row["agree"]) == (26, 25, 20)
    assert row["agreement"] == 0.8
    drain = next(p for p in report.promotions if p.action is Action.DRAIN_AND_RESTART)
    assert drain.earned is Mode.MONITOR and drain.promote_to is None
    assert drain.bar(Mode.APPROVE).why == (
        "25 cases judged (needs 20), agreement 80% (20/25; needs 95%)"
    )


def test_too_few_cases_are_not_promoted_however_good() -> None:
    cases, view = series(["drain_advised"] * 10)
    [drain] = [
        p
        for p in decide_promotions(
            aggregate(judge(c, view) for c in cases)[0], parse_policy(BAR), Mode.MONITOR
        )
        if p.action is Action.DRAIN_AND_RESTART
    ]
    assert drain.bar(Mode.APPROVE).agreement == 1.0
    assert not drain.bar(Mode.APPROVE).met and drain.promote_to is None
    assert drain.bar(Mode.APPROVE).why.startswith("10 cases judged (needs 20)")


def test_approve_mode_decisions_earn_auto() -> None:
    monitor, view = series(["drain_advised"] * 5)
    approvals = [approve_case(100 + i, True) for i in range(20)]
    rejected = [approve_case(200, False, by="bob")]
    timed_out = [approve_case(300 + i, None) for i in range(3)]
    policy = parse_policy(BAR)
    report = build_report(
        "c",
        NOW - timedelta(days=7),
        NOW,
        policy,
        Mode.APPROVE,
        monitor + approvals + rejected + timed_out,
        view,
    )
    row = report.by_action["drain_and_restart"]
    assert row["follow_ups"] == {
        "approved": 20,
        "rejected": 1,
        "no_decision": 3,
        "drained_advised": 5,
    }
    assert (row["monitor"], row["approve"]) == (5, 24)
    # A timeout is nobody's judgement: 25 + 1 judged, not 29.
    assert (row["judged"], row["agree"]) == (26, 25)
    assert (row["approve_judged"], row["approve_agree"]) == (21, 20)
    assert row["approve_agreement"] == round(20 / 21, 4)
    drain = next(p for p in report.promotions if p.action is Action.DRAIN_AND_RESTART)
    assert drain.current is Mode.APPROVE  # the cluster's mode, no override
    assert drain.bar(Mode.AUTO).met and drain.earned is Mode.AUTO
    assert drain.promote_to is Mode.AUTO
    rej = next(j for j in report.cases if j.follow_up is FollowUp.REJECTED)
    assert rej.agree is False and rej.detail == "by bob"

    # One more rejection and auto is out of reach (20/22 < 95%).
    more = [*approvals, *rejected, approve_case(201, False, by="bob")]
    tallies = aggregate(judge(c, view) for c in more)[0]
    drain = next(
        p
        for p in decide_promotions(tallies, policy, Mode.APPROVE)
        if p.action is Action.DRAIN_AND_RESTART
    )
    assert not drain.bar(Mode.AUTO).met and drain.promote_to is None


def test_auto_from_monitor_figures_when_the_policy_allows_it() -> None:
    cases, view = series(["drain_advised"] * 20)
    policy = parse_policy(
        "promotion: {min_cases: 20, min_agreement: 0.95, auto_requires_approvals: false}\n"
    )
    tallies = aggregate(judge(c, view) for c in cases)[0]
    drain = next(
        p
        for p in decide_promotions(tallies, policy, Mode.MONITOR)
        if p.action is Action.DRAIN_AND_RESTART
    )
    assert drain.earned is Mode.AUTO and drain.promote_to is Mode.AUTO


# ------------------------------------------------------------------ classification rules


@pytest.mark.parametrize(
    ("action", "choice", "follow_up", "agree"),
    [
        (Action.RESTART, "requeue", FollowUp.REQUEUED, True),
        (Action.RESTART, "resubmit", FollowUp.RESUBMITTED, True),
        (Action.RESTART, "nothing", FollowUp.NOTHING, False),
        (Action.RESTART, "drain_other", FollowUp.DRAINED_OTHER, False),
        (Action.RESTART_EXCLUDING, "requeue", FollowUp.REQUEUED, True),
        (Action.RESTART_EXCLUDING, "cancel", FollowUp.CANCELLED, False),
        (Action.STOP, "cancel", FollowUp.CANCELLED, True),
        (Action.STOP, "requeue", FollowUp.REQUEUED, False),
        (Action.STOP, "nothing", FollowUp.NOTHING, False),  # still running
        (Action.DRAIN_AND_RESTART, "requeue", FollowUp.REQUEUED, False),  # node not drained
    ],
)
def test_what_counts_as_doing_what_was_advised(
    action: Action, choice: str, follow_up: FollowUp, agree: bool
) -> None:
    cases, view = series([choice], action)
    judged = judge(cases[0], view)
    assert (judged.follow_up, judged.agree) == (follow_up, agree), judged.detail


def test_stop_advice_on_a_job_that_ended_and_stayed_ended_agrees() -> None:
    case = monitor_case(0, Action.STOP)
    view = SlurmView(jobs=[gathered(0, state="FAILED")], nodes=[node("a0"), node("b0")])
    judged = judge(case, view)
    assert judged.follow_up is FollowUp.STAYED_STOPPED and judged.agree is True


def test_drained_advised_and_requeued_are_both_seen() -> None:
    case = monitor_case(0)
    view = SlurmView(
        jobs=[gathered(0, state="RUNNING", restarts=1, nodes=["b0", "c0"])],
        nodes=[node("a0", "ops: bad gpu"), node("b0"), node("c0")],
    )
    judged = judge(case, view)
    assert judged.follow_up is FollowUp.DRAINED_ADVISED and judged.agree is True
    assert judged.seen == [FollowUp.DRAINED_ADVISED, FollowUp.REQUEUED]


@pytest.mark.parametrize(
    ("reason", "state", "by_a_person"),
    [
        ("ops: bad gpu", "IDLE", True),
        ("trainmedic incident-c-1-1: gpu_hardware: Xid 79", "IDLE", False),  # ours
        ("Not responding", "DOWN", False),  # slurmctld's own
        ("Kill task failed", "IDLE", False),
        ("maintenance", "DOWN", True),  # scontrol update state=down reason=maintenance
        (None, "IDLE", False),
    ],
)
def test_who_took_a_node_out(reason: str | None, state: str, by_a_person: bool) -> None:
    flags = ["DRAIN"] if reason and state != "DOWN" else []
    n = SlurmNode(name="n", state=state, state_flags=flags, reason=reason)
    assert out_by_a_person(n) is by_a_person


def test_a_node_drained_by_trainmedic_is_not_the_operators_agreement() -> None:
    case = monitor_case(0)
    view = SlurmView(
        jobs=[gathered(0)],
        nodes=[node("a0", "trainmedic incident-c-7-1: gpu_hardware: Xid 79"), node("b0")],
    )
    assert judge(case, view).follow_up is FollowUp.NOTHING


def test_a_requeue_by_a_later_incident_is_not_the_operators() -> None:
    case = monitor_case(0, Action.RESTART)
    job = gathered(0, restarts=1, comment="trainmedic incident-c-100-2: gpu_hardware: Xid 79")
    judged = judge(case, SlurmView(jobs=[job], nodes=[node("a0"), node("b0")]))
    assert judged.follow_up is FollowUp.UNKNOWN and judged.agree is None
    assert "acted on by trainmedic since" in judged.detail


def test_slurm_unreadable_leaves_monitor_cases_unknown_and_decisions_counted() -> None:
    view = SlurmView(problem="slurmctld unreachable")
    judged = judge(monitor_case(0), view)
    assert judged.follow_up is FollowUp.UNKNOWN and judged.agree is None
    assert "slurmctld unreachable" in judged.detail
    assert judge(approve_case(1, True), view).agree is True


def test_auto_mode_and_effectless_incidents_are_not_advice() -> None:
    auto = result(0, mode=Mode.AUTO)
    assert case_from_result(auto) is None
    waiting = result(1, Action.RESTART).model_copy(update={"effects": []})
    assert case_from_result(waiting) is None
    escalate = result(2)
    assert escalate.diagnosis is not None
    escalate.diagnosis.action = Action.ESCALATE
    assert case_from_result(escalate) is None


def test_without_the_gathered_job_the_result_still_names_job_and_restarts() -> None:
    case = case_from_result(result(3))
    assert case is not None
    assert (case.job_id, case.seen_restarts, case.advised_drains) == ("103", 0, ["a3"])
    assert case.advice == ["drain a3", "requeue job 103 excluding a3"]


# ------------------------------------------------------------------ recorded histories


def history(name: str) -> WorkflowHistory:
    path = HISTORIES / f"recovery-{name}.json"
    return WorkflowHistory.from_json(path.stem, path.read_text())


def test_cases_from_recorded_histories() -> None:
    monitor = case_from_history(history("mon-1"))
    assert monitor is not None and monitor.mode is Mode.MONITOR
    assert monitor.action is Action.DRAIN_AND_RESTART and monitor.rule_ids == ["kernel.xid_79"]
    assert monitor.advised_drains == ["gpu02"] and monitor.job_nodes == ["gpu01", "gpu02"]
    assert monitor.job_name and monitor.job_user == "root" and monitor.seen_restarts == 0
    assert monitor.closed_at is not None

    approved = case_from_history(history("appr-1"))
    assert approved is not None and approved.mode is Mode.APPROVE
    assert judge(approved, SlurmView()).follow_up is FollowUp.APPROVED
    rejected = case_from_history(history("rej-1"))
    assert rejected is not None
    assert judge(rejected, SlurmView()).follow_up is FollowUp.REJECTED
    assert case_from_history(history("auto-1")) is None  # auto mode: no advice


# ------------------------------------------------------------------ applying a promotion


def test_promoting_on_a_cluster_in_monitor_pins_the_other_kinds() -> None:
    policy = Policy()
    new, changes = promoted_policy(policy, Mode.MONITOR, Action.DRAIN_AND_RESTART, Mode.APPROVE)
    assert new.mode.default is Mode.APPROVE
    assert new.mode.actions == {
        Action.DRAIN_AND_RESTART: Mode.APPROVE,
        Action.RESTART: Mode.MONITOR,
        Action.RESTART_EXCLUDING: Mode.MONITOR,
        Action.STOP: Mode.MONITOR,
    }
    assert new.version == "builtin-1+drain_and_restart=approve"
    assert changes[0] == "mode.actions.drain_and_restart: monitor -> approve"
    assert "mode.default: monitor -> approve" in changes

    from trainmedic.workflows.planning import effect_mode

    # As planning decides it: only the promoted kind gains autonomy.
    assert effect_mode(new, Mode.APPROVE, Action.DRAIN_AND_RESTART, None) is Mode.APPROVE
    assert effect_mode(new, Mode.APPROVE, Action.RESTART, None) is Mode.MONITOR
    assert effect_mode(new, Mode.APPROVE, Action.STOP, None) is Mode.MONITOR


def test_promoting_on_a_cluster_with_autonomy_changes_only_the_kind() -> None:
    policy = parse_policy("version: p7\nmode: {default: approve, actions: {stop: monitor}}\n")
    new, changes = promoted_policy(policy, Mode.APPROVE, Action.RESTART, Mode.AUTO)
    assert new.mode.default is Mode.APPROVE
    assert new.mode.actions == {Action.STOP: Mode.MONITOR, Action.RESTART: Mode.AUTO}
    assert changes == ["mode.actions.restart: approve -> auto"]
    assert new.version == "p7+restart=auto"


# ------------------------------------------------------------------ the policy's bar


def test_promotion_policy_defaults_and_keys() -> None:
    bar = Policy().promotion
    assert (bar.min_cases, bar.min_agreement, bar.window) == (20, 0.95, timedelta(days=7))
    assert bar.auto_requires_approvals is True
    custom = parse_policy("promotion: {min_cases: 5, min_agreement: 0.8, window: 30d}\n")
    assert custom.promotion.window == timedelta(days=30)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("promotion: {min_cases: 0}", "promotion.min_cases: Input should be greater than"),
        ("promotion: {min_agreement: 1.5}", "promotion.min_agreement: Input should be less"),
        ("promotion: {min_agreement: 0}", "promotion.min_agreement: Input should be greater"),
        ("promotion: {min_agreement: .nan}", "promotion.min_agreement"),
        ("promotion: {window: 0s}", "promotion.window: must be more than 0s"),
        ("promotion: {cases: 20}", "promotion.cases: Extra inputs are not permitted"),
    ],
)
def test_promotion_policy_is_validated(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(text)
    assert message in str(caught.value)
