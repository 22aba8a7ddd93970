"""The response cache: exact answers replayed by key, isolated per API key by default.

``key`` makes the cache key, ``entry`` the stored form and its replays (``messages`` and
``responses``: those of a provider's own Messages and Responses answers), ``store`` and ``redis``
the two backends behind one protocol, ``flight`` one upstream call for identical requests in
flight, ``controls`` the caller's Cache-Control, and ``policy`` puts them together.
"""
