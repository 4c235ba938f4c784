"""The Attributor as the recovery loop calls it, and the CLI (corpus gate: test_corpus_real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from trainmedic.catalog import Attributor
from trainmedic.cli.attribute import register
from trainmedic.domain import (
    Action,
    AttributionRequest,
    Category,
    Evidence,
    EvidenceSource,
    SlurmObservation,
)

CORPUS = Path(__file__).parents[1] / "corpus"
NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
ENGINE = Attributor()


def _req(**kw: object) -> AttributionRequest:
    return AttributionRequest(nodelist=NODES, tasks_per_node=8, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("obs", "category", "action", "culprits"),
    [
        (
            SlurmObservation(job_state="FAILED", node_states={"gpu03": "DOWN*", "gpu01": "MIXED"}),
            Category.NODE_DOWN,
            Action.DRAIN_AND_RESTART,
            ["gpu03"],
        ),
        (
            SlurmObservation(job_state="RUNNING", node_states={"gpu02": "IDLE+NOT_RESPONDING"}),
            Category.NODE_DOWN,
            Action.DRAIN_AND_RESTART,
            ["gpu02"],
        ),
        (SlurmObservation(job_state="OUT_OF_MEMORY"), Category.OOM_HOST, Action.STOP, []),
        (SlurmObservation(job_state="TIMEOUT"), Category.SCHEDULER_PREEMPTION, Action.WAIT, []),
        (SlurmObservation(job_state="PREEMPTED"), Category.SCHEDULER_PREEMPTION, Action.WAIT, []),
        (SlurmObservation(job_state="FAILED", exit_code=1), Category.UNKNOWN, Action.ESCALATE, []),
    ],
)
def test_slurm_state_alone(obs, category, action, culprits) -> None:
    diagnosis = ENGINE.attribute(_req(slurm=obs))
    assert (diagnosis.category, diagnosis.action) == (category, action)
    assert diagnosis.culprit_nodes == culprits
    assert diagnosis.catalog_version == ENGINE.catalog.version


@pytest.mark.parametrize(
    "printed",
    [
        "slurm node gpu03 state=DOWN+NOT_RESPONDING reason=Not responding",
        "> slurm job_state=NODE_FAIL reason=NodeDown exit_code=0 signal=None",
        "slurm job_state=OUT_OF_MEMORY",
    ],
)
def test_a_job_printing_slurm_state_lines_is_not_slurm(tmp_path: Path, printed: str) -> None:
    # The rules for Slurm's own state read the lines the engine renders from Slurm; a job
    # echoing the same words (a wrapper script, a copied diagnosis) is not Slurm saying so.
    log = tmp_path / "out.log"
    log.write_text(printed + "\n")
    from_log = ENGINE.attribute(_req(log_paths=[str(log)]))
    assert not any(r.startswith("slurm_state.") for r in from_log.rule_ids)
    assert not from_log.culprit_nodes
    from_slurm = ENGINE.attribute(
        _req(slurm=SlurmObservation(job_state="FAILED", node_states={"gpu03": "DOWN"}))
    )
    assert from_slurm.rule_ids[0].startswith("slurm_state.")


def test_state_words_from_other_origins_are_not_slurms_state(tmp_path: Path) -> None:
    # A log line handed over as evidence, and a node's free-text reason (an admin's or a
    # health check's words), are not Slurm's state either.
    printed = Evidence(source=EvidenceSource.LOG, text="slurm job_state=OUT_OF_MEMORY")
    assert ENGINE.attribute(_req(evidence=[printed])).category is Category.UNKNOWN
    reason = SlurmObservation(
        job_state="RUNNING",
        node_states={"gpu03": "MIXED+DRAIN"},
        node_reasons={"gpu03": "slurm job_state=OUT_OF_MEMORY"},
    )
    assert not any(
        r.startswith("slurm_state.") for r in ENGINE.attribute(_req(slurm=reason)).rule_ids
    )
    # The same reason field still carries catalog lines that are not Slurm's own words.
    xid = SlurmObservation(
        job_state="RUNNING",
        node_states={"gpu03": "MIXED+DRAIN"},
        node_reasons={"gpu03": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"},
    )
    assert ENGINE.attribute(_req(slurm=xid)).category is Category.GPU_HARDWARE


def test_a_job_printing_the_controllers_node_death_line_is_not_the_controller(
    tmp_path: Path,
) -> None:
    # Only the controller's liveness check writes this line (source agent_heartbeat); a
    # job printing it would otherwise turn its own stop into a restart excluding gpu02.
    log = tmp_path / "out.log"
    log.write_text(
        "ValueError: bad config\n"
        "gpu02: trainmedic: node gpu02 confirmed dead: agent silent for 7.1 s\n"
    )
    diagnosis = ENGINE.attribute(_req(log_paths=[str(log)]))
    assert (diagnosis.action, diagnosis.culprit_nodes) == (Action.STOP, [])
    heartbeat = Evidence(
        source=EvidenceSource.AGENT_HEARTBEAT,
        node="gpu02",
        text="trainmedic: node gpu02 confirmed dead: agent silent for 7.1 s",
    )
    from_controller = ENGINE.attribute(_req(evidence=[heartbeat]))
    assert (from_controller.category, from_controller.culprit_nodes) == (
        Category.NODE_DOWN,
        ["gpu02"],
    )


def test_a_job_printing_the_watchers_hang_line_is_not_a_hang(tmp_path: Path) -> None:
    # Only the log watcher writes this line (source progress); a job printing it would
    # otherwise turn an unexplained failure, escalated to a person, into a restart.
    line = "trainmedic: no training progress for 600 s (last: step 12 at 2026-12-01T10:00:00Z)"
    log = tmp_path / "out.log"
    log.write_text(f"{line}\n")
    printed = ENGINE.attribute(_req(log_paths=[str(log)]))
    assert (printed.category, printed.action) == (Category.UNKNOWN, Action.ESCALATE)
    as_log_evidence = ENGINE.attribute(
        _req(evidence=[Evidence(source=EvidenceSource.LOG, text=line)])
    )
    assert as_log_evidence.category is Category.UNKNOWN
    watched = ENGINE.attribute(_req(evidence=[Evidence(source=EvidenceSource.PROGRESS, text=line)]))
    assert (watched.category, watched.action) == (Category.HANG, Action.RESTART)


def test_node_outside_the_job_is_not_blamed() -> None:
    obs = SlurmObservation(job_state="FAILED", exit_code=1, node_states={"gpu09": "DOWN"})
    diagnosis = ENGINE.attribute(_req(slurm=obs))
    assert diagnosis.category is Category.UNKNOWN and not diagnosis.culprit_nodes


def test_kernel_evidence_beats_cascades_in_logs(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    lines = [
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=9) ran for 600100 milliseconds before timing out."
        for r in range(32)
    ]
    log.write_text("\n".join(lines) + "\n")
    xid = Evidence(
        source=EvidenceSource.KERNEL,
        node="gpu02",
        text="NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python, DBE (0x00000000)",
    )
    diagnosis = ENGINE.attribute(_req(log_paths=[str(log)], evidence=[xid]))
    assert diagnosis.category is Category.GPU_MEMORY_ECC
    assert diagnosis.action is Action.DRAIN_AND_RESTART
    assert diagnosis.culprit_nodes == ["gpu02"]
    assert "kernel.xid_48" in diagnosis.rule_ids
    only_cascades = ENGINE.attribute(_req(log_paths=[str(log)]))
    assert only_cascades.culprit_nodes == [] and only_cascades.confidence < 0.5


def test_rank_prefix_maps_to_node(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_text("[rank19]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    diagnosis = ENGINE.attribute(_req(log_paths=[str(log)]))
    assert diagnosis.culprit_nodes == ["gpu03"] and diagnosis.culprit_ranks == [19]
    assert diagnosis.evidence[0].line_no == 1 and diagnosis.evidence[0].file == str(log)


def test_node_fault_on_most_nodes_is_not_drained(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_text(
        "".join(f"{h}:1:2 [0] NCCL WARN NET/IB : Got async event : port error\n" for h in NODES[:3])
    )
    diagnosis = ENGINE.attribute(_req(log_paths=[str(log)]))
    assert diagnosis.category is Category.INFINIBAND_NIC
    assert diagnosis.action is not Action.DRAIN_AND_RESTART and diagnosis.culprit_nodes == []


def test_nothing_found_is_unknown_escalate(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_text("iteration 1 | loss 2.0\nvalidation error: 0.1\n")
    diagnosis = ENGINE.attribute(_req(log_paths=[str(log)]))
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert diagnosis.confidence <= 0.25


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:
        pass

    return app


def test_cli_attribute_json(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("Mar 12 10:19:03 gpu04 kernel: NVRM: Xid (PCI:0000:b3:00): 79, pid=1, x\n")
    result = CliRunner().invoke(
        _app(),
        ["attribute", str(log), "--nodelist", "gpu[01-04]", "--tasks-per-node", "8", "--json"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[0])
    for key in (
        "file",
        "category",
        "action",
        "culprit_nodes",
        "culprit_ranks",
        "transient",
        "confidence",
        "evidence",
        "rule_ids",
    ):
        assert key in data
    assert data["culprit_nodes"] == ["gpu04"] and data["action"] == "drain_and_restart"


def test_cli_eval_json() -> None:
    result = CliRunner().invoke(
        _app(),
        ["attribution", "eval", str(CORPUS), "--labels", str(CORPUS / "labels.jsonl"), "--json"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in (
        "n",
        "category_accuracy",
        "action_accuracy",
        "restart_family_accuracy",
        "binary_agreement",
        "stops_caught",
        "stops",
        "culprit_accuracy",
        "culprit_precision",
        "culprit_recall",
        "transient_accuracy",
        "unknown_rate",
        "dangerous_stops",
        "dangerous",
        "false_alarms",
        "results",
    ):
        assert key in data


def test_cli_bad_inputs_are_clean_errors(tmp_path: Path) -> None:
    app = _app()
    missing = CliRunner().invoke(app, ["attribute", str(tmp_path / "nope.log")])
    assert missing.exit_code == 2 and "nope.log" in missing.output
    binary = tmp_path / "core.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    result = CliRunner().invoke(app, ["attribute", str(binary)])
    assert result.exit_code == 2 and "core.bin" in result.output and "binary" in result.output
    (tmp_path / "a.log").write_text("x\n")
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"file": "a.log", "category": "unknown", "expected_action": "wait"}\n{bad\n')
    result = CliRunner().invoke(
        app, ["attribution", "eval", str(tmp_path), "--labels", str(labels)]
    )
    assert result.exit_code == 2 and "labels.jsonl:2" in result.output
    assert "Traceback" not in result.output
