"""The ``m2mwire`` console command: demo, serve, send, compress, decompress, schema."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _read(value: str) -> str:
    return sys.stdin.read() if value == "-" else value


def _cmd_demo(_: argparse.Namespace) -> int:
    from m2mwire.demo import run_demo

    asyncio.run(run_demo())
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from m2mwire.api import Session, serve
    from m2mwire.demo import answer

    async def agent(session: Session) -> None:
        print(f"session {session.info.session_id} from {session.remote_address}: {session.info}", flush=True)
        async for message in session:
            await session.send(answer(message))

    async def run() -> None:
        options: dict[str, Any] = {}
        if args.certfile:
            options.update(certfile=args.certfile, keyfile=args.keyfile)
        async with serve(agent, args.url, **options) as server:
            print(
                f"serving on {server.url}"
                + (f" (fingerprint {server.fingerprint})" if server.fingerprint else ""),
                flush=True,
            )
            await asyncio.Future()

    logging.basicConfig(level=logging.INFO)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


def _cmd_send(args: argparse.Namespace) -> int:
    from m2mwire.api import connect

    content: Any = _read(args.message)
    if args.json:
        content = json.loads(content)

    async def run() -> None:
        options: dict[str, Any] = {"token_stats": True}
        for name in ("fingerprint", "cafile"):
            if getattr(args, name):
                options[name] = getattr(args, name)
        if args.insecure:
            options["insecure"] = True
        async with connect(args.url, **options) as session:
            sent = await session.send(content, algorithm=args.algorithm)
            print(
                f"sent via {sent.algorithm}: {sent.original_bytes} -> {sent.wire_bytes} bytes",
                file=sys.stderr,
            )
            reply = await asyncio.wait_for(session.recv(), args.timeout)
            print(json.dumps(reply.value) if reply.kind == "json" else reply.text)

    asyncio.run(run())
    return 0


def _cmd_compress(args: argparse.Namespace) -> int:
    from m2mwire.codecs import compress

    print(compress(_read(args.content), args.algorithm, encoding=args.encoding, optimize=args.optimize))
    return 0


def _cmd_decompress(args: argparse.Namespace) -> int:
    from m2mwire.codecs import decompress

    print(decompress(_read(args.wire).rstrip("\n")))
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from m2mwire.schemas.messages import json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if args.stdout:
        print(text, end="")
    else:
        path = Path(__file__).parent / "schemas" / "session.schema.json"
        path.write_text(text)
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="m2mwire", description="Agent-to-agent sessions with M2M wire formats"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("demo", help="run a server and a client on 127.0.0.1 and show what goes over the wire")

    p = sub.add_parser("serve", help="run an answering agent")
    p.add_argument("url", nargs="?", default="ws://127.0.0.1:8765", help="ws://, wss:// or quic://host:port")
    p.add_argument("--certfile")
    p.add_argument("--keyfile")

    p = sub.add_parser("send", help="open a session, send one message, print the reply")
    p.add_argument("url")
    p.add_argument("message", help="the content, or - for standard input")
    p.add_argument("--json", action="store_true", help="parse the content as JSON")
    p.add_argument("--algorithm", help="tokennative, token, brotli, dictionary or none (default: automatic)")
    p.add_argument("--fingerprint", help="pin the server certificate's SHA-256 (wss://, quic://)")
    p.add_argument("--cafile")
    p.add_argument(
        "--insecure", action="store_true", help="DO NOT verify the server certificate (local testing)"
    )
    p.add_argument("--timeout", type=float, default=30.0)

    p = sub.add_parser("compress", help="print the wire form of some content")
    p.add_argument("content", help="the content, or - for standard input")
    p.add_argument("--algorithm", default=None)
    p.add_argument("--encoding", default="cl100k_base")
    p.add_argument("--optimize", choices=["bytes", "tokens"], default="bytes")

    p = sub.add_parser("decompress", help="decode a wire string")
    p.add_argument("wire", help="the wire string, or - for standard input")

    p = sub.add_parser("schema", help="regenerate m2mwire/schemas/session.schema.json")
    p.add_argument("--stdout", action="store_true")

    args = parser.parse_args(argv)
    handlers = {
        "demo": _cmd_demo,
        "serve": _cmd_serve,
        "send": _cmd_send,
        "compress": _cmd_compress,
        "decompress": _cmd_decompress,
        "schema": _cmd_schema,
    }
    from m2mwire.errors import M2MError

    try:
        return handlers[args.command](args)
    except M2MError as exc:
        print(f"m2mwire: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
