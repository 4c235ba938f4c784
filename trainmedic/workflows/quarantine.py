"""NodeQuarantineWorkflow: one per node that failed (id `node-<cluster>-<node>`).

reports arrive (signal `report`) -> cool-down since the last report -> assess (Slurm:
is the node still out, and out by trainmedic's drain? count it in the cluster's
repeat-offender ledger) -> health check where the node is (the node agent's GPU checks,
or the lab's) -> resume the node in Slurm only if trainmedic drained it and it is
healthy.

- Unhealthy: kept out; re-checked after a back-off that doubles (policy `quarantine`),
  up to `recheck_limit` failures, then a person is asked (`waiting_for_person`).
- Agent unreachable: the same as unhealthy (the `agent` check fails): a node never
  goes back on Slurm's word alone.
- Repeat offender (implicated in K incidents within T): waits for a person's release.
- Drained or downed by anyone else (an admin, Slurm's "Not responding"), or already
  back in service: left alone, never resumed by trainmedic.

An operator's release (signal `release` from the UI, or the validated update
`release_node` from `trainmedic nodes release`) ends the wait and the cool-down: the
health check still runs and is recorded, and the node is resumed whatever it says.
Releases are recorded with who, when, how and why.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from trainmedic.activities.quarantine import QuarantineActivities
    from trainmedic.config import QuarantinePolicy
    from trainmedic.domain.activity_io import (
        Assessment,
        AssessRequest,
        HealthCheckRequest,
        ResumeRequest,
    )
    from trainmedic.domain.health import HealthCheck, NodeHealthReport
    from trainmedic.domain.incident import IncidentSignal
    from trainmedic.domain.slurm import EffectResult
    from trainmedic.durations import format_duration
    from trainmedic.temporal.search_attributes import TM_CLUSTER, TM_NODES

# Reports and health reports kept in the workflow (and carried over continue-as-new).
MAX_SIGNALS = 50
MAX_CHECKS = 20


def quarantine_workflow_id(cluster: str, node: str) -> str:
    return f"node-{cluster}-{node}"


WaitingFor = Literal["health_check", "repeat_offender"]


class Release(BaseModel):
    by: str
    comment: str = ""
    at: datetime | None = None
    via: Literal["signal", "update"] = "signal"


class QuarantineInput(BaseModel):
    cluster: str
    node: str
    cooldown: timedelta = timedelta(minutes=10)
    # Carried over continue-as-new.
    signals: list[IncidentSignal] = Field(default_factory=list)
    checks: list[NodeHealthReport] = Field(default_factory=list)
    escalated: str | None = None
    since: datetime | None = None
    episode: str | None = None
    cause: Assessment | None = None
    waiting_for: WaitingFor | None = None
    failed_checks: int = 0
    ecc_baseline: dict[str, int] | None = None


class ReleasePayload(BaseModel):
    by: str = ""
    comment: str = ""


QuarantineState = Literal[
    "cooling_down", "checking", "rechecking", "waiting_for_person", "resumed", "left_alone"
]


class QuarantineStatus(BaseModel):
    cluster: str
    node: str
    state: QuarantineState
    details: str
    since: datetime | None = None
    cooldown_until: datetime | None = None
    next_check_at: datetime | None = None
    failed_checks: int = 0
    recheck_limit: int | None = None
    waiting_for: WaitingFor | None = None
    cause: Assessment | None = None
    signals: list[IncidentSignal] = Field(default_factory=list)
    checks: list[NodeHealthReport] = Field(default_factory=list)
    released_by: Release | None = None
    resume: EffectResult | None = None
    escalated: str | None = None
    ignored: list[str] = Field(default_factory=list)  # refused releases, and why


ACTIVITY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)


def _say(delta: timedelta) -> str:
    return format_duration(delta) if delta.total_seconds() >= 1 else f"{delta.total_seconds()}s"


@workflow.defn(name="NodeQuarantineWorkflow")
class NodeQuarantineWorkflow:
    @workflow.init
    def __init__(self, request: QuarantineInput) -> None:
        self.request = request
        self.signals: list[IncidentSignal] = list(request.signals)
        self.checks: list[NodeHealthReport] = list(request.checks)
        self.escalated = request.escalated
        self.since = request.since or workflow.info().start_time
        self.cause = request.cause
        self.waiting_for: WaitingFor | None = request.waiting_for
        self.failed_checks = request.failed_checks
        self.baseline = request.ecc_baseline
        self.state: QuarantineState = "cooling_down"
        self.details = "waiting for reports to settle"
        self.cooldown_until: datetime | None = None
        self.next_check_at: datetime | None = None
        self.released: Release | None = None
        self.ignored: list[str] = []
        self.resume_result: EffectResult | None = None
        self.assess_problem = ""
        self.new_reports = 0
        self.seen = 0  # reports counted when the current wait began

    # -- messages -----------------------------------------------------------------------

    @workflow.signal
    def report(self, signal: IncidentSignal) -> None:
        self.signals = [*self.signals, signal][-MAX_SIGNALS:]
        self.new_reports += 1

    @workflow.signal
    def release(self, payload: ReleasePayload) -> None:
        """An operator says the node may go back (early, or after an escalation).

        A release names who gives it: one without `by` (the UI sends no identity) is
        recorded as ignored, never acted on."""
        if not payload.by.strip():
            self.ignored.append("release ignored: say who releases the node ('by')")
            workflow.logger.warning("%s", self.ignored[-1])
            return
        self._release(payload, "signal")

    @workflow.update
    def release_node(self, payload: ReleasePayload) -> QuarantineStatus:
        """`release`, validated: refused (with no history event) without a name, or when
        the quarantine is over or already released."""
        self._release(payload, "update")
        return self.status()

    @release_node.validator
    def _check_release(self, payload: ReleasePayload) -> None:
        if not payload.by.strip():
            raise ValueError("say who releases the node ('by')")
        if self.state in ("resumed", "left_alone"):
            raise ValueError(f"{self.request.node}'s quarantine is over ({self.state})")
        if self.released is not None:
            raise ValueError(f"{self.request.node} was already released by {self.released.by}")

    def _release(self, payload: ReleasePayload, via: Literal["signal", "update"]) -> None:
        self.released = Release(
            by=payload.by.strip(), comment=payload.comment, at=workflow.now(), via=via
        )
        workflow.logger.info("%s released by %s (%s)", self.request.node, payload.by, via)

    @workflow.query
    def status(self) -> QuarantineStatus:
        policy = self._policy()
        return QuarantineStatus(
            cluster=self.request.cluster,
            node=self.request.node,
            state=self.state,
            details=self.details,
            since=self.since,
            cooldown_until=self.cooldown_until if self.state == "cooling_down" else None,
            next_check_at=self.next_check_at if self.state == "rechecking" else None,
            failed_checks=self.failed_checks,
            recheck_limit=policy.recheck_limit,
            waiting_for=self.waiting_for if self.state == "waiting_for_person" else None,
            cause=self.cause,
            signals=self.signals,
            checks=self.checks,
            released_by=self.released,
            resume=self.resume_result,
            escalated=self.escalated,
            ignored=self.ignored,
        )

    # -- helpers --------------------------------------------------------------------------

    def _policy(self) -> QuarantinePolicy:
        offense = self.cause.offense if self.cause else None
        return offense.policy if offense else QuarantinePolicy()

    def _set(self, state: QuarantineState, details: str) -> None:
        self.state = state
        self.details = details
        workflow.set_current_details(f"{self.request.node}: {state} - {details}")

    def _reported(self) -> bool:
        return self.new_reports != self.seen

    async def _cool_down(self) -> None:
        """Wait `cooldown` after the last report (a new one restarts it), or a release."""
        cooldown = self.request.cooldown
        while self.released is None:
            self.seen = self.new_reports
            self.cooldown_until = workflow.now() + cooldown
            self._set(
                "cooling_down",
                f"health check at {self.cooldown_until:%Y-%m-%d %H:%M:%S} UTC "
                f"({_say(cooldown)} after the last report)",
            )
            try:
                await workflow.wait_condition(
                    lambda: self.released is not None or self._reported(), timeout=cooldown
                )
            except TimeoutError:
                return

    async def _assess(self, *, quiet: bool = False) -> Assessment | None:
        """Slurm's view of the node and its offense record; None when it could not be
        read (the caller keeps the node as it is and tries again later)."""
        if not quiet:
            self._set("checking", "reading the node's state in Slurm")
        info = workflow.info()
        try:
            return await workflow.execute_activity_method(
                QuarantineActivities.assess,
                AssessRequest(
                    cluster=self.request.cluster,
                    node=self.request.node,
                    episode=self.request.episode or info.first_execution_run_id,
                    record=not quiet,
                ),
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=ACTIVITY_RETRY,
            )
        except ActivityError as error:
            cause = str(error.cause or error)
            workflow.logger.warning("assessing %s failed: %s", self.request.node, cause)
            self.assess_problem = cause
            return None

    async def _assess_until_read(self) -> Assessment:
        """Assess; while Slurm (or the ledger) cannot be read, the node stays out and it
        is tried again after `recheck_after` (sooner on a release or a new report)."""
        while True:
            cause = await self._assess()
            if cause is not None:
                return cause
            retry = self._policy().recheck_after
            self.next_check_at = workflow.now() + retry
            self._set(
                "rechecking",
                f"could not read the node in Slurm ({self.assess_problem}); trying again at "
                f"{self.next_check_at:%Y-%m-%d %H:%M:%S} UTC",
            )
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self.released is not None or self._reported(), timeout=retry
                )

    async def _check(self) -> NodeHealthReport:
        self._set("checking", "running the health check on the node")
        try:
            report = await workflow.execute_activity_method(
                QuarantineActivities.check_health,
                HealthCheckRequest(node=self.request.node, ecc_baseline=self.baseline or {}),
                # The probe gives up after agent_health_timeout (at most 9m): a report,
                # not a timeout, says the agent did not answer.
                start_to_close_timeout=timedelta(minutes=10),
                retry_policy=ACTIVITY_RETRY,
            )
        except ActivityError as error:
            # Slurm unreadable, or a bug: no check ran, so the node is not healthy.
            cause = str(error.cause or error)
            report = NodeHealthReport.of(
                self.request.node,
                [HealthCheck(name="slurm", ok=False, detail=f"the check could not run: {cause}")],
                workflow.now(),
                source="slurm",
            )
        self.checks = [*self.checks, report][-MAX_CHECKS:]
        if self.baseline is None and report.reachable and report.ecc_aggregate:
            # The first reading of this quarantine: later ECC growth is "since the drain".
            self.baseline = dict(report.ecc_aggregate)
        return report

    async def _check_until_healthy(self) -> Literal["healthy", "released", "report", "escalate"]:
        """Health checks with a doubling back-off between failures."""
        policy = self._policy()
        interval = policy.recheck_after
        while True:
            report = await self._check()
            if report.healthy:
                return "healthy"
            if self.released is not None:
                return "released"
            self.failed_checks += 1
            what = "agent unreachable" if not report.reachable else "health check failing"
            if self.failed_checks > policy.recheck_limit:
                self.escalated = (
                    f"{self.request.node} failed {self.failed_checks} health checks "
                    f"({what}: {report.detail})"
                )
                workflow.logger.warning("quarantine escalated: %s", self.escalated)
                return "escalate"
            self.next_check_at = workflow.now() + interval
            self._set(
                "rechecking",
                f"{what}: {report.detail}; re-check at {self.next_check_at:%Y-%m-%d %H:%M:%S}"
                f" UTC ({self.failed_checks} of {policy.recheck_limit} failures before a "
                "person is asked)",
            )
            self.seen = self.new_reports
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self.released is not None or self._reported(), timeout=interval
                )
            if self.released is None and self._reported():
                return "report"
            interval = min(interval * 2, policy.recheck_max_interval)

    async def _wait_for_person(self) -> bool:
        """Until a release or a new report (True); continues as new when the history is
        long. Slurm is read again every `recheck_max_interval`: a node someone else
        resumed or took over is no longer trainmedic's to hold (False)."""
        cause = self.cause
        if self.waiting_for == "repeat_offender" and cause and cause.offense:
            offense = cause.offense
            ids = ", ".join(o.incident_id or o.episode for o in offense.offenses)
            why = (
                f"repeat offender: {offense.count} incidents within {_say(offense.window)} ({ids})"
            )
        else:
            why = self.escalated or "health check failing"
        self._set(
            "waiting_for_person",
            f"{why}; waiting for a person: trainmedic nodes release {self.request.node} --by NAME",
        )
        self.seen = self.new_reports
        while True:
            try:
                await workflow.wait_condition(
                    lambda: (
                        self.released is not None
                        or self._reported()
                        or workflow.info().is_continue_as_new_suggested()
                    ),
                    timeout=self._policy().recheck_max_interval,
                )
                break
            except TimeoutError:
                now = await self._assess(quiet=True)
                if now is not None and (not now.out or not now.ours):
                    self.cause = now.model_copy(
                        update={"offense": self.cause and self.cause.offense}
                    )
                    return False
        if self.released is None and not self._reported():
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(
                QuarantineInput(
                    cluster=self.request.cluster,
                    node=self.request.node,
                    cooldown=self.request.cooldown,
                    signals=self.signals,
                    checks=self.checks,
                    escalated=self.escalated,
                    since=self.since,
                    episode=self.request.episode or workflow.info().first_execution_run_id,
                    cause=self.cause,
                    waiting_for=self.waiting_for,
                    failed_checks=self.failed_checks,
                    ecc_baseline=self.baseline,
                )
            )
        return True

    async def _resume(self) -> QuarantineStatus:
        self.resume_result = await workflow.execute_activity_method(
            QuarantineActivities.resume_node,
            ResumeRequest(node=self.request.node),
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=ACTIVITY_RETRY,
        )
        why = f"released by {self.released.by}" if self.released else "healthy"
        if self.resume_result.changed:
            self._set("resumed", f"{why}; {self.resume_result.detail}")
        else:
            # Not drained by us any more: Slurm brought it back, or an admin holds it.
            self._set("left_alone", f"{why}; {self.resume_result.detail}")
        return self.status()

    # -- the run --------------------------------------------------------------------------

    @workflow.run
    async def run(self, request: QuarantineInput) -> QuarantineStatus:
        workflow.upsert_search_attributes(
            [TM_CLUSTER.value_set(request.cluster), TM_NODES.value_set([request.node])]
        )
        while True:
            if self.waiting_for is None:
                await self._cool_down()
                self.cause = await self._assess_until_read()
                cause = self.cause
                if not cause.out:
                    known = cause.state != "UNKNOWN"
                    why = (
                        f"back in service already ({cause.state})" if known else "unknown to Slurm"
                    )
                    self._set("left_alone", why)
                    return self.status()
                if not cause.ours:
                    who = f" by {cause.reason_user}" if cause.reason_user else ""
                    self._set(
                        "left_alone",
                        f"{cause.state}, reason {cause.reason!r}{who}: not trainmedic's "
                        "drain, never resumed by trainmedic",
                    )
                    return self.status()
                if cause.offense and cause.offense.repeat and self.released is None:
                    self.waiting_for = "repeat_offender"
            if self.waiting_for is not None and self.released is None:
                if not await self._wait_for_person():
                    now = self.cause
                    self._set(
                        "left_alone",
                        f"no longer held by trainmedic: Slurm shows it {now.state if now else '?'}"
                        f" ({now.reason if now and now.reason else 'no reason'}); someone "
                        "resumed or took it over",
                    )
                    return self.status()
                if self.released is None:  # a new report: the node failed again
                    self.waiting_for = None
                    continue
            outcome = await self._check_until_healthy()
            if outcome in ("healthy", "released"):
                return await self._resume()
            if outcome == "escalate":
                self.waiting_for = "health_check"
            # "report": a new failure; the cool-down starts again.
