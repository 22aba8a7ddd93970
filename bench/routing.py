"""Routing on the healthy path (issue 19, acceptance 5): the same requests as ``json-c64``, sent
direct (the upstream's model) and through model aliases of two deployments, one after the other
by the same gateway process, so that drift between them is as small as it gets:

- ``alias-ordered``: the first deployment answers (``strategy = "ordered"``);
- ``alias-weighted``: one drawn by weight (``strategy = "weighted"``, 1:1);
- ``alias-capped``: the first deployment's provider has account caps (``rpm`` / ``tpm``, far
  above what the run sends): the cost of counting each request on the limits store.

Every deployment is the fake upstream under another provider name, so only the gateway's routing
differs from the direct scenario.
"""

from __future__ import annotations

from pathlib import Path

from bench.load import MODEL
from bench.results import Scenario

__all__ = ["DIRECT", "ROUTED_CAPPED", "providers_file", "scenarios"]

DIRECT = "direct-c64"  # the scenario the routed ones are compared with
ROUTED_CAPPED = "alias-capped-c64"
_CONCURRENCY = 64

_ALIASES = (
    (DIRECT, MODEL, "the upstream's model, no alias, c=64"),
    ("alias-ordered-c64", "bench-ordered", "alias of two deployments, ordered, c=64"),
    ("alias-weighted-c64", "bench-weighted", "alias of two deployments, weighted 1:1, c=64"),
    (ROUTED_CAPPED, "bench-capped", "alias whose first provider has rpm / tpm caps, c=64"),
)


def scenarios(requests: int, warmup: int) -> tuple[Scenario, ...]:
    return tuple(
        Scenario(name, title, False, _CONCURRENCY, requests, warmup, model=alias)
        for name, alias, title in _ALIASES
    )


def _provider(name: str, upstream_url: str, caps: str = "") -> str:
    return (
        f'[[providers]]\nname = "{name}"\nkind = "venice"\nbase_url = "{upstream_url}"\n'
        f'api_key_env = "VENICE_API_KEY"\n{caps}\n'
    )


def providers_file(directory: Path, upstream_url: str) -> Path:
    """The gateway's ``LLMGW_CONFIG``: ``venice`` first (the direct scenarios' provider, as without
    a file), two more names for the same upstream, and the aliases."""
    path = directory / "llmgw-bench.toml"
    deployment = MODEL
    path.write_text(
        _provider("venice", upstream_url)
        + _provider("venice-b", upstream_url)
        + _provider("venice-capped", upstream_url, "rpm = 1000000000\ntpm = 1000000000000\n")
        + f'[[models]]\nalias = "bench-ordered"\n'
        f'deployments = ["venice:{deployment}", "venice-b:{deployment}"]\n\n'
        f'[[models]]\nalias = "bench-weighted"\n'
        f'deployments = ["venice:{deployment}", "venice-b:{deployment}"]\n'
        'strategy = "weighted"\nweights = [1, 1]\n\n'
        f'[[models]]\nalias = "bench-capped"\n'
        f'deployments = ["venice-capped:{deployment}", "venice:{deployment}"]\n'
    )
    return path
