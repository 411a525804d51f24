"""OpenTelemetry spans for sessions and requests, when the ``otel`` extra is installed.

``pip install 'm2mwire[otel]'`` adds ``opentelemetry-api``; with an SDK configured by the
application, every session gets a span (``m2mwire.session``, from the handshake's end to the
close) and every ``request()``/``stream()`` a client span (``m2mwire.request``), and the answering
side a server span per answer (``m2mwire.reply``). The W3C trace context travels in HELLO and on
requests as ``traceparent``/``tracestate`` fields (docs/PROTOCOL.md), so one trace crosses agents.

Without the package, :data:`ENABLED` is False and every function here returns at once: the
shell tests that flag before calling in, so sessions pay one attribute read, not an import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # the optional extra is not installed
    ENABLED = False
else:
    ENABLED = True

if TYPE_CHECKING:
    from m2mwire.session.events import SessionInfo

__all__ = ["ENABLED", "carrier", "end_session", "reply_span", "request_span", "start_session", "use"]

_TRACER_NAME = "m2mwire"


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``, maybe ``tracestate``)."""
    if not ENABLED:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return {k: v for k, v in headers.items() if k in ("traceparent", "tracestate")}


def _extract(traceparent: str | None, tracestate: str | None) -> Any:
    headers = {}
    if traceparent:
        headers["traceparent"] = traceparent[:128]  # a valid one is 55 characters
        if tracestate:
            headers["tracestate"] = tracestate[:512]  # W3C allows 512 characters
    return propagate.extract(headers) if headers else None


def start_session(info: SessionInfo, remote: str, traceparent: str | None, tracestate: str | None) -> Any:
    """Start the session's span (parented by the peer's HELLO context on a server) and make it
    current in the calling task; returns a token for :func:`end_session`, or None."""
    if not ENABLED:
        return None
    kind = trace.SpanKind.SERVER if info.role.value == "server" else trace.SpanKind.CLIENT
    span = trace.get_tracer(_TRACER_NAME).start_span(
        "m2mwire.session",
        context=_extract(traceparent, tracestate),
        kind=kind,
        attributes={
            "m2mwire.session_id": info.session_id,
            "m2mwire.role": info.role.value,
            "m2mwire.peer_agent_id": info.peer_agent_id[:128],
            "m2mwire.algorithms": ",".join(a.value for a in info.algorithms),
            "m2mwire.encoding": info.encoding.value,
            "m2mwire.mode": info.mode,
            "net.peer.name": remote,
        },
    )
    return span


def use(span: Any) -> contextlib.AbstractContextManager[Any]:
    """Make ``span`` the current span for the block (a no-op for None)."""
    if span is None or not ENABLED:
        return contextlib.nullcontext()
    return trace.use_span(span, end_on_exit=False)


def end_session(span: Any, code: str, reason: str, error: bool) -> None:
    if span is None:
        return
    span.set_attribute("m2mwire.close_code", code)
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{code}: {reason}"[:200]))
    span.end()


@contextlib.contextmanager
def request_span(request_id: str) -> Iterator[dict[str, str]]:
    """A client span around one request; yields the trace headers to send with it."""
    if not ENABLED:
        yield {}
        return
    with trace.get_tracer(_TRACER_NAME).start_as_current_span(
        "m2mwire.request", kind=trace.SpanKind.CLIENT, attributes={"m2mwire.request_id": request_id}
    ):
        yield carrier()


@contextlib.contextmanager
def reply_span(request_id: str, traceparent: str | None, tracestate: str | None) -> Iterator[None]:
    """A server span around one answer, parented by the trace context the request carried."""
    if not ENABLED:
        yield
        return
    parent = _extract(traceparent, tracestate)
    token = otel_context.attach(parent) if parent is not None else None
    try:
        with trace.get_tracer(_TRACER_NAME).start_as_current_span(
            "m2mwire.reply", kind=trace.SpanKind.SERVER, attributes={"m2mwire.request_id": request_id}
        ):
            yield
    finally:
        if token is not None:
            otel_context.detach(token)
