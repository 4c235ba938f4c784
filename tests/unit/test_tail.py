"""FileTail: following one file through growth, requeues, rotation and garbage."""

from __future__ import annotations

import os
from pathlib import Path

from trainmedic.watchers.tail import Block, FileTail


def _lines(blocks: list[Block]) -> list[tuple[int, bytes]]:
    """(line number, bytes) of every complete line in the blocks."""
    out: list[tuple[int, bytes]] = []
    for block in blocks:
        if block.fragment or not block.end:
            continue
        for offset, raw in enumerate(block.data[: block.end].split(b"\n")[:-1]):
            out.append((block.line_no + offset, raw))
    return out


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_missing_file_then_growth_and_partial_lines(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    tail = FileTail(str(path))
    assert tail.poll(1 << 20) == [] and not tail.exists
    _append(path, b"one\ntw")
    assert _lines(tail.poll(1 << 20)) == [(1, b"one")]
    assert tail.carry == b"tw"
    assert _lines(tail.poll(1 << 20)) == []  # nothing new: no read
    _append(path, b"o\nthree\n")
    assert _lines(tail.poll(1 << 20)) == [(2, b"two"), (3, b"three")]


def test_bounded_read_per_poll_resumes(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    path.write_bytes(b"".join(b"line %04d\n" % i for i in range(1000)))  # 10 bytes each
    tail = FileTail(str(path))
    got: list[tuple[int, bytes]] = []
    polls = 0
    while len(got) < 1000:
        blocks = tail.poll(4096)
        assert sum(len(b.data) - b.fresh_from for b in blocks) <= 4096
        got += _lines(blocks)
        polls += 1
    assert polls >= 3
    assert got[0] == (1, b"line 0000") and got[-1] == (1000, b"line 0999")
    assert [n for n, _ in got] == list(range(1, 1001))


def test_truncation_restarts_from_the_top(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    path.write_bytes(b"run0 a\nrun0 b\nrun0 c\n")
    tail = FileTail(str(path))
    assert len(_lines(tail.poll(1 << 20))) == 3
    path.write_bytes(b"run1 a\n")  # O_TRUNC, same inode, shorter
    assert _lines(tail.poll(1 << 20)) == [(1, b"run1 a")]
    assert tail.resets == 1 and tail.last_reset == "truncated"


def test_rewrite_past_old_offset_within_one_poll_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    path.write_bytes(b"run0 line one\nrun0 line two\n")
    tail = FileTail(str(path))
    tail.poll(1 << 20)
    # Requeue overwrote the file and the new run already wrote more than the old one.
    with open(path, "r+b") as handle:
        handle.truncate(0)
        handle.write(b"run1 different start\nrun1 second line\nrun1 third\n")
    got = _lines(tail.poll(1 << 20))
    assert got[0] == (1, b"run1 different start") and got[-1] == (3, b"run1 third")
    assert tail.last_reset == "rewritten"


def test_append_on_requeue_continues(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    path.write_bytes(b"run0\n")
    tail = FileTail(str(path))
    tail.poll(1 << 20)
    _append(path, b"run1 resumed\n")
    assert _lines(tail.poll(1 << 20)) == [(2, b"run1 resumed")]
    assert tail.resets == 0


def test_replaced_file_new_inode(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    path.write_bytes(b"old 1\nold 2\nold 3\nold 4\n")
    tail = FileTail(str(path))
    tail.poll(1 << 20)
    os.rename(path, tmp_path / "kept-elsewhere")
    path.write_bytes(b"new 1\nnew 2\nnew 3\nnew 4\nnew 5\n")  # longer: size alone says nothing
    got = _lines(tail.poll(1 << 20))
    assert got[0] == (1, b"new 1") and len(got) == 5
    assert tail.last_reset == "replaced"


def test_deleted_and_recreated_with_a_reused_inode(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    path.write_bytes(b"old 1\nold 2\nold 3\nold 4\n")
    tail = FileTail(str(path))
    tail.poll(1 << 20)
    path.unlink()
    # tmpfs/ext4 may hand the same inode number to the new file: the bytes before the
    # old offset are what tells them apart.
    path.write_bytes(b"new 1\nnew 2\nnew 3\nnew 4\nnew 5\n")
    got = _lines(tail.poll(1 << 20))
    assert [raw for _, raw in got] == [b"new %d" % i for i in range(1, 6)]
    assert got[0][0] == 1 and tail.resets == 1


def test_rotation_reads_the_rest_of_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    path.write_bytes(b"a\nb\n")
    tail = FileTail(str(path))
    tail.poll(1 << 20)
    _append(path, b"c before rotation\nunfinished")
    os.rename(path, f"{path}.1")
    path.write_bytes(b"fresh\n")
    got = _lines(tail.poll(1 << 20))
    texts = [raw for _, raw in got]
    assert texts == [b"c before rotation", b"unfinished", b"fresh"]
    assert got[-1][0] == 1  # the new file is numbered from its own top


def test_not_a_regular_file_is_ignored(tmp_path: Path) -> None:
    tail = FileTail("/dev/null")
    assert tail.poll(1 << 20) == []
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert FileTail(str(fifo)).poll(1 << 20) == []  # never blocks on a reader-less pipe


def test_giant_line_is_fragmented_and_memory_bounded(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    max_line = 64 << 10
    tail = FileTail(str(path), max_line=max_line)
    _append(path, b"before\n")
    tail.poll(1 << 20)
    fragments = 0
    for _ in range(20):  # a 20 MB line, written 1 MB at a time
        _append(path, b"x" * (1 << 20))
        for block in tail.poll(1 << 20):
            assert block.fragment and block.line_no == 2
            fragments += 1
        assert len(tail.carry) <= max_line
    _append(path, b"\nafter\n")
    got = _lines(tail.poll(1 << 20))
    assert got[-1] == (3, b"after")
    assert tail.long_lines == 1 and fragments == 20


def test_big_existing_file_starts_near_its_end(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    path.write_bytes(b"".join(b"history line %06d\n" % i for i in range(100_000)))  # ~2 MB
    tail = FileTail(str(path), catch_up_bytes=64 << 10)
    blocks = tail.poll(1 << 20)
    got = _lines(blocks)
    assert 0 < len(got) < 5000
    assert got[-1][1] == b"history line 099999"
    assert got[0][1].startswith(b"history line ")  # no half line at the cut
    assert all(not b.line_known for b in blocks)


def test_from_end_starts_after_what_is_there_with_true_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(b"old 1\nold 2\nhalf a li")
    tail = FileTail(str(path), from_end=True)
    assert tail.poll(1 << 20) == []  # the first poll only takes the position
    _append(path, b"ne\nnew 4\n")
    # The unfinished line was there before: its rest is skipped, the next one is line 4.
    assert _lines(tail.poll(1 << 20)) == [(4, b"new 4")]


def test_from_end_reads_a_file_that_appears_later_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    tail = FileTail(str(path), from_end=True)
    assert tail.poll(1 << 20) == []
    path.write_bytes(b"first\n")
    assert _lines(tail.poll(1 << 20)) == [(1, b"first")]
