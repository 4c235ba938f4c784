"""Stream a log file of any size through the matcher with bounded memory.

Reads big byte blocks, runs the trigger prefilter over the whole block, and only
splits out the lines around prefilter hits. Invalid UTF-8 is replaced, NUL bytes
dropped, and lines longer than `max_line` bytes are cut into chunks (the chunks keep
the line's number), so one multi-megabyte line never has to sit in memory whole.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainmedic.catalog.matcher import LineMatch, Matcher

log = logging.getLogger(__name__)

BLOCK_SIZE = 4 << 20
MAX_LINE = 64 << 10
_TEXT_KEEP = 2000  # characters of a matched line kept as evidence


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
    with open(path, "rb") as handle:
        head = handle.read(probe)
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
        with open(path, "rb") as handle:
            yield from self.scan_stream(handle)

    def scan_stream(self, handle: object) -> Iterator[ScanHit]:
        """Hits in a binary stream, in order; memory is bounded by the block size.

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
        try:
            while True:
                if readinto is not None:
                    got = readinto(view[kept : kept + step]) or 0
                else:
                    block = read(step)
                    got = len(block)
                    buf[kept : kept + got] = block
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
