"""SshRunner without a server: the remote command line (quoting, env, bin_dir), the
mapping from OpenSSH's own messages (captured from OpenSSH 9.2 on Debian 12) to typed
errors, and the settings and wiring of ssh mode."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from trainmedic.adapters.slurm import (
    SlurmError,
    SlurmUnavailable,
    SshAuthFailed,
    SshHostKeyRejected,
    SshRunner,
    SshUnavailable,
)
from trainmedic.adapters.slurm.cli import SlurmCli
from trainmedic.adapters.slurm.ssh import classify_ssh_failure, remote_command, ssh_runner
from trainmedic.config import Settings
from trainmedic.errors import ConfigError
from trainmedic.watchers.router import local_runner
from trainmedic.workers.controller import slurm_backend

HOSTILE = [
    "scontrol",
    "update",
    "NodeName=gpu01",
    'Reason=trainmedic incident: Xid 79; it\'s "bad"',
    "a; rm -rf /tmp/x",
    "$(touch /tmp/pwned)",
    "`id`",
    "$HOME ${PATH}",
    "new\nline",
    "*",
    "",
    "--",
]

KH = Path("/etc/trainmedic/known_hosts")
TARGET = "root@login1:22"
UNKNOWN = (
    "No ED25519 host key is known for [127.0.0.1]:43379 and you have requested strict "
    "checking.\nHost key verification failed.\n"
)
CHANGED = (
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
    "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
    "IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n"
    "The fingerprint for the ED25519 key sent by the remote host is\n"
    "SHA256:ZZiT8iIvfXzTciH31Jrxh0eodhNLUF+ZfU0ath5TTlA.\n"
    "Offending ED25519 key in /etc/trainmedic/known_hosts:1\n"
    "Host key for [127.0.0.1]:43379 has changed and you have requested strict checking.\n"
    "Host key verification failed.\n"
)


def test_remote_command_round_trips_through_a_posix_shell() -> None:
    line = remote_command(HOSTILE)
    assert shlex.split(line) == HOSTILE


def test_remote_command_sets_env_with_env_and_uses_the_remote_bin_dir() -> None:
    line = remote_command(
        ["scontrol", "ping"], {"SLURM_CONF": "/etc/slurm lab/x.conf"}, Path("/opt/slurm/bin")
    )
    assert shlex.split(line) == [
        "env",
        "SLURM_CONF=/etc/slurm lab/x.conf",
        "/opt/slurm/bin/scontrol",
        "ping",
    ]
    assert shlex.split(remote_command(["/usr/bin/squeue"], None, Path("/opt"))) == [
        "/usr/bin/squeue"
    ]
    with pytest.raises(ValueError):
        remote_command([])
    with pytest.raises(ValueError, match="environment variable"):
        remote_command(["true"], {"A;B": "x"})


def test_sh_runs_the_quoted_words_literally(tmp_path: Path) -> None:
    line = remote_command(["printf", "%s\\n", *HOSTILE[3:]])
    out = subprocess.run(
        ["sh", "-c", line], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout == "".join(f"{word}\n" for word in HOSTILE[3:])
    assert list(tmp_path.iterdir()) == []


def test_unknown_host_key_is_not_retryable_and_names_host_and_file() -> None:
    error = classify_ssh_failure(UNKNOWN, target=TARGET, known_hosts=KH)
    assert isinstance(error, SshHostKeyRejected) and not error.retryable
    assert TARGET in str(error) and str(KH) in str(error) and "unknown" in str(error)


def test_changed_host_key_is_not_retryable_and_shows_the_fingerprint() -> None:
    error = classify_ssh_failure(CHANGED, target=TARGET, known_hosts=KH)
    assert isinstance(error, SshHostKeyRejected) and not error.retryable
    assert "differs" in str(error) and "SHA256:ZZiT8" in str(error) and str(KH) in str(error)


def test_refused_key_is_not_retryable() -> None:
    error = classify_ssh_failure(
        "root@127.0.0.1: Permission denied (publickey).\n", target=TARGET, known_hosts=KH
    )
    assert isinstance(error, SshAuthFailed) and not error.retryable


@pytest.mark.parametrize(
    "stderr",
    [
        "ssh: connect to host 127.0.0.1 port 1: Connection refused\n",
        "ssh: connect to host 10.0.0.1 port 22: Connection timed out\n",
        "Timeout, server 10.0.0.1 not responding.\n",
        "mux_client_request_session: read from master failed: Broken pipe\n",
        "Connection to 10.0.0.1 closed by remote host.\n",
        "ssh: Could not resolve hostname nosuchhost.invalid: Name or service not known\n",
        "",
    ],
)
def test_transport_failures_are_retryable(stderr: str) -> None:
    error = classify_ssh_failure(stderr, target=TARGET, known_hosts=KH)
    assert isinstance(error, SshUnavailable) and isinstance(error, SlurmUnavailable)
    assert error.retryable and isinstance(error, SlurmError)


def ssh_settings(**extra: object) -> Settings:
    values: dict[str, object] = {
        "slurm_access": "ssh",
        "ssh_host": "login1",
        "ssh_user": "svc",
        "ssh_known_hosts": KH,
        "slurm_conf": Path("/etc/slurm/slurm.conf"),
    }
    values.update(extra)
    return Settings(**values)  # type: ignore[arg-type]


def test_ssh_mode_requires_a_known_hosts_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainmedic.config import load_settings

    monkeypatch.setenv("TRAINMEDIC_SLURM_ACCESS", "ssh")
    monkeypatch.setenv("TRAINMEDIC_SSH_HOST", "login1")
    with pytest.raises(ConfigError, match="TRAINMEDIC_SSH_KNOWN_HOSTS"):
        load_settings()
    monkeypatch.setenv("TRAINMEDIC_SSH_KNOWN_HOSTS", str(KH))
    assert load_settings().ssh_known_hosts == KH


def test_backend_and_watcher_share_one_runner() -> None:
    settings = ssh_settings(ssh_port=2222)
    backend = slurm_backend(settings)
    runner = local_runner(settings)
    assert isinstance(backend, SlurmCli) and isinstance(runner, SshRunner)
    assert backend._runner is runner is ssh_runner(settings)
    assert runner.target == "svc@login1:2222" and runner.known_hosts == KH
    assert shlex.split(remote_command(["squeue", "--json"], runner._env))[:2] == [
        "env",
        "SLURM_CONF=/etc/slurm/slurm.conf",
    ]
    # no slurm_conf: nothing is set on the remote side
    bare = ssh_runner(ssh_settings(ssh_port=2223, slurm_conf=None))
    assert bare._env == {}


def test_options_never_accept_a_host_key_or_ask_for_a_password() -> None:
    runner = SshRunner("login1", known_hosts=KH, key=Path("/k"), port=2200)
    options = runner._options()
    for wanted in (
        "BatchMode=yes",
        "StrictHostKeyChecking=yes",
        f"UserKnownHostsFile={KH}",
        "GlobalKnownHostsFile=/dev/null",
        "PasswordAuthentication=no",
        "IdentitiesOnly=yes",
    ):
        assert wanted in options
    assert any(o.startswith("ServerAliveInterval=") for o in options)
    assert options[:2] == ["-F", "/dev/null"]
