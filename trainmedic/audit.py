"""Payload decoding for workflow histories (shared by audit export and tests)."""

from __future__ import annotations

from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter


def decode_payloads(payloads: list[Payload] | Any) -> list[Any]:
    """JSON values of Temporal payloads, without knowing their Python types."""
    return list(pydantic_data_converter.payload_converter.from_payloads(list(payloads)))


def decode_payload(payload: Payload) -> Any:
    return decode_payloads([payload])[0]
