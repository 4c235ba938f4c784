"""LogWatcher: catalog matches become evidence-carrying signals; hangs; many files."""

from __future__ import annotations

import asyncio
import tracemalloc
from datetime import timedelta
from pathlib import Path

from trainmedic.catalog import Attributor, Matcher, load_catalog
from trainmedic.domain import AttributionRequest, Category, Evidence, EvidenceSource
from trainmedic.domain.slurm import SlurmJob
from trainmedic.watchers.base import ListSink
from trainmedic.watchers.logs import LogWatchConfig, LogWatcher, output_paths
from trainmedic.watchers.progress import ProgressConfig

CATALOG = load_catalog()
MATCHER = Matcher(CATALOG)
ATTRIBUTOR = Attributor(CATALOG)
NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
XID = "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
CUDA = "[rank5]:   what():  CUDA error: an illegal memory access was encountered"
WATCHDOG = (
    "[rank{r}]:[E1016 04:12:55.883417112 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=88211, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600083 milliseconds before timing out."
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watcher(
    sink: ListSink, clock: Clock | None = None, hang_after: float = 2.0, **cfg: object
) -> LogWatcher:
    config = LogWatchConfig(
        progress=ProgressConfig(hang_after=timedelta(seconds=hang_after)),
        **cfg,
    )
    return LogWatcher(sink, cluster="lab", matcher=MATCHER, config=config, clock=clock or Clock())


def _append(path: Path, text: str | bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(text.encode() if isinstance(text, str) else text)


def _poll(watcher: LogWatcher) -> list:
    return asyncio.run(watcher.poll_and_submit())


def test_match_carries_file_line_rank_and_node(tmp_path: Path) -> None:
    sink = ListSink()
    watcher = _watcher(sink)
    out = tmp_path / "train-42.out"
    watcher.watch("42", [str(out)], nodelist=NODES, tasks_per_node=2, run=0)
    assert _poll(watcher) == []  # file not there yet: fine
    _append(out, "".join(f"[rank0]: step {i} loss 2.0\n" for i in range(1, 11)))
    _append(out, CUDA + "\n")
    signals = _poll(watcher)
    assert [s.kind for s in signals] == ["log_match"]
    signal = signals[0]
    assert signal.source == "log" and signal.job_id == "42" and signal.run == 0
    hit = next(e for e in signal.evidence if e.rule_id == "cuda.illegal_address")
    assert hit.file == str(out) and hit.line_no == 11
    assert hit.rank == 5 and hit.node == "gpu03"  # rank 5 with 2 tasks per node -> 3rd node
    assert signal.nodes == ["gpu03"]
    assert signal.progress == "step 10"
    assert sink.signals == signals


def test_garbage_invalid_utf8_and_partial_lines(tmp_path: Path) -> None:
    sink = ListSink()
    watcher = _watcher(sink)
    out = tmp_path / "o.out"
    watcher.watch("7", [str(out)])
    _append(
        out, b"\xff\xfe\x00\x01garbage\x80\x81\n" + bytes(range(256)).replace(b"\n", b"") + b"\n"
    )
    _append(out, XID[:30].encode())  # a partial line: nothing yet
    assert _poll(watcher) == []
    _append(out, XID[30:].encode() + b"\n")
    (signal,) = _poll(watcher)
    (ev,) = [e for e in signal.evidence if e.rule_id == "kernel.xid_79"]
    assert ev.line_no == 3 and ev.text == XID


def test_matches_in_one_cycle_are_one_signal_and_repeats_are_limited(tmp_path: Path) -> None:
    sink = ListSink()
    clock = Clock()
    watcher = _watcher(sink, clock, repeat_interval=timedelta(seconds=60))
    files = [tmp_path / f"r{r}.out" for r in range(4)]
    watcher.watch("9", [str(f) for f in files], nodelist=NODES, tasks_per_node=1)
    for rank, file in enumerate(files):
        _append(file, (WATCHDOG.format(r=rank) + "\n") * 3)
    (signal,) = _poll(watcher)
    assert {e.rule_id for e in signal.evidence} == {"nccl.watchdog_timeout"}
    clock.now += 5
    for rank, file in enumerate(files):
        _append(file, WATCHDOG.format(r=rank) + "\n")
    assert _poll(watcher) == []  # the same cascade again within the repeat interval
    assert watcher.stats.suppressed >= 4
    clock.now += 61
    _append(files[0], WATCHDOG.format(r=0) + "\n")
    assert len(_poll(watcher)) == 1


def test_nccl_cascade_across_rank_files_lets_attribution_find_the_root(tmp_path: Path) -> None:
    sink = ListSink()
    watcher = _watcher(sink)
    files = {r: tmp_path / f"train-77-{r}.out" for r in range(8)}
    watcher.watch("77", [str(f) for f in files.values()], nodelist=NODES, tasks_per_node=2)
    for rank, file in files.items():
        _append(file, "".join(f"[rank{rank}]: step {i}\n" for i in range(50)))
    _poll(watcher)
    # Rank 5 hits a CUDA error first; every other rank's watchdog fires afterwards.
    _append(files[5], CUDA + "\n")
    _poll(watcher)
    for rank, file in files.items():
        if rank != 5:
            _append(file, WATCHDOG.format(r=rank) + "\n")
    _poll(watcher)
    evidence: list[Evidence] = [e for s in sink.signals for e in s.evidence]
    assert {e.rule_id for e in evidence} >= {"cuda.illegal_address", "nccl.watchdog_timeout"}
    root = next(e for e in evidence if e.rule_id == "cuda.illegal_address")
    assert root.file == str(files[5]) and root.line_no == 51
    diagnosis = ATTRIBUTOR.attribute(
        AttributionRequest(job_id="77", nodelist=NODES, tasks_per_node=2, evidence=evidence)
    )
    assert diagnosis.category is Category.CUDA_SOFTWARE
    assert diagnosis.culprit_ranks == [5]


def test_hang_fires_once_after_the_configured_time_and_rearms(tmp_path: Path) -> None:
    sink = ListSink()
    clock = Clock()
    watcher = _watcher(sink, clock, hang_after=2.0)
    out = tmp_path / "h.out"
    watcher.watch("5", [str(out)], nodelist=NODES[:2], tasks_per_node=1, run=1)
    _append(out, "loading data...\n")
    _poll(watcher)
    clock.now += 60
    assert _poll(watcher) == []  # no progress ever: not a hang (still starting up)
    _append(out, "[rank0]: step 1 loss 3.0\n[rank0]: saved checkpoint at step 1\n")
    _append(out, "[rank0]: step 2 loss 2.9\n")
    _poll(watcher)
    clock.now += 1.5
    assert _poll(watcher) == []
    clock.now += 1.0
    (hang,) = _poll(watcher)
    assert hang.kind == "hang" and hang.source == "log" and hang.job_id == "5" and hang.run == 1
    assert hang.progress == "checkpoint@1"
    last, synthetic = hang.evidence
    assert last.text == "[rank0]: step 2 loss 2.9" and last.line_no == 4 and last.rank == 0
    assert synthetic.text.startswith("trainmedic: no training progress for 2 s (last: step 2")
    assert synthetic.source is EvidenceSource.PROGRESS  # the watcher's words, not the log's
    assert hang.nodes == NODES[:2]
    diagnosis = ATTRIBUTOR.attribute(AttributionRequest(job_id="5", evidence=hang.evidence))
    assert diagnosis.category is Category.HANG and "trainmedic.hang" in diagnosis.rule_ids
    clock.now += 30
    assert _poll(watcher) == []  # one signal per stall
    _append(out, "[rank0]: step 2 loss 2.9\n")  # a reprint is not progress
    clock.now += 30
    assert _poll(watcher) == []
    _append(out, "[rank0]: step 3 loss 2.8\n")
    _poll(watcher)
    clock.now += 2.5
    assert [s.kind for s in _poll(watcher)] == ["hang"]
    view = watcher.view("5")
    assert view is not None and view.hang_reported and view.progress == "step 3"


def test_a_paused_watcher_does_not_call_everything_hung(tmp_path: Path) -> None:
    clock = Clock()
    watcher = _watcher(ListSink(), clock, hang_after=20.0)
    out = tmp_path / "p.out"
    watcher.watch("1", [str(out)])
    _append(out, "step 1\n")
    _poll(watcher)
    clock.now += 300  # the controller was suspended
    assert _poll(watcher) == []
    kinds = []
    for _ in range(25):  # then it runs normally again, and the stall is counted from here
        clock.now += 1
        kinds += [s.kind for s in _poll(watcher)]
    assert kinds == ["hang"]


def test_requeue_overwrite_is_a_new_run(tmp_path: Path) -> None:
    sink = ListSink()
    clock = Clock()
    watcher = _watcher(sink, clock)
    out = tmp_path / "train-3.out"
    watcher.watch("3", [str(out)], run=0)
    _append(out, "step 1\nstep 2\n" + CUDA + "\n")
    assert len(_poll(watcher)) == 1
    out.write_text("resuming from checkpoint\n" + CUDA + "\n")  # run 1 truncated the file
    watcher.watch("3", [str(out)], run=1)
    started, signal = sorted(_poll(watcher), key=lambda s: s.kind != "run_started")
    assert started.kind == "run_started" and started.log_from == {str(out): 0}  # rewritten
    (ev,) = [e for e in signal.evidence if e.rule_id == "cuda.illegal_address"]
    assert signal.run == 1 and ev.line_no == 2  # new run: not rate-limited, renumbered
    clock.now += 60
    assert _poll(watcher) == []  # run 1 has not progressed yet: no hang


def test_sync_follows_running_jobs_and_reads_the_last_lines_after_they_stop(
    tmp_path: Path,
) -> None:
    sink = ListSink()
    clock = Clock()
    watcher = _watcher(sink, clock, linger=timedelta(seconds=5))
    out = tmp_path / "train-11.out"
    job = SlurmJob(
        job_id="11",
        state="RUNNING",
        nodes=["gpu01", "gpu02"],
        node_count=2,
        tasks=2,
        stdout_path=str(out),
        stderr_path=str(out),
        restarts=2,
    )
    pending = SlurmJob(job_id="12", state="PENDING", stdout_path=str(tmp_path / "x"))
    watcher.sync([job, pending])
    assert watcher.watched() == ["11"]
    _append(out, "step 1\n")
    _poll(watcher)
    failed = job.model_copy(update={"state": "FAILED"})
    _append(out, "1: " + XID + "\n")  # written as the job died, read after it left the list
    watcher.sync([failed])
    assert watcher.watched() == []
    (signal,) = _poll(watcher)
    assert signal.run == 2 and signal.nodes == ["gpu02"]  # task 1 runs on the 2nd node
    clock.now += 10
    _poll(watcher)
    assert watcher.view("11") is None  # dropped after lingering, and no hang for it


def test_output_paths_fill_per_task_patterns() -> None:
    job = SlurmJob(
        job_id="5",
        state="RUNNING",
        nodes=["gpu01", "gpu02"],
        tasks=4,
        stdout_path="/logs/train-5-%t.out",
        stderr_path="/logs/train-5-%N.err",
    )
    assert output_paths(job) == [
        "/logs/train-5-0.out",
        "/logs/train-5-1.out",
        "/logs/train-5-2.out",
        "/logs/train-5-3.out",
        "/logs/train-5-gpu01.err",
        "/logs/train-5-gpu02.err",
    ]
    assert output_paths(job.model_copy(update={"stdout_path": "/dev/null"})) == output_paths(
        job.model_copy(update={"stdout_path": None})
    )


def test_a_20mb_line_keeps_memory_bounded_and_still_matches(tmp_path: Path) -> None:
    sink = ListSink()
    watcher = _watcher(sink, max_read_per_file=1 << 20)
    out = tmp_path / "big.out"
    watcher.watch("8", [str(out)])
    _append(out, "step 1\n")
    _poll(watcher)
    tracemalloc.start()
    try:
        for chunk in range(20):
            _append(out, b"y" * (1 << 20) if chunk != 13 else b"z" * 1000 + CUDA.encode())
            _poll(watcher)
        _append(out, "\nstep 2\n" + XID + "\n")
        _poll(watcher)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # a few read buffers, never the 20 MB line
    evidence = [e for s in sink.signals for e in s.evidence]
    assert {(e.rule_id, e.line_no) for e in evidence} >= {
        ("cuda.illegal_address", 2),
        ("kernel.xid_79", 4),
    }
    assert all(len(e.text) <= 2001 for e in evidence)
    assert watcher.stats.long_lines == 1


def test_one_runaway_writer_does_not_starve_the_others(tmp_path: Path) -> None:
    sink = ListSink()
    watcher = _watcher(sink, max_read_per_file=64 << 10)
    flood, quiet = tmp_path / "flood.out", tmp_path / "quiet.out"
    watcher.watch("1", [str(flood)])
    watcher.watch("2", [str(quiet)])
    _append(flood, b"noise line without anything interesting\n" * 100_000)  # ~4 MB
    _append(quiet, XID + "\n")
    signals = _poll(watcher)
    assert [s.job_id for s in signals] == ["2"]


def test_two_thousand_files(tmp_path: Path) -> None:
    sink = ListSink()
    watcher = _watcher(sink)
    paths = []
    for job in range(1000):
        pair = [tmp_path / f"j{job}.out", tmp_path / f"j{job}.err"]
        watcher.watch(str(job), [str(p) for p in pair], run=0)
        paths += pair
    for index, path in enumerate(paths):
        if index % 2 == 0:  # stderr files not created yet
            _append(path, f"step {index}\n")
    _append(paths[1500], XID + "\n")
    signals = _poll(watcher)
    assert watcher.stats.files == 2000 and watcher.stats.files_present == 1000
    assert [s.job_id for s in signals] == ["750"]
    assert "kernel.xid_79" in {e.rule_id for e in signals[0].evidence}
    _append(paths[1999], CUDA + "\n")  # a file that appeared later
    assert [s.job_id for s in _poll(watcher)] == ["999"]


async def test_run_loop_polls_until_stopped(tmp_path: Path) -> None:
    sink = ListSink()
    watcher = LogWatcher(
        sink, matcher=MATCHER, config=LogWatchConfig(interval=timedelta(seconds=0.05))
    )
    out = tmp_path / "a.out"
    watcher.watch("1", [str(out)])
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    _append(out, XID + "\n")
    for _ in range(200):
        if sink.signals:
            break
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert [s.kind for s in sink.signals] == ["log_match"]


def test_an_appending_requeued_job_is_read_from_where_its_new_run_begins(
    tmp_path: Path,
) -> None:
    """Issue 8.5: with --open-mode=append the old run's error stays in the file; the
    next run neither reports it again nor lets attribution count it."""
    sink = ListSink()
    clock = Clock()
    watcher = _watcher(sink, clock, linger=timedelta(seconds=5))
    out = tmp_path / "train-4.out"
    watcher.watch("4", [str(out)], run=0)
    _append(out, "step 1\n" + CUDA + "\n")
    assert [s.kind for s in _poll(watcher)] == ["log_match"]
    boundary = out.stat().st_size
    watcher.unwatch("4")  # run 0 failed; its last lines are read while it lingers
    clock.now += 6
    assert _poll(watcher) == []  # dropped, its read position remembered
    watcher.watch("4", [str(out)], run=1)  # Slurm ran it again, appending
    _append(out, "resuming from checkpoint step 8\nstep 9\n")
    signals = _poll(watcher)
    assert [(s.kind, s.run, s.log_from) for s in signals] == [
        ("run_started", 1, {str(out): boundary})
    ]
    _append(out, WATCHDOG.format(r=3) + "\n")
    (match,) = _poll(watcher)
    assert match.run == 1 and match.log_from == {str(out): boundary}
    assert [e.line_no for e in match.evidence] == [5]  # numbering carried over


def test_a_requeued_job_whose_file_was_rewritten_starts_from_zero(tmp_path: Path) -> None:
    sink = ListSink()
    clock = Clock()
    watcher = _watcher(sink, clock, linger=timedelta(seconds=1))
    out = tmp_path / "train-5.out"
    watcher.watch("5", [str(out)], run=0)
    _append(out, "x" * 100 + "\n")
    _poll(watcher)
    watcher.unwatch("5")
    clock.now += 2
    _poll(watcher)
    out.write_text("y" * 300 + "\n" + CUDA + "\n")  # truncated by the requeue, then longer
    watcher.watch("5", [str(out)], run=1)
    signals = _poll(watcher)
    assert {s.kind for s in signals} == {"run_started", "log_match"}
    assert all(s.log_from == {str(out): 0} for s in signals)
