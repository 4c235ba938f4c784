"""Planning: diagnosis + policy -> effects, and the mode each effect runs under."""

from __future__ import annotations

from trainmedic.config import parse_policy
from trainmedic.domain import Action, Category, Diagnosis, Evidence, EvidenceSource, Mode
from trainmedic.domain.incident import NODE_EVIDENCE, EffectKind, EffectStatus, IncidentSignal
from trainmedic.domain.slurm import SlurmJob, SlurmNode
from trainmedic.workflows.planning import (
    cause_key,
    effect_mode,
    is_ours,
    plan_effects,
    running_job_untouched,
    slurm_reason,
)


def diagnosis(
    action: Action,
    culprits: list[str],
    category: Category = Category.GPU_HARDWARE,
    source: EvidenceSource = EvidenceSource.KERNEL,
) -> Diagnosis:
    """Culprits witnessed by `source` (the node agent's kernel log unless told)."""
    return Diagnosis(
        category=category,
        action=action,
        culprit_nodes=culprits,
        confidence=0.9,
        catalog_version="test",
        summary="Xid 79",
        evidence=[
            Evidence(source=source, text=f"NVRM: Xid (PCI:0000:3b:00): 79 on {n}", node=n)
            for n in culprits
        ],
    )


JOB = SlurmJob(
    job_id="42",
    state="FAILED",
    partition="gpu",
    nodes=["gpu01", "gpu02"],
    restarts=1,
    excluded_nodes=["gpu09"],
)
NODES = {n: SlurmNode(name=n, state="IDLE", partitions=["gpu"]) for n in ("gpu01", "gpu02")}


def test_drain_and_restart_isolates_first_then_requeues_excluding() -> None:
    policy = parse_policy("mode: {default: auto}")
    effects = plan_effects(
        "inc-1", diagnosis(Action.DRAIN_AND_RESTART, ["gpu02"]), JOB, NODES, policy, Mode.AUTO
    )
    assert [(e.id, e.kind) for e in effects] == [
        ("drain-gpu02", EffectKind.DRAIN_NODE),
        ("requeue-42", EffectKind.REQUEUE_EXCLUDING),
    ]
    assert effects[1].exclude == ["gpu02", "gpu09"]  # the user's own exclusions are kept
    assert effects[1].seen_restarts == 1
    assert effects[0].reason.startswith("trainmedic inc-1: gpu_hardware")
    assert is_ours(effects[0].reason)


def test_other_actions() -> None:
    policy = parse_policy("")
    stop = plan_effects(
        "i", diagnosis(Action.STOP, [], Category.USER_CODE), JOB, NODES, policy, Mode.AUTO
    )
    assert [e.kind for e in stop] == [EffectKind.CANCEL_JOB]
    restart = plan_effects("i", diagnosis(Action.RESTART, []), JOB, NODES, policy, Mode.AUTO)
    assert [e.kind for e in restart] == [EffectKind.REQUEUE_JOB]
    excl = plan_effects(
        "i", diagnosis(Action.RESTART_EXCLUDING, ["gpu01"]), JOB, NODES, policy, Mode.AUTO
    )
    assert [e.kind for e in excl] == [EffectKind.REQUEUE_EXCLUDING]
    for action in (Action.WAIT, Action.ESCALATE):
        assert plan_effects("i", diagnosis(action, ["gpu01"]), JOB, NODES, policy, Mode.AUTO) == []
    # No job known: only the isolation.
    alone = plan_effects(
        "i", diagnosis(Action.DRAIN_AND_RESTART, ["gpu01"]), None, NODES, policy, Mode.AUTO
    )
    assert [e.kind for e in alone] == [EffectKind.DRAIN_NODE]


def test_effect_mode_precedence() -> None:
    policy = parse_policy(
        "mode: {default: approve, actions: {restart: auto}, partitions: {prod: monitor}}"
    )
    assert effect_mode(policy, Mode.APPROVE, Action.RESTART, "gpu") is Mode.AUTO
    assert effect_mode(policy, Mode.APPROVE, Action.STOP, "gpu") is Mode.APPROVE
    assert effect_mode(policy, Mode.AUTO, Action.RESTART, "prod") is Mode.MONITOR
    # Both overrides set: the stricter wins (a trusted action in a careful partition).
    assert effect_mode(policy, Mode.APPROVE, Action.RESTART, "prod") is Mode.MONITOR
    # A cluster in monitor (operator or breaker) keeps every effect in monitor.
    assert effect_mode(policy, Mode.MONITOR, Action.RESTART, "gpu") is Mode.MONITOR
    # A forced mode only lowers autonomy.
    assert (
        effect_mode(policy, Mode.AUTO, Action.RESTART, "gpu", forced=Mode.APPROVE) is Mode.APPROVE
    )
    assert effect_mode(policy, Mode.APPROVE, Action.STOP, "gpu", forced=Mode.AUTO) is Mode.APPROVE


def test_cause_key_names_category_and_culprits() -> None:
    assert cause_key(diagnosis(Action.RESTART, ["gpu02", "gpu01"])) == "gpu_hardware@gpu01,gpu02"
    assert cause_key(diagnosis(Action.RESTART, [], Category.USER_CODE)) == "user_code@-"


def test_a_node_only_the_job_names_is_the_same_cause_on_any_node() -> None:
    # A broken site prolog fails the job on gpu01, then on gpu02 after the restart that
    # excluded gpu01; only the job's output names them: one cause, so the restart budget
    # ends the walk across the cluster. No culprit at all is the same cause too.
    log = EvidenceSource.LOG
    first = diagnosis(Action.RESTART_EXCLUDING, ["gpu01"], Category.NODE_DOWN, log)
    second = diagnosis(Action.RESTART_EXCLUDING, ["gpu02"], Category.NODE_DOWN, log)
    printed_drain = diagnosis(Action.DRAIN_AND_RESTART, ["gpu03"], Category.NODE_DOWN, log)
    nobody = diagnosis(Action.RESTART, [], Category.NODE_DOWN, log)
    assert len({cause_key(d) for d in (first, second, printed_drain, nobody)}) == 1
    # Hardware proof on two nodes is two failures (two bad GPUs in a large cluster), and
    # Slurm's own word on a node counts as proof.
    assert cause_key(diagnosis(Action.DRAIN_AND_RESTART, ["gpu01"])) != cause_key(
        diagnosis(Action.DRAIN_AND_RESTART, ["gpu02"])
    )
    slurm = EvidenceSource.SLURM
    assert cause_key(diagnosis(Action.RESTART_EXCLUDING, ["gpu01"], Category.NODE_DOWN, slurm)) == (
        "node_down@gpu01"
    )


def test_a_forced_incident_mode_is_not_lifted_by_an_action_override() -> None:
    """Issue 9.8: "mode": "approve" on the incident, `actions: {restart: auto}`."""
    policy = parse_policy("mode: {default: auto, actions: {restart: auto}}")
    effects = plan_effects(
        "i", diagnosis(Action.RESTART, []), JOB, NODES, policy, Mode.APPROVE, forced=Mode.APPROVE
    )
    assert [e.mode for e in effects] == [Mode.APPROVE]


def test_a_node_only_the_jobs_output_names_is_excluded_not_drained() -> None:
    """Issue 9.4: a user printing `gpu02: NVRM: Xid ... 79` must not take gpu02 out."""
    policy = parse_policy("mode: {default: auto}")
    forged = diagnosis(Action.DRAIN_AND_RESTART, ["gpu02"], source=EvidenceSource.LOG)
    effects = plan_effects("i", forged, JOB, NODES, policy, Mode.AUTO)
    assert [(e.kind, e.exclude) for e in effects] == [
        (EffectKind.REQUEUE_EXCLUDING, ["gpu02", "gpu09"])
    ]
    assert "only the job's own output names it" in effects[0].note
    # In approve mode the operator's approval is the proof: the drain is proposed.
    approve = plan_effects("i", forged, JOB, NODES, policy, Mode.APPROVE)
    assert [e.kind for e in approve] == [EffectKind.DRAIN_NODE, EffectKind.REQUEUE_EXCLUDING]
    assert "your approval is the proof" in approve[0].note
    # Slurm's own word that the node is down is trusted.
    down = dict(NODES, gpu02=SlurmNode(name="gpu02", state="IDLE", state_flags=["NOT_RESPONDING"]))
    assert plan_effects("i", forged, JOB, down, policy, Mode.AUTO)[0].kind is EffectKind.DRAIN_NODE


def test_evidence_may_only_name_the_jobs_nodes() -> None:
    policy = parse_policy("mode: {default: auto}")
    effects = plan_effects(
        "i", diagnosis(Action.DRAIN_AND_RESTART, ["gpu07"]), JOB, NODES, policy, Mode.AUTO
    )
    assert [e.kind for e in effects] == [EffectKind.REQUEUE_JOB]
    assert "ignored gpu07: not a node of job 42" in effects[0].note


def test_a_node_already_out_is_already_true_and_the_job_still_restarts() -> None:
    """Issue 9.2: an admin set the node DOWN under the running job."""
    policy = parse_policy("mode: {default: auto}")
    nodes = dict(
        NODES,
        gpu02=SlurmNode(
            name="gpu02", state="DOWN", state_flags=["DRAIN"], reason="bad dimm", reason_user="ops"
        ),
    )
    effects = plan_effects(
        "i", diagnosis(Action.DRAIN_AND_RESTART, ["gpu02"]), JOB, nodes, policy, Mode.AUTO
    )
    assert [(e.kind, e.status) for e in effects] == [
        (EffectKind.DRAIN_NODE, EffectStatus.ALREADY_TRUE),
        (EffectKind.REQUEUE_EXCLUDING, EffectStatus.PLANNED),
    ]
    assert "already out of service (DOWN+DRAIN, reason 'bad dimm' by ops)" in effects[0].note


def test_a_running_job_is_left_alone_on_its_own_output() -> None:
    running = JOB.model_copy(update={"state": "RUNNING"})
    line = IncidentSignal(source="log", kind="log_match", job_id="42")
    assert running_job_untouched(running, [line, line]) is not None
    assert running_job_untouched(JOB, [line]) is None  # it failed: act
    hang = IncidentSignal(source="log", kind="hang", job_id="42")
    kernel = IncidentSignal(source="kernel", kind="log_match", job_id="42")
    assert running_job_untouched(running, [line, hang]) is None
    assert running_job_untouched(running, [line, kernel]) is None
    assert running_job_untouched(running, []) is None  # started by an operator
    # A node finding that leaves the node fit (an Xid 13, a kernel OOM kill) likewise.
    finding = IncidentSignal(source="kernel", kind=NODE_EVIDENCE, job_id="42")
    why = running_job_untouched(running, [line, finding])
    assert why is not None and "node findings that leave its nodes fit" in why
    assert running_job_untouched(JOB, [finding]) is None
    assert running_job_untouched(running, [finding, hang]) is None


def test_drain_reasons_carry_no_control_characters() -> None:
    forged = diagnosis(Action.DRAIN_AND_RESTART, ["gpu02"])
    forged.summary = "Xid 79\x1b[31m\r\nreason=evil\x00 \u2603 ok"
    reason = slurm_reason("inc-1", forged)
    assert reason == "trainmedic inc-1: gpu_hardware: Xid 79 [31m reason=evil ok"


def test_a_job_pinned_to_the_culprit_is_not_requeued_to_pend_for_ever() -> None:
    """Found by the chaos suite: `sbatch -w gpu02` excluding gpu02 never starts."""
    policy = parse_policy("mode: {default: auto}")
    pinned = JOB.model_copy(update={"required_nodes": ["gpu02"]})
    effects = plan_effects(
        "i", diagnosis(Action.DRAIN_AND_RESTART, ["gpu02"]), pinned, NODES, policy, Mode.AUTO
    )
    assert [(e.kind, e.status) for e in effects] == [
        (EffectKind.DRAIN_NODE, EffectStatus.PLANNED),
        (EffectKind.REQUEUE_EXCLUDING, EffectStatus.SKIPPED),
    ]
    assert "must run on gpu02 (--nodelist)" in effects[1].note
