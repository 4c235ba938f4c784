"""Temporal TLS settings: checked at start-up with the key named; the client built from
them carries TLS, the server name and the API key; refusals in plain words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from tests.fixtures.tls import Pki, make_pki
from trainmedic.config import load_settings
from trainmedic.errors import ConfigError, ServiceError
from trainmedic.temporal import client as tm_client
from trainmedic.temporal.tls import TlsSettings, explain


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def refusal(**settings: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(**settings)
    return str(caught.value)


# ------------------------------------------------------------------ start-up checks


def test_a_missing_ca_file_is_named(tmp_path: Path) -> None:
    message = refusal(temporal_tls_ca=tmp_path / "nope.pem")
    assert f"TRAINMEDIC_TEMPORAL_TLS_CA: no such file: {tmp_path / 'nope.pem'}" in message


def test_a_directory_or_non_pem_file_is_refused(tmp_path: Path, pki: Pki) -> None:
    assert "is not a regular file" in refusal(temporal_tls_ca=tmp_path)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert "TRAINMEDIC_TEMPORAL_TLS_CA: " in refusal(temporal_tls_ca=junk)
    assert "is not PEM" in refusal(temporal_tls_ca=junk)
    # A key where the CA belongs: PEM, but no certificate in it.
    assert "holds no usable certificate" in refusal(temporal_tls_ca=pki.client.key)


def test_an_unreadable_file_is_named(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    real_open = os.open

    def deny(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path) == str(pki.client.key):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    # Root reads any file, so the permission error is what a non-root user would get.
    monkeypatch.setattr(os, "open", deny)
    message = refusal(temporal_tls_cert=pki.client.cert, temporal_tls_key=pki.client.key)
    assert "TRAINMEDIC_TEMPORAL_TLS_KEY: cannot read" in message and "permission denied" in message


@pytest.mark.parametrize(("given", "lacking"), [("cert", "KEY"), ("key", "CERT")])
def test_a_certificate_without_its_key_and_back(pki: Pki, given: str, lacking: str) -> None:
    path = pki.client.cert if given == "cert" else pki.client.key
    message = refusal(**{f"temporal_tls_{given}": path})
    assert f"TRAINMEDIC_TEMPORAL_TLS_{lacking} is not" in message


def test_a_key_of_another_certificate_is_refused(pki: Pki) -> None:
    message = refusal(temporal_tls_cert=pki.client.cert, temporal_tls_key=pki.server.key)
    assert "TRAINMEDIC_TEMPORAL_TLS_KEY: the key" in message
    assert "does not belong to the certificate" in message


def test_an_expired_client_certificate_is_named(pki: Pki) -> None:
    message = refusal(
        temporal_tls_cert=pki.client_expired.cert, temporal_tls_key=pki.client_expired.key
    )
    assert "TRAINMEDIC_TEMPORAL_TLS_CERT: the client certificate" in message
    assert "expired on" in message


def test_an_encrypted_key_is_refused(tmp_path: Path, pki: Pki) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.client.key.read_bytes(), None)
    encrypted = tmp_path / "enc.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    message = refusal(temporal_tls_cert=pki.client.cert, temporal_tls_key=encrypted)
    assert "TRAINMEDIC_TEMPORAL_TLS_KEY" in message and "encrypted" in message


def test_good_files_pass_and_turn_tls_on(pki: Pki) -> None:
    settings = load_settings(
        temporal_tls_ca=pki.ca,
        temporal_tls_cert=pki.client.cert,
        temporal_tls_key=pki.client.key,
        temporal_tls_server_name="temporal.internal",
    )
    assert settings.temporal_tls is True
    assert "TRAINMEDIC_TEMPORAL_TLS_SERVER_NAME" in (settings.temporal_tls_implied_by or "")


def test_a_server_name_with_tls_off_is_refused() -> None:
    message = refusal(temporal_tls=False, temporal_tls_server_name="temporal.internal")
    assert "TLS is off but TRAINMEDIC_TEMPORAL_TLS_SERVER_NAME" in message


# ------------------------------------------------------------ the client they build


async def test_the_client_carries_tls_server_name_and_api_key(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    async def fake_connect(target: str, **kwargs: Any) -> str:
        seen.update(kwargs, target=target)
        return "client"

    monkeypatch.setattr(Client, "connect", fake_connect)
    settings = load_settings(
        temporal_address="temporal.example.org:7233",
        temporal_namespace="prod",
        temporal_tls_ca=pki.ca,
        temporal_tls_cert=pki.client.cert,
        temporal_tls_key=pki.client.key,
        temporal_tls_server_name="temporal.internal",
        temporal_api_key="k-123",
    )
    assert await tm_client.connect(settings) == "client"
    tls = seen["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == pki.ca.read_bytes()
    assert tls.client_cert == pki.client.cert.read_bytes()
    assert tls.client_private_key == pki.client.key.read_bytes()
    assert tls.domain == "temporal.internal"
    assert seen["api_key"] == "k-123"
    assert seen["namespace"] == "prod" and seen["target"] == "temporal.example.org:7233"
    assert seen["data_converter"] is tm_client.pydantic_data_converter


async def test_a_file_gone_since_start_up_is_named_at_connect(tmp_path: Path, pki: Pki) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pki.ca.read_bytes())
    settings = load_settings(temporal_tls_ca=ca)
    ca.unlink()
    with pytest.raises(ServiceError, match=f"TRAINMEDIC_TEMPORAL_TLS_CA: no such file: {ca}"):
        await tm_client.connect(settings)


def test_only_open_client_calls_client_connect() -> None:
    """One place builds Temporal clients (TLS, API key, errors the same everywhere)."""
    package = Path(tm_client.__file__).parents[1]
    callers = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "Client.connect(" in path.read_text()
    ]
    assert callers == ["temporal/client.py"]
    assert tm_client.__file__ and Path(tm_client.__file__).read_text().count("Client.connect(") == 1


# -------------------------------------------------------------- refusals, in words

TLS = TlsSettings(tls=True, ca=Path("/etc/site-ca.pem"), api_key=True)


@pytest.mark.parametrize(
    "error",
    [
        RPCError("Request unauthorized.", RPCStatusCode.UNAUTHENTICATED, b""),
        RuntimeError(
            "Failed client connect: `get_system_info` call error after connection: Status { "
            'code: Unauthenticated, message: "Request unauthorized.", metadata: {} }'
        ),
    ],
)
def test_a_rejected_api_key_is_said_and_not_echoed(error: BaseException) -> None:
    message = explain(error, "t.example:7233", "prod", TLS)
    assert "rejected the API key (TRAINMEDIC_TEMPORAL_API_KEY)" in message
    assert "wrong, expired or revoked" in message


def test_a_key_without_rights_on_the_namespace() -> None:
    error = RPCError("Request unauthorized.", RPCStatusCode.PERMISSION_DENIED, b"")
    message = explain(error, "t.example:7233", "prod", TLS)
    assert "no permission on namespace 'prod'" in message


def test_an_unknown_namespace() -> None:
    error = RPCError("Namespace prod is not found.", RPCStatusCode.NOT_FOUND, b"")
    assert "namespace 'prod' does not exist" in explain(error, "t:7233", "prod", TLS)


def test_a_server_alert_about_an_expired_client_certificate() -> None:
    text = "Failed client connect: ... error: AlertReceived(CertificateExpired) ..."
    tls = TlsSettings(tls=True, cert=Path("/etc/tm/client.pem"))
    message = explain(RuntimeError(text), "t:7233", "default", tls)
    assert (
        "refused the client certificate as expired" in message and "/etc/tm/client.pem" in message
    )


def test_an_rpc_refusal_after_connecting_becomes_a_service_error() -> None:
    class FakeClient:
        namespace = "prod"

        class service_client:
            class config:
                tls = True
                api_key = "k"
                target_host = "t.example:7233"

    error = RPCError("Request unauthorized.", RPCStatusCode.UNAUTHENTICATED, b"")
    problem = tm_client.rpc_problem(error, FakeClient(), "listing")  # type: ignore[arg-type]
    assert isinstance(problem, ServiceError) and "rejected the API key" in str(problem)
    other = RPCError("boom", RPCStatusCode.INTERNAL, b"")
    assert str(tm_client.rpc_problem(other, FakeClient(), "listing")) == "listing failed: boom"  # type: ignore[arg-type]
