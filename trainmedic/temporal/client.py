"""Build Temporal clients the one way trainmedic does: pydantic converter, TLS, API key."""

from __future__ import annotations

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, TLSConfig

from trainmedic.config import Settings
from trainmedic.errors import ServiceError
from trainmedic.temporal.search_attributes import REQUIRED

logger = logging.getLogger(__name__)


def _tls(settings: Settings) -> TLSConfig | bool:
    # Settings turns TLS on when a key or certificate is set and TRAINMEDIC_TEMPORAL_TLS
    # is not, and refuses an explicit "off" with them: no credential goes out in plaintext.
    if not settings.temporal_tls:
        return False
    if settings.temporal_tls_implied_by:
        logger.info(
            "TLS to Temporal is on because %s is set (TRAINMEDIC_TEMPORAL_TLS unset)",
            settings.temporal_tls_implied_by,
        )
    return TLSConfig(
        server_root_ca_cert=settings.temporal_tls_ca.read_bytes()
        if settings.temporal_tls_ca
        else None,
        client_cert=settings.temporal_tls_cert.read_bytes() if settings.temporal_tls_cert else None,
        client_private_key=settings.temporal_tls_key.read_bytes()
        if settings.temporal_tls_key
        else None,
    )


async def connect(settings: Settings, *, address: str | None = None) -> Client:
    """Connect, or raise ServiceError saying where we tried and what to do."""
    target = address or settings.temporal_address
    api_key = settings.temporal_api_key.get_secret_value() if settings.temporal_api_key else None
    try:
        return await Client.connect(
            target,
            namespace=settings.temporal_namespace,
            data_converter=pydantic_data_converter,
            tls=_tls(settings),
            api_key=api_key,
        )
    except (RuntimeError, RPCError, OSError) as error:
        raise ServiceError(
            f"cannot reach Temporal at {target} (namespace {settings.temporal_namespace}): "
            f"{error}. Start the embedded one with `trainmedic server start`, or set "
            "TRAINMEDIC_TEMPORAL_ADDRESS."
        ) from None


_TYPE_NAMES = {
    IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD: "Keyword",
    IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST: "KeywordList",
    IndexedValueType.INDEXED_VALUE_TYPE_TEXT: "Text",
    IndexedValueType.INDEXED_VALUE_TYPE_INT: "Int",
    IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE: "Double",
    IndexedValueType.INDEXED_VALUE_TYPE_BOOL: "Bool",
    IndexedValueType.INDEXED_VALUE_TYPE_DATETIME: "Datetime",
}


INDEXED_TYPES = {name: kind for kind, name in _TYPE_NAMES.items()}


async def missing_search_attributes(client: Client) -> list[str]:
    """Required attributes absent or of the wrong type, as 'Name (Type)' strings."""
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    present = {
        name: _TYPE_NAMES.get(kind, str(kind)) for name, kind in response.custom_attributes.items()
    }
    return [f"{name} ({kind})" for name, kind in REQUIRED.items() if present.get(name) != kind]


async def require_search_attributes(client: Client) -> None:
    missing = await missing_search_attributes(client)
    if missing:
        commands = "\n".join(
            f"  temporal operator search-attribute create --namespace {client.namespace} "
            f"--name {entry.split(' ')[0]} --type {REQUIRED[entry.split(' ')[0]]}"
            for entry in missing
        )
        raise ServiceError(
            "Temporal namespace "
            f"{client.namespace!r} lacks trainmedic's search attributes: {', '.join(missing)}. "
            f"Without them workflows stall. Register them with:\n{commands}"
        )


async def connect_plain(address: str, namespace: str = "default") -> Client:
    """A client for our own local dev server (no TLS, no key), with the pydantic converter."""
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter
    )
