"""The suite's gateway processes never collide with a gateway running on the default port, nor
inherit the gateway settings of the shell that runs the tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from llmgw.compat import PUBLIC_APIS_ONLY_VARIABLE
from llmgw.config import ENVIRONMENT_VARIABLES
from tests.conftest import with_database
from tests.fake_venice import FAKE_VENICE_KEY
from tests.processes import NO_VENICE_URL, clean_env, run_llmgw

DEFAULT_BIND = next(var.default for var in ENVIRONMENT_VARIABLES if var.name == "BIND_ADDR")


@pytest.fixture
def default_port_taken() -> Iterator[None]:
    """The default port in use, as by a gateway someone runs on this machine (or it already is)."""
    assert DEFAULT_BIND is not None
    host, _, port = DEFAULT_BIND.rpartition(":")
    try:
        held = socket.create_server((host, int(port)))
    except OSError:  # taken already: the case under test
        yield
        return
    with held:
        yield


def test_no_gateway_setting_is_inherited_and_bind_addr_is_a_free_loopback_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ENVIRONMENT_VARIABLES:
        monkeypatch.setenv(var.name, "from-the-shell")
    env = clean_env()
    inherited = [var.name for var in ENVIRONMENT_VARIABLES if env.get(var.name) == "from-the-shell"]
    assert inherited == [PUBLIC_APIS_ONLY_VARIABLE]  # the suite's mode, and only it, is kept
    host, _, port = env["BIND_ADDR"].rpartition(":")
    assert host == "127.0.0.1" and env["BIND_ADDR"] != DEFAULT_BIND
    with socket.create_server((host, int(port))):  # free
        pass
    assert env["VENICE_BASE_URL"] == NO_VENICE_URL
    assert clean_env(BIND_ADDR="127.0.0.1:1")["BIND_ADDR"] == "127.0.0.1:1"  # a test's own wins


@pytest.mark.usefixtures("default_port_taken")
def test_serve_in_a_test_reaches_its_own_error_while_the_default_port_is_taken(
    database_url: str,
) -> None:
    url = with_database(database_url, "llmgw_no_such_database")
    result = run_llmgw(
        "serve", env=clean_env(DATABASE_URL=url, VENICE_API_KEY=FAKE_VENICE_KEY), timeout=60
    )
    assert result.returncode == 2
    assert 'database "llmgw_no_such_database" does not exist' in result.stderr, result.stderr
