"""How the controller asks a node for its health: `NodeHealthProbe`.

- `HttpNodeHealthProbe`: the node agent's `GET /health` (signed both ways with the
  site key). A node whose agent does not answer, or answers unsigned, raises
  `AgentUnreachable`: the quarantine keeps it out (never back on Slurm's word alone).

The lab's probe (the same checks in the controller, over a lab node's fake GPUs) is the
lab's own: `trainmedic.lab.agents.LabNodeHealthProbe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Protocol
from urllib.parse import quote, urlsplit

from trainmedic.channel.wire import node_key
from trainmedic.domain.health import SIGNATURE_HEADER, NodeHealthReport, NodeHealthRequest
from trainmedic.errors import TrainmedicError
from trainmedic.health.wire import WireError, encode_request, verify_response

MAX_RESPONSE_BYTES = 1024 * 1024


class AgentUnreachable(TrainmedicError):
    """The node's agent gave no answer that can be believed (down, refused, forged)."""


class NodeHealthProbe(Protocol):
    """Runs the health check where the node's GPUs are."""

    async def check(self, request: NodeHealthRequest) -> NodeHealthReport:
        """The node's report; raises AgentUnreachable when there is none to believe."""
        ...


class HttpNodeHealthProbe:
    """`GET <url>` on the node's agent. `url` is a template with `{node}`, e.g.
    `http://{node}:8791/health` (https with the system's CAs works too). `key` is the
    site key: each exchange is signed with the node's key derived from it."""

    def __init__(self, url: str, key: bytes | None, *, timeout_s: float = 240.0) -> None:
        if "{node}" not in url:
            raise ValueError(f"the agent URL {url!r} must contain {{node}}")
        self.url = url
        self._key = key
        self.timeout_s = timeout_s

    async def check(self, request: NodeHealthRequest) -> NodeHealthReport:
        if not self._key:
            # An unsigned answer cannot be told from a forged one: no key, no answer.
            raise AgentUnreachable(
                "no site key configured (TRAINMEDIC_AGENT_KEY_FILE or _SPOOL_KEY_FILE): the "
                "agent's answer cannot be verified"
            )
        key = node_key(self._key, request.node)
        url = urlsplit(self.url.format(node=request.node))
        q, signature = encode_request(request, key)
        target = f"{url.path or '/'}?q={quote(q)}"
        try:
            status, headers, body = await asyncio.wait_for(
                _get(url.scheme, url.hostname or request.node, url.port, target, signature),
                self.timeout_s,
            )
        except TimeoutError:
            raise AgentUnreachable(
                f"{request.node}'s agent did not answer within {self.timeout_s:.0f} s"
            ) from None
        except (
            OSError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ) as error:
            raise AgentUnreachable(f"{request.node}'s agent: {error}") from None
        if status != 200:
            raise AgentUnreachable(
                f"{request.node}'s agent answered {status}: {body[:200].decode('utf-8', 'replace')}"
            )
        try:
            response = verify_response(body, headers.get(SIGNATURE_HEADER.lower()), key, request)
        except WireError as error:
            raise AgentUnreachable(f"{request.node}'s agent: {error}") from None
        return response.report


async def _get(
    scheme: str, host: str, port: int | None, target: str, signature: str
) -> tuple[int, dict[str, str], bytes]:
    """One GET; the body is read by its Content-Length (a server that keeps the
    connection open is fine), else chunked or up to the end of the connection."""
    if scheme not in ("http", "https"):
        raise ValueError(f"unsupported scheme {scheme!r}")
    tls = ssl.create_default_context() if scheme == "https" else None
    reader, writer = await asyncio.open_connection(
        host, port or (443 if tls else 80), ssl=tls, limit=64 * 1024
    )
    try:
        writer.write(
            (
                f"GET {target} HTTP/1.1\r\nHost: {host}{f':{port}' if port else ''}\r\n"
                f"{SIGNATURE_HEADER}: {signature}\r\n"
                "Accept: application/json\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit() or int(length) > MAX_RESPONSE_BYTES:
                raise ValueError(f"answer of {length[:20]} bytes")
            body = await reader.readexactly(int(length))
        else:
            body = await reader.read(MAX_RESPONSE_BYTES + 1)
            while len(body) <= MAX_RESPONSE_BYTES and (more := await reader.read(65536)):
                body += more
            if len(body) > MAX_RESPONSE_BYTES:
                raise ValueError("answer larger than 1 MiB")
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = _dechunk(body)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return int(parts[1]), headers, body


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return out
