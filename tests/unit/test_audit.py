"""records_from_history and the export helpers, on histories built event by event.

The events are the protobufs Temporal itself stores, with payloads encoded by the same
converter the workers use, so the walker sees exactly what it sees in production.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio import activity, workflow
from temporalio.api.common.v1 import Memo, Payload, Payloads, SearchAttributes, WorkflowType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history import v1 as h
from temporalio.api.update.v1 import Input, Meta, Outcome, Request
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from trainmedic.activities.attribution import AttributionActivities
from trainmedic.activities.control import ControlActivities
from trainmedic.activities.notify import NotifyActivities
from trainmedic.activities.slurm import SlurmActivities
from trainmedic.audit import (
    _ACTIVITIES,
    _UPDATES,
    AuditError,
    AuditRecord,
    evidence_line,
    parse_since,
    records_from_history,
    visibility_query,
)
from trainmedic.domain import Evidence, EvidenceSource
from trainmedic.workflows.control import ControlWorkflow
from trainmedic.workflows.recovery import RecoveryWorkflow

T0 = datetime(2025, 3, 12, 10, 0, tzinfo=UTC)
CONVERTER = pydantic_data_converter.payload_converter
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
DRAIN_ARGV = ["scontrol", "update", "NodeName=gpu02", "State=DRAIN", "Reason=trainmedic i-1"]


def payloads(*values: Any) -> Payloads:
    return Payloads(payloads=CONVERTER.to_payloads(list(values)))


def payload(value: Any) -> Payload:
    return CONVERTER.to_payloads([value])[0]


class History:
    """Builds a history one event at a time, one second apart."""

    def __init__(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id
        self.events: list[h.HistoryEvent] = []

    def add(self, **attributes: Any) -> int:
        event_id = len(self.events) + 1
        stamp = Timestamp()
        stamp.FromDatetime((T0 + timedelta(seconds=event_id)).replace(tzinfo=None))
        self.events.append(h.HistoryEvent(event_id=event_id, event_time=stamp, **attributes))
        return event_id

    def started(self, workflow_type: str, request: dict[str, Any], identity: str = "") -> None:
        self.add(
            workflow_execution_started_event_attributes=h.WorkflowExecutionStartedEventAttributes(
                workflow_type=WorkflowType(name=workflow_type),
                input=payloads(request),
                identity=identity,
                original_execution_run_id="run-1",
            )
        )

    def stage(self, stage: str) -> None:
        self.add(
            upsert_workflow_search_attributes_event_attributes=(
                h.UpsertWorkflowSearchAttributesEventAttributes(
                    search_attributes=SearchAttributes(indexed_fields={"TmStage": payload(stage)})
                )
            )
        )

    def memo(self, **fields: Any) -> None:
        self.add(
            workflow_properties_modified_event_attributes=h.WorkflowPropertiesModifiedEventAttributes(
                upserted_memo=Memo(fields={key: payload(value) for key, value in fields.items()})
            )
        )

    def activity(self, name: str, request: Any, result: Any, identity: str = "w@host") -> None:
        from temporalio.api.common.v1 import ActivityType as ProtoActivityType

        scheduled = self.add(
            activity_task_scheduled_event_attributes=h.ActivityTaskScheduledEventAttributes(
                activity_type=ProtoActivityType(name=name), input=payloads(request)
            )
        )
        self.add(
            activity_task_completed_event_attributes=h.ActivityTaskCompletedEventAttributes(
                scheduled_event_id=scheduled, result=payloads(result), identity=identity
            )
        )

    def signal(self, name: str, value: dict[str, Any], identity: str = "") -> None:
        self.add(
            workflow_execution_signaled_event_attributes=h.WorkflowExecutionSignaledEventAttributes(
                signal_name=name, input=payloads(value), identity=identity
            )
        )

    def update(
        self,
        name: str,
        value: dict[str, Any],
        identity: str,
        result: Any = None,
        failure: str | None = None,
    ) -> None:
        accepted = self.add(
            workflow_execution_update_accepted_event_attributes=(
                h.WorkflowExecutionUpdateAcceptedEventAttributes(
                    protocol_instance_id="u1",
                    accepted_request=Request(
                        meta=Meta(update_id="u1", identity=identity),
                        input=Input(name=name, args=payloads(value)),
                    ),
                )
            )
        )
        outcome = (
            Outcome(failure=Failure(message=failure))
            if failure
            else Outcome(success=payloads(result))
        )
        self.add(
            workflow_execution_update_completed_event_attributes=(
                h.WorkflowExecutionUpdateCompletedEventAttributes(
                    accepted_event_id=accepted, outcome=outcome, meta=Meta(update_id="u1")
                )
            )
        )

    def completed(self, result: Any) -> None:
        self.add(
            workflow_execution_completed_event_attributes=h.WorkflowExecutionCompletedEventAttributes(
                result=payloads(result)
            )
        )

    def records(self) -> list[AuditRecord]:
        return records_from_history(WorkflowHistory(self.workflow_id, self.events))


def effect(effect_id: str, status: str, **extra: Any) -> dict[str, Any]:
    kind = "drain_node" if effect_id.startswith("drain") else "requeue_excluding"
    return {
        "id": effect_id,
        "kind": kind,
        "reason": "trainmedic i-1",
        "mode": "approve",
        "status": status,
        **extra,
    }


DIAGNOSIS = {
    "category": "gpu_hardware",
    "action": "drain_and_restart",
    "culprit_nodes": ["gpu02"],
    "confidence": 0.9,
    "evidence": [
        {"source": "kernel", "text": XID, "node": "gpu02", "gpu": 3, "rule_id": "kernel.xid_79"}
    ],
    "rule_ids": ["kernel.xid_79"],
    "catalog_version": "2025.11.1",
    "summary": "Xid 79",
}
DRAIN_RESULT = {
    "command": DRAIN_ARGV,
    "changed": True,
    "detail": "gpu02 set to drain",
    "before": "MIXED",
    "after": "MIXED+DRAIN",
}


def approve_incident(decisions: list[dict[str, Any]]) -> History:
    """An approve-mode incident: alice approves from the UI, mallory's reject comes late."""
    hist = History("incident-lab-42-1")
    hist.started(
        "RecoveryWorkflow",
        {
            "cluster": "lab",
            "job_id": "42",
            "nodes": ["gpu02"],
            "signal": {
                "source": "nvml",
                "kind": "xid",
                "nodes": ["gpu02"],
                "detail": "Xid 79",
                "evidence": [{"source": "kernel", "text": XID, "node": "gpu02"}],
            },
        },
        identity="watcher@ctl",
    )
    hist.activity(
        "control_snapshot",
        {"cluster": "lab"},
        {"cluster": "lab", "mode": "approve", "policy": {"version": "p-7"}},
    )
    hist.stage("attribute")
    hist.activity("attribute", {"job_id": "42"}, DIAGNOSIS)
    hist.memo(diagnosis=DIAGNOSIS)
    hist.memo(effects=[effect("drain-gpu02", "planned"), effect("requeue-42", "planned")])
    hist.stage("gate")
    hist.signal("approve", {"action": "all", "by": "alice", "comment": "go"})
    hist.stage("isolate")
    hist.activity(
        "apply_effect",
        {"incident_id": "incident-lab-42-1", "effect": effect("drain-gpu02", "approved")},
        {"status": "applied", "note": "", "results": [DRAIN_RESULT]},
    )
    hist.memo(
        effects=[
            effect("drain-gpu02", "applied", results=[DRAIN_RESULT]),
            effect("requeue-42", "rejected", note="rejected"),
        ],
        decisions=decisions,
    )
    hist.signal("reject", {"action": "requeue-42", "by": "mallory"}, identity="cli@laptop")
    hist.memo(outcome={"outcome": "recovered", "summary": "job 42 runs again on gpu03"})
    hist.completed(
        {
            "incident_id": "incident-lab-42-1",
            "outcome": "recovered",
            "summary": "job 42 runs again on gpu03",
            "decisions": decisions,
        }
    )
    return hist


ALICE = {
    "action": "all",
    "approve": True,
    "by": "alice",
    "comment": "go",
    "via": "signal",
    "effect_ids": ["drain-gpu02", "requeue-42"],
}


def by_kind(records: list[AuditRecord], kind: str) -> list[AuditRecord]:
    return [r for r in records if r.kind == kind]


def test_ui_approval_is_recorded_with_who_and_no_identity() -> None:
    records = approve_incident([ALICE]).records()
    [decision] = by_kind(records, "decision")
    assert (decision.who, decision.identity, decision.unverified_identity) == (
        "alice",
        None,
        True,
    )
    assert decision.approve is True and decision.via == "signal"
    assert decision.stage == "gate"
    assert decision.effect_id == "drain-gpu02,requeue-42"
    assert decision.incident == "incident-lab-42-1" and decision.cluster == "lab"
    assert decision.time == T0 + timedelta(seconds=decision.event_id)


def test_signal_the_workflow_did_not_take_is_a_refused_decision() -> None:
    records = approve_incident([ALICE]).records()
    [refused] = by_kind(records, "decision_refused")
    assert refused.who == "mallory"
    assert refused.identity == "cli@laptop" and refused.unverified_identity is False
    assert refused.approve is False and refused.action == "requeue-42"


def test_signal_with_no_matching_decision_is_refused_even_for_a_known_name() -> None:
    # Without alice's decision in the workflow's list, her signal was not taken either.
    records = approve_incident([]).records()
    assert [r.who for r in by_kind(records, "decision_refused")] == ["alice", "mallory"]


def test_effect_records_carry_argv_results_and_versions() -> None:
    records = approve_incident([ALICE]).records()
    [applied] = by_kind(records, "effect_applied")
    assert applied.effect_id == "drain-gpu02" and applied.status == "applied"
    assert applied.commands == [DRAIN_ARGV]
    assert applied.results[0].before == "MIXED" and applied.results[0].after == "MIXED+DRAIN"
    assert applied.stage == "isolate"
    assert applied.policy_version == "p-7"
    assert applied.identity == "w@host"
    planned = by_kind(records, "effect_planned")
    assert [r.effect_id for r in planned] == ["drain-gpu02", "requeue-42"]
    assert {r.catalog_version for r in planned} == {"2025.11.1"}
    # The drain's "applied" in the memo repeats the activity: not a second record.
    [changed] = by_kind(records, "effect_status")
    assert (changed.effect_id, changed.status) == ("requeue-42", "rejected")


def test_diagnosis_and_start_carry_evidence_lines() -> None:
    records = approve_incident([ALICE]).records()
    assert records[0].kind == "incident_started"
    assert records[0].identity == "watcher@ctl"
    assert records[0].evidence == [f"kernel gpu02: {XID}"]
    [diagnosis] = by_kind(records, "diagnosis")  # once, though activity and memo both say it
    assert diagnosis.evidence == [f"kernel gpu02 gpu3 [kernel.xid_79]: {XID}"]
    assert diagnosis.rule_ids == ["kernel.xid_79"]
    assert diagnosis.category == "gpu_hardware" and diagnosis.culprit_nodes == ["gpu02"]
    assert diagnosis.action == "drain_and_restart"


def test_one_outcome_at_the_end() -> None:
    records = approve_incident([ALICE]).records()
    [outcome] = by_kind(records, "outcome")
    assert outcome.status == "recovered" and "gpu03" in outcome.detail
    assert outcome.stage == "done"


def test_decide_update_records_identity_and_refusal() -> None:
    hist = History("incident-lab-7-1")
    hist.started("RecoveryWorkflow", {"cluster": "lab", "job_id": "7"})
    hist.stage("gate")
    hist.update(
        "decide",
        {"action": "all", "by": "bob", "decision": "reject"},
        "bob@cli",
        result={"incident_id": "incident-lab-7-1"},
    )
    hist.update(
        "decide",
        {"action": "x", "by": "eve", "decision": "approve"},
        "",
        failure="unknown action 'x'",
    )
    records = hist.records()
    [decision] = by_kind(records, "decision")
    assert (decision.who, decision.identity, decision.unverified_identity) == (
        "bob",
        "bob@cli",
        False,
    )
    assert decision.approve is False and decision.via == "update"
    [refused] = by_kind(records, "decision_refused")
    assert refused.who == "eve" and refused.unverified_identity is True
    assert refused.detail == "unknown action 'x'"


def test_timeout_decision_comes_from_the_memo() -> None:
    hist = History("incident-lab-9-1")
    hist.started("RecoveryWorkflow", {"cluster": "lab", "job_id": "9"})
    timeout = {
        "action": "drain-gpu01",
        "approve": False,
        "by": "trainmedic:timeout",
        "via": "timeout",
        "comment": "no decision within 0:30:00: escalate",
        "effect_ids": ["drain-gpu01"],
    }
    hist.memo(decisions=[timeout])
    hist.memo(decisions=[timeout])  # the whole list again: no second record
    [decision] = by_kind(hist.records(), "decision")
    assert decision.via == "timeout" and decision.who == "trainmedic:timeout"
    assert decision.effect_id == "drain-gpu01" and decision.approve is False


def control_state(mode: str, **extra: Any) -> dict[str, Any]:
    return {"cluster": "lab", "mode": mode, "policy": {"version": "p-1"}, **extra}


def test_control_history_mode_policy_and_breaker() -> None:
    hist = History("control-lab")
    hist.started(
        "ControlWorkflow",
        {"cluster": "lab", "policy": {"version": "p-1", "mode": {"default": "auto"}}},
    )
    hist.update(
        "set_mode",
        {"mode": "approve", "by": "carol", "reason": "night"},
        "carol@cli",
        result=control_state("approve"),
    )
    hist.update(
        "set_policy",
        {"policy": {"version": "p-2"}, "by": "worker@ctl"},
        "w@ctl",
        result=control_state("approve"),
    )
    grant = {"granted": False, "reason": "isolation budget spent", "breaker_tripped": True}
    hist.update(
        "reserve_isolation",
        {
            "incident_id": "incident-lab-1-1",
            "node": "gpu01",
            "partition": "gpu",
            "partition_size": 4,
        },
        "w@ctl",
        result=grant,
    )
    records = hist.records()
    assert [r.kind for r in records] == [
        "mode_change",
        "mode_change",
        "policy_change",
        "reservation",
        "mode_change",
    ]
    initial, carol, policy, reservation, breaker = records
    assert initial.who == "trainmedic:start" and initial.mode == "auto"
    assert carol.who == "carol" and carol.identity == "carol@cli"
    assert carol.mode == "approve" and carol.detail == "mode approve: night"
    assert policy.policy_version == "p-2" and policy.who == "worker@ctl"
    assert reservation.status == "refused" and reservation.incident == "incident-lab-1-1"
    assert breaker.who == "trainmedic:breaker" and breaker.mode == "monitor"
    assert all(r.incident is None for r in (initial, carol, policy))


def test_continued_control_run_has_no_initial_mode_record() -> None:
    hist = History("control-lab")
    hist.started("ControlWorkflow", {"cluster": "lab", "state": control_state("auto")})
    assert hist.records() == []


def test_undecodable_payload_does_not_stop_the_walk() -> None:
    hist = History("incident-lab-3-1")
    hist.started("RecoveryWorkflow", {"cluster": "lab"})
    hist.add(
        workflow_execution_signaled_event_attributes=h.WorkflowExecutionSignaledEventAttributes(
            signal_name="approve",
            input=Payloads(
                payloads=[Payload(metadata={"encoding": b"binary/encrypted"}, data=b"\x00")]
            ),
        )
    )
    records = hist.records()
    assert [r.kind for r in records] == ["incident_started", "decision"]
    assert records[1].who is None and records[1].unverified_identity is True


def test_evidence_line_formats_location() -> None:
    line = evidence_line(
        Evidence(source=EvidenceSource.LOG, file="/j/42.out", line_no=12, rank=3, text="boom")
    )
    assert line == "log /j/42.out:12 rank 3: boom"


def test_old_verify_result_with_nudged_reads_the_same() -> None:
    # VerifyResult lost its always-empty `nudged`; histories written before still carry it.
    hist = History("incident-lab-5-1")
    hist.started("RecoveryWorkflow", {"cluster": "lab", "job_id": "5"})
    request = {"incident_id": "incident-lab-5-1", "job_id": "5", "timeout_s": 60}
    result = {"running": True, "state": "RUNNING", "nodes": ["gpu03"], "nudged": []}
    hist.activity("verify_job", request, result)
    [verification] = by_kind(hist.records(), "verification")
    assert verification.status == "running" and verification.commands == []
    assert verification.detail == "job 5 RUNNING on gpu03"


def test_unreadable_activity_result_is_skipped_not_fatal() -> None:
    hist = History("incident-lab-6-1")
    hist.started("RecoveryWorkflow", {"cluster": "lab", "job_id": "6"})
    hist.activity("apply_effect", {"incident_id": "x"}, {"status": "no such status"})
    hist.activity("notify", {"event": "escalated"}, {"delivered": True})
    kinds = [r.kind for r in hist.records()]
    assert kinds == ["incident_started", "notification"]


@pytest.mark.parametrize("name", sorted(_ACTIVITIES))
def test_activity_table_matches_the_activity_definitions(name: str) -> None:
    """The audit reads each activity with the models of its signature, under the name
    it is registered (and scheduled) by."""
    methods = [
        AttributionActivities.attribute,
        ControlActivities.control_snapshot,
        ControlActivities.reserve_isolation,
        ControlActivities.reserve_restart,
        NotifyActivities.notify,
        SlurmActivities.apply_effect,
        SlurmActivities.verify_job,
        SlurmActivities.check_consistency,
    ]
    definitions = {d.name: d for d in map(activity._Definition.must_from_callable, methods)}
    definition, entry = definitions[name], _ACTIVITIES[name]
    assert (definition.arg_types, definition.ret_type) == ([entry.request], entry.result)


@pytest.mark.parametrize("name", sorted(_UPDATES))
def test_update_table_matches_the_workflow_updates(name: str) -> None:
    updates = {
        **workflow._Definition.must_from_class(ControlWorkflow).updates,
        **workflow._Definition.must_from_class(RecoveryWorkflow).updates,
    }
    entry = _UPDATES[name]
    update = updates[name]
    assert update.arg_types == [entry.request]
    if entry.result is not None:
        assert update.ret_type is entry.result


def test_parse_since_durations_and_times() -> None:
    now = datetime(2025, 3, 12, 12, 0, tzinfo=UTC)
    assert parse_since("2h", now) == now - timedelta(hours=2)
    assert parse_since("1h30m", now) == now - timedelta(minutes=90)
    assert parse_since("2025-03-12T10:00:00Z", now) == datetime(2025, 3, 12, 10, tzinfo=UTC)
    assert parse_since("2025-03-12T10:00:00", now).tzinfo is UTC


@pytest.mark.parametrize("bad", ["yesterday", "", "12:00pm", "-2h"])
def test_parse_since_rejects_garbage(bad: str) -> None:
    with pytest.raises(AuditError, match="--since"):
        parse_since(bad)


def test_visibility_query() -> None:
    assert visibility_query(None) == 'WorkflowType IN ("RecoveryWorkflow","ControlWorkflow")'
    query = visibility_query(datetime(2025, 3, 12, 10, tzinfo=UTC))
    assert 'StartTime >= "2025-03-12T10:00:00.000000Z"' in query
    assert 'ExecutionStatus = "Running"' in query
