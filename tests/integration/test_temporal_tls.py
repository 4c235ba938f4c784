"""trainmedic against a Temporal that requires TLS / mTLS, with its own site CA.

The server is the real dev server behind a TLS-terminating proxy (tests/fixtures/tls.py:
`temporal server start-dev` has no TLS flags); the client side is the SDK's own TLS
(rustls), through `trainmedic.temporal.client.connect`, the one place clients are built.
Workflows run end to end through the proxy; each refusal is checked for the one line an
operator sees, and three of them through the real `trainmedic` command.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.service import TLSConfig
from temporalio.worker import Worker

from tests.fixtures.tls import Pki, TlsProxy, hpack_huffman, make_pki
from trainmedic import procs
from trainmedic.config import Settings, load_settings
from trainmedic.errors import ConfigError, ServiceError
from trainmedic.temporal.client import connect, require_search_attributes
from trainmedic.temporal.devserver import DevServer

pytestmark = pytest.mark.integration


@activity.defn
async def shout(text: str) -> str:
    return text.upper()


@workflow.defn(sandboxed=False)
class TlsEchoWorkflow:
    """One activity round trip: the worker polls and completes tasks over TLS."""

    @workflow.run
    async def run(self, text: str) -> str:
        loud = await workflow.execute_activity(
            shout, text, start_to_close_timeout=timedelta(seconds=30)
        )
        return f"{loud} over TLS"


# ------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_proxy(temporal_server: DevServer, pki: Pki) -> Iterator[TlsProxy]:
    with TlsProxy(temporal_server.port, pki.server) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def mtls_proxy(temporal_server: DevServer, pki: Pki) -> Iterator[TlsProxy]:
    with TlsProxy(temporal_server.port, pki.server, client_ca=pki.ca) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def expired_proxy(temporal_server: DevServer, pki: Pki) -> Iterator[TlsProxy]:
    with TlsProxy(temporal_server.port, pki.server_expired) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def rejecting_server(pki: Pki) -> Iterator[TlsProxy]:
    """TLS, then every gRPC call answered UNAUTHENTICATED, as a Temporal with an
    authorizer answers a bad API key; it keeps the request headers it got."""
    with TlsProxy(0, pki.server, reject=(16, "Request unauthorized.")) as server:
        yield server


def settings_for(address: str, **tls: Any) -> Settings:
    return load_settings(temporal_address=address, **tls)


async def run_echo(client: Client) -> str:
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[TlsEchoWorkflow], activities=[shout]):
        return await client.execute_workflow(
            TlsEchoWorkflow.run,
            "hello",
            id=f"tls-echo-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            execution_timeout=timedelta(seconds=60),
        )


async def server_refused(proxy: TlsProxy, words: str = "") -> bool:
    """The server side's record of a refused handshake (written a moment after the
    client already gave up, from the proxy's own thread)."""
    for _ in range(50):
        if any(words in error for error in proxy.handshake_errors):
            return True
        await asyncio.sleep(0.1)
    return False


async def refused(settings: Settings) -> str:
    with pytest.raises(ServiceError) as caught:
        await asyncio.wait_for(connect(settings), 60)
    message = str(caught.value)
    assert "\n" not in message and "tonic" not in message and "Traceback" not in message
    return message


# ------------------------------------------------------------------- it works: TLS


async def test_tls_with_the_site_ca_runs_a_workflow(tls_proxy: TlsProxy, pki: Pki) -> None:
    settings = settings_for(
        tls_proxy.address,
        temporal_tls_ca=pki.ca,
        temporal_tls_server_name="localhost",
        temporal_api_key="tm-test-key",
    )
    client = await connect(settings)
    # What the client sends: TLS with our CA and name, and the API key (as the
    # `authorization: Bearer` header; the dev server behind the proxy ignores it).
    config = client.service_client.config
    assert isinstance(config.tls, TLSConfig)
    assert config.tls.server_root_ca_cert == pki.ca.read_bytes()
    assert config.tls.domain == "localhost"
    assert config.api_key == "tm-test-key"
    await require_search_attributes(client)  # the operator service, over TLS too
    assert await run_echo(client) == "HELLO over TLS"


async def test_mtls_with_a_client_certificate_runs_a_workflow(
    mtls_proxy: TlsProxy, pki: Pki
) -> None:
    settings = settings_for(
        mtls_proxy.address,
        temporal_tls_ca=pki.ca,
        temporal_tls_cert=pki.client.cert,
        temporal_tls_key=pki.client.key,
    )
    assert settings.temporal_tls is True
    client = await connect(settings)
    assert await run_echo(client) == "HELLO over TLS"


# ------------------------------------------------------------- refusals, in one line


async def test_mtls_without_a_client_certificate_fails_clearly(
    mtls_proxy: TlsProxy, pki: Pki
) -> None:
    message = await refused(settings_for(mtls_proxy.address, temporal_tls_ca=pki.ca))
    assert "client certificate" in message
    assert "TRAINMEDIC_TEMPORAL_TLS_CERT" in message and "TRAINMEDIC_TEMPORAL_TLS_KEY" in message
    assert await server_refused(mtls_proxy, "CERTIFICATE"), mtls_proxy.handshake_errors


async def test_mtls_with_a_certificate_of_another_ca_fails_clearly(
    mtls_proxy: TlsProxy, pki: Pki
) -> None:
    message = await refused(
        settings_for(
            mtls_proxy.address,
            temporal_tls_ca=pki.ca,
            temporal_tls_cert=pki.client_other_ca.cert,
            temporal_tls_key=pki.client_other_ca.key,
        )
    )
    assert "refused the client certificate" in message
    assert str(pki.client_other_ca.cert) in message


def test_an_expired_client_certificate_is_refused_at_start_up(pki: Pki) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_for(
            "127.0.0.1:7233",
            temporal_tls_ca=pki.ca,
            temporal_tls_cert=pki.client_expired.cert,
            temporal_tls_key=pki.client_expired.key,
        )
    message = str(caught.value)
    assert "TRAINMEDIC_TEMPORAL_TLS_CERT" in message and "expired on" in message
    assert str(pki.client_expired.cert) in message


async def test_a_client_certificate_that_expired_since_start_up_fails_clearly(
    mtls_proxy: TlsProxy, pki: Pki, tmp_path: Path
) -> None:
    """The files are read again at connect (a rotated certificate is picked up); one
    that expired meanwhile is refused by the server, and said so."""
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    shutil.copy(pki.client.cert, cert)
    shutil.copy(pki.client.key, key)
    settings = settings_for(
        mtls_proxy.address, temporal_tls_ca=pki.ca, temporal_tls_cert=cert, temporal_tls_key=key
    )
    shutil.copy(pki.client_expired.cert, cert)
    shutil.copy(pki.client_expired.key, key)
    message = await refused(settings)
    assert "refused the client certificate" in message and "expired" in message
    assert await server_refused(mtls_proxy, "expired"), mtls_proxy.handshake_errors


async def test_an_api_key_goes_over_tls_and_its_rejection_is_said(
    rejecting_server: TlsProxy, pki: Pki, tmp_path: Path
) -> None:
    key = "tm-secret-2026"
    message = await refused(
        settings_for(rejecting_server.address, temporal_tls_ca=pki.ca, temporal_api_key=key)
    )
    assert "rejected the API key (TRAINMEDIC_TEMPORAL_API_KEY)" in message
    assert "wrong, expired or revoked" in message and key not in message
    # The server got it, inside TLS, as `authorization: Bearer <key>` (HPACK-encoded).
    bearer = hpack_huffman(f"Bearer {key}")
    assert any(bearer in block for block in rejecting_server.header_blocks)
    # The same through the real command: exit 2, one message, the key never echoed.
    env = cli_env(
        tmp_path,
        temporal_address=rejecting_server.address,
        temporal_tls_ca=pki.ca,
        temporal_api_key=key,
    )
    result = trainmedic("setup", "temporal", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "rejected the API key" in " ".join(result.stderr.split())
    assert key not in result.stderr + result.stdout


async def test_a_wrong_ca_names_the_ca_file(tls_proxy: TlsProxy, pki: Pki) -> None:
    message = await refused(settings_for(tls_proxy.address, temporal_tls_ca=pki.wrong_ca))
    assert "certificate verify failed" in message
    assert f"TRAINMEDIC_TEMPORAL_TLS_CA ({pki.wrong_ca})" in message


async def test_no_ca_means_the_system_cas_and_says_so(tls_proxy: TlsProxy) -> None:
    message = await refused(settings_for(tls_proxy.address, temporal_tls=True))
    assert "certificate verify failed" in message and "system's CAs" in message
    assert "TRAINMEDIC_TEMPORAL_TLS_CA" in message


async def test_an_expired_server_certificate_says_expired(
    expired_proxy: TlsProxy, pki: Pki
) -> None:
    message = await refused(settings_for(expired_proxy.address, temporal_tls_ca=pki.ca))
    assert "server's TLS certificate expired on" in message


async def test_a_name_not_on_the_certificate_names_the_override(
    tls_proxy: TlsProxy, pki: Pki
) -> None:
    message = await refused(
        settings_for(
            tls_proxy.address,
            temporal_tls_ca=pki.ca,
            temporal_tls_server_name="temporal.example.org",
        )
    )
    assert "not temporal.example.org" in message and "localhost" in message
    assert "TRAINMEDIC_TEMPORAL_TLS_SERVER_NAME" in message


async def test_tls_to_a_plaintext_port_says_so(temporal_server: DevServer, pki: Pki) -> None:
    message = await refused(settings_for(temporal_server.address, temporal_tls_ca=pki.ca))
    assert "does not speak TLS" in message


async def test_connection_refused_says_so(pki: Pki) -> None:
    address = f"127.0.0.1:{procs.free_port()}"
    message = await refused(settings_for(address, temporal_tls_ca=pki.ca))
    assert f"cannot reach Temporal at {address}" in message and "connection refused" in message


# ------------------------------------------------------ the real command, as run


def trainmedic(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainmedic.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def cli_env(tmp_path: Path, **settings: str | Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEDIC_")}
    env.update({"XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "400"})
    env.update({f"TRAINMEDIC_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def test_cli_worker_with_a_wrong_ca_exits_2_naming_the_ca(
    tls_proxy: TlsProxy, pki: Pki, tmp_path: Path
) -> None:
    env = cli_env(tmp_path, temporal_address=tls_proxy.address, temporal_tls_ca=pki.wrong_ca)
    result = trainmedic("worker", "--no-detect", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    error = " ".join(result.stderr.split())
    assert "certificate verify failed" in error and str(pki.wrong_ca) in error


def test_cli_config_check_names_a_missing_ca_file(tmp_path: Path) -> None:
    env = cli_env(tmp_path, temporal_tls_ca=tmp_path / "no-such-ca.pem")
    result = trainmedic("config", "check", env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"TRAINMEDIC_TEMPORAL_TLS_CA: no such file: {tmp_path / 'no-such-ca.pem'}" in (
        " ".join(result.stderr.split())
    )


def test_cli_setup_temporal_over_mtls(mtls_proxy: TlsProxy, pki: Pki, tmp_path: Path) -> None:
    env = cli_env(
        tmp_path,
        temporal_address=mtls_proxy.address,
        temporal_tls_ca=pki.ca,
        temporal_tls_cert=pki.client.cert,
        temporal_tls_key=pki.client.key,
    )
    result = trainmedic("setup", "temporal", env=env)
    assert result.returncode == 0, result.stderr
    assert "already present" in result.stdout and "nothing to do" in result.stdout
