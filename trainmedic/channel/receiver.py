"""The controller's end of the agent channel: one small HTTP server in the controller.

    agent --POST /v1/heartbeat--> receiver --> AgentTable (last seen; no Temporal call)
    agent --POST /v1/findings---> receiver --> sink (NodeFanout -> IncidentRouter)

Each request is checked, in this order, and refused with one log line naming why (the
same reason at most once per node every 10 s; every refusal is counted in `rejected`):

- size: a body over `max_body` -> 413, before it is read;
- signature: the node's key (derived from the site key) over method, path, node, time
  and body -> 401;
- time: within `replay_window` of our clock, and later than the node's last accepted
  request -> 401 (a replay, or a clock gone backwards);
- rate: a token bucket per node -> 429;
- identity: the body's node and every finding's nodes and evidence must be the signed
  node, and a finding must read as a node agent's (kernel or NVML, no job) -> 403/400.

Trust is the spool's: node-agent evidence is trusted for its own node only, and that
node is the authenticated one. A finding the router cannot take now (Temporal down) is
answered 503, and the agent keeps it in its spool; each finding carries an idempotency
key, remembered once delivered, so a retry is acknowledged without delivering twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import re
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any

import msgspec
from pydantic import ValidationError

from trainmedic.channel import wire
from trainmedic.channel.liveness import AgentTable
from trainmedic.domain.hostlist import HostlistError, validate_node_name
from trainmedic.domain.incident import IncidentSignal
from trainmedic.errors import DeliveryError
from trainmedic.watchers.base import SignalSink
from trainmedic.workers.node_agent import agent_signal_problem

logger = logging.getLogger(__name__)

_FINDING_ID = re.compile(r"^[A-Za-z0-9_.-]{8,80}$")
_LOG_EVERY = 10.0  # seconds between two log lines for one (node, reason)


class FindingLedger:
    """Idempotency keys of findings already delivered (bounded, oldest forgotten first)."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, finding_id: str) -> bool:
        return finding_id in self._ids

    def add(self, finding_id: str) -> None:
        self._ids[finding_id] = None
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)


class RateLimiter:
    """A token bucket per node: `rate` requests a second, bursts up to `burst`."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def allow(self, node: str) -> bool:
        now = self.clock()
        tokens, at = self._buckets.get(node, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[node] = (tokens, now)
            return False
        self._buckets[node] = (tokens - 1.0, now)
        return True


class Refused(Exception):
    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason  # a short slug counted in `rejected`
        self.detail = detail


class AgentReceiver:
    """The HTTP receiver. `start()` binds (port 0: any free one, see `port`), `close()`
    stops; `run(stop)` does both around waiting for `stop`."""

    def __init__(
        self,
        sink: SignalSink,
        site_key: bytes,
        table: AgentTable,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        replay_window: float = 30.0,
        max_body: int = 256 * 1024,
        rate: float = 10.0,
        burst: float = 40.0,
        idle_timeout: float = 120.0,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.site_key = site_key
        self.table = table
        self.host = host
        self.port = port
        self.replay_window = replay_window
        self.max_body = max_body
        self.idle_timeout = idle_timeout
        self.wall_clock = wall_clock
        self.clock = clock
        self.limiter = RateLimiter(rate, burst, clock)
        self.ledger = FindingLedger()
        self.accepted: defaultdict[str, int] = defaultdict(int)  # heartbeat, finding, dup
        self.rejected: defaultdict[str, int] = defaultdict(int)  # reason -> count
        self._keys: dict[str, bytes] = {}
        self._last_time: dict[str, float] = {}
        self._logged: dict[tuple[str, str], float] = {}
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._connections: set[_Connection] = set()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self.host, self.port, backlog=4096, reuse_address=True
        )
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        self._sweeper = asyncio.create_task(self._sweep())
        logger.info("agent channel: listening on %s:%d", self.host, self.port)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in list(self._connections):
            connection.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)
        self._server = None
        logger.info("agent channel: stopped")

    async def run(self, stop: asyncio.Event) -> None:
        if self._server is None:
            await self.start()
        try:
            await stop.wait()
        finally:
            await self.close()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def _sweep(self) -> None:
        """Close connections idle (or stuck inside a request) for `idle_timeout`: one
        timer for all of them instead of one per read."""
        while True:
            await asyncio.sleep(min(10.0, self.idle_timeout / 2))
            horizon = self.clock() - self.idle_timeout
            for connection in [c for c in self._connections if c.last < horizon]:
                connection.close()

    # -- requests -----------------------------------------------------------------------

    def check(self, request: wire.Request) -> str:
        """The authenticated node of a request (raises Refused)."""
        node = request.headers.get(wire.NODE_HEADER, "")
        if request.method != "POST":
            raise Refused(405, "method", f"{request.method} is not accepted")
        if request.path not in (wire.HEARTBEAT_PATH, wire.FINDINGS_PATH):
            raise Refused(404, "path", f"no such endpoint {request.path[:80]!r}")
        self._authenticate(request, node)
        if not self.limiter.allow(node):
            raise Refused(429, "rate", "more requests than the per-node rate allows")
        return node

    def refused(self, request: wire.Request, refused: Refused) -> bytes:
        self.rejected[refused.reason] += 1
        who = request.headers.get(wire.NODE_HEADER, "") or request.peer
        self._refuse_log(who, refused.reason, refused.detail, request.path)
        payload = {"error": refused.detail, "reason": refused.reason}
        return wire.response_bytes(refused.status, payload, close=not request.keep_alive)

    def answer_now(self, request: wire.Request) -> bytes | None:
        """The response to a request that needs no waiting (a heartbeat, a refusal);
        None for findings, which `answer` delivers."""
        try:
            node = self.check(request)
            if request.path != wire.HEARTBEAT_PATH:
                request.extra["node"] = node
                return None
            self._heartbeat(request, node)
        except Refused as refused:
            return self.refused(request, refused)
        return _OK if request.keep_alive else _OK_CLOSE

    async def answer(self, request: wire.Request) -> bytes:
        try:
            status, payload = await self._findings(request, request.extra["node"])
        except Refused as refused:
            return self.refused(request, refused)
        return wire.response_bytes(status, payload, close=not request.keep_alive)

    def _key(self, node: str) -> bytes:
        key = self._keys.get(node)
        if key is None:
            key = self._keys[node] = wire.node_key(self.site_key, node)
        return key

    def _authenticate(self, request: wire.Request, node: str) -> None:
        try:
            validate_node_name(node)
        except HostlistError as error:
            raise Refused(401, "node", f"no valid node name in the request: {error}") from None
        stamp_text = request.headers.get(wire.TIME_HEADER, "")
        given = request.headers.get(wire.SIGNATURE_HEADER, "")
        expected = wire.signature(
            self._key(node), request.method, request.path, node, stamp_text, request.body
        )
        if not given or not hmac.compare_digest(given, expected):
            raise Refused(401, "signature", "bad signature: not signed with this node's key")
        try:
            stamp = float(stamp_text)
        except ValueError:
            raise Refused(401, "time", "bad time header") from None
        now = self.wall_clock()
        if abs(now - stamp) > self.replay_window:
            raise Refused(
                401,
                "stale",
                f"time {stamp:.3f} is {now - stamp:+.1f} s from ours; the replay window is "
                f"{self.replay_window:g} s (replayed, or the node's clock is off)",
            )
        last = self._last_time.get(node)
        if last is not None and stamp <= last:
            raise Refused(401, "replay", "not later than the node's last request: a replay")
        self._last_time[node] = stamp

    def _heartbeat(self, request: wire.Request, node: str) -> None:
        try:
            beat = wire.heartbeat_decoder.decode(request.body)
        except msgspec.DecodeError as error:
            raise Refused(400, "malformed", f"heartbeat: {error}") from None
        if beat.node != node:
            raise Refused(
                403, "wrong-node", f"heartbeat names {beat.node[:64]!r}, signed by {node}"
            )
        self.table.beat(node, beat, request.peer)
        self.accepted["heartbeat"] += 1

    async def _findings(self, request: wire.Request, node: str) -> tuple[int, dict[str, Any]]:
        try:
            body = wire.findings_decoder.decode(request.body)
        except msgspec.DecodeError as error:
            raise Refused(400, "malformed", f"findings: {error}") from None
        if body.node != node:
            raise Refused(403, "wrong-node", f"findings name {body.node[:64]!r}, signed by {node}")
        parsed: list[tuple[str, IncidentSignal]] = []
        for item in body.findings[:64]:
            finding_id = item.get("id")
            if not isinstance(finding_id, str) or not _FINDING_ID.match(finding_id):
                raise Refused(400, "malformed", "a finding without a valid id")
            try:
                signal = IncidentSignal.model_validate(item.get("signal"))
            except ValidationError as error:
                text = " ".join(str(error).split())[:300]
                raise Refused(400, "malformed", f"finding {finding_id}: {text}") from None
            if signal.nodes != [node] or any(e.node not in (None, node) for e in signal.evidence):
                named = ",".join(signal.nodes)[:100]
                raise Refused(
                    403, "wrong-node", f"finding {finding_id} is about {named}, signed by {node}"
                )
            problem = agent_signal_problem(signal)
            if problem:
                raise Refused(400, "not-agent", f"finding {finding_id}: {problem}")
            parsed.append((f"{node}/{finding_id}", signal))
        self.table.seen(node)  # a finding is a sign of life too
        delivered: list[str] = []
        duplicates: list[str] = []
        for key, signal in parsed:
            if key in self.ledger:
                duplicates.append(key.split("/", 1)[1])
                self.accepted["duplicate"] += 1
                continue
            try:
                await self.sink.submit(signal)
            except DeliveryError as error:
                logger.warning("agent channel: finding from %s kept by the agent: %s", node, error)
                return 503, {"error": "cannot deliver now; keep it", "delivered": delivered}
            self.ledger.add(key)
            delivered.append(key.split("/", 1)[1])
            self.accepted["finding"] += 1
            logger.info("agent channel: %s from %s: %s", signal.kind, node, signal.detail[:200])
        return 200, {"ok": True, "delivered": delivered, "duplicates": duplicates}

    def _refuse_log(self, who: str, reason: str, detail: str, path: str = "") -> None:
        now = self.clock()
        key = (who, reason)
        if now - self._logged.get(key, -_LOG_EVERY - 1) < _LOG_EVERY:
            return
        self._logged[key] = now
        if len(self._logged) > 50_000:
            self._logged.clear()
        logger.warning(
            "agent channel: refused %s from %s (%s): %s; nothing delivered",
            path or "request",
            who[:64] or "?",
            reason,
            detail,
        )


_OK = wire.response_bytes(200, {"ok": True})
_OK_CLOSE = wire.response_bytes(200, {"ok": True}, close=True)


class _Connection(asyncio.Protocol):
    """One agent's keep-alive connection. A Protocol, not streams: at 12,500 agents the
    receiver answers thousands of heartbeats a second, each parsed and answered in the
    read callback itself (bench/agent_fleet.py). A findings request is answered by a
    task; reading pauses meanwhile, so answers keep the requests' order."""

    def __init__(self, receiver: AgentReceiver) -> None:
        self.receiver = receiver
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.busy = False
        self.closing = False
        self.last = receiver.clock()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if isinstance(peername, tuple) else str(peername or "")
        self.receiver._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.receiver._connections.discard(self)
        self.closing = True

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.last = self.receiver.clock()
        if not self.busy:
            self._serve()

    def _serve(self) -> None:
        receiver = self.receiver
        while not self.closing and self.transport is not None:
            try:
                request = wire.parse_request(self.buffer, receiver.max_body)
            except wire.HttpError as error:
                receiver.rejected["http"] += 1
                receiver._refuse_log(self.peer, "http", f"{error} (HTTP {error.status})")
                payload = {"error": str(error), "reason": "http"}
                self.transport.write(wire.response_bytes(error.status, payload, close=True))
                self.close()
                return
            if request is None:
                return
            request.peer = self.peer
            now = receiver.answer_now(request)
            if now is None:
                self.busy = True
                self.transport.pause_reading()
                task = asyncio.ensure_future(receiver.answer(request))
                task.add_done_callback(functools.partial(self._answered, request))
                return
            self.transport.write(now)
            if not request.keep_alive:
                self.close()
                return

    def _answered(self, request: wire.Request, task: asyncio.Future[bytes]) -> None:
        self.busy = False
        if self.closing or self.transport is None:
            return
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                logger.error(
                    "agent channel: findings from %s failed", self.peer, exc_info=task.exception()
                )
            payload = {"error": "internal error; keep it", "reason": "internal"}
            self.transport.write(wire.response_bytes(500, payload, close=True))
            self.close()
            return
        self.transport.write(task.result())
        if not request.keep_alive:
            self.close()
            return
        self.transport.resume_reading()
        self._serve()
