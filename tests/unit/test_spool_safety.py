"""Spools (issue 9, items 4 and 6): only the expected writer's regular files are read,
refused files are set aside with the reason, nothing is lost while Temporal is down,
nothing is delivered twice, and no spool error ends a watcher."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from trainmedic.adapters.slurm.errors import SlurmUnavailable
from trainmedic.domain import Evidence, EvidenceSource
from trainmedic.domain.incident import IncidentSignal
from trainmedic.domain.slurm import SlurmNode
from trainmedic.errors import DeliveryError
from trainmedic.watchers import spoolfile
from trainmedic.watchers.base import ListSink
from trainmedic.watchers.epilog import EpilogSpool, PushReport, report_from_env, write_report
from trainmedic.watchers.spoolfile import (
    SpoolConfigError,
    SpoolPolicy,
    load_key,
    seal,
    write_spool_file,
)
from trainmedic.workers.detection import SignalSpool
from trainmedic.workers.node_agent import SIGNAL_PURPOSE, SpoolSink

KEY = b"0123456789abcdef-site-key"
OTHER_UID = 54321


def _signal(node: str = "gpu01", **update: Any) -> IncidentSignal:
    base = IncidentSignal(
        source="kernel",
        kind="kernel_xid",
        nodes=[node],
        at=datetime.now(UTC),
        detail=f"Xid 79 on {node}",
        evidence=[Evidence(source=EvidenceSource.KERNEL, text="NVRM: Xid 79", node=node)],
    )
    return base.model_copy(update=update)


def _epilog(job_id: str = "42") -> PushReport:
    return report_from_env(
        {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "gpu01", "SLURM_JOB_EXIT_CODE2": "1:0"}
    )


def _bad(folder: Path) -> dict[str, str]:
    """bad/ as {file name: reason slug}."""
    out: dict[str, str] = {}
    for reason in (folder / "bad").glob("*.reason"):
        out[reason.name.removesuffix(".reason")] = reason.read_text().split(":", 1)[0]
    return out


def _spool(folder: Path, sink: Any = None, **policy: Any) -> tuple[SignalSpool, ListSink]:
    sink = sink or ListSink()
    folder.mkdir(mode=0o755, exist_ok=True)
    return SignalSpool(folder, sink, interval=0.01, policy=SpoolPolicy(**policy)), sink


# ------------------------------------------------------------------------ refused files


async def test_a_symlink_to_shadow_is_refused_and_set_aside(tmp_path: Path) -> None:
    spool, sink = _spool(tmp_path / "signals")
    link = spool.folder / "0001-evil.json"
    link.symlink_to("/etc/shadow")
    before = Path("/etc/shadow").stat() if Path("/etc/shadow").exists() else None
    assert await spool.poll() == 0
    assert sink.signals == []
    assert _bad(spool.folder) == {"0001-evil.json": "symlink"}
    assert (spool.folder / "bad" / "0001-evil.json").is_symlink()  # moved, not followed
    if before is not None:
        assert Path("/etc/shadow").stat().st_mtime_ns == before.st_mtime_ns


async def test_world_writable_other_owner_oversize_fifo_and_hard_link_are_refused(
    tmp_path: Path,
) -> None:
    spool, sink = _spool(tmp_path / "signals", max_bytes=4096)
    body = _signal().model_dump_json()
    writable = spool.folder / "1-writable.json"
    writable.write_text(body)
    writable.chmod(0o666)
    foreign = spool.folder / "2-foreign.json"
    foreign.write_text(body)
    os.chown(foreign, OTHER_UID, OTHER_UID)
    (spool.folder / "3-big.json").write_text(body + " " * 5000)
    os.mkfifo(spool.folder / "4-fifo.json")
    outside = tmp_path / "outside.json"
    outside.write_text(body)
    os.link(outside, spool.folder / "5-linked.json")
    assert await asyncio.wait_for(spool.poll(), 5) == 0
    assert sink.signals == []
    assert _bad(spool.folder) == {
        "1-writable.json": "mode",
        "2-foreign.json": "owner",
        "3-big.json": "too-big",
        "4-fifo.json": "not-regular",
        "5-linked.json": "hard-link",
    }
    assert list(spool.folder.glob("*.json")) == []
    assert await spool.poll() == 0  # never read again


async def test_a_configured_owner_is_accepted(tmp_path: Path) -> None:
    spool, sink = _spool(tmp_path / "signals", owners=frozenset({OTHER_UID}))
    path = write_spool_file(
        spool.folder, "1.json", _signal().model_dump_json().encode(), purpose=SIGNAL_PURPOSE
    )
    os.chown(path, OTHER_UID, OTHER_UID)
    assert await spool.poll() == 1
    assert len(sink.signals) == 1


async def test_the_default_size_cap_is_one_mib(tmp_path: Path) -> None:
    spool, _ = _spool(tmp_path / "signals")
    (spool.folder / "huge.json").write_bytes(b" " * ((1 << 20) + 1))
    await spool.poll()
    assert _bad(spool.folder) == {"huge.json": "too-big"}


async def test_an_unsafe_spool_directory_is_not_read_at_all(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool, sink = _spool(tmp_path / "signals")
    SpoolSink(spool.folder)._write(_signal())
    spool.folder.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert await spool.poll() == 0
    assert sink.signals == []
    assert spool.spool.problem and "group/world-writable" in spool.spool.problem
    assert sum("world-writable" in r.getMessage() for r in caplog.records) == 1  # once
    spool.folder.chmod(0o755)
    assert await spool.poll() == 1


async def test_an_agent_spool_speaks_for_node_agents_only(tmp_path: Path) -> None:
    spool, sink = _spool(tmp_path / "signals")
    writer = SpoolSink(spool.folder)
    writer._write(_signal(source="operator"))
    writer._write(_signal(job_id="42"))
    stray = Evidence(source=EvidenceSource.KERNEL, text="Xid 79", node="gpu09")
    writer._write(_signal(evidence=[stray]))
    (spool.folder / "junk.json").write_text("{not json")
    assert await spool.poll() == 0
    assert sink.signals == []
    assert sorted(_bad(spool.folder).values()) == ["malformed"] * 4


# ----------------------------------------------------------------------------- signing


async def test_with_a_key_unsigned_and_badly_signed_files_are_forged(tmp_path: Path) -> None:
    spool, sink = _spool(tmp_path / "signals", key=KEY)
    body = _signal().model_dump_json().encode()
    write_spool_file(spool.folder, "1-unsigned.json", body, purpose=SIGNAL_PURPOSE)
    write_spool_file(spool.folder, "2-wrongkey.json", body, key=b"x" * 32, purpose=SIGNAL_PURPOSE)
    # A good signature for another name, or for an epilog report, does not carry over.
    (spool.folder / "3-renamed.json").write_bytes(
        seal(body, key=KEY, purpose=SIGNAL_PURPOSE, name="original.json")
    )
    (spool.folder / "4-purpose.json").write_bytes(
        seal(body, key=KEY, purpose="report", name="4-purpose.json")
    )
    SpoolSink(spool.folder, key=KEY)._write(_signal("gpu02"))
    assert await spool.poll() == 1
    assert [s.nodes for s in sink.signals] == [["gpu02"]]
    assert set(_bad(spool.folder).values()) == {"forged"}
    assert len(_bad(spool.folder)) == 4


def test_key_files_must_be_private_and_long_enough(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(KEY + b"\n")
    key.chmod(0o600)
    assert load_key(key) == KEY
    key.chmod(0o644)
    with pytest.raises(SpoolConfigError, match="0600"):
        load_key(key)
    key.write_bytes(b"short")
    key.chmod(0o600)
    with pytest.raises(SpoolConfigError, match="shorter"):
        load_key(key)
    env = {spoolfile.KEY_FILE_ENV: str(key), spoolfile.OWNERS_ENV: "root,54321"}
    key.write_bytes(KEY)
    policy = SpoolPolicy.from_env(env)
    assert policy.key == KEY and policy.owners == frozenset({0, OTHER_UID})
    assert SpoolPolicy.from_env(env, signed=False).key is None


# ----------------------------------------------------------------------------- writers


def test_both_writers_share_one_atomic_private_implementation(tmp_path: Path) -> None:
    report = write_report(_epilog("42_3"), tmp_path / "reports")
    SpoolSink(tmp_path / "signals")._write(_signal())
    (signal_file,) = (tmp_path / "signals").glob("*.json")
    for path in (report, signal_file):
        assert path.stat().st_mode & 0o777 == 0o640
        assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no tmp
    weird = report_from_env({"SLURM_JOB_ID": "../../x"})
    assert write_report(weird, tmp_path / "reports").parent == tmp_path / "reports"


# ------------------------------------------------------------------ delivery and retries


class FlakySink(ListSink):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0

    async def submit(self, signal: IncidentSignal) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise DeliveryError("temporal unreachable")
        await super().submit(signal)


async def test_delivery_error_keeps_the_report_then_delivers_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = FlakySink(failures=3)
    spool, _ = _spool(tmp_path / "signals", sink=sink)
    now = [100.0]
    spool.spool.clock = lambda: now[0]
    SpoolSink(spool.folder)._write(_signal())
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            assert await spool.poll() == 0
            assert len(list(spool.folder.glob("*.json"))) == 1  # kept
            assert await spool.poll() == 0  # inside the backoff: not even tried
            now[0] += 60
        assert await spool.poll() == 1
    assert sink.calls == 4 and len(sink.signals) == 1
    assert list(spool.folder.glob("*.json")) == []
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot deliver now" in m for m in messages) == 1  # one line, not one per try
    assert any("delivering again" in m for m in messages)


async def test_an_undeletable_delivered_file_is_not_resubmitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool, sink = _spool(tmp_path / "signals")
    SpoolSink(spool.folder)._write(_signal())
    real_unlink = os.unlink

    def refuse(path: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("dir_fd") is not None:
            raise PermissionError(1, "Operation not permitted")
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(spoolfile.os, "unlink", refuse)
    for _ in range(5):
        await spool.poll()
    assert len(sink.signals) == 1
    assert len(list(spool.folder.glob("*.json"))) == 1  # still there, not delivered again


async def test_a_reader_that_keeps_crashing_sets_the_file_aside(tmp_path: Path) -> None:
    class Broken(ListSink):
        async def submit(self, signal: IncidentSignal) -> None:
            raise RuntimeError("bug")

    spool, _ = _spool(tmp_path / "signals", sink=Broken())
    SpoolSink(spool.folder)._write(_signal())
    for _ in range(5):
        await spool.poll()
    assert list(_bad(spool.folder).values()) == ["sink-error"]


async def test_a_vanishing_spool_dir_does_not_end_the_loop(tmp_path: Path) -> None:
    folder = tmp_path / "signals"
    spool, sink = _spool(folder)
    stop = asyncio.Event()
    task = asyncio.ensure_future(spool.run(stop))

    async def until(count: int) -> None:
        for _ in range(500):
            if len(sink.signals) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"only {len(sink.signals)} signal(s) delivered")

    SpoolSink(folder)._write(_signal())
    await until(1)
    shutil.rmtree(folder)
    await asyncio.sleep(0.1)
    folder.parent.mkdir(exist_ok=True)
    folder.mkdir()
    os.chmod(folder, 0o700)
    SpoolSink(folder)._write(_signal("gpu02"))
    await until(2)
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 5)


# ---------------------------------------------------------------------- epilog spool


class Slurm:
    def __init__(self, down: set[str], reachable: bool = True) -> None:
        self.down = down
        self.reachable = reachable

    async def get_node(self, name: str) -> SlurmNode:
        if not self.reachable:
            raise SlurmUnavailable("slurmctld not responding")
        return SlurmNode(name=name, state="DOWN" if name in self.down else "IDLE")

    async def list_nodes(self) -> list[SlurmNode]:
        return [await self.get_node(f"gpu{i:02d}") for i in range(1, 9)]


async def test_node_down_reports_count_only_for_nodes_slurm_shows_down(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    slurm = Slurm(down={"gpu02"})
    sink = ListSink()
    spool = EpilogSpool(folder, sink, backend=slurm, policy=SpoolPolicy())  # type: ignore[arg-type]
    write_report(report_from_env({}, kind="node_down", nodes=["gpu01"]), folder)
    write_report(report_from_env({}, kind="node_down", nodes=["gpu01", "gpu02"]), folder)
    many = [f"gpu{i:02d}" for i in range(1, 7)]
    write_report(report_from_env({}, kind="node_failed", nodes=many), folder)
    await spool.drain_once()
    assert [s.nodes for s in sink.signals] == [["gpu02"], ["gpu02"]]
    assert spool.dropped == 1 and spool.pending() == []


async def test_node_down_waits_while_slurm_cannot_confirm(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    slurm = Slurm(down={"gpu01"}, reachable=False)
    sink = ListSink()
    spool = EpilogSpool(folder, sink, backend=slurm, policy=SpoolPolicy())  # type: ignore[arg-type]
    write_report(report_from_env({}, kind="node_down", nodes=["gpu01"]), folder)
    await spool.drain_once()
    assert sink.signals == [] and len(spool.pending()) == 1
    slurm.reachable = True
    spool.spool.clock = lambda: 1e12  # past the backoff
    await spool.drain_once()
    assert [s.nodes for s in sink.signals] == [["gpu01"]]


async def test_epilog_spool_keeps_reports_while_temporal_is_down(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    sink = FlakySink(failures=1)
    spool = EpilogSpool(folder, sink, policy=SpoolPolicy())
    write_report(_epilog("42"), folder)
    write_report(_epilog("43"), folder)
    assert await spool.drain_once() == []
    assert len(spool.pending()) == 2
    spool.spool.clock = lambda: 1e12
    assert [s.job_id for s in await spool.drain_once()] == ["42", "43"]
    assert spool.pending() == []


async def test_malformed_epilog_reports_are_set_aside(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    spool = EpilogSpool(folder, ListSink(), policy=SpoolPolicy())
    for n, job_id in enumerate(["42; reboot", "../../x", "4\n2"]):
        body = _epilog("1").model_copy(update={"job_id": job_id}).model_dump_json()
        write_spool_file(folder, f"{n}.json", body.encode(), purpose="report")
    nodes = _epilog("1").model_copy(update={"nodes": ["gpu01;id"]}).model_dump_json()
    write_spool_file(folder, "9.json", nodes.encode(), purpose="report")
    assert await spool.drain_once() == []
    assert set(_bad(folder).values()) == {"malformed"} and len(_bad(folder)) == 4
