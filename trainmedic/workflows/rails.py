"""The safety rails' arithmetic: pure functions over the cluster's ledgers.

ControlWorkflow calls them from its update handlers (so reservations are serialised
per cluster); tests call them with any clock they like.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from trainmedic.domain.control import (
    ControlState,
    Isolation,
    IsolationGrant,
    IsolationRequest,
    Offense,
    OffenseRequest,
    OffenseVerdict,
    RestartGrant,
    RestartRecord,
    RestartRequest,
)

# A reservation is made right before its drain: for this long it counts even though
# Slurm does not show the drain yet (a drain that failed is released after it).
PENDING_DRAIN_GRACE = timedelta(minutes=10)


def isolation_budget(state: ControlState, partition_size: int) -> int:
    rails = state.policy.rails
    return max(rails.min_isolated_nodes, math.floor(rails.max_isolated_fraction * partition_size))


def reconcile_isolations(
    state: ControlState, held_out: list[str] | None, now: datetime
) -> list[str]:
    """Drop ledger entries for nodes trainmedic no longer holds out (an operator resumed
    them, or the drain never happened); returns the nodes released. Without a Slurm
    read (`held_out` None) entries expire after the policy's isolation window."""
    out_now = set(held_out or ())
    keep: list[Isolation] = []
    released: list[str] = []
    for isolation in state.isolations:
        if held_out is None:
            held = isolation.at >= now - state.policy.rails.isolation_window
        elif isolation.node in out_now:
            isolation.seen_out = True
            held = True
        else:
            # Back in service: released by someone, unless its drain is still on its way.
            held = not isolation.seen_out and isolation.at >= now - PENDING_DRAIN_GRACE
        if held:
            keep.append(isolation)
        else:
            released.append(isolation.node)
    state.isolations = keep
    return released


def confirm_isolation(state: ControlState, request: IsolationRequest) -> bool:
    """The node's drain took effect (or it was already out): from now on, seeing it back
    in service means someone released it. False when the ledger has no such entry."""
    for isolation in state.isolations:
        if isolation.node == request.node:
            isolation.seen_out = True
            return True
    return False


def grant_isolation(
    state: ControlState, request: IsolationRequest, now: datetime
) -> IsolationGrant:
    """Record and grant one node's isolation, or refuse it (breaker_tripped=True).

    The ledger holds the distinct nodes trainmedic holds out now (docs/architecture.md
    "Modes and safety rails"): several incidents about one node reserve it once, and a node
    released in Slurm no longer counts. The drain *rate* is a separate ledger. Idempotent
    per node: a retried or second reservation of a held node gets a grant.
    """
    rails = state.policy.rails
    reconcile_isolations(state, request.held_out, now)
    for isolation in state.isolations:
        if isolation.node == request.node:
            if isolation.incident_id == request.incident_id:
                return IsolationGrant(granted=True, reason="already reserved")
            return IsolationGrant(
                granted=True,
                reason=f"already held out (reserved by {isolation.incident_id})",
                held_by=isolation.incident_id,
            )
    held = {i.node for i in state.isolations if i.partition == request.partition}
    budget = isolation_budget(state, request.partition_size)
    drains_last_hour = [d for d in state.drains if d.at >= now - timedelta(hours=1)]
    refusal = None
    if len(held) >= budget:
        refusal = (
            f"isolation budget spent: {len(held)} of {budget} nodes of partition "
            f"{request.partition} held out by trainmedic ({', '.join(sorted(held))})"
        )
    elif len(drains_last_hour) >= rails.max_drains_per_hour:
        refusal = f"drain limit reached: {len(drains_last_hour)} drains in the last hour"
    if refusal:
        return IsolationGrant(
            granted=False,
            reason=refusal,
            breaker_tripped=True,
            isolated_in_window=len(held),
            budget=budget,
        )
    entry = Isolation(
        node=request.node, partition=request.partition, incident_id=request.incident_id, at=now
    )
    state.isolations.append(entry)
    state.drains.append(entry)
    return IsolationGrant(
        granted=True,
        reason=f"{len(held) + 1} of {budget} nodes held out",
        isolated_in_window=len(held) + 1,
        budget=budget,
    )


def grant_restart(state: ControlState, request: RestartRequest, now: datetime) -> RestartGrant:
    """Grant a restart unless the job already restarted `restart_budget` times for the
    same cause with no progress in between (only restarts since the last sign of
    progress count)."""
    rails = state.policy.rails
    for record in state.restarts:
        if record.incident_id == request.incident_id and record.job_id == request.job_id:
            return RestartGrant(
                granted=True, reason="already reserved", budget=rails.restart_budget
            )
    without_progress = [
        r
        for r in state.restarts
        if r.job_id == request.job_id
        and r.cause == request.cause
        and r.at >= now - rails.restart_window
        and r.progress == request.progress
    ]
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


def record_offense(state: ControlState, request: OffenseRequest, now: datetime) -> OffenseVerdict:
    """Record one quarantine of a node trainmedic drained (idempotent per episode) and
    say whether the node is a repeat offender: implicated in at least
    `repeat_offender_incidents` quarantines within `repeat_offender_window`."""
    policy = state.policy.quarantine
    window = policy.repeat_offender_window
    state.offenses = [o for o in state.offenses if o.at >= now - window]
    if not any(o.node == request.node and o.episode == request.episode for o in state.offenses):
        state.offenses.append(
            Offense(
                node=request.node,
                episode=request.episode,
                incident_id=request.incident_id,
                category=request.category,
                reason=request.reason,
                at=now,
            )
        )
    mine = [o for o in state.offenses if o.node == request.node]
    limit = policy.repeat_offender_incidents
    return OffenseVerdict(
        repeat=limit > 0 and len(mine) >= limit,
        count=len(mine),
        limit=limit,
        window=window,
        offenses=mine,
        policy=policy,
        policy_version=state.policy.version,
    )
