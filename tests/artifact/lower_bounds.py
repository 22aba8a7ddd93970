"""The pip constraints that pin every runtime dependency to the lower bound pyproject.toml declares.

    python -m tests.artifact.lower_bounds [--output PATH]
    python -m tests.artifact.lower_bounds --check-installed

Runtime dependencies are ``project.dependencies`` and the optional extras an operator installs
(``grpc``, ``redis``, ``speed``, ``bedrock``, ``vertex``); the ``test`` and ``dev`` extras are tools, not what
llmgw runs on, and are left to resolve against these pins. .ci/run installs ``.[test,dev]`` with
``--constraint`` on this output, so a bound that no longer works fails CI instead of a user's
install. Every runtime requirement must declare a ``>=`` bound: one without a bound cannot be
tested at its oldest end and is refused here. ``--check-installed`` exits 1 unless the running
environment holds every runtime dependency at exactly its bound (an extra left uninstalled would
leave its bound untested).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Iterable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

__all__ = ["TOOL_EXTRAS", "constraints", "lower_bound", "not_at_bound", "runtime_requirements"]

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# Extras that hold the tools to test and develop llmgw, not dependencies of the running gateway.
TOOL_EXTRAS = frozenset({"test", "dev"})


def runtime_requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """``project.dependencies`` and every extra outside TOOL_EXTRAS, first mention of a name wins."""
    project = tomllib.loads(pyproject.read_text())["project"]
    lines: list[str] = list(project["dependencies"])
    for extra, requirements in project.get("optional-dependencies", {}).items():
        if extra not in TOOL_EXTRAS:
            lines.extend(requirements)
    seen: dict[str, Requirement] = {}
    for line in lines:
        requirement = Requirement(line)
        seen.setdefault(canonicalize_name(requirement.name), requirement)
    return list(seen.values())


def lower_bound(requirement: Requirement) -> str:
    """The version of the ``>=`` specifier; a requirement without one is a ValueError."""
    bounds = [spec.version for spec in requirement.specifier if spec.operator == ">="]
    if len(bounds) != 1:
        raise ValueError(f"{requirement} needs exactly one '>=' lower bound to be tested at it")
    return bounds[0]


def constraints(requirements: Iterable[Requirement]) -> str:
    """``name==lower`` per requirement (no extras: pip constraints name distributions only)."""
    return "".join(f"{r.name}=={lower_bound(r)}\n" for r in requirements)


def not_at_bound(requirements: Iterable[Requirement]) -> list[str]:
    """One line per requirement the running environment does not hold at exactly its bound."""
    wrong = []
    for requirement in requirements:
        bound = lower_bound(requirement)
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            wrong.append(f"{requirement.name}: not installed, bound {bound}")
            continue
        if Version(installed) != Version(bound):
            wrong.append(f"{requirement.name}: {installed} installed, bound {bound}")
    return wrong


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="write here instead of standard output")
    parser.add_argument(
        "--check-installed", action="store_true", help="check this environment is at the bounds"
    )
    args = parser.parse_args(argv)
    if args.check_installed:
        wrong = not_at_bound(runtime_requirements())
        for line in wrong:
            print(line, file=sys.stderr)
        return 1 if wrong else 0
    text = constraints(runtime_requirements())
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
