"""The audit trail, read back from workflow histories.

Every decision and effect of trainmedic is recorded in a Temporal history: operator
signals and updates (with the event's identity), the memo upserts the RecoveryWorkflow
makes at each step, the activities that changed Slurm (with the exact argv and what it
found before and after), and the ControlWorkflow's mode, policy and reservation updates.
`records_from_history` turns one history into flat `AuditRecord`s (pure: no I/O), and
`export` walks the workflows visibility lists. Payloads are read into the same pydantic
models the workflows and activities wrote them with (trainmedic.domain), one decoder per
event kind and a table per activity and update; old histories read the same (fields
added since have defaults, dropped ones are ignored). A payload no model reads (foreign,
encrypted) is logged and leaves its record out, or empty, never stopping the audit.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from trainmedic.domain.activity_io import (
    ApplyEffectRequest,
    ConsistencyReport,
    ConsistencyRequest,
    ControlRef,
    EffectOutcome,
    ReserveIsolation,
    ReserveRestart,
    VerifyRequest,
    VerifyResult,
)
from trainmedic.domain.control import (
    ControlInput,
    ControlState,
    IsolationGrant,
    IsolationRequest,
    RestartGrant,
    RestartRequest,
    SetModeRequest,
    SetPolicyRequest,
)
from trainmedic.domain.diagnosis import AttributionRequest, Diagnosis, Evidence
from trainmedic.domain.incident import (
    Decision,
    DecisionPayload,
    IncidentInput,
    IncidentResult,
    IncidentSignal,
    PlannedEffect,
)
from trainmedic.domain.notify import Notification, NotifyResult
from trainmedic.domain.slurm import EffectResult
from trainmedic.durations import parse_duration
from trainmedic.errors import ServiceError, TrainmedicError

logger = logging.getLogger(__name__)

RECOVERY = "RecoveryWorkflow"
CONTROL = "ControlWorkflow"

# Kinds of record, in the order an incident usually produces them.
KINDS = (
    "incident_started",
    "signal",
    "diagnosis",
    "effect_planned",
    "decision",
    "decision_refused",
    "reservation",
    "effect_applied",
    "effect_status",
    "verification",
    "cancel_requested",
    "consistency",
    "outcome",
    "notification",
    "mode_change",
    "policy_change",
)


_CONVERTER = pydantic_data_converter.payload_converter


def decode_payloads(payloads: list[Payload] | Any) -> list[Any]:
    """JSON values of Temporal payloads, without knowing their Python types."""
    return list(_CONVERTER.from_payloads(list(payloads)))


def decode_payload(payload: Payload) -> Any:
    return decode_payloads([payload])[0]


class AuditError(TrainmedicError):
    """An audit export could not be done as asked (bad --since, unknown incident)."""


class AuditRecord(BaseModel):
    """One audited fact. Flat on purpose: one JSON object per line, grep- and jq-able."""

    time: datetime
    kind: str
    workflow_id: str
    run_id: str = ""
    workflow_type: str
    event_id: int
    incident: str | None = None  # the incident this is about (also for control records)
    cluster: str | None = None
    stage: str | None = None
    mode: str | None = None
    who: str | None = None  # the payload's `by`: the name an operator gave
    identity: str | None = None  # the client identity Temporal recorded with the event
    # True for an operator message whose event carries no identity (the Temporal UI
    # sends none): then `who` is only what the sender typed.
    unverified_identity: bool = False
    via: str | None = None  # signal | update | timeout | start
    approve: bool | None = None
    action: str | None = None  # decision target ("all" or an effect id) or diagnosis action
    effect_id: str | None = None
    effect_kind: str | None = None
    status: str | None = None  # effect status, grant, or outcome
    commands: list[list[str]] = Field(default_factory=list)  # exact Slurm argv
    results: list[EffectResult] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    rule_ids: list[str] = Field(default_factory=list)
    catalog_version: str | None = None
    policy_version: str | None = None
    category: str | None = None
    culprit_nodes: list[str] = Field(default_factory=list)
    comment: str | None = None
    detail: str = ""


# ----------------------------------------------------------------------- decoding

T = TypeVar("T")
Req = TypeVar("Req", bound=BaseModel)
Res = TypeVar("Res", bound=BaseModel)


def _raw(payload: Payload | None) -> Any:
    """A payload's JSON value, for messages no model describes; None when unreadable."""
    if payload is None:
        return None
    try:
        return decode_payload(payload)
    except Exception as error:  # a foreign or encrypted payload must not stop the audit
        logger.warning("undecodable payload in history: %s", error)
        return None


def _read(payload: Payload | None, model: type[T]) -> T | None:
    """A payload as the model it was written with; None when absent or unreadable."""
    if payload is None:
        return None
    try:
        value: T = _CONVERTER.from_payload(payload, model)
    except Exception as error:  # see _raw
        logger.warning("unreadable %s in history: %s", getattr(model, "__name__", model), error)
        return None
    return value


def _first(payloads: Any) -> Payload | None:
    return payloads.payloads[0] if payloads.payloads else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class _OutcomeMemo(BaseModel):
    """The `outcome` memo RecoveryWorkflow upserts as it finishes."""

    outcome: str | None = None
    summary: str = ""


def evidence_line(item: Evidence) -> str:
    """'kernel gpu02 gpu3 [rule]: text' or 'log /path:12 rank 3: text'."""
    where: list[str] = [item.source.value]
    if item.file:
        where.append(f"{item.file}:{item.line_no}" if item.line_no else item.file)
    if item.node:
        where.append(item.node)
    if item.rank is not None:
        where.append(f"rank {item.rank}")
    if item.gpu is not None:
        where.append(f"gpu{item.gpu}")
    if item.rule_id:
        where.append(f"[{item.rule_id}]")
    return f"{' '.join(where)}: {item.text}"


def _ran(results: list[EffectResult]) -> dict[str, Any]:
    """A record's `commands` (the exact Slurm argv) and `results`."""
    return {"commands": [r.command for r in results if r.command], "results": results}


def _reserving(request: IsolationRequest | RestartRequest | None) -> str:
    if isinstance(request, IsolationRequest):
        return f"isolate {request.node} (partition {request.partition})"
    if isinstance(request, RestartRequest):
        return f"restart job {request.job_id} ({request.cause})"
    return "?"


def _sender(identity: str) -> dict[str, Any]:
    """A message's identity, and whether it came without one (the Temporal UI's)."""
    return {"identity": identity or None, "unverified_identity": not identity}


def _failure_message(failure: Any) -> str:
    message = failure.message
    cause = failure.cause if failure.HasField("cause") else None
    while cause is not None and cause.message:
        message = f"{message}: {cause.message}"
        cause = cause.cause if cause.HasField("cause") else None
    return str(message)


# ------------------------------------------------------------------------ the walk


class _Walker:
    """State carried across one history's events. Each event kind has its decoder
    (`_EVENTS`); activities and updates have theirs in `_ACTIVITIES` and `_UPDATES`."""

    def __init__(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id
        self.run_id = ""
        self.workflow_type = ""
        self.cluster: str | None = None
        self.stage: str | None = None
        self.mode: str | None = None
        self.policy_version: str | None = None
        self.catalog_version: str | None = None
        self.records: list[AuditRecord] = []
        self.event = HistoryEvent()  # the one being read (an update's: its acceptance)
        self.attrs: Any = None  # its attributes
        self.sender: dict[str, Any] = {}  # an update's identity (see _sender)
        self.scheduled: dict[int, tuple[str, Payload | None]] = {}  # event id -> (type, input)
        self.accepted: dict[int, HistoryEvent] = {}  # updates accepted, by event id
        self.effect_status: dict[str, str] = {}
        self.planned: set[str] = set()  # effects already recorded as planned
        self.decision_signals: list[AuditRecord] = []
        self.memo_decisions: list[Decision] = []
        self.has_diagnosis = False
        self.has_outcome = False

    def record(self, kind: str, **fields: Any) -> AuditRecord:
        fields.setdefault("incident", self.workflow_id if self.workflow_type == RECOVERY else None)
        fields.setdefault("stage", self.stage)
        fields.setdefault("mode", self.mode)
        fields.setdefault("policy_version", self.policy_version)
        rec = AuditRecord(
            time=self.event.event_time.ToDatetime(tzinfo=UTC),
            kind=kind,
            workflow_id=self.workflow_id,
            run_id=self.run_id,
            workflow_type=self.workflow_type,
            event_id=self.event.event_id,
            cluster=self.cluster,
            **fields,
        )
        self.records.append(rec)
        return rec

    def walk(self, events: Iterable[HistoryEvent]) -> list[AuditRecord]:
        for event in events:
            kind = event.WhichOneof("attributes") or ""
            decoder = _EVENTS.get(kind.removesuffix("_event_attributes"))
            if decoder is not None:
                self.event, self.attrs = event, getattr(event, kind)
                decoder(self, self.attrs)
        self.settle_signals()
        return self.records

    # -- workflow start ---------------------------------------------------------------

    def started(self, a: Any) -> None:
        self.workflow_type = a.workflow_type.name
        self.run_id = a.original_execution_run_id or ""
        if self.workflow_type == RECOVERY:
            self.incident_started(_read(_first(a.input), IncidentInput))
        elif self.workflow_type == CONTROL:
            self.control_started(_read(_first(a.input), ControlInput))
        else:  # a quarantine, the lease: only which cluster it is about
            cluster = _dict(_raw(_first(a.input))).get("cluster")
            self.cluster = cluster if isinstance(cluster, str) else None

    def incident_started(self, request: IncidentInput | None) -> None:
        if request is None:
            return
        self.cluster = request.cluster
        signal = request.signal or IncidentSignal()
        about = f"job {request.job_id}" if request.job_id else "no job"
        nodes = ",".join(request.nodes) or "none"
        self.record(
            "incident_started",
            **_sender(self.attrs.identity),
            via="start",
            mode=request.mode.value if request.mode else None,
            culprit_nodes=request.nodes,
            evidence=[evidence_line(e) for e in signal.evidence],
            detail=f"{signal.source}/{signal.kind} ({about}, nodes {nodes}): "
            f"{signal.detail}".strip(),
        )

    def control_started(self, request: ControlInput | None) -> None:
        if request is None:
            return
        self.cluster = request.cluster
        state = request.state
        self.policy_version = (state.policy if state else request.policy).version
        self.mode = (state.mode if state else request.policy.mode.default).value
        if state is None:  # a fresh start (not a continue-as-new) sets the initial mode
            self.record(
                "mode_change",
                who="trainmedic:start",
                identity=self.attrs.identity or None,
                via="start",
                detail="initial mode from policy",
            )

    def search_attributes(self, a: Any) -> None:
        fields = a.search_attributes.indexed_fields
        for name, attr in (("TmStage", "stage"), ("TmMode", "mode"), ("TmCluster", "cluster")):
            value = _raw(fields[name]) if name in fields else None
            if isinstance(value, list):
                value = value[0] if value else None
            if value:
                setattr(self, attr, str(value))

    # -- activities and operator messages ---------------------------------------------

    def activity_scheduled(self, a: Any) -> None:
        self.scheduled[self.event.event_id] = (a.activity_type.name, _first(a.input))

    def activity_completed(self, a: Any) -> None:
        name, request = self.scheduled.get(a.scheduled_event_id, ("", None))
        if (how := _ACTIVITIES.get(name)) and (result := _read(_first(a.result), how.result)):
            how.completed(self, _read(request, how.request), result)

    def activity_failed(self, a: Any) -> None:
        name, request = self.scheduled.get(a.scheduled_event_id, ("", None))
        if (how := _ACTIVITIES.get(name)) and how.failed:
            how.failed(self, _read(request, how.request), _failure_message(a.failure))

    def signaled(self, a: Any) -> None:
        name, payload = a.signal_name, _first(a.input)
        if name in ("approve", "reject"):
            # Unreadable, it still says which decision came (with the payload's defaults).
            decision = _read(payload, DecisionPayload) or DecisionPayload()
            rec = self.record(
                "decision",
                who=decision.by or None,
                **_sender(a.identity),
                via="signal",
                approve=name == "approve",
                action=decision.action,
                comment=decision.comment or None,
                detail=f"{name} {decision.action}",
            )
            self.decision_signals.append(rec)
            return
        report = _read(payload, IncidentSignal) if name == "report" else None
        raw = _dict(_raw(payload))
        self.record(
            "signal",
            who=raw.get("by") or None,
            **_sender(a.identity),
            via="signal",
            evidence=[evidence_line(e) for e in report.evidence] if report else [],
            detail=f"{name}: {raw.get('detail') or raw}",
        )

    def update_accepted(self, a: Any) -> None:
        self.accepted[self.event.event_id] = self.event

    def update_completed(self, a: Any) -> None:
        accepted = self.accepted.pop(a.accepted_event_id, None)
        if accepted is None:
            return
        self.event = accepted  # an update is recorded where it was accepted
        asked = accepted.workflow_execution_update_accepted_event_attributes.accepted_request
        name, payload = asked.input.name, _first(asked.input.args)
        self.sender = {**_sender(asked.meta.identity), "via": "update"}
        failure = _failure_message(a.outcome.failure) if a.outcome.HasField("failure") else None
        how = _UPDATES.get(name)
        request = _read(payload, how.request) if how else None
        if how is None or request is None:
            who = _dict(_raw(payload)).get("by") or None
            self.record("signal", who=who, detail=failure or f"update {name}", **self.sender)
            return
        result = None
        if failure is None and how.result is not None:
            result = _read(_first(a.outcome.success), how.result)
        how.record(self, request, result, failure)

    # -- what the incident recorded in its memo ---------------------------------------

    def memo(self, a: Any) -> None:
        fields = a.upserted_memo.fields
        if "diagnosis" in fields:
            self.diagnosis(_read(fields["diagnosis"], Diagnosis))
        if "effects" in fields:
            self.effects(_read(fields["effects"], list[PlannedEffect]) or [])
        if "decisions" in fields:
            self.decisions(_read(fields["decisions"], list[Decision]) or [])
        if "outcome" in fields and (outcome := _read(fields["outcome"], _OutcomeMemo)):
            self.closed(outcome.outcome, outcome.summary)

    def diagnosis(self, diagnosis: Diagnosis | None) -> None:
        if diagnosis is None or self.has_diagnosis:
            return
        self.has_diagnosis = True
        self.catalog_version = diagnosis.catalog_version
        category, action = diagnosis.category.value, diagnosis.action.value
        self.record(
            "diagnosis",
            stage="attribute",
            category=category,
            action=action,
            culprit_nodes=diagnosis.culprit_nodes,
            evidence=[evidence_line(e) for e in diagnosis.evidence],
            rule_ids=diagnosis.rule_ids,
            catalog_version=self.catalog_version,
            detail=f"{category} -> {action} (confidence {diagnosis.confidence}): "
            f"{diagnosis.summary}",
        )

    def effects(self, effects: list[PlannedEffect]) -> None:
        for effect in effects:
            status = effect.status.value
            fields: dict[str, Any] = {
                "effect_id": effect.id,
                "effect_kind": effect.kind.value,
                "status": status,
                "mode": effect.mode.value,
                "catalog_version": self.catalog_version,
            }
            if effect.id not in self.planned:
                self.planned.add(effect.id)
                self.effect_status[effect.id] = status
                detail = f"{effect.reason} {effect.note}".strip()
                self.record("effect_planned", detail=detail, **fields)
            elif self.effect_status.get(effect.id) != status:
                self.effect_status[effect.id] = status
                self.record("effect_status", **_ran(effect.results), detail=effect.note, **fields)

    def decisions(self, decisions: list[Decision]) -> None:
        # Each memo holds the whole list. Operator decisions were recorded from their
        # signal or update event (which carries the identity); only timeouts are new here.
        for decision in decisions[len(self.memo_decisions) :]:
            if decision.via == "timeout":
                self.record(
                    "decision",
                    who=decision.by,
                    via="timeout",
                    approve=decision.approve,
                    action=decision.action,
                    effect_id=",".join(decision.effect_ids) or None,
                    comment=decision.comment or None,
                    detail=decision.comment,
                )
        self.memo_decisions = decisions

    # -- the end ------------------------------------------------------------------------

    def cancel_requested(self, a: Any) -> None:
        detail = a.cause or "cancellation requested"
        self.record("cancel_requested", **_sender(a.identity), detail=detail)

    def completed(self, a: Any) -> None:
        if a.new_execution_run_id or self.workflow_type != RECOVERY:
            return  # continue-as-new (the next run carries on), or not an incident
        result = _read(_first(a.result), IncidentResult)
        if result is not None:
            self.memo_decisions = result.decisions
        self.closed(result.outcome.value if result else None, result.summary if result else "")

    def closed(self, status: str | None, detail: str, **fields: Any) -> None:
        if not self.has_outcome:
            self.has_outcome = True
            self.record("outcome", stage="done", status=status, detail=detail, **fields)

    def settle_signals(self) -> None:
        """A decision signal the workflow refused (it cannot answer a signal) is one
        that never reached the workflow's own list of decisions."""
        taken = [d for d in self.memo_decisions if d.via == "signal"]
        for rec in self.decision_signals:
            same = (
                d
                for d in taken
                if (d.by, d.action, d.approve) == (rec.who or "", rec.action, rec.approve)
            )
            match = next(same, None)
            if match is not None:
                taken.remove(match)
                rec.effect_id = ",".join(match.effect_ids) or None
            elif self.has_outcome:
                rec.kind = "decision_refused"
                rec.detail = f"{rec.detail}: not taken by the workflow (see its `ignored` list)"
            else:
                rec.detail = f"{rec.detail}: not (yet) in the workflow's decisions"


# ------------------------------------------------------------ activities and updates


def _snapshot(w: _Walker, _: ControlRef | None, state: ControlState) -> None:
    w.policy_version = state.policy.version or w.policy_version


def _attributed(w: _Walker, _: AttributionRequest | None, diagnosis: Diagnosis) -> None:
    w.diagnosis(diagnosis)


def _applied(w: _Walker, request: ApplyEffectRequest | None, outcome: EffectOutcome | str) -> None:
    """An effect applied, or (`outcome` the failure's message) failed for good; with the
    identity of the worker that ran it."""
    effect = request.effect if request else None
    if isinstance(outcome, str):
        status, detail, ran = "failed", outcome, _ran([])
    else:
        status, ran = outcome.status.value, _ran(outcome.results)
        detail = outcome.note or (effect.reason if effect else "")
        if effect is not None:
            w.effect_status[effect.id] = status
    w.record(
        "effect_applied",
        identity=w.attrs.identity or None,
        effect_id=effect.id if effect else None,
        effect_kind=effect.kind.value if effect else None,
        status=status,
        detail=detail,
        **ran,
    )


def _verified(w: _Walker, request: VerifyRequest | None, result: VerifyResult) -> None:
    on = f" on {','.join(result.nodes)}" if result.nodes else ""
    job = request.job_id if request else None
    w.record(
        "verification",
        status="running" if result.running else (result.state or "not running"),
        detail=f"job {job} {result.state}{on}: {result.detail}".rstrip(": "),
    )


def _consistency(w: _Walker, _: ConsistencyRequest | None, report: ConsistencyReport) -> None:
    w.record("consistency", **_ran(report.results), detail=report.summary)


def _reserved(
    w: _Walker,
    request: ReserveIsolation | ReserveRestart | None,
    grant: IsolationGrant | RestartGrant,
) -> None:
    what = _reserving(request.request if request else None)
    status = "granted" if grant.granted else "refused"
    w.record("reservation", status=status, detail=f"{what}: {grant.reason}")


def _notified(w: _Walker, request: Notification | None, result: NotifyResult | str) -> None:
    event = request.event.value if request else None
    if isinstance(result, str):  # out of retries: the news reached no one, the trail says so
        w.record("notification", status="failed", detail=f"{event}: {result}")
        return
    status = "delivered" if result.delivered else "not sent"
    w.record("notification", status=status, detail=f"{event}: {result.detail}".rstrip(": "))


def _decided(w: _Walker, payload: DecisionPayload, _: None, failure: str | None) -> None:
    decision = payload.decision
    w.record(
        "decision_refused" if failure is not None else "decision",
        who=payload.by or None,
        approve=decision == "approve" if decision else None,
        action=payload.action,
        comment=payload.comment or None,
        detail=failure or f"{decision} {payload.action}",
        **w.sender,
    )


def _changed(
    w: _Walker, request: SetModeRequest | SetPolicyRequest, _: None, failure: str | None
) -> None:
    """An operator's mode or policy change; what it set holds for the records after it."""
    if isinstance(request, SetModeRequest):
        kind, detail = "mode_change", f"mode {request.mode.value}: {request.reason}"
        if failure is None:
            w.mode = request.mode.value
    else:
        version = request.policy.version
        kind, detail = "policy_change", f"policy {version}: {request.reason}".rstrip(": ")
        if failure is None:
            w.policy_version = version or w.policy_version
    status = "failed" if failure is not None else "applied"
    w.record(kind, who=request.by or None, status=status, detail=failure or detail, **w.sender)


def _reservation(
    w: _Walker,
    request: IsolationRequest | RestartRequest,
    grant: IsolationGrant | RestartGrant | None,
    failure: str | None,
) -> None:
    status = (
        "failed" if failure is not None else "granted" if grant and grant.granted else "refused"
    )
    reason = grant.reason if grant else ""
    incident = request.incident_id
    detail = failure or f"{_reserving(request)}: {reason}"
    w.record("reservation", incident=incident, status=status, detail=detail, **w.sender)
    if isinstance(grant, IsolationGrant) and grant.breaker_tripped:
        w.mode = "monitor"
        detail = f"breaker tripped: {reason}"
        w.record("mode_change", who="trainmedic:breaker", incident=incident, detail=detail)


@dataclass(frozen=True)
class _Activity(Generic[Req, Res]):
    """How one activity is audited: its models, and what it records when it completes
    (or fails for good: given the failure's message, usually by the same function)."""

    request: type[Req]
    result: type[Res]
    completed: Callable[[_Walker, Req | None, Res], None]
    failed: Callable[[_Walker, Req | None, str], None] | None = None


@dataclass(frozen=True)
class _Update(Generic[Req, Res]):
    """How one workflow update is audited: its payload's and result's models (None: its
    result is not read), and what it records given the failure's message (None: done)."""

    request: type[Req]
    result: type[Res] | None
    record: Callable[[_Walker, Req, Res | None, str | None], None]


# By activity type (the @activity.defn names), with the models of the activity's
# signature (tests/unit/test_audit.py holds the two to each other).
_ACTIVITIES: dict[str, _Activity[Any, Any]] = {
    "control_snapshot": _Activity(ControlRef, ControlState, _snapshot),
    "attribute": _Activity(AttributionRequest, Diagnosis, _attributed),
    "apply_effect": _Activity(ApplyEffectRequest, EffectOutcome, _applied, _applied),
    "verify_job": _Activity(VerifyRequest, VerifyResult, _verified),
    "check_consistency": _Activity(ConsistencyRequest, ConsistencyReport, _consistency),
    "reserve_isolation": _Activity(ReserveIsolation, IsolationGrant, _reserved),
    "reserve_restart": _Activity(ReserveRestart, RestartGrant, _reserved),
    "notify": _Activity(Notification, NotifyResult, _notified, _notified),
}

# By update name; any other update is recorded as a "signal" with its payload's `by`.
_UPDATES: dict[str, _Update[Any, Any]] = {
    "decide": _Update(DecisionPayload, None, _decided),
    "set_mode": _Update(SetModeRequest, None, _changed),
    "set_policy": _Update(SetPolicyRequest, None, _changed),
    "reserve_isolation": _Update(IsolationRequest, IsolationGrant, _reservation),
    "reserve_restart": _Update(RestartRequest, RestartGrant, _reservation),
}


# One decoder per event kind (HistoryEvent's `attributes`); other events say nothing.
_EVENTS: dict[str, Callable[[_Walker, Any], None]] = {
    "workflow_execution_started": _Walker.started,
    "upsert_workflow_search_attributes": _Walker.search_attributes,
    "activity_task_scheduled": _Walker.activity_scheduled,
    "activity_task_completed": _Walker.activity_completed,
    "activity_task_failed": _Walker.activity_failed,
    "workflow_execution_signaled": _Walker.signaled,
    "workflow_execution_update_accepted": _Walker.update_accepted,
    "workflow_execution_update_completed": _Walker.update_completed,
    "workflow_properties_modified": _Walker.memo,
    "workflow_execution_cancel_requested": _Walker.cancel_requested,
    "workflow_execution_completed": _Walker.completed,
    "workflow_execution_failed": lambda w, a: w.closed("failed", _failure_message(a.failure)),
    "workflow_execution_canceled": lambda w, a: w.closed("cancelled", "workflow cancelled"),
    "workflow_execution_terminated": lambda w, a: w.closed(
        "terminated", a.reason or "terminated", **_sender(a.identity)
    ),
    "workflow_execution_timed_out": lambda w, a: w.closed("timed_out", "workflow timed out"),
}


def records_from_history(history: WorkflowHistory) -> list[AuditRecord]:
    """Every audited fact of one workflow run, in history order. Pure."""
    return _Walker(history.workflow_id).walk(history.events)


# ------------------------------------------------------------------------ export


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """'2h' / '30m' / '1d' (ago), or an ISO time (naive = UTC). Raises AuditError."""
    now = now or datetime.now(UTC)
    value = text.strip()
    try:
        ago = parse_duration(value)
    except ValueError:
        ago = None
    if isinstance(ago, timedelta):
        return now - ago
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise AuditError(
            f"--since {text!r}: give a duration back from now (30m, 2h, 1d) or an ISO time "
            "(2025-03-12T10:00:00Z)"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def visibility_query(since: datetime | None) -> str:
    types = f'WorkflowType IN ("{RECOVERY}","{CONTROL}")'
    if since is None:
        return types
    stamp = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # A run started before `since` still counts if it is open or closed after it: the
    # ControlWorkflow lives for weeks, and its recent changes belong in the export.
    return (
        f'{types} AND (StartTime >= "{stamp}" OR CloseTime >= "{stamp}" '
        'OR ExecutionStatus = "Running")'
    )


async def _history(client: Client, workflow_id: str, run_id: str | None) -> WorkflowHistory:
    try:
        return await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise AuditError(
                f"no workflow {workflow_id!r} in namespace {client.namespace}"
            ) from None
        raise ServiceError(f"reading the history of {workflow_id}: {error}") from None


async def export(
    client: Client, since: datetime | None = None, incident: str | None = None
) -> AsyncIterator[AuditRecord]:
    """Audit records of one workflow (`incident`, every run of it), or of every
    Recovery/Control workflow visibility knows (newest first, history order within).

    Visibility is eventually consistent: a workflow started a moment ago may be missing
    from a listing; asking for it by id reads its history directly.
    """
    runs: Iterable[tuple[str, str | None]]
    if incident:
        runs = await _runs_of(client, incident)
    else:
        query = visibility_query(since)
        try:
            runs = [(w.id, w.run_id) async for w in client.list_workflows(query)]
        except RPCError as error:
            raise ServiceError(f"listing workflows ({query}): {error}") from None
    for workflow_id, run_id in runs:
        history = await _history(client, workflow_id, run_id)
        for record in records_from_history(history):
            if since is None or record.time >= since:
                yield record


async def _runs_of(client: Client, workflow_id: str) -> list[tuple[str, str | None]]:
    """Every run of one workflow id, oldest first (continue-as-new makes several)."""
    query = f'WorkflowId = "{workflow_id}"'
    try:
        listed = [(w.start_time, w.id, w.run_id) async for w in client.list_workflows(query)]
    except RPCError:
        listed = []
    if not listed:
        return [(workflow_id, None)]  # not visible yet: the latest run, read directly
    return [(wid, rid) for _, wid, rid in sorted(listed, key=lambda item: item[0])]
