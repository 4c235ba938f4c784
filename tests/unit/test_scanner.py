"""The streaming scanner: line numbers, garbage, giant lines, block boundaries."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

from trainmedic.catalog import Matcher, Scanner, load_catalog
from trainmedic.catalog.scanner import looks_binary

MATCHER = Matcher(load_catalog())
PLAIN = Matcher(MATCHER.catalog, use_re2=False)
XID = b"kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
OOM = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def _scan(data: bytes, matcher: Matcher = MATCHER, **kw: int) -> list[tuple[int, list[str]]]:
    scanner = Scanner(matcher, **kw)
    return [
        (h.line_no, [m.rule.id for m in h.matches]) for h in scanner.scan_stream(io.BytesIO(data))
    ]


class _ReadOnly:
    """A stream with read() but no readinto(), like some wrappers."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def read(self, size: int) -> bytes:
        return self._inner.read(size)


def _mixed_log(seed: int) -> tuple[bytes, dict[int, str]]:
    """Benign lines with every catalog example sprinkled in; {line number: rule id}."""
    rng = random.Random(seed)
    lines: list[bytes] = []
    expected: dict[int, str] = {}
    for rule in MATCHER.catalog.rules:
        if rule.sources:
            continue  # read only from Slurm's state or the controller, never a log
        for example in rule.examples:
            lines.extend(
                b"[rank1]: iteration %d | lm loss: 2.0 | nan iterations: 0" % i
                for i in range(rng.randrange(0, 40))
            )
            lines.append(example.encode())
            expected.setdefault(len(lines), rule.id)
    return b"\n".join(lines) + b"\n", expected


def test_line_numbers_across_small_blocks() -> None:
    lines = [b"iteration %d | lm loss 2.0" % i for i in range(1000)]
    lines[10] = XID
    lines[777] = OOM
    data = b"\n".join(lines)  # no trailing newline: the last line still counts
    for block in (7, 64, 1000, 1 << 20):
        hits = _scan(data, block_size=block, max_line=256)
        assert [n for n, _ in hits] == [11, 778]
        assert "kernel.xid_79" in hits[0][1] and "oom.gpu_torch" in hits[1][1]


def test_invalid_utf8_nul_and_crlf_survive() -> None:
    data = (
        b"\xff\xfe\x00garbage\x80\r\n"
        + os.urandom(5000).replace(b"\n", b" ")
        + b"\r\n"
        + XID
        + b"\r\n"
    )
    hits = _scan(data, block_size=512)
    assert hits[-1][0] == 3 and "kernel.xid_79" in hits[-1][1]


def test_multi_megabyte_line_is_chunked_and_scanning_continues() -> None:
    giant = b"A" * (3 << 20) + b" " + OOM + b" " + b"B" * (2 << 20)
    data = b"start\n" + giant + b"\n" + XID + b"\n"
    hits = _scan(data, block_size=1 << 20, max_line=64 << 10)
    assert any(n == 2 and "oom.gpu_torch" in ids for n, ids in hits)
    assert hits[-1][0] == 3 and "kernel.xid_79" in hits[-1][1]


def test_benign_lines_give_no_hits() -> None:
    data = b"\n".join(
        [
            b"validation error: 0.12 | mean absolute error 0.3",
            b"gpu01:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 8 cudaDev 0 - Init COMPLETE",
            b"number of nan iterations: 0 | loss scale: 1.0",
        ]
        * 50
    )
    assert _scan(data) == []


def test_looks_binary(tmp_path: Path) -> None:
    text = tmp_path / "a.log"
    text.write_bytes(XID + b"\n")
    binary = tmp_path / "b.bin"
    binary.write_bytes(bytes(range(256)) * 40)
    assert not looks_binary(text)
    assert looks_binary(binary)


def test_re2_and_re_prefilters_give_identical_scans_at_any_block_size() -> None:
    data, expected = _mixed_log(seed=5)
    reference = _scan(data, PLAIN, block_size=1 << 20)
    assert {n for n, _ in reference} == set(expected)  # one hit line per example
    for n, ids in reference:
        assert expected[n] in ids
    for block in (61, 4096, 1 << 20):
        assert _scan(data, MATCHER, block_size=block, max_line=1 << 16) == reference


def test_stream_without_readinto_scans_the_same() -> None:
    data, _ = _mixed_log(seed=9)
    via_readinto = _scan(data, block_size=333)
    scanner = Scanner(MATCHER, block_size=333)
    via_read = [
        (h.line_no, [m.rule.id for m in h.matches]) for h in scanner.scan_stream(_ReadOnly(data))
    ]
    assert via_read == via_readinto
    assert scanner.bytes_scanned == len(data)
    assert scanner.lines_scanned == data.count(b"\n")


def test_line_longer_than_a_block_is_carried_whole() -> None:
    # 3 kB line (longer than the 256-byte block, shorter than max_line) with the
    # trigger in its middle, after and before plain lines.
    long_line = b"x" * 1500 + b" " + OOM + b" " + b"y" * 1500
    data = b"a\nb\n" + long_line + b"\nc\n" + XID + b"\n"
    hits = _scan(data, block_size=256, max_line=8192)
    assert [n for n, _ in hits] == [3, 5]
    assert "oom.gpu_torch" in hits[0][1] and "kernel.xid_79" in hits[1][1]


def test_many_trigger_lines_in_a_row_each_judged_once() -> None:
    data = b"\n".join([OOM + b" Killed Error"] * 500 + [b"done"])
    hits = _scan(data, block_size=4096)
    assert [n for n, _ in hits] == list(range(1, 501))


def test_scan_limits_start_where_the_run_begins(tmp_path: Path) -> None:
    """An appending requeued job: the earlier run's error is not read again."""
    from trainmedic.catalog.scanner import ScanLimits, scan_limits

    log = tmp_path / "job.out"
    old = "[rank1]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    new = "[rank0]: ValueError: the config names no dataset\n"
    log.write_text(old + new)
    scanner = Scanner(Matcher(load_catalog()))

    def rules() -> set[str]:
        return {m.rule.id for hit in scanner.scan_path(log) for m in hit.matches}

    everything = rules()
    with scan_limits(ScanLimits(start_at={str(log): len(old)})):
        this_run = rules()
    assert this_run and this_run < everything
    assert not any("ecc" in rule for rule in this_run)
    # An offset past the end (the file was truncated and rewritten): read it all.
    with scan_limits(ScanLimits(start_at={str(log): 10_000})):
        assert rules() == everything
