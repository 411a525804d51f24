"""Preloading the tokenizers a session will use, off the event loop (client and server alike)."""

from __future__ import annotations

import asyncio

from m2mwire.codecs import Algorithm
from m2mwire.errors import M2MError
from m2mwire.session.config import SessionConfig
from m2mwire.session.events import SessionInfo
from m2mwire.shell.sessionlog import log

__all__ = ["warm_tokenizers"]


async def warm_tokenizers(info: SessionInfo, config: SessionConfig) -> None:
    """Build the tokenizers this session will use before the application's first send: a build
    takes ~0.2 s, which would otherwise stall the event loop (and every session on it) at the
    first TokenNative message. It runs in a worker thread, once per process and encoding."""
    from m2mwire.codecs import Encoding
    from m2mwire.codecs.tokenizers import is_loaded, preload

    wanted = []
    if Algorithm.TOKENNATIVE in info.algorithms:
        wanted.append(info.encoding)
    if config.token_stats:
        wanted.append(Encoding.CL100K)
    missing = [e for e in wanted if not is_loaded(e)]
    if missing:
        try:
            await asyncio.to_thread(preload, missing)
        except M2MError as exc:  # e.g. TokenizerUnavailable: the first send reports it properly
            log.debug("could not preload tokenizers %s: %s", missing, exc)
