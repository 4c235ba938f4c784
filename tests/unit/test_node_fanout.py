"""NodeFanout: a node agent's finding reaches the jobs on the node as a failure only when
it shows the node unfit; otherwise as evidence that waits for the job's own failure.

Driven through the real IncidentRouter (the recording fake client of test_router), so
what is asserted is which workflows start and what they receive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from temporalio.common import WorkflowIDReusePolicy

from tests.unit.test_router import Clock, FakeClient, router
from trainmedic.adapters.slurm.view import JobView, SlurmView
from trainmedic.domain import EvidenceSource
from trainmedic.domain.diagnosis import Evidence
from trainmedic.domain.incident import NODE_EVIDENCE, IncidentSignal
from trainmedic.lab.faults import Fault, kernel_lines
from trainmedic.watchers.router import NODE_EVIDENCE_HORIZON
from trainmedic.workers.detection import NodeFanout
from trainmedic.workflows.quarantine import QuarantineInput


@dataclass
class Watcher:
    view: SlurmView | None


def cluster(*jobs: JobView) -> Watcher:
    return Watcher(SlurmView(jobs={j.job_id: j for j in jobs}, nodes={}, read_at=0.0))


def kernel_signal(node: str, lines: list[str], kind: str = "kernel_xid") -> IncidentSignal:
    return IncidentSignal(
        source="kernel",
        kind=kind,
        nodes=[node],
        detail=lines[0][:80],
        evidence=[
            Evidence(source=EvidenceSource.KERNEL, text=text, node=node, line_no=n)
            for n, text in enumerate(lines, 1)
        ],
    )


XID_13 = (
    "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics Exception: ESR 0x405840=0x200"
)
SHARED = (
    JobView("41", "RUNNING", restarts=0, nodes="gpu[01-02]"),
    JobView("42", "RUNNING", restarts=2, nodes="gpu02"),
    JobView("43", "PENDING", nodes=""),
    JobView("44", "RUNNING", nodes="gpu03"),
)


async def test_a_node_that_lost_a_gpu_fails_every_job_on_it() -> None:
    client, clock = FakeClient(), Clock()
    fanout = NodeFanout(router(client, clock), cluster(*SHARED))
    xid79 = kernel_signal("gpu02", kernel_lines(Fault.XID79, pid=4242, node="gpu02"))
    await fanout.submit(xid79)
    assert sorted(client.ids()) == [
        "incident-lab-41-1",
        "incident-lab-42-3",  # the run that failed: Slurm's restart count 2
        "node-lab-gpu02",
    ]
    sent = [c.kwargs["start_signal_args"][0] for c in client.calls]
    assert {s.kind for s in sent} == {"kernel_xid"}
    assert all(
        c.kwargs["id_reuse_policy"] is WorkflowIDReusePolicy.REJECT_DUPLICATE
        for c in client.calls
        if c.id.startswith("incident-")
    )


async def test_a_finding_that_leaves_the_node_fit_waits_for_the_jobs_own_failure() -> None:
    """A kernel OOM kill on a shared node may be another job's process; an Xid 13 is
    the application's to survive or die of. Neither requeues nor cancels a running job,
    and neither closes the run's incident before its real failure arrives."""
    client, clock = FakeClient(), Clock()
    routed = router(client, clock)
    fanout = NodeFanout(routed, cluster(*SHARED))
    for lines in (kernel_lines(Fault.HOST_OOM, pid=4242), [XID_13]):
        await fanout.submit(kernel_signal("gpu02", lines, kind="kernel_error"))
    # Only the node's own report opens anything: its quarantine.
    assert client.ids() == ["node-lab-gpu02"] * 2
    assert all(isinstance(c.arg, QuarantineInput) for c in client.calls)
    waiting = routed.node_waiting["42"]
    assert [(s.kind, s.run) for s in waiting] == [(NODE_EVIDENCE, 2), (NODE_EVIDENCE, 2)]

    # Job 42's run fails: one incident, with the node's findings as its evidence.
    await routed.submit(IncidentSignal(source="slurm", kind="job_failed", job_id="42", run=2))
    incident = [c for c in client.calls if c.id == "incident-lab-42-3"]
    later = [c for c in client.calls if c.id == "incident-lab-42-3" and c is not incident[0]]
    assert len(incident) == 3, client.ids()  # the start, then the two findings it waited for
    assert [c.kwargs["start_signal_args"][0].kind for c in incident] == [
        "job_failed",
        NODE_EVIDENCE,
        NODE_EVIDENCE,
    ]
    assert later and all(c.kwargs["start_signal_args"][0].source == "kernel" for c in later)


async def test_a_dead_node_fails_its_jobs_without_any_line() -> None:
    client, clock = FakeClient(), Clock()
    fanout = NodeFanout(router(client, clock), cluster(*SHARED))
    death = IncidentSignal(
        source="agent_heartbeat",
        kind="node_down",
        nodes=["gpu03"],
        detail="node gpu03 confirmed dead: agent silent for 31.0 s",
    )
    await fanout.submit(death)
    assert sorted(client.ids()) == ["incident-lab-44-1", "node-lab-gpu03"]


def test_only_lines_this_catalog_drains_on_show_a_node_unfit() -> None:
    fanout = NodeFanout(router(FakeClient(), Clock()), cluster())
    ecc = kernel_lines(Fault.ECC, pid=7, node="gpu01")
    assert fanout.shows_node_unfit(kernel_signal("gpu01", ecc))
    # The Xid 63 half of the same fault alone: a remap pending until the next reset.
    assert not fanout.shows_node_unfit(kernel_signal("gpu01", ecc[1:]))
    assert not fanout.shows_node_unfit(kernel_signal("gpu01", [XID_13]))
    # An agent's word without a line that says it: nothing shown.
    bare = IncidentSignal(source="kernel", kind="kernel_xid", nodes=["gpu01"], detail="Xid 79")
    assert not fanout.shows_node_unfit(bare)
    lost = IncidentSignal(
        source="nvml",
        kind="nvml",
        nodes=["gpu01"],
        evidence=[
            Evidence(
                source=EvidenceSource.NVML,
                text="nvml: gpu 3 ecc_uncorrectable_volatile=3",
                node="gpu01",
            )
        ],
    )
    assert fanout.shows_node_unfit(lost)


def test_a_dead_node_is_the_controllers_word_not_an_agents() -> None:
    fanout = NodeFanout(router(FakeClient(), Clock()), cluster())
    said = IncidentSignal(source="kernel", kind="node_down", nodes=["gpu03"], detail="dead")
    assert not fanout.shows_node_unfit(said)


async def test_a_finding_survives_the_jobs_own_log_lines_and_a_resend() -> None:
    """The job's ranks print a line per watcher cycle while they wait out the collective
    timeout; the kernel's line must still reach the incident, once however often the
    agent's report was delivered again after Temporal was away."""
    client, clock = FakeClient(), Clock()
    routed = router(client, clock)
    fanout = NodeFanout(routed, cluster(*SHARED))
    finding = kernel_signal("gpu02", [XID_13])
    for _ in range(3):  # the first delivery and two resends
        await fanout.submit(finding)
    for _ in range(12):
        await routed.submit(
            IncidentSignal(source="log", kind="log_match", job_id="42", run=2, detail="timeout")
        )
    await routed.submit(IncidentSignal(source="slurm", kind="job_failed", job_id="42", run=2))
    kinds = [
        c.kwargs["start_signal_args"][0].kind for c in client.calls if c.id == "incident-lab-42-3"
    ]
    assert kinds.count(NODE_EVIDENCE) == 1


async def test_an_old_finding_decides_no_later_failure() -> None:
    """Another job's OOM kill hours ago on a shared node must not make this job's
    network failure a host OOM."""
    client, clock = FakeClient(), Clock()
    wall = [1_000_000.0]
    routed = router(client, clock, wall_clock=lambda: wall[0])
    fanout = NodeFanout(routed, cluster(*SHARED))
    oom = kernel_signal("gpu02", kernel_lines(Fault.HOST_OOM, pid=777), kind="kernel_error")
    oom = oom.model_copy(update={"at": datetime.fromtimestamp(wall[0], UTC)})
    await fanout.submit(oom)
    wall[0] += NODE_EVIDENCE_HORIZON.total_seconds() + 60
    await routed.submit(IncidentSignal(source="slurm", kind="job_failed", job_id="42", run=2))
    sent = [c.kwargs["start_signal_args"][0] for c in client.calls if c.id == "incident-lab-42-3"]
    assert [s.kind for s in sent] == ["job_failed"]


async def test_a_late_finding_reaches_its_runs_incident_past_the_window() -> None:
    client, clock = FakeClient(), Clock()
    routed = router(client, clock)
    fanout = NodeFanout(routed, cluster(*SHARED))
    await routed.submit(IncidentSignal(source="slurm", kind="job_failed", job_id="42", run=2))
    clock.now += 600  # the incident's window is long past; it still runs (approval)
    await fanout.submit(kernel_signal("gpu02", [XID_13]))
    late = [c for c in client.calls if c.id == "incident-lab-42-3"]
    assert [c.kwargs["start_signal_args"][0].kind for c in late] == ["job_failed", NODE_EVIDENCE]
    # A closed incident refuses it: nothing new opens for that run.
    client.closed.add("incident-lab-42-3")
    await fanout.submit(kernel_signal("gpu02", [XID_13.replace("13,", "31,")]))
    assert routed.rejected == ["incident-lab-42-3"]
    assert client.ids().count("incident-lab-42-3") == 2
