"""NodeQuarantineWorkflow: one per node that failed (id `node-<cluster>-<node>`).

reports arrive (signal `report`) -> cool-down since the last report -> health check ->
resume the node in Slurm only if trainmedic drained it and it is healthy; otherwise keep
it out and escalate (recorded, details say why), and wait for an operator's `release`
or for new reports. An operator's `release` skips the rest of the cool-down.

Resuming is guarded by the drain reason: a node drained or set DOWN by anyone else (an
admin, Slurm's own "Not responding") is never resumed by trainmedic; in monitor mode
trainmedic drains nothing, so there is nothing of ours to resume either.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from trainmedic.domain.incident import IncidentSignal
    from trainmedic.domain.slurm import EffectResult

OURS = "trainmedic"
# Reports kept in the workflow (and carried over continue-as-new): the latest ones.
MAX_SIGNALS = 50


def quarantine_workflow_id(cluster: str, node: str) -> str:
    return f"node-{cluster}-{node}"


class QuarantineInput(BaseModel):
    cluster: str
    node: str
    cooldown: timedelta = timedelta(minutes=10)
    # Carried over continue-as-new.
    signals: list[IncidentSignal] = Field(default_factory=list)
    checks: list[HealthResult] = Field(default_factory=list)
    escalated: str | None = None


class HealthRequest(BaseModel):
    node: str


class HealthResult(BaseModel):
    node: str
    healthy: bool
    checks: dict[str, bool] = Field(default_factory=dict)  # name -> passed
    detail: str = ""
    at: datetime | None = None


class ResumeRequest(BaseModel):
    node: str
    only_if_reason_contains: str = OURS


class ReleasePayload(BaseModel):
    by: str = ""
    comment: str = ""


QuarantineState = Literal["cooling_down", "checking", "kept_out", "resumed", "left_alone"]


class QuarantineStatus(BaseModel):
    cluster: str
    node: str
    state: QuarantineState
    details: str
    signals: list[IncidentSignal] = Field(default_factory=list)
    checks: list[HealthResult] = Field(default_factory=list)
    released_by: ReleasePayload | None = None
    resume: EffectResult | None = None
    escalated: str | None = None
    ignored: list[str] = Field(default_factory=list)  # refused releases, and why


QuarantineInput.model_rebuild()

ACTIVITY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)


@workflow.defn(name="NodeQuarantineWorkflow")
class NodeQuarantineWorkflow:
    @workflow.init
    def __init__(self, request: QuarantineInput) -> None:
        self.request = request
        self.signals: list[IncidentSignal] = list(request.signals)
        self.checks: list[HealthResult] = list(request.checks)
        self.escalated = request.escalated
        self.state: QuarantineState = "cooling_down"
        self.details = "waiting for reports to settle"
        self.released: ReleasePayload | None = None
        self.ignored: list[str] = []
        self.resume_result: EffectResult | None = None
        self.new_reports = 0
        self.seen = 0  # reports counted when the current wait began

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
        self.released = payload

    @workflow.query
    def status(self) -> QuarantineStatus:
        return QuarantineStatus(
            cluster=self.request.cluster,
            node=self.request.node,
            state=self.state,
            details=self.details,
            signals=self.signals,
            checks=self.checks,
            released_by=self.released,
            resume=self.resume_result,
            escalated=self.escalated,
            ignored=self.ignored,
        )

    def _set(self, state: QuarantineState, details: str) -> None:
        self.state = state
        self.details = details
        workflow.set_current_details(f"{self.request.node}: {state} - {details}")

    async def _cool_down(self) -> None:
        """Wait `cooldown` after the last report (a new one restarts it), or a release."""
        cooldown = self.request.cooldown
        while self.released is None:
            self.seen = self.new_reports
            self._set(
                "cooling_down",
                f"health check {int(cooldown.total_seconds())} s after the last report",
            )
            try:
                await workflow.wait_condition(
                    lambda: self.released is not None or self.new_reports != self.seen,
                    timeout=cooldown,
                )
            except TimeoutError:
                return

    @workflow.run
    async def run(self, request: QuarantineInput) -> QuarantineStatus:
        node = request.node
        while True:
            await self._cool_down()
            self._set("checking", "running the health check")
            health: HealthResult = await workflow.execute_activity(
                "quarantine_check_health",
                HealthRequest(node=node),
                result_type=HealthResult,
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=ACTIVITY_RETRY,
            )
            self.checks = [*self.checks, health][-MAX_SIGNALS:]
            if health.healthy or self.released is not None:
                self.resume_result = await workflow.execute_activity(
                    "quarantine_resume_node",
                    ResumeRequest(node=node),
                    result_type=EffectResult,
                    start_to_close_timeout=timedelta(minutes=2),
                    retry_policy=ACTIVITY_RETRY,
                )
                why = f"released by {self.released.by}" if self.released else "healthy"
                if self.resume_result.changed:
                    self._set("resumed", f"{why}; {self.resume_result.detail}")
                else:
                    # Not drained by us: Slurm brought it back, or an admin holds it.
                    self._set("left_alone", f"{why}; {self.resume_result.detail}")
                return self.status()
            # Unhealthy: keep it out; a person decides (release) or new reports restart.
            self.escalated = f"{node} failed its health check: {health.detail}"
            self._set("kept_out", f"{self.escalated}; waiting for `release` or new reports")
            workflow.logger.warning("quarantine escalated: %s", self.escalated)
            self.seen = self.new_reports
            await workflow.wait_condition(
                lambda: (
                    self.released is not None
                    or self.new_reports != self.seen
                    or workflow.info().is_continue_as_new_suggested()
                )
            )
            if workflow.info().is_continue_as_new_suggested() and self.released is None:
                workflow.continue_as_new(
                    QuarantineInput(
                        cluster=request.cluster,
                        node=node,
                        cooldown=request.cooldown,
                        signals=self.signals,
                        checks=self.checks,
                        escalated=self.escalated,
                    )
                )
