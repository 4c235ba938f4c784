"""Safety-rail arithmetic over a clock we control."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainmedic.config import parse_policy
from trainmedic.domain.control import ControlState, IsolationRequest, RestartRequest
from trainmedic.workflows.rails import (
    confirm_isolation,
    grant_isolation,
    grant_restart,
    isolation_budget,
)

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def state(policy_yaml: str) -> ControlState:
    policy = parse_policy(policy_yaml)
    return ControlState(cluster="t", mode=policy.mode.default, policy=policy)


def ask(incident: str, node: str, size: int = 8) -> IsolationRequest:
    return IsolationRequest(incident_id=incident, node=node, partition="gpu", partition_size=size)


def test_isolation_budget_per_window_and_idempotence() -> None:
    s = state("rails: {max_isolated_fraction: 0.25, isolation_window: 1h, max_drains_per_hour: 99}")
    assert isolation_budget(s, 8) == 2 and isolation_budget(s, 3) == 1  # min_isolated_nodes
    assert grant_isolation(s, ask("i1", "gpu01"), T0).granted
    assert grant_isolation(s, ask("i2", "gpu02"), T0 + timedelta(minutes=1)).granted
    assert grant_isolation(s, ask("i1", "gpu01"), T0 + timedelta(minutes=2)).granted  # retry
    refused = grant_isolation(s, ask("i3", "gpu03"), T0 + timedelta(minutes=3))
    assert not refused.granted and refused.breaker_tripped
    assert "2 of 2" in refused.reason
    # An hour after the first isolation, its slot is free again.
    later = grant_isolation(s, ask("i4", "gpu04"), T0 + timedelta(minutes=61))
    assert later.granted and later.isolated_in_window == 2
    # Other partitions have budgets of their own.
    other = IsolationRequest(incident_id="i5", node="cpu01", partition="cpu", partition_size=4)
    assert grant_isolation(s, other, T0 + timedelta(minutes=62)).granted


def test_drains_per_hour_limit() -> None:
    s = state("rails: {max_isolated_fraction: 1.0, max_drains_per_hour: 2}")
    assert grant_isolation(s, ask("a", "n1"), T0).granted
    assert grant_isolation(s, ask("b", "n2"), T0).granted
    refused = grant_isolation(s, ask("c", "n3"), T0 + timedelta(minutes=30))
    assert not refused.granted and "drain limit" in refused.reason
    assert grant_isolation(s, ask("d", "n3"), T0 + timedelta(minutes=61)).granted


def restart(incident: str, progress: str | None, cause: str = "network_nccl@-") -> RestartRequest:
    return RestartRequest(incident_id=incident, job_id="42", cause=cause, progress=progress)


def test_restart_budget_counts_only_restarts_without_progress() -> None:
    s = state("rails: {restart_budget: 2, restart_window: 24h}")
    assert grant_restart(s, restart("i1", "checkpoint@100"), T0).granted
    assert grant_restart(s, restart("i2", "checkpoint@100"), T0).granted
    assert grant_restart(s, restart("i2", "checkpoint@100"), T0).granted  # retried: same answer
    stuck = grant_restart(s, restart("i3", "checkpoint@100"), T0)
    assert not stuck.granted and "restart budget spent" in stuck.reason
    # Progress since: the budget starts over. Another cause has its own budget.
    assert grant_restart(s, restart("i4", "checkpoint@200"), T0).granted
    assert grant_restart(s, restart("i5", "checkpoint@100", cause="gpu_hardware@gpu01"), T0).granted
    # Outside the window the old restarts no longer count.
    assert grant_restart(s, restart("i6", "checkpoint@100"), T0 + timedelta(hours=25)).granted


def test_the_ledger_counts_distinct_nodes_held_out_now() -> None:
    """Issue 9.3: three jobs on one dead node plus a node an operator had resumed."""
    s = state("rails: {max_isolated_fraction: 0.25, max_drains_per_hour: 99}")

    def held(incident: str, node: str, out: list[str]) -> IsolationRequest:
        return ask(incident, node, size=12).model_copy(update={"held_out": out})

    # An earlier incident drained gpu01; an operator has since resumed it.
    assert grant_isolation(s, held("i0", "gpu01", []), T0).granted
    assert confirm_isolation(s, held("i0", "gpu01", [])), "its drain took effect"
    later = T0 + timedelta(minutes=2)  # well within the grace for drains on their way
    # Three incidents, one per job, about the one dead node gpu05.
    first = grant_isolation(s, held("i1", "gpu05", []), later)
    second = grant_isolation(s, held("i2", "gpu05", ["gpu05"]), later)
    third = grant_isolation(s, held("i3", "gpu05", ["gpu05"]), later)
    assert first.granted and first.isolated_in_window == 1  # gpu01 released by the resume
    assert second.granted and "already held out (reserved by i1)" in second.reason
    assert second.held_by == "i1", "the second incident must not drain it again"
    assert third.granted and third.held_by == "i1"
    assert first.held_by is None
    assert grant_isolation(s, held("i1", "gpu05", ["gpu05"]), later).held_by is None, "a retry"
    assert [i.node for i in s.isolations] == ["gpu05"]
    assert len(s.drains) == 2  # the drain rate counts drains, not incidents
    # Budget 3 of 12: two more distinct nodes fit, the third trips the breaker.
    assert grant_isolation(s, held("i4", "gpu06", ["gpu05"]), later).granted
    assert grant_isolation(s, held("i5", "gpu07", ["gpu05", "gpu06"]), later).granted
    refused = grant_isolation(s, held("i6", "gpu08", ["gpu05", "gpu06", "gpu07"]), later)
    assert not refused.granted and refused.breaker_tripped
    assert "3 of 3" in refused.reason and "gpu05, gpu06, gpu07" in refused.reason


def test_a_reservation_whose_drain_never_showed_is_released_after_the_grace() -> None:
    s = state("rails: {max_isolated_fraction: 0.1, max_drains_per_hour: 99}")  # budget 1
    assert grant_isolation(s, ask("i1", "gpu01").model_copy(update={"held_out": []}), T0).granted
    soon = grant_isolation(
        s, ask("i2", "gpu02").model_copy(update={"held_out": []}), T0 + timedelta(minutes=1)
    )
    assert not soon.granted  # gpu01's drain may still be on its way
    s.breaker_tripped_at = None
    late = grant_isolation(
        s, ask("i3", "gpu02").model_copy(update={"held_out": []}), T0 + timedelta(minutes=11)
    )
    assert late.granted
