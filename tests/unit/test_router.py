"""The incident router's keying, window and storm logic, against a recording fake client."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from trainmedic.domain.incident import IncidentInput, IncidentSignal
from trainmedic.errors import DeliveryError
from trainmedic.watchers.router import HeldSignals, IncidentRouter
from trainmedic.workflows.quarantine import QuarantineInput


@dataclass
class Call:
    workflow: Any
    arg: Any
    kwargs: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.kwargs["id"])


@dataclass
class FakeClient:
    """Records start_workflow calls; ids in `closed` behave like finished workflows."""

    calls: list[Call] = field(default_factory=list)
    closed: set[str] = field(default_factory=set)

    async def start_workflow(self, workflow: Any, arg: Any = None, **kwargs: Any) -> None:
        if kwargs["id"] in self.closed and (
            kwargs.get("id_reuse_policy") == WorkflowIDReusePolicy.REJECT_DUPLICATE
        ):
            raise WorkflowAlreadyStartedError(kwargs["id"], "RecoveryWorkflow")
        self.calls.append(Call(workflow, arg, kwargs))

    def ids(self) -> list[str]:
        return [c.id for c in self.calls]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def router(
    client: FakeClient, clock: Clock, lookup: dict[str, int] | None = None, **kw: Any
) -> IncidentRouter:
    return IncidentRouter(
        client,
        "lab",
        "tq",
        window=timedelta(seconds=60),
        **{
            "clock": clock,
            "wall_clock": lambda: 5.0,
            "run_lookup": (lookup or {}).get,
            "quarantine_task_queue": "tq-q",
            **kw,
        },
    )


def sig(
    kind: str,
    job: str | None = None,
    nodes: tuple[str, ...] = (),
    run: int | None = None,
    source: str = "slurm",
) -> IncidentSignal:
    return IncidentSignal(source=source, kind=kind, job_id=job, nodes=list(nodes), run=run)


async def test_one_failure_reported_three_ways_is_one_incident() -> None:
    client, clock = FakeClient(), Clock()
    r = router(client, clock)
    await r.submit(sig("epilog", "42", ("gpu01",), run=0, source="epilog"))
    clock.now += 2
    await r.submit(sig("job_failed", "42", ("gpu01", "gpu02"), run=0))
    await r.submit(sig("log_match", "42", source="log"))  # no run: the window decides
    assert client.ids() == ["incident-lab-42-1"] * 3
    first = client.calls[0]
    assert first.kwargs["start_signal"] == "report"
    assert first.kwargs["start_signal_args"][0].source == "epilog"
    assert first.kwargs["id_reuse_policy"] == WorkflowIDReusePolicy.REJECT_DUPLICATE
    assert first.kwargs["task_queue"] == "tq"
    assert isinstance(first.arg, IncidentInput)
    assert (first.arg.cluster, first.arg.job_id, first.arg.signal) == ("lab", "42", None)


async def test_run_comes_from_the_signal_or_the_slurm_view() -> None:
    client, clock = FakeClient(), Clock()
    r = router(client, clock, lookup={"7": 3})
    await r.submit(sig("job_failed", "5", run=2))
    await r.submit(sig("hang", "7", source="log"))
    await r.submit(sig("job_failed", "8"))  # unknown everywhere: first run
    assert client.ids() == ["incident-lab-5-3", "incident-lab-7-4", "incident-lab-8-1"]


async def test_a_later_run_is_a_new_incident_however_soon() -> None:
    """Issue 9.1: a job requeued by its incident that fails again within a minute."""
    client, clock = FakeClient(), Clock()
    r = router(client, clock)
    await r.submit(sig("job_failed", "42", run=0))
    clock.now += 30
    await r.submit(sig("job_failed", "42", run=0))  # the same run again: same incident
    await r.submit(sig("log_match", "42", run=1, source="log"))  # run 1 prints a warning
    client.closed.add("incident-lab-42-1")
    await r.submit(sig("job_node_fail", "42", run=1))  # run 1 fails: a new incident
    clock.now += 61
    await r.submit(sig("job_failed", "42", run=2))
    assert client.ids() == [
        "incident-lab-42-1",
        "incident-lab-42-1",
        "incident-lab-42-2",
        "incident-lab-42-2",  # run 1's earlier warning, as evidence for its incident
        "incident-lab-42-3",
    ]
    assert r.rejected == []


async def test_a_matched_line_in_a_running_job_opens_nothing() -> None:
    """Issue 9.9: log lines are evidence for an incident, never its reason to exist."""
    client, clock = FakeClient(), Clock()
    r = router(client, clock)
    warning = sig("log_match", "42", run=0, source="log").model_copy(
        update={"progress": "step 120"}
    )
    for _ in range(100):
        await r.submit(warning)
    assert client.calls == []
    assert len(r.noted) == 100
    # When the run does fail, its incident carries the last progress the log showed,
    # and the lines read before Slurm saw the end (the last few) as evidence.
    await r.submit(sig("job_failed", "42", run=0))
    assert client.calls[0].kwargs["start_signal_args"][0].progress == "step 120"
    kinds = [c.kwargs["start_signal_args"][0].kind for c in client.calls]
    assert kinds == ["job_failed"] + ["log_match"] * 8
    assert set(client.ids()) == {"incident-lab-42-1"}


async def test_late_duplicate_of_a_closed_incident_opens_nothing() -> None:
    client, clock = FakeClient(closed={"incident-lab-42-1"}), Clock()
    r = router(client, clock)
    await r.submit(sig("job_failed", "42", run=0))
    assert client.calls == []
    assert r.rejected == ["incident-lab-42-1"]


async def test_noted_kinds_open_nothing() -> None:
    client, clock = FakeClient(), Clock()
    r = router(client, clock)
    kinds = (
        "node_drained_by_admin",
        "job_requeued",
        "job_held",
        "job_cancelled",
        "node_not_responding",
    )
    for kind in kinds:
        await r.submit(sig(kind, "42" if kind.startswith("job") else None, ("gpu01",), run=0))
    assert client.calls == []
    assert [s.kind for s in r.noted] == list(kinds)


async def test_node_down_under_two_jobs_gives_two_incidents_and_one_quarantine() -> None:
    client, clock = FakeClient(), Clock()
    r = router(client, clock)
    await r.submit(sig("node_down", "7", ("gpu02",), run=1))
    await r.submit(sig("node_down", "8", ("gpu02",), run=0))
    await r.submit(sig("node_down", None, ("gpu02",)))
    assert client.ids() == ["incident-lab-7-2", "incident-lab-8-1", "node-lab-gpu02"]
    quarantine = client.calls[2]
    assert isinstance(quarantine.arg, QuarantineInput)
    assert quarantine.arg.node == "gpu02"
    assert quarantine.kwargs["task_queue"] == "tq-q"
    assert quarantine.kwargs["start_signal"] == "report"


async def test_storm_folds_signals_into_one_incident() -> None:
    client, clock = FakeClient(), Clock()
    r = router(client, clock, storm_threshold=3)
    for index in range(3):  # at the threshold: still per job
        await r.submit(sig("node_down", str(100 + index), (f"gpu{index:02d}",), run=0))
    assert client.ids() == ["incident-lab-100-1", "incident-lab-101-1", "incident-lab-102-1"]
    for index in range(3, 40):
        await r.submit(sig("node_down", str(100 + index), (f"gpu{index:02d}",), run=0))
        await r.submit(sig("node_down", None, (f"gpu{index:02d}",)))
    storm_ids = set(client.ids()[3:])
    assert storm_ids == {"incident-lab-storm-5"}
    last = client.calls[-1].arg
    assert last.job_id is None
    assert len(last.nodes) == 40
    # A job that already had its incident keeps it.
    await r.submit(sig("log_match", "100", source="log"))
    assert client.ids()[-1] == "incident-lab-100-1"
    # After the window the storm is over and per-job incidents resume.
    clock.now += 120
    await r.submit(sig("job_failed", "999", run=0))
    assert client.ids()[-1] == "incident-lab-999-1"
    assert r.storm is None


async def test_default_storm_threshold_scales_with_the_cluster() -> None:
    r = router(FakeClient(), Clock(), node_count=lambda: 12_500)
    assert r.threshold() == 1250
    assert router(FakeClient(), Clock(), node_count=lambda: 4).threshold() == 3


async def test_a_failing_client_raises_delivery_error_so_spools_keep_the_report() -> None:
    class Broken(FakeClient):
        async def start_workflow(self, workflow: Any, arg: Any = None, **kwargs: Any) -> None:
            raise RuntimeError("temporal down")

    with pytest.raises(DeliveryError, match="temporal down"):
        await router(Broken(), Clock()).submit(sig("job_failed", "1", run=0))


async def test_held_signals_wait_for_temporal_in_order_and_lose_nothing() -> None:
    """Issue 9.6: reports of watchers without a spool survive a Temporal outage."""

    class Flaky:
        def __init__(self) -> None:
            self.down = True
            self.got: list[str] = []

        async def submit(self, signal: IncidentSignal) -> None:
            if self.down:
                raise DeliveryError("temporal down")
            self.got.append(signal.kind)

    sink = Flaky()
    held = HeldSignals(sink, limit=3)
    for kind in ("a", "b", "c"):
        await held.submit(sig(kind, "1"))
    assert sink.got == [] and [s.kind for s in held.held] == ["a", "b", "c"]
    assert await held.flush() == 0  # still down: nothing lost, nothing reordered
    await held.submit(sig("d", "1"))  # over the bound: the oldest goes, and says so
    assert held.dropped == 1
    sink.down = False
    assert await held.flush() == 3
    assert sink.got == ["b", "c", "d"] and not held.held
    await held.submit(sig("e", "1"))  # nothing held: straight through
    assert sink.got[-1] == "e"


async def test_held_signals_queue_behind_those_already_waiting() -> None:
    class Recording:
        def __init__(self) -> None:
            self.got: list[str] = []

        async def submit(self, signal: IncidentSignal) -> None:
            self.got.append(signal.kind)

    sink = Recording()
    held = HeldSignals(sink)
    held.held.append(sig("first", "1"))  # left from an outage
    await held.submit(sig("second", "1"))
    assert sink.got == []  # not ahead of the older report
    await held.flush()
    assert sink.got == ["first", "second"]


async def test_where_a_run_begins_reaches_that_runs_incident_only() -> None:
    """Issue 8.5: the log watcher says where run 1's output starts (an appending
    requeued job); the incident of run 1 gets it, run 2's does not."""
    client, clock = FakeClient(), Clock()
    r = router(client, clock)
    started = sig("run_started", "9", run=1, source="log").model_copy(
        update={"log_from": {"/jobs/9.out": 4096}}
    )
    await r.submit(started)
    assert client.calls == []
    await r.submit(sig("job_failed", "9", run=1))
    await r.submit(sig("job_failed", "9", run=2))
    opened = {c.id: c.kwargs["start_signal_args"][0] for c in client.calls}
    assert opened["incident-lab-9-2"].log_from == {"/jobs/9.out": 4096}
    assert opened["incident-lab-9-3"].log_from == {}
