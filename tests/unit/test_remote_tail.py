"""The remote log snapshot's framing, and a remote tail polling a snapshot like a file."""

from __future__ import annotations

import stat

from trainmedic.watchers.remote_tail import (
    RemoteFileTail,
    RemoteSlice,
    RemoteStat,
    SliceRequest,
    parse_snapshot,
)

REGULAR = stat.S_IFREG | 0o644


def test_records_are_read_in_order_and_a_cut_answer_keeps_what_is_whole() -> None:
    requests = [SliceRequest("/a", 0, 100), SliceRequest("/fifo", 0, 100), SliceRequest("/b", 5, 9)]
    out = (
        b"F 81a4 2049 11 6 1700000000 0 6\nline\n\n"  # 6 bytes, one of them a newline
        b"N 11a4 2049 12 0 1700000000\n"
        b"F 81a4 2049 13 20 1700000001 5 9\n12345"  # cut: 5 of 9 bytes arrived
    )
    slices = parse_snapshot(requests, out)
    assert slices["/a"].data == b"line\n\n" and slices["/a"].stat is not None
    assert slices["/a"].stat.st_size == 6 and stat.S_ISREG(slices["/a"].stat.st_mode)
    fifo = slices["/fifo"].stat
    assert fifo is not None and stat.S_ISFIFO(fifo.st_mode)
    assert "/b" not in slices, "a record cut short is asked for again next cycle"
    assert parse_snapshot([SliceRequest("/gone", 0, 1)], b"M\n")["/gone"].stat is None


def test_a_remote_tail_reads_only_what_its_snapshot_holds() -> None:
    tail = RemoteFileTail("/job.out")
    assert tail.poll(100) == [], "no snapshot this cycle: nothing read, nothing lost"
    content = b"one\ntwo\nthr"
    request = tail.request(100)
    assert (request.start, request.length) == (0, 100)
    tail.snapshot = RemoteSlice(RemoteStat(REGULAR, 1, 7, len(content), 1), 0, content)
    [block] = tail.poll(100)
    assert block.data[: block.end] == b"one\ntwo\n" and tail.carry == b"thr"
    assert tail.snapshot is None, "each snapshot is read once"
    # The next request starts at the fingerprint before the offset, for the rewrite check.
    request = tail.request(50)
    assert request.start == 0 and request.length == 50 + len(content)
    grown = content + b"ee\n"
    tail.snapshot = RemoteSlice(RemoteStat(REGULAR, 1, 7, len(grown), 2), 0, grown)
    [block] = tail.poll(100)
    assert block.data[: block.end] == b"three\n" and block.line_no == 3
