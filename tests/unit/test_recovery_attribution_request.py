"""What RecoveryWorkflow hands the attributor: Slurm's NodeAddr turns an IP a log names
back into the node (issue 8.4), without a workflow run (the method reads no clock)."""

from __future__ import annotations

from pathlib import Path

from trainmedic.catalog import Attributor
from trainmedic.domain import Action
from trainmedic.domain.activity_io import Gathered
from trainmedic.domain.incident import IncidentInput
from trainmedic.domain.slurm import SlurmJob, SlurmNode
from trainmedic.workflows.recovery import RecoveryWorkflow

RAY_OOM = (
    "(raylet) [2022-10-28 13:00:31,947 E 90952 90952] (raylet) node_manager.cc:3077: 6 Workers"
    " (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other"
    " reasons at node (ID: 28b65794b30840d656df62dff0cfe84933253e18, IP: 10.1.0.12) over the"
    " last time period.\n"
)


def _gathered(log: Path) -> Gathered:
    job = SlurmJob(job_id="42", name="train", state="FAILED", nodes=["gpu01", "gpu02"])
    return Gathered(
        job=job,
        nodes=[
            SlurmNode(name="gpu01", state="IDLE", address="10.1.0.11"),
            SlurmNode(name="gpu02", state="IDLE", address="10.1.0.12"),
            SlurmNode(name="gpu03", state="IDLE", address="gpu03"),  # NodeAddr = NodeName
            SlurmNode(name="gpu04", state="IDLE"),  # none reported
        ],
        log_paths=[str(log)],
    )


def test_node_addresses_reach_the_attributor_and_name_the_node(tmp_path: Path) -> None:
    log = tmp_path / "slurm-42.out"
    log.write_text(RAY_OOM, encoding="utf-8")
    workflow = RecoveryWorkflow(IncidentInput(cluster="lab", job_id="42"))

    request = workflow._attribution_request(
        IncidentInput(cluster="lab", job_id="42"), _gathered(log)
    )

    assert request.node_addrs == {"10.1.0.11": "gpu01", "10.1.0.12": "gpu02"}
    diagnosis = Attributor().attribute(request)
    assert diagnosis.action is Action.STOP
    assert diagnosis.culprit_nodes == ["gpu02"]


def test_without_addresses_an_ip_names_no_node_of_the_job(tmp_path: Path) -> None:
    log = tmp_path / "slurm-42.out"
    log.write_text(RAY_OOM, encoding="utf-8")
    gathered = _gathered(log)
    for node in gathered.nodes:
        node.address = None
    request = RecoveryWorkflow(IncidentInput(cluster="lab", job_id="42"))._attribution_request(
        IncidentInput(cluster="lab", job_id="42"), gathered
    )
    assert request.node_addrs == {}
    # The job's nodes are gpu01 and gpu02: an address nobody maps is not one of them.
    assert Attributor().attribute(request).culprit_nodes == []
