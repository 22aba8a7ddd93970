"""Run nginx from the system packages as the load balancer in front of gateway processes.

Each test writes its own ``nginx.conf`` into a temporary directory (pid file, logs and temp paths
included) and runs ``nginx -c <conf> -p <dir>`` in the foreground as a child process.

The configuration is the one the README recommends for replicas:

- ``proxy_buffering off`` so server-sent events reach the client as each one is written;
- ``proxy_http_version 1.1`` with ``Connection ""`` (no hop-by-hop ``close`` towards the replicas);
- a request a replica never answered goes to the next replica. For ``GET`` routes that is
  ``proxy_next_upstream error timeout http_502 http_503``. For the ``POST`` routes that call the
  provider it is ``error non_idempotent`` only: the connection was refused, or reset or closed
  before any response header. A replica stopping on SIGTERM finishes every request it has started,
  so what it resets or closes at that moment (a connection still in its accept queue, or accepted
  but not yet read) was never processed, and re-sending it is safe. Without ``non_idempotent``
  nginx answers those few requests 502 during every rolling restart under load (the tests saw about
  one in 15,000). The price: a replica that crashes (SIGKILL, OOM) after calling the provider but
  before answering has that request re-sent, as a client retrying the 502 would do anyway;
- no upstream ``keepalive`` pool: every proxied request opens its own connection, so a replica
  that stops listening never gets a request on a connection it is already closing.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

__all__ = ["Nginx", "find_nginx", "require_nginx", "start_nginx"]

_CANDIDATES = ("nginx", "/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
INSTALL_HINT = "apt-get install nginx-light (or nginx); .ci/run installs it when missing"

# One access-log line per proxied request: which replica(s) served it, for the tests to read.
_ACCESS_FORMAT = (
    'log_format replicas \'$msec $request_id "$request" $status '
    "upstream=$upstream_addr upstream_status=$upstream_status rid=$http_x_request_id';"
)


def find_nginx() -> str | None:
    for candidate in _CANDIDATES:
        found = shutil.which(candidate)
        if found is not None:
            return found
    return None


def require_nginx() -> str:
    """The nginx binary; without one, fail under CI (it installs nginx) and skip elsewhere."""
    found = find_nginx()
    if found is not None:
        return found
    message = f"nginx is not installed ({INSTALL_HINT})"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{message}; the replica tests must run in CI", pytrace=False)
    pytest.skip(message)


@attrs.define
class Nginx:
    process: subprocess.Popen[bytes]
    port: int
    directory: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def error_log(self) -> Path:
        return self.directory / "error.log"

    @property
    def access_log(self) -> Path:
        return self.directory / "access.log"

    def access_entries(self) -> list[dict[str, str]]:
        """Parsed access-log lines (fields: msec, status, upstream, upstream_status, rid)."""
        entries = []
        pattern = re.compile(
            r"(?P<msec>\S+) \S+ \"(?P<request>[^\"]*)\" (?P<status>\d+) "
            r"upstream=(?P<upstream>.*) upstream_status=(?P<upstream_status>.*) rid=(?P<rid>\S*)$"
        )
        if not self.access_log.exists():
            return entries
        for line in self.access_log.read_text().splitlines():
            match = pattern.match(line)
            if match is not None:
                entries.append(match.groupdict())
        return entries

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: nginx's fast shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _config(directory: Path, port: int, upstream_ports: Sequence[int]) -> str:
    servers = "\n".join(
        f"        server 127.0.0.1:{upstream} max_fails=1 fail_timeout=10s;"
        for upstream in upstream_ports
    )
    # Workers of a root master drop to 'nobody', which cannot write into the test's temp dirs.
    user = "user root;" if os.geteuid() == 0 else ""
    return f"""
{user}
daemon off;
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log notice;
events {{ worker_connections 1024; }}
http {{
    {_ACCESS_FORMAT}
    access_log {directory}/access.log replicas;
    client_body_temp_path {directory}/client_body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;

    upstream llmgw {{
{servers}
    }}

    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 2m;

        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_buffering off;
        proxy_read_timeout 300s;
        proxy_next_upstream_tries {len(upstream_ports)};

        # Completions and embeddings: retried on another replica only when the one tried never
        # answered (refused, or reset/closed before the response header); see the module docstring.
        location ~ ^/v1/(chat/completions|embeddings)$ {{
            proxy_pass http://llmgw;
            proxy_next_upstream error non_idempotent;
        }}

        location / {{
            proxy_pass http://llmgw;
            proxy_next_upstream error timeout http_502 http_503;
        }}
    }}
}}
"""


def _wait_listening(port: int, process: subprocess.Popen[bytes], error_log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = error_log.read_text() if error_log.exists() else ""
            raise RuntimeError(f"nginx exited with {process.returncode}: {log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            time.sleep(0.05)
        else:
            return
    raise TimeoutError(f"nginx did not listen on port {port}")


def start_nginx(directory: Path, port: int, upstream_ports: Sequence[int]) -> Nginx:
    """Start nginx on ``port`` balancing over the replicas on ``upstream_ports``."""
    binary = require_nginx()
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "nginx.conf"
    conf.write_text(_config(directory, port, upstream_ports))
    process = subprocess.Popen(
        [binary, "-c", str(conf), "-p", str(directory), "-e", str(directory / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_listening(port, process, directory / "error.log")
    return Nginx(process, port, directory)
