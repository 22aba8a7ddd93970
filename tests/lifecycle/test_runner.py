"""The serving process's socket: connections a busy process has not accepted yet wait in the kernel."""

from __future__ import annotations

import os
import select
import signal
import socket
import time

from tests.conftest import StartGateways, gateway_env
from tests.fake_venice import FakeVenice

# More than aiohttp's default listen backlog (128), which its site used to set again over serve's
# own; fewer than the test process's soft limit of open files (often 1,024) allows.
CONNECTIONS = 900


def handshaken(sockets: list[socket.socket], within: float) -> int:
    """How many of the connecting ``sockets`` completed their handshake within ``within`` s."""
    pending, done = {s.fileno(): s for s in sockets}, 0
    deadline = time.monotonic() + within
    poller = select.poll()
    for fileno in pending:
        poller.register(fileno, select.POLLOUT)
    while pending and (left := deadline - time.monotonic()) > 0:
        for fileno, _ in poller.poll(left * 1000):
            poller.unregister(fileno)
            if pending.pop(fileno).getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                done += 1
    return done


def test_a_process_that_is_not_accepting_has_hundreds_of_connections_queued_not_dropped(
    gateway_processes: StartGateways, database_url: str, fake_venice: FakeVenice
) -> None:
    (gateway,) = gateway_processes(gateway_env(database_url, fake_venice.base_url))
    sockets = [socket.socket() for _ in range(CONNECTIONS)]
    # Stopped, the process accepts nothing, as when a burst outpaces a busy event loop: each
    # handshake is then the kernel's alone, done at once if the queue has room and dropped (the
    # caller retries after 1 s, 3 s, ...) if it is full.
    os.kill(gateway.process.pid, signal.SIGSTOP)
    try:
        for sock in sockets:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", gateway.port))
        queued = handshaken(sockets, within=5.0)
    finally:
        os.kill(gateway.process.pid, signal.SIGCONT)
        for sock in sockets:
            sock.close()
    assert queued == CONNECTIONS
    gateway.wait_ready()  # and it serves on
