"""Provider kinds come from entry points (group llmgw.providers): llmgw's own, and any installed
package's, whose kind-specific keys its options spec declares and the providers file's converter
validates. A kind that is missing or does not load is one configuration error naming it."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest

from llmgw.api.models import ModelListCache
from llmgw.config import ConfigError, load_settings
from llmgw.config.kinds import installed_kinds, load_kind
from llmgw.config.providers_file import ProviderConfigError, load_provider_config
from llmgw.lifecycle.reload import ConfigReloader, RequestGenerations
from llmgw.providers.plugin import Capabilities, ProviderPlugin
from llmgw.routing.registry import ProviderRegistry, build_registry
from tests.lifecycle.test_reload import StubProvider
from tests.providers.installed import install

# A plugin module: kind "regional", with a required key of its own and one with a checked range.
REGIONAL = """
import attrs
from llmgw.config.converter import check
from llmgw.providers.plugin import Capabilities, ProviderPlugin
from llmgw.routing.registry import build_registry
from tests.providers.installed import install

@attrs.frozen
class Options:
    region: str
    replicas: int = attrs.field(default=1, validator=check(lambda n: 1 <= n <= 9, "an integer 1-9"))

PLUGIN = ProviderPlugin(
    factory=lambda setup: setup,
    options=Options,
    capabilities=Capabilities(reasoning=True, native_messages=True),
)
"""

# A plugin whose factory refuses the entry it was given (a valid one, by its options).
FAILING = """
from llmgw.providers.plugin import ProviderPlugin

def factory(setup):
    raise RuntimeError(f"no region serves {setup.base_url}")

PLUGIN = ProviderPlugin(factory=factory)
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "site-packages"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    install(
        path,
        "llmgw-test-plugins",
        {
            "regional": "llmgw_test_regional:PLUGIN",
            "broken": "llmgw_test_broken:PLUGIN",
            "not-a-plugin": "llmgw_test_regional:Options",
            "failing": "llmgw_test_failing:PLUGIN",
        },
        {
            "llmgw_test_regional": REGIONAL,
            "llmgw_test_broken": "import llmgw_no_such_module\n",
            "llmgw_test_failing": FAILING,
        },
    )
    return path


def load(tmp_path: Path, kind: str, extra: str = "") -> object:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        f'[[providers]]\nname = "p"\nkind = "{kind}"\nbase_url = "http://127.0.0.1:9"\n{extra}'
    )
    return load_provider_config(path, {}).providers[0]


def problem(tmp_path: Path, kind: str, extra: str = "") -> str:
    with pytest.raises(ProviderConfigError) as raised:
        load(tmp_path, kind, extra)
    return str(raised.value).split(": ", 1)[1]


def test_the_built_in_kinds_are_entry_points_of_llmgw() -> None:
    found = {kind.name: kind.source for kind in installed_kinds()}
    assert found["venice"].startswith("llmgw ")
    assert found["openai-compatible"].startswith("llmgw ")
    assert isinstance(load_kind("venice"), ProviderPlugin)


def test_a_plugin_kind_is_configured_with_its_own_keys(tmp_path: Path, site: Path) -> None:
    spec = load(tmp_path, "regional", 'region = "eu"\nreplicas = 3\nreasoning = false\n')
    assert spec.options.region == "eu"  # type: ignore[attr-defined]
    assert spec.options.replicas == 3  # type: ignore[attr-defined]
    # The kind's defaults, but for what the entry overrides.
    assert spec.capabilities == Capabilities(reasoning=False, native_messages=True)  # type: ignore[attr-defined]
    assert {kind.name: kind.source for kind in installed_kinds()}["regional"] == (
        "llmgw-test-plugins 1.2"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("", "providers[0].region: is required"),
        (
            'region = "eu"\nreplicas = 10\n',
            "providers[0].replicas: expected an integer 1-9, got 10",
        ),
        ('region = "eu"\nreplicas = "2"\n', 'providers[0].replicas: expected an integer, got "2"'),
        (
            'region = "eu"\nzone = "b"\n',
            "providers[0].zone: unknown key; expected one of name, kind",
        ),
    ],
)
def test_a_plugin_key_is_validated_like_the_others(
    tmp_path: Path, site: Path, extra: str, message: str
) -> None:
    assert problem(tmp_path, "regional", extra).startswith(message)


def test_an_unknown_key_lists_the_kind_s_own_keys_too(tmp_path: Path, site: Path) -> None:
    assert problem(tmp_path, "regional", 'region = "eu"\nzone = "b"\n').endswith(
        "reasoning, prefill, responses, messages, region, replicas"
    )


def test_an_unknown_kind_lists_the_installed_ones(tmp_path: Path, site: Path) -> None:
    assert problem(tmp_path, "foo") == (
        'providers[0].kind: no provider kind "foo" is installed; installed kinds: '
        '"anthropic", "azure-openai", "bedrock", "broken", "failing", "gemini", "not-a-plugin", "openai-compatible", "regional", "venice", "vertex"'
    )


def test_a_plugin_that_fails_to_load_is_named_in_one_line(tmp_path: Path, site: Path) -> None:
    assert problem(tmp_path, "broken") == (
        'providers[0].kind: the plugin of kind "broken" (llmgw_test_broken:PLUGIN, from '
        "llmgw-test-plugins 1.2) failed to load: ModuleNotFoundError: No module named "
        "'llmgw_no_such_module'"
    )
    assert problem(tmp_path, "not-a-plugin").endswith(
        "is a type, not an llmgw.providers.plugin.ProviderPlugin"
    )


async def test_a_plugin_whose_factory_fails_is_named_in_one_line(
    tmp_path: Path, site: Path
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        '[[providers]]\nname = "p"\nkind = "failing"\nbase_url = "http://127.0.0.1:9"\n'
    )
    settings = load_settings({"LLMGW_CONFIG": str(path)})
    with pytest.raises(ConfigError) as refused:
        await build_registry(settings)
    assert str(refused.value) == (
        "LLMGW_CONFIG: provider 'p': kind \"failing\" could not build it: "
        "RuntimeError: no region serves http://127.0.0.1:9"
    )


@pytest.mark.parametrize("when", ["start", "reload"])
async def test_the_providers_built_before_a_factory_fails_are_closed(
    tmp_path: Path,
    site: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    when: str,
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        "".join(
            f'[[providers]]\nname = "{name}"\nkind = "{kind}"\nbase_url = "http://127.0.0.1:9"\n'
            for name, kind in (("a", "openai-compatible"), ("b", "venice"), ("p", "failing"))
        )
    )
    monkeypatch.setenv("LLMGW_CONFIG", str(path))
    monkeypatch.setenv("VENICE_API_KEY", "unused")
    with caplog.at_level(logging.ERROR):
        if when == "start":
            with pytest.raises(ConfigError, match="provider 'p'"):
                await build_registry(load_settings(require_venice_key=True))
        else:
            running = ProviderRegistry([StubProvider("running")])  # type: ignore[list-item]
            reloader = ConfigReloader(
                running, build_registry, ModelListCache(), RequestGenerations()
            )
            assert await reloader.reload() is False
            assert [p.name for p in running.providers] == ["running"]
            assert "the running configuration stays: LLMGW_CONFIG: provider 'p'" in caplog.text
            await reloader.close()
        gc.collect()  # an unclosed aiohttp session says so as it is collected
    assert "Unclosed" not in caplog.text
