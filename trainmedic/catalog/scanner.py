"""Stream a log file of any size through the matcher with bounded memory.

Reads big byte blocks, runs the trigger prefilter over the whole block, and only
splits out the lines around prefilter hits. Invalid UTF-8 is replaced, NUL bytes
dropped, and lines longer than `max_line` bytes are cut into chunks (the chunks keep
the line's number), so one multi-megabyte line never has to sit in memory whole.

Log files are the job owner's: `scan_path` opens them without blocking (O_NONBLOCK, so a
FIFO cannot stall the open) and scans regular files only (a FIFO, /dev/zero or a socket
is refused with `NotRegularFile`), and never reads past the size the file had when it
was opened (a writer that keeps appending cannot make a scan endless). Under
`scan_limits(...)` (the `attribute` activity) each file is also cut to its last
`max_bytes`, the whole scan stops at `deadline`, a `cancel` event stops it at the next
block, and what was skipped is written to `notes`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from trainmedic.catalog.matcher import LineMatch, Matcher

log = logging.getLogger(__name__)

BLOCK_SIZE = 4 << 20
MAX_LINE = 64 << 10
DEFAULT_MAX_SCAN_BYTES = 64 << 20  # per file: the failure is at the end of a log
_TEXT_KEEP = 2000  # characters of a matched line kept as evidence
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class NotRegularFile(OSError):
    """A log path that is a FIFO, device, socket or directory: never read."""


class ScanCancelled(Exception):
    """The scan's owner gave up (activity cancelled or timed out): stop now."""


@dataclass(slots=True)
class ScanLimits:
    """Bounds on one attribution's scans; shared with the thread that scans."""

    max_bytes: int | None = DEFAULT_MAX_SCAN_BYTES  # per file, from its end
    # Where the diagnosed run's output begins, per file: earlier runs' lines (a requeued
    # job appending to its log) are skipped. Ignored when the file is shorter.
    start_at: dict[str, int] = field(default_factory=dict)
    deadline: float | None = None  # time.monotonic() at which scanning stops
    cancel: threading.Event = field(default_factory=threading.Event)
    notes: list[str] = field(default_factory=list)
    bytes_scanned: int = 0  # all files so far (heartbeat details)
    files: int = 0
    out_of_time: bool = False

    def note(self, text: str) -> None:
        if len(self.notes) < 32:
            self.notes.append(text)
        log.warning("attribution scan: %s", text)

    def check(self) -> bool:
        """False once out of time; raises ScanCancelled once cancelled."""
        if self.cancel.is_set():
            raise ScanCancelled
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.out_of_time = True
        return not self.out_of_time


_LIMITS: ContextVar[ScanLimits | None] = ContextVar("trainmedic_scan_limits", default=None)


@contextlib.contextmanager
def scan_limits(limits: ScanLimits) -> Iterator[ScanLimits]:
    """Apply `limits` to every `scan_path` in this context (thread or task)."""
    token = _LIMITS.set(limits)
    try:
        yield limits
    finally:
        _LIMITS.reset(token)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def open_log(path: str | Path) -> tuple[int, os.stat_result]:
    """A descriptor on a regular file, opened without blocking; NotRegularFile otherwise.

    Symbolic links are followed: sites point job output at other file systems that way,
    and the type check below is made on what was actually opened.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, f"not a regular file ({_kind(st.st_mode)})", str(path))
    return fd, st


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return f"type {stat.S_IFMT(mode):o}"


@dataclass(frozen=True, slots=True)
class ScanHit:
    line_no: int  # 1-based
    text: str
    matches: tuple[LineMatch, ...]


def decode_line(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").replace("\x00", "").rstrip("\r\n")


def clip(text: str) -> str:
    return text if len(text) <= _TEXT_KEEP else text[:_TEXT_KEEP] + "…"


def looks_binary(path: str | Path, probe: int = 8192) -> bool:
    """True for files that are clearly not text logs (many NULs / control bytes)."""
    fd, _ = open_log(path)
    try:
        head = os.read(fd, probe)
    finally:
        os.close(fd)
    if not head:
        return False
    controls = sum(1 for b in head if b < 9 or 13 < b < 32)
    return head.count(0) > len(head) // 100 or controls > len(head) // 10


class Scanner:
    def __init__(
        self, matcher: Matcher, block_size: int = BLOCK_SIZE, max_line: int = MAX_LINE
    ) -> None:
        self.matcher = matcher
        self.block_size = block_size
        self.max_line = max_line
        self.bytes_scanned = 0
        self.lines_scanned = 0

    def scan_path(self, path: str | Path) -> Iterator[ScanHit]:
        """Hits in one log file, within the current `scan_limits` (see the module doc)."""
        limits = _LIMITS.get()
        if limits is not None and not limits.check():
            limits.note(f"{path}: not scanned, the scan's time cap was reached")
            return
        try:
            fd, st = open_log(path)
        except NotRegularFile as error:
            if limits is not None:
                limits.note(f"{path}: not scanned, {error.strerror}")
            raise
        with os.fdopen(fd, "rb", buffering=0) as handle:
            size, start = st.st_size, 0
            if limits is not None:
                limits.files += 1
                run_start = limits.start_at.get(str(path), 0)
                if 0 < run_start <= size:
                    # Not a limit worth a note in the summary: the lines before belong
                    # to earlier runs of the job, not to the failure being diagnosed.
                    start = run_start
                    handle.seek(start)
                    log.debug("%s: this run's output starts at byte %d", path, run_start)
                if limits.max_bytes is not None and size - start > limits.max_bytes:
                    start = size - limits.max_bytes
                    handle.seek(start)
                    limits.note(
                        f"{path}: scanned the last {_mib(limits.max_bytes)} of {_mib(size)}; "
                        "line numbers count from there"
                    )
            yield from self.scan_stream(handle, limit=size - start, path=str(path))

    def scan_stream(
        self, handle: object, *, limit: int | None = None, path: str = "stream"
    ) -> Iterator[ScanHit]:
        """Hits in a binary stream, in order; memory is bounded by the block size.

        At most `limit` bytes are read (the file's size at open: a file that keeps
        growing still ends). The current `scan_limits` are checked once per block.

        The stream is read into one reused buffer (`readinto` where the stream has it):
        allocating a fresh multi-megabyte block per read costs as much as the scan.
        """
        readinto = getattr(handle, "readinto", None)
        read = handle.read  # type: ignore[attr-defined]
        step = self.block_size
        # The unfinished last line is carried to the front of the buffer; it is
        # shorter than one block (or than max_line, when no newline was seen at all).
        buf = bytearray(step + max(step, self.max_line))
        view = memoryview(buf)
        line_no = 1  # number of the line that starts at offset 0 of `buf`
        kept = 0  # bytes of the carried line at the front of `buf`
        limits = _LIMITS.get()
        left = limit
        try:
            while True:
                want = step if left is None else min(step, left)
                if limits is not None and want and not limits.check():
                    limits.note(f"{path}: time cap reached; the rest was not scanned")
                    want = 0
                if not want:
                    got = 0
                elif readinto is not None:
                    got = readinto(view[kept : kept + want]) or 0
                else:
                    block = read(want)
                    got = len(block)
                    buf[kept : kept + got] = block
                if left is not None:
                    left -= got
                if limits is not None:
                    limits.bytes_scanned += got
                eof = got == 0
                filled = kept + got
                if not filled:
                    break
                self.bytes_scanned += got
                if eof:
                    end = filled
                else:
                    end = buf.rfind(b"\n", 0, filled) + 1
                    if end == 0:
                        # No newline in the whole buffer: a giant line. Scan what we
                        # have as one chunk of it and go on with the same line number.
                        if filled < self.max_line:
                            kept = filled
                            continue
                        yield from self._chunks_of_long_line(bytes(view[:filled]), line_no)
                        kept = 0
                        continue
                yield from self._scan_region(buf, end, line_no)
                newlines = buf.count(b"\n", 0, end)
                self.lines_scanned += newlines
                line_no += newlines
                kept = filled - end
                if eof:
                    if kept:
                        self.lines_scanned += 1
                    break
                if kept:
                    buf[:kept] = view[end:filled]
        finally:
            view.release()

    def _scan_region(self, buf: bytearray, end: int, line_no: int) -> Iterator[ScanHit]:
        """Hits in `buf[:end]`, whose first line is number `line_no`."""
        search = self.matcher.prefilter.search
        cursor, cursor_line, pos = 0, line_no, 0
        # One prefilter search per candidate line: after a hit, go on from the end of
        # its line, so a line full of triggers costs one search, not one per trigger.
        while pos < end and (hit := search(buf, pos, end)) is not None:
            start = buf.rfind(b"\n", pos, hit.start()) + 1 or pos
            stop = buf.find(b"\n", hit.end(), end)
            if stop < 0:
                stop = end
            pos = stop + 1
            cursor_line += buf.count(b"\n", cursor, start)
            cursor = start
            if stop - start > self.max_line:
                yield from self._chunks_of_long_line(bytes(buf[start:stop]), cursor_line)
                continue
            text = decode_line(bytes(buf[start:stop]))
            found = self.matcher.match(text)
            if found:
                yield ScanHit(cursor_line, clip(text), tuple(found))

    def _chunks_of_long_line(self, data: bytes, line_no: int) -> Iterator[ScanHit]:
        step = self.max_line
        for offset in range(0, len(data), step):
            # Overlap chunks a little so a message cut at a chunk edge is still seen.
            chunk = data[max(0, offset - 512) : offset + step]
            if not self.matcher.prefilter.search(chunk):
                continue
            text = decode_line(chunk)
            found = self.matcher.match(text)
            if found:
                yield ScanHit(line_no, clip(text), tuple(found))
