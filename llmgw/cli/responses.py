"""``llmgw responses``: retention of the Responses API's stored responses (``prune``)."""

from __future__ import annotations

import argparse

from llmgw.cli.common import environment_help, prepare_database, run_with_connection
from llmgw.config import load_settings
from llmgw.storage.responses import prune_responses

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    responses = commands.add_parser(
        "responses",
        help="manage stored /v1/responses answers (retention)",
        description=(
            "POST /v1/responses stores each answer (table responses) so previous_response_id and "
            "GET /v1/responses/{id} work; an answer expires RESPONSES_RETENTION_DAYS after it was "
            "made and is no longer served from then on. Expired rows stay on disk until pruned: "
            "run 'llmgw responses prune' on a schedule (cron, a Kubernetes CronJob)."
        ),
        epilog=environment_help(("DATABASE_URL", "LLMGW_DATA_DIR", "RESPONSES_RETENTION_DAYS")),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = responses.add_subparsers(dest="action", metavar="ACTION", required=True)
    prune = actions.add_parser("prune", help="delete stored responses that have expired")
    prune.set_defaults(run=_prune)


def _prune(args: argparse.Namespace) -> int:
    url = prepare_database(load_settings())
    deleted = run_with_connection(url, prune_responses)
    print(f"deleted {deleted} expired responses")
    return 0
