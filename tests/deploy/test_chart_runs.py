"""The rendered manifests run: the migration Job's command, taken from the manifest, migrates a real
PostgreSQL to head, and the Deployment's container (its command, environment, secrets and mounted
files, all from the manifest) starts a `serve` that its own probes find live and ready."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from llmgw.storage import revisions
from tests.deploy.chart import Rendered, render
from tests.fake_venice import FAKE_VENICE_KEY, FakeVenice
from tests.processes import clean_env, eventually, free_port, stop

PROVIDERS = """\
[[providers]]
name = "venice"
kind = "venice"
base_url = "{base_url}"
api_key_env = "VENICE_API_KEY"
"""


def _local(release: Rendered, pod: dict[str, Any], root: Path) -> dict[str, Path]:
    """Each volume mount's path in the pod -> a directory here, ConfigMaps' files written in."""
    config_maps = {o["metadata"]["name"]: o["data"] for o in release.all("ConfigMap")}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {}
    for mount in pod["containers"][0].get("volumeMounts", []):
        local = root / mount["name"]
        local.mkdir()
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            for name, text in config_maps[volume["configMap"]["name"]].items():
                (local / name).write_text(text)
        mounts[mount["mountPath"]] = local
    return mounts


def container_env(release: Rendered, pod: dict[str, Any], root: Path) -> dict[str, str]:
    """The container's environment as the kubelet builds it: values, and secretKeyRefs resolved
    from the rendered Secret; paths into mounted volumes pointed at their local copies."""
    secrets = {o["metadata"]["name"]: o.get("stringData", {}) for o in release.all("Secret")}
    mounts = _local(release, pod, root)
    env: dict[str, str] = {}
    for entry in pod["containers"][0]["env"]:
        if "value" in entry:
            value = str(entry["value"])
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            if ref["key"] not in secrets[ref["name"]]:
                assert ref.get("optional"), f"{entry['name']}: no {ref['key']} in {ref['name']}"
                continue
            value = secrets[ref["name"]][ref["key"]]
        for mount_path, local in mounts.items():
            if value == mount_path or value.startswith(mount_path + "/"):
                value = str(local) + value[len(mount_path) :]
        env[entry["name"]] = value
    return env


def command_of(pod: dict[str, Any]) -> list[str]:
    command: list[str] = pod["containers"][0]["command"]
    assert command[0] == "python", command  # the image's interpreter; here, the suite's
    return [sys.executable, *command[1:]]


def _spawn(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


async def _revision(url: str) -> str | None:
    connection = await asyncpg.connect(url)
    try:
        return await revisions.current_revision(connection)
    finally:
        await connection.close()


async def test_the_rendered_job_migrates_and_the_rendered_deployment_turns_ready(
    empty_database: str, fake_venice: FakeVenice, tmp_path: Path
) -> None:
    release = render(
        {
            "secrets": {
                "databaseUrl": empty_database,
                "adminToken": "admin-token-for-the-chart-test",
                "providerKeys": {"VENICE_API_KEY": FAKE_VENICE_KEY},
            },
            "providersConfig": PROVIDERS.format(base_url=fake_venice.base_url),
            "config": {"LOG_LEVEL": "WARNING"},
        }
    )

    # The hook Job, as Helm runs it before any pod of the release.
    job = release.job["spec"]["template"]["spec"]
    (tmp_path / "job").mkdir()
    job_env = clean_env(**container_env(release, job, tmp_path / "job"))
    migrated = await asyncio.to_thread(
        subprocess.run,
        command_of(job),
        env=job_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert "database upgraded to head" in migrated.stdout
    assert await _revision(empty_database) == revisions.head_revision()

    # The gateway's container: its port from BIND_ADDR is the one its probes ask; here it listens
    # on a free loopback port instead.
    pod = release.deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    (tmp_path / "pod").mkdir()
    env = container_env(release, pod, tmp_path / "pod")
    assert env["BIND_ADDR"] == f"0.0.0.0:{container['ports'][0]['containerPort']}"
    port = free_port()
    process = _spawn(command_of(pod), clean_env(**{**env, "BIND_ADDR": f"127.0.0.1:{port}"}))
    try:
        async with aiohttp.ClientSession() as session:

            async def probe(name: str) -> int:
                path = container[name]["httpGet"]["path"]
                try:
                    async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                        return response.status
                except aiohttp.ClientConnectionError:
                    assert process.poll() is None, process.communicate()[1]
                    return 0

            async def ready() -> bool:
                return await probe("readinessProbe") == 200

            await eventually(ready, within=60, what="the readiness probe answers 200")
            assert await probe("startupProbe") == 200
            assert await probe("livenessProbe") == 200
            # The admin token from the chart's Secret reached it: the admin API is on.
            async with session.get(
                f"http://127.0.0.1:{port}/admin/v1/keys",
                headers={"Authorization": "Bearer admin-token-for-the-chart-test"},
            ) as response:
                assert response.status == 200
    finally:
        assert stop(process) == 0, process.communicate()[1]
