"""Signing and encoding of the health check's HTTP exchange (see domain/health.py).

The request travels in the query string of a GET (`q`, base64url JSON), signed with the
site key; the response body is signed too and echoes the request's nonce, so neither a
forged nor a replayed "healthy" can return a node to service.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime

from pydantic import ValidationError

from trainmedic.domain.health import (
    MAX_REQUEST_AGE_S,
    REQUEST_PURPOSE,
    RESPONSE_PURPOSE,
    NodeHealthRequest,
    NodeHealthResponse,
)


class WireError(Exception):
    """A request or response that must not be believed; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def mac(key: bytes, purpose: bytes, payload: bytes) -> str:
    return hmac.new(key, purpose + b"\0" + payload, hashlib.sha256).hexdigest()


def encode_request(request: NodeHealthRequest, key: bytes) -> tuple[str, str]:
    """(the `q` query value, its signature header value)."""
    q = base64.urlsafe_b64encode(request.model_dump_json().encode()).decode().rstrip("=")
    return q, mac(key, REQUEST_PURPOSE, q.encode())


def decode_request(
    q: str, signature: str | None, key: bytes, *, now: datetime | None = None
) -> NodeHealthRequest:
    """The request, if it is signed with the site key and fresh; WireError otherwise."""
    if len(q) > 64 * 1024:
        raise WireError(400, "request too large")
    if not signature:
        raise WireError(401, "unsigned request")
    if not hmac.compare_digest(signature.strip(), mac(key, REQUEST_PURPOSE, q.encode())):
        raise WireError(401, "signature does not match the site key")
    try:
        raw = base64.urlsafe_b64decode(q + "=" * (-len(q) % 4))
        request = NodeHealthRequest.model_validate_json(raw)
    except (ValueError, ValidationError) as error:
        raise WireError(400, f"malformed request: {str(error)[:200]}") from None
    now = now or datetime.now(UTC)
    at = request.at if request.at.tzinfo else request.at.replace(tzinfo=UTC)
    if abs((now - at).total_seconds()) > MAX_REQUEST_AGE_S:
        raise WireError(401, f"stale request (asked at {at.isoformat()})")
    return request


def sign_response(body: bytes, key: bytes) -> str:
    return mac(key, RESPONSE_PURPOSE, body)


def verify_response(
    body: bytes, signature: str | None, key: bytes, request: NodeHealthRequest
) -> NodeHealthResponse:
    """The agent's answer to *this* request; WireError when it is not that."""
    if not signature or not hmac.compare_digest(signature.strip(), sign_response(body, key)):
        raise WireError(401, "the answer is not signed with the site key")
    try:
        response = NodeHealthResponse.model_validate_json(body)
    except ValidationError as error:
        raise WireError(400, f"malformed answer: {str(error)[:200]}") from None
    if not hmac.compare_digest(response.nonce, request.nonce):
        raise WireError(401, "the answer is to another request (nonce)")
    if response.report.node != request.node:
        raise WireError(409, f"the answer is about {response.report.node!r}, not {request.node}")
    return response
