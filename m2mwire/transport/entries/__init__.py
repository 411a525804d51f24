"""Each built-in transport's ``open()`` and ``listen()``, as m2mwire.transport.registry calls them.

One module per transport, imported by the registry when its scheme is first opened or listened
on (looking a scheme up to check a URL or its options loads none of them).
"""
