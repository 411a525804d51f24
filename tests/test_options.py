"""Options and URLs of connect()/serve(): whatever does not apply fails at the call, saying what does."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

import m2mwire
from m2mwire import ConfigError, ListenError, connect, serve
from m2mwire.api import Session
from m2mwire.errors import TransportError
from m2mwire.transport.tls import generate_self_signed

FP = "ab" * 32


async def nothing(session: Session) -> None:
    pass


@pytest.mark.parametrize(
    ("url", "options", "says"),
    [
        (
            "ws://127.0.0.1:1",
            {"fingerprint": FP},
            "fingerprint= applies to connect() with wss:// and quic://",
        ),
        ("ws://127.0.0.1:1", {"cafile": "/nonexistent.pem"}, "cafile= applies to connect() with wss://"),
        ("ws://127.0.0.1:1", {"insecure": True}, "insecure= applies to connect()"),
        ("wss://127.0.0.1:1", {"certfile": "c.pem"}, "certfile= is an option of serve(), not of connect()"),
        ("quic://127.0.0.1:1", {"keyfile": "k.pem"}, "keyfile= is an option of serve()"),
        ("wss://127.0.0.1:1", {"idle_timeout": 5}, "idle_timeout= applies to connect() with quic:// only"),
        ("ws://127.0.0.1:1", {"fingreprint": FP}, "unknown option fingreprint="),
        ("ws://127.0.0.1:1", {"max_sessions": 3}, "max_sessions= is an option of serve(), not of connect()"),
    ],
)
def test_connect_rejects_options_that_do_not_apply(url: str, options: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        connect(url, **options)  # at the call: nothing is opened
    message = str(caught.value)
    assert says in message
    scheme = url.split(":")[0]
    assert f"Options of connect() with a {scheme}:// URL: " in message and "max_payload" in message
    assert isinstance(caught.value, ValueError)  # what Python code expects of a bad argument


@pytest.mark.parametrize(
    ("url", "options", "says"),
    [
        ("ws://127.0.0.1:0", {"insecure": True}, "insecure= is an option of connect(), not of serve()"),
        ("quic://127.0.0.1:0", {"fingerprint": FP}, "fingerprint= is an option of connect()"),
        ("ws://127.0.0.1:0", {"certfile": "c.pem"}, "certfile= applies to serve() with wss:// and quic://"),
        ("ws://127.0.0.1:0", {"cert_dir": "certs"}, "cert_dir= applies to serve() with wss:// and quic://"),
    ],
)
def test_serve_rejects_options_that_do_not_apply(url: str, options: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match="Options of serve\\(\\)") as caught:
        serve(nothing, url, **options)
    assert says in str(caught.value)


def test_each_call_lists_its_own_options() -> None:
    with pytest.raises(ConfigError) as caught:
        serve(nothing, "quic://127.0.0.1:0", open_timeout=3)
    listed = str(caught.value).split("URL: ")[1].split(", ")
    assert {"on_hello", "max_sessions", "certfile", "idle_timeout", "timers"} <= set(listed)
    assert "token" not in listed and "fingerprint" not in listed


def test_none_means_not_given() -> None:
    connect("ws://127.0.0.1:1", fingerprint=None, cafile=None, insecure=False)
    serve(nothing, "ws://127.0.0.1:0", certfile=None, keyfile=None)
    # cert_dir=False (a certificate in memory only) passes wherever there is no certificate to keep
    serve(nothing, "ws://127.0.0.1:0", cert_dir=False, certfile=None)


def test_optimize_is_checked_at_the_call_not_the_first_send() -> None:
    with pytest.raises(ConfigError, match="optimize= takes 'bytes' or 'tokens', not 'speed'"):
        connect("ws://127.0.0.1:1", optimize="speed")
    with pytest.raises(ConfigError, match="optimize="):
        serve(nothing, "ws://127.0.0.1:0", optimize="speed")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"timers": {"ping_intervall": 5}}, "unknown timer(s) ping_intervall; timers: hello_timeout"),
        ({"timers": {"pong_timeout": 0}}, "timer pong_timeout takes a number above 0"),
        ({"timers": 5}, "timers= takes a Timers or a dict"),
        ({"max_payload": -1}, "max_payload= takes a number of bytes"),
        ({"open_timeout": 0}, "open_timeout= takes a number of seconds above 0"),
        # From a CLI review: each of these was a bare TypeError / AttributeError / EncodeError, or
        # was taken and failed later (on the wire, or at the first send).
        ({"timers": {"max_missed_pongs": 1.5}}, "timer max_missed_pongs takes a whole count above 0"),
        ({"timers": {"ping_interval": float("nan")}}, "timer ping_interval takes a number above 0"),
        ({"algorithms": ["nope"]}, "algorithms=: unknown compression algorithm 'nope'"),
        ({"algorithms": ["zlib"]}, "algorithms=: zlib"),
        ({"encodings": ["x"]}, "encodings=: unknown tokenizer encoding 'x'"),
        ({"zstd": {"bogus": 1}}, "zstd= takes a ZstdOptions or a dict of its fields (window, level"),
        ({"zstd": "yes"}, "zstd= takes a ZstdOptions or a dict of its fields, not 'yes'"),
        ({"zstd": {"level": 99}}, "zstd level=99: must be 1..19"),
        ({"agent_id": 5}, "agent_id= takes a str, not 5"),
        ({"token_stats": "yes"}, "token_stats= takes True or False"),
    ],
)
def test_bad_values_are_named(options: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        connect("ws://127.0.0.1:1", **options)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:8765", "http:// is not an m2mwire URL"),
        ("https://example.org", "use wss://"),
        ("127.0.0.1:8765", "has no scheme: write ws://127.0.0.1:8765"),
        ("ws://127.0.0.1:port", "bad port in 'ws://127.0.0.1:port'"),
        ("tcp://127.0.0.1:1", "use ws://, wss:// or quic://"),
    ],
)
def test_urls_that_are_not_m2mwire_urls(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        connect(url)
    assert says in str(caught.value)


def test_malformed_fingerprint_and_contradictory_trust() -> None:
    with pytest.raises(ConfigError, match="not a SHA-256 digest"):
        connect("wss://127.0.0.1:1", fingerprint="ab:cd")
    with pytest.raises(ConfigError, match="choose one way to verify the server"):
        connect("quic://127.0.0.1:1", fingerprint=FP, insecure=True)


def test_missing_or_unusable_cafile(tmp_path: Path) -> None:
    for url in ("wss://127.0.0.1:1", "quic://127.0.0.1:1"):
        with pytest.raises(ConfigError, match=r"no such file\. Pass the PEM file of the CA"):
            connect(url, cafile=str(tmp_path / "missing.pem"))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="holds no usable PEM certificate"):
        connect("quic://127.0.0.1:1", cafile=str(junk))


@pytest.mark.parametrize("scheme", ["wss", "quic"])
def test_server_certificate_without_its_key_fails_at_serve(scheme: str, tmp_path: Path) -> None:
    cert = generate_self_signed()
    certfile = tmp_path / "cert.pem"
    certfile.write_bytes(cert.cert_pem)
    with pytest.raises(ConfigError, match="pass keyfile= with the private key"):
        serve(nothing, f"{scheme}://127.0.0.1:0", certfile=str(certfile))
    with pytest.raises(ConfigError, match="keyfile= needs certfile="):
        serve(nothing, f"{scheme}://127.0.0.1:0", keyfile=str(certfile))
    with pytest.raises(ConfigError, match="no such file"):
        serve(nothing, f"{scheme}://127.0.0.1:0", certfile=str(tmp_path / "missing.pem"))
    both = tmp_path / "both.pem"
    both.write_bytes(cert.cert_pem + cert.key_pem)  # one file holding both is fine
    serve(nothing, f"{scheme}://127.0.0.1:0", certfile=str(both))


async def test_wss_hints_speak_python() -> None:
    async with serve(nothing, "ws://127.0.0.1:0") as plain:
        with pytest.raises(TransportError, match="is this a plain ws:// server"):
            await connect(f"wss://127.0.0.1:{plain.port}", open_timeout=5)
    async with serve(nothing, "wss://127.0.0.1:0") as secure:
        with pytest.raises(TransportError) as caught:
            await connect(secure.url, open_timeout=5)
        assert "not trusted (self-signed certificate)" in str(caught.value)
        assert "fingerprint=<sha256>" in str(caught.value) and "cafile=" in str(caught.value)


@pytest.mark.parametrize("scheme", ["ws", "quic"])
async def test_a_port_in_use_is_a_listen_error_naming_the_url(scheme: str) -> None:
    """serve() on a port in use raised websockets'/asyncio's bare OSError (a CLI user got its
    traceback); it is a ListenError now: an M2MError and still an OSError, naming the URL and the
    way out."""
    kind = socket.SOCK_STREAM if scheme == "ws" else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as taken:
        taken.bind(("127.0.0.1", 0))
        if kind == socket.SOCK_STREAM:
            taken.listen()
        url = f"{scheme}://127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ListenError) as caught:
            async with m2mwire.serve(lambda session: None, url, cert_dir=False):  # type: ignore[arg-type,return-value]
                pass
    assert isinstance(caught.value, OSError) and caught.value.errno == errno.EADDRINUSE
    assert url in str(caught.value) and "choose another port" in str(caught.value)


def test_bad_tls_and_gateway_values_are_config_errors() -> None:
    """fingerprint=5 raised AttributeError ('int' object has no attribute 'strip'), and a
    gateway's resume_window="x" a ValueError from float(); NaN went through."""
    with pytest.raises(ConfigError, match="fingerprint= takes the server's SHA-256"):
        connect("wss://127.0.0.1:1", fingerprint=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="gateway resume_window= takes a number >= 0, not 'x'"):
        m2mwire.gateway("ws://127.0.0.1:0", "nats://127.0.0.1:4222/x", resume_window="x")
    with pytest.raises(ConfigError, match="gateway hello_timeout= takes a number > 0, not nan"):
        m2mwire.gateway("ws://127.0.0.1:0", "nats://127.0.0.1:4222/x", hello_timeout=float("nan"))


async def test_open_quic_connection_options_are_checked_as_connect_checks_them() -> None:
    """A ws:// URL raised ValueError, an unknown option TypeError without naming the options
    there are, open_timeout= (which connect() takes) was refused, and connect(connection=5)
    raised TypeError (stop 32's review). All ConfigError now; open_timeout= bounds the handshake."""
    with pytest.raises(ConfigError, match="needs a quic:// URL"):
        await m2mwire.open_quic_connection("ws://127.0.0.1:9")
    with pytest.raises(ConfigError, match=r"bogus; it takes cafile, .*max_payload, open_timeout"):
        await m2mwire.open_quic_connection("quic://127.0.0.1:9", bogus=1)
    with pytest.raises(ConfigError, match=r"connection= takes a connection from m2mwire\.open_quic"):
        await m2mwire.connect("quic://127.0.0.1:9", connection=5)
    with pytest.raises(TransportError, match=r"timed out after 0\.2 s"):  # nothing listens there
        await m2mwire.open_quic_connection("quic://127.0.0.1:9", open_timeout=0.2)
