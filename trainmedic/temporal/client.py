"""Build Temporal clients the one way trainmedic does: pydantic converter, TLS, API key.

`open_client` below is the only call of `Client.connect` in trainmedic: the controller,
the worker, the CLI and the dev server's health check all come through it, so TLS, the
API key and the plain-words errors are the same everywhere.
"""

from __future__ import annotations

import atexit
import gc
import logging
import time

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, TLSConfig

from trainmedic.config import Settings
from trainmedic.errors import ServiceError
from trainmedic.telemetry import tracing_interceptor
from trainmedic.temporal import tls as tm_tls
from trainmedic.temporal.search_attributes import REQUIRED

logger = logging.getLogger(__name__)

_SETTLE_AT_EXIT_S = 0.2


def tls_config(settings: Settings) -> TLSConfig | bool:
    """The SDK's TLS settings for these Settings (False: plaintext)."""
    # Settings turns TLS on when a key or certificate is set and TRAINMEDIC_TEMPORAL_TLS
    # is not, and refuses an explicit "off" with them: no credential goes out in plaintext.
    if not settings.temporal_tls:
        return False
    if settings.temporal_tls_implied_by:
        logger.info(
            "TLS to Temporal is on because %s is set (TRAINMEDIC_TEMPORAL_TLS unset)",
            settings.temporal_tls_implied_by,
        )
    # Settings checked the files at start-up; they are read again here (not cached) so
    # that a restarted worker picks up a rotated certificate.
    files: dict[str, bytes | None] = {}
    for name, path in (
        (tm_tls.CA_KEY, settings.temporal_tls_ca),
        (tm_tls.CERT_KEY, settings.temporal_tls_cert),
        (tm_tls.KEY_KEY, settings.temporal_tls_key),
    ):
        try:
            files[name] = tm_tls.read_pem(path, "PEM") if path else None
        except ValueError as error:
            raise ServiceError(f"{name}: {error}") from None
    return TLSConfig(
        server_root_ca_cert=files[tm_tls.CA_KEY],
        client_cert=files[tm_tls.CERT_KEY],
        client_private_key=files[tm_tls.KEY_KEY],
        # SNI, HTTP/2 authority and the name the certificate is checked against, when
        # the address is not a name on the server's certificate (an IP, a tunnel).
        domain=settings.temporal_tls_server_name,
    )


def tls_settings(settings: Settings) -> tm_tls.TlsSettings:
    return tm_tls.TlsSettings(
        tls=bool(settings.temporal_tls),
        ca=settings.temporal_tls_ca,
        cert=settings.temporal_tls_cert,
        server_name=settings.temporal_tls_server_name,
        api_key=settings.temporal_api_key is not None,
    )


async def open_client(
    target: str,
    namespace: str,
    *,
    tls: TLSConfig | bool = False,
    api_key: str | None = None,
    explain_as: tm_tls.TlsSettings | None = None,
    tracing: bool = True,
) -> Client:
    """The one place a Temporal client is built; a failure is a one-line ServiceError.

    `tracing`: OpenTelemetry spans for its calls and for the workers built on it
    (trainmedic.telemetry; a no-op until the process sets up a tracer provider)."""
    _settle_at_exit()
    try:
        return await Client.connect(
            target,
            namespace=namespace,
            data_converter=pydantic_data_converter,
            tls=tls,
            api_key=api_key,
            interceptors=[tracing_interceptor()] if tracing else [],
        )
    except (RuntimeError, RPCError, OSError) as error:
        # The SDK's text (a Rust Debug dump) stays in the debug log for whoever needs it.
        logger.debug("connecting to Temporal at %s failed: %s", target, error)
        context = explain_as or tm_tls.TlsSettings(tls=bool(tls), api_key=api_key is not None)
        raise ServiceError(tm_tls.explain(error, target, namespace, context)) from None


_settling: list[bool] = []


def _settle_at_exit() -> None:
    """Once per process: at exit, let dropped clients close before finalization.

    A client still alive when the interpreter finalizes (a command's last one, often
    held by the traceback of the error it exits with), or a connection that just failed,
    is dropped then, and the SDK's Rust threads can abort the process in
    "PyGILState_Release" (SIGABRT instead of the exit code the command chose;
    temporalio/sdk-python#300; about 1 run in 30-50 here). atexit handlers run while the
    interpreter is still whole and after the exiting exception is gone: collect, and give
    the connections a moment to close.
    """
    if not _settling:
        _settling.append(True)
        atexit.register(_let_clients_close)


def _let_clients_close() -> None:
    gc.collect()
    time.sleep(_SETTLE_AT_EXIT_S)


async def connect(settings: Settings, *, address: str | None = None) -> Client:
    """Connect as Settings say, or raise ServiceError saying where we tried and what to do."""
    return await open_client(
        address or settings.temporal_address,
        settings.temporal_namespace,
        tls=tls_config(settings),
        api_key=settings.temporal_api_key.get_secret_value() if settings.temporal_api_key else None,
        explain_as=tls_settings(settings),
    )


def rpc_problem(error: RPCError, client: Client, what: str) -> ServiceError:
    """An RPC refused after connecting (credentials, namespace), in plain words."""
    config = client.service_client.config
    context = tm_tls.TlsSettings(tls=bool(config.tls), api_key=config.api_key is not None)
    detail = tm_tls.explain(error, config.target_host, client.namespace, context)
    if detail.startswith("cannot reach"):  # nothing specific recognised: say what failed
        detail = f"{what} failed: {error.message}"
    return ServiceError(detail)


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


async def registered_search_attributes(client: Client) -> dict[str, str]:
    """The namespace's custom search attributes, name -> type as the CLI spells it."""
    try:
        response = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
    except RPCError as error:
        raise rpc_problem(error, client, "listing the search attributes") from None
    return {
        name: _TYPE_NAMES.get(kind, str(kind)) for name, kind in response.custom_attributes.items()
    }


async def missing_search_attributes(client: Client) -> list[str]:
    """Required attributes absent or of the wrong type, as 'Name (Type)' strings."""
    present = await registered_search_attributes(client)
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
            "Without them workflows stall. Register them with `trainmedic setup temporal` "
            f"(same settings as this worker), or with:\n{commands}"
        )


async def connect_plain(address: str, namespace: str = "default") -> Client:
    """A client for our own local dev server (no TLS, no key), with the pydantic converter."""
    return await open_client(address, namespace)
