"""Build the llmgw wheel as the image's builder stage does, and install it into a fresh venv.

The wheel is built from a copy of exactly the files docker/Dockerfile copies into its builder
(``BUILD_INPUTS``; tests/test_docker_files.py checks the two agree), never in the checkout, so
nothing a developer has lying around (a stale ``build/``, an untracked module) can reach it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import attrs

from tests.processes import REPO_ROOT

__all__ = [
    "BUILD_INPUTS",
    "WHEEL_ENV",
    "Install",
    "build_wheel",
    "install",
    "outside_env",
    "wheel_for_tests",
]

# What the Dockerfile's builder stage copies from the repository root.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "setup.cfg", "README.md", "llmgw", "alembic")

# .ci/run builds the wheel once and names it here, so every check installs the same file.
WHEEL_ENV = "LLMGW_TEST_WHEEL"


def build_wheel(work: Path) -> Path:
    """``pip wheel --no-deps`` on a copy of BUILD_INPUTS; the wheel lands in ``work/wheels``."""
    source = work / "src"
    source.mkdir(parents=True)
    for name in BUILD_INPUTS:
        origin = REPO_ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, source / name)
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", wheels, "."],
        cwd=source,
        check=True,
    )
    (wheel,) = wheels.glob("llmgw-*.whl")
    return wheel


def wheel_for_tests(work: Path) -> Path:
    """The wheel .ci/run built (``LLMGW_TEST_WHEEL``), else one built now into ``work``."""
    given = os.environ.get(WHEEL_ENV)
    return Path(given).resolve() if given else build_wheel(work)


@attrs.frozen
class Install:
    """A virtual environment with the wheel installed (not editable), and nothing of the checkout."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def site_packages(self) -> Path:
        (found,) = (self.root / "lib").glob("python3.*/site-packages")
        return found


def install(
    root: Path, wheel: Path, *, extras: str = "", constraints: Path | None = None
) -> Install:
    """A fresh venv at ``root`` with ``wheel[extras]`` and its dependencies from the index."""
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    target = Install(root)
    requirement = f"{wheel}[{extras}]" if extras else str(wheel)
    command = [str(target.python), "-m", "pip", "install", "--quiet", requirement]
    if constraints is not None:
        command[4:4] = ["--constraint", str(constraints)]
    # From the venv's own directory: nothing of the checkout is on sys.path while pip runs.
    subprocess.run(command, cwd=root, check=True, env=outside_env())
    return target


def outside_env(**extra: str) -> dict[str, str]:
    """This process's environment less anything that would point Python at the checkout."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
        and not name.startswith(("LLMGW_", "OTEL_", "VENICE_"))
    }
    env.pop("DATABASE_URL", None)
    env.update(extra)
    return env
