"""TLS to a production Temporal: the start-up checks of the files, and plain words for
the ways a connection fails.

Only the standard library's `ssl` (OpenSSL) reads the files here: it is the same PEM
parsing every TLS stack shares, and it needs no extra dependency. The SDK's own TLS
(rustls, in the Rust core) then does the real handshake; its errors arrive as text, and
`explain` turns the ones an operator meets into one line that names the setting to fix.
"""

from __future__ import annotations

import os
import re
import ssl
import stat
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ENV = "TRAINMEDIC_"
CA_KEY = ENV + "TEMPORAL_TLS_CA"
CERT_KEY = ENV + "TEMPORAL_TLS_CERT"
KEY_KEY = ENV + "TEMPORAL_TLS_KEY"
SERVER_NAME_KEY = ENV + "TEMPORAL_TLS_SERVER_NAME"
API_KEY_KEY = ENV + "TEMPORAL_API_KEY"

# A CA bundle or a certificate chain is a few kB; the system bundle is ~200 kB.
MAX_PEM_BYTES = 4 * 2**20


# ------------------------------------------------------------------ start-up checks


def read_pem(path: Path, what: str) -> bytes:
    """The file's bytes: a regular, readable file of PEM text, or ValueError saying why."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}") from None
    except PermissionError:
        raise ValueError(f"cannot read {path} (permission denied for uid {os.getuid()})") from None
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_PEM_BYTES + 1)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_PEM_BYTES:
        raise ValueError(f"{path} is larger than {MAX_PEM_BYTES} bytes; is it {what}?")
    if b"-----BEGIN " not in data:
        raise ValueError(f"{path} is not PEM ({what} expected, '-----BEGIN ...' not found)")
    return data


def check_ca_file(path: Path) -> None:
    """The site CA: PEM that OpenSSL loads as at least one certificate."""
    read_pem(path, "a PEM CA certificate")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=str(path))
    except ssl.SSLError as error:
        raise ValueError(f"{path} holds no usable certificate ({_ssl_reason(error)})") from None


def check_client_cert(cert: Path) -> None:
    """mTLS: the client certificate is PEM and valid now.

    Checked here because a server that refuses a client certificate says little more
    than "connection closed"; an expired one is the usual reason.
    """
    read_pem(cert, "a PEM client certificate")
    not_before, not_after = certificate_validity(cert)
    now = time.time()
    if not_after is not None and not_after < now:
        raise ValueError(f"the client certificate {cert} expired on {_when(not_after)}")
    if not_before is not None and not_before > now:
        raise ValueError(f"the client certificate {cert} is not valid before {_when(not_before)}")


def check_client_pair(cert: Path, key: Path) -> None:
    """mTLS: the private key is PEM, unencrypted, and belongs to the certificate."""
    read_pem(key, "a PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        # A password callback that refuses: an encrypted key fails here, not at a prompt.
        context.load_cert_chain(str(cert), str(key), password=_no_password)
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(f"the key {key} does not belong to the certificate {cert}") from None
        raise ValueError(
            f"cannot load {cert} with {key} ({_ssl_reason(error)}); an encrypted key is not "
            "supported: give an unencrypted PEM key, readable only by this user"
        ) from None
    except TypeError:  # what the refusing callback turns into
        raise ValueError(
            f"the key {key} is encrypted; give an unencrypted PEM key, readable only by this user"
        ) from None


def _no_password() -> str:
    raise TypeError("encrypted key")


def certificate_validity(path: Path) -> tuple[float | None, float | None]:
    """(notBefore, notAfter) of the first certificate in a PEM file, as epoch seconds.

    The standard library decodes a certificate file only through this private helper;
    where it is missing, the dates are not checked here (the handshake still is).
    ValueError when the file holds no certificate.
    """
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None, None
    try:
        decoded = decode(str(path))
    except (ssl.SSLError, OSError) as error:  # OSError: it changed since read_pem
        raise ValueError(f"{path} holds no certificate ({_ssl_reason(error)})") from None
    try:
        return (
            ssl.cert_time_to_seconds(decoded["notBefore"]),
            ssl.cert_time_to_seconds(decoded["notAfter"]),
        )
    except (KeyError, ValueError):
        return None, None


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _ssl_reason(error: OSError) -> str:
    reason = getattr(error, "reason", None) or getattr(error, "strerror", None)
    return str(reason or (error.args[0] if error.args else error)).replace("_", " ").lower()


# --------------------------------------------------------------- connection errors

# rustls' certificate errors (as Debug text in the core's error), and the TLS alerts a
# server sends; matched on the words, which are stable across versions.
_NOT_AFTER = re.compile(r"not_after: UnixTime\((\d+)\)")
_EXPECTED = re.compile(r'expected: (?:DnsName|IpAddress)\("?([^")]+)"?\)')
_PRESENTED = re.compile(r"presented: \[([^\]]*)\]")


@dataclass(frozen=True)
class TlsSettings:
    """What `explain` needs to know of the settings (config imports this module)."""

    tls: bool
    ca: Path | None = None
    cert: Path | None = None
    server_name: str | None = None
    api_key: bool = False


def explain(error: BaseException, target: str, namespace: str, tls: TlsSettings) -> str:
    """One line: what went wrong reaching Temporal, and which setting to look at."""
    # Imported here: Settings imports this module, and most commands never connect.
    from temporalio.service import RPCError, RPCStatusCode

    text = error.message if isinstance(error, RPCError) else str(error)
    status = error.status if isinstance(error, RPCError) else None
    where = f"Temporal at {target} (namespace {namespace})"
    ca = f"the CA in {CA_KEY} ({tls.ca})" if tls.ca else "the system's CAs"
    # --- the server's certificate, as our side judged it
    if "UnknownIssuer" in text or "certificate verify failed" in text or "BadSignature" in text:
        fix = (
            f"set {CA_KEY} to the CA that signed the server's certificate"
            if tls.ca
            else f"set {CA_KEY} to your site's CA"
        )
        return (
            f"cannot reach {where}: certificate verify failed: the server's certificate is not "
            f"signed by {ca}; {fix}"
        )
    if "Expired" in text and "InvalidCertificate" in text:
        found = _NOT_AFTER.search(text)
        since = f" on {_when(int(found.group(1)))}" if found else ""
        return (
            f"cannot reach {where}: the server's TLS certificate expired{since}; the "
            "server's operator must renew it (nothing to change on this side)"
        )
    if "NotValidYet" in text:
        return (
            f"cannot reach {where}: the server's TLS certificate is not valid yet; check "
            "this host's clock and the certificate's dates"
        )
    if "NotValidForName" in text:
        expected = _EXPECTED.search(text)
        presented = _PRESENTED.search(text)
        names = (
            presented.group(1).replace('\\"', "").replace("DnsName(", "").replace("IpAddress(", "")
            if presented
            else "other names"
        )
        names = names.replace('"', "").replace(")", "")
        asked = expected.group(1) if expected else (tls.server_name or target)
        return (
            f"cannot reach {where}: the server's certificate is for {names}, not {asked}; set "
            f"{SERVER_NAME_KEY} to one of its names, or use that name in the address"
        )
    # --- what the server said of our certificate (a TLS alert)
    if "CertificateExpired" in text:
        return (
            f"cannot reach {where}: the server refused the client certificate as expired "
            f"({CERT_KEY}={tls.cert}); renew it"
        )
    if "CertificateRequired" in text:
        return (
            f"cannot reach {where}: the server requires a client certificate (mTLS); set "
            f"{CERT_KEY} and {KEY_KEY}"
        )
    if any(alert in text for alert in ("BadCertificate", "UnknownCA", "CertificateUnknown")):
        return (
            f"cannot reach {where}: the server refused the client certificate {tls.cert} "
            f"({CERT_KEY}): not signed by a CA it trusts, or revoked"
        )
    # --- transport
    if "ConnectionRefused" in text or "Connection refused" in text:
        return (
            f"cannot reach {where}: connection refused (nothing listens there). Start the "
            "embedded one with `trainmedic server start`, or set TRAINMEDIC_TEMPORAL_ADDRESS."
        )
    if "dns error" in text or "failed to lookup address" in text:
        return f"cannot reach {where}: the host name does not resolve (TRAINMEDIC_TEMPORAL_ADDRESS)"
    if tls.tls and ("InvalidContentType" in text or "CorruptMessage" in text):
        return (
            f"cannot reach {where}: the server does not speak TLS on this port; unset the "
            f"TLS settings ({CA_KEY}, {CERT_KEY}, {API_KEY_KEY}) or use its TLS port"
        )
    # --- credentials: an API key, or what it (or the certificate) may do
    if status in (RPCStatusCode.UNAUTHENTICATED, RPCStatusCode.PERMISSION_DENIED) or any(
        code in text for code in ("code: Unauthenticated", "code: PermissionDenied")
    ):
        denied = status is RPCStatusCode.PERMISSION_DENIED or "code: PermissionDenied" in text
        who = f"the API key ({API_KEY_KEY})" if tls.api_key else "the client certificate or API key"
        if denied:
            return (
                f"{where} refused the call: {who} has no permission on namespace "
                f"{namespace!r}; grant it, or set TRAINMEDIC_TEMPORAL_NAMESPACE"
            )
        return f"{where} rejected {who}: it is wrong, expired or revoked" + (
            "" if tls.api_key else f"; set {API_KEY_KEY} or {CERT_KEY}/{KEY_KEY}"
        )
    if status is RPCStatusCode.NOT_FOUND and "amespace" in text:
        return (
            f"{where}: namespace {namespace!r} does not exist; create it, or set "
            "TRAINMEDIC_TEMPORAL_NAMESPACE"
        )
    # The server hung up right after a handshake our side accepted: with TLS 1.3 that is
    # how a refused (or missing) client certificate shows on the client.
    closed = any(
        word in text
        for word in (
            "connection closed",
            "BrokenPipe",
            "broken pipe",
            "UnexpectedEof",
            "close_notify",
            "ConnectionReset",
            "connection reset",
        )
    )
    if closed and tls.tls:
        if tls.cert is None:
            return (
                f"cannot reach {where}: the server closed the connection after the TLS "
                f"handshake; it probably requires a client certificate (mTLS): set {CERT_KEY} "
                f"and {KEY_KEY}"
            )
        return (
            f"cannot reach {where}: the server closed the connection after the TLS handshake; "
            f"it probably refused the client certificate {tls.cert} ({CERT_KEY}): expired, "
            "or not signed by a CA it trusts"
        )
    if closed:
        return (
            f"cannot reach {where}: the server closed the connection; if it requires TLS, set "
            f"{CA_KEY} (or TRAINMEDIC_TEMPORAL_TLS=true for a publicly trusted certificate)"
        )
    first = " ".join(text.split())[:300]
    return (
        f"cannot reach {where}: {first}. Start the embedded one with `trainmedic server "
        "start`, or set TRAINMEDIC_TEMPORAL_ADDRESS."
    )
