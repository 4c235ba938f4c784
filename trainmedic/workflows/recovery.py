"""RecoveryWorkflow: one failure, from detection to a recorded outcome.

detect -> attribute -> plan -> (gate -> isolate/act) per effect -> verify.

Deterministic orchestration only: every look at Slurm and every change to it is an
activity, and each effect passes its gate (mode), its safety rail (ControlWorkflow)
and a fresh read of the world (inside the activity) before anything happens.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from trainmedic.activities.attribution import AttributionActivities
    from trainmedic.activities.control import ControlActivities
    from trainmedic.activities.notify import NotifyActivities
    from trainmedic.activities.slurm import SlurmActivities
    from trainmedic.activities.telemetry import TelemetryActivities
    from trainmedic.config import Policy
    from trainmedic.domain.activity_io import (
        ApplyEffectRequest,
        ConsistencyRequest,
        ControlRef,
        Gathered,
        GatherRequest,
        ReserveIsolation,
        ReserveRestart,
        VerifyRequest,
    )
    from trainmedic.domain.control import (
        IsolationGrant,
        IsolationRequest,
        RestartGrant,
        RestartRequest,
    )
    from trainmedic.domain.diagnosis import AttributionRequest, Diagnosis, SlurmObservation
    from trainmedic.domain.enums import Action, Mode, Outcome, Stage
    from trainmedic.domain.incident import (
        Decision,
        DecisionPayload,
        EffectKind,
        EffectStatus,
        IncidentInput,
        IncidentResult,
        IncidentSignal,
        IncidentStatus,
        IncidentTimes,
        PlannedEffect,
    )
    from trainmedic.domain.notify import Notification, NotifyEvent, NotifyResult
    from trainmedic.domain.telemetry import OutcomeRecord, OutcomeRecorded
    from trainmedic.temporal.search_attributes import (
        TM_ACTION,
        TM_CATEGORY,
        TM_CLUSTER,
        TM_JOB,
        TM_MODE,
        TM_NODES,
        TM_OUTCOME,
        TM_STAGE,
    )
    from trainmedic.workflows.planning import cause_key, plan_effects, running_job_untouched


def _backoff(attempts: int, longest_s: float, first_s: float = 1.0) -> RetryPolicy:
    """Retries whose waits double from `first_s` up to `longest_s`, `attempts` in all."""
    return RetryPolicy(
        initial_interval=timedelta(seconds=first_s),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=longest_s),
        maximum_attempts=attempts,
    )


READ_RETRY = _backoff(10, longest_s=30)
# Effects retry less: each attempt re-reads the world first, so a retry after a lost
# reply is safe, but an effect that keeps failing should reach a person soon.
EFFECT_RETRY = _backoff(5, longest_s=10)
DECIDED = {
    EffectStatus.APPROVED,
    EffectStatus.REJECTED,
    EffectStatus.ABANDONED,
}
# A notification must never hold recovery up: it runs beside the effects, and gives up
# after a few minutes of a receiver that does not answer.
NOTIFY_RETRY = _backoff(6, longest_s=60, first_s=2)
NOTIFY_PATCH = "notify-webhook"
# The incident's figures (metrics) are recorded by an activity at its end: a few quick
# tries, and a failure is logged, never the incident's.
RECORD_OUTCOME_PATCH = "record-outcome"
RECORD_RETRY = _backoff(3, longest_s=5)
FINAL = {
    EffectStatus.WOULD_APPLY,
    EffectStatus.REJECTED,
    EffectStatus.APPLIED,
    EffectStatus.ALREADY_TRUE,
    EffectStatus.SKIPPED,
    EffectStatus.BLOCKED,
    EffectStatus.FAILED,
    EffectStatus.ABANDONED,
}


STORM_SUBJECT = "storm"


def incident_workflow_id(cluster: str, subject: str, n: int) -> str:
    """docs/architecture.md "Incident identity": incident-<cluster>-<job or node>-<n>."""
    return f"incident-{cluster}-{subject}-{n}"


def is_storm(workflow_id: str) -> bool:
    return f"-{STORM_SUBJECT}-" in workflow_id


@workflow.defn(name="RecoveryWorkflow")
class RecoveryWorkflow:
    @workflow.init
    def __init__(self, request: IncidentInput) -> None:
        self.request = request
        self.stage = Stage.DETECT
        self.mode = request.mode or Mode.MONITOR
        self.details = "gathering evidence"
        self.signals: list[IncidentSignal] = [request.signal] if request.signal else []
        self.diagnosis: Diagnosis | None = None
        self.effects: list[PlannedEffect] = []
        self.decisions: list[Decision] = []
        self.ignored: list[str] = []
        self.outcome: Outcome | None = None
        self.policy: Policy | None = None
        self.breaker: str | None = None  # why the cluster's breaker is open, if it is
        self.notifications: list[asyncio.Task[NotifyResult]] = []
        self.running_again_at: datetime | None = None
        self.breaker_tripped = False  # a reservation of this incident tripped the breaker

    # -- operator messages ----------------------------------------------------------

    @workflow.signal
    def approve(self, payload: DecisionPayload) -> None:
        self._take_signal(payload, approve=True)

    @workflow.signal
    def reject(self, payload: DecisionPayload) -> None:
        self._take_signal(payload, approve=False)

    @workflow.update
    def decide(self, payload: DecisionPayload) -> IncidentStatus:
        self._apply_decision(payload, payload.decision == "approve", via="update")
        return self.status()

    @decide.validator
    def _validate_decide(self, payload: DecisionPayload) -> None:
        if payload.decision is None:
            raise ValueError("say 'decision': 'approve' or 'reject'")
        problem = self._decision_problem(payload)
        if problem:
            raise ValueError(problem)

    @workflow.signal
    def report(self, signal: IncidentSignal) -> None:
        """More evidence about this failure (a watcher's signal-with-start lands here)."""
        self.signals.append(signal)

    @workflow.query
    def status(self) -> IncidentStatus:
        return IncidentStatus(
            incident_id=workflow.info().workflow_id,
            cluster=self.request.cluster,
            job_id=self.request.job_id,
            stage=self.stage,
            mode=self.mode,
            details=self.details,
            diagnosis=self.diagnosis,
            effects=self.effects,
            decisions=self.decisions,
            ignored=self.ignored,
            signals=self.signals,
            outcome=self.outcome,
            policy_version=self.policy.version if self.policy else None,
        )

    def _decision_problem(self, payload: DecisionPayload) -> str | None:
        if self.outcome is not None:
            return f"the incident is finished ({self.outcome.value}); nothing to decide"
        if self.stage not in (Stage.PLAN, Stage.GATE, Stage.ISOLATE, Stage.ACT):
            return f"nothing to decide yet: the incident is at stage {self.stage.value}"
        if not payload.by.strip():
            return "say who decides ('by')"
        approvable = [e for e in self.effects if e.mode is Mode.APPROVE]
        if payload.action == "all":
            if not any(
                e.status in (EffectStatus.PLANNED, EffectStatus.AWAITING_APPROVAL)
                for e in approvable
            ):
                return "every effect of this incident is already decided"
            return None
        effect = next((e for e in self.effects if e.id == payload.action), None)
        if effect is None:
            known = ", ".join(e.id for e in approvable) or "none"
            return f"unknown action {payload.action!r}; awaiting approval: {known}"
        if effect.mode is not Mode.APPROVE:
            return f"{effect.id} runs in {effect.mode.value} mode and needs no approval"
        if effect.status not in (EffectStatus.PLANNED, EffectStatus.AWAITING_APPROVAL):
            return f"{effect.id} is already decided ({effect.status.value})"
        return None

    def _take_signal(self, payload: DecisionPayload, approve: bool) -> None:
        problem = self._decision_problem(payload)
        if problem:
            # Signals cannot be refused to the sender; the refusal is recorded instead.
            verb = "approve" if approve else "reject"
            self.ignored.append(f"{verb} {payload.action!r} by {payload.by or '?'}: {problem}")
            workflow.logger.warning("ignored decision: %s", self.ignored[-1])
            return
        self._apply_decision(payload, approve, via="signal")

    def _apply_decision(self, payload: DecisionPayload, approve: bool, via: str) -> None:
        status = EffectStatus.APPROVED if approve else EffectStatus.REJECTED
        touched: list[str] = []
        for effect in self.effects:
            if effect.mode is not Mode.APPROVE:
                continue
            if payload.action not in ("all", effect.id):
                continue
            if effect.status in (EffectStatus.PLANNED, EffectStatus.AWAITING_APPROVAL):
                effect.status = status
                touched.append(effect.id)
        self.decisions.append(
            Decision(
                action=payload.action,
                approve=approve,
                by=payload.by,
                comment=payload.comment,
                via="update" if via == "update" else "signal",
                at=workflow.now(),
                effect_ids=touched,
            )
        )

    # -- the run --------------------------------------------------------------------

    @workflow.run
    async def run(self, request: IncidentInput) -> IncidentResult:
        workflow.upsert_search_attributes(
            [
                TM_CLUSTER.value_set(request.cluster),
                TM_JOB.value_set(request.job_id or ""),
                TM_NODES.value_set(sorted(request.nodes)),
            ]
        )
        try:
            result = await self._recover(request)
        except asyncio.CancelledError:
            result = await self._cancelled(request)
            await self._outcome_recorded(self._record_outcome(result))
            return result
        if result.outcome is Outcome.STOPPED:
            self._notify(NotifyEvent.JOB_STOPPED, result.summary)
        elif result.outcome is Outcome.ESCALATED:
            self._notify(NotifyEvent.ESCALATED, result.summary)
        recording = self._record_outcome(result)
        await self._notifications_sent()
        await self._outcome_recorded(recording)
        return result

    # -- telemetry ----------------------------------------------------------------------

    def _record_outcome(self, result: IncidentResult) -> asyncio.Task[OutcomeRecorded] | None:
        """Start the record_outcome activity (metrics), beside the notifications."""
        if not workflow.patched(RECORD_OUTCOME_PATCH):
            return None  # a history from before telemetry: replay it as it ran
        return workflow.start_activity_method(
            TelemetryActivities.record_outcome,
            OutcomeRecord(
                cluster=self.request.cluster,
                mode=self.mode,
                result=result,
                breaker_tripped=self.breaker_tripped,
            ),
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RECORD_RETRY,
        )

    async def _outcome_recorded(self, recording: asyncio.Task[OutcomeRecorded] | None) -> None:
        if recording is None:
            return
        try:
            await recording
        except ActivityError as error:
            workflow.logger.warning("the incident's metrics were not recorded: %s", error)

    # -- notifications ----------------------------------------------------------------

    def _notify(self, event: NotifyEvent, summary: str, action_hint: str = "") -> None:
        """Start the notify activity beside the recovery (never in its way)."""
        if not workflow.patched(NOTIFY_PATCH):
            return  # a history from before notifications: replay it as it ran
        request = self.request
        notification = Notification(
            event=event,
            incident_id=workflow.info().workflow_id,
            cluster=request.cluster,
            job_id=request.job_id,
            nodes=sorted(
                {*request.nodes, *(self.diagnosis.culprit_nodes if self.diagnosis else [])}
            ),
            summary=summary,
            action_hint=action_hint,
            at=workflow.now(),
        )
        self.notifications.append(
            workflow.start_activity_method(
                NotifyActivities.notify,
                notification,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=NOTIFY_RETRY,
            )
        )

    async def _notifications_sent(self) -> None:
        """Wait for the notifications before closing: a lost one is logged, not fatal."""
        for outcome in await asyncio.gather(*self.notifications, return_exceptions=True):
            if isinstance(outcome, BaseException):
                workflow.logger.warning("a notification was not delivered: %s", outcome)

    async def _recover(self, request: IncidentInput) -> IncidentResult:
        control = await workflow.execute_activity_method(
            ControlActivities.control_snapshot,
            ControlRef(cluster=request.cluster),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=READ_RETRY,
        )
        self.policy = control.policy
        self.breaker = control.breaker_reason if control.breaker_tripped_at else None
        self.mode = self._incident_mode(control.mode, request.mode)
        self._set_stage(Stage.DETECT, f"gathering evidence ({self.mode.value} mode)")
        if control.policy.detect.settle > timedelta(0):
            await workflow.sleep(control.policy.detect.settle)

        gathered = await workflow.execute_activity_method(
            SlurmActivities.gather_evidence,
            GatherRequest(
                incident_id=workflow.info().workflow_id,
                job_id=request.job_id,
                nodes=sorted({*request.nodes, *(n for s in self.signals for n in s.nodes)}),
            ),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=READ_RETRY,
        )

        self._set_stage(Stage.ATTRIBUTE, "attributing the failure")
        self.diagnosis = await workflow.execute_activity_method(
            AttributionActivities.attribute,
            self._attribution_request(request, gathered),
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=60),
            retry_policy=READ_RETRY,
        )
        diagnosis = self.diagnosis
        self._record("diagnosis", diagnosis.model_dump(mode="json"))
        workflow.upsert_search_attributes(
            [
                TM_CATEGORY.value_set(diagnosis.category.value),
                TM_ACTION.value_set(diagnosis.action.value),
                TM_NODES.value_set(sorted({*request.nodes, *diagnosis.culprit_nodes})),
            ]
        )

        self._set_stage(Stage.PLAN, f"planning: {diagnosis.headline()}")
        untouched = running_job_untouched(gathered.job, self.signals)
        if untouched:
            return self._finish(Outcome.NOTED, f"{untouched}: {diagnosis.headline()}")
        if request.job_id is None and is_storm(workflow.info().workflow_id):
            # Many nodes at once is the site's problem (power, network, a bad rollout),
            # not one culprit's: draining them one by one would take the cluster down.
            return self._finish(
                Outcome.ESCALATED,
                f"storm: {len(request.nodes)} nodes failed within a minute "
                f"({', '.join(sorted(request.nodes)[:20])}); a person must look. "
                f"Diagnosis: {diagnosis.headline()}",
            )
        nodes = {node.name: node for node in gathered.nodes}
        self.effects = plan_effects(
            workflow.info().workflow_id,
            diagnosis,
            gathered.job,
            nodes,
            control.policy,
            self.mode,
            forced=request.mode,  # an override may not lift a mode forced on the incident
        )
        self._record_effects()
        if diagnosis.action in (Action.WAIT, Action.ESCALATE) or not self.effects:
            return self._finish_without_effects(gathered)

        blocked = False
        for effect in self.effects:
            if effect.status in FINAL:
                continue  # decided at planning: e.g. a culprit already out of service
            if blocked:
                effect.status = EffectStatus.SKIPPED
                effect.note = effect.note or "not attempted: an earlier effect was blocked"
                continue
            try:
                if not await self._gate(effect):
                    continue
                if not await self._rail(effect, request.cluster, gathered, diagnosis):
                    blocked = True
                    continue
                if effect.status is EffectStatus.ALREADY_TRUE:
                    continue  # another incident drains this node
                await self._apply(effect)
                await self._confirm_isolation(effect, request.cluster, gathered)
            finally:
                self._record_effects()

        return await self._conclude(request, diagnosis)

    def _incident_mode(self, cluster_mode: Mode, forced: Mode | None) -> Mode:
        order = [Mode.MONITOR, Mode.APPROVE, Mode.AUTO]
        if forced is not None and order.index(forced) < order.index(cluster_mode):
            return forced
        return cluster_mode

    def _attribution_request(
        self, request: IncidentInput, gathered: Gathered
    ) -> AttributionRequest:
        job = gathered.job
        reported = sorted({n for s in self.signals for n in s.nodes} | set(request.nodes))
        nodelist = list(job.nodes) if job and job.nodes else reported
        observation = job.observation(gathered.nodes) if job else None
        if observation is None and gathered.nodes:
            observation = SlurmObservation(
                node_states={n.name: n.state_text for n in gathered.nodes},
                node_reasons={n.name: n.reason for n in gathered.nodes if n.reason},
            )
        log_from: dict[str, int] = {}
        for signal in self.signals:  # one run per incident: later reports refine
            log_from.update(signal.log_from)
        return AttributionRequest(
            job_id=request.job_id,
            nodelist=nodelist,
            tasks_per_node=job.tasks_per_node if job else None,
            # NCCL peers and Ray name a node by its IP: Slurm's NodeAddr turns it back
            # into the node (an address equal to the name adds nothing).
            node_addrs={
                n.address: n.name for n in gathered.nodes if n.address and n.address != n.name
            },
            log_paths=gathered.log_paths,
            log_from={p: at for p, at in log_from.items() if p in gathered.log_paths},
            evidence=[e for s in self.signals for e in s.evidence],
            slurm=observation,
        )

    async def _gate(self, effect: PlannedEffect) -> bool:
        """True when the effect may go ahead; records why not otherwise."""
        policy = self.policy or Policy()
        self._set_stage(Stage.GATE, f"gating: {effect.describe()}")
        if effect.mode is Mode.MONITOR:
            effect.status = EffectStatus.WOULD_APPLY
            effect.note = "monitor mode: recorded, not done"
            return False
        if effect.mode is Mode.AUTO or effect.status is EffectStatus.APPROVED:
            return effect.status in (EffectStatus.PLANNED, EffectStatus.APPROVED)
        if effect.status is EffectStatus.REJECTED:
            return False
        effect.status = EffectStatus.AWAITING_APPROVAL
        effect.awaiting_since = workflow.now()
        why = self.diagnosis.headline() if self.diagnosis else ""
        self.details = f"waiting for approval to {effect.describe()}: {why}"
        self._notify(
            NotifyEvent.APPROVAL_NEEDED,
            self.details,
            f"trainmedic incidents approve {workflow.info().workflow_id} --action {effect.id} "
            "--by <you> (or reject)",
        )
        workflow.set_current_details(
            # The UI renders this as markdown: the payload goes in a code span, so that its
            # quotes stay straight and it can be pasted into "Send a Signal" as it is.
            f"{self.details}\n\nApprove or reject with a signal `approve` / `reject` and "
            f'payload `{{"action": "{effect.id}", "by": "YOUR-NAME", "comment": "WHY"}}` '
            f'(or `"action": "all"`); timeout {policy.approval.timeout}, '
            f"then {policy.approval.fallback}."
        )
        try:
            await workflow.wait_condition(
                lambda: effect.status is not EffectStatus.AWAITING_APPROVAL,
                timeout=policy.approval.timeout,
            )
        except TimeoutError:
            fallback = policy.approval.fallback
            self.decisions.append(
                Decision(
                    action=effect.id,
                    approve=fallback == "proceed",
                    by="trainmedic:timeout",
                    comment=f"no decision within {policy.approval.timeout}: {fallback}",
                    via="timeout",
                    at=workflow.now(),
                    effect_ids=[effect.id],
                )
            )
            if fallback == "proceed":
                effect.status = EffectStatus.APPROVED
            else:
                effect.status = EffectStatus.ABANDONED
                effect.note = f"no decision within {policy.approval.timeout} ({fallback})"
        return effect.status is EffectStatus.APPROVED

    async def _rail(
        self, effect: PlannedEffect, cluster: str, gathered: Gathered, diagnosis: Diagnosis
    ) -> bool:
        """Reserve budget with the ControlWorkflow right before the effect."""
        incident_id = workflow.info().workflow_id
        grant: IsolationGrant | RestartGrant
        if effect.kind is EffectKind.DRAIN_NODE and effect.node:
            grant = await workflow.execute_activity_method(
                ControlActivities.reserve_isolation,
                self._isolation(effect, effect.node, cluster, gathered),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=READ_RETRY,
            )
        elif (
            effect.kind in (EffectKind.REQUEUE_JOB, EffectKind.REQUEUE_EXCLUDING) and effect.job_id
        ):
            grant = await workflow.execute_activity_method(
                ControlActivities.reserve_restart,
                ReserveRestart(
                    cluster=cluster,
                    request=RestartRequest(
                        incident_id=incident_id,
                        job_id=effect.job_id,
                        cause=cause_key(diagnosis),
                        progress=self._progress(),
                    ),
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=READ_RETRY,
            )
        else:
            return True
        if (
            isinstance(grant, IsolationGrant)
            and grant.granted
            and grant.held_by
            and workflow.patched("drain-held-by-another-incident")
        ):
            # Incidents about one node race (three jobs on it fail at once): the first
            # reservation drains it; the others keep it out of their jobs and drain nothing.
            effect.status = EffectStatus.ALREADY_TRUE
            effect.note = (
                f"{effect.node} is drained by {grant.held_by} (it reserved the node first); "
                "not drained twice, kept out of the job"
            )
            return True
        if grant.granted:
            return True
        effect.status = EffectStatus.BLOCKED
        effect.note = grant.reason
        if isinstance(grant, IsolationGrant) and grant.breaker_tripped:
            self.breaker_tripped = True
            self._notify(
                NotifyEvent.BREAKER_TRIPPED,
                f"cluster {cluster} is back in monitor mode: {grant.reason}",
                f"trainmedic incidents mode {cluster} auto --by <you> (once the nodes held out are "
                "understood)",
            )
        workflow.logger.warning("%s blocked by a safety rail: %s", effect.id, grant.reason)
        return False

    async def _confirm_isolation(
        self, effect: PlannedEffect, cluster: str, gathered: Gathered
    ) -> None:
        """Tell the ledger a drain took effect, so the node's return to service later
        reads as a release (an operator's resume), not as a drain still on its way."""
        if effect.kind is not EffectKind.DRAIN_NODE or not effect.node:
            return
        if effect.status not in (EffectStatus.APPLIED, EffectStatus.ALREADY_TRUE):
            return
        await workflow.execute_activity_method(
            ControlActivities.confirm_isolation,
            self._isolation(effect, effect.node, cluster, gathered),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=READ_RETRY,
        )

    def _isolation(
        self, effect: PlannedEffect, node: str, cluster: str, gathered: Gathered
    ) -> ReserveIsolation:
        partition = effect.partition or "default"
        return ReserveIsolation(
            cluster=cluster,
            request=IsolationRequest(
                incident_id=workflow.info().workflow_id,
                node=node,
                partition=partition,
                partition_size=gathered.partition_sizes.get(partition, 0),
            ),
        )

    def _progress(self) -> str | None:
        markers = [s.progress for s in self.signals if s.progress]
        return markers[-1] if markers else None

    async def _apply(self, effect: PlannedEffect) -> None:
        stage = Stage.ISOLATE if effect.kind is EffectKind.DRAIN_NODE else Stage.ACT
        self._set_stage(stage, f"applying: {effect.describe()}")
        try:
            outcome = await workflow.execute_activity_method(
                SlurmActivities.apply_effect,
                ApplyEffectRequest(incident_id=workflow.info().workflow_id, effect=effect),
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=EFFECT_RETRY,
            )
        except ActivityError as error:
            effect.status = EffectStatus.FAILED
            cause = error.cause
            effect.note = str(cause.message if isinstance(cause, ApplicationError) else error)
            return
        effect.status = outcome.status
        # A planning note (why a node was not drained) stays beside what Slurm said.
        effect.note = "; ".join(n for n in (effect.note, outcome.note) if n)
        effect.results = outcome.results
        effect.applied_at = workflow.now()
        if effect.status is EffectStatus.APPLIED:
            why = self.diagnosis.headline() if self.diagnosis else ""
            self._notify(NotifyEvent.EFFECT_APPLIED, f"{effect.describe()}: {why}")

    async def _conclude(self, request: IncidentInput, diagnosis: Diagnosis) -> IncidentResult:
        # Culprits found already out of service at planning changed nothing: they
        # neither make an incident "applied" nor keep monitor mode's advice from reading
        # as advice.
        live = [
            e
            for e in self.effects
            if not (e.kind is EffectKind.DRAIN_NODE and e.status is EffectStatus.ALREADY_TRUE)
        ]
        statuses = {e.status for e in live}
        job_effects = [e for e in self.effects if e.job_id]
        if not live:
            out = "; ".join(e.note for e in self.effects)
            return self._finish(Outcome.ESCALATED, f"culprits already out; no job to act on: {out}")
        if statuses <= {EffectStatus.WOULD_APPLY}:
            would = "; ".join(e.describe() for e in live)
            if self.breaker:
                # The cluster fell back to monitor because a rail tripped: this failure
                # still needs handling, by a person.
                return self._finish(
                    Outcome.ESCALATED,
                    f"breaker open ({self.breaker}); a person must decide. Advice: {would}",
                )
            return self._finish(Outcome.RECOMMENDED, f"monitor mode: would {would}")
        if EffectStatus.BLOCKED in statuses:
            reasons = "; ".join(e.note for e in self.effects if e.status is EffectStatus.BLOCKED)
            return self._finish(Outcome.ESCALATED, f"a safety rail stopped recovery: {reasons}")
        if EffectStatus.FAILED in statuses:
            failed = "; ".join(
                f"{e.describe()}: {e.note}" for e in self.effects if e.status is EffectStatus.FAILED
            )
            return self._finish(Outcome.ESCALATED, f"an effect failed: {failed}")
        if any(e.status is EffectStatus.ABANDONED for e in self.effects):
            outcome = (
                Outcome.ABANDONED
                if self.policy and self.policy.approval.fallback == "abandon"
                else Outcome.ESCALATED
            )
            return self._finish(outcome, "no decision in time; nothing more was done")
        if any(e.status is EffectStatus.REJECTED for e in job_effects) or (
            not job_effects and EffectStatus.REJECTED in statuses
        ):
            return self._finish(Outcome.REJECTED, "rejected by an operator; left as it is")

        done = [
            e for e in job_effects if e.status in (EffectStatus.APPLIED, EffectStatus.ALREADY_TRUE)
        ]
        if any(e.kind is EffectKind.CANCEL_JOB for e in done):
            return self._finish(Outcome.STOPPED, f"job stopped: {diagnosis.headline()}")
        requeued = [
            e for e in done if e.kind in (EffectKind.REQUEUE_JOB, EffectKind.REQUEUE_EXCLUDING)
        ]
        if requeued and requeued[0].job_id:
            return await self._verify(requeued[0].job_id, diagnosis)
        if job_effects:
            skipped = "; ".join(f"{e.describe()}: {e.note}" for e in job_effects)
            return self._finish(Outcome.ESCALATED, f"the job was not acted on: {skipped}")
        return self._finish(Outcome.ESCALATED, "culprits isolated; no job to restart")

    async def _verify(self, job_id: str, diagnosis: Diagnosis) -> IncidentResult:
        policy = self.policy or Policy()
        self._set_stage(Stage.VERIFY, f"waiting for job {job_id} to run again")
        result = await workflow.execute_activity_method(
            SlurmActivities.verify_job,
            VerifyRequest(
                incident_id=workflow.info().workflow_id,
                job_id=job_id,
                avoid_nodes=diagnosis.culprit_nodes,
                timeout_s=policy.verify.timeout.total_seconds(),
                poll_s=policy.verify.poll_interval.total_seconds(),
            ),
            start_to_close_timeout=policy.verify.timeout + timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=READ_RETRY,
        )
        if result.running:
            self.running_again_at = workflow.now()
            return self._finish(
                Outcome.RECOVERED,
                f"job {job_id} runs again on {','.join(result.nodes)}",
                job_nodes_after=result.nodes,
            )
        return self._finish(
            Outcome.ESCALATED,
            f"job {job_id} did not run again within {policy.verify.timeout}: {result.detail}",
            job_nodes_after=result.nodes,
        )

    def _finish_without_effects(self, gathered: Gathered) -> IncidentResult:
        diagnosis = self.diagnosis
        headline = diagnosis.headline() if diagnosis else "no diagnosis"
        problems = f" ({'; '.join(gathered.problems)})" if gathered.problems else ""
        if diagnosis and diagnosis.action is Action.WAIT:
            # Not "the scheduler requeues it": Slurm requeues a preempted job or one that
            # lost a node, never one that ran out its time limit, which is its owner's to
            # resubmit. Either way it is not ours to restart.
            return self._finish(
                Outcome.WAITING_ON_SCHEDULER,
                f"not restarted by trainmedic, the scheduler's or the owner's call: {headline}",
            )
        return self._finish(Outcome.ESCALATED, f"needs a person: {headline}{problems}")

    def _finish(
        self, outcome: Outcome, summary: str, job_nodes_after: list[str] | None = None
    ) -> IncidentResult:
        self.outcome = outcome
        self._record("outcome", {"outcome": outcome.value, "summary": summary})
        self._set_stage(Stage.DONE, f"{outcome.value}: {summary}")
        workflow.upsert_search_attributes([TM_OUTCOME.value_set(outcome.value)])
        return IncidentResult(
            incident_id=workflow.info().workflow_id,
            outcome=outcome,
            summary=summary,
            diagnosis=self.diagnosis,
            effects=self.effects,
            decisions=self.decisions,
            job_nodes_after=job_nodes_after or [],
            times=self._times(),
        )

    def _times(self) -> IncidentTimes:
        # A report's time comes from outside (a spool file, a person): naive means UTC.
        reported = [
            s.at if s.at.tzinfo else s.at.replace(tzinfo=UTC)
            for s in self.signals
            if s.at is not None
        ]
        applied = [
            e.applied_at
            for e in self.effects
            if e.applied_at is not None and e.status is EffectStatus.APPLIED
        ]
        return IncidentTimes(
            failed_at=min(reported) if reported else None,
            opened_at=workflow.info().start_time,
            acted_at=min(applied) if applied else None,
            running_again_at=self.running_again_at,
            last_progress=self._progress(),
        )

    async def _cancelled(self, request: IncidentInput) -> IncidentResult:
        """Cancellation: finish no effect half-way, and say what Slurm looks like now."""
        for effect in self.effects:
            if effect.status not in FINAL:
                effect.status = EffectStatus.SKIPPED
                effect.note = "incident cancelled before this effect"
        report = await workflow.execute_activity_method(
            SlurmActivities.check_consistency,
            ConsistencyRequest(
                incident_id=workflow.info().workflow_id,
                job_id=request.job_id,
                nodes=sorted({*request.nodes, *(e.node for e in self.effects if e.node)}),
            ),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=READ_RETRY,
        )
        applied = [e.describe() for e in self.effects if e.status is EffectStatus.APPLIED]
        done = "; ".join(applied) if applied else "no effect was applied"
        return self._finish(Outcome.CANCELLED, f"cancelled: {done}. Slurm now: {report.summary}")

    def _record(self, key: str, value: object) -> None:
        # The memo puts each step's record in the history as its own event
        # (WorkflowPropertiesModified): the audit trail needs no result to exist yet,
        # and monitor mode's would-be effects are visible there.
        workflow.upsert_memo({key: value})

    def _record_effects(self) -> None:
        self._record("effects", [effect.model_dump(mode="json") for effect in self.effects])
        if self.decisions:
            self._record(
                "decisions", [decision.model_dump(mode="json") for decision in self.decisions]
            )

    def _set_stage(self, stage: Stage, details: str) -> None:
        self.stage = stage
        self.details = details
        workflow.set_current_details(details)
        workflow.upsert_search_attributes(
            [TM_STAGE.value_set(stage.value), TM_MODE.value_set(self.mode.value)]
        )
