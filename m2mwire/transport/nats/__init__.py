"""NATS transport: sessions carried over a NATS server or cluster (see docs/PROTOCOL.md, "NATS mapping").

``options`` and ``frames`` import nothing from nats-py, so URL and option parsing stays cheap for
users of the other transports; ``bus``, ``channel`` and ``service`` need the ``nats`` extra.
"""
