"""The node agent: kernel log and NVML on one GPU node, turned into signals.

It knows nothing about jobs: every signal has `job_id=None` and `nodes=[node]`; the
incident router maps a node signal to the jobs running there. Kernel lines are matched
against the catalog and reported when a root rule fires (Xid, ECC, OOM killer, NIC
errors...); NVML is polled every few seconds and changes for the worse are reported.

Kernel sources (all polled, never blocking the event loop for long):
- `KernelLogTail`: a log file (the lab's `<lab root>/nodes/<node>/kern.log`, or
  /var/log/kern.log), followed from its end, across rotation and truncation;
- `KmsgSource`: /dev/kmsg records, from the newest on;
- `CommandSource`: a command's stdout, e.g. `journalctl -k -f -o short-monotonic`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from trainmedic.adapters.nvml.protocol import (
    GpuHealth,
    NvmlBackend,
    NvmlError,
    NvmlFinding,
    findings,
    xid_finding,
)
from trainmedic.catalog import Matcher, load_catalog
from trainmedic.catalog.matcher import LineMatch
from trainmedic.domain.diagnosis import Evidence
from trainmedic.domain.enums import EvidenceSource, Role
from trainmedic.domain.incident import IncidentSignal
from trainmedic.watchers.base import SignalSink
from trainmedic.watchers.tail import Block, FileTail

log = logging.getLogger(__name__)

MAX_LINE = 16 * 1024  # longer kernel lines are cut: no real one is this long
_READ_CHUNK = 256 * 1024
_READ_BUDGET = 16 * 1024 * 1024  # bytes of kernel log read per poll; the rest comes next
_MAX_EVIDENCE = 32


@dataclass(frozen=True, slots=True)
class KernelLine:
    text: str
    file: str | None = None
    line_no: int | None = None


class KernelSource(Protocol):
    def poll(self) -> list[KernelLine]:
        """Complete lines that arrived since the last call; never blocks for long."""

    def close(self) -> None: ...


class _Lines:
    """Bytes in, complete decoded lines out: partial lines wait, huge ones are cut."""

    def __init__(self) -> None:
        self._partial = bytearray()
        self._skipping = False  # inside a line already cut at MAX_LINE

    def feed(self, data: bytes) -> list[str]:
        out: list[str] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if not self._skipping:
                self._partial += data[start:end]
                out.append(self._partial[:MAX_LINE].decode("utf-8", "replace").rstrip("\r"))
            self._partial.clear()
            self._skipping = False
            start = end + 1
        if not self._skipping:
            self._partial += data[start:]
            if len(self._partial) > MAX_LINE:
                out.append(self._partial[:MAX_LINE].decode("utf-8", "replace"))
                self._partial.clear()
                self._skipping = True
        return out

    def reset(self) -> None:
        self._partial.clear()
        self._skipping = False


class KernelLogTail:
    """A kernel log file followed like `tail -F` (`watchers.tail.FileTail` does the
    following: rotation, truncation, partial lines, non-regular files refused), from its
    end at start, or from its start if asked or if it appears later. Lines longer than
    MAX_LINE are cut there."""

    def __init__(self, path: Path, *, from_start: bool = False) -> None:
        self.path = Path(path)
        self._tail = FileTail(str(self.path), max_line=MAX_LINE, from_end=not from_start)
        self._in_long = False  # the rest of a line already cut at MAX_LINE is dropped
        self._tail.poll(0)  # the position now: what is there already is not news

    def poll(self) -> list[KernelLine]:
        out: list[KernelLine] = []
        for block in self._tail.poll(_READ_BUDGET):
            if block.fragment:  # an over-long line, still without its end
                if not self._in_long:
                    out.append(self._line(block.data[:MAX_LINE], block, block.line_no))
                self._in_long = True
                continue
            if not block.end:
                continue  # an unfinished line: it comes again once its newline arrives
            lines = block.data[: block.end - 1].split(b"\n")
            if self._in_long:
                lines = lines[1:]  # the tail of the line cut before
                self._in_long = False
                first = block.line_no + 1
            else:
                first = block.line_no
            for number, raw in enumerate(lines, first):
                out.append(self._line(raw[:MAX_LINE], block, number))
        return out

    def _line(self, raw: bytes, block: Block, number: int) -> KernelLine:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        return KernelLine(text, str(self.path), number if block.line_known else None)

    def close(self) -> None:
        """Nothing to release: the tail holds no descriptor between polls."""


# /dev/kmsg record: "<prio>,<seq>,<usec since boot>,<flags>[,...];<message>"
_KMSG = re.compile(rb"^(\d+),(\d+),(\d+),[^;]*;(.*)$", re.S)


class KmsgSource:
    """The kernel ring buffer through /dev/kmsg (root or CAP_SYSLOG), newest on.

    Each read returns one record; records are rendered dmesg-style
    (`[  812.123456] message`) so they read like `dmesg` output in evidence.
    """

    def __init__(self, path: Path = Path("/dev/kmsg")) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self._fd, 0, os.SEEK_END)  # only what happens from now on

    def poll(self) -> list[KernelLine]:
        out: list[KernelLine] = []
        while self._fd is not None and len(out) < 4096:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as error:
                if error.errno == errno.EPIPE:
                    continue  # we were overrun: records were lost; carry on from here
                log.warning("reading %s: %s", self.path, error)
                break
            if not record:
                break
            out.append(KernelLine(render_kmsg(record), str(self.path)))
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def render_kmsg(record: bytes) -> str:
    m = _KMSG.match(record.rstrip(b"\n"))
    if not m:
        return record.decode("utf-8", "replace").rstrip("\n")
    usec = int(m.group(3))
    # Continuation lines of a record come after "\n " and carry key=value metadata.
    message = m.group(4).split(b"\n", 1)[0].decode("utf-8", "replace")
    return f"[{usec // 1_000_000:5d}.{usec % 1_000_000:06d}] {message}"


class CommandSource:
    """Lines of a long-running command's stdout (argv list), e.g.
    `["journalctl", "-k", "-f", "-n", "0", "-o", "short-monotonic"]`."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        assert self._proc.stdout is not None
        self._fd = self._proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._lines = _Lines()

    def poll(self) -> list[KernelLine]:
        out: list[KernelLine] = []
        for _ in range(64):
            try:
                data = os.read(self._fd, _READ_CHUNK)
            except BlockingIOError:
                break
            if not data:
                if self._proc.poll() is not None:
                    log.warning("%s exited with %s", self.argv[0], self._proc.returncode)
                break
            out.extend(KernelLine(text, self.argv[0]) for text in self._lines.feed(data))
        return out

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def pci_key(bus_id: str) -> tuple[int, str, str] | None:
    """`0000:3b:00` (NVRM) and `00000000:3B:00.0` (NVML) name the same GPU: normalise."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    domain, bus, device = parts
    try:
        return int(domain, 16), bus, device.split(".", 1)[0]
    except ValueError:
        return None


def _evidence_weight(matches: list[LineMatch]) -> int:
    """How much a kernel line says of its node: a line whose rule drains it, then one
    whose rule is a root, then the rest (lower comes first)."""
    if any(m.rule.drains for m in matches):
        return 0
    return 1 if any(m.rule.role is Role.ROOT for m in matches) else 2


def _strongest(found: list[tuple[int, int, Evidence]]) -> list[Evidence]:
    """At most _MAX_EVIDENCE lines, the weightiest first chosen, in the log's order: one
    Xid 13 prints a line per SM, and 40 of them must not push out the Xid 79 after them,
    which is what says the node is unfit (workers/detection.py NodeFanout)."""
    kept = sorted(found, key=lambda f: (f[0], f[1]))[:_MAX_EVIDENCE]
    return [evidence for _, _, evidence in sorted(kept, key=lambda f: f[1])]


class NodeAgent:
    """Watches one node. `run()` until cancelled or `stop` is set; `poll_kernel()` and
    `poll_nvml()` do one round each (tests, benchmarks)."""

    def __init__(
        self,
        node: str,
        sink: SignalSink,
        *,
        kernel: KernelSource | Path | None = None,
        nvml: NvmlBackend | None = None,
        matcher: Matcher | None = None,
        kernel_interval: float = 0.25,
        nvml_interval: float = 5.0,
    ) -> None:
        self.node = node
        self.sink = sink
        self.kernel: KernelSource | None = (
            KernelLogTail(kernel) if isinstance(kernel, Path) else kernel
        )
        self.nvml = nvml
        self.matcher = matcher or Matcher(load_catalog())
        self.kernel_interval = kernel_interval
        self.nvml_interval = nvml_interval
        self._nvml_ready = False
        self._health: dict[int, GpuHealth] = {}
        self._gpu_by_pci: dict[tuple[int, str, str], int] = {}

    # ---------------------------------------------------------------- kernel

    def _relevant(self, matches: list[LineMatch]) -> list[LineMatch]:
        """Roots and confirmations, the strongest rule first (an Xid before its echo)."""
        kept = [m for m in matches if m.rule.role in (Role.ROOT, Role.CONFIRMATION)]
        return sorted(kept, key=lambda m: (m.rule.role is not Role.ROOT, -m.rule.precedence))

    async def poll_kernel(self) -> list[IncidentSignal]:
        """Read new kernel lines; emit one signal for the batch if a root rule fired."""
        if self.kernel is None:
            return []
        lines = await asyncio.to_thread(self.kernel.poll)
        # (weight, line's place, evidence): past the cap, the lines that say most are kept
        found: list[tuple[int, int, Evidence]] = []
        has_root = False
        xids: list[int] = []
        descriptions: list[str] = []
        for line in lines:
            matches = self._relevant(self.matcher.match(line.text, EvidenceSource.KERNEL))
            if not matches:
                continue
            first = matches[0]
            has_root = has_root or any(m.rule.role is Role.ROOT for m in matches)
            pci = next((m.pci for m in matches if m.pci), None)
            xid = next((m.xid for m in matches if m.xid is not None), None)
            if xid is not None:
                xids.append(xid)
            if first.rule.description and first.rule.description not in descriptions:
                descriptions.append(first.rule.description)
            found.append(
                (
                    _evidence_weight(matches),
                    len(found),
                    Evidence(
                        source=EvidenceSource.KERNEL,
                        text=line.text,
                        file=line.file,
                        line_no=line.line_no,
                        rule_id=first.rule.id,
                        node=self.node,
                        gpu=self._gpu_of(pci),
                    ),
                )
            )
        if not has_root:
            return []
        evidence = _strongest(found)
        kind = "kernel_xid" if xids else "kernel_error"
        what = f"Xid {', '.join(str(x) for x in dict.fromkeys(xids))}" if xids else "kernel error"
        signal = IncidentSignal(
            source="kernel",
            kind=kind,
            job_id=None,
            nodes=[self.node],
            at=datetime.now(UTC),
            detail=f"{what} on {self.node}: {descriptions[0] if descriptions else ''}".rstrip(": "),
            evidence=evidence,
        )
        await self._submit(signal)
        return [signal]

    def _gpu_of(self, pci: str | None) -> int | None:
        if not pci:
            return None
        key = pci_key(pci)
        return self._gpu_by_pci.get(key) if key else None

    # ------------------------------------------------------------------ nvml

    async def start_nvml(self) -> bool:
        if self.nvml is None:
            return False
        if self._nvml_ready:
            return True
        try:
            await asyncio.to_thread(self.nvml.init)
        except NvmlError as error:
            log.warning("node %s: NVML unavailable (%s); kernel log only", self.node, error)
            self.nvml = None
            return False
        self._nvml_ready = True
        # The first reading is the baseline: standing faults are reported, counters not.
        await self.poll_nvml()
        return True

    def _read_all(self) -> tuple[list[GpuHealth], list[NvmlFinding]]:
        assert self.nvml is not None
        readings = [self.nvml.read(i) for i in range(self.nvml.device_count())]
        events = self.nvml.xid_events(0)
        by_index = {h.index: h for h in readings}
        out: list[NvmlFinding] = []
        for health in readings:
            out.extend(findings(self._health.get(health.index), health))
        for event in events:
            out.append(xid_finding(event, by_index.get(event.gpu) or self._health.get(event.gpu)))
        return readings, out

    async def poll_nvml(self) -> list[IncidentSignal]:
        if self.nvml is None or not self._nvml_ready:
            return []
        try:
            readings, found = await asyncio.to_thread(self._read_all)
        except NvmlError as error:
            log.warning("node %s: NVML read failed: %s", self.node, error)
            return []
        for health in readings:
            if health.pci_bus_id and (key := pci_key(health.pci_bus_id)):
                self._gpu_by_pci[key] = health.index
            previous = self._health.get(health.index)
            if health.lost and previous is not None:
                # Keep what we knew of a lost GPU (its identity) for later evidence.
                health = health.model_copy(
                    update={"uuid": previous.uuid, "pci_bus_id": previous.pci_bus_id}
                )
            self._health[health.index] = health
        evidence: list[Evidence] = []
        rule_ids: list[str] = []
        for finding in found:
            matches = self._relevant(self.matcher.match(finding.text, EvidenceSource.NVML))
            if not matches:
                log.info("node %s: %s (no catalog rule: not reported)", self.node, finding.text)
                continue
            rule_ids.append(matches[0].rule.id)
            evidence.append(
                Evidence(
                    source=EvidenceSource.NVML,
                    text=finding.text,
                    rule_id=matches[0].rule.id,
                    node=self.node,
                    gpu=finding.gpu if finding.gpu >= 0 else None,
                )
            )
        if not evidence:
            return []
        signal = IncidentSignal(
            source="nvml",
            kind="nvml",
            job_id=None,
            nodes=[self.node],
            at=datetime.now(UTC),
            detail=f"NVML on {self.node}: "
            + "; ".join(e.text.removeprefix("nvml: ") for e in evidence[:4]),
            evidence=evidence[:_MAX_EVIDENCE],
        )
        await self._submit(signal)
        return [signal]

    # ------------------------------------------------------------------- run

    async def _submit(self, signal: IncidentSignal) -> None:
        log.info("node %s: %s", self.node, signal.detail)
        try:
            await self.sink.submit(signal)
        except Exception:  # the agent must outlive a sink's bad moment
            log.exception("node %s: could not deliver a %s signal", self.node, signal.kind)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.start_nvml()
        loop = asyncio.get_running_loop()
        next_nvml = loop.time() + self.nvml_interval
        try:
            while not stop.is_set():
                await self.poll_kernel()
                if loop.time() >= next_nvml:
                    await self.poll_nvml()
                    next_nvml = loop.time() + self.nvml_interval
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.kernel_interval)
        finally:
            self.close()

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
        if self.nvml is not None and self._nvml_ready:
            with contextlib.suppress(NvmlError):
                self.nvml.shutdown()
            self._nvml_ready = False
