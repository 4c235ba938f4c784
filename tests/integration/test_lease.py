"""The watchers' lease on the real dev server: one leader at a time, a dead leader's lease
passes after its time, a clean stop hands over at once, and every handover is recorded."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from trainmedic.workers.lease import LeaseHolder
from trainmedic.workflows.lease import LeaseWorkflow

pytestmark = pytest.mark.integration

# Long enough that a loaded CI machine's slow updates do not read as a dead leader.
TTL = timedelta(seconds=9)


class Terms:
    """Who led when (loop time), to check that no two terms overlap."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float | None, bool]] = []

    def detect(self, name: str):  # type: ignore[no-untyped-def]
        async def run(lost: asyncio.Event, took_over: bool) -> None:
            loop = asyncio.get_running_loop()
            index = len(self.spans)
            self.spans.append((name, loop.time(), None, took_over))
            try:
                await lost.wait()
            finally:
                who, start, _, over = self.spans[index]
                self.spans[index] = (who, start, loop.time(), over)

        return run

    def leader(self) -> str | None:
        open_terms = [who for who, _, end, _ in self.spans if end is None]
        assert len(open_terms) <= 1, f"two leaders at once: {open_terms}"
        return open_terms[0] if open_terms else None


@pytest.fixture
async def lease_queue(temporal_client: Client) -> AsyncIterator[str]:
    queue = f"lease-{uuid.uuid4().hex[:6]}"
    async with Worker(temporal_client, task_queue=queue, workflows=[LeaseWorkflow]):
        yield queue


async def wait_until(probe, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not probe():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_one_leader_a_dead_one_replaced_a_clean_stop_handed_over(
    temporal_client: Client, lease_queue: str
) -> None:
    cluster = f"ls{uuid.uuid4().hex[:6]}"
    terms = Terms()
    holders = {
        name: LeaseHolder(temporal_client, cluster, name, lease_queue, ttl=TTL)
        for name in ("ctl-a", "ctl-b")
    }
    stops = {name: asyncio.Event() for name in holders}
    tasks = {
        name: asyncio.create_task(holder.lead(stops[name], terms.detect(name)))
        for name, holder in holders.items()
    }
    try:
        await _scenario(terms, holders, stops, tasks)
    finally:
        # A failed check must not leave the holders renewing into the next tests.
        for stop in stops.values():
            stop.set()
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


async def _scenario(
    terms: Terms,
    holders: dict[str, LeaseHolder],
    stops: dict[str, asyncio.Event],
    tasks: dict[str, asyncio.Task[None]],
) -> None:
    await wait_until(lambda: terms.leader() is not None, 20)
    first = terms.leader()
    assert first is not None
    other = "ctl-b" if first == "ctl-a" else "ctl-a"
    await asyncio.sleep(TTL.total_seconds())  # renewals: still the same leader
    assert terms.leader() == first
    assert terms.spans[0][3] is False, "the first leader takes over from nobody"

    # The leader dies: no release, its renewals just stop (its detection with it).
    tasks[first].cancel()
    died = asyncio.get_running_loop().time()
    await wait_until(lambda: terms.leader() == other, 20)
    took = asyncio.get_running_loop().time() - died
    assert took <= TTL.total_seconds() * 2, f"handover took {took:.1f}s"
    assert terms.spans[-1][3] is True, "a takeover looks back for what was missed"

    # The old one comes back: it waits as standby while the other renews.
    stops[first] = asyncio.Event()
    tasks[first] = asyncio.create_task(holders[first].lead(stops[first], terms.detect(first)))
    await asyncio.sleep(TTL.total_seconds())
    assert terms.leader() == other

    # A clean stop releases the lease: the standby leads within a renewal period.
    stops[other].set()
    await tasks[other]
    stopped = asyncio.get_running_loop().time()
    await wait_until(lambda: terms.leader() == first, 20)
    assert asyncio.get_running_loop().time() - stopped <= TTL.total_seconds()
    assert terms.spans[-1][3] is True

    stops[first].set()
    await tasks[first]
    state = await holders[first].state()
    assert state.holder is None
    whys = [h.why for h in state.handovers]
    # On a loaded machine a slow renewal may hand over once more; the order stays.
    assert whys[0] == "first" and whys[-1] == "released", whys
    assert "expired" in whys and "after release" in whys, whys
    # Terms never overlapped (checked at every look) and each one ended.
    assert all(end is not None for _, _, end, _ in terms.spans)
    ordered = sorted(terms.spans, key=lambda s: s[1])
    for (_, _, end, _), (_, start, _, _) in itertools.pairwise(ordered):
        assert end is not None and end <= start
