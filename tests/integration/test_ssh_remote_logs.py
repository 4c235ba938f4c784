"""Job logs read over SSH (a controller that does not see the shared file system), against
a real sshd on loopback: exact bytes, this run's part only, the tail within the cap,
hostile paths read literally, FIFOs and devices refused without hanging, and the
attribute activity naming the remote file in its evidence."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from tests.fixtures.ssh import SshServer
from trainmedic.activities.attribution import AttributionActivities
from trainmedic.adapters.slurm.remote_logs import RemoteLogs
from trainmedic.catalog import Attributor, Matcher, load_catalog
from trainmedic.domain.diagnosis import AttributionRequest
from trainmedic.domain.enums import Category
from trainmedic.watchers.base import ListSink
from trainmedic.watchers.logs import LogWatchConfig, LogWatcher
from trainmedic.watchers.progress import ProgressConfig
from trainmedic.watchers.remote_tail import RemoteFiles

pytestmark = pytest.mark.integration

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]

XID = (
    b"[Tue Dec  1 09:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, "
    b"GPU has fallen off the bus.\n"
)


async def test_bytes_run_part_and_tail_arrive_as_they_are(
    ssh_server: SshServer, tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    log = remote / "slurm-42.out"
    earlier_run = b"run 0: old failure line\n"
    this_run = b"step 1 \xff\xfe not UTF-8\nstep 2\n"
    log.write_bytes(earlier_run + this_run)
    big = remote / "big.out"
    big.write_bytes(b"x" * 5000 + b"\nthe end\n")
    hostile = remote / "$(touch pwned); `id` it's"
    hostile.write_bytes(b"literal\n")
    into = tmp_path / "copies"
    into.mkdir(mode=0o700)
    runner = ssh_server.runner()
    try:
        fetched = await RemoteLogs(runner).fetch(
            [str(log), str(big), str(hostile)],
            into,
            start_at={str(log): len(earlier_run)},
            max_bytes=1000,
        )
    finally:
        await runner.close()
    copies = {fetched.remote(local): Path(local).read_bytes() for local in fetched.local_to_remote}
    assert copies[str(log)] == this_run, "only this run's part, byte for byte"
    assert copies[str(big)] == (b"x" * 5000 + b"\nthe end\n")[-1000:]
    assert copies[str(hostile)] == b"literal\n"
    assert not (remote / "pwned").exists() and not Path("pwned").exists()
    assert any("big.out: read the last 1000 of 5009 bytes" in n for n in fetched.notes)
    assert all(oct(os.stat(p).st_mode & 0o777) == "0o600" for p in fetched.local_to_remote)


async def test_fifos_devices_and_missing_files_are_refused_not_read(
    ssh_server: SshServer, tmp_path: Path
) -> None:
    fifo = tmp_path / "job.out"
    os.mkfifo(fifo)  # nobody writes to it: opening it for reading would block forever
    into = tmp_path / "copies"
    into.mkdir(mode=0o700)
    runner = ssh_server.runner()
    try:
        fetched = await RemoteLogs(runner, timeout=20).fetch(
            [str(fifo), "/dev/zero", str(tmp_path / "nope.out")], into, max_bytes=1 << 20
        )
    finally:
        await runner.close()
    assert fetched.local_to_remote == {}
    notes = "\n".join(fetched.notes)
    assert f"{fifo}: not scanned, fifo (not a regular file)" in notes
    assert "/dev/zero: not scanned, character special file" in notes
    assert "nope.out: no such file on the SSH host" in notes


async def test_attribution_over_ssh_names_the_remote_file(
    ssh_server: SshServer, tmp_path: Path
) -> None:
    log = tmp_path / "slurm-77.out"
    log.write_bytes(
        b"epoch 3 step 1200 loss 1.93\n" + XID + b"Traceback (most recent call last):\n"
    )
    runner = ssh_server.runner()
    try:
        activities = AttributionActivities(Attributor(), remote_logs=RemoteLogs(runner))
        diagnosis = await ActivityEnvironment().run(
            activities.attribute,
            AttributionRequest(job_id="77", nodelist=["gpu01"], log_paths=[str(log)]),
        )
    finally:
        await runner.close()
    assert diagnosis.category is Category.GPU_HARDWARE, diagnosis.summary
    files = {e.file for e in diagnosis.evidence if e.file}
    assert files == {str(log)}, "evidence names the file on the cluster, not the local copy"
    assert [e.line_no for e in diagnosis.evidence if e.file] == [2]


# -- the log watcher over SSH -----------------------------------------------------------

CUDA = b"[rank5]:   what():  CUDA error: an illegal memory access was encountered\n"


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


async def test_the_log_watcher_follows_job_logs_over_ssh(
    ssh_server: SshServer, tmp_path: Path
) -> None:
    """The same signals as a local tail: a match with file, line, rank and node; a
    partial line completed later; a rewrite started again from the top; a FIFO refused."""
    sink = ListSink()
    runner = ssh_server.runner()
    watcher = LogWatcher(
        sink,
        cluster="lab",
        matcher=Matcher(load_catalog()),
        config=LogWatchConfig(progress=ProgressConfig(hang_after=timedelta(hours=1))),
        remote=RemoteFiles(runner),
    )
    out = tmp_path / "train-42.out"
    fifo = tmp_path / "train-42.err"
    os.mkfifo(fifo)
    try:
        watcher.watch("42", [str(out), str(fifo)], nodelist=NODES, tasks_per_node=2, run=0)
        assert await watcher.poll_and_submit() == []  # not there yet
        _append(out, b"".join(b"[rank0]: step %d loss 2.0\n" % i for i in range(1, 11)))
        _append(out, CUDA[:30])  # half a line: nothing yet
        assert await watcher.poll_and_submit() == []
        _append(out, CUDA[30:])
        [signal] = await watcher.poll_and_submit()
        hit = next(e for e in signal.evidence if e.rule_id == "cuda.illegal_address")
        assert hit.file == str(out) and hit.line_no == 11
        assert hit.rank == 5 and hit.node == "gpu03"
        assert signal.progress == "step 10"
        # The job is requeued without --open-mode=append: the file is rewritten.
        out.write_bytes(b"[rank0]: step 1 loss 3.0\n" + XID)
        signals = await watcher.poll_and_submit()
        view = watcher.view("42")
        assert view is not None
        tails = {t.path: t for t in watcher._jobs["42"].tails.values()}
        assert tails[str(out)].resets == 1
        assert any("fallen off the bus" in e.text for s in signals for e in s.evidence)
        assert tails[str(fifo)].refused and "not a regular file" in tails[str(fifo)].refused
    finally:
        await runner.close()
