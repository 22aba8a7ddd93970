"""Package discovery, the one build setting pyproject.toml cannot express.

Every package under llmgw/ is found, so a new one cannot be left out of the wheel. The Alembic
migrations live in alembic/ (so ``alembic upgrade head`` works from a checkout) and ship as
``llmgw._migrations``, mapped in pyproject.toml's ``[tool.setuptools.package-dir]``; discovery
cannot see a mapped directory outside llmgw/, so its two packages are added by name.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["llmgw", "llmgw.*"]),
        "llmgw._migrations",
        "llmgw._migrations.versions",
    ]
)
