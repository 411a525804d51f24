"""TLS helpers shared by the QUIC and WebSocket (wss://) transports.

Three ways for a client to trust a server, in the order we recommend them:

1. **CA verification** (default): the system trust store, or ``cafile``/``cadata`` for a private CA
   or for a self-signed certificate the client was handed out of band. Hostname checked.
2. **Fingerprint pinning**: ``fingerprint="<sha256 hex of the DER certificate>"``, e.g. the value a
   server with a generated certificate logs at start. The chain, names and dates are not checked;
   the pin (plus the TLS handshake's proof of the private key) is the whole trust decision. For
   TLS over TCP, :func:`client_ssl_context` then returns a ``CERT_NONE`` context and the caller
   MUST call :func:`verify_fingerprint` on the ``ssl.SSLObject`` right after the handshake, before
   sending anything (QUIC does this inside the transport).
3. ``insecure=True``: no verification at all. Logged as a WARNING every time it is used.

Fingerprints are written as 64 lowercase hex digits without colons; inputs may use colons and any
case.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import hashlib
import ipaddress
import logging
import os
import re
import shutil
import ssl
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from m2mwire.errors import ConfigError, TransportError

__all__ = [
    "SelfSignedCert",
    "certificate_fingerprint",
    "check_client_trust",
    "client_context",
    "client_ssl_context",
    "generate_self_signed",
    "load_server_certificate",
    "normalize_fingerprint",
    "private_key_pem",
    "self_signed_certificate",
    "server_ssl_context",
    "verify_fingerprint",
    "warn_insecure",
]

logger = logging.getLogger("m2mwire.transport")

_HEX64 = re.compile(r"[0-9a-f]{64}")


def normalize_fingerprint(fingerprint: str) -> str:
    """``"AB:CD:..."`` or ``"abcd..."`` -> ``"abcd..."``; ValueError unless it is a SHA-256 digest."""
    if not isinstance(fingerprint, str):
        raise ConfigError(f"fingerprint= takes the server's SHA-256 as 64 hex digits, not {fingerprint!r}")
    value = fingerprint.strip().replace(":", "").lower()
    if not _HEX64.fullmatch(value):
        raise ValueError(
            f"fingerprint {fingerprint!r} is not a SHA-256 digest: expected 64 hex digits "
            "(colons allowed), as logged by the server at start"
        )
    return value


def certificate_fingerprint(certificate: x509.Certificate | bytes) -> str:
    """SHA-256 of the DER encoding (a certificate object or DER bytes), lowercase hex, no colons."""
    der = (
        certificate
        if isinstance(certificate, bytes)
        else certificate.public_bytes(serialization.Encoding.DER)
    )
    return hashlib.sha256(der).hexdigest()


@dataclass(frozen=True)
class SelfSignedCert:
    """An in-memory certificate and private key (PEM), and the certificate's SHA-256 fingerprint."""

    cert_pem: bytes
    key_pem: bytes
    fingerprint: str
    hostnames: tuple[str, ...] = field(default=())

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def private_key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return key

    def write_temp_files(self) -> tuple[str, str]:
        """Write ``(certfile, keyfile)`` into a new private (0700) temporary directory.

        For ``ssl.SSLContext.load_cert_chain``, which only reads files. The directory is removed
        when the interpreter exits; use :meth:`temp_files` to remove it sooner.
        """
        directory = tempfile.mkdtemp(prefix="m2mwire-tls-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        certfile = os.path.join(directory, "cert.pem")
        keyfile = os.path.join(directory, "key.pem")
        for path, data in ((certfile, self.cert_pem), (keyfile, self.key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return certfile, keyfile

    @contextlib.contextmanager
    def temp_files(self) -> Iterator[tuple[str, str]]:
        """Yield ``(certfile, keyfile)`` paths in a private (0700) temporary directory, removed after.

        ``ssl.SSLContext.load_cert_chain`` only reads files; the key is on disk only for the
        duration of the ``with`` block.
        """
        certfile, keyfile = self.write_temp_files()
        try:
            yield certfile, keyfile
        finally:
            shutil.rmtree(os.path.dirname(certfile), ignore_errors=True)

    def server_ssl_context(self) -> ssl.SSLContext:
        """A server ``SSLContext`` (TLS over TCP, e.g. for wss://) loaded with this certificate."""
        with self.temp_files() as (certfile, keyfile):
            return server_ssl_context(certfile, keyfile)


def generate_self_signed(
    hostnames: Sequence[str] = ("localhost", "127.0.0.1", "::1"),
    *,
    days: int = 365,
) -> SelfSignedCert:
    """A fresh ECDSA P-256 self-signed server certificate, entirely in memory.

    ``hostnames`` become subjectAltName entries (IP addresses as IP SANs, the rest as DNS names);
    the first DNS name (or the first entry) is the subject CN. Validity starts one hour in the past
    to tolerate clock skew.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    cert = self_signed_certificate(key, hostnames, days=days)
    return SelfSignedCert(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=private_key_pem(key),
        fingerprint=certificate_fingerprint(cert),
        hostnames=tuple(hostnames),
    )


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """``key`` as unencrypted PKCS#8 PEM (what load_cert_chain reads)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def self_signed_certificate(
    key: ec.EllipticCurvePrivateKey, hostnames: Sequence[str], *, days: int = 365
) -> x509.Certificate:
    """A self-signed server certificate for ``key`` (see :func:`generate_self_signed`)."""
    if not hostnames:
        raise ValueError("a self-signed certificate needs at least one hostname or IP address")
    sans: list[x509.GeneralName] = []
    dns_names: list[str] = []
    for name in hostnames:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
            dns_names.append(name)
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0] if dns_names else hostnames[0])]
    )
    now = datetime.datetime.now(datetime.UTC)
    public_key = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert


def server_ssl_context(
    certfile: str | os.PathLike[str], keyfile: str | os.PathLike[str] | None = None
) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2+) for TCP transports such as websockets' ``serve(ssl=...)``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    return context


def client_ssl_context(
    *,
    cafile: str | os.PathLike[str] | None = None,
    cadata: str | bytes | None = None,
    fingerprint: str | None = None,
    insecure: bool = False,
    target: str = "",
) -> ssl.SSLContext:
    """A TLS client context for TCP transports (websockets' ``connect(ssl=...)``).

    * default: system trust store, hostname checked; ``cafile``/``cadata`` (PEM) replace it.
    * ``fingerprint``: returns a ``CERT_NONE`` context; call :func:`verify_fingerprint` on the
      connection's ``ssl_object`` after the handshake and before sending (websockets:
      ``ws.transport.get_extra_info("ssl_object")``), and close the connection if it raises.
    * ``insecure=True``: no verification; logs a WARNING naming ``target``.
    """
    check_trust_options(cafile=cafile, cadata=cadata, fingerprint=fingerprint, insecure=insecure)
    if fingerprint is not None or insecure:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if insecure:
            warn_insecure(target or "a TLS connection")
    else:
        if isinstance(cadata, bytes):
            cadata = cadata.decode("ascii")
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile, cadata=cadata)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def verify_fingerprint(ssl_object: ssl.SSLObject | ssl.SSLSocket, expected: str) -> None:
    """Raise TransportError unless the peer certificate's SHA-256 fingerprint equals ``expected``."""
    der = ssl_object.getpeercert(binary_form=True)
    if der is None:
        raise TransportError("TLS peer presented no certificate; cannot check the pinned fingerprint")
    check_fingerprint(certificate_fingerprint(der), expected)


def check_fingerprint(actual: str, expected: str) -> None:
    """Compare a computed fingerprint with the pinned one; the error names both."""
    want = normalize_fingerprint(expected)
    if actual != want:
        raise TransportError(
            f"server certificate fingerprint mismatch: expected sha256 {want}, got {actual}. "
            "The server's certificate changed or someone is intercepting the connection; "
            "check the fingerprint the server logged and pin that one"
        )


def check_trust_options(
    *,
    cafile: str | os.PathLike[str] | None,
    cadata: str | bytes | None,
    fingerprint: str | None,
    insecure: bool,
) -> None:
    """Reject contradictory verification options with a message that says which to keep."""
    chosen = [
        name
        for name, on in (
            ("cafile/cadata", cafile is not None or cadata is not None),
            ("fingerprint", fingerprint is not None),
            ("insecure=True", insecure),
        )
        if on
    ]
    if len(chosen) > 1:
        raise ValueError(f"choose one way to verify the server, not {' and '.join(chosen)}")
    if fingerprint is not None:
        normalize_fingerprint(fingerprint)


def warn_insecure(target: str) -> None:
    logger.warning(
        "TLS certificate verification is DISABLED for %s (insecure=True): anyone on the network path "
        "can impersonate the server. Pin the server's fingerprint= or pass cafile= instead.",
        target,
    )


# -- from connect()/serve() options (checked by m2mwire.options) to what a transport loads --------


def check_client_trust(transport: Mapping[str, Any]) -> None:
    """connect()'s TLS options: contradictory verification options, a malformed fingerprint, a
    missing or unreadable cafile raise ConfigError naming the option."""
    try:
        check_trust_options(
            cafile=transport.get("cafile"),
            cadata=transport.get("cadata"),
            fingerprint=transport.get("fingerprint"),
            insecure=bool(transport.get("insecure", False)),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cafile, cadata = transport.get("cafile"), transport.get("cadata")
    if cafile is None and cadata is None:
        return
    if cafile is not None and not os.path.isfile(cafile):
        raise ConfigError(
            f"cafile={os.fspath(cafile)!r}: no such file. Pass the PEM file of the CA that signed the "
            "server's certificate (or the server's own certificate), or pin fingerprint= instead"
        )
    try:  # the same loader the transports use, so what passes here loads there too
        ssl.create_default_context(
            cafile=cafile, cadata=cadata.decode("ascii") if isinstance(cadata, bytes) else cadata
        )
    except (ssl.SSLError, OSError, ValueError, UnicodeDecodeError) as exc:
        what = f"cafile={os.fspath(cafile)!r}" if cafile is not None else "cadata="
        raise ConfigError(f"{what} holds no usable PEM certificate: {exc}") from None


def load_server_certificate(certfile: Any, keyfile: Any) -> ssl.SSLContext:
    """A server TLS context from ``certfile``/``keyfile``; ConfigError when they do not load.

    Checked when serve() is called: QUIC (aioquic) would otherwise accept a certificate without its
    key at start and fail every client's handshake.
    """
    if certfile is None:
        raise ConfigError("keyfile= needs certfile= (the certificate chain, PEM)")
    for name, path in (("certfile", certfile), ("keyfile", keyfile)):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{name}={os.fspath(path)!r}: no such file")
    try:
        return server_ssl_context(certfile, keyfile)
    except (ssl.SSLError, OSError, ValueError) as exc:
        hint = (
            "; pass keyfile= with the private key (PEM) unless certfile holds both" if keyfile is None else ""
        )
        raise ConfigError(
            f"cannot load the server certificate certfile={os.fspath(certfile)!r}"
            + (f" keyfile={os.fspath(keyfile)!r}" if keyfile is not None else "")
            + f": {exc}{hint}"
        ) from None


def client_context(options: Mapping[str, Any], target: str) -> ssl.SSLContext:
    """The client TLS context connect()'s options ask for: ``ssl=`` as given, else one built from
    cafile/cadata/fingerprint/insecure (see :func:`client_ssl_context`)."""
    given = options.get("ssl")
    if given is not None:
        return given  # type: ignore[no-any-return]  # checked to be an SSLContext by split_options
    return client_ssl_context(
        cafile=options.get("cafile"),
        cadata=options.get("cadata"),
        fingerprint=options.get("fingerprint"),
        insecure=bool(options.get("insecure", False)),
        target=target,
    )
