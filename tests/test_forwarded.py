"""A reverse proxy's forwarded headers: believed only when TRUST_FORWARDED_HEADERS says so."""

from __future__ import annotations

from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from llmgw.forwarded import client_address, is_https


def request(*headers: tuple[str, str]) -> web.Request:
    """A plain-HTTP request from the proxy at 192.0.2.10 with these headers."""
    transport = mock.Mock()
    transport.get_extra_info.side_effect = {"peername": ("192.0.2.10", 40000)}.get
    return make_mocked_request(
        "POST", "/console/sign-in", CIMultiDict(headers), transport=transport
    )


@pytest.mark.parametrize(
    ("headers", "trusted"),
    [
        ((("X-Forwarded-Proto", "https"),), True),
        ((("X-Forwarded-Proto", "HTTPS, http"),), True),
        ((("Forwarded", 'for="[2001:db8::1]";proto=https'),), True),
        ((("X-Forwarded-Proto", "http"),), False),
        ((), False),
    ],
)
def test_https_behind_a_trusted_proxy(headers: tuple[tuple[str, str], ...], trusted: bool) -> None:
    assert is_https(request(*headers), trust_forwarded=True) is trusted
    assert is_https(request(*headers), trust_forwarded=False) is False


def test_the_client_address_is_the_one_the_proxy_appended() -> None:
    spoofed = request(("X-Forwarded-For", "10.9.9.9, 203.0.113.7"))
    assert client_address(spoofed, trust_forwarded=True) == "203.0.113.7"
    assert client_address(spoofed, trust_forwarded=False) == "192.0.2.10"
    two_headers = request(("X-Forwarded-For", "10.9.9.9"), ("X-Forwarded-For", "2001:db8::7"))
    assert client_address(two_headers, trust_forwarded=True) == "2001:db8::7"
    for junk in ("", "not-an-address", "203.0.113.7, ", "x" * 10_000):
        peer = request(("X-Forwarded-For", junk))
        assert client_address(peer, trust_forwarded=True) == "192.0.2.10"
