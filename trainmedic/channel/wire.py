"""What goes over the agent channel, and how both ends sign and frame it.

Every request is `POST /v1/<kind>` with a JSON body and three headers:

    X-Trainmedic-Node: gpu02
    X-Trainmedic-Time: 1764580000.123456          (the sender's clock, seconds)
    X-Trainmedic-Signature: <hex HMAC-SHA256>

The signature covers the method, the path, the node, the time and the body, under the
*node's* key: `node_key = HMAC-SHA256(site key, "trainmedic-agent-node-v1\\0" + node)`.
The controller holds the site key and derives every node's key; a node needs only its
own (`node_key`), so a node that is taken over cannot speak for another one. The node
name the controller acts on is the signed header's, never a name inside the body.

Replays: the time must be within the replay window of the controller's clock, and
strictly later than the last request it accepted from that node (an agent sends one
request at a time on one connection, so its times only grow).

The HTTP here is the small subset both ends speak: HTTP/1.1, Content-Length bodies only
(no chunked encoding), keep-alive, bounded header and body sizes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

NODE_HEADER = "x-trainmedic-node"
TIME_HEADER = "x-trainmedic-time"
SIGNATURE_HEADER = "x-trainmedic-signature"
HEARTBEAT_PATH = "/v1/heartbeat"
FINDINGS_PATH = "/v1/findings"
ALIVE_PATH = "/v1/alive"
MAX_HEADER_BYTES = 8 * 1024
_SIG_DOMAIN = b"trainmedic-agent-v1"
_NODE_DOMAIN = b"trainmedic-agent-node-v1\0"

REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def node_key(site_key: bytes, node: str) -> bytes:
    """The key one node signs with, derived from the site key."""
    return hmac.new(site_key, _NODE_DOMAIN + node.encode(), hashlib.sha256).digest()


def signature(key: bytes, method: str, path: str, node: str, stamp: str, body: bytes) -> str:
    message = b"\n".join(
        (_SIG_DOMAIN, method.encode(), path.encode(), node.encode(), stamp.encode(), body)
    )
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def signed_headers(key: bytes, path: str, node: str, stamp: float, body: bytes) -> dict[str, str]:
    text = f"{stamp:.6f}"
    return {
        NODE_HEADER: node,
        TIME_HEADER: text,
        SIGNATURE_HEADER: signature(key, "POST", path, node, text, body),
    }


class Heartbeat(msgspec.Struct, forbid_unknown_fields=False):
    """An agent's `I am alive`: cheap to decode (12,500 agents every 2 s)."""

    node: str
    agent: str  # this agent process's instance id: a new one means it restarted
    seq: int = 0
    interval: float = 2.0  # how often it beats, so the controller can judge silence
    probe_port: int | None = None  # where its probe listener answers (on its address)


class FindingsBody(msgspec.Struct, forbid_unknown_fields=False):
    node: str
    agent: str
    findings: list[dict[str, Any]]  # [{"id": idempotency key, "signal": IncidentSignal}]


heartbeat_decoder = msgspec.json.Decoder(Heartbeat)
findings_decoder = msgspec.json.Decoder(FindingsBody)


# ------------------------------------------------------------------------------- HTTP


class HttpError(Exception):
    """A request that cannot be read: answered with `status` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""
    keep_alive: bool = True
    peer: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _head(head: bytes, max_body: int) -> tuple[Request, int]:
    """The request of a head (without its blank line) and its body's length."""
    first, _, rest = head.decode("latin-1").partition("\r\n")
    parts = first.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "not an HTTP/1.x request line")
    method, path, version = parts
    headers: dict[str, str] = {}
    for line in rest.split("\r\n") if rest else ():
        name, sep, value = line.partition(":")
        if not sep or not name or name[-1] in " \t" or name[0] in " \t":
            raise HttpError(400, "malformed header line")
        headers[name.lower()] = value.strip()  # names are case-insensitive, values not
    if "transfer-encoding" in headers:
        raise HttpError(411, "chunked bodies are not accepted; send Content-Length")
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        raise HttpError(400, "bad Content-Length")
    length = int(length_text)
    if length > max_body:
        raise HttpError(413, f"body of {length} bytes; the limit is {max_body}")
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" and not (
        version == "HTTP/1.0" and connection != "keep-alive"
    )
    return Request(method, path, headers, b"", keep_alive), length


def parse_request(buffer: bytearray, max_body: int) -> Request | None:
    """Take one complete request off the front of `buffer` (a connection's unread bytes);
    None while it is incomplete. Raises HttpError for one that cannot be served (a body
    over `max_body` is refused from its head, before it is read)."""
    end = buffer.find(b"\r\n\r\n", 0, MAX_HEADER_BYTES + 4)
    if end < 0:
        if len(buffer) > MAX_HEADER_BYTES:
            raise HttpError(431, f"request head over {MAX_HEADER_BYTES} bytes")
        return None
    request, length = _head(bytes(buffer[:end]), max_body)
    start = end + 4
    if len(buffer) < start + length:
        return None
    request.body = bytes(buffer[start : start + length])
    del buffer[: start + length]
    return request


async def read_request(
    reader: asyncio.StreamReader, *, max_body: int, idle_timeout: float, read_timeout: float
) -> Request | None:
    """The next request on a stream (the agent's probe listener); None when the peer
    closed it between requests or stayed idle."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), idle_timeout)
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            return None
        raise HttpError(400, "connection closed inside the request head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"request head over {MAX_HEADER_BYTES} bytes") from None
    except TimeoutError:
        return None  # an idle keep-alive connection: let it go
    if len(head) > MAX_HEADER_BYTES:
        raise HttpError(431, f"request head over {MAX_HEADER_BYTES} bytes")
    request, length = _head(head[:-4], max_body)
    if length:
        try:
            request.body = await asyncio.wait_for(reader.readexactly(length), read_timeout)
        except (asyncio.IncompleteReadError, TimeoutError):
            raise HttpError(408, "body not received in time") from None
    return request


def response_bytes(status: int, payload: dict[str, Any], *, close: bool = False) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
    )
    return head.encode() + body


def reply_bytes(status: int, body: bytes, headers: Mapping[str, str]) -> bytes:
    """A response with `headers` and `body`, closing the connection (the probe listener's
    mounted endpoints, the health check's own small server)."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n{extra}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def request_bytes(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader, timeout: float) -> tuple[int, bytes, bool]:
    """(status, body, keep_alive) of one response."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise HttpError(502, f"bad status line {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await asyncio.wait_for(reader.readexactly(length), timeout) if length else b""
    return int(parts[1]), body, headers.get("connection", "").lower() != "close"
