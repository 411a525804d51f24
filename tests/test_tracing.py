"""OpenTelemetry: spans per session and request, trace context across agents (real SDK, in memory)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from m2mwire import tracing
from m2mwire.api import Session, connect
from tests.test_api import (
    client_opts,
    running,
    scheme,  # noqa: F401 (the ws/quic/nats fixture)
)

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process: install ours the first time.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


async def answer(session: Session) -> None:
    tracer = trace.get_tracer("handler")
    async for message in session:
        with tracer.start_as_current_span("handler-work"):
            pass
        if message.request_id is not None:
            await session.reply(message, {"ok": True})


async def test_one_trace_crosses_both_agents(scheme: str, spans: InMemorySpanExporter) -> None:
    assert tracing.ENABLED
    tracer = trace.get_tracer("client-app")
    async with running(answer, scheme) as server:
        with tracer.start_as_current_span("client-root") as root:
            async with connect(server.url, **client_opts(server)) as session:
                reply = await session.request({"q": 1}, timeout=10)
                assert reply.json() == {"ok": True}
        for _ in range(100):
            if server.active_sessions == 0:
                break
            await asyncio.sleep(0.01)
    finished = {s.name: s for s in spans.get_finished_spans()}
    trace_id = root.get_span_context().trace_id
    names = {"m2mwire.session", "m2mwire.request", "m2mwire.reply", "handler-work"}
    assert names <= set(finished), sorted(finished)
    by_name: dict[str, list[object]] = {}
    for s in spans.get_finished_spans():
        by_name.setdefault(s.name, []).append(s)
    # Every span of both agents belongs to the client's trace.
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {trace_id}, [
        (s.name, s.kind, s.context.trace_id == trace_id) for s in spans.get_finished_spans()
    ]
    assert len(by_name["m2mwire.session"]) == 2  # the client's and the server's
    request = finished["m2mwire.request"]
    reply = finished["m2mwire.reply"]
    assert reply.parent is not None and reply.parent.span_id == request.context.span_id
    server_session = next(s for s in by_name["m2mwire.session"] if s.kind is trace.SpanKind.SERVER)
    work = finished["handler-work"]
    assert work.parent is not None and work.parent.span_id == server_session.context.span_id


async def test_requests_carry_a_traceparent(scheme: str, spans: InMemorySpanExporter) -> None:
    seen: list[object] = []

    async def record(session: Session) -> None:
        async for message in session:
            seen.append(message.traceparent)
            await session.reply(message, "ok")

    async with running(record, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:
            await session.request("q", timeout=10)
    # The request span itself is current while sending: its context travels.
    assert seen and isinstance(seen[0], str) and seen[0].startswith("00-")


def test_without_the_extra_sessions_run_and_send_no_trace_fields(tmp_path: object) -> None:
    """Simulates a machine without opentelemetry (its import fails) in a fresh interpreter."""
    code = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # import opentelemetry now raises ImportError
import m2mwire
from m2mwire import tracing
assert tracing.ENABLED is False

async def main():
    seen = []
    async def handler(session):
        async for message in session:
            seen.append(message.traceparent)
            await session.reply(message, "ok")
    async with m2mwire.serve(handler, "ws://127.0.0.1:0") as server:
        async with m2mwire.connect(server.url) as session:
            assert (await session.request("q", timeout=10)).text == "ok"
    assert seen == [None], seen
    assert "opentelemetry" not in {m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}
    print("ok")

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
