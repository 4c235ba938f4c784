"""Following job logs on the far side of the SSH connection (a controller that does not
see the cluster's shared file system).

The log watcher's cycle asks once, in one remote command, for every followed file: its
stat and the bytes from where its tail stands (plus the few bytes before, which the
tail's rewrite check compares), within the cycle's read budget. Each `RemoteFileTail`
then polls that snapshot exactly as a local tail polls the file system, so truncation,
replacement, partial and over-long lines, the catch-up jump and the refusal of FIFOs and
devices behave the same. Only rotation (`<path>.1`) is not followed remotely: job output
is not rotated by Slurm, and the new file is still picked up from its start.

The remote script is a constant; paths and numbers are its positional arguments, quoted
by `remote_command`. A file's type is decided from its stat before anything opens it,
so a FIFO swapped in for a job's output is never read (a swap within the same instant is
bounded by the command's timeout on both ends). It needs a POSIX shell and GNU
coreutils, as a Linux login node has.
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from trainmedic.adapters.slurm.remote_logs import RawRunner
from trainmedic.watchers.tail import Block, FileTail, StatLike

log = logging.getLogger(__name__)

# Per file: "M" (missing), "N <mode> <dev> <ino> <size> <mtime>" (not a regular file), or
# "F <mode> <dev> <ino> <size> <mtime> <start> <n>" followed by n bytes from `start`: the
# asked offset, or 0 when the file is now shorter than that (truncated: the tail starts
# again from the top, and this way reads it in the same cycle).
_SNAPSHOT_SCRIPT = r"""
t=$(mktemp) || exit 3
trap 'rm -f "$t"' EXIT
while [ $# -ge 3 ]; do
  f=$1 from=$2 max=$3
  shift 3
  st=$(stat -L -c '%f %d %i %s %Y' -- "$f" 2>/dev/null) || { echo M; continue; }
  mode=${st%% *}
  if [ $(( 0x$mode & 61440 )) -ne 32768 ]; then echo "N $st"; continue; fi
  set -- $st "$@"
  [ "$from" -le "$4" ] || from=0
  shift 5
  tail -c +$((from + 1)) -- "$f" 2>/dev/null | head -c "$max" > "$t"
  echo "F $st $from $(wc -c < "$t")"
  cat "$t"
done
"""


@dataclass(frozen=True, slots=True)
class RemoteStat:
    st_mode: int
    st_dev: int
    st_ino: int
    st_size: int
    st_mtime_ns: int


@dataclass(frozen=True, slots=True)
class RemoteSlice:
    """One file as the remote host saw it this cycle: None stat means missing."""

    stat: RemoteStat | None
    start: int = 0  # offset of data[0] in the file
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class SliceRequest:
    path: str
    start: int
    length: int


def parse_snapshot(requests: Sequence[SliceRequest], out: bytes) -> dict[str, RemoteSlice]:
    """The remote script's output, one record per request in order."""
    slices: dict[str, RemoteSlice] = {}
    pos = 0
    for request in requests:
        end = out.find(b"\n", pos)
        if end < 0:
            break  # cut short (timeout): the rest is asked again next cycle
        words = out[pos:end].decode("ascii", "replace").split()
        pos = end + 1
        if not words or words[0] == "M":
            slices[request.path] = RemoteSlice(stat=None)
            continue
        mode, dev, ino, size, mtime = (
            int(words[1], 16),
            int(words[2]),
            int(words[3]),
            int(words[4]),
            int(words[5]),
        )
        remote_stat = RemoteStat(mode, dev, ino, size, mtime * 1_000_000_000)
        if words[0] == "N":
            slices[request.path] = RemoteSlice(stat=remote_stat)
            continue
        start, length = int(words[6]), int(words[7])
        data = out[pos : pos + length]
        pos += length
        if len(data) < length:
            break
        slices[request.path] = RemoteSlice(stat=remote_stat, start=start, data=data)
    return slices


class RemoteFiles:
    """One remote command per cycle for every followed file."""

    def __init__(self, runner: RawRunner, *, timeout: float = 20.0) -> None:
        self._runner = runner
        self.timeout = timeout

    async def snapshot(self, requests: Sequence[SliceRequest]) -> dict[str, RemoteSlice]:
        if not requests:
            return {}
        argv = ["/bin/sh", "-c", _SNAPSHOT_SCRIPT, "sh"]
        for r in requests:
            argv += [r.path, str(r.start), str(r.length)]
        done, out = await self._runner.run_raw(argv, self.timeout)
        if done.returncode != 0:
            log.warning(
                "remote log snapshot exited %s: %s", done.returncode, done.stderr.strip()[:200]
            )
        return parse_snapshot(requests, out)


class RemoteFileTail(FileTail):
    """A FileTail that polls the snapshot its watcher fetched this cycle."""

    snapshot: RemoteSlice | None = None

    def request(self, max_bytes: int) -> SliceRequest:
        """What to fetch for the next poll: the fingerprint's bytes, then new ones."""
        start = max(0, self.offset - len(self.fingerprint))
        return SliceRequest(self.path, start, max_bytes + (self.offset - start))

    def poll(self, max_bytes: int) -> list[Block]:
        try:
            return super().poll(max_bytes)
        finally:
            self.snapshot = None  # each snapshot is read once

    def _stat(self) -> StatLike:
        if self.snapshot is None:
            raise OSError("not in this cycle's snapshot")
        if self.snapshot.stat is None:
            raise FileNotFoundError(self.path)
        return self.snapshot.stat

    def _read(self, max_bytes: int, st: StatLike) -> bytes:
        snap = self.snapshot
        if snap is None or not stat.S_ISREG(st.st_mode):
            return b""
        self.refused = None
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            return b""
        fingerprint = self.fingerprint
        if fingerprint and self.offset >= len(fingerprint):
            lo = self.offset - len(fingerprint) - snap.start
            seen = snap.data[lo : lo + len(fingerprint)] if lo >= 0 else fingerprint
            if len(seen) == len(fingerprint) and seen != fingerprint:
                self._restart(st, "rewritten")  # truncated and rewritten past our offset
        lo = self.offset - snap.start
        if lo < 0 or lo > len(snap.data):
            return b""  # the tail moved (a restart, the catch-up jump): asked for next cycle
        want = min(max_bytes, max(0, st.st_size - self.offset), len(snap.data) - lo)
        data = snap.data[lo : lo + want]
        self._advance(data)
        return data

    def _drain_rotated(self, max_bytes: int) -> list[Block]:
        return []  # see the module doc: remote rotation is not followed
