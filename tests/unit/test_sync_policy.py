"""The controller's start writes its policy file into the control workflow with the
state it read (SetPolicyRequest.expected): a change that lands in between refuses the
write, and the controller reads again and decides again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from trainmedic.config import Policy, Settings
from trainmedic.domain.control import ControlState, SetPolicyRequest
from trainmedic.domain.enums import Mode
from trainmedic.workers import controller
from trainmedic.workflows.control import STALE_READ


class FakeHandle:
    def __init__(
        self,
        states: list[ControlState],
        refusals: int,
        refusal_type: str = STALE_READ,
        refusal: str = "the cluster's policy, mode or breaker changed after they were read",
    ) -> None:
        self.states = states
        self.refusals = refusals
        self.refusal_type = refusal_type
        self.refusal = refusal
        self.writes: list[SetPolicyRequest] = []

    async def query(self, _query: Any) -> ControlState:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    async def execute_update(self, _update: Any, request: SetPolicyRequest) -> None:
        self.writes.append(request)
        if self.refusals:
            self.refusals -= 1
            raise WorkflowUpdateFailedError(ApplicationError(self.refusal, type=self.refusal_type))


class FakeClient:
    def __init__(self, handle: FakeHandle) -> None:
        self.handle = handle

    def get_workflow_handle_for(self, *_: Any) -> FakeHandle:
        return self.handle


def _state(version: str) -> ControlState:
    return ControlState(cluster="c1", mode=Mode.MONITOR, policy=Policy(version=version))


@pytest.fixture(autouse=True)
def _no_control_start(monkeypatch: pytest.MonkeyPatch) -> None:
    async def ensure_control(*_: Any, **__: Any) -> None:
        return None

    monkeypatch.setattr(controller, "ensure_control", ensure_control)


def _sync(handle: FakeHandle, policy: Policy) -> None:
    settings = Settings(cluster="c1")
    asyncio.run(controller.sync_policy(FakeClient(handle), settings, policy))  # type: ignore[arg-type]


def test_a_promotion_landing_during_start_is_kept() -> None:
    # Read v1, a promotion of the file v2 lands, the write is refused; read again: kept.
    handle = FakeHandle([_state("v1"), _state("v2+restart=approve")], refusals=1)
    _sync(handle, Policy(version="v2"))
    [write] = handle.writes
    assert write.expected == _state("v1").autonomy()  # the write named what it read


def test_the_write_names_what_it_read_and_goes_through() -> None:
    handle = FakeHandle([_state("v1")], refusals=0)
    _sync(handle, Policy(version="v2"))
    [write] = handle.writes
    assert write.policy.version == "v2" and write.expected == _state("v1").autonomy()


def test_three_refusals_in_a_row_fail_the_start() -> None:
    handle = FakeHandle([_state("v1")], refusals=3)
    with pytest.raises(WorkflowUpdateFailedError):
        _sync(handle, Policy(version="v2"))
    assert len(handle.writes) == 3


def test_a_stale_read_refused_by_the_previous_release_is_tried_again() -> None:
    # During a rolling deploy the old workflow code refuses with a plain ValueError.
    handle = FakeHandle([_state("v1"), _state("v2+restart=approve")], 1, "ValueError")
    _sync(handle, Policy(version="v2"))
    assert len(handle.writes) == 1  # refused once, read again: the promotion is kept


def test_a_refusal_other_than_a_stale_read_is_not_tried_again() -> None:
    # A policy the workflow refuses for what it says (not for when it was read) would be
    # refused again: the start fails at once, with the workflow's reason.
    handle = FakeHandle([_state("v1")], 3, "ValueError", "say who changes the policy ('by')")
    with pytest.raises(WorkflowUpdateFailedError):
        _sync(handle, Policy(version="v2"))
    assert len(handle.writes) == 1
