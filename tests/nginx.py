"""Run nginx from the system packages, with the shipped docker/nginx.conf, in front of gateways.

Each test renders docker/nginx.conf for this machine (``render_shipped_config``: loopback ports
instead of compose service names, its pid, logs and temp paths in a temporary directory) and runs
``nginx -c <conf> -p <dir>`` in the foreground as a child process. Everything that decides what a
client sees during a restart is the shipped file's own: the keep-alive pool, ``proxy_next_upstream``
and its tries, ``max_fails``/``fail_timeout``, the timeouts and ``proxy_buffering off``. So the
replica tests (tests/test_replicas.py) prove the configuration compose runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from tests.processes import REPO_ROOT, LoopbackProcess, listening, wait_until

__all__ = ["Nginx", "find_nginx", "render_shipped_config", "require_nginx", "start_nginx"]

_CANDIDATES = ("nginx", "/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
INSTALL_HINT = "apt-get install nginx-light (or nginx); .ci/run installs it when missing"

# A line of the shipped access log (log_format upstreamlog): which replica(s) served a request.
_ACCESS_LINE = re.compile(
    r"\S+ \"(?P<request>[^\"]*)\" (?P<status>\d+) \d+ request_id=(?P<rid>\S*) "
    r"upstream=(?P<upstream>.*) upstream_status=(?P<upstream_status>.*) request_time=\S+ "
    r"upstream_time=.*$"
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
class Nginx(LoopbackProcess):
    directory: Path

    @property
    def error_log(self) -> Path:
        return self.directory / "error.log"

    @property
    def access_log(self) -> Path:
        return self.directory / "access.log"

    def access_entries(self) -> list[dict[str, str]]:
        """Parsed access-log lines (fields: request, status, rid, upstream, upstream_status)."""
        entries: list[dict[str, str]] = []
        if not self.access_log.exists():
            return entries
        for line in self.access_log.read_text().splitlines():
            match = _ACCESS_LINE.match(line)
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


SHIPPED_CONFIG = REPO_ROOT / "docker" / "nginx.conf"

# The shipped upstream's servers are compose service names, resolved by Docker's DNS.
_SHIPPED_SERVER = re.compile(
    r"^[ \t]*server[ \t]+gateway-\d+:\d+[ \t]+resolve\b(?P<params>[^;]*);\n", re.M
)


def _replace_once(text: str, pattern: str, replacement: str) -> str:
    """Replace the one match of ``pattern``; fail when docker/nginx.conf no longer has it."""
    rendered, count = re.subn(pattern, lambda _: replacement, text, flags=re.M)
    assert count == 1, f"docker/nginx.conf: expected one match of {pattern!r}, found {count}"
    return rendered


def render_shipped_config(directory: Path, port: int, upstream_ports: Sequence[int]) -> str:
    """docker/nginx.conf as it would run here: only what is specific to Docker is changed.

    The replicas are 127.0.0.1 ports instead of compose service names (with the shipped servers'
    parameters: max_fails, fail_timeout...), Docker's resolver goes, nginx listens on ``port`` on
    loopback, stays in the foreground, and keeps its pid, logs and temp files in ``directory``.
    Every proxying directive, timeout, retry rule and the keep-alive pool are the shipped ones.
    """
    text = SHIPPED_CONFIG.read_text()
    found = {match["params"].strip() for match in _SHIPPED_SERVER.finditer(text)}
    assert len(found) == 1, f"docker/nginx.conf: the replicas' server lines differ: {found}"
    (params,) = found
    servers = "".join(
        f"        server 127.0.0.1:{upstream} {params};\n" for upstream in upstream_ports
    )
    shipped_servers = f"(?:{_SHIPPED_SERVER.pattern})+"
    text = _replace_once(text, shipped_servers, servers)
    text = _replace_once(text, r"^[ \t]*resolver[ \t][^;]*;\n", "")
    text = _replace_once(text, r"^error_log[ \t][^;]*;", f"error_log {directory}/error.log notice;")
    text = _replace_once(
        text, r"access_log /dev/stdout (?=\w+;)", f"access_log {directory}/access.log "
    )
    text = _replace_once(text, r"listen 8080;", f"listen 127.0.0.1:{port};")
    temp_paths = "".join(
        f"    {kind}_temp_path {directory}/{kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    text = _replace_once(text, r"^http \{\n", "http {\n" + temp_paths)
    # Workers of a root master drop to 'nobody', which cannot write into the test's temp dirs.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"{user}daemon off;\npid {directory}/nginx.pid;\n{text}"


def _wait_listening(port: int, process: subprocess.Popen[bytes], error_log: Path) -> None:
    def running() -> bool:
        if process.poll() is None:
            return True
        log = error_log.read_text() if error_log.exists() else ""
        raise RuntimeError(f"nginx exited with {process.returncode}: {log}")

    wait_until(lambda: running() and listening(port), within=10, what=f"nginx on port {port}")


def start_nginx(directory: Path, port: int, upstream_ports: Sequence[int]) -> Nginx:
    """Start nginx with the shipped configuration on ``port``, over the replicas on ``upstream_ports``."""
    binary = require_nginx()
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "nginx.conf"
    conf.write_text(render_shipped_config(directory, port, upstream_ports))
    process = subprocess.Popen(
        [binary, "-c", str(conf), "-p", str(directory), "-e", str(directory / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_listening(port, process, directory / "error.log")
    return Nginx(process, port, directory)
