"""Every wrong JSON type in every field of a document, for fuzz-style tests of the translations:
a caller's mistake must be a 400, a provider's odd answer translated or refused, never a crash."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["crashes"]

_MISSING = object()  # the field left out
_WRONG_VALUES: list[Any] = [
    _MISSING, None, True, 0, -1, 1.5, "x", "", [], ["x"], [[]], {}, {"a": []},
]  # fmt: skip


def _locations(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every value in a document (the document itself first)."""
    yield path
    if isinstance(value, dict):
        for name, inner in value.items():
            yield from _locations(inner, (*path, name))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _locations(inner, (*path, index))


def _with_value(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of ``document`` with the value at ``path`` replaced (or removed: _MISSING)."""
    if not path:
        return value
    changed = copy.deepcopy(document)
    parent = changed
    for step in path[:-1]:
        parent = parent[step]
    if value is _MISSING:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return changed


def _variants(document: Any) -> Iterator[tuple[str, Any]]:
    """(where, changed document) for each field of ``document`` and each wrong value for it."""
    for path in _locations(document):
        for value in _WRONG_VALUES:
            if path or value is not _MISSING:
                shown = "missing" if value is _MISSING else repr(value)
                yield f"{list(path)} = {shown}", _with_value(document, path, value)


def crashes(
    document: Any,
    attempt: Callable[[Any], object],
    expected: tuple[type[Exception], ...] = (),
) -> list[str]:
    """Where ``attempt`` raised anything but ``expected`` for a variant of ``document``."""
    found = []
    for where, changed in _variants(document):
        try:
            attempt(changed)
        except expected:
            pass
        except Exception as exc:
            found.append(f"{where}: {exc!r}")
    return found
