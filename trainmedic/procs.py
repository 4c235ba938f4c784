"""Small process helpers for the services trainmedic starts on this machine.

The rule they serve: never signal a process we did not start. A pid file alone is not
proof (pids are reused), so every check also reads /proc/<pid>/cmdline for a marker
that only our own command line carries (typically a path under our state directory).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path


def cmdline(pid: int) -> list[str]:
    """The argv of a live process, or [] if it is gone or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait() is pending


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def owned_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in pid_file if that process is alive and its argv mentions marker."""
    pid = read_pid(pid_file)
    if pid is None or not is_alive(pid):
        return None
    return pid if any(marker in arg for arg in cmdline(pid)) else None


def terminate(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL. Reaps the child when it is ours."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        _reap(pid)
        if not is_alive(pid):
            return
        time.sleep(0.05)


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Wait until a process has fully exited: reaped if it is our child, else gone from
    /proc. A zombie leader can outlive its threads' sockets by a moment, so "not alive"
    is not enough before reusing its ports."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return True
        except ChildProcessError:  # not our child: watch /proc instead
            if not Path(f"/proc/{pid}").exists():
                return True
        time.sleep(0.05)
    return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def port_in_use(host: str, port: int) -> bool:
    """Something accepts connections on host:port.

    A connect to a free port in the ephemeral range can "succeed" by connecting the
    socket to itself (TCP simultaneous open, when the kernel picks that very port as
    the source): that is not a listener.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        if sock.connect_ex((host, port)) != 0:
            return False
        return bool(sock.getsockname() != sock.getpeername())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listener_of(port: int) -> tuple[int, list[str]] | None:
    """Which process listens on a TCP port (from /proc), for 'port held by X' errors."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(inode)
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    pid = int(proc.name)
                    return pid, cmdline(pid)
    return None
