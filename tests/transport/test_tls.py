"""TLS helpers (m2mwire.transport.tls) and certificate verification of the QUIC transport."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import os
import ssl
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from m2mwire.errors import TransportError
from m2mwire.transport.quic import connect_quic
from m2mwire.transport.tls import (
    SelfSignedCert,
    certificate_fingerprint,
    client_ssl_context,
    generate_self_signed,
    normalize_fingerprint,
    server_ssl_context,
    verify_fingerprint,
)
from tests.transport.quicpeers import quic_server

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cert() -> SelfSignedCert:
    return generate_self_signed()


async def round_trip(port: int, **options: object) -> str | bytes:
    conn = await connect_quic("127.0.0.1", port, connect_timeout=5.0, **options)  # type: ignore[arg-type]
    try:
        channel = await conn.open_channel()
        await channel.send("ping")
        return await channel.recv()
    finally:
        await conn.close()


# -- certificate generation ----------------------------------------------------------------------


def test_self_signed_certificate_contents(cert: SelfSignedCert) -> None:
    c = x509.load_pem_x509_certificate(cert.cert_pem)
    key = serialization.load_pem_private_key(cert.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert isinstance(key.curve, ec.SECP256R1)
    assert c.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
    san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    assert c.subject.rfc4514_string() == "CN=localhost"
    der = c.public_bytes(serialization.Encoding.DER)
    assert cert.fingerprint == hashlib.sha256(der).hexdigest() == certificate_fingerprint(c)
    assert len(cert.fingerprint) == 64 and cert.fingerprint == cert.fingerprint.lower()
    assert c.not_valid_before_utc < c.not_valid_after_utc
    assert cert.certificate.serial_number == c.serial_number
    assert generate_self_signed().fingerprint != cert.fingerprint  # a fresh key each time


def test_custom_hostnames() -> None:
    c = generate_self_signed(["agent.internal", "10.0.0.7"]).certificate
    san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["agent.internal"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    with pytest.raises(ValueError):
        generate_self_signed([])


def test_temp_files_are_private_and_removed(cert: SelfSignedCert) -> None:
    with cert.temp_files() as (certfile, keyfile):
        with open(certfile, "rb") as f:
            assert f.read() == cert.cert_pem
        assert stat.S_IMODE(os.stat(keyfile).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(keyfile)).st_mode) == 0o700
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)
    assert not os.path.exists(certfile) and not os.path.exists(keyfile)
    certfile, keyfile = cert.write_temp_files()
    assert os.path.exists(certfile) and os.path.exists(keyfile)


def test_fingerprint_normalisation(cert: SelfSignedCert) -> None:
    colons = ":".join(cert.fingerprint[i : i + 2] for i in range(0, 64, 2)).upper()
    assert normalize_fingerprint(colons) == cert.fingerprint
    for bad in ("", "abc", "z" * 64, cert.fingerprint + "00"):
        with pytest.raises(ValueError, match="SHA-256"):
            normalize_fingerprint(bad)


def test_contradictory_trust_options_are_rejected(cert: SelfSignedCert) -> None:
    with pytest.raises(ValueError, match="choose one"):
        client_ssl_context(cadata=cert.cert_pem, insecure=True)
    with pytest.raises(ValueError, match="choose one"):
        client_ssl_context(fingerprint=cert.fingerprint, insecure=True)


async def test_quic_contradictory_options_and_bad_fingerprint() -> None:
    with pytest.raises(ValueError, match="choose one"):
        await connect_quic("127.0.0.1", 1, fingerprint="a" * 64, cafile="x.pem")
    with pytest.raises(ValueError, match="SHA-256"):
        await connect_quic("127.0.0.1", 1, fingerprint="not-a-digest")


# -- QUIC verification ---------------------------------------------------------------------------


async def test_quic_fingerprint_pinning_succeeds() -> None:
    async with quic_server(idle_timeout=5.0) as server:
        assert await round_trip(server.port, fingerprint=server.fingerprint) == "ping"
        colons = ":".join(server.fingerprint[i : i + 2] for i in range(0, 64, 2))
        assert await round_trip(server.port, fingerprint=colons.upper()) == "ping"


async def test_quic_fingerprint_mismatch_names_both(cert: SelfSignedCert) -> None:
    async with quic_server(idle_timeout=5.0) as server:
        wrong = cert.fingerprint
        with pytest.raises(TransportError) as info:
            await round_trip(server.port, fingerprint=wrong)
        message = str(info.value)
        assert "fingerprint mismatch" in message
        assert wrong in message and server.fingerprint in message


async def test_quic_server_fingerprint_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="m2mwire.transport"):
        async with quic_server(idle_timeout=5.0) as server:
            pass
    assert any(server.fingerprint in r.getMessage() for r in caplog.records)


async def test_quic_ca_file_and_cadata_verification(cert: SelfSignedCert) -> None:
    with cert.temp_files() as (certfile, keyfile):
        async with quic_server(idle_timeout=5.0, certfile=certfile, keyfile=keyfile) as server:
            assert server.fingerprint == cert.fingerprint
            assert await round_trip(server.port, cafile=certfile) == "ping"
            assert await round_trip(server.port, cadata=cert.cert_pem) == "ping"
            assert await round_trip(server.port, cadata=cert.cert_pem.decode()) == "ping"
            assert await round_trip(server.port, cafile=certfile, server_name="localhost") == "ping"
            with pytest.raises(TransportError, match="TLS failure"):
                await round_trip(server.port, cafile=certfile, server_name="example.com")


async def test_quic_default_verification_rejects_unknown_self_signed_cert() -> None:
    async with quic_server(idle_timeout=5.0) as server:
        with pytest.raises(TransportError) as info:
            await round_trip(server.port)
        assert "fingerprint=" in str(info.value)  # the error says how to trust it
        assert info.value.clean is False


async def test_quic_wrong_ca_is_rejected() -> None:
    other = generate_self_signed()
    async with quic_server(idle_timeout=5.0) as server:
        with pytest.raises(TransportError):
            await round_trip(server.port, cadata=other.cert_pem)


async def test_quic_insecure_mode_warns_every_time(caplog: pytest.LogCaptureFixture) -> None:
    async with quic_server(idle_timeout=5.0) as server:
        with caplog.at_level(logging.WARNING, logger="m2mwire.transport"):
            assert await round_trip(server.port, insecure=True) == "ping"
            assert await round_trip(server.port, insecure=True) == "ping"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "DISABLED" in r.getMessage()]
    assert len(warnings) == 2
    assert f"quic://127.0.0.1:{server.port}" in warnings[0].getMessage()


async def test_quic_server_fingerprint_seen_by_client() -> None:
    async with quic_server(idle_timeout=5.0) as server:
        conn = await connect_quic("127.0.0.1", server.port, fingerprint=server.fingerprint)
        try:
            assert conn.server_fingerprint == server.fingerprint
        finally:
            await conn.close()


# -- TLS over TCP (what wss:// uses) -------------------------------------------------------------


@asynccontextmanager
async def tcp_tls_server(context: ssl.SSLContext) -> AsyncIterator[int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await reader.readline())
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def tcp_round_trip(port: int, context: ssl.SSLContext, *, pin: str | None = None) -> bytes:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost"
    )
    try:
        if pin is not None:
            verify_fingerprint(writer.get_extra_info("ssl_object"), pin)
        writer.write(b"hi\n")
        return await reader.readline()
    finally:
        writer.close()


async def test_tcp_tls_cafile_fingerprint_and_default(cert: SelfSignedCert) -> None:
    async with tcp_tls_server(cert.server_ssl_context()) as port:
        with cert.temp_files() as (certfile, _):
            assert await tcp_round_trip(port, client_ssl_context(cafile=certfile)) == b"hi\n"
        assert await tcp_round_trip(port, client_ssl_context(cadata=cert.cert_pem)) == b"hi\n"
        pinned = client_ssl_context(fingerprint=cert.fingerprint)
        assert pinned.verify_mode == ssl.CERT_NONE
        assert await tcp_round_trip(port, pinned, pin=cert.fingerprint) == b"hi\n"
        with pytest.raises(TransportError, match="fingerprint mismatch"):
            await tcp_round_trip(port, pinned, pin="00" * 32)
        with pytest.raises(ssl.SSLCertVerificationError):
            await tcp_round_trip(port, client_ssl_context())


async def test_tcp_tls_insecure_warns(cert: SelfSignedCert, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="m2mwire.transport"):
        context = client_ssl_context(insecure=True, target="wss://127.0.0.1:1")
    assert context.verify_mode == ssl.CERT_NONE
    assert any("wss://127.0.0.1:1" in r.getMessage() for r in caplog.records)
    with cert.temp_files() as (certfile, keyfile):
        server_context = server_ssl_context(certfile, keyfile)
    async with tcp_tls_server(server_context) as port:
        assert await tcp_round_trip(port, context) == b"hi\n"
