"""docker/Dockerfile's runtime stage, performed as faithfully as a machine without Docker allows.

The steps and values are read from the Dockerfile and compose.yaml, not restated: the wheel (built
once per session from the builder stage's inputs, or the one .ci/run built) is installed into a
fresh venv with the image's extras and its constraints file; the image's working directory gets
what the runtime stage copies there; every command runs as an unprivileged user with the image's
ENV, from that directory: compose's ``migrate`` and ``seed`` commands against a real PostgreSQL,
the image's CMD (``serve``) with a gateway's compose environment, and the HEALTHCHECK command
against it. Slow (a pip install); CI runs it.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest

from tests.artifact.install import Install, install, outside_env, wheel_for_tests
from tests.artifact.postgres import throwaway_database
from tests.fake_venice import FAKE_VENICE_KEY, FakeVenice
from tests.otlp_receiver import OtlpReceiver
from tests.processes import REPO_ROOT, free_port, wait_for_http
from tests.test_docker_files import (
    compose_seconds,
    context_copies,
    exec_form,
    final_stage,
    final_stage_instruction,
    gateway_environ,
    service_command,
    services,
    split_flags,
)

pytestmark = pytest.mark.slow

DEV_KEY = "llmg_dev_0123456789abcdef"
CONSTRAINTS = REPO_ROOT / "docker" / "constraints.txt"


@attrs.frozen
class Image:
    """The runtime stage on this machine: the install, its working directory, its user."""

    install: Install
    workdir: Path
    env: dict[str, str]
    uid: int
    gid: int

    def command(self, argv: list[str], extra: dict[str, str]) -> dict[str, Any]:
        """Popen arguments for ``argv`` as the image runs it: its user, directory and ENV."""
        executable = shutil.which(argv[0], path=str(self.install.bin))
        assert executable is not None, f"the image has no {argv[0]!r}"
        return {
            "args": [executable, *argv[1:]],
            "cwd": self.workdir,
            "env": {**self.env, **extra},
            "user": self.uid,
            "group": self.gid,
            "extra_groups": [],
            "text": True,
        }

    def run(self, argv: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            **self.command(argv, extra), capture_output=True, timeout=120, check=False
        )

    def start(self, argv: list[str], **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            **self.command(argv, extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )


def unprivileged_user() -> tuple[int, int]:
    """uid and gid to run as: ourselves when not root, else ``nobody`` (the image's uid 10001)."""
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("running as root and there is no 'nobody' user to drop to")
    return nobody.pw_uid, nobody.pw_gid


def image_pip_install() -> tuple[str, bool]:
    """The extras and whether the constraints file is used, from the runtime stage's pip install."""
    runs = [i.args for i in final_stage() if i.keyword == "RUN" and "pip install" in i.args]
    assert len(runs) == 1, runs
    match = re.search(r'pip install (?P<options>.*?)"\$\{wheel\}\[(?P<extras>[\w,]*)\]"', runs[0])
    assert match is not None, f'expected pip install ... "${{wheel}}[extras]": {runs[0]}'
    options = match["options"]
    return match["extras"], "--constraint /wheels/constraints.txt" in options


def image_env(data_dir: Path, home: Path, install: Install) -> dict[str, str]:
    """The runtime stage's ENV, with its data directory moved to ``data_dir``."""
    env = {"PATH": f"{install.bin}:/usr/bin:/bin", "HOME": str(home)}
    for instruction in final_stage():
        if instruction.keyword == "ENV":
            for pair in instruction.args.split():
                name, _, value = pair.partition("=")
                env[name] = value
    assert env["LLMGW_DATA_DIR"] == "/var/lib/llmgw"
    env["LLMGW_DATA_DIR"] = str(data_dir)
    return env


@pytest.fixture(scope="session")
def image() -> Iterator[Image]:
    uid, gid = unprivileged_user()
    root = Path(tempfile.mkdtemp(prefix="llmgw-image-"))
    os.chmod(root, 0o755)  # the unprivileged user reads the venv and the working directory
    try:
        wheel = wheel_for_tests(root / "build")
        extras, constrained = image_pip_install()
        assert constrained, "the image installs from docker/constraints.txt"
        target = install(root / "venv", wheel, extras=extras, constraints=CONSTRAINTS)
        # WORKDIR and what the runtime stage copies into it (alembic.ini, alembic/), root-owned
        # and read-only for the service user, as COPY leaves them.
        workdir_text = final_stage_instruction("WORKDIR")
        workdir = root / workdir_text.lstrip("/")
        workdir.mkdir(parents=True)
        for instruction, sources, _ in context_copies():
            if instruction.stage == final_stage()[0].stage:
                for source in sources:
                    origin = REPO_ROOT / source
                    if origin.is_dir():
                        shutil.copytree(
                            origin, workdir / source, ignore=shutil.ignore_patterns("__pycache__")
                        )
                    else:
                        shutil.copy2(origin, workdir / source)
        data_dir, home = root / "var-lib-llmgw", root / "home"
        for directory in (data_dir, home):
            directory.mkdir(mode=0o750)
            os.chown(directory, uid, gid)
        yield Image(target, workdir, image_env(data_dir, home, target), uid, gid)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_image_is_a_production_install_with_every_version_pinned(image: Image) -> None:
    pinned = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pinned[name.lower().replace("_", "-")] = version
    frozen = subprocess.run(
        [str(image.install.python), "-m", "pip", "freeze", "--exclude", "llmgw"],
        capture_output=True,
        text=True,
        check=True,
        env=outside_env(),
    ).stdout.split()
    installed = dict(line.lower().replace("_", "-").split("==") for line in frozen)
    installed.pop("pip", None)
    installed.pop("setuptools", None)
    unpinned = {name: v for name, v in installed.items() if pinned.get(name) != v}
    assert unpinned == {}, "installed but not pinned (or pinned otherwise) in constraints.txt"
    for module in ("pytest", "mypy", "openai", "grpc"):  # test, dev and optional extras
        probe = image.run(["python", "-c", f"import {module}"])
        assert probe.returncode != 0, f"{module} is in the image"


@pytest.fixture
def database() -> Iterator[str]:
    with throwaway_database() as url:
        yield url


@pytest.fixture
async def upstreams() -> AsyncIterator[tuple[FakeVenice, OtlpReceiver]]:
    receiver = OtlpReceiver()
    await receiver.start()
    async with FakeVenice() as fake:
        yield fake, receiver
    await receiver.close()


async def test_migrate_seed_serve_and_healthcheck_as_the_image_runs_them(
    image: Image, database: str, upstreams: tuple[FakeVenice, OtlpReceiver]
) -> None:
    fake, receiver = upstreams
    database_env = {"DATABASE_URL": database}

    # compose's release step, from the image's working directory.
    migrate = await asyncio.to_thread(image.run, service_command("migrate"), **database_env)
    assert migrate.returncode == 0, migrate.stderr
    current = await asyncio.to_thread(
        image.run, ["python", "-m", "llmgw", "db", "current"], **database_env
    )
    assert current.returncode == 0, current.stderr
    revision, _, head = current.stdout.strip().partition(" (head is ")
    assert head == revision + ")", current.stdout

    # compose's seed: the dev key once; a second run changes nothing and says why (docker/README.md).
    seed = await asyncio.to_thread(image.run, service_command("seed"), **database_env)
    assert (seed.returncode, seed.stdout.strip()) == (0, DEV_KEY), seed.stderr
    again = await asyncio.to_thread(image.run, service_command("seed"), **database_env)
    assert again.returncode == 1
    assert again.stderr.startswith(f"llmgw: a key with prefix {DEV_KEY[:12]!r} already exists")

    # The image's CMD with a gateway's compose environment; only addresses are this machine's.
    port = free_port()
    gateway = {
        **gateway_environ("gateway-1"),
        **database_env,
        "BIND_ADDR": f"127.0.0.1:{port}",
        "VENICE_API_KEY": FAKE_VENICE_KEY,
        "VENICE_BASE_URL": fake.base_url,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
    }
    healthcheck = healthcheck_argv()
    serve = image.start(exec_form(final_stage_instruction("CMD")), **gateway)
    try:
        await asyncio.to_thread(wait_for_http, f"http://127.0.0.1:{port}/readyz", timeout=60)
        status = (await asyncio.to_thread(image.run, healthcheck, **gateway)).returncode
        assert status == 0, "HEALTHCHECK reports the serving gateway healthy"
        assert owner_of(serve.pid) == image.uid
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hi"}]},
                headers={"Authorization": f"Bearer {DEV_KEY}"},
            ) as response,
        ):
            assert response.status == 200, await response.text()
    finally:
        serve.send_signal(signal.SIGTERM)
        stop_grace = compose_seconds(services()["gateway-1"]["stop_grace_period"])
        exit_status = await asyncio.to_thread(serve.wait, stop_grace)
    log = serve.stderr.read() if serve.stderr else ""
    assert exit_status == 0, log[-2000:]
    assert "Traceback" not in log
    assert receiver.span_attributes("chat llama-3.3-70b"), "spans reached the collector over HTTP"
    status = (await asyncio.to_thread(image.run, healthcheck, **gateway)).returncode
    assert status != 0, "HEALTHCHECK reports a stopped gateway unhealthy"


def healthcheck_argv() -> list[str]:
    flags, rest = split_flags(final_stage_instruction("HEALTHCHECK"))
    assert "timeout" in flags and rest.startswith("CMD ")
    return exec_form(rest.removeprefix("CMD ").strip())


def owner_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^Uid:\s+(\d+)", status, re.M)
    assert match is not None
    return int(match[1])
