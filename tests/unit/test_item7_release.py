"""`trainmedic incidents release NODE` needs a non-empty `--by`, like approve/reject, and
goes the way `trainmedic nodes release` goes: the quarantine's confirmed update."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateRPCTimeoutOrCancelledError
from typer.testing import CliRunner

from trainmedic.cli import incidents as incidents_cli
from trainmedic.workflows.quarantine import NodeQuarantineWorkflow, ReleasePayload


class FakeHandle:
    def __init__(self, status: WorkflowExecutionStatus) -> None:
        self.status = status
        self.updates: list[tuple[Any, Any]] = []
        self.signals: list[tuple[Any, Any]] = []
        self.controller_down = False

    async def describe(self) -> Any:
        return type("Described", (), {"status": self.status})()

    async def execute_update(self, update: Any, payload: Any, **_: Any) -> Any:
        self.updates.append((update, payload))
        if self.controller_down:
            raise WorkflowUpdateRPCTimeoutOrCancelledError()
        return type("Status", (), {"state": "checking", "details": "health check runs"})()

    async def signal(self, signal: Any, payload: Any) -> None:
        self.signals.append((signal, payload))


class FakeClient:
    def __init__(self, handle: FakeHandle) -> None:
        self.handle = handle
        self.ids: list[str] = []

    def get_workflow_handle_for(self, _run: Any, workflow_id: str) -> FakeHandle:
        self.ids.append(workflow_id)
        return self.handle


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient(FakeHandle(WorkflowExecutionStatus.RUNNING))

    async def connect(*_: Any, **__: Any) -> FakeClient:
        return fake

    monkeypatch.setattr(incidents_cli, "connect", connect)
    return fake


def invoke(*args: str) -> Any:
    return CliRunner().invoke(incidents_cli.app, list(args))


def test_release_sends_who_and_why(client: FakeClient) -> None:
    result = invoke("release", "gpu02", "--cluster", "prod", "--by", "alice", "--comment", "ok")
    assert result.exit_code == 0, result.output
    assert client.ids == ["node-prod-gpu02"]
    [(update, payload)] = client.handle.updates
    assert update is NodeQuarantineWorkflow.release_node  # confirmed, not fire-and-forget
    assert payload == ReleasePayload(by="alice", comment="ok")
    assert "gpu02: released by alice (node-prod-gpu02); now checking" in result.output


@pytest.mark.parametrize("by", [None, "", "   "])
def test_release_without_a_name_is_refused(client: FakeClient, by: str | None) -> None:
    args = ["release", "gpu02", "--cluster", "prod"] + ([] if by is None else ["--by", by])
    result = invoke(*args)
    assert result.exit_code == 2
    assert "--by" in result.output
    assert client.handle.updates == []


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_approve_and_reject_refuse_a_blank_name_too(client: FakeClient, verb: str) -> None:
    result = invoke(verb, "incident-prod-7-1", "--by", " ")
    assert result.exit_code == 2
    assert "--by" in result.output
    assert client.ids == []


def test_release_of_a_node_not_in_quarantine_says_so(client: FakeClient) -> None:
    client.handle.status = WorkflowExecutionStatus.COMPLETED
    result = invoke("release", "gpu02", "--cluster", "prod", "--by", "alice")
    assert result.exit_code == 2
    assert "not held out" in result.output
    assert client.handle.updates == []


def test_release_refuses_a_bad_node_name(client: FakeClient) -> None:
    result = invoke("release", "gpu02;x", "--cluster", "prod", "--by", "alice")
    assert result.exit_code == 2
    assert "invalid node name" in result.output
    assert client.ids == []


def test_release_while_no_controller_runs_is_kept_as_a_signal(client: FakeClient) -> None:
    # An update needs a running controller; the signal waits in Temporal for one.
    client.handle.controller_down = True
    result = invoke("release", "gpu02", "--cluster", "prod", "--by", "alice")
    assert result.exit_code == 0, result.output
    [(signal, payload)] = client.handle.signals
    assert signal is NodeQuarantineWorkflow.release
    assert payload == ReleasePayload(by="alice")
    assert "no controller answered" in result.output and "takes effect when" in result.output
