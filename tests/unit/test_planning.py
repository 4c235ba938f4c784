"""Planning: diagnosis + policy -> effects, and the mode each effect runs under."""

from __future__ import annotations

from trainmedic.config import parse_policy
from trainmedic.domain import Action, Category, Diagnosis, Mode
from trainmedic.domain.incident import EffectKind
from trainmedic.domain.slurm import SlurmJob, SlurmNode
from trainmedic.workflows.planning import cause_key, effect_mode, is_ours, plan_effects


def diagnosis(
    action: Action, culprits: list[str], category: Category = Category.GPU_HARDWARE
) -> Diagnosis:
    return Diagnosis(
        category=category,
        action=action,
        culprit_nodes=culprits,
        confidence=0.9,
        catalog_version="test",
        summary="Xid 79",
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
