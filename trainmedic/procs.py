"""Finding and signalling the processes trainmedic started on this machine, and nothing else.

The rule they serve: never signal a process we did not start. A pid file alone is not
proof (pids are reused), so every check also reads /proc/<pid>/cmdline for something
only our own command line carries (typically a path under our state directory), or,
for a slurmstepd, an open file only ours holds (`stepds_holding`).

One module for the Temporal dev server, the loopback sshd and the Slurm lab. Two ways
to stop processes:

- `terminate(pid)` / `wait_gone(pid)`: one process, usually our child, waited for until
  it is reaped (a zombie leader can outlive its threads' sockets by a moment, so "not
  alive" is not enough before reusing its ports);
- `terminate_all(pids)` / `wait_exited(pids)`: many processes, usually not our children
  (the lab's daemons), waited for until none is alive (a zombie counts as gone).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")

# -- reading /proc --------------------------------------------------------------------


def cmdline(pid: int) -> list[str]:
    """The argv of a live process, or [] if it is gone or unreadable."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first), or []."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return []
    # The command name is in parentheses and may itself hold spaces or parentheses.
    return stat.rpartition(")")[2].split()


def is_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie (one whose parent's wait() is pending)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else None


def all_pids() -> list[int]:
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def open_paths(pid: int) -> set[str]:
    """Targets of the process's open file descriptors (readable ones only)."""
    found: set[str] = set()
    try:
        entries = list((PROC / str(pid) / "fd").iterdir())
    except OSError:
        return found
    for entry in entries:
        with contextlib.suppress(OSError):
            found.add(os.readlink(entry))
    return found


def descendants(roots: Iterable[int]) -> list[int]:
    """All live descendants of `roots` (not the roots), by walking parent links once."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        parent = parent_pid(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    out: list[int] = []
    stack = list(roots)
    seen = set(stack)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in seen:
                seen.add(child)
                out.append(child)
                stack.append(child)
    return out


# -- pid files ------------------------------------------------------------------------


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def verified_pid(pid_file: Path, matches: Callable[[list[str]], bool]) -> int | None:
    """The pid in `pid_file` if that process is alive and its argv passes `matches`."""
    pid = read_pid(pid_file)
    if pid is None or not is_alive(pid):
        return None
    return pid if matches(cmdline(pid)) else None


def has_flags(argv: list[str], *flags: tuple[str, str]) -> bool:
    """`argv` has each flag directly followed by its value (e.g. ("-N", "node01"))."""
    return set(itertools.pairwise(argv)).issuperset(flags)


def owned_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in `pid_file` if that process is alive and its argv mentions `marker`."""
    return verified_pid(pid_file, lambda argv: any(marker in arg for arg in argv))


# -- finding the lab's processes --------------------------------------------------------


def stepds_holding(log_file: Path) -> list[int]:
    """slurmstepd processes forked by the slurmd that writes `log_file` (a stepd inherits
    its slurmd's log; its environment is empty, so that is what ties it to one slurmd)."""
    target = str(log_file)
    found = []
    for pid in all_pids():
        argv = cmdline(pid)
        if argv and argv[0].startswith("slurmstepd") and target in open_paths(pid):
            found.append(pid)
    return found


def processes_under(root: Path) -> list[int]:
    """Processes whose command line, working directory or open files point under root."""
    prefix = str(root.resolve())
    own = os.getpid()
    found = []
    for pid in all_pids():
        if pid == own or not is_alive(pid):
            continue
        hits = [*cmdline(pid)]
        with contextlib.suppress(OSError):
            hits.append(os.readlink(PROC / str(pid) / "cwd"))
        hits.extend(open_paths(pid))
        if any(item == prefix or f"{prefix}/" in item for item in hits):
            found.append(pid)
    return found


# -- stopping ---------------------------------------------------------------------------


def send(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            log.debug("sent %s to pid %d", sig.name, pid)


def reap(pid: int) -> None:
    """Collect our exited child `pid`, if it is one (a no-op for anyone else's)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def wait_exited(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of `pids` is alive (our children among them are reaped); return
    those still alive at the deadline."""
    remaining = list(pids)
    deadline = time.monotonic() + timeout
    while remaining:
        for pid in remaining:
            reap(pid)
        remaining = [pid for pid in remaining if is_alive(pid)]
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return remaining


def terminate_all(pids: Iterable[int], grace: float) -> list[int]:
    """SIGTERM, then SIGKILL whatever is left after `grace` seconds; returns the pids
    still alive 5 s after the SIGKILL (normally none)."""
    pids = list(pids)
    if not pids:
        return []
    send(pids, signal.SIGTERM)
    left = wait_exited(pids, grace)
    if not left:
        return []
    log.warning("pids %s ignored SIGTERM for %.0f s; killing", left, grace)
    send(left, signal.SIGKILL)
    return wait_exited(left, 5.0)


def terminate(pid: int, timeout_s: float = 10.0) -> None:
    """One process: SIGTERM, wait `timeout_s`, then SIGKILL. Reaps it when it is ours."""
    terminate_all([pid], timeout_s)


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Wait until a process has fully exited: reaped if it is our child, else gone from
    /proc. Stricter than `wait_exited`, which takes a zombie for gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return True
        except ChildProcessError:  # not our child: watch /proc instead
            if not (PROC / str(pid)).exists():
                return True
        time.sleep(0.05)
    return False


# -- ports ----------------------------------------------------------------------------


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
    for pid in all_pids():
        with contextlib.suppress(OSError):
            for fd in (PROC / str(pid) / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return pid, cmdline(pid)
    return None
