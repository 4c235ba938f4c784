"""Run Slurm commands on a login or controller node over one verified SSH connection.

Why the system `ssh` client with ControlMaster, not `asyncssh`:

- It needs no new Python dependency (and no compiled `cryptography` wheel to keep in
  step): Debian's openssh-client is already where the controller runs, and it is the
  client operators already trust, audit and configure.
- Host key checking is OpenSSH's own (`StrictHostKeyChecking=yes` against the configured
  known_hosts file, hashed entries, `[host]:port` entries, `@revoked` and
  `@cert-authority` lines): nothing re-implemented here, so nothing to get subtly wrong.
- One master connection (`ControlMaster`) carries every command as a channel, with
  OpenSSH's keepalives (`ServerAliveInterval`/`ServerAliveCountMax`) on it: a command
  costs a fork of the small mux client, not a handshake (measured on loopback: a few ms).
- The cost: errors come back as an exit status of 255 and a line of text, so they are
  classified from OpenSSH's messages (tested against a real sshd), and the remote side
  must be a POSIX shell (argv is joined with `shlex.join`, never a string we build).

The master is a child process owned by this runner; a command finding it dead reconnects
(with backoff between failed attempts), and a connection that cannot be made is
`SshUnavailable` (retryable: Temporal retries the effect later). A host key that is
unknown or changed is `SshHostKeyRejected`, which is not retryable and runs nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainmedic.adapters.slurm.errors import (
    SlurmCommandNotFound,
    SlurmError,
    SlurmTimeout,
    SlurmUnavailable,
)
from trainmedic.adapters.slurm.protocol import CompletedCommand

if TYPE_CHECKING:
    from trainmedic.config import Settings

log = logging.getLogger(__name__)

# OpenSSH exits 255 for its own errors; a remote command's status is passed through.
SSH_ERROR_STATUS = 255
# The remote shell says this when the command itself is missing (POSIX: 127).
COMMAND_NOT_FOUND_STATUS = 127
# The remote `timeout` fires this long after the local one (see `run`).
REMOTE_GRACE_S = 2.0


class SshHostKeyRejected(SlurmError):
    """The server's host key is not in the known_hosts file, or differs from it.

    Never retried and never accepted on the fly: an operator checks the fingerprint and
    adds the key (e.g. `ssh-keyscan -p PORT HOST`, compared out of band)."""

    retryable = False


class SshAuthFailed(SlurmError):
    """The server refused our key (wrong key, user, or authorized_keys)."""

    retryable = False


class SshUnavailable(SlurmUnavailable):
    """The SSH connection could not be made, or was lost (refused, timed out, reset)."""

    retryable = True


_HOST_KEY = re.compile(
    r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED|"
    r"No \S+ host key is known for|host key for .* has changed|"
    r"Offending \S+ key in|HOST KEY HAS BEEN REVOKED|known_hosts.*(?:not|no) .*key",
    re.I,
)
_AUTH = re.compile(r"Permission denied \(|Too many authentication failures", re.I)
_CONNECTION = re.compile(
    r"Connection refused|Connection timed out|connect to host|Connection reset|"
    r"Connection closed|Broken pipe|mux_client|Control socket|ControlSocket|"
    r"Could not resolve hostname|No route to host|Network is unreachable|"
    r"Timeout, server .* not responding|kex_exchange_identification|"
    r"Connection to .* closed|lost connection",
    re.I,
)


def remote_command(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    bin_dir: Path | None = None,
) -> str:
    """The one string the remote shell parses: `env K=V ... argv`, each word quoted.

    `env` (the program) rather than `K=V cmd`, so a value with spaces stays one
    assignment and is never read as a command name."""
    if not argv:
        raise ValueError("empty argv")
    args = [str(a) for a in argv]
    if bin_dir is not None and "/" not in args[0]:
        args[0] = f"{str(bin_dir).rstrip('/')}/{args[0]}"
    if env:
        for key in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"not an environment variable name: {key!r}")
        args = ["env", *(f"{k}={v}" for k, v in env.items()), *args]
    return shlex.join(args)


def classify_ssh_failure(
    stderr: str, *, target: str, known_hosts: Path, argv: Sequence[str] = ()
) -> SlurmError:
    """Turn OpenSSH's own failure (exit 255) into a typed error that names the host."""
    text = stderr.strip()
    if _HOST_KEY.search(text):
        changed = re.search(r"CHANGED|has changed|Offending", text) is not None
        what = (
            f"its host key differs from the one in {known_hosts} (changed or impersonated)"
            if changed
            else f"its host key is unknown (not in {known_hosts})"
        )
        said = [
            line.strip()
            for line in text.splitlines()
            if re.search(r"^SHA256:|fingerprint|host key (?:is known|for)", line, re.I)
        ]
        return SshHostKeyRejected(
            f"refusing to connect to {target}: {what}; host keys are never accepted "
            f"automatically: verify the server's fingerprint out of band and update "
            f"{known_hosts}. ssh said: {' '.join(said) or _first_lines(text)}",
            argv=argv,
            returncode=SSH_ERROR_STATUS,
            stderr=stderr,
        )
    if _AUTH.search(text):
        return SshAuthFailed(
            f"{target} refused our key: {_first_lines(text)}",
            argv=argv,
            returncode=SSH_ERROR_STATUS,
            stderr=stderr,
        )
    # Anything else ssh itself failed on is a transport problem: retrying may help.
    why = _first_lines(text) or "ssh exited 255 with no message"
    return SshUnavailable(
        f"ssh to {target}: {why}", argv=argv, returncode=SSH_ERROR_STATUS, stderr=stderr
    )


def _first_lines(text: str, limit: int = 3) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and "@@@@" not in line]
    return " / ".join(lines[:limit])


class SshRunner:
    """`CommandRunner` over SSH: key authentication only, verified host key, one master
    connection reused by every command (the backend's and the watchers' JSON polls).

    `env` is set on the remote side for each command (`SLURM_CONF`); `bin_dir` is a
    directory on the remote host."""

    def __init__(
        self,
        host: str,
        *,
        known_hosts: Path,
        user: str | None = None,
        port: int = 22,
        key: Path | None = None,
        env: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
        connect_timeout: float = 10.0,
        keepalive_interval: int = 15,
        keepalive_count: int = 3,
        max_backoff: float = 30.0,
        ssh_binary: str = "ssh",
    ) -> None:
        if not host:
            raise ValueError("an SSH host is required")
        self.host = host
        self.user = user
        self.port = port
        self.key = key
        self.known_hosts = known_hosts
        self._env = dict(env) if env else {}
        self._bin_dir = bin_dir
        self._connect_timeout = connect_timeout
        self._keepalive = (keepalive_interval, keepalive_count)
        self._max_backoff = max_backoff
        self._ssh = ssh_binary
        self._master: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._failures = 0
        self._next_attempt = 0.0
        self._last_error: SlurmError | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._guard = threading.Lock()

    @property
    def target(self) -> str:
        who = f"{self.user}@" if self.user else ""
        return f"{who}{self.host}:{self.port}"

    # ------------------------------------------------------------------ options

    def _options(self) -> list[str]:
        interval, count = self._keepalive
        opts = [
            "-F",
            "/dev/null",  # no user or system ssh_config can loosen what follows
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "UpdateHostKeys=no",
            "-o",
            "CheckHostIP=no",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "KbdInteractiveAuthentication=no",
            "-o",
            "PubkeyAuthentication=yes",
            "-o",
            f"ConnectTimeout={max(1, int(self._connect_timeout))}",
            "-o",
            f"ServerAliveInterval={interval}",
            "-o",
            f"ServerAliveCountMax={count}",
            "-o",
            "LogLevel=ERROR",
            "-p",
            str(self.port),
        ]
        if self.key is not None:
            opts += ["-i", str(self.key), "-o", "IdentitiesOnly=yes"]
        if self.user:
            opts += ["-l", self.user]
        return opts

    @property
    def _control_path(self) -> Path:
        if self._dir is None:
            raise SshUnavailable(f"ssh to {self.target}: not connected")
        return self._dir / "cm"

    # ------------------------------------------------------------------ master

    def _master_alive(self) -> bool:
        return (
            self._master is not None
            and self._dir is not None
            and self._master.poll() is None
            and self._control_path.is_socket()
        )

    def _get_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    async def connect(self) -> None:
        """Make sure the master connection is up; raise the typed reason when it is not."""
        if self._master_alive():
            return
        async with self._get_lock():
            if self._master_alive():
                return
            now = time.monotonic()
            if now < self._next_attempt and self._last_error is not None:
                raise type(self._last_error)(
                    f"{self._last_error} (next attempt in {self._next_attempt - now:.1f}s)",
                    argv=self._last_error.argv,
                    returncode=self._last_error.returncode,
                    stderr=self._last_error.stderr,
                )
            try:
                await self._start_master()
            except SlurmError as error:
                self._failures += 1
                self._last_error = error
                backoff = min(self._max_backoff, 0.5 * 2 ** (self._failures - 1))
                self._next_attempt = time.monotonic() + backoff
                log.warning(
                    "ssh to %s failed (%s); next attempt in %.1fs", self.target, error, backoff
                )
                raise
            if self._failures:
                log.info("ssh to %s connected again after %d failures", self.target, self._failures)
            self._failures, self._last_error = 0, None

    async def _start_master(self) -> None:
        self._stop_master()
        if shutil.which(self._ssh) is None:
            raise SlurmCommandNotFound(f"{self._ssh} not found (install openssh-client)")
        if not self.known_hosts.is_file():
            raise SshHostKeyRejected(
                f"refusing to connect to {self.target}: known_hosts file {self.known_hosts} "
                "does not exist (host keys are never accepted automatically)"
            )
        # A private 0700 directory: nobody else may open our control socket (it would
        # run commands as us without authenticating). Short, for the 108-byte limit.
        self._dir = Path(tempfile.mkdtemp(prefix="tm-ssh-"))
        log_path = self._dir / "master.log"
        argv = [
            self._ssh,
            *self._options(),
            "-M",
            "-N",
            "-S",
            str(self._control_path),
            "-o",
            "ControlPersist=no",
            "-o",
            "ExitOnForwardFailure=yes",
            self.host,
        ]
        with log_path.open("wb") as log_file:
            self._master = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,  # a Ctrl-C to the controller is not our hangup
            )
        _LIVE.add(self)
        deadline = time.monotonic() + self._connect_timeout + 5
        while time.monotonic() < deadline:
            if self._master.poll() is not None:
                stderr = log_path.read_text(errors="replace")
                self._stop_master()
                raise classify_ssh_failure(stderr, target=self.target, known_hosts=self.known_hosts)
            if self._control_path.is_socket():
                log.info("ssh master connection to %s is up", self.target)
                return
            await asyncio.sleep(0.02)
        stderr = log_path.read_text(errors="replace")
        self._stop_master()
        raise SshUnavailable(
            f"ssh to {self.target}: no connection within {self._connect_timeout:g}s "
            f"{_first_lines(stderr)}".rstrip()
        )

    def _stop_master(self) -> None:
        with self._guard:
            master, self._master = self._master, None
            folder, self._dir = self._dir, None
        if master is not None and master.poll() is None:
            master.terminate()
            try:
                master.wait(5)
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        _LIVE.discard(self)

    async def close(self) -> None:
        """Close the master connection (a later command connects again)."""
        self._stop_master()

    # ------------------------------------------------------------------ commands

    async def run(self, argv: Sequence[str], timeout: float) -> CompletedCommand:
        done, out = await self.run_raw(argv, timeout)
        return done.model_copy(update={"stdout": out.decode("utf-8", "replace")})

    async def run_raw(self, argv: Sequence[str], timeout: float) -> tuple[CompletedCommand, bytes]:
        """`run`, with the remote command's stdout as bytes (job logs are not always
        UTF-8, and a decode would change what the attributor reads)."""
        # Killing the local client does not signal the remote command (no tty), so the
        # remote side bounds it too, a little later than we give up here.
        remote = f"timeout -k 5 {timeout + REMOTE_GRACE_S:g} " + remote_command(
            argv, self._env, self._bin_dir
        )
        started = time.monotonic()
        try:
            await asyncio.wait_for(self.connect(), timeout)
        except TimeoutError as exc:
            raise SshUnavailable(
                f"ssh to {self.target}: no connection within {timeout:g}s", argv=list(argv)
            ) from exc
        except SlurmError as error:
            error.argv = list(argv)
            raise
        args = [
            self._ssh,
            *self._options(),
            "-S",
            str(self._control_path),
            "-o",
            "ControlMaster=no",
            "-T",
            self.host,
            "--",
            remote,
        ]
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            # The master holds the client's pipes until the remote command ends (the
            # remote `timeout` below ends it), so do not wait for them here.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 1)
            raise SlurmTimeout(
                f"{' '.join(argv)} on {self.target}: no answer within {timeout:g}s",
                argv=list(argv),
            ) from exc
        duration = time.monotonic() - started
        stderr = err.decode("utf-8", "replace")
        code = proc.returncode if proc.returncode is not None else -1
        log.debug("ran %s on %s -> %s in %.3fs", argv, self.target, code, duration)
        if code == SSH_ERROR_STATUS:
            if not self._master_alive():
                self._stop_master()  # the next command reconnects
            raise classify_ssh_failure(
                stderr, target=self.target, known_hosts=self.known_hosts, argv=argv
            )
        if code == COMMAND_NOT_FOUND_STATUS and re.search(
            r"not found|No such file or directory", stderr
        ):
            raise SlurmCommandNotFound(
                f"{argv[0]} not found on {self.target} (is the Slurm client installed there, "
                "or TRAINMEDIC_SLURM_BIN_DIR set?)",
                argv=list(argv),
                returncode=code,
                stderr=stderr,
            )
        done = CompletedCommand(
            argv=list(argv), returncode=code, stderr=stderr, duration_s=duration
        )
        return done, out


# Masters still running at interpreter exit are stopped (they are our children).
_LIVE: set[SshRunner] = set()
_SHARED: dict[tuple[object, ...], SshRunner] = {}


@atexit.register
def _stop_all() -> None:
    for runner in list(_LIVE):
        runner._stop_master()


def ssh_runner(settings: Settings) -> SshRunner:
    """The one `SshRunner` of this process for these settings: the Slurm backend and the
    watchers' JSON polls share it, and so its connection."""
    if not settings.ssh_host or settings.ssh_known_hosts is None:
        raise ValueError("slurm_access=ssh needs TRAINMEDIC_SSH_HOST and _SSH_KNOWN_HOSTS")
    env = {"SLURM_CONF": str(settings.slurm_conf)} if settings.slurm_conf else {}
    key = (
        settings.ssh_host,
        settings.ssh_port,
        settings.ssh_user,
        settings.ssh_key,
        settings.ssh_known_hosts,
        settings.slurm_conf,
        settings.slurm_bin_dir,
    )
    runner = _SHARED.get(key)
    if runner is None:
        runner = _SHARED[key] = SshRunner(
            settings.ssh_host,
            known_hosts=settings.ssh_known_hosts,
            user=settings.ssh_user,
            port=settings.ssh_port,
            key=settings.ssh_key,
            env=env,
            bin_dir=settings.slurm_bin_dir,
        )
    return runner


__all__ = [
    "SshAuthFailed",
    "SshHostKeyRejected",
    "SshRunner",
    "SshUnavailable",
    "classify_ssh_failure",
    "remote_command",
    "ssh_runner",
]
