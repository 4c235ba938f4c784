"""Advice review: was trainmedic's advice what an operator did, and has an action kind
earned more autonomy?

Pure logic, no I/O: `case_from_history` reads one closed incident's history (already
fetched), `judge` compares one recommendation with what Slurm shows now, `aggregate`
counts per rule, category and action kind, and `decide_promotions` holds the figures
against the policy's bar (`promotion:`). `trainmedic advice report` and
`trainmedic mode promote` (trainmedic/cli/advice.py) do the reading.

What counts as a recommendation: an incident whose effects were recorded and not done
(monitor mode: status would_apply), or that waited for a person (approve mode). Auto
mode's effects are not advice and are left out.

What happened next:
- approve mode: the incident's own decisions. A person approved (agree) or rejected
  (disagree); an approval that timed out is nobody's judgement (`no_decision`, not
  counted in the agreement rate).
- monitor mode: what Slurm shows *at report time* (Slurm keeps no history without
  slurmdbd): the advised node drained or down with a reason that is neither
  trainmedic's nor Slurm's own; another node of the job out the same way; the job
  cancelled; its restart count moved on (requeued); a newer job of the same name and
  user (resubmitted); or none of these. A job whose comment is trainmedic's was
  requeued or cancelled by a later incident, not by a person. A job Slurm no longer
  knows (purged after MinJobAge) with no node taken out cannot be judged (`unknown`).
  Something done and undone before the report (a node drained and resumed) is not seen.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, ValidationError
from temporalio.client import WorkflowHistory

from trainmedic.audit import decode_payloads
from trainmedic.config import Policy, PromotionPolicy
from trainmedic.domain.enums import Action, Mode
from trainmedic.domain.incident import (
    Decision,
    EffectKind,
    EffectStatus,
    IncidentResult,
)
from trainmedic.domain.slurm import SlurmJob, SlurmNode
from trainmedic.workflows.planning import _AUTONOMY as AUTONOMY  # monitor < approve < auto
from trainmedic.workflows.planning import effect_mode, is_ours

# The action kinds that have effects, hence a mode to earn (wait and escalate do nothing).
PROMOTABLE: tuple[Action, ...] = (
    Action.RESTART,
    Action.RESTART_EXCLUDING,
    Action.DRAIN_AND_RESTART,
    Action.STOP,
)

# Reasons slurmctld sets by itself: a node out for one of these was not taken out by a
# person (the reason's user does not tell: slurmctld records SlurmUser, often root).
SLURM_OWN_REASONS: tuple[str, ...] = (
    "not responding",
    "kill task failed",
    "prolog error",
    "epilog error",
    "batch job complete failure",
    "job credential revoked",
    "low realmemory",
    "low socket*core*thread",
    "low cpus",
    "low tmpdisk",
    "gres/",
    "node unexpectedly rebooted",
    "reboot requested",
    "reboot issued",
    "reboot complete",
    "power_down",
    "powered down",
    "duplicate jobid",
    "node silently failed",
)

LIMITATION = (
    "monitor-mode follow-ups are read from Slurm as it is now (no history without "
    "slurmdbd): what an operator did and undid since, or a job Slurm has purged, is not seen"
)


class FollowUp(StrEnum):
    """What happened after a recommendation (one primary label per case)."""

    APPROVED = "approved"  # approve mode: a person approved
    REJECTED = "rejected"  # approve mode: a person rejected
    NO_DECISION = "no_decision"  # approve mode: the approval timed out
    DRAINED_ADVISED = "drained_advised"  # the advised node out, by a person
    DRAINED_OTHER = "drained_other"  # another node of the job out, by a person
    CANCELLED = "cancelled"  # the job is CANCELLED
    REQUEUED = "requeued"  # the job's restart count moved on
    RESUBMITTED = "resubmitted"  # a newer job of the same name and user
    STAYED_STOPPED = "stayed_stopped"  # stop advised: the job ended and was not restarted
    NOTHING = "nothing"  # none of the above is visible
    UNKNOWN = "unknown"  # cannot be told (job purged, Slurm unreadable, no decision)


class Case(BaseModel):
    """One recommendation: what was advised, in which mode, about which job and nodes."""

    incident_id: str
    closed_at: datetime | None = None
    mode: Mode  # monitor or approve
    action: Action
    category: str
    rule_ids: list[str] = Field(default_factory=list)
    outcome: str = ""
    job_id: str | None = None
    job_nodes: list[str] = Field(default_factory=list)  # the job's nodes when it failed
    job_name: str | None = None
    job_user: str | None = None
    seen_restarts: int | None = None  # the job's restart count when it failed
    advised_drains: list[str] = Field(default_factory=list)
    advice: list[str] = Field(default_factory=list)  # "drain gpu02", "requeue job 42 ..."
    decisions: list[Decision] = Field(default_factory=list)


class SlurmView(BaseModel):
    """Slurm as read at report time (one job list, one node list)."""

    jobs: list[SlurmJob] = Field(default_factory=list)
    nodes: list[SlurmNode] = Field(default_factory=list)
    read_at: datetime | None = None
    problem: str | None = None  # Slurm could not be read: monitor cases are unknown

    # Indexes for the lookups (a report judges thousands of cases against thousands of
    # jobs); rebuilt when the lists grew since.
    _jobs: dict[str, SlurmJob] = PrivateAttr(default_factory=dict)
    _named: dict[tuple[str, str], list[SlurmJob]] = PrivateAttr(default_factory=dict)
    _jobs_indexed: int = PrivateAttr(-1)
    _nodes: dict[str, SlurmNode] = PrivateAttr(default_factory=dict)

    def _index_jobs(self) -> None:
        if self._jobs_indexed == len(self.jobs):
            return
        self._jobs = {j.job_id: j for j in self.jobs}
        self._named = {}
        for j in self.jobs:
            self._named.setdefault((j.name, j.user or ""), []).append(j)
        self._jobs_indexed = len(self.jobs)

    def job(self, job_id: str | None) -> SlurmJob | None:
        if job_id is None:
            return None
        self._index_jobs()
        return self._jobs.get(job_id)

    def newest(self, name: str, user: str) -> SlurmJob | None:
        """The job of this name and user with the highest id (Slurm's ids only grow)."""
        self._index_jobs()
        same = [(n, j) for j in self._named.get((name, user), []) if (n := _numeric(j.job_id))]
        return max(same, key=lambda pair: pair[0])[1] if same else None

    def node(self, name: str) -> SlurmNode | None:
        if len(self._nodes) != len(self.nodes):
            self._nodes = {n.name: n for n in self.nodes}
        return self._nodes.get(name)


class Judged(BaseModel):
    case: Case
    follow_up: FollowUp
    seen: list[FollowUp] = Field(default_factory=list)  # every act seen, not only the first
    agree: bool | None  # None: not judged (not counted in the agreement rate)
    detail: str = ""


class Tally(BaseModel):
    cases: int = 0
    monitor: int = 0
    approve: int = 0
    follow_ups: dict[str, int] = Field(default_factory=dict)
    judged: int = 0
    agree: int = 0
    # The same figures for approve-mode cases alone (decisions by a person).
    approve_judged: int = 0
    approve_agree: int = 0

    @property
    def agreement(self) -> float | None:
        return self.agree / self.judged if self.judged else None

    @property
    def approve_agreement(self) -> float | None:
        return self.approve_agree / self.approve_judged if self.approve_judged else None

    def add(self, judged: Judged) -> None:
        self.cases += 1
        if judged.case.mode is Mode.APPROVE:
            self.approve += 1
        else:
            self.monitor += 1
        key = judged.follow_up.value
        self.follow_ups[key] = self.follow_ups.get(key, 0) + 1
        if judged.agree is None:
            return
        self.judged += 1
        self.agree += judged.agree
        if judged.case.mode is Mode.APPROVE:
            self.approve_judged += 1
            self.approve_agree += judged.agree

    def summary(self) -> dict[str, Any]:
        out = self.model_dump()
        out["agreement"] = _round(self.agreement)
        out["approve_agreement"] = _round(self.approve_agreement)
        return out


class Bar(BaseModel):
    """One step of the promotion ladder, held against the figures."""

    to: Mode
    cases: int  # judged cases counted for this step
    agree: int
    agreement: float | None
    min_cases: int
    min_agreement: float
    met: bool
    why: str  # the figures in words, for the report and a refusal


class Promotion(BaseModel):
    action: Action
    current: Mode  # the kind's mode now (cluster mode and action override)
    earned: Mode  # the highest mode the figures support (monitor: none yet)
    promote_to: Mode | None  # earned and above current: what to run `promote` with
    bars: list[Bar] = Field(default_factory=list)

    def bar(self, to: Mode) -> Bar:
        return next(b for b in self.bars if b.to is to)


class AdviceReport(BaseModel):
    cluster: str
    since: datetime
    generated_at: datetime
    policy_version: str
    bar: PromotionPolicy
    cluster_mode: Mode
    incidents_read: int = 0
    incidents_unreadable: int = 0
    incidents_listed: int = 0
    slurm_read_at: datetime | None = None
    slurm_problem: str | None = None
    limitation: str = LIMITATION
    cases: list[Judged] = Field(default_factory=list)
    by_action: dict[str, dict[str, Any]] = Field(default_factory=dict)
    by_category: dict[str, dict[str, Any]] = Field(default_factory=dict)
    by_rule: dict[str, dict[str, Any]] = Field(default_factory=dict)
    promotions: list[Promotion] = Field(default_factory=list)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# ---------------------------------------------------------------------- reading a case


def case_from_result(
    result: IncidentResult,
    job: SlurmJob | None = None,
    closed_at: datetime | None = None,
) -> Case | None:
    """The recommendation an incident made, or None when it made none (auto mode, no
    diagnosis, an action with no effects, or nothing planned)."""
    diagnosis = result.diagnosis
    if diagnosis is None or diagnosis.action not in PROMOTABLE or not result.effects:
        return None
    # Culprits found already out changed nothing and advised nothing.
    live = [
        e
        for e in result.effects
        if not (e.kind is EffectKind.DRAIN_NODE and e.status is EffectStatus.ALREADY_TRUE)
    ]
    if any(e.mode is Mode.APPROVE for e in live):
        mode = Mode.APPROVE
    elif any(e.status is EffectStatus.WOULD_APPLY for e in live):
        mode = Mode.MONITOR
    else:
        return None
    advised = [e for e in live if e.status is EffectStatus.WOULD_APPLY or e.mode is Mode.APPROVE]
    job_ids = [e.job_id for e in result.effects if e.job_id]
    restarts = [e.seen_restarts for e in result.effects if e.seen_restarts is not None]
    return Case(
        incident_id=result.incident_id,
        closed_at=closed_at,
        mode=mode,
        action=diagnosis.action,
        category=diagnosis.category.value,
        rule_ids=list(diagnosis.rule_ids),
        outcome=result.outcome.value,
        job_id=job.job_id if job else (job_ids[0] if job_ids else None),
        job_nodes=list(job.nodes) if job else [],
        job_name=(job.name or None) if job else None,
        job_user=job.user if job else None,
        seen_restarts=job.restarts if job else (restarts[0] if restarts else None),
        advised_drains=[e.node for e in advised if e.kind is EffectKind.DRAIN_NODE and e.node],
        advice=[e.describe() for e in advised],
        decisions=list(result.decisions),
    )


def case_from_history(history: WorkflowHistory) -> Case | None:
    """A closed RecoveryWorkflow's recommendation, from its history: the result (close
    event) plus the job as gathered when it failed (its nodes, name, user, restart
    count). None when it did not complete or made no recommendation."""
    scheduled: dict[int, str] = {}
    job: SlurmJob | None = None
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = attrs.activity_type.name
        elif event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            if scheduled.get(done.scheduled_event_id) != "gather_evidence":
                continue
            gathered = _first_dict(done.result.payloads)
            if gathered.get("job"):
                try:
                    job = SlurmJob.model_validate(gathered["job"])
                except ValidationError:
                    job = None
        elif event.HasField("workflow_execution_completed_event_attributes"):
            completed = event.workflow_execution_completed_event_attributes
            raw = _first_dict(completed.result.payloads)
            try:
                result = IncidentResult.model_validate(raw)
            except ValidationError:
                return None
            closed = event.event_time.ToDatetime(tzinfo=UTC)
            return case_from_result(result, job, closed)
    return None


def _first_dict(payloads: Any) -> dict[str, Any]:
    try:
        values = decode_payloads(payloads)
    except Exception:  # a foreign or encrypted payload: nothing to read
        return {}
    return values[0] if values and isinstance(values[0], dict) else {}


# ----------------------------------------------------------------------- judging a case


def out_by_a_person(node: SlurmNode | None) -> bool:
    """Drained or down with a reason that is neither trainmedic's nor slurmctld's own."""
    if node is None or not (node.drain_flag or node.is_down):
        return False
    reason = (node.reason or "").strip()
    if not reason or is_ours(reason):
        return False
    lowered = reason.lower()
    return not any(lowered.startswith(own) for own in SLURM_OWN_REASONS)


def _resubmitted(case: Case, job: SlurmJob | None, view: SlurmView) -> SlurmJob | None:
    """A newer job of the same name and user (Slurm's ids only grow)."""
    name = case.job_name or (job.name if job else None)
    user = case.job_user or (job.user if job else None)
    base = _numeric(case.job_id)
    if not name or not user or base is None:
        return None
    newest = view.newest(name, user)
    number = _numeric(newest.job_id) if newest else None
    return newest if number is not None and number > base else None


def _numeric(job_id: str | None) -> int | None:
    head = (job_id or "").split("_")[0].split("+")[0]
    return int(head) if head.isdigit() else None


def _judge_decisions(case: Case) -> Judged:
    people = [d for d in case.decisions if d.via != "timeout"]
    if any(not d.approve for d in people):
        who = ", ".join(sorted({d.by for d in people if not d.approve}))
        return Judged(case=case, follow_up=FollowUp.REJECTED, agree=False, detail=f"by {who}")
    if people:
        who = ", ".join(sorted({d.by for d in people}))
        return Judged(case=case, follow_up=FollowUp.APPROVED, agree=True, detail=f"by {who}")
    if case.decisions:
        return Judged(
            case=case,
            follow_up=FollowUp.NO_DECISION,
            agree=None,
            detail="the approval timed out: nobody's judgement, not counted",
        )
    return Judged(case=case, follow_up=FollowUp.UNKNOWN, agree=None, detail="no decision recorded")


def judge(case: Case, view: SlurmView) -> Judged:
    """Compare one recommendation with what followed (approve mode: the decisions;
    monitor mode: what Slurm shows now)."""
    if case.mode is Mode.APPROVE:
        return _judge_decisions(case)
    if view.problem:
        return Judged(
            case=case,
            follow_up=FollowUp.UNKNOWN,
            agree=None,
            detail=f"Slurm not read: {view.problem}",
        )
    job = view.job(case.job_id)
    seen: list[FollowUp] = []
    notes: list[str] = []
    advised_out = [n for n in case.advised_drains if out_by_a_person(view.node(n))]
    if advised_out:
        seen.append(FollowUp.DRAINED_ADVISED)
        notes.append(_node_note(view, advised_out))
    others = sorted({*case.job_nodes, *(job.nodes if job else [])} - set(case.advised_drains))
    others_out = [n for n in others if out_by_a_person(view.node(n))]
    if others_out:
        seen.append(FollowUp.DRAINED_OTHER)
        notes.append(_node_note(view, others_out))
    # trainmedic writes its reason into the comment of a job it requeues or cancels: a
    # later incident's effect (after a promotion) is not this operator's choice.
    ours = job is not None and is_ours(job.comment)
    if ours and job is not None:
        notes.append(f"job {job.job_id} was acted on by trainmedic since ({job.comment[:80]!r})")
    if job is not None and not ours and job.state == "CANCELLED":
        seen.append(FollowUp.CANCELLED)
        notes.append(f"job {job.job_id} CANCELLED")
    if (
        job is not None
        and not ours
        and case.seen_restarts is not None
        and job.restarts > case.seen_restarts
    ):
        seen.append(FollowUp.REQUEUED)
        notes.append(
            f"job {job.job_id} restarts {case.seen_restarts} -> {job.restarts} ({job.state})"
        )
    newer = _resubmitted(case, job, view)
    if newer is not None:
        seen.append(FollowUp.RESUBMITTED)
        notes.append(f"job {newer.job_id} ({newer.name}, {newer.user}) submitted since")

    restarted = FollowUp.REQUEUED in seen or FollowUp.RESUBMITTED in seen
    match case.action:
        case Action.DRAIN_AND_RESTART:
            agree = FollowUp.DRAINED_ADVISED in seen
        case Action.RESTART | Action.RESTART_EXCLUDING:
            # Restarted without blaming a node trainmedic did not blame.
            agree = restarted and FollowUp.DRAINED_OTHER not in seen
        case Action.STOP:
            agree = FollowUp.CANCELLED in seen or (
                job is not None and not ours and job.is_finished and not restarted
            )
            if agree and not seen:
                seen.append(FollowUp.STAYED_STOPPED)
                notes.append(
                    f"job {job.job_id if job else '?'} ended ({job.state if job else '?'})"
                    " and was not restarted"
                )
        case _:
            agree = False
    if not seen:
        if ours:
            return Judged(case=case, follow_up=FollowUp.UNKNOWN, agree=None, detail=notes[-1])
        if job is None and case.job_id is not None:
            return Judged(
                case=case,
                follow_up=FollowUp.UNKNOWN,
                agree=None,
                detail=f"job {case.job_id} is no longer known to Slurm and no node of it is out",
            )
        seen.append(FollowUp.NOTHING)
        state = f"job {job.job_id} {job.state}" if job else "no job"
        notes.append(f"nothing visible ({state})")
    return Judged(case=case, follow_up=seen[0], seen=seen, agree=agree, detail="; ".join(notes))


def _node_note(view: SlurmView, names: list[str]) -> str:
    parts = []
    for name in names:
        node = view.node(name)
        if node is None:
            continue
        who = f" by {node.reason_user}" if node.reason_user else ""
        parts.append(f"{name} {node.state_text} ({node.reason!r}{who})")
    return ", ".join(parts)


# ----------------------------------------------------------------------- aggregating


def aggregate(
    judged: Iterable[Judged],
) -> tuple[dict[str, Tally], dict[str, Tally], dict[str, Tally]]:
    """Tallies per action kind, per category and per rule id (a case counts under each
    of its rules; '(none)' when no rule fired)."""
    by_action: dict[str, Tally] = {}
    by_category: dict[str, Tally] = {}
    by_rule: dict[str, Tally] = {}
    for item in judged:
        case = item.case
        by_action.setdefault(case.action.value, Tally()).add(item)
        by_category.setdefault(case.category, Tally()).add(item)
        for rule in case.rule_ids or ["(none)"]:
            by_rule.setdefault(rule, Tally()).add(item)
    return by_action, by_category, by_rule


# ----------------------------------------------------------------------- promotions


def current_mode(policy: Policy, cluster_mode: Mode, action: Action) -> Mode:
    """The kind's mode now, as planning.effect_mode decides it (partition overrides
    aside): a cluster in monitor keeps every kind in monitor; otherwise the action's
    override, else the cluster's mode."""
    return effect_mode(policy, cluster_mode, action, None)


def _bar(to: Mode, cases: int, agree: int, bar: PromotionPolicy, evidence: str) -> Bar:
    rate = agree / cases if cases else None
    met = cases >= bar.min_cases and rate is not None and rate >= bar.min_agreement
    shown = f"{rate:.0%}" if rate is not None else "-"
    why = (
        f"{cases} {evidence} (needs {bar.min_cases}), agreement {shown} ({agree}/{cases}; "
        f"needs {bar.min_agreement:.0%})"
    )
    return Bar(
        to=to,
        cases=cases,
        agree=agree,
        agreement=_round(rate),
        min_cases=bar.min_cases,
        min_agreement=bar.min_agreement,
        met=met,
        why=why,
    )


def decide_promotions(
    by_action: dict[str, Tally], policy: Policy, cluster_mode: Mode
) -> list[Promotion]:
    """For each action kind with effects: the mode its figures have earned.

    approve: judged cases of monitor and approve mode together meet the bar. auto: with
    `promotion.auto_requires_approvals` (the default), approve-mode decisions alone
    must meet it (auto takes the person out: the evidence is people approving these
    very effects); otherwise the same figures as for approve. Earning auto needs
    earning approve too.
    """
    bar = policy.promotion
    out: list[Promotion] = []
    for action in PROMOTABLE:
        tally = by_action.get(action.value, Tally())
        to_approve = _bar(Mode.APPROVE, tally.judged, tally.agree, bar, "cases judged")
        if bar.auto_requires_approvals:
            to_auto = _bar(
                Mode.AUTO,
                tally.approve_judged,
                tally.approve_agree,
                bar,
                "decisions in approve mode",
            )
        else:
            to_auto = _bar(Mode.AUTO, tally.judged, tally.agree, bar, "cases judged")
        to_auto.met = to_auto.met and to_approve.met
        earned = Mode.AUTO if to_auto.met else Mode.APPROVE if to_approve.met else Mode.MONITOR
        now = current_mode(policy, cluster_mode, action)
        out.append(
            Promotion(
                action=action,
                current=now,
                earned=earned,
                promote_to=earned if AUTONOMY[earned] > AUTONOMY[now] else None,
                bars=[to_approve, to_auto],
            )
        )
    return out


def build_report(
    cluster: str,
    since: datetime,
    now: datetime,
    policy: Policy,
    cluster_mode: Mode,
    cases: list[Case],
    view: SlurmView,
) -> AdviceReport:
    judged = [judge(case, view) for case in cases]
    by_action, by_category, by_rule = aggregate(judged)
    return AdviceReport(
        cluster=cluster,
        since=since,
        generated_at=now,
        policy_version=policy.version,
        bar=policy.promotion,
        cluster_mode=cluster_mode,
        slurm_read_at=view.read_at,
        slurm_problem=view.problem,
        cases=judged,
        by_action={k: v.summary() for k, v in sorted(by_action.items())},
        by_category={k: v.summary() for k, v in sorted(by_category.items())},
        by_rule={k: v.summary() for k, v in sorted(by_rule.items())},
        promotions=decide_promotions(by_action, policy, cluster_mode),
    )


# ----------------------------------------------------------------------- applying one


def promoted_policy(
    policy: Policy, cluster_mode: Mode, action: Action, to: Mode
) -> tuple[Policy, list[str]]:
    """The policy with `action` raised to `to`, and what else had to change, in words.

    A cluster in monitor holds every kind in monitor whatever the overrides say
    (planning.effect_mode), so there a promotion also pins every other kind without an
    override at monitor and raises the policy's default mode to `to`: the ControlWorkflow
    then moves the cluster's mode with it, and only `action` gains autonomy.
    """
    actions = dict(policy.mode.actions)
    changes = [
        f"mode.actions.{action.value}: {current_mode(policy, cluster_mode, action).value}"
        f" -> {to.value}"
    ]
    default = policy.mode.default
    if cluster_mode is Mode.MONITOR:
        for other in PROMOTABLE:
            if other is not action and other not in actions:
                actions[other] = Mode.MONITOR
                changes.append(f"mode.actions.{other.value}: monitor (pinned)")
        if default is not to:
            changes.append(f"mode.default: {default.value} -> {to.value}")
        default = to
    actions[action] = to
    mode = policy.mode.model_copy(update={"actions": actions, "default": default})
    version = f"{policy.version}+{action.value}={to.value}"
    return policy.model_copy(update={"mode": mode, "version": version}), changes
