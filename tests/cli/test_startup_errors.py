"""Start-up errors are one line on stderr and exit status 2, never a traceback (real processes).

A database that refuses the connection (unknown database or role, wrong password), a BIND_ADDR
that is taken or not this host's, a revision that does not exist, and a data directory of the
embedded database that cannot be written.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.conftest import with_database
from tests.fake_venice import FAKE_VENICE_KEY
from tests.processes import clean_env, free_port, run_llmgw

# Each test runs llmgw's CLI as a process (a second or more each): run by .ci/run's `pytest -m slow`.
pytestmark = pytest.mark.slow


def assert_one_line(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("llmgw: ")
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def serve(database_url: str, bind: str | None = None) -> subprocess.CompletedProcess[str]:
    env = clean_env(
        DATABASE_URL=database_url,
        VENICE_API_KEY=FAKE_VENICE_KEY,
        BIND_ADDR=bind or f"127.0.0.1:{free_port()}",
    )
    return run_llmgw("serve", env=env, timeout=60)


def with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@pytest.mark.parametrize("command", [["serve"], ["keys", "list"], ["db", "upgrade"]])
def test_an_unknown_database_is_one_line(command: list[str], database_url: str) -> None:
    url = with_database(database_url, "llmgw_no_such_database")
    env = clean_env(DATABASE_URL=url, VENICE_API_KEY=FAKE_VENICE_KEY)
    result = run_llmgw(*command, env=env, timeout=60)
    assert_one_line(result, 'database "llmgw_no_such_database" does not exist', "DATABASE_URL")


def test_an_unknown_role_is_one_line(database_url: str) -> None:
    result = serve(with_user(database_url, "llmgw_no_such_role"))
    assert_one_line(result, 'role "llmgw_no_such_role" does not exist')


@pytest.fixture
def password_refusing_server() -> Iterator[int]:
    """A PostgreSQL wire-protocol peer that asks for a password and refuses it, as a server with
    password authentication does (SQLSTATE 28P01). The suite's servers trust every local user."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def packet(kind: bytes, payload: bytes) -> bytes:
        return kind + struct.pack("!i", len(payload) + 4) + payload

    def answer(connection: socket.socket) -> None:
        with connection:
            length, code = struct.unpack("!ii", connection.recv(8))
            if code == 80877103:  # SSLRequest: no TLS here, then the real startup message
                connection.sendall(b"N")
                length = struct.unpack("!i", connection.recv(4))[0]
                connection.recv(length - 4)
            else:
                connection.recv(length - 8)
            connection.sendall(packet(b"R", struct.pack("!i", 3)))  # cleartext password, please
            connection.recv(4096)
            fields = [
                b"SFATAL",
                b"VFATAL",
                b"C28P01",
                b'Mpassword authentication failed for user "llmgw"',
            ]
            connection.sendall(packet(b"E", b"\0".join(fields) + b"\0\0"))

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            answer(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


def test_a_wrong_password_is_one_line_without_the_password(password_refusing_server: int) -> None:
    url = f"postgresql://llmgw:not-the-password@127.0.0.1:{password_refusing_server}/llmgw"
    line = assert_one_line(serve(url), 'password authentication failed for user "llmgw"')
    assert "not-the-password" not in line


def test_a_port_in_use_fails_before_listening(database_url: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = serve(database_url, f"127.0.0.1:{port}")
    assert_one_line(result, f"127.0.0.1:{port}", "Address already in use", "BIND_ADDR")
    assert "listening on" not in result.stderr


def test_an_address_this_host_does_not_have_is_one_line(database_url: str) -> None:
    result = serve(database_url, "192.0.2.1:3000")  # TEST-NET-1: never a local address
    assert_one_line(result, "192.0.2.1:3000", "Cannot assign requested address", "BIND_ADDR")


@pytest.mark.parametrize("action", ["upgrade", "downgrade"])
def test_a_bad_revision_is_one_line(action: str, database_url: str) -> None:
    result = run_llmgw("db", action, "nonsense", env=clean_env(DATABASE_URL=database_url))
    assert_one_line(result, f"db {action} nonsense", "nonsense")


RunReadOnly = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[tuple[Path, RunReadOnly]]:
    """A directory llmgw cannot write in, and how to run llmgw so that it cannot.

    Not as root: the directory's mode says so. As root (who may write anyway): a read-only tmpfs
    mounted over it in a private mount namespace, as a read-only volume in a container is.
    """
    directory = tmp_path / "read-only"
    directory.mkdir()
    wrapper: list[str] = []
    if os.geteuid() != 0:
        directory.chmod(0o555)
    else:
        if shutil.which("unshare") is None:
            pytest.skip("root, and no unshare to mount a read-only file system")
        wrapper = ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o ro none {directory} && exec \"$@\"", "sh"]  # fmt: skip
        probe = subprocess.run([*wrapper, "true"], capture_output=True, check=False)
        if probe.returncode != 0:
            pytest.skip(f"cannot mount a read-only file system: {probe.stderr!r}")

    def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*wrapper, sys.executable, "-m", "llmgw", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    yield directory, run
    directory.chmod(0o755)


@pytest.mark.parametrize("command", [["serve"], ["keys", "list"], ["db", "upgrade"]])
def test_a_data_dir_that_cannot_be_written_is_one_line(
    command: list[str], read_only_dir: tuple[Path, RunReadOnly]
) -> None:
    directory, run = read_only_dir
    env = clean_env(
        LLMGW_DATA_DIR=str(directory / "data"),
        VENICE_API_KEY=FAKE_VENICE_KEY,
        BIND_ADDR=f"127.0.0.1:{free_port()}",
    )
    line = assert_one_line(run(*command, env=env), "cannot write to", str(directory / "data"))
    assert "LLMGW_DATA_DIR" in line and "DATABASE_URL" in line
