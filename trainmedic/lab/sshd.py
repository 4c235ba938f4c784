"""A real OpenSSH `sshd` on loopback: the far end of SSH mode in the lab (the demo's
`--slurm-access ssh`) and in the tests.

It runs on a free port with its own host key, sshd_config and authorized_keys in a
private directory, never as a system service, and stops with the context. The client
side gets a key and a known_hosts file that holds exactly this server's host key, so
SSH mode's host-key checking is the real one.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainmedic import procs
from trainmedic.lab.lab import LabError

SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True)
class LoopbackSshd:
    host: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path  # holds exactly this server's host key for [host]:port
    host_public_key: str  # "ssh-ed25519 AAAA..."
    root: Path


def sshd_unavailable_reason() -> str | None:
    if not SSHD.exists():
        return f"{SSHD} not found: install Debian's openssh-server (make install does)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "ssh / ssh-keygen not found: install Debian's openssh-client"
    if os.geteuid() != 0:
        return "the loopback sshd runs as root (privilege separation, login as root)"
    return None


def keygen(path: Path, comment: str = "trainmedic-lab") -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    kind, blob, *_ = path.with_suffix(".pub").read_text().split()
    return f"{kind} {blob}"


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def loopback_sshd() -> Iterator[LoopbackSshd]:
    """Start the sshd, yield how to reach it, stop it and remove its files."""
    reason = sshd_unavailable_reason()
    if reason is not None:
        raise LabError(f"cannot start the loopback sshd: {reason}")
    root = Path(tempfile.mkdtemp(prefix="tm-sshd-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        host_key = root / "host_ed25519"
        host_public = keygen(host_key)
        client_key = root / "client_ed25519"
        client_public = keygen(client_key)
        (root / "authorized_keys").write_text(client_public + "\n")
        port = procs.free_port()
        config = root / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    f"PidFile {root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {root / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "X11Forwarding no",
                    "AllowTcpForwarding no",
                    "PrintMotd no",
                    # a command per channel on one connection: the client multiplexes
                    "MaxSessions 64",
                    "MaxStartups 64",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        log = root / "sshd.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(SSHD), "-D", "-f", str(config), "-e"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 15
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"the loopback sshd did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        known_hosts = root / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_public}\n")
        yield LoopbackSshd(
            host="127.0.0.1",
            port=port,
            user=getpass.getuser(),
            client_key=client_key,
            known_hosts=known_hosts,
            host_public_key=host_public,
            root=root,
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)
