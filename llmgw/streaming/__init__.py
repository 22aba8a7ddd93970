"""Relaying a provider's server-sent events to the client as they arrive."""
