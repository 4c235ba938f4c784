"""The Slurm watcher's diff, lean parsers and loop, on synthetic views and captured JSON."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trainmedic.adapters.slurm.errors import NoSuchJob, SlurmUnavailable
from trainmedic.adapters.slurm.parse import parse_sinfo_json, parse_squeue_json
from trainmedic.domain.incident import IncidentSignal
from trainmedic.domain.slurm import ExitStatus, SlurmJob
from trainmedic.watchers.base import ListSink
from trainmedic.watchers.slurm import (
    JobView,
    NodeView,
    SlurmView,
    SlurmWatcher,
    diff_views,
    parse_sinfo_lean,
    parse_squeue_lean,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def view(jobs: list[JobView] = (), nodes: list[NodeView] = (), at: float = 0.0) -> SlurmView:  # type: ignore[assignment]
    return SlurmView(jobs={j.job_id: j for j in jobs}, nodes={n.name: n for n in nodes}, read_at=at)


def running(job_id: str = "7", nodes: str = "gpu[01-02]", restarts: int = 0) -> JobView:
    return JobView(job_id=job_id, state="RUNNING", nodes=nodes, restarts=restarts)


def up(name: str) -> NodeView:
    return NodeView(name=name, state="ALLOCATED")


def kinds(signals: list[IncidentSignal]) -> list[tuple[str, str | None]]:
    return sorted(((s.kind, s.job_id) for s in signals), key=lambda k: (k[0], k[1] or ""))


NODES = [up("gpu01"), up("gpu02"), up("gpu03")]


def test_unchanged_view_gives_no_signal() -> None:
    before = view([running(), JobView(job_id="8", state="PENDING", reason="Priority")], NODES)
    after = view([running(), JobView(job_id="8", state="PENDING", reason="Priority")], NODES)
    assert diff_views(before, after) == []


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("FAILED", "job_failed"),
        ("NODE_FAIL", "job_node_fail"),
        ("OUT_OF_MEMORY", "job_oom"),
        ("TIMEOUT", "job_timeout"),
        ("PREEMPTED", "job_preempted"),
    ],
)
def test_running_job_that_fails(state: str, kind: str) -> None:
    ended = JobView(
        job_id="7", state=state, nodes="gpu[01-02]", restarts=2, exit=ExitStatus(code=3)
    )
    signals = diff_views(view([running(restarts=2)], NODES), view([ended], NODES))
    assert kinds(signals) == [(kind, "7")]
    assert signals[0].run == 2
    assert signals[0].nodes == ["gpu01", "gpu02"]
    assert signals[0].source == "slurm"
    assert f"job_state={state}" in signals[0].evidence[0].text
    # ...and once only: the next identical view says nothing more.
    assert diff_views(view([ended], NODES), view([ended], NODES)) == []


def test_completed_jobs_are_not_failures() -> None:
    for state in ("COMPLETED", "COMPLETING"):
        after = JobView(job_id="7", state=state, nodes="gpu[01-02]")
        assert diff_views(view([running()], NODES), view([after], NODES)) == []


# A cancel by the job's owner, an admin or trainmedic itself is no failure: it is
# noted (`job_cancelled`, in the router's NOTED_KINDS), never an incident.


def test_cancelled_running_job_is_a_note_not_a_failure() -> None:
    after = JobView(job_id="7", state="CANCELLED", nodes="gpu[01-02]", restarts=1)
    signals = diff_views(view([running(restarts=1)], NODES), view([after], NODES))
    assert kinds(signals) == [("job_cancelled", "7")]
    assert signals[0].run == 1
    assert signals[0].nodes == ["gpu01", "gpu02"]
    assert "not a failure" in signals[0].detail
    assert "job_state=CANCELLED" in signals[0].evidence[0].text
    # Once: the next identical view says nothing more.
    assert diff_views(view([after], NODES), view([after], NODES)) == []


def test_cancelled_record_without_nodes_keeps_the_nodes_it_ran_on() -> None:
    after = JobView(job_id="7", state="CANCELLED", nodes="")
    signals = diff_views(view([running()], NODES), view([after], NODES))
    assert [(s.kind, s.nodes) for s in signals] == [("job_cancelled", ["gpu01", "gpu02"])]


def test_cancelled_pending_job_is_not_news() -> None:
    pending = JobView(job_id="9", state="PENDING", reason="Priority")
    after = JobView(job_id="9", state="CANCELLED", reason="Priority")
    assert diff_views(view([pending], NODES), view([after], NODES)) == []


@pytest.mark.parametrize(
    ("reason", "kind"),
    [("NodeDown", "job_node_fail"), ("TimeLimit", "job_timeout"), ("None", "job_cancelled")],
)
def test_cancelled_for_a_failure_stays_a_failure(reason: str, kind: str) -> None:
    after = JobView(job_id="7", state="CANCELLED", nodes="gpu[01-02]", reason=reason)
    assert kinds(diff_views(view([running()], NODES), view([after], NODES))) == [(kind, "7")]


@pytest.mark.parametrize(
    ("name", "job_id"),
    [
        ("22.05/squeue_held_nodefail.json", "2"),
        ("24.11/real/finished_squeue_states_all.json", "3"),
    ],
)
@pytest.mark.parametrize("fast", [False, True])
def test_captured_cancelled_jobs_are_notes(name: str, job_id: str, fast: bool) -> None:
    jobs = parse_squeue_lean((DATA / name).read_text(), use_msgspec=fast)
    cancelled = jobs[job_id]
    assert cancelled.state == "CANCELLED"
    before = {**jobs, job_id: running(job_id, "gpu01", restarts=cancelled.restarts)}
    signals = diff_views(view(list(before.values()), NODES), view(list(jobs.values()), NODES))
    assert [(s.kind, s.job_id, s.nodes) for s in signals] == [("job_cancelled", job_id, ["gpu01"])]


async def test_vanished_cancelled_job_is_a_note() -> None:
    final = SlurmJob(job_id="7", state="CANCELLED", nodes=["gpu01"], restarts=0)
    source = ScriptedSource([view([running("7")], NODES, at=1.0), view([], NODES, at=3.0)])
    w = watcher(source, FakeBackend({"7": final}))
    await w.poll_once()
    assert kinds(await w.poll_once()) == [("job_cancelled", "7")]


def test_requeue_reports_the_run_that_ended() -> None:
    after = JobView(job_id="7", state="PENDING", restarts=1, reason="BeginTime")
    signals = diff_views(view([running(restarts=0)], NODES), view([after], NODES))
    assert kinds(signals) == [("job_requeued", "7")]
    assert signals[0].run == 0


def test_requeue_hold_is_requeued_and_held() -> None:
    after = JobView(
        job_id="7", state="PENDING", restarts=1, held=True, reason="job_requeued_in_held_state"
    )
    signals = diff_views(view([running()], NODES), view([after], NODES))
    assert kinds(signals) == [("job_held", "7"), ("job_requeued", "7")]
    assert {s.run for s in signals} == {0}


def test_hold_of_a_pending_job() -> None:
    pending = JobView(job_id="9", state="PENDING", reason="Priority")
    held = JobView(job_id="9", state="PENDING", held=True, reason="JobHeldAdmin")
    assert kinds(diff_views(view([pending]), view([held]))) == [("job_held", "9")]
    assert diff_views(view([held]), view([held])) == []


def test_node_down_gives_one_signal_per_job_and_one_for_the_node() -> None:
    jobs = [
        running("7", "gpu[01-02]", restarts=1),
        running("8", "gpu02"),
        running("9", "gpu03"),
        JobView(job_id="10", state="PENDING"),
    ]
    down = NodeView(
        name="gpu02", state="DOWN", state_flags=("NOT_RESPONDING",), reason="Not responding"
    )
    signals = diff_views(view(jobs, NODES), view(jobs, [up("gpu01"), down, up("gpu03")]))
    assert kinds(signals) == [("node_down", None), ("node_down", "7"), ("node_down", "8")]
    assert all(s.nodes == ["gpu02"] for s in signals)
    by_job = {s.job_id: s.run for s in signals}
    assert by_job == {"7": 1, "8": 0, None: None}


def test_node_not_responding_and_fail() -> None:
    lagging = NodeView(name="gpu01", state="ALLOCATED", state_flags=("NOT_RESPONDING",))
    failing = NodeView(name="gpu03", state="ALLOCATED", state_flags=("FAIL",), reason="bad psu")
    signals = diff_views(view([], NODES), view([], [lagging, up("gpu02"), failing]))
    assert sorted((s.kind, s.nodes[0]) for s in signals) == [
        ("node_failed", "gpu03"),
        ("node_not_responding", "gpu01"),
    ]


OUR_REASON = "trainmedic incident-lab-7-1: gpu_hardware: Xid 79 on gpu02"


def test_admin_drain_is_noted_and_our_drain_is_not() -> None:
    admin = NodeView(
        name="gpu01", state="MIXED", state_flags=("DRAIN",), reason="bad fan", reason_user="alice"
    )
    ours = NodeView(name="gpu02", state="MIXED", state_flags=("DRAIN",), reason=OUR_REASON)
    signals = diff_views(view([], NODES), view([], [admin, ours, up("gpu03")]))
    assert [(s.kind, s.nodes) for s in signals] == [("node_drained_by_admin", ["gpu01"])]
    assert "alice" in signals[0].detail


@pytest.mark.parametrize(
    "reason",
    # Reasons the old lower-cased prefix test took for trainmedic's: a person's drain,
    # reported (and never resumed by the quarantine).
    ["TRAINMEDIC incident-lab-7-1: gpu_hardware: x", "trainmedic-test maintenance"],
)
def test_a_person_drain_that_looks_like_ours_is_noted(reason: str) -> None:
    drained = NodeView(name="gpu02", state="IDLE", state_flags=("DRAIN",), reason=reason)
    signals = diff_views(view([], NODES), view([], [up("gpu01"), drained, up("gpu03")]))
    assert [(s.kind, s.nodes) for s in signals] == [("node_drained_by_admin", ["gpu02"])]


def test_our_down_is_not_a_failure() -> None:
    ours = NodeView(name="gpu01", state="DOWN", reason=OUR_REASON)
    assert diff_views(view([running("7", "gpu01")], NODES), view([], [ours])) == []


def test_new_job_already_failed_is_reported_but_not_on_the_first_view() -> None:
    failed = JobView(job_id="11", state="FAILED", nodes="gpu01")
    assert kinds(diff_views(view([], NODES), view([failed], NODES))) == [("job_failed", "11")]


# ----------------------------------------------------------------------------- lean parse


@pytest.mark.parametrize(
    "name",
    ["22.05/squeue_mixed.json", "22.05/squeue_held_nodefail.json", "24.11/squeue_mixed.json"],
)
@pytest.mark.parametrize("fast", [False, True])
def test_lean_squeue_agrees_with_the_full_parser(name: str, fast: bool) -> None:
    text = (DATA / name).read_text()
    full = {j.job_id: JobView.from_job(j) for j in parse_squeue_json(text)}
    lean = parse_squeue_lean(text, use_msgspec=fast)
    assert set(lean) == set(full)
    for job_id, job in full.items():
        mine = lean[job_id]
        assert (mine.state, mine.restarts, mine.held, mine.reason, mine.flags) == (
            job.state,
            job.restarts,
            job.held,
            job.reason,
            job.flags,
        )
        assert mine.node_names() == job.node_names()
        if mine.exit is not None:
            assert mine.exit == job.exit


@pytest.mark.parametrize(
    "name",
    ["22.05/sinfo_drain_down.json", "22.05/sinfo_draining.json", "24.11/sinfo_draining.json"],
)
@pytest.mark.parametrize("fast", [False, True])
def test_lean_sinfo_agrees_with_the_full_parser(name: str, fast: bool) -> None:
    text = (DATA / name).read_text()
    full = {n.name: NodeView.from_node(n) for n in parse_sinfo_json(text)}
    assert parse_sinfo_lean(text, use_msgspec=fast) == full


@pytest.mark.parametrize("fast", [False, True])
def test_unreachable_slurmctld_is_an_error(fast: bool) -> None:
    with pytest.raises(SlurmUnavailable):
        parse_squeue_lean((DATA / "22.05/squeue_unreachable.json").read_text(), use_msgspec=fast)
    with pytest.raises(SlurmUnavailable):
        parse_sinfo_lean((DATA / "22.05/sinfo_unreachable.json").read_text(), use_msgspec=fast)


# ----------------------------------------------------------------------------- the loop


class ScriptedSource:
    """Hands out the given views (or raises the given errors) in order."""

    def __init__(self, steps: list[SlurmView | Exception]) -> None:
        self.steps = steps
        self.reads = 0

    async def read(self) -> SlurmView:
        step = self.steps[min(self.reads, len(self.steps) - 1)]
        self.reads += 1
        if isinstance(step, Exception):
            raise step
        return step


class FakeBackend:
    def __init__(self, jobs: dict[str, SlurmJob]) -> None:
        self.jobs = jobs
        self.asked: list[str] = []

    async def get_job(self, job_id: str) -> SlurmJob:
        self.asked.append(job_id)
        if job_id not in self.jobs:
            raise NoSuchJob(f"no job {job_id}")
        return self.jobs[job_id]


def watcher(source: ScriptedSource, backend: FakeBackend | None = None) -> SlurmWatcher:
    return SlurmWatcher(
        backend or FakeBackend({}),  # type: ignore[arg-type]
        ListSink(),
        interval=0.01,
        cluster="t",
        source=source,
        max_backoff=0.02,
    )


async def test_errors_keep_the_last_view_and_the_loop_alive() -> None:
    before = view([running()], NODES, at=1.0)
    failed = view([JobView(job_id="7", state="FAILED", nodes="gpu[01-02]")], NODES, at=2.0)
    source = ScriptedSource([before, SlurmUnavailable("down"), RuntimeError("bug"), failed])
    w = watcher(source)
    stop = asyncio.Event()
    task = asyncio.create_task(w.run(stop))
    while source.reads < 5:
        await asyncio.sleep(0.01)
    stop.set()
    await task
    sink = w.sink
    assert isinstance(sink, ListSink)
    # The failure is seen once, against the view kept from before the errors.
    assert kinds(sink.signals) == [("job_failed", "7")]
    assert w.job_run("7") == 0


async def test_vanished_running_job_is_looked_up_once() -> None:
    final = SlurmJob(job_id="7", state="OUT_OF_MEMORY", nodes=["gpu01"], restarts=0)
    backend = FakeBackend({"7": final})
    source = ScriptedSource(
        [view([running("7"), running("8", "gpu03")], NODES, at=1.0), view([], NODES, at=3.0)]
    )
    w = watcher(source, backend)
    await w.poll_once()
    signals = await w.poll_once()
    assert kinds(signals) == [("job_failed", "8"), ("job_oom", "7")]
    assert sorted(backend.asked) == ["7", "8"]
    assert "unknown" in next(s for s in signals if s.job_id == "8").detail


async def test_vanished_jobs_after_a_long_gap_are_only_logged() -> None:
    source = ScriptedSource([view([running("7")], NODES, at=1.0), view([], NODES, at=1000.0)])
    backend = FakeBackend({})
    w = watcher(source, backend)
    await w.poll_once()
    assert await w.poll_once() == []
    assert backend.asked == []
