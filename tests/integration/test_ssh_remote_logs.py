"""Job logs read over SSH (a controller that does not see the shared file system), against
a real sshd on loopback: exact bytes, this run's part only, the tail within the cap,
hostile paths read literally, FIFOs and devices refused without hanging, and the
attribute activity naming the remote file in its evidence."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from tests.fixtures.ssh import SshServer
from trainmedic.activities.attribution import AttributionActivities
from trainmedic.adapters.slurm.remote_logs import RemoteLogs
from trainmedic.catalog import Attributor
from trainmedic.domain.diagnosis import AttributionRequest
from trainmedic.domain.enums import Category

pytestmark = pytest.mark.integration

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
