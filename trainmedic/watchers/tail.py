"""Follow one growing file by polling: `os.stat`, then read only the new bytes.

No thread and no open descriptor per file, so thousands of files cost a `stat` each per
cycle. The tail survives what job output files go through:

- a requeue that overwrites (`O_TRUNC`, or a new file under the same name): the size
  drops below the offset, the inode changes, or the bytes just before the offset are no
  longer the ones read last time (truncated and rewritten past the old offset within one
  poll) -> start again at the top;
- a requeue that appends, or plain growth -> carry on;
- rotation (rename + new file): the rest of the old file is read from `<path>.1` when
  that is the same inode, then the new file from its start;
- partial lines: kept until their newline arrives, bounded by `max_line`; a longer line
  is handed out in fragments (all with the line's number) and counted once;
- a file that does not exist yet: polled again (and read from its start once it
  appears, even with `from_end`: everything in it is new);
- a path that is not a regular file (a FIFO, /dev/zero, a socket; the job's owner
  chooses the path): never opened for reading, said once in `refused` and the log.

The file is opened O_NONBLOCK and checked with `fstat` after the open, so a FIFO
swapped in between the `stat` and the open neither blocks the open nor is read. Links
are followed: sites point job output at other file systems through them, and what was
opened is what is checked. One poll reads at most `max_bytes`.

Bytes are handed out raw; decoding (invalid UTF-8, NULs) is the reader's business.

Job outputs are read from the start (their history is the job's), a kernel log from its
end as of the first poll (`from_end`, with true line numbers: the node agent's
`KernelLogTail`).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_FINGERPRINT = 32  # bytes before the offset that must still be there on the next read
_OVERLAP = 256  # bytes of an over-long line kept so a message cut at a fragment edge is seen


class StatLike(Protocol):
    """What a tail needs of a file's stat: `os.stat_result`, or a remote host's answer."""

    @property
    def st_mode(self) -> int: ...
    @property
    def st_dev(self) -> int: ...
    @property
    def st_ino(self) -> int: ...
    @property
    def st_size(self) -> int: ...
    @property
    def st_mtime_ns(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Block:
    """New bytes of one file, ready to scan.

    `data[:end]` is whole lines (the first one may be the tail of an over-long line whose
    head was handed out before); `data[end:]` is the unfinished last line. For a
    fragment of an over-long line `end == len(data)` and every byte belongs to line
    `line_no`. `fresh_from` is where bytes not seen in an earlier block start.
    """

    data: bytes
    end: int
    line_no: int  # number (1-based) of the line that starts at data[0]
    fragment: bool
    fresh_from: int
    line_known: bool  # False when the tail started mid-file and numbers are relative


class FileTail:
    """The read position in one file. Not thread-safe; one owner polls it."""

    def __init__(
        self,
        path: str,
        *,
        max_line: int = 32 << 10,
        catch_up_bytes: int = 4 << 20,
        from_end: bool = False,
    ) -> None:
        self.path = path
        # Start at the end of what the first poll finds (a kernel log's past is not news).
        self.from_end = from_end
        self.max_line = max(max_line, 2 * _OVERLAP)
        self.catch_up_bytes = catch_up_bytes
        self.dev: int | None = None
        self.ino: int | None = None
        self.offset = 0
        self.mtime_ns = 0
        self.line_no = 1  # the line that starts at the current carry
        self.line_known = True
        self.carry = b""
        self.in_long = False  # inside an over-long line whose head went out already
        self.skip_to_newline = False  # started mid-file: drop the partial first line
        self.fingerprint = b""
        # Counters (for stats and tests).
        self.bytes_read = 0
        self.lines = 0
        self.long_lines = 0
        self.resets = 0
        self.last_reset: str | None = None
        self.exists = False
        self.refused: str | None = None  # why the path is not read (not a regular file)
        # Where the current run's output begins (bytes): set when a requeued job's new
        # run resumes after the old run's lines; 0 once the file is rewritten.
        self.run_start = 0
        self._resume: tuple[int, int, bytes] | None = None

    def resume_at(self, offset: int, line_no: int, fingerprint: bytes) -> None:
        """Start after what an earlier tail of this file read (a job's previous run):
        at `offset`, if the file still holds the same bytes before it, else from 0."""
        self._resume = (offset, line_no, fingerprint)
        self.run_start = offset

    def position(self) -> tuple[int, int, bytes]:
        """(offset, line number, fingerprint): what `resume_at` takes."""
        return self.offset, self.line_no, self.fingerprint

    # -- polling -----------------------------------------------------------------------

    def poll(self, max_bytes: int) -> list[Block]:
        """Read up to `max_bytes` new bytes; [] when nothing changed or no file yet."""
        try:
            st = self._stat()
        except FileNotFoundError:
            self.exists = False
            if self.ino is None:
                self.from_end = False  # appears later: everything in it is new
            return []
        except OSError as error:
            log.debug("cannot stat %s: %s", self.path, error)
            return []
        if not stat.S_ISREG(st.st_mode):
            self._refuse(st)
            return []
        self.exists = True
        blocks: list[Block] = []
        if self.ino is None:
            self._attach(st)
        elif (st.st_dev, st.st_ino) != (self.dev, self.ino):
            blocks.extend(self._drain_rotated(max_bytes))
            blocks.extend(self._flush())
            self._restart(st, "replaced")
        elif st.st_size < self.offset:
            blocks.extend(self._flush())
            self._restart(st, "truncated")
        if st.st_size == self.offset and st.st_mtime_ns == self.mtime_ns:
            return blocks
        self.mtime_ns = st.st_mtime_ns
        data = self._read(max_bytes, st)
        if data:
            blocks.extend(self._assemble(data))
        return blocks

    def _stat(self) -> StatLike:
        """The file's stat now (a remote tail answers from its cycle's snapshot)."""
        return os.stat(self.path)

    def _refuse(self, st: StatLike) -> None:
        if self.path == "/dev/null" or stat.S_ISDIR(st.st_mode):
            return  # nothing to read, nothing to say
        why = f"not a regular file (mode {stat.S_IFMT(st.st_mode):o}); not read"
        if why != self.refused:
            log.warning("log %s is %s", self.path, why)
        self.refused = why

    def _attach(self, st: StatLike) -> None:
        self.dev, self.ino = st.st_dev, st.st_ino
        if self.from_end:
            self.from_end = False
            if self._attach_at_end(st.st_size):
                return
        resume, self._resume = self._resume, None
        if resume is not None and resume[0] <= st.st_size:
            # The previous run's lines are already read; the fingerprint check in
            # `_read` restarts from 0 if the file was truncated and rewritten meanwhile.
            self.offset, self.line_no, self.fingerprint = resume
            if st.st_size - self.offset <= self.catch_up_bytes:
                return
        self.run_start = 0 if resume is None or resume[0] > st.st_size else self.run_start
        if st.st_size > self.catch_up_bytes:
            # A big file already there (controller restarted under a long job): its
            # history is not news. Read only the recent end; line numbers are unknown.
            self.offset = st.st_size - self.catch_up_bytes
            self.fingerprint = b""  # a jump, not a resumed position: nothing to compare
            self.line_known = False
            self.skip_to_newline = True

    def _attach_at_end(self, size: int) -> bool:
        """Start at `size`, counting the lines before it (so line numbers stay true to
        the file, for evidence people look up); a last line without its newline yet is
        skipped. False when the file cannot be read here (then: from the start)."""
        try:
            fd = os.open(self.path, _OPEN_FLAGS)
        except OSError:
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            newlines, offset, last = 0, 0, b"\n"
            while offset < size:
                chunk = os.pread(fd, min(1 << 20, size - offset), offset)
                if not chunk:
                    break
                newlines += chunk.count(b"\n")
                offset += len(chunk)
                last = chunk[-1:]
        except OSError:
            return False
        finally:
            os.close(fd)
        self.offset = offset
        self.skip_to_newline = last != b"\n"
        # The skipped partial line is line newlines + 1: what follows it comes after.
        self.line_no = newlines + (2 if self.skip_to_newline else 1)
        self.mtime_ns = 0
        return True

    def _restart(self, st: StatLike, why: str) -> None:
        log.info("log %s %s: following it from the start", self.path, why)
        self.dev, self.ino = st.st_dev, st.st_ino
        self.offset = 0
        self.mtime_ns = 0
        self.line_no = 1
        self.line_known = True
        self.carry = b""
        self.in_long = False
        self.skip_to_newline = False
        self.fingerprint = b""
        self.run_start = 0
        self.resets += 1
        self.last_reset = why

    def _read(self, max_bytes: int, st: StatLike) -> bytes:
        try:
            fd = os.open(self.path, _OPEN_FLAGS)
        except OSError as error:
            log.debug("cannot open %s: %s", self.path, error)
            return b""
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode):
                self._refuse(now)  # swapped for a FIFO/device after the stat
                return b""
            self.refused = None
            if (now.st_dev, now.st_ino) != (self.dev, self.ino):
                return b""  # replaced between stat and open: the next poll sees it
            if self.fingerprint and self.offset >= len(self.fingerprint):
                before = os.pread(fd, len(self.fingerprint), self.offset - len(self.fingerprint))
                if before != self.fingerprint:
                    # Truncated and rewritten past our offset within one poll.
                    self._restart(now, "rewritten")
            want = min(max_bytes, max(0, now.st_size - self.offset))
            data = os.pread(fd, want, self.offset) if want else b""
        except OSError as error:
            log.debug("cannot read %s: %s", self.path, error)
            return b""
        finally:
            os.close(fd)
        self._advance(data)
        return data

    def _advance(self, data: bytes) -> None:
        self.offset += len(data)
        self.bytes_read += len(data)
        if len(data) >= _FINGERPRINT:
            self.fingerprint = data[-_FINGERPRINT:]
        else:
            self.fingerprint = (self.fingerprint + data)[-_FINGERPRINT:]

    def _drain_rotated(self, max_bytes: int) -> list[Block]:
        """The old file was renamed away: finish it from `<path>.1` when that is it."""
        old = f"{self.path}.1"
        try:
            fd = os.open(old, _OPEN_FLAGS)
        except OSError:
            return []
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return []
            if (st.st_dev, st.st_ino) != (self.dev, self.ino) or st.st_size <= self.offset:
                return []
            data = os.pread(fd, min(max_bytes, st.st_size - self.offset), self.offset)
        except OSError:
            return []
        finally:
            os.close(fd)
        self._advance(data)
        return self._assemble(data)

    def _flush(self) -> list[Block]:
        """The file ended for good (rotated/truncated): its unfinished line is a line."""
        if not self.carry or self.skip_to_newline:
            return []
        blocks = self._assemble(b"\n")
        return blocks

    # -- lines -------------------------------------------------------------------------

    def _assemble(self, data: bytes) -> list[Block]:
        if self.skip_to_newline:
            cut = data.find(b"\n")
            if cut < 0:
                return []
            data = data[cut + 1 :]
            self.skip_to_newline = False
            if not data:
                return []
        fresh_from = len(self.carry)
        buf = self.carry + data if self.carry else data
        end = buf.rfind(b"\n") + 1
        blocks: list[Block] = []
        if end:
            blocks.append(Block(buf, end, self.line_no, False, fresh_from, self.line_known))
            newlines = buf.count(b"\n", 0, end)
            self.line_no += newlines
            self.lines += newlines
            self.in_long = False
            rest = buf[end:]
            fresh_from = 0
        else:
            rest = buf
        if len(rest) > self.max_line:
            # An over-long line with no end in sight: hand this much out as a fragment
            # and keep only a little, so memory stays bounded whatever the writer does.
            if not self.in_long:
                self.long_lines += 1
            self.in_long = True
            blocks.append(Block(rest, len(rest), self.line_no, True, fresh_from, self.line_known))
            self.carry = rest[-_OVERLAP:]
        else:
            self.carry = rest
            if not end and rest:
                # Only an unfinished line: still worth a look for progress bars (\r).
                blocks.append(Block(rest, 0, self.line_no, False, fresh_from, self.line_known))
        return blocks
