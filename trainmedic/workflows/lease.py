"""LeaseWorkflow: one per cluster (id `lease-<cluster>`): which controller runs detection.

Controllers for availability share the task queue, and Temporal spreads workflows and
activities between their workers. The watchers must run in one of them only: two Slurm
watchers would both report every failure (incident ids make the second report
harmless, but spools would be read twice and every node probed twice). The lease lives
in Temporal itself, so no extra database: each controller asks `acquire` every third of
the lease's time; the holder's asks renew it; another's ask wins once the holder has
been silent for the whole lease (its process died, its host or network went away). The
workflow's clock decides, and every handover is in the history.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from trainmedic.domain.lease import (
        Handover,
        LeaseGrant,
        LeaseInput,
        LeaseRequest,
        LeaseState,
    )

KEEP_HANDOVERS = 50


def lease_workflow_id(cluster: str) -> str:
    return f"lease-{cluster}"


@workflow.defn(name="LeaseWorkflow")
class LeaseWorkflow:
    @workflow.init
    def __init__(self, request: LeaseInput) -> None:
        self.state = request.state or LeaseState(cluster=request.cluster)

    @workflow.run
    async def run(self, request: LeaseInput) -> None:
        # Renewals are updates: the history grows by a few events every few seconds.
        await workflow.wait_condition(lambda: workflow.info().is_continue_as_new_suggested())
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(LeaseInput(cluster=self.state.cluster, state=self.state))

    @workflow.query
    def current(self) -> LeaseState:
        return self.state

    @workflow.update
    def acquire(self, request: LeaseRequest) -> LeaseGrant:
        state, now = self.state, workflow.now()
        previous = state.holder
        held_by_another = previous is not None and previous != request.holder
        if held_by_another and state.expires_at is not None and state.expires_at > now:
            return LeaseGrant(granted=False, holder=previous, expires_at=state.expires_at)
        took_over = None
        if previous != request.holder:
            why = "first" if previous is None else "expired"
            if previous is None and state.handovers and state.handovers[-1].why == "released":
                # A clean stop: the one before still led a moment ago.
                why, took_over = "after release", state.handovers[-1].previous
            else:
                took_over = previous
            self._handover(request.holder, previous, why)
            state.since = now
        state.holder = request.holder
        state.expires_at = now + timedelta(seconds=request.ttl_s)
        return LeaseGrant(
            granted=True,
            holder=request.holder,
            expires_at=state.expires_at,
            took_over_from=took_over,
        )

    @workflow.update
    def release(self, request: LeaseRequest) -> LeaseState:
        """A controller stopping on purpose hands over at once (no lease to wait out)."""
        if self.state.holder == request.holder:
            self._handover(None, request.holder, "released")
            self.state.holder = None
            self.state.expires_at = None
            self.state.since = None
        return self.state

    def _handover(self, holder: str | None, previous: str | None, why: str) -> None:
        self.state.handovers.append(
            Handover(holder=holder, previous=previous, at=workflow.now(), why=why)
        )
        del self.state.handovers[:-KEEP_HANDOVERS]
        workflow.logger.info(
            "lease of %s: %s -> %s (%s)", self.state.cluster, previous, holder, why
        )
