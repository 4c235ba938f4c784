"""The agent side of the health check: `GET /health`, to be mounted on the node agent's
HTTP server.

`HealthEndpoint.handle(method, target, headers)` is framework-neutral: it takes the
request line's method and target (path + query) and the headers, and returns an
`HttpReply` (status, headers, body) for whatever server the agent runs. `serve_health`
is a minimal asyncio HTTP/1.1 server around it, for an agent without one (and tests).

    endpoint = HealthEndpoint(node, NodeHealthChecker(node, nvml, config), key)
    reply = await endpoint.handle("GET", "/health?q=...", headers)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from trainmedic.adapters.nvml.protocol import NvmlBackend
from trainmedic.channel.wire import node_key, reply_bytes
from trainmedic.config import Settings
from trainmedic.domain.health import HEALTH_PATH, SIGNATURE_HEADER, NodeHealthResponse
from trainmedic.errors import ConfigError
from trainmedic.health.checks import NodeHealthChecker, health_config
from trainmedic.health.wire import WireError, decode_request, sign_response
from trainmedic.watchers.spoolfile import load_key

log = logging.getLogger(__name__)

_MAX_HEADER_BYTES = 16 * 1024


@dataclass(frozen=True)
class HttpReply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def _error(status: int, message: str) -> HttpReply:
    body = json.dumps({"error": message}).encode()
    return HttpReply(status, body, {"Content-Type": "application/json"})


class HealthEndpoint:
    """Answers signed health requests for one node with a signed report. `key` is the
    node's own key (`channel.wire.node_key(site key, node)`), never the site key."""

    def __init__(self, node: str, checker: NodeHealthChecker, key: bytes) -> None:
        if not key:
            raise ValueError("the health endpoint needs the node's key (it signs its answers)")
        self.node = node
        self._checker = checker
        self._key = key

    async def handle(self, method: str, target: str, headers: Mapping[str, str]) -> HttpReply:
        parts = urlsplit(target)
        if parts.path != HEALTH_PATH:
            return _error(404, f"no {parts.path[:100]!r} here; try GET {HEALTH_PATH}")
        if method.upper() != "GET":
            return _error(405, f"{HEALTH_PATH} takes GET")
        values = parse_qs(parts.query).get("q") or [""]
        try:
            request = decode_request(values[0], _header(headers, SIGNATURE_HEADER), self._key)
        except WireError as error:
            log.warning("health request refused (%d): %s", error.status, error)
            return _error(error.status, str(error))
        if request.node != self.node:
            return _error(409, f"this is {self.node}'s agent, not {request.node}'s")
        report = await self._checker.check(request)
        body = NodeHealthResponse(nonce=request.nonce, report=report).model_dump_json().encode()
        return HttpReply(
            200,
            body,
            {"Content-Type": "application/json", SIGNATURE_HEADER: sign_response(body, self._key)},
        )


def build_health_endpoint(
    node: str, nvml: NvmlBackend | None, settings: Settings, key: bytes | None = None
) -> HealthEndpoint:
    """The endpoint as the node agent mounts it: its NVML, dcgmi and site script from
    Settings (TRAINMEDIC_HEALTH_*); answers signed with the node's key (`key`, as the
    agent's channel key; else derived from the site key in TRAINMEDIC_AGENT_KEY_FILE or
    TRAINMEDIC_SPOOL_KEY_FILE). No key: a ConfigError at start-up, since an unsigned
    answer would never be believed by the controller anyway."""
    if key is None:
        site = settings.site_key_file
        if site is not None:
            key = node_key(load_key(site), node)
    if not key:
        raise ConfigError(
            "environment (TRAINMEDIC_*)",
            [
                "TRAINMEDIC_AGENT_KEY_FILE (or _SPOOL_KEY_FILE): the health endpoint signs "
                "its answers with the node's key"
            ],
        )
    return HealthEndpoint(node, NodeHealthChecker(node, nvml, health_config(settings)), key)


async def _serve_one(
    endpoint: HealthEndpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if len(head) > _MAX_HEADER_BYTES:
            raise ValueError("headers too large")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip()] = value.strip()
        reply = await endpoint.handle(method, target, headers)
    except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        reply = _error(400, "malformed HTTP request")
    except Exception:  # a bug in a check must not take the agent down: say so, log it
        log.exception("health check failed")
        reply = _error(500, "the health check failed on the agent (see its log)")
    writer.write(reply_bytes(reply.status, reply.body, reply.headers))
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def serve_health(endpoint: HealthEndpoint, host: str, port: int) -> asyncio.Server:
    """A minimal HTTP/1.1 server for `GET /health` (one request per connection)."""
    return await asyncio.start_server(
        lambda r, w: _serve_one(endpoint, r, w), host, port, limit=_MAX_HEADER_BYTES
    )
