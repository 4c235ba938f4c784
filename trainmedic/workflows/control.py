"""ControlWorkflow: one per cluster (id `control-<cluster>`).

It holds the cluster's mode and policy, and the ledgers the safety rails count on
(isolations per partition, drains per hour, restarts per job). Recovery workflows
reserve budget here, through an update, right before an effect, so two incidents
racing for the last node of budget cannot both win. Every change of autonomy is an
update with who and why: the history is the audit trail.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from trainmedic.domain.control import (
        ControlInput,
        ControlState,
        IsolationGrant,
        IsolationRequest,
        ModeChange,
        OffenseRequest,
        OffenseVerdict,
        RestartGrant,
        RestartRequest,
        SetModeRequest,
        SetPolicyRequest,
    )
    from trainmedic.domain.enums import Mode
    from trainmedic.temporal.search_attributes import TM_CLUSTER, TM_MODE
    from trainmedic.workflows.rails import (
        confirm_isolation,
        grant_isolation,
        grant_restart,
    )
    from trainmedic.workflows.rails import record_offense as count_offense

BREAKER = "trainmedic:breaker"
# The type of the refusal of a write whose `expected` autonomy is no longer the current
# one: the writer reads again and decides again; any other refusal is final.
STALE_READ = "StaleAutonomyRead"


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
        """A new policy. The cluster's mode changes only when the policy's own default
        mode was edited (an operator's explicit act); otherwise the mode set by an
        operator or by the breaker stays as it is."""
        state = self.state
        old_default = state.policy.mode.default
        state.policy = request.policy
        reason = request.reason or f"policy {request.policy.version}"
        if request.policy.mode.default is not old_default:
            state.mode = request.policy.mode.default
            reason += f"; default mode {old_default.value} -> {state.mode.value}"
            if state.mode is not Mode.MONITOR:
                state.breaker_tripped_at = None
                state.breaker_reason = None
            workflow.upsert_search_attributes([TM_MODE.value_set(state.mode.value)])
        state.changes.append(
            ModeChange(
                mode=state.mode,
                by=request.by,
                reason=reason,
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
        current = self.state.autonomy()
        if request.expected is not None and request.expected != current:
            raise ApplicationError(
                "the cluster's policy, mode or breaker changed after they were read (read "
                f"{request.expected}; now {current}); read them again and retry",
                type=STALE_READ,
            )

    # -- safety rails ---------------------------------------------------------------------

    @workflow.update
    def reserve_isolation(self, request: IsolationRequest) -> IsolationGrant:
        """Grant a drain if the partition's isolation budget and the hourly drain limit
        allow (rails.grant_isolation). A refusal trips the breaker: the cluster falls
        back to monitor until a person re-arms it with set_mode."""
        grant = grant_isolation(self.state, request, workflow.now())
        if grant.breaker_tripped:
            self._trip(grant.reason, workflow.now())
        return grant

    @workflow.update
    def confirm_isolation(self, request: IsolationRequest) -> bool:
        """A reserved node's drain took effect (rails.confirm_isolation)."""
        return confirm_isolation(self.state, request)

    @workflow.update
    def reserve_restart(self, request: RestartRequest) -> RestartGrant:
        return grant_restart(self.state, request, workflow.now())

    @workflow.update
    def record_offense(self, request: OffenseRequest) -> OffenseVerdict:
        """A node trainmedic drained is in quarantine: count it (rails.record_offense)."""
        return count_offense(self.state, request, workflow.now())

    @record_offense.validator
    def _check_record_offense(self, request: OffenseRequest) -> None:
        if not request.node.strip() or not request.episode.strip():
            raise ValueError("an offense names its node and its quarantine (episode)")

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
        # Isolations stay while the node is held out: they leave the ledger when a
        # reservation's Slurm read shows the node back (rails.reconcile_isolations).
        state.drains = [d for d in state.drains if d.at >= now - timedelta(hours=1)]
        state.restarts = [r for r in state.restarts if r.at >= now - rails.restart_window]
        window = state.policy.quarantine.repeat_offender_window
        state.offenses = [o for o in state.offenses if o.at >= now - window]
        state.changes = state.changes[-50:]

    def _describe(self) -> None:
        state = self.state
        text = f"cluster {state.cluster}: mode {state.mode.value}, policy {state.policy.version}"
        if state.breaker_tripped_at:
            text += f"; breaker tripped: {state.breaker_reason}"
        workflow.set_current_details(text)
