"""The audit trail, read back from workflow histories.

Every decision and effect of trainmedic is recorded in a Temporal history: operator
signals and updates (with the event's identity), the memo upserts the RecoveryWorkflow
makes at each step, the activities that changed Slurm (with the exact argv and what it
found before and after), and the ControlWorkflow's mode, policy and reservation updates.
`records_from_history` turns one history into flat `AuditRecord`s (pure: no I/O), and
`export` walks the workflows visibility lists. Histories are read, never trusted to a
shape: a field an older version did not write is simply absent from the record.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

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


def decode_payloads(payloads: list[Payload] | Any) -> list[Any]:
    """JSON values of Temporal payloads, without knowing their Python types."""
    return list(pydantic_data_converter.payload_converter.from_payloads(list(payloads)))


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


# ----------------------------------------------------------------------- helpers


def _decode_all(payloads: Any) -> list[Any]:
    try:
        return decode_payloads(payloads.payloads)
    except Exception as error:  # a foreign or encrypted payload must not stop the audit
        logger.warning("undecodable payloads in history: %s", error)
        return []


def _first(payloads: Any) -> Any:
    values = _decode_all(payloads)
    return values[0] if values else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def evidence_line(item: dict[str, Any]) -> str:
    """'kernel gpu02 gpu3 [rule]: text' or 'log /path:12 rank 3: text'."""
    where: list[str] = [str(item.get("source") or "?")]
    if item.get("file"):
        where.append(f"{item['file']}:{item['line_no']}" if item.get("line_no") else item["file"])
    if item.get("node"):
        where.append(str(item["node"]))
    if item.get("rank") is not None:
        where.append(f"rank {item['rank']}")
    if item.get("gpu") is not None:
        where.append(f"gpu{item['gpu']}")
    if item.get("rule_id"):
        where.append(f"[{item['rule_id']}]")
    return f"{' '.join(where)}: {item.get('text', '')}"


def _results(raw: Any) -> list[EffectResult]:
    out: list[EffectResult] = []
    for item in raw or []:
        try:
            out.append(EffectResult.model_validate(item))
        except ValidationError:
            logger.warning("unreadable effect result in history: %r", item)
    return out


def _event_time(event: HistoryEvent) -> datetime:
    return event.event_time.ToDatetime(tzinfo=UTC)


def _failure_message(failure: Any) -> str:
    message = failure.message
    cause = failure.cause if failure.HasField("cause") else None
    while cause is not None and cause.message:
        message = f"{message}: {cause.message}"
        cause = cause.cause if cause.HasField("cause") else None
    return str(message)


class _Walker:
    """State carried across one history's events."""

    def __init__(self, history: WorkflowHistory) -> None:
        self.history = history
        self.workflow_id = history.workflow_id
        self.run_id = ""
        self.workflow_type = ""
        self.cluster: str | None = None
        self.stage: str | None = None
        self.mode: str | None = None
        self.policy_version: str | None = None
        self.catalog_version: str | None = None
        self.records: list[AuditRecord] = []
        self.scheduled: dict[int, tuple[str, Any]] = {}  # event id -> (activity, input)
        self.accepted: dict[int, tuple[HistoryEvent, str, Any]] = {}  # update accepted
        self.effect_status: dict[str, str] = {}
        self.effect_kinds: dict[str, str] = {}
        self.decision_signals: list[AuditRecord] = []
        self.memo_decisions: list[dict[str, Any]] = []
        self.has_diagnosis = False
        self.has_outcome = False

    def record(self, event: HistoryEvent, kind: str, **fields: Any) -> AuditRecord:
        fields.setdefault("incident", self.workflow_id if self.workflow_type == RECOVERY else None)
        fields.setdefault("stage", self.stage)
        fields.setdefault("mode", self.mode)
        fields.setdefault("policy_version", self.policy_version)
        rec = AuditRecord(
            time=_event_time(event),
            kind=kind,
            workflow_id=self.workflow_id,
            run_id=self.run_id,
            workflow_type=self.workflow_type,
            event_id=event.event_id,
            cluster=self.cluster,
            **fields,
        )
        self.records.append(rec)
        return rec

    # ------------------------------------------------------------------ events

    def walk(self) -> list[AuditRecord]:
        for event in self.history.events:
            kind = event.WhichOneof("attributes")
            if kind is None:
                continue
            handler = getattr(self, f"on_{kind}", None)
            if handler is not None:
                handler(event, getattr(event, kind))
        self.settle_signals()
        return self.records

    def on_workflow_execution_started_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        self.workflow_type = a.workflow_type.name
        self.run_id = a.original_execution_run_id or ""
        request = _dict(_first(a.input))
        self.cluster = request.get("cluster")
        if self.workflow_type == CONTROL:
            state = _dict(request.get("state"))
            policy = _dict(state.get("policy") or request.get("policy"))
            self.policy_version = policy.get("version")
            self.mode = state.get("mode") or _dict(policy.get("mode")).get("default") or "monitor"
            if not state:  # a fresh start (not a continue-as-new) sets the initial mode
                self.record(
                    event,
                    "mode_change",
                    who="trainmedic:start",
                    identity=a.identity or None,
                    via="start",
                    detail="initial mode from policy",
                )
            return
        if self.workflow_type != RECOVERY:
            return
        signal = _dict(request.get("signal"))
        nodes = list(request.get("nodes") or [])
        job = request.get("job_id")
        about = f"job {job}" if job else "no job"
        self.record(
            event,
            "incident_started",
            identity=a.identity or None,
            unverified_identity=not a.identity,
            via="start",
            mode=request.get("mode"),
            culprit_nodes=nodes,
            evidence=[evidence_line(_dict(e)) for e in signal.get("evidence") or []],
            detail=(
                f"{signal.get('source', 'manual')}/{signal.get('kind', 'report')} "
                f"({about}, nodes {','.join(nodes) or 'none'}): {signal.get('detail', '')}"
            ).strip(),
        )

    def on_upsert_workflow_search_attributes_event_attributes(
        self, event: HistoryEvent, a: Any
    ) -> None:
        fields = a.search_attributes.indexed_fields
        for name, attr in (("TmStage", "stage"), ("TmMode", "mode"), ("TmCluster", "cluster")):
            if name in fields:
                try:
                    value = decode_payload(fields[name])
                except Exception:  # an odd attribute is not worth failing for
                    continue
                if isinstance(value, list):
                    value = value[0] if value else None
                if value:
                    setattr(self, attr, str(value))

    def on_activity_task_scheduled_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        self.scheduled[event.event_id] = (a.activity_type.name, _first(a.input))

    def on_activity_task_completed_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        name, request = self.scheduled.get(a.scheduled_event_id, ("", None))
        result = _dict(_first(a.result))
        request = _dict(request)
        if name == "control_snapshot":
            self.policy_version = _dict(result.get("policy")).get("version") or self.policy_version
        elif name == "attribute":
            self.diagnosis(event, result)
        elif name == "apply_effect":
            effect = _dict(request.get("effect"))
            results = _results(result.get("results"))
            effect_id = effect.get("id")
            status = result.get("status")
            if effect_id and status:
                self.effect_status[effect_id] = status
            self.record(
                event,
                "effect_applied",
                identity=a.identity or None,
                effect_id=effect_id,
                effect_kind=effect.get("kind"),
                status=status,
                commands=[r.command for r in results if r.command],
                results=results,
                detail=result.get("note") or effect.get("reason") or "",
            )
        elif name == "verify_job":
            nudged = _results(result.get("nudged"))
            running = bool(result.get("running"))
            nodes = ",".join(result.get("nodes") or [])
            self.record(
                event,
                "verification",
                status="running" if running else str(result.get("state") or "not running"),
                commands=[r.command for r in nudged if r.command],
                results=nudged,
                detail=(
                    f"job {request.get('job_id')} {result.get('state', '')}"
                    f"{' on ' + nodes if nodes else ''}: {result.get('detail', '')}"
                ).rstrip(": "),
            )
        elif name == "check_consistency":
            checked = _results(result.get("results"))
            self.record(
                event,
                "consistency",
                commands=[r.command for r in checked if r.command],
                results=checked,
                detail=result.get("summary", ""),
            )
        elif name in ("reserve_isolation", "reserve_restart"):
            inner = _dict(request.get("request"))
            what = (
                f"isolate {inner.get('node')} (partition {inner.get('partition')})"
                if name == "reserve_isolation"
                else f"restart job {inner.get('job_id')} ({inner.get('cause')})"
            )
            granted = bool(result.get("granted"))
            self.record(
                event,
                "reservation",
                status="granted" if granted else "refused",
                detail=f"{what}: {result.get('reason', '')}",
            )
        elif name == "notify":
            sent = _dict(request)
            self.record(
                event,
                "notification",
                status="delivered" if result.get("delivered") else "not sent",
                detail=f"{sent.get('event')}: {result.get('detail', '')}".rstrip(": "),
            )

    def on_activity_task_failed_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        name, request = self.scheduled.get(a.scheduled_event_id, ("", None))
        if name == "notify":
            # Out of retries: the news did not reach anyone, and the trail says so.
            self.record(
                event,
                "notification",
                status="failed",
                detail=f"{_dict(request).get('event')}: {_failure_message(a.failure)}",
            )
            return
        if name != "apply_effect":
            return
        effect = _dict(_dict(request).get("effect"))
        self.record(
            event,
            "effect_applied",
            identity=a.identity or None,
            effect_id=effect.get("id"),
            effect_kind=effect.get("kind"),
            status="failed",
            detail=_failure_message(a.failure),
        )

    def on_workflow_execution_signaled_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        payload = _dict(_first(a.input))
        identity = a.identity or None
        if a.signal_name in ("approve", "reject"):
            rec = self.record(
                event,
                "decision",
                who=payload.get("by") or None,
                identity=identity,
                unverified_identity=not identity,
                via="signal",
                approve=a.signal_name == "approve",
                action=payload.get("action", "all"),
                comment=payload.get("comment") or None,
                detail=f"{a.signal_name} {payload.get('action', 'all')}",
            )
            self.decision_signals.append(rec)
            return
        self.record(
            event,
            "signal",
            who=payload.get("by") or None,
            identity=identity,
            unverified_identity=not identity,
            via="signal",
            evidence=[evidence_line(_dict(e)) for e in payload.get("evidence") or []],
            detail=f"{a.signal_name}: {payload.get('detail') or payload}",
        )

    def on_workflow_execution_update_accepted_event_attributes(
        self, event: HistoryEvent, a: Any
    ) -> None:
        request = a.accepted_request
        args = _decode_all(request.input.args)
        self.accepted[event.event_id] = (event, request.input.name, args[0] if args else None)

    def on_workflow_execution_update_completed_event_attributes(
        self, event: HistoryEvent, a: Any
    ) -> None:
        accepted_event, name, payload = self.accepted.pop(a.accepted_event_id, (None, "", None))
        if accepted_event is None:
            return
        identity = accepted_event.workflow_execution_update_accepted_event_attributes
        who_identity = identity.accepted_request.meta.identity or None
        failed = a.outcome.HasField("failure")
        result = None if failed else _dict(_first(a.outcome.success))
        self.update(accepted_event, name, _dict(payload), who_identity, result, a, failed)

    def update(
        self,
        event: HistoryEvent,
        name: str,
        payload: dict[str, Any],
        identity: str | None,
        result: dict[str, Any] | None,
        completed: Any,
        failed: bool,
    ) -> None:
        failure = _failure_message(completed.outcome.failure) if failed else ""
        common: dict[str, Any] = {
            "identity": identity,
            "unverified_identity": not identity,
            "via": "update",
        }
        if name == "decide":
            decision = payload.get("decision")
            self.record(
                event,
                "decision_refused" if failed else "decision",
                who=payload.get("by") or None,
                approve=decision == "approve" if decision else None,
                action=payload.get("action", "all"),
                comment=payload.get("comment") or None,
                detail=failure or f"{decision} {payload.get('action', 'all')}",
                **common,
            )
        elif name == "set_mode":
            if not failed:
                self.mode = payload.get("mode") or self.mode
            self.record(
                event,
                "mode_change",
                who=payload.get("by") or None,
                status="failed" if failed else "applied",
                detail=failure or f"mode {payload.get('mode')}: {payload.get('reason', '')}",
                **common,
            )
        elif name == "set_policy":
            policy = _dict(payload.get("policy"))
            if not failed:
                self.policy_version = policy.get("version") or self.policy_version
            self.record(
                event,
                "policy_change",
                who=payload.get("by") or None,
                status="failed" if failed else "applied",
                detail=failure
                or f"policy {policy.get('version')}: {payload.get('reason', '')}".rstrip(": "),
                **common,
            )
        elif name in ("reserve_isolation", "reserve_restart"):
            granted = bool((result or {}).get("granted"))
            what = (
                f"isolate {payload.get('node')} (partition {payload.get('partition')})"
                if name == "reserve_isolation"
                else f"restart job {payload.get('job_id')} ({payload.get('cause')})"
            )
            self.record(
                event,
                "reservation",
                incident=payload.get("incident_id"),
                status="failed" if failed else ("granted" if granted else "refused"),
                detail=failure or f"{what}: {(result or {}).get('reason', '')}",
                **common,
            )
            if result and result.get("breaker_tripped"):
                self.mode = "monitor"
                self.record(
                    event,
                    "mode_change",
                    who="trainmedic:breaker",
                    incident=payload.get("incident_id"),
                    detail=f"breaker tripped: {result.get('reason', '')}",
                )
        else:
            self.record(
                event,
                "signal",
                who=payload.get("by") or None,
                detail=failure or f"update {name}",
                **common,
            )

    def on_workflow_properties_modified_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        fields = a.upserted_memo.fields
        for key in ("diagnosis", "effects", "decisions", "outcome"):
            if key not in fields:
                continue
            try:
                value = decode_payload(fields[key])
            except Exception:  # see _decode_all
                continue
            if key == "diagnosis" and not self.has_diagnosis:
                self.diagnosis(event, _dict(value))
            elif key == "effects":
                self.effects(event, value if isinstance(value, list) else [])
            elif key == "decisions":
                self.decisions(event, value if isinstance(value, list) else [])
            elif key == "outcome" and not self.has_outcome:
                outcome = _dict(value)
                self.has_outcome = True
                self.record(
                    event,
                    "outcome",
                    stage="done",
                    status=outcome.get("outcome"),
                    detail=outcome.get("summary", ""),
                )

    def diagnosis(self, event: HistoryEvent, diagnosis: dict[str, Any]) -> None:
        if not diagnosis or self.has_diagnosis:
            return
        self.has_diagnosis = True
        self.catalog_version = diagnosis.get("catalog_version")
        confidence = diagnosis.get("confidence")
        self.record(
            event,
            "diagnosis",
            stage="attribute",
            category=diagnosis.get("category"),
            action=diagnosis.get("action"),
            culprit_nodes=list(diagnosis.get("culprit_nodes") or []),
            evidence=[evidence_line(_dict(e)) for e in diagnosis.get("evidence") or []],
            rule_ids=list(diagnosis.get("rule_ids") or []),
            catalog_version=self.catalog_version,
            detail=(
                f"{diagnosis.get('category')} -> {diagnosis.get('action')}"
                f" (confidence {confidence}): {diagnosis.get('summary', '')}"
            ),
        )

    def effects(self, event: HistoryEvent, effects: list[Any]) -> None:
        for raw in effects:
            effect = _dict(raw)
            effect_id = effect.get("id")
            status = effect.get("status")
            if not effect_id or not status:
                continue
            fields: dict[str, Any] = {
                "effect_id": effect_id,
                "effect_kind": effect.get("kind"),
                "status": status,
                "mode": effect.get("mode") or self.mode,
                "catalog_version": self.catalog_version,
            }
            if effect_id not in self.effect_kinds:
                self.effect_kinds[effect_id] = effect.get("kind") or ""
                self.effect_status[effect_id] = status
                self.record(
                    event,
                    "effect_planned",
                    detail=f"{effect.get('reason', '')} {effect.get('note', '')}".strip(),
                    **fields,
                )
            elif self.effect_status.get(effect_id) != status:
                self.effect_status[effect_id] = status
                results = _results(effect.get("results"))
                self.record(
                    event,
                    "effect_status",
                    commands=[r.command for r in results if r.command],
                    results=results,
                    detail=effect.get("note", ""),
                    **fields,
                )

    def decisions(self, event: HistoryEvent, decisions: list[Any]) -> None:
        # Each memo holds the whole list. Operator decisions were recorded from their
        # signal or update event (which carries the identity); only timeouts are new here.
        for raw in decisions[len(self.memo_decisions) :]:
            decision = _dict(raw)
            if decision.get("via") == "timeout":
                self.record(
                    event,
                    "decision",
                    who=decision.get("by"),
                    via="timeout",
                    approve=decision.get("approve"),
                    action=decision.get("action"),
                    effect_id=",".join(decision.get("effect_ids") or []) or None,
                    comment=decision.get("comment") or None,
                    detail=decision.get("comment", ""),
                )
        self.memo_decisions = [_dict(d) for d in decisions]

    def on_workflow_execution_cancel_requested_event_attributes(
        self, event: HistoryEvent, a: Any
    ) -> None:
        self.record(
            event,
            "cancel_requested",
            identity=a.identity or None,
            unverified_identity=not a.identity,
            detail=a.cause or "cancellation requested",
        )

    def on_workflow_execution_completed_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        if a.new_execution_run_id:
            return  # continue-as-new: the next run carries on
        if self.workflow_type != RECOVERY:
            return
        result = _dict(_first(a.result))
        if isinstance(result.get("decisions"), list):
            self.memo_decisions = [_dict(d) for d in result["decisions"]]
        if self.has_outcome:
            return
        self.has_outcome = True
        self.record(
            event,
            "outcome",
            stage="done",
            status=result.get("outcome"),
            detail=result.get("summary", ""),
        )

    def on_workflow_execution_failed_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        self.closed(event, "failed", _failure_message(a.failure))

    def on_workflow_execution_canceled_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        self.closed(event, "cancelled", "workflow cancelled")

    def on_workflow_execution_terminated_event_attributes(
        self, event: HistoryEvent, a: Any
    ) -> None:
        self.closed(
            event,
            "terminated",
            a.reason or "terminated",
            identity=a.identity or None,
            unverified_identity=not a.identity,
        )

    def on_workflow_execution_timed_out_event_attributes(self, event: HistoryEvent, a: Any) -> None:
        self.closed(event, "timed_out", "workflow timed out")

    def closed(self, event: HistoryEvent, status: str, detail: str, **fields: Any) -> None:
        if self.has_outcome:
            return
        self.has_outcome = True
        self.record(event, "outcome", stage="done", status=status, detail=detail, **fields)

    def settle_signals(self) -> None:
        """A decision signal the workflow refused (it cannot answer a signal) is one
        that never reached the workflow's own list of decisions."""
        taken = [d for d in self.memo_decisions if d.get("via") == "signal"]
        for rec in self.decision_signals:
            match = next(
                (
                    d
                    for d in taken
                    if d.get("by") == (rec.who or "")
                    and d.get("action") == rec.action
                    and d.get("approve") == rec.approve
                ),
                None,
            )
            if match is not None:
                taken.remove(match)
                rec.effect_id = ",".join(match.get("effect_ids") or []) or None
            elif self.has_outcome:
                rec.kind = "decision_refused"
                rec.detail = f"{rec.detail}: not taken by the workflow (see its `ignored` list)"
            else:
                rec.detail = f"{rec.detail}: not (yet) in the workflow's decisions"


def records_from_history(history: WorkflowHistory) -> list[AuditRecord]:
    """Every audited fact of one workflow run, in history order. Pure."""
    return _Walker(history).walk()


# ------------------------------------------------------------------------ export

_AGO = re.compile(r"^\s*\d")


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
        runs = await _listed(client, since)
    for workflow_id, run_id in runs:
        history = await _history(client, workflow_id, run_id)
        for record in records_from_history(history):
            if since is None or record.time >= since:
                yield record


async def _listed(client: Client, since: datetime | None) -> list[tuple[str, str | None]]:
    query = visibility_query(since)
    try:
        return [(w.id, w.run_id) async for w in client.list_workflows(query)]
    except RPCError as error:
        raise ServiceError(f"listing workflows ({query}): {error}") from None


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
