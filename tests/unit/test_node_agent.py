"""Node agent: following a kernel log, matching the catalog, NVML polling, signal shape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.test_node_fanout import Watcher
from tests.unit.test_router import Clock, FakeClient, router
from trainmedic.adapters.nvml import FakeNvml, RecoveryAction
from trainmedic.catalog import Matcher, load_catalog
from trainmedic.domain.enums import EvidenceSource
from trainmedic.lab import faults
from trainmedic.watchers.base import ListSink
from trainmedic.watchers.node import MAX_LINE, KernelLogTail, NodeAgent, pci_key, render_kmsg
from trainmedic.workers.detection import NodeFanout


@pytest.fixture(scope="module")
def matcher() -> Matcher:
    return Matcher(load_catalog())


def _append(path: Path, text: str | bytes) -> None:
    with path.open("ab") as handle:
        handle.write(text.encode() if isinstance(text, str) else text)


def test_tail_starts_at_end_and_keeps_partial_lines(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old 1\nold 2\n")
    tail = KernelLogTail(log)
    assert tail.poll() == []
    _append(log, "new 1\nhalf")
    got = tail.poll()
    assert [(x.text, x.line_no) for x in got] == [("new 1", 3)]
    _append(log, " done\n")
    assert [x.text for x in tail.poll()] == ["half done"]
    tail.close()


def test_tail_follows_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    tail = KernelLogTail(log)
    _append(log, "before rotation\n")
    os.rename(log, tmp_path / "kern.log.1")
    _append(tmp_path / "kern.log.1", "late line in old file\n")
    log.write_text("first in new file\n")
    texts = [x.text for x in tail.poll()]
    assert texts == ["before rotation", "late line in old file", "first in new file"]
    log.write_text("x\n")  # truncated in place (copytruncate), shorter than before
    assert [x.text for x in tail.poll()] == ["x"]
    tail.close()


def test_tail_cuts_huge_lines_and_replaces_bad_utf8(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    tail = KernelLogTail(log)
    _append(log, b"A" * (MAX_LINE * 3) + b"\nbad \xff byte\n")
    got = [x.text for x in tail.poll()]
    assert len(got) == 2 and len(got[0]) == MAX_LINE
    assert got[1] == "bad \ufffd byte"
    tail.close()


def test_tail_of_missing_file_reads_it_whole_once_it_appears(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    tail = KernelLogTail(log)
    assert tail.poll() == []
    log.write_text("hello\n")
    assert [x.text for x in tail.poll()] == ["hello"]
    tail.close()


def test_kmsg_records_render_like_dmesg() -> None:
    record = b"4,1234,812123456,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen\n"
    assert (
        render_kmsg(record)
        == "[  812.123456] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen"
    )


def test_pci_keys_of_kernel_and_nvml_agree() -> None:
    assert pci_key("0000:3b:00") == pci_key("00000000:3B:00.0")
    assert pci_key("garbage") is None


async def test_xid_line_becomes_one_kernel_xid_signal_with_gpu(
    tmp_path: Path, matcher: Matcher
) -> None:
    node_dir = faults.node_dir(tmp_path, "gpu02")
    node_dir.mkdir(parents=True)
    state = node_dir / faults.NVML_STATE
    faults.write_json_atomic(state, faults.default_nvml_state("gpu02", 4))
    kern = node_dir / faults.KERNEL_LOG
    kern.write_text("[    1.000000] Linux version 6.1.0\n")
    sink = ListSink()
    agent = NodeAgent("gpu02", sink, kernel=kern, nvml=FakeNvml.from_file(state), matcher=matcher)
    assert await agent.start_nvml()
    assert sink.signals == []  # healthy GPUs: nothing at start
    faults.append_kernel(tmp_path, "gpu02", ["usb 1-1: new high-speed USB device"])
    assert await agent.poll_kernel() == []
    faults.append_kernel(
        tmp_path, "gpu02", faults.kernel_lines(faults.Fault.XID79, pid=4242, node="gpu02", gpu=2)
    )
    [signal] = await agent.poll_kernel()
    assert (signal.source, signal.kind, signal.job_id, signal.nodes) == (
        "kernel",
        "kernel_xid",
        None,
        ["gpu02"],
    )
    assert signal.at is not None and "Xid 79" in signal.detail
    xid = signal.evidence[0]
    assert xid.source is EvidenceSource.KERNEL and xid.rule_id == "kernel.xid_79"
    assert (xid.node, xid.gpu, xid.file, xid.line_no) == ("gpu02", 2, str(kern), 3)
    assert sink.signals == [signal]


async def test_host_oom_is_a_kernel_error(tmp_path: Path, matcher: Matcher) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("")
    sink = ListSink()
    agent = NodeAgent("gpu01", sink, kernel=kern, matcher=matcher)
    faults.append_kernel(tmp_path, "x", [])  # nothing written for no lines
    with kern.open("a") as handle:
        for line in faults.kernel_lines(faults.Fault.HOST_OOM, pid=77):
            handle.write(f"[ 10.0] {line}\n")
    [signal] = await agent.poll_kernel()
    assert signal.kind == "kernel_error"
    assert {e.rule_id for e in signal.evidence} == {"oom.host_kernel"}


async def test_nvml_changes_become_nvml_signals(matcher: Matcher) -> None:
    fake = FakeNvml(gpus=2)
    sink = ListSink()
    agent = NodeAgent("gpu03", sink, nvml=fake, matcher=matcher)
    assert await agent.start_nvml()
    assert await agent.poll_nvml() == []
    fake.set(1, ecc_uncorrectable_volatile=2, recovery_action=RecoveryAction.GPU_RESET)
    fake.xid(1, 48)
    [signal] = await agent.poll_nvml()
    assert (signal.source, signal.kind, signal.nodes, signal.job_id) == (
        "nvml",
        "nvml",
        ["gpu03"],
        None,
    )
    texts = {e.text for e in signal.evidence}
    assert texts == {
        "nvml: gpu 1 ecc_uncorrectable_volatile=2",
        "nvml: gpu 1 recovery_action=GPU_RESET",
        "nvml: gpu 1 Xid 48 event",
    }
    assert all(e.gpu == 1 and e.source is EvidenceSource.NVML for e in signal.evidence)
    assert await agent.poll_nvml() == []  # reported once
    agent.close()
    assert not fake.initialised


async def test_agent_without_nvml_keeps_watching_the_kernel(
    tmp_path: Path, matcher: Matcher
) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("")
    agent = NodeAgent(
        "gpu01", ListSink(), kernel=kern, nvml=FakeNvml(fail_init="no driver"), matcher=matcher
    )
    assert not await agent.start_nvml()
    assert await agent.poll_nvml() == []
    _append(kern, "[ 5.1] NVRM: Xid (PCI:0000:18:00): 48, pid=9, name=python, DBE\n")
    [signal] = await agent.poll_kernel()
    assert signal.evidence[0].gpu is None  # no NVML: no bus id to map


class _BrokenSink:
    async def submit(self, signal: object) -> None:
        raise RuntimeError("controller unreachable")


async def test_a_failing_sink_does_not_stop_the_agent(tmp_path: Path, matcher: Matcher) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("")
    agent = NodeAgent("gpu01", _BrokenSink(), kernel=kern, matcher=matcher)
    _append(kern, "[ 5.1] NVRM: Xid (PCI:0000:18:00): 79, pid=9, name=python, off the bus\n")
    assert len(await agent.poll_kernel()) == 1


def test_agent_process_spools_signals_and_stops_on_sigterm(tmp_path: Path) -> None:
    import signal as signals
    import subprocess
    import sys
    import time

    from trainmedic.domain.incident import IncidentSignal

    node_dir = faults.node_dir(tmp_path, "gpu04")
    node_dir.mkdir(parents=True)
    kern = node_dir / faults.KERNEL_LOG
    kern.write_text("")
    spool = tmp_path / "spool"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainmedic.workers.node_agent",
            "--node",
            "gpu04",
            "--kernel",
            str(kern),
            "--nvml",
            "none",
            "--spool",
            str(spool),
            "--kernel-interval",
            "0.05",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        files: list[Path] = []
        while not files and time.monotonic() < deadline:
            # Written repeatedly: the agent starts at the end of the file, whenever it starts.
            faults.append_kernel(
                tmp_path, "gpu04", faults.kernel_lines(faults.Fault.XID79, pid=1, node="gpu04")
            )
            time.sleep(0.3)
            files = sorted(spool.glob("*.json")) if spool.exists() else []
        assert files, "no signal spooled"
        signal = IncidentSignal.model_validate_json(files[0].read_text())
        assert (signal.kind, signal.nodes, signal.job_id) == ("kernel_xid", ["gpu04"], None)
    finally:
        proc.send_signal(signals.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_kernel_tail_of_a_line_cut_across_polls_gives_its_head_once(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    tail = KernelLogTail(log)
    _append(log, b"B" * (MAX_LINE * 2))  # no newline yet: handed out cut, once
    [cut] = tail.poll()
    assert cut.text == "B" * MAX_LINE and cut.line_no == 1
    _append(log, b"B" * MAX_LINE)
    assert tail.poll() == []
    _append(log, b"BBB\nnext\n")
    assert [(x.text, x.line_no) for x in tail.poll()] == [("next", 2)]
    tail.close()


async def test_a_flood_of_lesser_lines_does_not_hide_the_one_that_drains(
    tmp_path: Path, matcher: Matcher
) -> None:
    """One Xid 13 prints a line per SM; the Xid 79 after forty of them is what says the
    node lost a GPU, and it must be among the lines the agent sends."""
    kern = tmp_path / "kern.log"
    kern.write_text("")
    sink = ListSink()
    agent = NodeAgent("gpu02", sink, kernel=kern, matcher=matcher)
    assert await agent.poll_kernel() == []  # the tail starts at the log's end
    xid13 = [
        f"NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics SM Warp Exception on"
        f" (GPC {n // 8}, TPC {n % 8}, SM 0): Out Of Range Address"
        for n in range(40)
    ]
    with kern.open("a") as handle:
        for line in [*xid13, *faults.kernel_lines(faults.Fault.XID79, pid=4242, node="gpu02")]:
            handle.write(f"[  100.000000] {line}\n")
    [signal] = await agent.poll_kernel()
    texts = [e.text for e in signal.evidence]
    assert len(texts) <= 32
    xids = [t for t in texts if "): 79, " in t or "): 13, " in t]
    # Kept, and in the log's order: the Xid 13 lines that made the cut come before it.
    assert "): 79, pid=4242" in xids[-1]
    assert all("): 13, " in t for t in xids[:-1])
    fanout = NodeFanout(router(FakeClient(), Clock()), Watcher(None))
    assert fanout.shows_node_unfit(signal)
