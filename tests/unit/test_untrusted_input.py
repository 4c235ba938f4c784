"""Input a job's owner controls cannot stall or flood the controller (issue 9, item 5),
and `trainmedic report` spools no garbage (item 7)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from temporalio.testing import ActivityEnvironment
from typer.testing import CliRunner

from trainmedic.activities.attribution import AttributionActivities
from trainmedic.catalog import Attributor, Matcher, load_catalog
from trainmedic.catalog.scanner import NotRegularFile, ScanCancelled, Scanner, open_log
from trainmedic.cli.report import register
from trainmedic.domain import AttributionRequest, Diagnosis
from trainmedic.watchers import tail as tail_module
from trainmedic.watchers.base import ListSink
from trainmedic.watchers.logs import LogWatcher
from trainmedic.watchers.tail import FileTail

CATALOG = load_catalog()
MATCHER = Matcher(CATALOG)
XID = "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"


def _fifo(tmp_path: Path, name: str = "out.fifo") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


# ----------------------------------------------------------------------------- log tail


def test_tail_refuses_a_fifo_and_dev_zero_promptly(tmp_path: Path) -> None:
    for path in (str(_fifo(tmp_path)), "/dev/zero"):
        tail = FileTail(path)
        started = time.monotonic()
        assert tail.poll(1 << 20) == []
        assert time.monotonic() - started < 1.0
        assert tail.refused and "not a regular file" in tail.refused
        assert tail.bytes_read == 0


def test_tail_refuses_a_fifo_swapped_in_after_the_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "job.out"
    out.write_text("hello\n")
    tail = FileTail(str(out))
    assert tail.poll(1 << 20)  # attached, read the first line
    before = os.stat(out)
    # What a stat racing the swap saw: the old regular file, grown.
    regular = SimpleNamespace(
        st_mode=before.st_mode,
        st_dev=before.st_dev,
        st_ino=before.st_ino,
        st_size=before.st_size + 100,
        st_mtime_ns=before.st_mtime_ns + 1,
    )
    out.unlink()
    os.mkfifo(out)
    real_stat = os.stat

    def stale_stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        # The stat still sees the old regular file: the open is what meets the FIFO.
        return regular if str(path) == str(out) else real_stat(path, *args, **kwargs)

    monkeypatch.setattr(tail_module.os, "stat", stale_stat)
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(tail.poll(1 << 20)), daemon=True)
    worker.start()
    worker.join(2.0)
    assert done == [[]], "the open of a FIFO must neither block nor be read"
    assert tail.refused


async def test_log_watcher_returns_promptly_on_a_fifo_and_notes_it(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path, "train.out")
    good = tmp_path / "train.err"
    good.write_text(XID)
    sink = ListSink()
    watcher = LogWatcher(sink, cluster="lab", matcher=MATCHER)
    watcher.watch("42", [str(fifo), str(good)], nodelist=["gpu01"])
    signals = await asyncio.wait_for(watcher.poll_and_submit(), 5)
    assert [s.kind for s in signals] == ["log_match"]  # the regular file is still read
    view = watcher.view("42")
    assert view is not None and str(fifo) in view.refused


async def test_the_event_loop_never_waits_for_a_file(tmp_path: Path) -> None:
    """A cycle stuck in file I/O (hung mount) must not block watch/sync/view."""
    out = tmp_path / "a.out"
    out.write_text("x\n")
    watcher = LogWatcher(ListSink(), cluster="lab", matcher=MATCHER)
    watcher.watch("1", [str(out)])
    entered, release = threading.Event(), threading.Event()

    def stuck(self: FileTail, max_bytes: int) -> list[object]:
        entered.set()
        release.wait(10)
        return []

    original = FileTail.poll
    FileTail.poll = stuck  # type: ignore[method-assign,assignment]
    try:
        cycle = asyncio.ensure_future(watcher.poll_and_submit())
        assert await asyncio.to_thread(entered.wait, 5)
        started = time.monotonic()
        watcher.watch("2", [str(tmp_path / "b.out")])
        assert watcher.view("1") is not None
        watcher.unwatch("1")
        assert time.monotonic() - started < 0.5
        release.set()
        await asyncio.wait_for(cycle, 5)
    finally:
        release.set()
        FileTail.poll = original  # type: ignore[method-assign]


async def test_log_watcher_keeps_signals_the_router_could_not_deliver(tmp_path: Path) -> None:
    from trainmedic.errors import DeliveryError

    class Flaky(ListSink):
        down = True

        async def submit(self, signal: Any) -> None:
            if self.down:
                raise DeliveryError("temporal down")
            await super().submit(signal)

    now = [1000.0]
    out = tmp_path / "x.out"
    out.write_text(XID)
    sink = Flaky()
    watcher = LogWatcher(sink, cluster="lab", matcher=MATCHER, clock=lambda: now[0])
    watcher.watch("7", [str(out)])
    await watcher.poll_and_submit()
    assert sink.signals == []
    sink.down = False
    now[0] += 60  # past the backoff
    await watcher.poll_and_submit()
    assert [s.job_id for s in sink.signals] == ["7"]


# ------------------------------------------------------------------- attribution scans


def test_scanner_refuses_a_fifo_and_dev_zero(tmp_path: Path) -> None:
    for path in (str(_fifo(tmp_path)), "/dev/zero"):
        with pytest.raises(NotRegularFile):
            open_log(path)
        with pytest.raises(NotRegularFile):
            list(Scanner(MATCHER).scan_path(path))


def test_attributor_finishes_on_a_fifo_and_dev_zero(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text(XID)
    request = AttributionRequest(
        nodelist=["gpu01"], log_paths=[str(_fifo(tmp_path)), "/dev/zero", str(log)]
    )
    result: list[Diagnosis] = []
    worker = threading.Thread(
        target=lambda: result.append(Attributor(CATALOG).attribute(request)), daemon=True
    )
    worker.start()
    worker.join(10)
    assert result, "attribution must not hang on a FIFO or /dev/zero"
    assert "gpu_hardware" in result[0].headline()


def test_a_growing_file_is_scanned_up_to_its_size_at_open(tmp_path: Path) -> None:
    log = tmp_path / "grow.out"
    log.write_bytes(b"line\n" * 1000)

    class Growing:
        """Each read appends as much again, like a writer faster than the scan."""

        def __init__(self) -> None:
            self.handle = open(log, "rb")  # noqa: SIM115

        def read(self, n: int) -> bytes:
            with open(log, "ab") as more:
                more.write(b"more\n" * 1000)
            return self.handle.read(n)

    scanner = Scanner(MATCHER, block_size=4096)
    growing = Growing()
    try:
        list(scanner.scan_stream(growing, limit=5000))
    finally:
        growing.handle.close()
    assert scanner.bytes_scanned == 5000


def _big_sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)
        handle.seek(size - len(XID))
        handle.write(XID.encode())
    return path


async def test_attribute_activity_caps_size_notes_skips_and_heartbeats(tmp_path: Path) -> None:
    big = _big_sparse(tmp_path / "big.out", 64 << 20)
    fifo = _fifo(tmp_path)
    env = ActivityEnvironment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    activities = AttributionActivities(Attributor(CATALOG), max_scan_bytes=1 << 20)
    request = AttributionRequest(job_id="9", nodelist=["gpu01"], log_paths=[str(fifo), str(big)])
    diagnosis = await asyncio.wait_for(env.run(activities.attribute, request), 20)
    assert diagnosis.category.value == "gpu_hardware"  # the end of the file was scanned
    assert "not a regular file (a FIFO)" in diagnosis.summary
    assert "scanned the last 1.0 MiB of 64.0 MiB" in diagnosis.summary
    assert beats


class _Endless:
    """A stream that never ends (what /dev/zero would be if it were let in)."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self, n: int) -> bytes:
        self.reads += 1
        time.sleep(0.002)
        return b"\0" * 4095 + b"\n"


class _EndlessAttributor:
    def __init__(self) -> None:
        self.stream = _Endless()
        self.stopped = threading.Event()
        self.ended_by: BaseException | None = None

    def attribute(self, request: AttributionRequest) -> Diagnosis:
        try:
            list(Scanner(MATCHER, block_size=4096).scan_stream(self.stream, path="endless"))
        except BaseException as error:
            self.ended_by = error
            raise
        finally:
            self.stopped.set()
        return Attributor(CATALOG).attribute(AttributionRequest())


async def test_attribute_activity_stops_at_its_time_cap() -> None:
    attributor = _EndlessAttributor()
    activities = AttributionActivities(
        attributor, scan_timeout=__import__("datetime").timedelta(seconds=0.3)
    )
    started = time.monotonic()
    diagnosis = await asyncio.wait_for(
        ActivityEnvironment().run(activities.attribute, AttributionRequest()), 10
    )
    assert time.monotonic() - started < 5
    assert "time cap reached" in diagnosis.summary


async def test_a_cancelled_attribute_activity_leaves_no_scanning_thread() -> None:
    attributor = _EndlessAttributor()
    activities = AttributionActivities(attributor, heartbeat_every=0.05)
    env = ActivityEnvironment()
    task = asyncio.ensure_future(env.run(activities.attribute, AttributionRequest()))
    while attributor.stream.reads < 5:
        await asyncio.sleep(0.01)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert await asyncio.to_thread(attributor.stopped.wait, 5), "the scan thread kept running"
    reads = attributor.stream.reads
    await asyncio.sleep(0.1)
    assert attributor.stream.reads == reads
    assert isinstance(attributor.ended_by, ScanCancelled)  # stopped by the flag, not by luck


# ------------------------------------------------------------------ trainmedic report

_APP = typer.Typer()
register(_APP)
_APP.callback()(lambda: None)


def _report(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, list]:
    spool = tmp_path / "spool"
    base = {"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": "", "SLURMD_NODENAME": ""}
    started = time.monotonic()
    result = CliRunner().invoke(
        _APP, ["report", "--spool", str(spool), *args], env={**base, **(env or {})}
    )
    assert result.exit_code == 0
    assert time.monotonic() - started < 2
    return result.output, sorted(spool.glob("*.json")) if spool.exists() else []


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--job-id", "42; rm -rf /"], {}, "not a Slurm job id"),
        (["--job-id", "../../etc/x"], {}, "not a Slurm job id"),
        (["--job-id", "42_"], {}, "not a Slurm job id"),
        ([], {"SLURM_JOB_ID": "4\n2"}, "is not N, N_M or N+M"),
        (["--job-id", "42", "--nodes", "gpu01;reboot"], {}, "characters no hostlist has"),
        (["--job-id", "42", "--nodes", "gpu$(id)"], {}, "characters no hostlist has"),
        (["--job-id", "42", "--nodes", "gpu01 gpu02"], {}, "characters no hostlist has"),
        (["--job-id", "42", "--nodes", "gpu\x1b[31m"], {}, "characters no hostlist has"),
        (["--job-id", "42", "--nodes", "gpu[01-"], {}, "unbalanced"),
        (["--job-id", "42"], {"SLURM_JOB_NODELIST": "gpu`id`"}, "invalid node name"),
        (["--node-down"], {}, "needs nodes"),
        ([], {}, "needs a job id"),
        (["--job-id", "42", "--exit-code", "999"], {}, "out of range"),
    ],
)
def test_report_refuses_malformed_input_and_spools_nothing(
    tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    output, files = _report(tmp_path, *args, env=env)
    assert files == []
    assert "refused, nothing spooled" in output and says in output
    assert "\x1b" not in output  # control characters are not echoed raw


@pytest.mark.parametrize("job_id", ["42", "42_7", "42+1"])
def test_report_accepts_array_and_het_job_ids(tmp_path: Path, job_id: str) -> None:
    output, files = _report(
        tmp_path, "--job-id", job_id, "--nodes", "gpu[01-02]", "--detail", "bad\x07text"
    )
    assert len(files) == 1, output
    text = files[0].read_text()
    assert f'"job_id":"{job_id}"' in text and "\\u0007" not in text
    assert files[0].stat().st_mode & 0o777 == 0o640
