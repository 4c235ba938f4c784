"""SshRunner against a real sshd on loopback: quoting through a real remote shell, one
reused connection, host keys refused (unknown, changed) with nothing run, and lost or
refused connections as retryable errors."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.fixtures.ssh import SshServer, keygen
from trainmedic import procs
from trainmedic.adapters.slurm import (
    SlurmTimeout,
    SshHostKeyRejected,
    SshRunner,
    SshUnavailable,
)

pytestmark = pytest.mark.integration

HOSTILE = [
    "two words",
    "it's",
    'say "hi"',
    "a; touch /tmp/trainmedic-pwned",
    "$(touch /tmp/trainmedic-pwned)",
    "`id`",
    "$HOME",
    "back\\slash",
    "new\nline",
    "*",
    "",
]


async def test_arguments_reach_the_remote_command_unchanged(ssh_server: SshServer) -> None:
    runner = ssh_server.runner(env={"SLURM_CONF": "/etc/slurm lab/slurm.conf"})
    try:
        script = 'printf "%s\\0" "$SLURM_CONF" "$@"'
        result = await runner.run(["sh", "-c", script, "sh", *HOSTILE], timeout=10)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("\0")[:-1] == ["/etc/slurm lab/slurm.conf", *HOSTILE]
        assert not Path("/tmp/trainmedic-pwned").exists()
    finally:
        await runner.close()


async def test_one_connection_is_reused_and_rebuilt_when_lost(ssh_server: SshServer) -> None:
    runner = ssh_server.runner()
    try:
        await runner.run(["true"], timeout=10)
        master = runner._master
        assert master is not None
        for _ in range(5):
            assert (await runner.run(["echo", "ok"], timeout=10)).stdout == "ok\n"
        assert runner._master is master  # every command went over the same connection
        master.kill()
        master.wait()
        # the next command finds it gone and connects again (no error, nothing guessed)
        assert (await runner.run(["echo", "again"], timeout=10)).stdout == "again\n"
        assert runner._master is not master
    finally:
        await runner.close()


async def test_a_connection_lost_under_a_command_is_retryable(ssh_server: SshServer) -> None:
    runner = ssh_server.runner()
    try:
        await runner.run(["true"], timeout=10)
        master = runner._master
        assert master is not None
        pending = asyncio.create_task(runner.run(["sleep", "5"], timeout=10))
        await asyncio.sleep(0.5)
        master.kill()
        with pytest.raises(SshUnavailable) as caught:
            await pending
        assert caught.value.retryable
    finally:
        await runner.close()


async def test_per_command_timeout(ssh_server: SshServer) -> None:
    runner = ssh_server.runner()
    try:
        with pytest.raises(SlurmTimeout):
            await runner.run(["sleep", "5"], timeout=0.5)
        assert (await runner.run(["echo", "still"], timeout=10)).stdout == "still\n"
    finally:
        await runner.close()


async def test_connection_refused_is_retryable(ssh_server: SshServer) -> None:
    runner = SshRunner(
        "127.0.0.1",
        port=procs.free_port(),  # nobody listens there
        user=ssh_server.user,
        key=ssh_server.client_key,
        known_hosts=ssh_server.known_hosts,
    )
    with pytest.raises(SshUnavailable) as caught:
        await runner.run(["true"], timeout=10)
    assert caught.value.retryable and "refused" in str(caught.value).lower()
    # a second try inside the backoff says so instead of hammering the host
    with pytest.raises(SshUnavailable, match="next attempt in"):
        await runner.run(["true"], timeout=10)


def marker() -> Path:
    return Path(f"/tmp/trainmedic-ssh-{uuid.uuid4().hex}")


async def test_unknown_host_key_is_refused_and_nothing_runs(
    ssh_server: SshServer, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    # a key for another host only: this host:port is unknown
    known_hosts.write_text(f"[127.0.0.1]:1 {ssh_server.host_public_key}\n")
    runner = ssh_server.runner(known_hosts=known_hosts)
    touched = marker()
    with pytest.raises(SshHostKeyRejected) as caught:
        await runner.run(["touch", str(touched)], timeout=10)
    message = str(caught.value)
    assert f"127.0.0.1:{ssh_server.port}" in message and str(known_hosts) in message
    assert "unknown" in message and not caught.value.retryable
    assert not touched.exists()
    assert known_hosts.read_text() == f"[127.0.0.1]:1 {ssh_server.host_public_key}\n"


async def test_changed_host_key_is_refused_and_nothing_runs(
    ssh_server: SshServer, tmp_path: Path
) -> None:
    other = keygen(tmp_path / "impostor")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(ssh_server.known_hosts_line(other))
    runner = ssh_server.runner(known_hosts=known_hosts)
    touched = marker()
    with pytest.raises(SshHostKeyRejected) as caught:
        await runner.run(["touch", str(touched)], timeout=10)
    message = str(caught.value)
    assert f"127.0.0.1:{ssh_server.port}" in message and str(known_hosts) in message
    assert "changed" in message and "SHA256:" in message and not caught.value.retryable
    assert not touched.exists()
    assert known_hosts.read_text() == ssh_server.known_hosts_line(other)  # not "fixed"


async def test_missing_known_hosts_file_is_refused(ssh_server: SshServer, tmp_path: Path) -> None:
    runner = ssh_server.runner(known_hosts=tmp_path / "nope")
    with pytest.raises(SshHostKeyRejected, match="does not exist"):
        await runner.run(["true"], timeout=10)
    assert not (tmp_path / "nope").exists()
