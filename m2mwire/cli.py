"""The ``m2mwire`` console command: demo, serve, send, compress, decompress, schema.

Errors end the command with one line on stderr, never a traceback: ``m2mwire: <what went wrong>``,
exit status 1 for a failure and 2 for a usage error (a bad flag value, an option that does not apply),
130 for Ctrl-C. The library's messages speak Python (``fingerprint=``); :func:`_cli_terms` rewrites
them into the flags of this command (``--fingerprint``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m2mwire import __version__
from m2mwire.errors import ConfigError, M2MError

if TYPE_CHECKING:
    from m2mwire.api import Session
    from m2mwire.options import Call

__all__ = ["main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # the shell convention for SIGINT (128 + 2)

# Python keyword options -> the flags that set them, for messages written in the library's terms.
_FLAGS = {
    "fingerprint": "--fingerprint",
    "cafile": "--cafile",
    "certfile": "--certfile",
    "keyfile": "--keyfile",
    "cert_dir": "--cert-dir",
    "insecure": "--insecure",
    "max_payload": "--max-payload",
    "algorithms": "--algorithms",
    "encodings": "--encodings",
    "identity": "--identity",
    "agent_id": "--agent-id",
    "timers": "--timer",
    "optimize": "--optimize",
    "resume_window": "--resume-window",
    "hello_timeout": "--hello-timeout",
    "write_timeout": "--write-timeout",
}
# "name=True" and "name=" at the end of a word become the bare flag; "name=value" becomes "flag value".
_OPTION_IN_TEXT = re.compile(r"\b(" + "|".join(_FLAGS) + r")=(True\b|(?=[\s,.;:)]|$))?")


def _cli_terms(message: str) -> str:
    """``fingerprint=<sha256>`` -> ``--fingerprint <sha256>``, ``insecure=True`` -> ``--insecure``."""
    return _OPTION_IN_TEXT.sub(
        lambda m: _FLAGS[m.group(1)] + ("" if m.group(2) is not None else " "), message
    )


def _check_flags(call: Call, url: str, given: dict[str, Any]) -> None:
    """Reject flags that do not apply to the URL's scheme, in the command line's terms."""
    from m2mwire.options import parse_url, valid_options  # loads the codecs: not for --version
    from m2mwire.transport.registry import schemes

    scheme = parse_url(url).scheme
    valid = valid_options(call, scheme)
    for name, value in given.items():
        if value and name not in valid:
            where = [s + "://" for s in schemes() if name in valid_options(call, s)]
            raise UsageError(
                f"{_FLAGS[name]} does not apply to a {scheme}:// URL, only to {' and '.join(where)}"
            )


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (argparse names the flag on error;
    --timeout -1 used to send the message and then give up on the reply at once)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number of seconds, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"takes a number of seconds above 0, not {text!r}")
    return value


class UsageError(Exception):
    """A command-line value that cannot be used; the message names the flag."""


def _read(value: str) -> str:
    return sys.stdin.read() if value == "-" else value


def _setup_logging(level: str = "warning") -> None:
    """Warnings of every library, and m2mwire's own records from ``level`` up.

    aioquic's ``quic`` logger reports each failed handshake again (``[id] Error: 298, reason:
    self-signed certificate``) after m2mwire has raised a TransportError saying the same with a hint;
    its records stay below ERROR, so it is raised to ERROR here.
    """
    logging.basicConfig(level=logging.WARNING, format="m2mwire: %(levelname)s %(name)s: %(message)s")
    logging.getLogger("m2mwire").setLevel(level.upper())
    logging.getLogger("quic").setLevel(logging.ERROR)


def _cmd_demo(_: argparse.Namespace) -> int:
    from m2mwire.demo import run_demo

    _setup_logging("error")
    asyncio.run(run_demo())
    return 0


def _session_line(session: Session) -> str:
    info = session.info
    return (
        f"session {info.session_id} from {session.remote_address}: {info.peer_agent_type} "
        f"{info.peer_agent_id}; mode {info.mode} ({info.mode_reason}); "
        f"algorithms {','.join(a.value for a in info.algorithms)}; encoding {info.encoding.value}; "
        f"max_payload {info.max_payload}"
    )


def _certificate_options(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """--certfile, --keyfile, --cert-dir / --no-cert-dir as serve()'s and gateway()'s keywords."""
    _check_flags(
        "serve",
        url,
        {"certfile": args.certfile, "keyfile": args.keyfile, "cert_dir": args.cert_dir or args.no_cert_dir},
    )
    options = {name: getattr(args, name) for name in ("certfile", "keyfile", "cert_dir")}
    if args.no_cert_dir:
        options["cert_dir"] = False
    return {name: value for name, value in options.items() if value is not None}


def _add_certificate_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--certfile", help="TLS certificate chain (PEM; wss://, quic://); default: generated")
    p.add_argument("--keyfile", help="its private key (PEM), unless --certfile holds both")
    kept = p.add_mutually_exclusive_group()
    kept.add_argument(
        "--cert-dir",
        metavar="DIR",
        help="where the generated certificate is kept across restarts (wss://, quic://; default: "
        "$M2MWIRE_STATE_DIR, else $XDG_STATE_HOME/m2mwire, else ~/.local/state/m2mwire, then certs/HOST)",
    )
    kept.add_argument(
        "--no-cert-dir",
        action="store_true",
        help="keep the generated certificate in memory only: a new fingerprint at every start",
    )


def _serve_options(args: argparse.Namespace) -> dict[str, Any]:
    options = _certificate_options(args, args.url)
    for name in ("agent_id", "max_payload"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if getattr(args, "reuse_port", False):  # set by serve --workers for its workers
        options["reuse_port"] = True
    for name in ("algorithms", "encodings"):
        if getattr(args, name):
            options[name] = [part.strip() for part in getattr(args, name).split(",") if part.strip()]
    if args.identity:
        from m2mwire.schemas.identity import ModelIdentity

        try:
            options["identity"] = ModelIdentity.from_dict(json.loads(Path(args.identity).read_text()))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise UsageError(
                f"--identity {args.identity}: cannot read a model identity (a JSON object with "
                f"model_family, model_id, model_hash, hidden_dim, ...): {exc}"
            ) from None
    if args.timer:
        timers: dict[str, float | int | None] = {}
        for item in args.timer:
            name, sep, value = item.partition("=")
            name = name.strip()
            try:
                if name == "max_missed_pongs":  # a count
                    timers[name] = int(value)
                elif name == "session_timeout" and value.strip().lower() == "none":  # never
                    timers[name] = None
                else:
                    timers[name] = float(value)
            except ValueError:
                sep = ""
            if not sep:
                raise UsageError(
                    f"--timer {item!r}: write NAME=SECONDS (max_missed_pongs=COUNT, session_timeout=none "
                    "for never), e.g. --timer ping_interval=20"
                )
        options["timers"] = timers
    return options


def _cmd_serve(args: argparse.Namespace) -> int:
    if args.workers != 1:
        return _cmd_serve_workers(args)
    from m2mwire.api import serve
    from m2mwire.demo import answer

    _setup_logging(args.log_level)

    async def agent(session: Session) -> None:
        print(_session_line(session), flush=True)
        count = 0
        async for message in session:
            count += 1
            await session.send(answer(message))
        print(f"session {session.info.session_id} closed after {count} message(s)", flush=True)

    async def run() -> None:
        async with serve(agent, args.url, **_serve_options(args)) as server:
            print(
                f"serving on {server.url}"
                + (f" (certificate sha256 {server.fingerprint})" if server.fingerprint else ""),
                flush=True,
            )
            if server.fingerprint:
                print(
                    f"clients: m2mwire send {server.url} MESSAGE --fingerprint {server.fingerprint}",
                    flush=True,
                )
            await asyncio.Future()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:  # the way to stop a server: not a failure
        print("stopped", file=sys.stderr)
    return 0


def _cmd_serve_workers(args: argparse.Namespace) -> int:
    """``serve URL --workers N``: N worker processes of this command, one per core.

    ws:// and quic:// workers share the port with SO_REUSEPORT (the kernel spreads connections);
    nats:// workers join the service's queue group (NATS spreads sessions). With TLS and no
    --certfile, every worker uses the self-signed certificate kept in the state directory (or
    --cert-dir), made here first; with --no-cert-dir one generated here is handed to them. Either
    way every worker shows the same fingerprint.
    """
    import signal
    import subprocess
    import time
    from urllib.parse import urlsplit

    if args.workers < 1:
        raise UsageError(f"--workers takes a number of processes of at least 1, not {args.workers}")
    parts = urlsplit(args.url)
    scheme = parts.scheme.lower()
    # Each worker runs this very command line, less --workers.
    own: list[str] = []
    skip = False
    for arg in args.argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            own.append(arg)
    command = [sys.executable, "-m", "m2mwire", *own]
    if scheme in ("ws", "wss", "quic"):
        if not parts.port:
            raise UsageError(
                f"--workers {args.workers} needs a fixed port in {args.url} (with port 0 each worker "
                "would listen on a port of its own)"
            )
        command.append("--reuse-port")
    if scheme in ("wss", "quic") and not args.certfile:
        from m2mwire.options import parse_url
        from m2mwire.transport import certstore

        # The workers find this same pair (they resolve the same options for the same host).
        host = parse_url(args.url).host
        certfile, _, fingerprint = certstore.server_certificate_files(_serve_options(args), host)
        if certfile is None:  # --no-cert-dir (or no writable state directory): one for all, in a temp dir
            from m2mwire.transport.tls import generate_self_signed

            cert = generate_self_signed(certstore.certificate_names(host))
            certfile, keyfile = cert.write_temp_files()
            fingerprint = cert.fingerprint
            command += ["--certfile", certfile, "--keyfile", keyfile]
        print(f"workers share a self-signed certificate, SHA-256 fingerprint {fingerprint}")
    procs = [subprocess.Popen(command) for _ in range(args.workers)]
    print(f"serving {args.url} with {args.workers} worker processes: {' '.join(str(p.pid) for p in procs)}")
    sys.stdout.flush()
    # SIGTERM ends the workers too: exit through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        failed = [p for p in procs if p.returncode not in (None, 0)]
        return 1 if failed else 0
    except KeyboardInterrupt:
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def _cmd_gateway(args: argparse.Namespace) -> int:
    from m2mwire.shell.gateway import gateway

    async def run() -> None:
        options = _certificate_options(args, args.listen_url)
        for name in ("resume_window", "hello_timeout", "write_timeout"):
            if getattr(args, name) is not None:
                options[name] = getattr(args, name)
        async with gateway(args.listen_url, args.nats_url, **options) as gw:
            print(
                f"gateway on {gw.url} -> {args.nats_url}"
                + (f" (fingerprint {gw.fingerprint})" if gw.fingerprint else ""),
                flush=True,
            )
            await asyncio.Future()

    _setup_logging("info")
    try:
        asyncio.run(run())
    except KeyboardInterrupt:  # the way to stop a gateway: not a failure
        print("stopped", file=sys.stderr)
    return 0


def _cmd_send(args: argparse.Namespace) -> int:
    from m2mwire.api import connect
    from m2mwire.errors import SessionTimeout

    _setup_logging()
    content: Any = _read(args.message)
    if args.json:
        try:
            content = json.loads(content)
        except ValueError as exc:
            raise UsageError(
                f"--json: the message is not JSON ({exc}); leave out --json to send text"
            ) from None
    _check_flags(
        "connect",
        args.url,
        {"fingerprint": args.fingerprint, "cafile": args.cafile, "insecure": args.insecure},
    )
    options: dict[str, Any] = {"token_stats": True}
    for name in ("fingerprint", "cafile"):
        if getattr(args, name):
            options[name] = getattr(args, name)
    if args.insecure:
        options["insecure"] = True
    session_opener = connect(args.url, **options)  # checks the URL and options before anything runs

    async def run() -> None:
        async with session_opener as session:
            sent = await session.send(content, algorithm=args.algorithm)
            print(
                f"sent via {sent.algorithm}: {sent.original_bytes} -> {sent.wire_bytes} bytes",
                file=sys.stderr,
            )
            try:
                reply = await asyncio.wait_for(session.recv(), args.timeout)
            except TimeoutError:
                raise SessionTimeout(f"no reply within --timeout {args.timeout:g} s") from None
            print(json.dumps(reply.value) if reply.kind == "json" else reply.text)

    asyncio.run(run())
    return 0


def _cmd_compress(args: argparse.Namespace) -> int:
    from m2mwire.codecs import compress

    print(compress(_read(args.content), args.algorithm, encoding=args.encoding, optimize=args.optimize))
    return 0


def _cmd_decompress(args: argparse.Namespace) -> int:
    from m2mwire.codecs import Algorithm
    from m2mwire.codecs.wire import decode_wire

    decoded = decode_wire(_read(args.wire).rstrip("\n"))
    if decoded.algorithm is Algorithm.NONE:
        print(
            "m2mwire: not an M2M wire string: it starts with none of the prefixes #TK|, #T1|, "
            "#M2M[v3.0]|DATA:, #BR|, #M2M|, #DI| (content sent with algorithm 'none' has no prefix "
            "and needs no decoding)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    print(decoded.content)
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from m2mwire.schemas.messages import json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if args.output:  # never the installed package's own copy by default: it may be read-only or shared
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="m2mwire", description="Agent-to-agent sessions with M2M wire formats"
    )
    parser.add_argument("--version", action="version", version=f"m2mwire {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("demo", help="run a server and a client on 127.0.0.1 and show what goes over the wire")

    p = sub.add_parser(
        "serve",
        help="run an answering agent",
        description="Run the demo agent: JSON chat requests get a chat completion, other JSON an "
        "acknowledgement object, text 'ack: N characters received', a hidden state its tanh.",
    )
    p.add_argument(
        "url",
        nargs="?",
        default="ws://127.0.0.1:8765",
        help="ws://, wss://, quic://host:port or nats://host:4222/subject",
    )
    _add_certificate_flags(p)
    p.add_argument("--identity", metavar="FILE", help="model identity (JSON object); enables latent mode")
    p.add_argument("--agent-id", help="this agent's id (default: a random UUID)")
    p.add_argument("--algorithms", help="comma-separated, in order of preference (default: all)")
    p.add_argument("--encodings", help="comma-separated tokenizers to offer (default: all installed)")
    p.add_argument(
        "--max-payload",
        type=int,
        metavar="BYTES",
        help="largest message accepted; 0 = announce none (16 MiB still applies)",
    )
    p.add_argument(
        "--timer",
        action="append",
        metavar="NAME=SECONDS",
        help="a session timer, repeatable: hello_timeout, ping_interval, pong_timeout, max_missed_pongs "
        "(a count), close_timeout, session_timeout (none: never), write_timeout",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="m2mwire's own log records (other libraries log warnings only)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (ws://, quic:// share the port: SO_REUSEPORT; nats:// join the queue group)",
    )
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)

    p = sub.add_parser("gateway", help="accept WebSocket/QUIC sessions and carry them to a NATS service")
    p.add_argument("listen_url", help="ws://, wss:// or quic://host:port to accept clients on")
    p.add_argument("nats_url", help="nats://host:4222[,host2:4222]/service.subject of the workers")
    _add_certificate_flags(p)
    p.add_argument(
        "--resume-window",
        type=float,
        help="seconds to remember which worker holds a session whose connection was lost, so its "
        "client resumes there through this gateway (the workers' resume_window; default 60)",
    )
    p.add_argument(
        "--hello-timeout",
        type=float,
        metavar="SECONDS",
        help="how long a new connection may take to send its HELLO (default 30)",
    )
    p.add_argument(
        "--write-timeout",
        type=float,
        metavar="SECONDS",
        help="how long a relayed message may wait for a side that does not read; past it the "
        "relay is dropped (default 30)",
    )

    p = sub.add_parser("send", help="open a session, send one message, print the reply")
    p.add_argument("url")
    p.add_argument("message", help="the content, or - for standard input")
    p.add_argument("--json", action="store_true", help="parse the content as JSON")
    p.add_argument(
        "--algorithm", help="zstd, tokennative, token, brotli, dictionary, m2m or none (default: automatic)"
    )
    p.add_argument("--fingerprint", help="pin the server certificate's SHA-256 (wss://, quic://)")
    p.add_argument("--cafile", help="PEM file of the CA (or certificate) to trust (wss://, quic://)")
    p.add_argument(
        "--insecure", action="store_true", help="DO NOT verify the server certificate (local testing)"
    )
    p.add_argument("--timeout", type=_seconds, default=30.0, help="seconds to wait for the reply")

    p = sub.add_parser("compress", help="print the wire form of some content")
    p.add_argument("content", help="the content, or - for standard input")
    p.add_argument("--algorithm", default=None)
    p.add_argument("--encoding", default="cl100k_base")
    p.add_argument("--optimize", choices=["bytes", "tokens"], default="bytes")

    p = sub.add_parser("decompress", help="decode a wire string")
    p.add_argument("wire", help="the wire string, or - for standard input")

    p = sub.add_parser("schema", help="print the JSON Schema of the session messages")
    p.add_argument("-o", "--output", metavar="PATH", help="write it to PATH instead of standard output")
    p.add_argument(
        "--stdout", action="store_true", help=argparse.SUPPRESS
    )  # the default now; kept for scripts
    return parser


_HANDLERS = {
    "demo": _cmd_demo,
    "serve": _cmd_serve,
    "gateway": _cmd_gateway,
    "send": _cmd_send,
    "compress": _cmd_compress,
    "decompress": _cmd_decompress,
    "schema": _cmd_schema,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # serve --workers re-runs it per worker
    try:
        return _HANDLERS[args.command](args)
    except (UsageError, ConfigError) as exc:
        print(f"m2mwire: {_cli_terms(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except M2MError as exc:
        print(f"m2mwire: {type(exc).__name__}: {_cli_terms(str(exc))}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("m2mwire: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
