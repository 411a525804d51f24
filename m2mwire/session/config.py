"""Session options: what an endpoint offers in HELLO, its timers and its limits."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from m2mwire.codecs import Algorithm, Encoding, available_encodings, resolve_algorithm, resolve_encoding
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits, MiB
from m2mwire.codecs.zstdcontext import DEFAULT_LEVEL, DEFAULT_WINDOW, MAX_WINDOW, MIN_WINDOW, ZstdDictionary
from m2mwire.errors import ConfigError, EncodeError
from m2mwire.schemas.identity import ModelIdentity

__all__ = [
    "CONTROL_MESSAGE_LIMIT",
    "DEFAULT_ALGORITHMS",
    "SESSION_OPTIONS",
    "SessionConfig",
    "Timers",
    "ZstdOptions",
    "make_config",
    "transport_limit",
]

# Largest control message (HELLO, ACCEPT, REJECT, PING, PONG, CLOSE) either end accepts, whatever
# max_payload is: a real HELLO or ACCEPT is under 2 KiB, so 64 KiB leaves room for long identity
# strings, while a peer can no longer make us parse megabytes of algorithm names. It is fixed, not
# tied to max_payload, so that a small max_payload never refuses the other side's ACCEPT.
CONTROL_MESSAGE_LIMIT = 64 * 1024


def transport_limit(max_payload: int) -> int:
    """The channel's incoming message limit for a session allowing ``max_payload`` (0 = none)."""
    return max(max_payload, CONTROL_MESSAGE_LIMIT) if max_payload > 0 else 0


# Defaults that other places (the gateway, open_quic_connection(), the reconnect routes) share.
DEFAULT_MAX_PAYLOAD: Final = 16 * MiB  # largest message accepted
DEFAULT_RESUME_WINDOW: Final = 60.0  # seconds a server keeps a detached session for its client
DEFAULT_RESUME_BUFFER: Final = 16 * MiB  # DATA retained until acknowledged


# Preference order when the caller says nothing: token-efficient first, passthrough last. m2m (the
# reference 0.4's M2M v1 frames) is offered so a peer that speaks only that gets a session; automatic
# selection never prefers it to another negotiated algorithm.
DEFAULT_ALGORITHMS: tuple[Algorithm, ...] = (
    Algorithm.TOKENNATIVE,
    Algorithm.TOKEN,
    Algorithm.ZSTD,
    Algorithm.BROTLI,
    Algorithm.DICTIONARY,
    Algorithm.M2M,
    Algorithm.NONE,
)


@dataclass(frozen=True, slots=True)
class ZstdOptions:
    """Session-context zstd (algorithm ``zstd``): what this endpoint offers and how it compresses.

    ``window`` is the history each direction keeps (and the decoder memory it costs), a power of
    two from 1 KiB to 8 MiB; the session uses the smaller of both offers. ``level`` is this side's
    zstd level (1-19; the receiver does not care). ``dictionaries`` are shared dictionaries
    (:class:`ZstdDictionary` or bytes) offered to prime the contexts; the first one both sides have
    is used. ``binary=False`` asks the peer for the ``#ZS|`` text form (for text-only channels).
    ``history`` offers shared history: a message may be compressed against what both directions
    said (a reply quoted in the next request costs little); used when both peers offer it.
    """

    window: int = DEFAULT_WINDOW
    level: int = DEFAULT_LEVEL
    dictionaries: tuple[ZstdDictionary, ...] = ()
    binary: bool = True
    history: bool = True

    def __post_init__(self) -> None:
        if not MIN_WINDOW <= self.window <= MAX_WINDOW or self.window & (self.window - 1):
            raise ConfigError(
                f"zstd window={self.window}: must be a power of two from {MIN_WINDOW} to {MAX_WINDOW} bytes"
            )
        if not 1 <= self.level <= 19:
            raise ConfigError(f"zstd level={self.level}: must be 1..19")
        dictionaries = tuple(
            d if isinstance(d, ZstdDictionary) else ZstdDictionary(d) for d in self.dictionaries
        )
        object.__setattr__(self, "dictionaries", dictionaries)

    def dictionary(self, dictionary_id: str) -> ZstdDictionary | None:
        return next((d for d in self.dictionaries if d.id == dictionary_id), None)


@dataclass(frozen=True, slots=True)
class Timers:
    """The seed's session timers, in seconds; every one is configurable."""

    hello_timeout: float = 30.0  # HELLO must be answered (ACCEPT/REJECT) within this
    # A silent peer is declared gone after ping_interval + max_missed_pongs * pong_timeout = 20 s
    # (the QUIC idle timeout is 20 s too): a PING after 10 s of silence, a second one 5 s later.
    ping_interval: float = 10.0  # PING after this long without receiving anything
    pong_timeout: float = 5.0  # each PING must be answered within this
    max_missed_pongs: int = 2  # this many unanswered PINGs in a row: the connection is dead
    close_timeout: float = 5.0  # our CLOSE must be acknowledged within this
    # No DATA either way for this long closes the session; None: never (answered PINGs keep a
    # healthy idle session open).
    session_timeout: float | None = 300.0
    # One message that the transport cannot take for this long (the peer stopped reading) drops
    # the peer. The ping timers cannot see such a peer: we stop reading while our writes wait.
    write_timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Everything one endpoint brings to a session."""

    algorithms: tuple[Algorithm, ...] = DEFAULT_ALGORITHMS
    encodings: tuple[Encoding, ...] = ()  # empty = every tokenizer installed here
    preferred_encoding: Encoding | None = None  # None = the first of ``encodings``
    # The largest message we accept; 0 = announce none (limits.max_message_bytes applies).
    max_payload: int = DEFAULT_MAX_PAYLOAD
    identity: ModelIdentity | None = None  # offering one enables latent (AVP) mode
    agent_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    agent_type: str = "m2mwire-python"
    timers: Timers = Timers()
    limits: Limits = DEFAULT_LIMITS
    optimize: Literal["bytes", "tokens"] = "bytes"  # what automatic algorithm selection minimises
    token_stats: bool = False  # count cl100k tokens of every message for Session.stats (costs CPU)
    max_queue: int = 64  # received messages buffered before we stop reading (backpressure)
    # ... and their decoded size: reading also stops once this many bytes wait for the application
    # (2x the default max_payload, so two largest messages fit; at least one message always does).
    max_queue_bytes: int = 32 * MiB
    token: str | None = None  # client: credential sent in HELLO for the server's on_hello check
    zstd: ZstdOptions = ZstdOptions()  # session-context zstd, when "zstd" is among the algorithms
    # Resume (docs/PROTOCOL.md "Resume"): a server offers it while resume_window > 0 (seconds a
    # detached session waits for its client; 0 turns resume off); a client offers it with
    # connect(reconnect=...). resume_buffer_bytes bounds the DATA retained until acknowledged.
    resume_window: float = DEFAULT_RESUME_WINDOW
    resume_buffer_bytes: int = DEFAULT_RESUME_BUFFER
    resume: bool = False  # client: offer resume in HELLO (set by connect(reconnect=...))
    # Offer (and use) text DATA in binary form for large messages (docs/PROTOCOL.md §4, kind 'T').
    binary_text: bool = True

    def resolved_encodings(self) -> tuple[Encoding, ...]:
        return self.encodings or tuple(available_encodings())

    def resolved_preferred(self) -> Encoding:
        encodings = self.resolved_encodings()
        if self.preferred_encoding is not None:
            return self.preferred_encoding
        return encodings[0] if encodings else Encoding.CL100K


# ``resume`` is not a user option: connect(reconnect=...) sets it.
SESSION_OPTIONS = frozenset(SessionConfig.__dataclass_fields__) - {"resume"}
_TIMER_NAMES = tuple(Timers.__dataclass_fields__)


def make_config(options: dict[str, Any]) -> SessionConfig:
    """Build a SessionConfig from keyword options, accepting names in any spelling we know.

    ``timers`` may be a :class:`Timers` or a dict of its fields. Unknown options are an error, so a
    typo never silently falls back to a default.
    """
    unknown = set(options) - SESSION_OPTIONS
    if unknown:
        raise ConfigError(
            f"unknown session option(s): {', '.join(sorted(unknown))}; "
            f"session options: {', '.join(sorted(SESSION_OPTIONS))}"
        )
    opts = dict(options)
    if "algorithms" in opts:
        algs = _resolved("algorithms", resolve_algorithm, opts["algorithms"])
        if not algs:
            raise ConfigError("algorithms= must name at least one algorithm")
        if Algorithm.ZLIB in algs:
            raise ConfigError("algorithms=: zlib (#M2M[v2.0]) is deprecated: it is decoded but never offered")
        opts["algorithms"] = algs
    if "encodings" in opts:
        opts["encodings"] = _resolved("encodings", resolve_encoding, opts["encodings"])
    if opts.get("preferred_encoding") is not None:
        (opts["preferred_encoding"],) = _resolved(
            "preferred_encoding", resolve_encoding, opts["preferred_encoding"]
        )
    for name in ("agent_id", "agent_type"):
        if name in opts and not isinstance(opts[name], str):
            raise ConfigError(f"{name}= takes a str, not {opts[name]!r}")
    for name in ("token_stats",):
        if name in opts and not isinstance(opts[name], bool):
            raise ConfigError(f"{name}= takes True or False, not {opts[name]!r}")
    if opts.get("optimize", "bytes") not in ("bytes", "tokens"):
        # Checked here rather than at the first send(), where it used to fail.
        raise ConfigError(f"optimize= takes 'bytes' or 'tokens', not {opts['optimize']!r}")
    if isinstance(opts.get("timers"), dict):
        wrong = sorted(set(opts["timers"]) - set(_TIMER_NAMES))
        if wrong:
            raise ConfigError(f"unknown timer(s) {', '.join(wrong)}; timers: {', '.join(_TIMER_NAMES)}")
        opts["timers"] = replace(Timers(), **opts["timers"])
    timers = opts.get("timers")
    if timers is not None and not isinstance(timers, Timers):
        raise ConfigError(f"timers= takes a Timers or a dict of its fields, not {type(timers).__name__}")
    for name in _TIMER_NAMES:
        value = getattr(timers or Timers(), name)
        if name == "session_timeout" and value is None:
            continue  # no idle close
        if (
            isinstance(value, bool)
            or not isinstance(value, int if name == "max_missed_pongs" else int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            what = "a whole count above 0" if name == "max_missed_pongs" else "a number above 0 (seconds)"
            raise ConfigError(f"timer {name} takes {what}, not {value!r}")
    window = opts.get("resume_window", DEFAULT_RESUME_WINDOW)
    if (
        isinstance(window, bool)
        or not isinstance(window, int | float)
        or not math.isfinite(window)
        or window < 0
    ):
        # NaN compared false with everything and turned resume off unsaid; inf kept a detached
        # session, and what it retains, for good.
        raise ConfigError(
            f"resume_window= takes a finite number of seconds (0 turns resume off), not {window!r}"
        )
    if not isinstance(opts.get("binary_text", True), bool):
        raise ConfigError(f"binary_text= takes True or False, not {opts['binary_text']!r}")
    buffer = opts.get("resume_buffer_bytes", DEFAULT_RESUME_BUFFER)
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
        raise ConfigError(f"resume_buffer_bytes= takes a number of bytes above 0, not {buffer!r}")
    max_payload = opts.get("max_payload", 0)
    if isinstance(max_payload, bool) or not isinstance(max_payload, int) or max_payload < 0:
        raise ConfigError(
            f"max_payload= takes a number of bytes (0 = announce none: limits.max_message_bytes applies), "
            f"not {max_payload!r}"
        )
    for name in ("max_queue", "max_queue_bytes"):
        value = opts.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}= takes a number above 0, not {value!r}")
    if isinstance(opts.get("zstd"), dict):
        try:
            opts["zstd"] = ZstdOptions(**opts["zstd"])
        except TypeError as exc:  # an unknown key
            keys = ", ".join(ZstdOptions.__dataclass_fields__)
            raise ConfigError(f"zstd= takes a ZstdOptions or a dict of its fields ({keys}): {exc}") from None
    elif "zstd" in opts and not isinstance(opts["zstd"], ZstdOptions):
        raise ConfigError(f"zstd= takes a ZstdOptions or a dict of its fields, not {opts['zstd']!r}")
    config = SessionConfig(**opts)
    if config.preferred_encoding is not None and config.preferred_encoding not in config.resolved_encodings():
        raise ConfigError(
            f"preferred_encoding= {config.preferred_encoding.value} is not among the encodings offered"
        )
    return config


def _resolved(name: str, resolve: Callable[[Any], Any], value: Any) -> tuple[Any, ...]:
    """Each name of ``value`` (a str or an iterable of them) resolved; ConfigError naming the
    keyword (the resolvers' EncodeError says which names exist)."""
    try:
        return tuple(resolve(v) for v in _as_iter(value))
    except (EncodeError, TypeError) as exc:
        raise ConfigError(f"{name}=: {exc}") from None


def _as_iter(value: Any) -> Iterable[Any]:
    return (value,) if isinstance(value, str) else value
