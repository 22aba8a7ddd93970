"""Which model names may label a metric: the ones the gateway knows, every other as one value.

A client may send any model name; as a metric attribute each distinct one is a new time series
(1,000 invented names grew /metrics from 83 KB to 6.1 MB). Known are the aliases, every name in a
provider's model listing, and up to ``_MAX_ANSWERED`` more names a provider answered successfully
(a provider may accept names it does not list). Spans keep the name as sent.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["OVERFLOW_MODEL_NAME", "metric_model_name", "remember_listed"]

OVERFLOW_MODEL_NAME = "_OTHER"
_MAX_LISTED = 10_000
_MAX_ANSWERED = 256

# Process-wide, like the metric instruments whose cardinality it bounds.
_listed: set[str] = set()
_answered: set[str] = set()


def remember_listed(names: Iterable[str]) -> None:
    """Aliases and model listings: the names the gateway serves."""
    for name in names:
        if len(_listed) >= _MAX_LISTED:
            return
        _listed.add(name)


def metric_model_name(name: str, *, answered: bool = False) -> str:
    """``name`` as a metric attribute may carry it. ``answered``: a provider answered it with
    success, so it is known from now on, while few are (remembered here, in the same call as a
    request's end bounds it: one call per name, not two)."""
    if name in _listed:
        return name
    if answered and name not in _answered and len(_answered) < _MAX_ANSWERED:
        _answered.add(name)
    return name if name in _answered else OVERFLOW_MODEL_NAME
