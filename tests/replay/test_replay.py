"""Stored histories replay through the current workflow code.

A failure here means a change would break incidents already running in production
(non-determinism): version the change with workflow.patched(), or, when the change is
meant to be incompatible, refresh the histories (see histories/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from trainmedic.workflows.control import ControlWorkflow
from trainmedic.workflows.quarantine import NodeQuarantineWorkflow
from trainmedic.workflows.recovery import RecoveryWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_histories_are_present() -> None:
    kinds = {path.name.split("-")[0] for path in HISTORIES}
    assert kinds == {"recovery", "control", "quarantine"}
    assert len(HISTORIES) >= 10
    # Each way a quarantine ends or waits: back when healthy, left alone when an
    # operator drained it, out while the agent is unreachable, a repeat offender.
    quarantines = {p.stem for p in HISTORIES if p.name.startswith("quarantine-")}
    assert {
        "quarantine-xid79",
        "quarantine-admin",
        "quarantine-unreachable",
        "quarantine-repeat-2",
    } <= quarantines


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path) -> None:
    text = path.read_text()
    first = json.loads(text)["events"][0]["workflowExecutionStartedEventAttributes"]
    history = WorkflowHistory.from_json(path.stem, text)
    replayer = Replayer(
        workflows=[RecoveryWorkflow, ControlWorkflow, NodeQuarantineWorkflow],
        data_converter=pydantic_data_converter,
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, (
        f"{first['workflowType']['name']}: {result.replay_failure}"
    )
