"""The ``llmgw`` command line: serve, keys, db, usage, budgets, teams, responses, routes,
providers, cache and smoke. Parsing only."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llmgw import __version__
from llmgw.cli import (
    budgets,
    cache,
    db,
    keys,
    providers,
    responses,
    routes,
    serve,
    smoke,
    teams,
    usage,
)
from llmgw.cli.common import EXIT_CONFIG, CommandError, environment_help
from llmgw.config import ConfigError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw",
        description=(
            "llmgw: a self-hosted LLM gateway. Services call its OpenAI-compatible API with an llmgw "
            "key; llmgw authenticates them, applies per-key rate limits, forwards to Venice AI with "
            "the provider key only it holds, and emits OpenTelemetry GenAI telemetry."
        ),
        epilog=(
            "Start here:  VENICE_API_KEY=... llmgw serve   then   llmgw keys create --name demo\n"
            "Every subcommand has its own --help.\n\n" + environment_help()
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"llmgw {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve.register(commands)
    keys.register(commands)
    db.register(commands)
    smoke.register(commands)
    usage.register(commands)
    budgets.register(commands)
    teams.register(commands)
    responses.register(commands)
    routes.register(commands)
    providers.register(commands)
    cache.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.run(args)
    except ConfigError as exc:
        print(f"llmgw: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except CommandError as exc:
        print(f"llmgw: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return result
