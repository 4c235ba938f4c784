"""Job logs read over the SSH connection, for a controller that does not see the cluster's
shared file system (SSH mode).

The attribute activity scans local files; in SSH mode each job log's tail is copied first
into a private temporary directory, one command per file over the same ControlMaster
connection as Slurm's commands, with the same limits the local scan has: only the
current run's part (`log_from`), at most `max_bytes` of its end, regular files only (a
FIFO or a device that the job's owner pointed the output at is refused remotely before
anything opens it), and every command bounded by a timeout on both ends. The copies are
scanned, then evidence and notes name the remote path again.

The remote side needs a POSIX shell, GNU coreutils' `stat`, `tail` and `head`: what a
Linux login or controller node has. The script is a constant; the path and numbers reach
it as positional arguments, quoted by `remote_command`, never spliced into it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainmedic.adapters.slurm.errors import SlurmError, SlurmTimeout
from trainmedic.adapters.slurm.protocol import CompletedCommand

log = logging.getLogger(__name__)

# $1 path, $2 where this run's output starts, $3 at most this many bytes of the end (0: all).
# First line of output: "missing", "notregular <type>", or "ok <size> <from>"; then bytes.
_FETCH_SCRIPT = r"""
f=$1 start=$2 max=$3
[ -e "$f" ] || { echo missing; exit 0; }
[ -f "$f" ] || { echo "notregular $(stat -L -c %F -- "$f" 2>/dev/null | tr ' ' _)"; exit 0; }
size=$(stat -L -c %s -- "$f") || exit 3
from=$start
[ "$from" -le "$size" ] || from=0
if [ "$max" -gt 0 ] && [ $((size - from)) -gt "$max" ]; then from=$((size - max)); fi
echo "ok $size $from"
tail -c +$((from + 1)) -- "$f" | head -c $((size - from))
"""


class RawRunner(Protocol):
    async def run_raw(
        self, argv: Sequence[str], timeout: float
    ) -> tuple[CompletedCommand, bytes]: ...


@dataclass
class FetchedLogs:
    """Local copies of remote logs, and what to tell about them."""

    local_to_remote: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def remote(self, path: str | None) -> str | None:
        return self.local_to_remote.get(path or "", path)

    def rename(self, text: str) -> str:
        for local, remote in self.local_to_remote.items():
            text = text.replace(local, remote)
        return text


class RemoteLogs:
    def __init__(self, runner: RawRunner, *, timeout: float = 30.0, max_files: int = 64) -> None:
        self._runner = runner
        self._timeout = timeout
        self._max_files = max_files

    async def fetch(
        self,
        paths: list[str],
        into: Path,
        *,
        start_at: dict[str, int] | None = None,
        max_bytes: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> FetchedLogs:
        """Copy each log's tail into `into` (a private directory the caller removes);
        `progress(n)` is called before each file (the activity heartbeats with it)."""
        fetched = FetchedLogs()
        wanted = list(dict.fromkeys(paths))
        if len(wanted) > self._max_files:
            fetched.notes.append(
                f"{len(wanted)} log files; read the first {self._max_files} over SSH"
            )
            wanted = wanted[: self._max_files]
        for index, path in enumerate(wanted):
            if progress is not None:
                progress(index)
            start = (start_at or {}).get(path, 0)
            argv = ["/bin/sh", "-c", _FETCH_SCRIPT, "sh", path, str(start), str(max_bytes or 0)]
            try:
                done, out = await self._runner.run_raw(argv, self._timeout)
            except SlurmError as error:
                # A lost connection is an error of the activity (Temporal retries it); a
                # slow file is a note, and the scan goes on with the others.
                if error.retryable and not isinstance(error, SlurmTimeout):
                    raise
                fetched.notes.append(f"{path}: not read over SSH ({error})")
                continue
            head, _, data = out.partition(b"\n")
            words = head.decode("ascii", "replace").split()
            if done.returncode != 0 or not words:
                fetched.notes.append(
                    f"{path}: not read over SSH (exit {done.returncode}: "
                    f"{done.stderr.strip()[:200]})"
                )
                continue
            if words[0] == "missing":
                fetched.notes.append(f"{path}: no such file on the SSH host")
                continue
            if words[0] == "notregular":
                kind = words[1].replace("_", " ") if len(words) > 1 else "not a regular file"
                fetched.notes.append(f"{path}: not scanned, {kind} (not a regular file)")
                continue
            size, start_from = int(words[1]), int(words[2])
            local = into / f"{index:03d}-{Path(path).name[:80] or 'log'}"
            fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            fetched.local_to_remote[str(local)] = path
            if start_from > start:
                fetched.notes.append(
                    f"{path}: read the last {len(data)} of {size} bytes over SSH; "
                    "line numbers count from there"
                )
            log.debug("fetched %s: %d bytes from %d of %d", path, len(data), start_from, size)
        return fetched
