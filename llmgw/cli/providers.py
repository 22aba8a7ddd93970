"""``llmgw providers``: the provider kinds installed (llmgw's own and plugins'), where each comes
from and the capabilities it declares by default."""

from __future__ import annotations

import argparse

import attrs

from llmgw.config.kinds import InstalledKind, KindError, installed_kinds
from llmgw.providers.plugin import Capabilities

__all__ = ["register"]

_CAPABILITY_NAMES = {
    "reasoning": "reasoning",
    "prefill": "prefill",
    "native_responses": "native Responses",
    "native_messages": "native Messages",
}


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    providers = commands.add_parser(
        "providers",
        help="list the provider kinds installed, built in or from plugins",
        description=(
            "Every provider kind a [[providers]] entry of LLMGW_CONFIG may name: llmgw's own and "
            "those of installed plugins (entry points of the group llmgw.providers), with the "
            "package each comes from and the capabilities it declares by default (an entry may "
            "override them). A plugin that fails to load is listed with the reason."
        ),
    )
    providers.set_defaults(run=_providers)


def _capabilities(capabilities: Capabilities) -> str:
    named = [
        _CAPABILITY_NAMES[field]
        for field, value in attrs.asdict(capabilities).items()
        if value is True
    ]
    return ", ".join(named) or "plain chat only"


def _describe(kind: InstalledKind) -> tuple[str, str, str, str]:
    try:
        plugin = kind.load()
    except KindError as exc:
        return kind.name, kind.source, "-", f"cannot be used: {exc}"
    return kind.name, kind.source, _capabilities(plugin.capabilities), plugin.summary


def _providers(_args: argparse.Namespace) -> int:
    rows = [("KIND", "FROM", "DEFAULT CAPABILITIES", "")]
    rows += [_describe(kind) for kind in installed_kinds()]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[3]]).rstrip())
    return 0
