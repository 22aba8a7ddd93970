"""The SET clause of an UPDATE that changes the columns a change names (keys, teams)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["set_clause"]


def set_clause(changes: Mapping[str, Any], changeable: Collection[str]) -> str:
    """``name = $2, ...`` for each of ``changes`` in order (``$1`` is left for the row's id);
    ValueError when it names a column outside ``changeable``."""
    unknown = set(changes) - set(changeable)
    if unknown:
        raise ValueError(f"cannot change {', '.join(sorted(unknown))}")
    return ", ".join(f"{name} = ${i}" for i, name in enumerate(changes, start=2))
