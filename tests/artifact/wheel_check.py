"""The wheel check .ci/run runs: the built wheel, installed (production, no extras) into a fresh
venv, used from a directory outside the checkout as an operator would.

    python -m tests.artifact.wheel_check [--wheel PATH] [--postgres ADMIN_URL]

Checks, in order: the wheel holds every module of llmgw/ and every migration; ``llmgw --version``;
``keys create`` and ``serve`` on the embedded database, ``llmgw smoke`` (with the ``BIND_ADDR`` and
``LLMGW_KEY`` the README exports) and one chat completion through the fake upstream
(tests/fake_venice.py, run by the venv's own Python); ``db upgrade``, ``db current`` and
``keys create`` against a throwaway database on a real PostgreSQL server; a bad revision refused
with one line and exit status 2. Exits 1 at the first failure, printing what failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.artifact.install import Install, build_wheel, install, outside_env
from tests.artifact.postgres import ADMIN_URL, throwaway_database
from tests.fake_venice import FAKE_VENICE_KEY
from tests.processes import REPO_ROOT, free_port, wait_for_http


class CheckFailed(Exception):
    pass


def run(
    install: Install, *args: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(install.bin / args[0]), *args[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def expect(result: subprocess.CompletedProcess[str], status: int = 0) -> str:
    if result.returncode != status:
        raise CheckFailed(
            f"{' '.join(result.args)} exited {result.returncode}, expected {status}:\n"
            f"{result.stdout}{result.stderr}"
        )
    return result.stdout


def check(name: str, condition: bool, detail: object = "") -> None:
    if not condition:
        raise CheckFailed(f"{name}: {detail}")
    print(f"  ok  {name}")


def refused(result: subprocess.CompletedProcess[str]) -> bool:
    """Exit status 2 with one line on stderr: how llmgw refuses a configuration."""
    return result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def check_contents(install: Install) -> None:
    """Every module and migration of the checkout is in the installed package, and vice versa."""
    installed = install.site_packages() / "llmgw"
    wanted = {
        p.relative_to(REPO_ROOT / "llmgw").as_posix() for p in (REPO_ROOT / "llmgw").rglob("*.py")
    }
    wanted |= {
        "_migrations/" + p.relative_to(REPO_ROOT / "alembic").as_posix()
        for p in (REPO_ROOT / "alembic").rglob("*.py")
    }
    found = {p.relative_to(installed).as_posix() for p in installed.rglob("*.py")}
    check("the wheel holds every module and migration", wanted == found, sorted(wanted ^ found))
    check("the wheel ships py.typed", (installed / "py.typed").is_file())
    static = REPO_ROOT / "llmgw" / "console" / "static"
    assets = {p.name for p in static.iterdir() if p.is_file()}
    shipped = {p.name for p in (installed / "console" / "static").glob("*") if p.is_file()}
    check(
        "the wheel ships the console's pages and assets",
        assets == shipped,
        sorted(assets ^ shipped),
    )


def start_fake(install: Install, cwd: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [str(install.python), str(REPO_ROOT / "tests" / "fake_venice.py"), "--port", "0"],
        cwd=cwd,
        env=outside_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise CheckFailed(f"the fake upstream did not start: {line!r}")
    return process, line.removeprefix("listening on ").strip()


def chat(port: int, key: str) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(
            {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello!"}]}
        ).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (loopback)
        document: dict[str, object] = json.loads(response.read())
        return document


def check_embedded(install: Install, work: Path, fake_url: str) -> None:
    data_dir = work / "data"
    data_dir.mkdir()
    os.chmod(data_dir, 0o755)  # as root, the embedded server runs as a user of its own
    port = free_port()
    env = outside_env(
        LLMGW_DATA_DIR=str(data_dir),
        VENICE_API_KEY=FAKE_VENICE_KEY,
        VENICE_BASE_URL=fake_url,
        BIND_ADDR=f"127.0.0.1:{port}",
    )
    key = expect(
        run(install, "llmgw", "keys", "create", "--name", "wheel-check", cwd=work, env=env)
    )
    key = key.strip()
    check("keys create on the embedded database prints a key", key.startswith("llmg_"), key)
    serve = subprocess.Popen(
        [str(install.bin / "llmgw"), "serve"],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/readyz", timeout=60, process=serve)
        check("serve on the embedded database is ready", True)
        answer = chat(port, key)
        choices = answer.get("choices")
        check(
            "a chat completion through the fake upstream",
            isinstance(choices, list) and "Hello from fake Venice" in json.dumps(choices),
            answer,
        )
        smoke = run(install, "llmgw", "smoke", cwd=work, env={**env, "LLMGW_KEY": key})
        check("llmgw smoke with BIND_ADDR and LLMGW_KEY", smoke.returncode == 0, smoke.stdout)
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            status = serve.wait(timeout=40)
        except subprocess.TimeoutExpired:
            serve.kill()
            status = serve.wait()
    check("serve exits 0 on SIGTERM", status == 0, serve.stderr.read() if serve.stderr else "")


def check_external(install: Install, work: Path, admin_url: str) -> None:
    with throwaway_database(admin_url) as url:
        env = outside_env(DATABASE_URL=url)
        upgraded = expect(run(install, "llmgw", "db", "upgrade", cwd=work, env=env))
        check("db upgrade against PostgreSQL", "upgraded to head" in upgraded, upgraded)
        current = expect(run(install, "llmgw", "db", "current", cwd=work, env=env))
        revision, _, rest = current.partition(" (head is ")
        check("db current is head", rest.rstrip().rstrip(")") == revision, current)
        key = expect(
            run(install, "llmgw", "keys", "create", "--name", "external", cwd=work, env=env)
        )
        check("keys create against PostgreSQL", key.startswith("llmg_"), key)
        bad = run(install, "llmgw", "db", "downgrade", "nonsense", cwd=work, env=env)
        check("a bad revision: one line, exit 2", refused(bad), (bad.returncode, bad.stderr))
        grpc_env = {
            **env,
            "VENICE_API_KEY": FAKE_VENICE_KEY,
            "BIND_ADDR": f"127.0.0.1:{free_port()}",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        }
        grpc = run(install, "llmgw", "serve", cwd=work, env=grpc_env)
        check(
            "OTLP over gRPC without the [grpc] extra: one line naming it, exit 2",
            refused(grpc) and "llmgw[grpc]" in grpc.stderr,
            (grpc.returncode, grpc.stderr),
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--wheel", type=Path, help="the wheel to check (default: build one)")
    parser.add_argument("--postgres", default=ADMIN_URL, help="admin URL of a PostgreSQL server")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llmgw-wheel-check-") as directory:
        work = Path(directory)
        os.chmod(work, 0o755)
        wheel = args.wheel.resolve() if args.wheel else build_wheel(work / "build")
        print(f"wheel check: {wheel.name}")
        target = install(work / "venv", wheel)
        elsewhere = work / "elsewhere"
        elsewhere.mkdir()
        fake, fake_url = start_fake(target, elsewhere)
        try:
            check_contents(target)
            version = expect(run(target, "llmgw", "--version", cwd=elsewhere, env=outside_env()))
            check("llmgw --version", version.strip().startswith("llmgw "), version)
            check_embedded(target, elsewhere, fake_url)
            check_external(target, elsewhere, args.postgres)
        except CheckFailed as exc:
            print(f"wheel check FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            fake.terminate()
            fake.wait(timeout=10)
    print(f"wheel check passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
