"""The agent's end of the channel: push findings, beat, fall back to the spool.

- `ChannelClient`: one keep-alive connection to the controller, one request at a time
  (so the signed times of one node only grow), a fresh connection when it breaks.
- `ChannelSink`: the node agent's SignalSink. Each finding gets an idempotency key
  (uuid) and is pushed; when the push fails (controller down, 5xx, 429) the finding is
  written to the agent's spool instead (signed, atomic, `spoolfile.write_spool_file`),
  and while the spool holds anything new findings queue behind it, so order is kept.
- `AgentChannel`: the heartbeat loop (every `interval`, default 2 s); after each beat
  the controller took, the spool is drained oldest first, each file deleted only once
  the controller acknowledged it (a lost acknowledgement re-sends the same key, which
  the controller answers as a duplicate). A finding the controller refuses for good
  (malformed, wrong node) is set aside in `bad/` with the reason.
- `ProbeListener`: answers `GET /v1/alive`, so the controller can ask the agent directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from trainmedic.channel import wire
from trainmedic.domain.incident import IncidentSignal
from trainmedic.errors import DeliveryError
from trainmedic.watchers.spoolfile import (
    SpoolDir,
    SpoolItem,
    SpoolPolicy,
    SpoolRefused,
    write_spool_file,
)

logger = logging.getLogger(__name__)

FINDING_PURPOSE = "agent-finding"  # what the agent's own spool signatures bind a file to


class ChannelUnavailable(Exception):
    """The controller cannot take it now: keep it and try again."""


class ChannelRejected(Exception):
    """The controller refuses it for good (malformed, not this node's)."""


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class ChannelClient:
    def __init__(self, address: str, node: str, key: bytes, *, timeout: float = 5.0) -> None:
        self.host, self.port = parse_address(address)
        self.node = node
        self.key = key
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._last_stamp = 0.0

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), self.timeout
        )

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._reader = self._writer = None

    async def post(self, path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, answer). Raises ChannelUnavailable when the controller is unreachable."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        async with self._lock:
            for attempt in (1, 2):
                reused = self._writer is not None
                try:
                    if self._writer is None:
                        await self._connect()
                    assert self._reader is not None and self._writer is not None
                    stamp = max(time.time(), self._last_stamp + 1e-6)
                    self._last_stamp = stamp
                    headers = wire.signed_headers(self.key, path, self.node, stamp, body)
                    self._writer.write(
                        wire.request_bytes(f"{self.host}:{self.port}", path, body, headers)
                    )
                    await self._writer.drain()
                    status, raw, keep = await wire.read_response(self._reader, self.timeout)
                except (OSError, TimeoutError, asyncio.IncompleteReadError, wire.HttpError) as e:
                    await self.close()
                    if attempt == 1 and reused:
                        continue  # the server dropped an idle keep-alive connection
                    raise ChannelUnavailable(f"{self.host}:{self.port}: {e!r}") from None
                if not keep:
                    await self.close()
                try:
                    answer = json.loads(raw) if raw else {}
                except ValueError:
                    answer = {"error": raw[:200].decode("utf-8", "replace")}
                return status, answer if isinstance(answer, dict) else {}
        raise ChannelUnavailable("unreachable")  # pragma: no cover (the loop returns)


class ChannelSink:
    """The node agent's SignalSink when a controller is configured."""

    def __init__(
        self,
        client: ChannelClient,
        spool: Path,
        *,
        agent_id: str,
        spool_key: bytes | None = None,
    ) -> None:
        self.client = client
        self.spool = spool
        self.agent_id = agent_id
        self.spool_key = spool_key
        spool.mkdir(mode=0o750, parents=True, exist_ok=True)
        self._dir = SpoolDir(
            spool,
            SpoolPolicy(key=spool_key),
            purpose=FINDING_PURPOSE,
            label="agent spool",
        )
        self._seq = 0
        self.pushed = 0
        self.spooled = 0
        self.drained = 0

    # -- SignalSink -----------------------------------------------------------------------

    async def submit(self, signal: IncidentSignal) -> None:
        finding = {"id": uuid.uuid4().hex, "signal": signal.model_dump(mode="json")}
        if self.backlog():
            await asyncio.to_thread(self._write, finding)  # behind the ones waiting
            return
        try:
            await self.push(finding)
        except ChannelUnavailable as error:
            logger.warning("controller unreachable (%s); finding kept in %s", error, self.spool)
            await asyncio.to_thread(self._write, finding)
        except ChannelRejected as error:
            logger.error("controller refused a finding: %s; set aside in the spool", error)
            await asyncio.to_thread(self._write, finding, bad=True)

    async def push(self, finding: dict[str, Any]) -> None:
        status, answer = await self.client.post(
            wire.FINDINGS_PATH,
            {"node": self.client.node, "agent": self.agent_id, "findings": [finding]},
        )
        if status == 200:
            self.pushed += 1
            return
        detail = f"HTTP {status}: {answer.get('error', '')}"
        if status in (400, 403, 404, 413):
            raise ChannelRejected(detail)
        raise ChannelUnavailable(detail)  # 401 (key or clock being fixed), 429, 5xx

    # -- the spool ------------------------------------------------------------------------

    def backlog(self) -> bool:
        return bool(self._dir.names())

    def _write(self, finding: dict[str, Any], *, bad: bool = False) -> None:
        self._seq += 1
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%f")
        name = f"{stamp}-{self._seq:08d}-{finding['id']}.json"
        folder = self.spool / "bad" if bad else self.spool
        write_spool_file(
            folder,
            name,
            json.dumps(finding, separators=(",", ":")).encode(),
            key=self.spool_key,
            purpose=FINDING_PURPOSE,
        )
        if not bad:
            self.spooled += 1

    async def _handle(self, item: SpoolItem) -> bool:
        try:
            finding = json.loads(item.payload)
        except ValueError as error:
            raise SpoolRefused("malformed", str(error)[:200]) from error
        if not isinstance(finding, dict) or not isinstance(finding.get("id"), str):
            raise SpoolRefused("malformed", "not a finding")
        try:
            await self.push(finding)
        except ChannelUnavailable as error:
            raise DeliveryError(str(error)) from error
        except ChannelRejected as error:
            raise SpoolRefused("rejected", str(error)) from error
        self.drained += 1
        return True

    async def drain(self) -> int:
        """Deliver what the spool holds, oldest first; returns how many went out."""
        total = 0
        while True:
            result = await self._dir.drain(self._handle)
            total += result.delivered
            if result.kept or not result.handled:
                return total


class AgentChannel:
    """The heartbeat loop, and the spool drain after every beat the controller took."""

    def __init__(
        self,
        sink: ChannelSink,
        *,
        interval: float = 2.0,
        probe_port: int | None = None,
    ) -> None:
        self.sink = sink
        self.client = sink.client
        self.interval = interval
        self.probe_port = probe_port
        self.seq = 0
        self.failing_since: float | None = None

    async def beat(self) -> bool:
        self.seq += 1
        payload = {
            "node": self.client.node,
            "agent": self.sink.agent_id,
            "seq": self.seq,
            "interval": self.interval,
            "probe_port": self.probe_port,
        }
        try:
            status, answer = await self.client.post(wire.HEARTBEAT_PATH, payload)
        except ChannelUnavailable as error:
            self._failing(str(error))
            return False
        if status != 200:
            self._failing(f"HTTP {status}: {answer.get('error', '')}")
            return False
        if self.failing_since is not None:
            logger.info(
                "controller reachable again after %.1f s", time.monotonic() - self.failing_since
            )
            self.failing_since = None
            self.sink._dir._recovered()  # reachable again: drain now, not after the backoff
        return True

    def _failing(self, why: str) -> None:
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            logger.warning("heartbeat not taken (%s); findings go to the spool meanwhile", why)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                started = loop.time()
                if await self.beat() and self.sink.backlog():
                    drained = await self.sink.drain()
                    if drained:
                        logger.info("delivered %d finding(s) from the spool", drained)
                left = self.interval - (loop.time() - started)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.05, left))
        finally:
            await self.client.close()


class Reply(Protocol):
    @property
    def status(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def headers(self) -> dict[str, str]: ...


class Endpoint(Protocol):
    """A GET endpoint mounted on the probe listener (the health check's `HealthEndpoint`)."""

    async def handle(self, method: str, target: str, headers: Mapping[str, str]) -> Reply: ...


class ProbeListener:
    """The agent's own small HTTP server: `GET /v1/alive` (the controller's direct
    question: the node's name and this agent's instance), and whatever endpoints are
    mounted by path (`mount`), e.g. the quarantine's `GET /health`."""

    def __init__(self, node: str, agent_id: str, host: str = "0.0.0.0", port: int = 0) -> None:
        self.node = node
        self.agent_id = agent_id
        self.host = host
        self.port = port
        self.endpoints: dict[str, Endpoint] = {}
        self._server: asyncio.Server | None = None
        self._started = time.monotonic()

    def mount(self, path: str, endpoint: Endpoint) -> None:
        self.endpoints[path] = endpoint

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=wire.MAX_HEADER_BYTES, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await wire.read_request(reader, max_body=0, idle_timeout=5, read_timeout=5)
            if request is None:
                return
            path = urlsplit(request.path).path
            endpoint = self.endpoints.get(path)
            if request.method == "GET" and path == wire.ALIVE_PATH:
                payload = {
                    "node": self.node,
                    "agent": self.agent_id,
                    "up_s": round(time.monotonic() - self._started, 1),
                }
                writer.write(wire.response_bytes(200, payload, close=True))
            elif endpoint is not None:
                reply = await endpoint.handle(request.method, request.path, request.headers)
                writer.write(wire.reply_bytes(reply.status, reply.body, reply.headers))
            else:
                writer.write(wire.response_bytes(404, {"error": "not found"}, close=True))
            await writer.drain()
        except (wire.HttpError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
