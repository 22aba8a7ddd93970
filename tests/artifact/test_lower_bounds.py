"""The lower-bounds constraints pin every runtime dependency, and only those, at its declared bound."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.artifact.lower_bounds import (
    PYPROJECT,
    constraints,
    lower_bound,
    not_at_bound,
    runtime_requirements,
)


def pins(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, version = line.split("==")
        assert canonicalize_name(name) not in found, f"{name} pinned twice"
        found[canonicalize_name(name)] = version
    return found


def test_every_runtime_dependency_is_pinned_at_its_lower_bound() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    runtime = list(project["dependencies"])
    for extra in ("grpc", "redis", "speed", "bedrock", "vertex"):
        runtime += project["optional-dependencies"][extra]
    # Every extra is either one of those or a tool's: a new extra must be sorted into one.
    assert set(project["optional-dependencies"]) == {
        "grpc",
        "redis",
        "speed",
        "bedrock",
        "vertex",
        "test",
        "dev",
    }
    expected: dict[str, str] = {}
    for line in runtime:
        requirement = Requirement(line)
        (bound,) = (s.version for s in requirement.specifier if s.operator == ">=")
        expected.setdefault(canonicalize_name(requirement.name), bound)
    assert pins(constraints(runtime_requirements())) == expected


def test_tools_are_left_to_resolve() -> None:
    pinned = pins(constraints(runtime_requirements()))
    assert not {"pytest", "mypy", "ruff", "schemathesis"} & pinned.keys()


def test_a_dependency_without_a_lower_bound_is_refused(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["aiohttp>=3.14,<3.15"]\n'
        '[project.optional-dependencies]\nspeed = ["uvloop<1"]\ntest = ["pytest"]\n'
    )
    requirements = runtime_requirements(pyproject)
    assert [r.name for r in requirements] == ["aiohttp", "uvloop"]  # test is a tool's extra
    assert lower_bound(requirements[0]) == "3.14"
    with pytest.raises(ValueError, match="uvloop<1 needs exactly one '>=' lower bound"):
        constraints(requirements)


def test_an_environment_off_its_bounds_is_named() -> None:
    requirements = [Requirement("pytest>=1.0"), Requirement("llmgw-no-such-distribution>=1")]
    assert not_at_bound(requirements) == [
        f"pytest: {version('pytest')} installed, bound 1.0",
        "llmgw-no-such-distribution: not installed, bound 1",
    ]
    assert not_at_bound([Requirement(f"pytest>={version('pytest')}")]) == []
