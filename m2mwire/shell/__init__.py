"""The asyncio shell around the sans-I/O session core, one module per piece.

- :mod:`m2mwire.shell.session`: ``Session``, moving messages between a channel and the core.
- :mod:`m2mwire.shell.client`: ``connect()`` (opening a channel through the transport registry).
- :mod:`m2mwire.shell.server`: ``serve()``, ``Server``; :mod:`~m2mwire.shell.serverstats` its stats.
- :mod:`m2mwire.shell.hosting`: what a ``Server`` needs of the sessions it hosts.
- :mod:`m2mwire.shell.sessionlog`, :mod:`~m2mwire.shell.warmup`: session log lines, tokenizer
  preloading.

``m2mwire.api`` re-exports the public names; nothing here is imported by ``import m2mwire``.
"""
