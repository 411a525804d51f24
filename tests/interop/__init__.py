"""Interoperability with the reference AVP SDK (`avp` 0.6.2): in-process codec checks and a live HTTP peer."""
