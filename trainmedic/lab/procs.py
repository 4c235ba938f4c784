"""Finding and signalling the lab's own processes, and nothing else.

A pid file alone is not proof: the pid may have been reused by an unrelated process
since. Every pid is checked against /proc before it is signalled: a daemon's command
line must name this lab's config or socket, a slurmstepd must hold this lab's slurmd
log open (it inherits it from the slurmd that forked it; its environment is empty).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    # The state letter follows the command name, which is in parentheses and may
    # itself contain spaces or parentheses.
    state = stat.rpartition(")")[2].split()
    return bool(state) and state[0] != "Z"


def parent_pid(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 else None


def all_pids() -> list[int]:
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def open_paths(pid: int) -> set[str]:
    """Targets of the process's open file descriptors (readable ones only)."""
    found: set[str] = set()
    fd_dir = PROC / str(pid) / "fd"
    try:
        entries = list(fd_dir.iterdir())
    except OSError:
        return found
    for entry in entries:
        with contextlib.suppress(OSError):
            found.add(os.readlink(entry))
    return found


def read_pid_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def verified_pid(path: Path, matches: Callable[[list[str]], bool]) -> int | None:
    """The pid in `path` if that process is alive and its argv passes `matches`."""
    pid = read_pid_file(path)
    if pid is None or not is_alive(pid):
        return None
    return pid if matches(cmdline(pid)) else None


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


def stepds_holding(log_file: Path) -> list[int]:
    """slurmstepd processes forked by the slurmd that writes `log_file`."""
    target = str(log_file)
    found = []
    for pid in all_pids():
        argv = cmdline(pid)
        if not argv or not argv[0].startswith("slurmstepd"):
            continue
        if target in open_paths(pid):
            found.append(pid)
    return found


def send(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            log.debug("sent %s to pid %d", sig.name, pid)


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of `pids` is alive; return those still alive at the deadline."""
    remaining = list(pids)
    deadline = time.monotonic() + timeout
    while remaining:
        remaining = [pid for pid in remaining if is_alive(pid)]
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return remaining


def terminate(pids: list[int], grace: float) -> None:
    """SIGTERM, then SIGKILL whatever is left after `grace` seconds."""
    if not pids:
        return
    send(pids, signal.SIGTERM)
    left = wait_gone(pids, grace)
    if left:
        log.warning("pids %s ignored SIGTERM for %.0f s; killing", left, grace)
        send(left, signal.SIGKILL)
        wait_gone(left, 5.0)


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
