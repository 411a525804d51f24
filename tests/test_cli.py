"""The console command, run as a user would: a subprocess, real servers on 127.0.0.1 (port 0)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from m2mwire import __version__
from m2mwire.schemas.messages import json_schema
from m2mwire.transport.tls import generate_self_signed

ROOT = Path(__file__).resolve().parents[1]
PACKAGED_SCHEMA = ROOT / "m2mwire" / "schemas" / "session.schema.json"


def m2mwire(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "m2mwire", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def assert_clean_failure(done: subprocess.CompletedProcess[str], status: int, *says: str) -> None:
    """Failed with ``status``, one readable message, no traceback."""
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith("m2mwire: "), done.stderr
    for text in says:
        assert text in done.stderr, done.stderr


class Served:
    """``m2mwire serve URL ...`` in a subprocess; ``url``/``fingerprint`` from its first line."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "m2mwire", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # bounded: the process ends (EOF) if it cannot start
        assert line.startswith("serving on "), (line, self.stop()[1])
        self.url = line.split()[2]
        self.fingerprint = line.split("sha256 ")[1].rstrip(")\n") if "sha256" in line else None

    def stop(self) -> tuple[str, str]:
        """SIGINT (Ctrl-C), then everything it printed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        out, err = self.process.communicate(timeout=20)
        return out, err


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Served]]:
    started = {scheme: Served(f"{scheme}://127.0.0.1:0") for scheme in ("ws", "wss", "quic")}
    try:
        yield started
    finally:
        for served in started.values():
            served.stop()


# -- demo ------------------------------------------------------------------------------------------


def test_demo_fits_100_columns_explains_auto_and_points_onwards() -> None:
    done = m2mwire("demo")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Live session over WS" in out and "Live session over QUIC" in out
    assert "Live session over NATS" in out and "worker demo-worker-1 answered" in out
    assert out.count("mode LATENT (hash_match)") == 3
    assert out.count("hidden state (AVP, float32)") == 3
    widest = max(out.splitlines(), key=len)
    assert len(widest) <= 100, widest
    # Why automatic selection chose what it chose, in both sessions, from measured sizes.
    assert out.count("auto chose tokennative: smallest byte-exact wire of tokennative ") == 3
    assert "the tokens of the original" in out and "Dictionary was larger than the original for" in out
    assert out.count('optimize="tokens" (an LLM reads the wire) picks token.') == 3
    # Replies are whole (or a marked summary), never a JSON object cut in the middle.
    replies = [line for line in out.splitlines() if line.lstrip().startswith("reply (")]
    assert len(replies) == 24
    for line in replies:
        shown = line.split("): ", 1)[1]
        assert shown.startswith(("completion ", '"', "AVP hidden state")), line
        if shown.startswith("completion "):
            json.loads(shown.removeprefix("completion "))  # a whole JSON string
    assert 'completion "Got 4 message(s); the last one had' in out
    assert out.rstrip().splitlines()[-3].startswith("next: examples/")
    assert "m2mwire serve ws://127.0.0.1:8765" in out
    assert done.stderr == ""


# -- codecs ----------------------------------------------------------------------------------------


def test_compress_then_decompress_round_trip() -> None:
    content = '{"model":"gpt-4o","messages":[{"role":"user","content":"Hello, wörld"}]}'
    for algorithm in ("tokennative", "token", "brotli", "dictionary"):
        wire = m2mwire("compress", "-", "--algorithm", algorithm, stdin=content)
        assert wire.returncode == 0, wire.stderr
        back = m2mwire("decompress", "-", stdin=wire.stdout)
        assert back.returncode == 0, back.stderr
        value = json.loads(back.stdout)
        if algorithm == "token":  # T1 restores the omitted request defaults (temperature, top_p, ...)
            assert value.pop("temperature") == 1.0 and value.pop("top_p") == 1.0
            value = {k: v for k, v in value.items() if k in ("model", "messages")}
        assert value == json.loads(content)
    plain = m2mwire("compress", "-", "--algorithm", "none", stdin=content)
    assert plain.stdout == content + "\n"  # 'none' is the content itself


def test_bad_wire_is_a_clean_error() -> None:
    assert_clean_failure(m2mwire("decompress", "#TK|C|not base64!"), 1, "DecodeError")


def test_decompress_of_something_that_is_not_a_wire_string_fails() -> None:
    done = m2mwire("decompress", "hello there")
    assert_clean_failure(done, 1, "not an M2M wire string", "#TK|")
    assert done.stdout == ""


# -- version, schema -------------------------------------------------------------------------------


def test_version() -> None:
    done = m2mwire("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"m2mwire {__version__}"


def test_schema_goes_to_stdout_or_a_path_never_into_the_package(tmp_path: Path) -> None:
    before = PACKAGED_SCHEMA.stat().st_mtime_ns
    done = m2mwire("schema")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json_schema()
    target = tmp_path / "session.schema.json"
    done = m2mwire("schema", "--output", str(target))
    assert done.returncode == 0, done.stderr
    assert json.loads(target.read_text()) == json_schema()
    assert PACKAGED_SCHEMA.stat().st_mtime_ns == before
    assert json.loads(PACKAGED_SCHEMA.read_text()) == json_schema()  # the shipped copy is current


# -- URLs and flags --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:8765", "http:// is not an m2mwire URL"),
        ("127.0.0.1:8765", "has no scheme: write ws://127.0.0.1:8765"),
        ("ws://127.0.0.1:port", "bad port"),
    ],
)
def test_urls_that_are_not_m2mwire_urls(url: str, says: str) -> None:
    assert_clean_failure(m2mwire("send", url, "hi"), 2, says)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--fingerprint", "ab" * 32],
            "--fingerprint does not apply to a ws:// URL, only to wss:// and quic://",
        ),
        (["--cafile", "ca.pem"], "--cafile does not apply to a ws:// URL"),
        (["--insecure"], "--insecure does not apply to a ws:// URL"),
    ],
)
def test_send_flags_that_do_not_apply(args: list[str], says: str) -> None:
    assert_clean_failure(m2mwire("send", "ws://127.0.0.1:1", "hi", *args), 2, says)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        # a traceback from urllib's ValueError
        (["send", "quic://[::1", "hi"], 2, "malformed URL 'quic://[::1': Invalid IPv6 URL"),
        # a Python keyword in a command line's message
        (
            ["gateway", "ws://127.0.0.1:0", "nats://127.0.0.1:4222/x", "--resume-window", "-1"],
            2,
            "gateway --resume-window takes a number >= 0",
        ),
        (
            ["gateway", "ws://127.0.0.1:0", "nats://127.0.0.1:4222/x", "--write-timeout", "0"],
            2,
            "gateway --write-timeout takes a number > 0",
        ),
        (
            ["serve", "ws://127.0.0.1:0", "--algorithms", "nope"],
            2,
            "--algorithms: unknown compression algorithm",
        ),
    ],
)
def test_mistakes_found_by_a_cli_review_are_one_line_in_the_flags_terms(
    args: list[str], code: int, says: str
) -> None:
    assert_clean_failure(m2mwire(*args), code, says)


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_send_timeout_takes_seconds_above_0(value: str) -> None:
    """--timeout -1 sent the message, then gave up on the reply at once; nan was taken."""
    done = m2mwire("send", "ws://127.0.0.1:1", "hi", "--timeout", value)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "argument --timeout: takes a number of seconds above 0" in done.stderr.splitlines()[-1]


def test_timer_flags_take_a_count_and_none_where_the_keywords_do() -> None:
    """max_missed_pongs is a count (1.5 is refused, as timers= refuses it) and session_timeout=none
    means never, as session_timeout=None does in Python; write_timeout is listed in --help."""
    from m2mwire.cli import _parser, _serve_options

    parser = _parser()
    args = parser.parse_args(
        ["serve", "ws://127.0.0.1:0", "--timer", "max_missed_pongs=3", "--timer", "session_timeout=none"]
    )
    assert _serve_options(args)["timers"] == {"max_missed_pongs": 3, "session_timeout": None}
    assert_clean_failure(m2mwire("serve", "ws://127.0.0.1:0", "--timer", "max_missed_pongs=1.5"), 2, "COUNT")
    assert "write_timeout" in m2mwire("serve", "--help").stdout


def test_a_port_in_use_is_one_line_not_a_traceback() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        url = f"ws://127.0.0.1:{taken.getsockname()[1]}"
        assert_clean_failure(
            m2mwire("serve", url), 1, f"ListenError: cannot listen on {url}", "choose another port"
        )


def test_malformed_fingerprint() -> None:
    done = m2mwire("send", "quic://127.0.0.1:1", "hi", "--fingerprint", "12:34")
    assert_clean_failure(done, 2, "fingerprint '12:34' is not a SHA-256 digest")


def test_missing_cafile_is_a_message_not_a_timeout(tmp_path: Path) -> None:
    for url in ("wss://127.0.0.1:1", "quic://127.0.0.1:1"):
        started = time.monotonic()
        done = m2mwire("send", url, "hi", "--cafile", str(tmp_path / "ca.pem"))
        assert_clean_failure(done, 2, "--cafile '", "': no such file", "or pin --fingerprint instead")
        assert "cafile=" not in done.stderr and "SSL" not in done.stderr
        assert time.monotonic() - started < 8  # no handshake was attempted


def test_bad_json_is_a_message() -> None:
    done = m2mwire("send", "ws://127.0.0.1:1", '{"a": ', "--json")
    assert_clean_failure(done, 2, "--json: the message is not JSON", "leave out --json")


def test_ctrl_c_during_send_is_a_message() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts, never answers the handshake
        port = listener.getsockname()[1]
        process = subprocess.Popen(
            [sys.executable, "-m", "m2mwire", "send", f"ws://127.0.0.1:{port}", "hi"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        listener.settimeout(30)
        conn, _ = listener.accept()  # send is now waiting inside asyncio.run
        with conn:
            time.sleep(0.2)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=20)
    assert process.returncode == 130, err
    assert err == "m2mwire: interrupted\n"


# -- serve -----------------------------------------------------------------------------------------


def test_quic_certfile_without_keyfile_fails_at_startup(tmp_path: Path) -> None:
    certfile = tmp_path / "cert.pem"
    certfile.write_bytes(generate_self_signed().cert_pem)
    done = m2mwire("serve", "quic://127.0.0.1:0", "--certfile", str(certfile), timeout=30)
    assert_clean_failure(done, 2, "cannot load the server certificate", "pass --keyfile with the private key")
    assert "serving on" not in done.stdout


def test_serve_certfile_on_ws_is_rejected() -> None:
    done = m2mwire("serve", "ws://127.0.0.1:0", "--certfile", "cert.pem", timeout=30)
    assert_clean_failure(done, 2, "--certfile does not apply to a ws:// URL")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--timer", "ping_interval"], "--timer 'ping_interval': write NAME=SECONDS"),
        (["--timer", "pingg=3"], "unknown timer(s) pingg"),
        (["--algorithms", "zip"], "unknown compression algorithm 'zip'"),
        (["--identity", "/nonexistent.json"], "--identity /nonexistent.json: cannot read a model identity"),
    ],
)
def test_serve_option_errors(args: list[str], says: str) -> None:
    done = m2mwire("serve", "ws://127.0.0.1:0", *args, timeout=30)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert says in done.stderr


def test_serve_prints_a_readable_session_line_and_takes_session_options(tmp_path: Path) -> None:
    identity = tmp_path / "identity.json"
    identity.write_text(json.dumps({"model_family": "llama", "model_id": "m", "hidden_dim": 8}))
    served = Served(
        "ws://127.0.0.1:0",
        "--agent-id",
        "planner-7",
        "--algorithms",
        "brotli,none",
        "--max-payload",
        "65536",
        "--timer",
        "ping_interval=20",
        "--identity",
        str(identity),
        "--log-level",
        "debug",
    )
    try:
        sent = m2mwire("send", served.url, '{"question": "' + "why " * 100 + '"}', "--json", timeout=30)
        text = m2mwire("send", served.url, "hello agent", timeout=30)
    finally:
        out, err = served.stop()
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout) == {"ack": True, "type": "dict"}
    assert "sent via brotli" in sent.stderr  # the server offered brotli and none only
    assert text.stdout == "ack: 11 characters received\n"
    session_lines = [line for line in out.splitlines() if line.startswith("session ") and " from " in line]
    assert len(session_lines) == 2, out
    assert "SessionInfo(" not in out
    assert "; mode JSON (" in session_lines[0]
    assert "; algorithms brotli,none; " in session_lines[0] and "max_payload 65536" in session_lines[0]
    assert "closed after 1 message(s)" in out
    # m2mwire's own debug records are on; other libraries (websockets) stay at warnings.
    records = [line for line in err.splitlines() if line.startswith("m2mwire: ")]
    assert all(" m2mwire." in line.split(":")[1] for line in records if "INFO" in line or "DEBUG" in line), (
        err
    )
    assert "websockets" not in err, err


def test_wss_to_a_plain_ws_server_says_why(servers: dict[str, Served]) -> None:
    port = servers["ws"].url.rsplit(":", 1)[1]
    done = m2mwire("send", f"wss://127.0.0.1:{port}", "hi", timeout=30)
    assert_clean_failure(done, 1, "the TLS handshake failed (ConnectionResetError); is this a plain ws://")


@pytest.mark.parametrize("scheme", ["wss", "quic"])
def test_self_signed_server_hint_names_the_flag(servers: dict[str, Served], scheme: str) -> None:
    done = m2mwire("send", servers[scheme].url, "hi", timeout=30)
    assert_clean_failure(done, 1, "self-signed certificate", "--fingerprint <sha256")
    assert "fingerprint=" not in done.stderr
    assert "Error: 298" not in done.stderr  # aioquic's own log line of the same failure
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("scheme", ["ws", "wss", "quic"])
def test_send_gets_the_reply(servers: dict[str, Served], scheme: str) -> None:
    served = servers[scheme]
    pin = ["--fingerprint", served.fingerprint] if served.fingerprint else []
    done = m2mwire("send", served.url, '{"model": "m", "messages": []}', "--json", *pin, timeout=30)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["object"] == "chat.completion"


def test_serve_cert_dir_flags() -> None:
    from m2mwire.cli import UsageError, _parser, _serve_options

    def options(*argv: str) -> dict[str, object]:
        return _serve_options(_parser().parse_args(["serve", *argv]))

    assert "cert_dir" not in options("quic://127.0.0.1:0")  # the state directory
    assert options("wss://127.0.0.1:0", "--cert-dir", "/srv/certs")["cert_dir"] == "/srv/certs"
    assert options("quic://127.0.0.1:0", "--no-cert-dir")["cert_dir"] is False
    with pytest.raises(UsageError, match="--cert-dir does not apply to a ws:// URL"):
        options("ws://127.0.0.1:0", "--no-cert-dir")
    with pytest.raises(SystemExit):  # one or the other
        options("quic://127.0.0.1:0", "--no-cert-dir", "--cert-dir", "/srv/certs")


def test_cli_terms_rewrites_keyword_options_into_flags() -> None:
    from m2mwire.cli import _cli_terms

    assert _cli_terms("pass fingerprint=<sha256> or cafile=.") == "pass --fingerprint <sha256> or --cafile."
    assert _cli_terms("insecure=True and max_payload=5") == "--insecure and --max-payload 5"
    assert _cli_terms("certfile='a.pem'") == "--certfile 'a.pem'"


SILENT_AGENT = """
import asyncio, m2mwire

async def silent(session):
    async for _ in session:
        pass  # reads, never answers

async def main():
    async with m2mwire.serve(silent, "ws://127.0.0.1:0") as server:
        print(server.url, flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


def test_no_reply_within_timeout_is_a_session_timeout() -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SILENT_AGENT], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        done = m2mwire("send", url, "hi", "--timeout", "0.5", timeout=30)
    finally:
        server.kill()
        server.wait(timeout=10)
    assert_clean_failure(done, 1, "SessionTimeout: no reply within --timeout 0.5 s")
