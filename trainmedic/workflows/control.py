"""ControlWorkflow: one per cluster (id `control-<cluster>`).

It holds the cluster's mode and policy, and the ledgers the safety rails count on
(isolations per partition, drains per hour, restarts per job). Recovery workflows
reserve budget here, through an update, right before an effect, so two incidents
racing for the last node of budget cannot both win. Every change of autonomy is an
update with who and why: the history is the audit trail.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from trainmedic.domain.control import (
        ControlInput,
        ControlState,
        Isolation,
        IsolationGrant,
        IsolationRequest,
        ModeChange,
        RestartGrant,
        RestartRecord,
        RestartRequest,
        SetModeRequest,
        SetPolicyRequest,
    )
    from trainmedic.domain.enums import Mode
    from trainmedic.temporal.search_attributes import TM_CLUSTER, TM_MODE

BREAKER = "trainmedic:breaker"


def control_workflow_id(cluster: str) -> str:
    return f"control-{cluster}"


@workflow.defn(name="ControlWorkflow")
class ControlWorkflow:
    # @workflow.init: the state exists before any update handler runs, even when an
    # update arrives with the very first workflow task.
    @workflow.init
    def __init__(self, request: ControlInput) -> None:
        self.state = request.state or ControlState(
            cluster=request.cluster,
            mode=request.policy.mode.default,
            policy=request.policy,
            changes=[
                ModeChange(
                    mode=request.policy.mode.default,
                    by="trainmedic:start",
                    reason="initial mode from policy",
                    at=workflow.now(),
                    policy_version=request.policy.version,
                )
            ],
        )

    @workflow.run
    async def run(self, request: ControlInput) -> None:
        workflow.upsert_search_attributes(
            [TM_CLUSTER.value_set(self.state.cluster), TM_MODE.value_set(self.state.mode.value)]
        )
        self._describe()
        await workflow.wait_condition(lambda: workflow.info().is_continue_as_new_suggested())
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._prune(workflow.now())
        workflow.continue_as_new(ControlInput(cluster=self.state.cluster, state=self.state))

    @workflow.query
    def current(self) -> ControlState:
        return self.state

    # -- autonomy changes -------------------------------------------------------------

    @workflow.update
    def set_mode(self, request: SetModeRequest) -> ControlState:
        state = self.state
        state.mode = request.mode
        if request.mode is not Mode.MONITOR:
            state.breaker_tripped_at = None  # an operator re-arming autonomy resets it
            state.breaker_reason = None
        state.changes.append(
            ModeChange(
                mode=request.mode,
                by=request.by,
                reason=request.reason,
                at=workflow.now(),
                policy_version=state.policy.version,
            )
        )
        workflow.upsert_search_attributes([TM_MODE.value_set(request.mode.value)])
        self._describe()
        return state

    @set_mode.validator
    def _check_set_mode(self, request: SetModeRequest) -> None:
        if not request.by.strip():
            raise ValueError("say who changes the mode ('by')")

    @workflow.update
    def set_policy(self, request: SetPolicyRequest) -> ControlState:
        state = self.state
        state.policy = request.policy
        state.changes.append(
            ModeChange(
                mode=state.mode,
                by=request.by,
                reason=request.reason or f"policy {request.policy.version}",
                at=workflow.now(),
                policy_version=request.policy.version,
            )
        )
        self._describe()
        return state

    @set_policy.validator
    def _check_set_policy(self, request: SetPolicyRequest) -> None:
        if not request.by.strip():
            raise ValueError("say who changes the policy ('by')")

    # -- safety rails ---------------------------------------------------------------------

    @workflow.update
    def reserve_isolation(self, request: IsolationRequest) -> IsolationGrant:
        """Grant a drain if the partition's isolation budget and the hourly drain limit allow.

        Idempotent per (incident, node): a retried reservation gets the same answer.
        A refusal trips the breaker: the cluster falls back to monitor until a person
        re-arms it with set_mode.
        """
        state, now = self.state, workflow.now()
        rails = state.policy.rails
        for isolation in state.isolations:
            if isolation.incident_id == request.incident_id and isolation.node == request.node:
                return IsolationGrant(granted=True, reason="already reserved")
        window_start = now - rails.isolation_window
        in_window = [
            i for i in state.isolations if i.partition == request.partition and i.at >= window_start
        ]
        budget = max(
            rails.min_isolated_nodes,
            math.floor(rails.max_isolated_fraction * request.partition_size),
        )
        drains_last_hour = [d for d in state.drains if d.at >= now - timedelta(hours=1)]
        if len(in_window) >= budget:
            reason = (
                f"isolation budget spent: {len(in_window)} of {budget} nodes of partition "
                f"{request.partition} already isolated within {rails.isolation_window}"
            )
            self._trip(reason, now)
            return IsolationGrant(
                granted=False,
                reason=reason,
                breaker_tripped=True,
                isolated_in_window=len(in_window),
                budget=budget,
            )
        if len(drains_last_hour) >= rails.max_drains_per_hour:
            reason = f"drain limit reached: {len(drains_last_hour)} drains in the last hour"
            self._trip(reason, now)
            return IsolationGrant(
                granted=False,
                reason=reason,
                breaker_tripped=True,
                isolated_in_window=len(in_window),
                budget=budget,
            )
        entry = Isolation(
            node=request.node,
            partition=request.partition,
            incident_id=request.incident_id,
            at=now,
        )
        state.isolations.append(entry)
        state.drains.append(entry)
        return IsolationGrant(
            granted=True,
            reason=f"{len(in_window) + 1} of {budget} in window",
            isolated_in_window=len(in_window) + 1,
            budget=budget,
        )

    @workflow.update
    def reserve_restart(self, request: RestartRequest) -> RestartGrant:
        """Grant a restart unless the job already restarted `restart_budget` times for
        the same cause with no progress in between."""
        state, now = self.state, workflow.now()
        rails = state.policy.rails
        for record in state.restarts:
            if record.incident_id == request.incident_id and record.job_id == request.job_id:
                return RestartGrant(
                    granted=True, reason="already reserved", budget=rails.restart_budget
                )
        window_start = now - rails.restart_window
        same = [
            r
            for r in state.restarts
            if r.job_id == request.job_id and r.cause == request.cause and r.at >= window_start
        ]
        # Only restarts since the last sign of progress count against the budget.
        without_progress = [r for r in same if r.progress == request.progress]
        if len(without_progress) >= rails.restart_budget:
            return RestartGrant(
                granted=False,
                reason=(
                    f"restart budget spent: job {request.job_id} restarted "
                    f"{len(without_progress)} times for {request.cause} with no progress "
                    f"(last progress: {request.progress or 'none seen'})"
                ),
                restarts_without_progress=len(without_progress),
                budget=rails.restart_budget,
            )
        state.restarts.append(
            RestartRecord(
                job_id=request.job_id,
                cause=request.cause,
                progress=request.progress,
                incident_id=request.incident_id,
                at=now,
            )
        )
        return RestartGrant(
            granted=True,
            reason=f"restart {len(without_progress) + 1} of {rails.restart_budget}",
            restarts_without_progress=len(without_progress) + 1,
            budget=rails.restart_budget,
        )

    # -- helpers ------------------------------------------------------------------------

    def _trip(self, reason: str, now: datetime) -> None:
        state = self.state
        if state.mode is not Mode.MONITOR:
            state.mode = Mode.MONITOR
            state.changes.append(
                ModeChange(
                    mode=Mode.MONITOR,
                    by=BREAKER,
                    reason=f"breaker tripped: {reason}",
                    at=now,
                    policy_version=state.policy.version,
                )
            )
            workflow.upsert_search_attributes([TM_MODE.value_set(Mode.MONITOR.value)])
            workflow.logger.warning("breaker tripped on %s: %s", state.cluster, reason)
        if state.breaker_tripped_at is None:
            state.breaker_tripped_at = now
            state.breaker_reason = reason
        self._describe()

    def _prune(self, now: datetime) -> None:
        """Drop ledger entries no window looks at any more, before continue-as-new."""
        state = self.state
        rails = state.policy.rails
        keep_from = now - max(rails.isolation_window, timedelta(hours=1))
        state.isolations = [i for i in state.isolations if i.at >= keep_from]
        state.drains = [d for d in state.drains if d.at >= now - timedelta(hours=1)]
        state.restarts = [r for r in state.restarts if r.at >= now - rails.restart_window]
        state.changes = state.changes[-50:]

    def _describe(self) -> None:
        state = self.state
        text = f"cluster {state.cluster}: mode {state.mode.value}, policy {state.policy.version}"
        if state.breaker_tripped_at:
            text += f"; breaker tripped: {state.breaker_reason}"
        workflow.set_current_details(text)
